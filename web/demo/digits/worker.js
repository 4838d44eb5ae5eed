// The digits demo's worker: loads kiln and the package's 8×8 digits, trains
// the MLP, answers predictions and checkpoint requests between steps.
import { init, Kiln, Adam, crossEntropy, loadDigits } from '../../pkg/index.js';
import { serve, emit, exclusive, transferable, yieldToMessages } from '../lib/worker-host.js';

let kiln = null;
let train = null;
let test = null;
let model = null;
let stopRequested = false;
let training = false;

async function accuracy() {
  const graph = kiln.graph();
  try {
    const pred = graph.noGrad(() => model.forward(graph.tensor(test.images, [test.length, 64])).argmax(1));
    const p = await pred.toArray();
    let correct = 0;
    for (let i = 0; i < p.length; i++) correct += p[i] === test.labels[i] ? 1 : 0;
    return correct / p.length;
  } finally {
    graph.free();
  }
}

async function trainModel({ hidden = 64, epochs = 15, lr = 0.01, batch = 64 }) {
  if (training) throw new Error('already training');
  training = true;
  stopRequested = false;
  model?.free();
  model = kiln.mlp([64, hidden, 10], 'relu', 1);
  const opt = new Adam(model, lr);
  const graph = kiln.graph();
  const started = performance.now();
  const seconds = () => (performance.now() - started) / 1000;
  let step = 0;
  try {
    for (let epoch = 0; epoch < epochs && !stopRequested; epoch++) {
      const order = train.epochOrder(7, epoch);
      for (let s = 0; s < order.length && !stopRequested; s += batch) {
        const loss = await exclusive(async () => {
          const b = train.gather(order.subarray(s, s + batch));
          graph.reset();
          const l = crossEntropy(model.forward(graph.tensor(b.images, [b.size, 64])), graph.tensor(b.labels, [b.size]));
          opt.zeroGrad();
          l.backward();
          opt.step();
          b.free();
          return l.item();
        });
        emit('progress', { step: ++step, loss });
        await yieldToMessages();
      }
      emit('progress', { step, epoch: epoch + 1, epochs, accuracy: await exclusive(accuracy), seconds: seconds() });
    }
    return { steps: step, stopped: stopRequested, seconds: seconds() };
  } finally {
    opt.free();
    graph.free();
    training = false;
  }
}

serve({
  async start({ device = 'auto' }) {
    await init();
    kiln = await Kiln.create(device);
    ({ train, test } = await loadDigits(0.2, 42));
    return { device: kiln.device, deviceInfo: kiln.deviceInfo, fallbackReason: kiln.fallbackReason ?? null, train: train.length, test: test.length };
  },
  train: trainModel,
  stop() { stopRequested = true; return training; },
  async predict({ features }) {
    if (!model) return null;
    const graph = kiln.graph();
    try {
      return Array.from(await graph.noGrad(() => model.forward(graph.tensor(features, [1, 64])).softmax()).toArray());
    } finally {
      graph.free();
    }
  },
  async save() {
    const bytes = await model.stateDict();
    return transferable({ bytes, hidden: model.parameters()[0].shape[0] }, [bytes.buffer]);
  },
  /** A checkpoint of an MLP 64-hidden-10: `hidden` from the file's name, else the page's field. */
  async load({ bytes, hidden }) {
    const next = kiln.mlp([64, hidden, 10], 'relu', 1);
    try {
      next.loadStateDict(bytes);
    } catch (e) {
      next.free();
      throw e;
    }
    model?.free();
    model = next;
    return { accuracy: await accuracy() };
  },
}, ['train', 'stop']);
