// W1–W4 of BENCHMARKS.md (MLP step, CNN step, 1000-op chain, GEMM 1024³)
// in the browser, printing the same JSON lines as `kiln bench` and the peers
// in ../shared/peers/web. Each step ends by reading a value back (the loss,
// dL/dx, the product), so lazy execution cannot skip work. `threads`: the
// CPU path's threads (threadInfo(): >1 when the page is cross-origin
// isolated, as serve.mjs makes it unless ?coi=0). `?workloads=W1,W3` picks
// workloads; `?threads=1` asks init() for the single-threaded module.
import { init, Kiln, Adam, crossEntropy, threadInfo } from '../pkg/index.js';

const params = new URLSearchParams(location.search);
const quick = params.has('quick');
const workloads = new Set((params.get('workloads') || 'W1,W2,W3,W4').split(',').map((w) => w.trim().toUpperCase()));
const out = document.getElementById('out');
const lines = [];
const bench = (window.__kilnBench = { done: false, lines });

function random(n, seed) {
  // xorshift32: seeded data of the right shape (values do not matter here).
  let s = seed >>> 0 || 1;
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) { s ^= s << 13; s ^= s >>> 17; s ^= s << 5; a[i] = ((s >>> 0) / 4294967296) * 2 - 1; }
  return a;
}

async function timeRuns(warmup, counted, step) {
  for (let i = 0; i < warmup; i++) await step();
  const times = [];
  for (let i = 0; i < counted; i++) {
    const t0 = performance.now();
    await step();
    times.push(performance.now() - t0);
    await new Promise((r) => setTimeout(r, 0)); // let the page breathe
  }
  return times;
}

function median(times) {
  const t = [...times].sort((a, b) => a - b);
  const n = t.length;
  return n % 2 ? t[(n - 1) / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

function emit(workload, backend, times, notes) {
  times.sort((a, b) => a - b);
  const n = times.length;
  const line = `{"system":"kiln","backend":"${backend}","workload":"${workload}","median_ms":${median(times).toFixed(4)},"min_ms":${times[0].toFixed(4)},"max_ms":${times[n - 1].toFixed(4)},"threads":${backend === 'wasm-cpu' ? threadInfo().threads : 1},"notes":"${notes.replace(/"/g, "'")}"}`;
  lines.push(line);
  out.textContent = lines.join('\n');
  console.log(line);
}

try {
  await init(params.has('threads') ? { threads: Number(params.get('threads')) } : {});
  console.log(`threads: ${JSON.stringify(threadInfo())}`);
  const kiln = await Kiln.create(params.get('device') || 'auto');
  const backend = kiln.device === 'webgpu' ? 'webgpu' : 'wasm-cpu';
  const where = `${navigator.userAgent.match(/(Chrom\w+|Firefox|Safari)\/[\d.]+/)?.[0] ?? 'browser'}; ${kiln.deviceInfo}`;

  // W1: 784-512-512-10 ReLU MLP, cross-entropy, Adam 1e-3, batch 128; 20 warm-up, 100 counted.
  if (workloads.has('W1')) {
    const model = kiln.mlp([784, 512, 512, 10], 'relu', 1);
    const opt = new Adam(model, 1e-3);
    const images = random(128 * 784, 2);
    const labels = Int32Array.from(random(128, 3), (v) => Math.floor((v + 1) * 5) % 10);
    const g = kiln.graph();
    const times = await timeRuns(quick ? 2 : 20, quick ? 5 : 100, async () => {
      g.reset();
      const loss = crossEntropy(model.forward(g.tensor(images, [128, 784])), g.tensor(labels, [128]));
      opt.zeroGrad();
      loss.backward();
      opt.step();
      await loss.item();
    });
    emit('W1', backend, times, `${where}${quick ? '; quick: 5 counted' : ''}`);
    opt.free(); model.free(); g.free();
  }

  // W2: conv 1→32 3×3 + ReLU + max-pool 2, conv 32→64 3×3 + ReLU + max-pool 2,
  // flatten 1600 → 128 + ReLU → 10, cross-entropy, Adam 1e-3, batch 64 of
  // 28×28×1; 5 warm-up, 20 counted.
  if (workloads.has('W2')) {
    const model = kiln.sequential();
    for (const layer of [
      kiln.conv2d(1, 32, 3, { seed: 1 }), 'relu', kiln.maxPool2d(2),
      kiln.conv2d(32, 64, 3, { seed: 2 }), 'relu', kiln.maxPool2d(2),
      kiln.flatten(), kiln.linear(1600, 128, true, 3), 'relu', kiln.linear(128, 10, true, 4),
    ]) model.add(layer);
    const opt = new Adam(model, 1e-3);
    const images = random(64 * 28 * 28, 7).map((v) => (v + 1) / 2);
    const labels = Int32Array.from(random(64, 8), (v) => Math.floor((v + 1) * 5) % 10);
    const g = kiln.graph();
    const times = await timeRuns(quick ? 1 : 5, quick ? 2 : 20, async () => {
      g.reset();
      const loss = crossEntropy(model.forward(g.tensor(images, [64, 1, 28, 28])), g.tensor(labels, [64]));
      opt.zeroGrad();
      loss.backward();
      opt.step();
      await loss.item();
    });
    emit('W2', backend, times, `${where}${quick ? '; quick: 2 counted' : ''}`);
    opt.free(); model.free(); g.free();
  }

  // W3: x of 16 floats, y = tanh(y·1.0001 + 0.001) 1000 times, loss = sum(y);
  // forward + backward, loss and dL/dx read back; 5 warm-up, 20 counted.
  // The per-op figure in the notes is total / 1000, as the peers report it.
  if (workloads.has('W3')) {
    const x = kiln.param('x', random(16, 9), [16]);
    const g = kiln.graph();
    const times = await timeRuns(quick ? 1 : 5, quick ? 2 : 20, async () => {
      g.reset();
      const xt = g.param(x);
      let y = xt;
      for (let i = 0; i < 1000; i++) y = y.mul(1.0001).add(0.001).tanh();
      const loss = y.sum();
      const [dx] = g.grad(loss, [xt]);
      await loss.item();
      await dx.toArray();
    });
    emit('W3', backend, times, `${median(times).toFixed(2)} µs per op; ${where}${quick ? '; quick: 2 counted' : ''}`);
    x.free(); g.free();
  }

  // W4: C = A·B, 1024³, forward only, read back; 3 warm-up, 10 counted.
  if (workloads.has('W4')) {
    const n = 1024;
    const a = kiln.param('a', random(n * n, 5), [n, n]);
    const b = kiln.param('b', random(n * n, 6), [n, n]);
    const g = kiln.graph();
    const times = await timeRuns(quick ? 1 : 3, quick ? 2 : 10, async () => {
      g.reset();
      const c = g.noGrad(() => g.param(a).matmul(g.param(b)));
      await c.toArray();
    });
    emit('W4', backend, times, `${(2 * n ** 3 / (median(times) * 1e-3) / 1e9).toFixed(1)} GFLOP/s; ${where}${quick ? '; quick: 2 counted' : ''}`);
    a.free(); b.free(); g.free();
  }
  bench.done = true;
} catch (e) {
  bench.error = String(e && e.stack ? e.stack : e);
  out.textContent = `error: ${bench.error}`;
}
