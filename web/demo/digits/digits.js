// kiln demo: train an MLP on the embedded 8x8 digits in the page, chart the
// loss and test accuracy live, classify digits drawn on a canvas.
// Training runs on the main thread in time slices (~12 ms of steps, then a
// yield to the event loop), so the page stays responsive.
import { init, Kiln, Adam, crossEntropy, loadDigits } from '../../pkg/index.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

// State the browser test reads.
const demo = (window.kilnDemo = { state: 'loading', losses: [], accuracies: [], device: null, maxGapMs: 0, prediction: null });

await init();
const kiln = await Kiln.create(params.get('device') || 'auto');
demo.device = { device: kiln.device, deviceInfo: kiln.deviceInfo, fallbackReason: kiln.fallbackReason ?? null };
const deviceBox = $('device');
deviceBox.className = `device ${kiln.device}`;
deviceBox.textContent = kiln.device === 'webgpu'
  ? `WebGPU · ${kiln.deviceInfo}`
  : `CPU (WebAssembly) · ${kiln.deviceInfo}${kiln.fallbackReason ? ` — ${kiln.fallbackReason}` : ''}`;

const { train, test } = await loadDigits(0.2, 42);
const testImages = test.images;
const testLabels = test.labels;
let model = null;
let stopRequested = false;

// ----- chart ---------------------------------------------------------------

function drawChart() {
  const c = $('chart');
  const ctx = c.getContext('2d');
  const W = c.width, H = c.height, L = 46, R = 46, T = 14, B = 30;
  ctx.clearRect(0, 0, W, H);
  ctx.font = '11px system-ui, sans-serif';
  ctx.strokeStyle = '#ddd';
  ctx.fillStyle = '#666';
  const losses = demo.losses;
  const maxLoss = Math.max(2.5, ...losses.slice(0, 5));
  const steps = Math.max(losses.length, 10);
  for (let i = 0; i <= 5; i++) {
    const y = T + (H - T - B) * (i / 5);
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - R, y); ctx.stroke();
    ctx.textAlign = 'right'; ctx.fillText((maxLoss * (1 - i / 5)).toFixed(2), L - 4, y + 4);
    ctx.textAlign = 'left'; ctx.fillText(`${100 - i * 20}%`, W - R + 4, y + 4);
  }
  ctx.textAlign = 'center';
  ctx.fillText('training step', (L + W - R) / 2, H - 8);
  const x = (i) => L + (W - L - R) * (i / steps);
  // Loss per step (faint) and smoothed.
  ctx.strokeStyle = 'rgba(194,65,12,.25)';
  ctx.beginPath();
  losses.forEach((v, i) => { const y = T + (H - T - B) * (1 - Math.min(v, maxLoss) / maxLoss); i ? ctx.lineTo(x(i), y) : ctx.moveTo(x(i), y); });
  ctx.stroke();
  ctx.strokeStyle = '#c2410c'; ctx.lineWidth = 2;
  ctx.beginPath();
  let ema = null;
  losses.forEach((v, i) => { ema = ema === null ? v : 0.9 * ema + 0.1 * v; const y = T + (H - T - B) * (1 - Math.min(ema, maxLoss) / maxLoss); i ? ctx.lineTo(x(i), y) : ctx.moveTo(x(i), y); });
  ctx.stroke();
  // Test accuracy after each epoch.
  ctx.strokeStyle = '#15803d'; ctx.fillStyle = '#15803d';
  ctx.beginPath();
  demo.accuracies.forEach(({ step, accuracy }, i) => { const y = T + (H - T - B) * (1 - accuracy); i ? ctx.lineTo(x(step), y) : ctx.moveTo(x(step), y); });
  ctx.stroke();
  demo.accuracies.forEach(({ step, accuracy }) => { ctx.beginPath(); ctx.arc(x(step), T + (H - T - B) * (1 - accuracy), 3, 0, 7); ctx.fill(); });
  ctx.lineWidth = 1;
  ctx.textAlign = 'left';
  ctx.fillStyle = '#c2410c'; ctx.fillText('loss', L + 6, T + 12);
  ctx.fillStyle = '#15803d'; ctx.fillText('test accuracy', L + 40, T + 12);
}

// ----- training ------------------------------------------------------------

const yieldToPage = () => new Promise((resolve) => setTimeout(resolve, 0));

async function evaluate(graph) {
  graph.reset();
  const pred = graph.noGrad(() => model.forward(graph.tensor(testImages, [test.length, 64])).argmax(1));
  const p = await pred.toArray();
  let correct = 0;
  for (let i = 0; i < p.length; i++) correct += p[i] === testLabels[i] ? 1 : 0;
  return correct / p.length;
}

async function trainModel() {
  const hidden = Number($('hidden').value), epochs = Number(params.get('epochs') || $('epochs').value);
  const lr = Number($('lr').value), batch = Number($('batch').value);
  model?.free();
  model = kiln.mlp([64, hidden, 10], 'relu', 1);
  const opt = new Adam(model, lr);
  const graph = kiln.graph();
  demo.losses = []; demo.accuracies = []; demo.state = 'training';
  stopRequested = false;
  $('train').disabled = true; $('stop').disabled = false;
  const started = performance.now();
  let sliceStart = performance.now();
  try {
    for (let epoch = 0; epoch < epochs && !stopRequested; epoch++) {
      const order = train.epochOrder(7, epoch);
      for (let s = 0; s < order.length && !stopRequested; s += batch) {
        const b = train.gather(order.subarray(s, s + batch));
        graph.reset();
        const loss = crossEntropy(model.forward(graph.tensor(b.images, [b.size, 64])), graph.tensor(b.labels, [b.size]));
        opt.zeroGrad();
        loss.backward();
        opt.step();
        demo.losses.push(await loss.item());
        b.free();
        if (performance.now() - sliceStart > 12) {
          drawChart();
          await yieldToPage();
          sliceStart = performance.now();
        }
      }
      const accuracy = await evaluate(graph);
      demo.accuracies.push({ step: demo.losses.length, epoch: epoch + 1, accuracy });
      $('status').textContent = `epoch ${epoch + 1}/${epochs} · loss ${demo.losses.at(-1).toFixed(4)} · test accuracy ${(accuracy * 100).toFixed(1)}% · ${((performance.now() - started) / 1000).toFixed(1)} s`;
      drawChart();
      await yieldToPage();
      sliceStart = performance.now();
    }
    demo.state = 'done';
    demo.seconds = (performance.now() - started) / 1000;
    $('status').textContent += `\n${stopRequested ? 'stopped' : 'done'} · ${demo.losses.length} steps on ${kiln.device} — now draw a digit`;
  } catch (e) {
    demo.state = 'error';
    demo.error = String(e && e.message ? e.message : e);
    $('status').textContent = `error: ${demo.error}`;
  } finally {
    opt.free();
    graph.free();
    $('train').disabled = false; $('stop').disabled = true; $('download').disabled = false;
    predictFromPad();
  }
}

// Event-loop gaps while training: the responsiveness the test checks.
let lastTick = performance.now();
setInterval(() => {
  const now = performance.now();
  if (demo.state === 'training') demo.maxGapMs = Math.max(demo.maxGapMs, now - lastTick);
  lastTick = now;
}, 20);

$('train').onclick = () => trainModel();

// ----- checkpoints: the model's stateDict() bytes (safetensors, native kiln's keys) --

$('download').onclick = async () => {
  const bytes = await model.stateDict();
  const url = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
  const a = Object.assign(document.createElement('a'), { href: url, download: `kiln-digits-mlp-${model.parameters()[0].shape[0]}.safetensors` });
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
    const next = kiln.mlp([64, hidden, 10], 'relu', 1);
    next.loadStateDict(bytes);
    model?.free();
    model = next;
    $('hidden').value = hidden;
    demo.checkpoint = { loaded: file.name, size: file.size };
    const graph = kiln.graph();
    const accuracy = await evaluate(graph);
    graph.free();
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
$('stop').onclick = () => { stopRequested = true; };

// ----- drawing -------------------------------------------------------------

const pad = $('pad');
const pctx = pad.getContext('2d');
function clearPad() {
  pctx.fillStyle = '#000'; pctx.fillRect(0, 0, pad.width, pad.height);
  $('preview').getContext('2d').clearRect(0, 0, 96, 96);
  $('prediction').textContent = model ? 'draw a digit' : 'train, then draw';
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
  if (!features || !model || demo.state === 'training') return;
  const prev = $('preview').getContext('2d');
  for (let i = 0; i < 64; i++) {
    const v = Math.round(features[i] * 255);
    prev.fillStyle = `rgb(${v},${v},${v})`;
    prev.fillRect((i % 8) * 12, Math.floor(i / 8) * 12, 12, 12);
  }
  const graph = kiln.graph();
  const probs = await graph.noGrad(() => model.forward(graph.tensor(features, [1, 64])).softmax()).toArray();
  graph.free();
  let best = 0;
  for (let i = 1; i < 10; i++) if (probs[i] > probs[best]) best = i;
  demo.prediction = { digit: best, probabilities: Array.from(probs), features: Array.from(features) };
  $('prediction').textContent = `it's a ${best} (${(probs[best] * 100).toFixed(0)}%)`;
  $('bars').innerHTML = Array.from(probs, (p, i) => `<div>${i} <i style="width:${Math.round(p * 120)}px"></i> ${(p * 100).toFixed(1)}%</div>`).join('');
}

drawChart();
$('train').disabled = false;
$('upload').disabled = false;
$('status').textContent = `ready: ${train.length} training and ${test.length} test digits · press Train`;
demo.state = 'ready';
if (params.get('autotrain')) trainModel();
