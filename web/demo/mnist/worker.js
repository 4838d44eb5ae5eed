// The MNIST demo's worker: loads kiln, the served MNIST subset (IDX files),
// trains a small CNN and answers predictions and checkpoint requests. The
// page never runs kiln itself, so training cannot stall it.
import { init, Kiln, Adam, crossEntropy } from '../../pkg/index.js';
import { serve, emit, exclusive, transferable, yieldToMessages, fetchBytes } from '../lib/worker-host.js';

let kiln = null;
let model = null;
let opt = null;
let data = null;
let stopRequested = false;
let training = false;

/** An IDX file (u8 data): { dims, values }. */
function parseIdx(bytes, url) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint16(0) !== 0 || bytes[2] !== 0x08) throw new Error(`${url}: not an IDX file of unsigned bytes`);
  const dims = Array.from({ length: bytes[3] }, (_, d) => view.getUint32(4 + 4 * d));
  const offset = 4 + 4 * dims.length;
  const count = dims.reduce((a, b) => a * b, 1);
  if (bytes.length < offset + count) throw new Error(`${url}: truncated (${bytes.length} bytes for dims ${dims})`);
  return { dims, values: bytes.subarray(offset, offset + count) };
}

async function loadSet(base, prefix, limit) {
  const imagesUrl = `${base}/${prefix}-images-idx3-ubyte.gz`, labelsUrl = `${base}/${prefix}-labels-idx1-ubyte.gz`;
  const images = parseIdx(await fetchBytes(imagesUrl), imagesUrl);
  const labels = parseIdx(await fetchBytes(labelsUrl), labelsUrl);
  const n = Math.min(images.dims[0], labels.dims[0], limit);
  const pixels = new Float32Array(n * 784);
  for (let i = 0; i < pixels.length; i++) pixels[i] = images.values[i] / 255;
  return { size: n, images: pixels, labels: Int32Array.from(labels.values.subarray(0, n)) };
}

/** conv(1→8, 3×3) · ReLU · max-pool 2 · conv(8→16, 3×3) · ReLU · max-pool 2 · linear(784→10). */
function makeModel(seed) {
  const m = kiln.sequential();
  m.add(kiln.conv2d(1, 8, 3, { padding: 1, seed }));
  m.add('relu');
  m.add(kiln.maxPool2d(2));
  m.add(kiln.conv2d(8, 16, 3, { padding: 1, seed: seed + 1 }));
  m.add('relu');
  m.add(kiln.maxPool2d(2));
  m.add(kiln.flatten());
  m.add(kiln.linear(16 * 7 * 7, 10, true, seed + 2));
  return m;
}

function reset({ seed = 1, lr = 0.005 } = {}) {
  opt?.free();
  model?.free();
  model = makeModel(seed);
  opt = new Adam(model, lr);
  return { parameters: model.numParameters };
}

/** Class probabilities for `images` (Float32Array, n × 784). */
async function probabilities(images) {
  const n = images.length / 784;
  const graph = kiln.graph();
  try {
    const x = graph.tensor(images, [n, 1, 28, 28]);
    return await graph.noGrad(() => model.forward(x).softmax()).toArray();
  } finally {
    graph.free();
  }
}

async function testAccuracy() {
  const { test } = data;
  let correct = 0;
  for (let s = 0; s < test.size; s += 100) {
    const n = Math.min(100, test.size - s);
    const p = await probabilities(test.images.subarray(s * 784, (s + n) * 784));
    for (let i = 0; i < n; i++) {
      let best = 0;
      for (let c = 1; c < 10; c++) if (p[i * 10 + c] > p[i * 10 + best]) best = c;
      correct += best === test.labels[s + i] ? 1 : 0;
    }
  }
  return correct / test.size;
}

/** A shuffled order of 0..n-1 (xorshift, seeded: the same every run). */
function shuffled(n, seed) {
  const order = Uint32Array.from({ length: n }, (_, i) => i);
  let s = (seed * 2654435761) >>> 0 || 1;
  for (let i = n - 1; i > 0; i--) {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    const j = s % (i + 1);
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}

async function train({ epochs = 3, batch = 32, lr, maxSteps = Infinity, evalEvery = 0 }) {
  if (training) throw new Error('already training');
  if (lr !== undefined) opt.lr = lr;
  training = true;
  stopRequested = false;
  const { train } = data;
  const graph = kiln.graph();
  const images = new Float32Array(batch * 784), labels = new Int32Array(batch);
  let step = 0, accuracy = null;
  const started = performance.now();
  const seconds = () => (performance.now() - started) / 1000;
  try {
    for (let epoch = 0; epoch < epochs && !stopRequested && step < maxSteps; epoch++) {
      const order = shuffled(train.size, epoch + 1);
      let s = 0;
      for (; s + batch <= train.size && !stopRequested && step < maxSteps; s += batch) {
        for (let i = 0; i < batch; i++) {
          const k = order[s + i];
          images.set(train.images.subarray(k * 784, (k + 1) * 784), i * 784);
          labels[i] = train.labels[k];
        }
        const loss = await exclusive(async () => {
          graph.reset();
          const l = crossEntropy(model.forward(graph.tensor(images, [batch, 1, 28, 28])), graph.tensor(labels, [batch]));
          opt.zeroGrad();
          l.backward();
          opt.step();
          return l.item();
        });
        step++;
        accuracy = evalEvery && step % evalEvery === 0 ? await exclusive(testAccuracy) : null;
        emit('progress', { step, epoch: epoch + 1, loss, seconds: seconds(), ...(accuracy === null ? {} : { accuracy }) });
        await yieldToMessages();
      }
      if (!evalEvery && s + batch > train.size) {
        // A whole epoch done: its test accuracy.
        accuracy = await exclusive(testAccuracy);
        emit('progress', { step, epoch: epoch + 1, accuracy, seconds: seconds() });
      }
    }
    accuracy ??= await exclusive(testAccuracy);
    return { steps: step, stopped: stopRequested, seconds: seconds(), accuracy };
  } finally {
    graph.free();
    training = false;
  }
}

serve({
  async start({ device = 'auto', dataUrl = 'data', trainLimit = Infinity }) {
    await init();
    kiln = await Kiln.create(device);
    const [train, test] = await Promise.all([loadSet(dataUrl, 'train', trainLimit), loadSet(dataUrl, 't10k', 10000)]);
    data = { train, test };
    const { parameters } = reset();
    return { device: kiln.device, deviceInfo: kiln.deviceInfo, fallbackReason: kiln.fallbackReason ?? null, train: train.size, test: test.size, parameters };
  },
  reset,
  train,
  stop() { stopRequested = true; return training; },
  async predict({ images }) { return Array.from(await probabilities(images)); },
  accuracy: testAccuracy,
  async save() {
    const bytes = await model.stateDict();
    return transferable(bytes, [bytes.buffer]);
  },
  load({ bytes }) { model.loadStateDict(bytes); return true; },
  /** The first `count` test images (for the page to show and the tests to compare). */
  testImages({ count }) { return { images: data.test.images.slice(0, count * 784), labels: Array.from(data.test.labels.subarray(0, count)) }; },
}, ['train', 'stop']);
