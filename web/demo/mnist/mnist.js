// The MNIST demo page: the worker (worker.js) trains; this page charts the
// loss and test accuracy, turns drawings into 28×28 MNIST-style images and
// shows the worker's predictions, and moves checkpoints in and out.
import { startWorker, showDevice, watchEventLoop, drawChart, checkpointButtons } from '../lib/page.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// State the browser tests read.
const demo = (window.kilnDemo = { state: 'loading', losses: [], accuracies: [], device: null, maxGapMs: 0, prediction: null, checkpoint: null });
// Watched from the first step's result on: start-up (wasm compile, the WebGPU self-test) happens before.
watchEventLoop(demo, () => demo.state === 'training' && demo.losses.length > 0);

const rpc = startWorker(new URL('worker.js', import.meta.url));
let trained = false;
const status = (text) => { $('status').textContent = text; };
const fail = (e) => { demo.state = 'error'; demo.error = e.message; status(`error: ${e.message}`); };
rpc.on('error', (e) => fail(new Error(e.error)));
rpc.on('progress', (p) => {
  if (p.loss !== undefined) demo.losses.push(p.loss);
  if (p.accuracy !== undefined) demo.accuracies.push({ step: p.step, accuracy: p.accuracy });
  const acc = demo.accuracies.at(-1);
  status(`epoch ${p.epoch} · step ${p.step} · loss ${demo.losses.at(-1)?.toFixed(4)}${acc ? ` · test accuracy ${(acc.accuracy * 100).toFixed(1)}%` : ''} · ${p.seconds.toFixed(1)} s`);
  drawChart($('chart'), demo.losses, demo.accuracies, 2.5);
});

const controls = (busy) => {
  for (const id of ['train', 'reset', 'download', 'upload']) $(id).disabled = busy;
  $('stop').disabled = !busy;
};

async function train() {
  demo.state = 'training';
  controls(true);
  try {
    const result = await rpc.call('train', {
      epochs: Number(params.get('epochs') || $('epochs').value), batch: Number($('batch').value), lr: Number(params.get('lr') || $('lr').value),
      maxSteps: Number(params.get('steps') || Infinity), evalEvery: Number(params.get('evalEvery') || 0),
    });
    Object.assign(demo, { result, state: 'done' });
    trained = true;
    status(`${$('status').textContent}\n${result.stopped ? 'stopped' : 'done'}: ${result.steps} steps in ${result.seconds.toFixed(1)} s, test accuracy ${(result.accuracy * 100).toFixed(1)}% — now draw a digit`);
    await predictFromPad();
  } catch (e) {
    fail(e);
  } finally {
    controls(false);
  }
}

$('train').onclick = train;
$('stop').onclick = () => rpc.call('stop');
$('reset').onclick = async () => {
  await rpc.call('reset', { seed: Math.floor(Math.random() * 1e6), lr: Number($('lr').value) });
  demo.losses = []; demo.accuracies = []; trained = false;
  drawChart($('chart'), [], [], 2.5);
  status('new random weights');
  await predictFromPad();
};
checkpointButtons({
  rpc, download: $('download'), upload: $('upload'), filename: 'kiln-mnist-cnn.safetensors', onError: fail,
  onLoaded: async (file) => {
    trained = true;
    const accuracy = await rpc.call('accuracy');
    demo.checkpoint = { loaded: file.name, accuracy };
    status(`loaded ${file.name} (${file.size} bytes): test accuracy ${(accuracy * 100).toFixed(1)}%`);
    await predictFromPad();
  },
});

// ----- drawing ---------------------------------------------------------------

const pad = $('pad');
const pctx = pad.getContext('2d', { willReadFrequently: true });
let drawing = false, last = null;
function clearPad() {
  pctx.fillStyle = '#000'; pctx.fillRect(0, 0, pad.width, pad.height);
  $('preview').getContext('2d').clearRect(0, 0, 84, 84);
  $('prediction').textContent = trained ? 'draw a digit' : 'train, then draw';
  $('bars').innerHTML = '';
  demo.prediction = null;
}
const pos = (e) => { const r = pad.getBoundingClientRect(); return [(e.clientX - r.left) * pad.width / r.width, (e.clientY - r.top) * pad.height / r.height]; };
function stroke(p) {
  pctx.strokeStyle = '#fff'; pctx.lineWidth = 20; pctx.lineCap = 'round'; pctx.lineJoin = 'round';
  pctx.beginPath(); pctx.moveTo(last[0], last[1]); pctx.lineTo(p[0], p[1]); pctx.stroke();
  last = p;
}
pad.addEventListener('pointerdown', (e) => { drawing = true; last = pos(e); pad.setPointerCapture(e.pointerId); stroke(last); });
pad.addEventListener('pointermove', (e) => { if (drawing) stroke(pos(e)); });
pad.addEventListener('pointerup', () => { drawing = false; predictFromPad(); });
$('clear').onclick = clearPad;
clearPad();

/** The drawing as MNIST prepared its digits: the bounding box scaled to fit
 * 20×20 (aspect kept, anti-aliased), placed in 28×28 with its centre of
 * mass at the centre; values in [0, 1]. */
function padToImage() {
  const { data } = pctx.getImageData(0, 0, pad.width, pad.height);
  let x0 = pad.width, y0 = pad.height, x1 = -1, y1 = -1;
  for (let y = 0; y < pad.height; y++) for (let x = 0; x < pad.width; x++) {
    if (data[(y * pad.width + x) * 4] > 40) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
  }
  if (x1 < 0) return null;
  const w = x1 - x0 + 1, h = y1 - y0 + 1, scale = 20 / Math.max(w, h);
  const small = new OffscreenCanvas(28, 28).getContext('2d', { willReadFrequently: true });
  small.imageSmoothingQuality = 'high';
  const draw = (dx, dy) => {
    small.fillStyle = '#000'; small.fillRect(0, 0, 28, 28);
    small.drawImage(pad, x0, y0, w, h, dx, dy, w * scale, h * scale);
    const px = small.getImageData(0, 0, 28, 28).data;
    return Float32Array.from({ length: 784 }, (_, i) => px[i * 4] / 255);
  };
  let dx = 14 - (w * scale) / 2, dy = 14 - (h * scale) / 2;
  const first = draw(dx, dy);
  let mass = 0, mx = 0, my = 0;
  first.forEach((v, i) => { mass += v; mx += v * (i % 28); my += v * Math.floor(i / 28); });
  dx += 13.5 - mx / mass; dy += 13.5 - my / mass;
  return draw(Math.round(dx), Math.round(dy));
}

async function predictFromPad() {
  const image = padToImage();
  if (!image || demo.state === 'loading') return;
  const prev = $('preview').getContext('2d');
  image.forEach((v, i) => { const g = Math.round(v * 255); prev.fillStyle = `rgb(${g},${g},${g})`; prev.fillRect((i % 28) * 3, Math.floor(i / 28) * 3, 3, 3); });
  const probs = await rpc.call('predict', { images: image });
  let best = 0;
  for (let i = 1; i < 10; i++) if (probs[i] > probs[best]) best = i;
  demo.prediction = { digit: best, probabilities: probs, mass: image.reduce((a, b) => a + b, 0) };
  $('prediction').textContent = `${trained ? "it's" : 'untrained guess:'} a ${best} (${(probs[best] * 100).toFixed(0)}%)`;
  $('bars').innerHTML = probs.map((p, i) => `<div>${i} <i style="width:${Math.round(p * 120)}px"></i> ${(p * 100).toFixed(1)}%</div>`).join('');
}

// ----- start -------------------------------------------------------------------

try {
  const info = await rpc.call('start', { device: params.get('device') || 'auto', dataUrl: new URL('data', location.href).href });
  demo.device = info;
  showDevice($('device'), info);
  drawChart($('chart'), [], [], 2.5);
  status(`ready: ${info.train} training and ${info.test} test images, ${info.parameters} parameters · press Train`);
  controls(false);
  $('stop').disabled = true;
  demo.state = 'ready';
  if (params.get('autotrain')) train();
} catch (e) {
  fail(e);
}
