// W1 (MLP training step) and W4 (GEMM 1024³) of BENCHMARKS.md in the
// browser, printing the same JSON lines as `kiln bench`. Each step ends by
// reading a value back (the loss, the product), so lazy execution cannot
// skip work. threads = 1: the browser build is single-threaded.
import { init, Kiln, Adam, crossEntropy } from '../pkg/index.js';

const params = new URLSearchParams(location.search);
const quick = params.has('quick');
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

function emit(workload, backend, times, notes) {
  times.sort((a, b) => a - b);
  const n = times.length;
  const median = n % 2 ? times[(n - 1) / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  const line = `{"system":"kiln","backend":"${backend}","workload":"${workload}","median_ms":${median.toFixed(4)},"min_ms":${times[0].toFixed(4)},"max_ms":${times[n - 1].toFixed(4)},"threads":1,"notes":"${notes.replace(/"/g, "'")}"}`;
  lines.push(line);
  out.textContent = lines.join('\n');
  console.log(line);
}

try {
  await init();
  const kiln = await Kiln.create(params.get('device') || 'auto');
  const backend = kiln.device === 'webgpu' ? 'webgpu' : 'wasm-cpu';
  const where = `${navigator.userAgent.match(/(Chrom\w+|Firefox|Safari)\/[\d.]+/)?.[0] ?? 'browser'}; ${kiln.deviceInfo}`;

  // W1: 784-512-512-10 ReLU MLP, cross-entropy, Adam 1e-3, batch 128; 20 warm-up, 100 counted.
  {
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

  // W4: C = A·B, 1024³, forward only, read back; 3 warm-up, 10 counted.
  {
    const n = 1024;
    const a = kiln.param('a', random(n * n, 5), [n, n]);
    const b = kiln.param('b', random(n * n, 6), [n, n]);
    const g = kiln.graph();
    const times = await timeRuns(quick ? 1 : 3, quick ? 2 : 10, async () => {
      g.reset();
      const c = g.noGrad(() => g.param(a).matmul(g.param(b)));
      await c.toArray();
    });
    const sorted = [...times].sort((x, y) => x - y);
    const median = sorted[Math.floor(sorted.length / 2)];
    emit('W4', backend, times, `${(2 * n ** 3 / (median * 1e-3) / 1e9).toFixed(1)} GFLOP/s; ${where}${quick ? '; quick: 2 counted' : ''}`);
    a.free(); b.free(); g.free();
  }
  bench.done = true;
} catch (e) {
  bench.error = String(e && e.stack ? e.stack : e);
  out.textContent = `error: ${bench.error}`;
}
