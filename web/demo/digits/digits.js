// kiln demo: an MLP trains on the package's 8x8 digits in a Web Worker
// (worker.js); this page charts the loss and test accuracy live, classifies
// digits drawn on a canvas (the worker predicts), and moves checkpoints.
import { startWorker, showDevice, watchEventLoop, drawChart } from '../lib/page.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

// State the browser test reads.
const demo = (window.kilnDemo = { state: 'loading', losses: [], accuracies: [], device: null, maxGapMs: 0, prediction: null, checkpoint: null });
// Watched from the first step's result on: start-up (wasm compile, the WebGPU self-test) happens before.
watchEventLoop(demo, () => demo.state === 'training' && demo.losses.length > 0);

const rpc = startWorker(new URL('worker.js', import.meta.url));
const info = await rpc.call('start', { device: params.get('device') || 'auto' }).catch((e) => {
  demo.state = 'error';
  demo.error = e.message;
  $('status').textContent = `error: ${e.message}`;
  throw e;
});
demo.device = { device: info.device, deviceInfo: info.deviceInfo, fallbackReason: info.fallbackReason };
showDevice($('device'), info);
let trained = false;

// ----- chart ---------------------------------------------------------------

// The shared chart (lib/page.js) with this demo's scale: at least 2.5
// nats, or the first steps' loss when it starts higher.
function redrawChart() {
  drawChart($('chart'), demo.losses, demo.accuracies, Math.max(2.5, ...demo.losses.slice(0, 5)));
}

// ----- training (in the worker) ---------------------------------------------

const fail = (e) => { demo.state = 'error'; demo.error = String(e && e.message ? e.message : e); $('status').textContent = `error: ${demo.error}`; };
let chartPending = false;
rpc.on('progress', (p) => {
  if (p.loss !== undefined) demo.losses.push(p.loss);
  if (p.accuracy !== undefined) {
    demo.accuracies.push({ step: p.step, epoch: p.epoch, accuracy: p.accuracy });
    $('status').textContent = `epoch ${p.epoch}/${p.epochs} · loss ${demo.losses.at(-1).toFixed(4)} · test accuracy ${(p.accuracy * 100).toFixed(1)}% · ${p.seconds.toFixed(1)} s`;
  }
  // One redraw per frame, however many steps arrive.
  if (!chartPending) { chartPending = true; requestAnimationFrame(() => { chartPending = false; redrawChart(); }); }
});
rpc.on('error', (e) => fail(new Error(e.error)));

async function trainModel() {
  demo.losses = []; demo.accuracies = []; demo.state = 'training';
  for (const id of ['train', 'download', 'upload']) $(id).disabled = true;
  $('stop').disabled = false;
  try {
    const result = await rpc.call('train', {
      hidden: Number($('hidden').value), epochs: Number(params.get('epochs') || $('epochs').value),
      lr: Number($('lr').value), batch: Number($('batch').value),
    });
    demo.seconds = result.seconds;
    demo.state = 'done';
    trained = true;
    redrawChart();
    $('status').textContent += `\n${result.stopped ? 'stopped' : 'done'} · ${result.steps} steps on ${info.device} in a Web Worker — now draw a digit`;
  } catch (e) {
    fail(e);
  } finally {
    for (const id of ['train', 'download', 'upload']) $(id).disabled = false;
    $('download').disabled = !trained;
    $('stop').disabled = true;
    predictFromPad();
  }
}

$('train').onclick = () => trainModel();
$('stop').onclick = () => rpc.call('stop');

// ----- checkpoints: the model's stateDict() bytes (safetensors, native kiln's keys) --

$('download').onclick = async () => {
  const { bytes, hidden } = await rpc.call('save');
  const url = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
  const a = Object.assign(document.createElement('a'), { href: url, download: `kiln-digits-mlp-${hidden}.safetensors` });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
};
$('upload').onchange = async () => {
  const file = $('upload').files[0];
  if (!file) return;
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    // The hidden width: from the name the download gave the file, else the field; loadStateDict
    // refuses a file whose shapes differ, naming every mismatched key.
    const hidden = Number(file.name.match(/mlp-(\d+)/)?.[1] ?? $('hidden').value);
    const { accuracy } = await rpc.call('load', { bytes, hidden }, [bytes.buffer]);
    $('hidden').value = hidden;
    trained = true;
    demo.checkpoint = { loaded: file.name, size: file.size, accuracy };
    $('status').textContent = `loaded ${file.name} (${file.size} bytes): test accuracy ${(accuracy * 100).toFixed(1)}% — draw a digit`;
    $('download').disabled = false;
    await predictFromPad();
  } catch (e) {
    $('status').textContent = `error: ${e.message}`;
    demo.error = e.message;
  } finally {
    $('upload').value = '';
  }
};

// ----- drawing -------------------------------------------------------------

const pad = $('pad');
const pctx = pad.getContext('2d');
function clearPad() {
  pctx.fillStyle = '#000'; pctx.fillRect(0, 0, pad.width, pad.height);
  $('preview').getContext('2d').clearRect(0, 0, 96, 96);
  $('prediction').textContent = trained ? 'draw a digit' : 'train, then draw';
  $('bars').innerHTML = '';
  demo.prediction = null;
}
clearPad();
let drawing = false, last = null;
const pos = (e) => { const r = pad.getBoundingClientRect(); return [(e.clientX - r.left) * pad.width / r.width, (e.clientY - r.top) * pad.height / r.height]; };
pad.addEventListener('pointerdown', (e) => { drawing = true; last = pos(e); pad.setPointerCapture(e.pointerId); stroke(last); });
pad.addEventListener('pointermove', (e) => { if (drawing) stroke(pos(e)); });
pad.addEventListener('pointerup', () => { drawing = false; predictFromPad(); });
function stroke(p) {
  pctx.strokeStyle = '#fff'; pctx.lineWidth = 22; pctx.lineCap = 'round';
  pctx.beginPath(); pctx.moveTo(last[0], last[1]); pctx.lineTo(p[0], p[1]); pctx.stroke();
  last = p;
}
$('clear').onclick = clearPad;

/** The pad as the dataset's 64 features: the drawing's bounding box scaled
 * into a 32×32 bitmap (as the UCI preprocessing did), 4×4 blocks counted
 * (0–16), divided by 16. */
export function padToFeatures() {
  const { data } = pctx.getImageData(0, 0, pad.width, pad.height);
  let x0 = pad.width, y0 = pad.height, x1 = -1, y1 = -1;
  for (let y = 0; y < pad.height; y++) for (let x = 0; x < pad.width; x++) {
    if (data[(y * pad.width + x) * 4] > 60) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
  }
  if (x1 < 0) return null;
  const size = Math.max(x1 - x0, y1 - y0) + 1;
  const cx = (x0 + x1) / 2, cy = (y0 + y1) / 2;
  const bitmap = new Uint8Array(32 * 32);
  for (let by = 0; by < 32; by++) for (let bx = 0; bx < 32; bx++) {
    // The digit's box fills the 32×32 bitmap (aspect kept, centred).
    const sx = Math.round(cx + ((bx + 0.5) / 32 - 0.5) * size);
    const sy = Math.round(cy + ((by + 0.5) / 32 - 0.5) * size);
    if (sx >= 0 && sy >= 0 && sx < pad.width && sy < pad.height) bitmap[by * 32 + bx] = data[(sy * pad.width + sx) * 4] > 127 ? 1 : 0;
  }
  const features = new Float32Array(64);
  for (let r = 0; r < 8; r++) for (let c = 0; c < 8; c++) {
    let count = 0;
    for (let dy = 0; dy < 4; dy++) for (let dx = 0; dx < 4; dx++) count += bitmap[(r * 4 + dy) * 32 + c * 4 + dx];
    features[r * 8 + c] = count / 16;
  }
  return features;
}

async function predictFromPad() {
  const features = padToFeatures();
  if (!features || !trained || demo.state === 'training') return;
  const prev = $('preview').getContext('2d');
  for (let i = 0; i < 64; i++) {
    const v = Math.round(features[i] * 255);
    prev.fillStyle = `rgb(${v},${v},${v})`;
    prev.fillRect((i % 8) * 12, Math.floor(i / 8) * 12, 12, 12);
  }
  const probs = await rpc.call('predict', { features });
  let best = 0;
  for (let i = 1; i < 10; i++) if (probs[i] > probs[best]) best = i;
  demo.prediction = { digit: best, probabilities: probs, features: Array.from(features) };
  $('prediction').textContent = `it's a ${best} (${(probs[best] * 100).toFixed(0)}%)`;
  $('bars').innerHTML = probs.map((p, i) => `<div>${i} <i style="width:${Math.round(p * 120)}px"></i> ${(p * 100).toFixed(1)}%</div>`).join('');
}

redrawChart();
$('train').disabled = false;
$('upload').disabled = false;
$('status').textContent = `ready: ${info.train} training and ${info.test} test digits · press Train`;
demo.state = 'ready';
if (params.get('autotrain')) trainModel();
