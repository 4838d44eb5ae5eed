// The GPT demo's worker: a character-level transformer (token and position
// embeddings, pre-norm causal transformer blocks, final LayerNorm, linear
// head) built from kiln-web's layers, trained on the served Shakespeare
// text, writing samples as it learns. Sampling decodes incrementally: a
// KvCache keeps every block's keys and values, so each new character costs
// one position's forward pass; when the context is full, the cache restarts
// from the last half of it.
import { init, Kiln, Adam, crossEntropy } from '../../pkg/index.js';
import { serve, emit, exclusive, transferable, yieldToMessages, fetchBytes } from '../lib/worker-host.js';

let kiln = null;
let text = null;       // Int32Array of character ids
let vocab = [];        // id -> character
let config = null;
let net = null;        // { all, tok, pos, blocks, ln, head }
let opt = null;
let stopRequested = false;
let training = false;
let stepsDone = 0;

/** xorshift32: seeded, the same windows and samples every run. */
function rng(seed) {
  let s = (seed * 2654435761) >>> 0 || 1;
  return () => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; };
}

function build({ seed = 1, lr = 3e-3 } = {}) {
  opt?.free();
  net?.all.free();
  const { context, width, layers, heads } = config;
  const all = kiln.sequential();   // holds every layer: one parameter list, one checkpoint
  const tok = kiln.embedding(vocab.length, width, seed);
  const pos = kiln.embedding(context, width, seed + 1);
  const blocks = Array.from({ length: layers }, (_, i) => kiln.transformerBlock(width, heads, 4 * width, 0, seed + 2 + i));
  const ln = kiln.layerNorm([width]);
  const head = kiln.linear(width, vocab.length, true, seed + 2 + layers);
  for (const layer of [tok, pos, ...blocks, ln, head]) all.add(layer);
  net = { all, tok, pos, blocks, ln, head };
  opt = new Adam(all, lr);
  stepsDone = 0;
  return { parameters: all.numParameters };
}

/** Logits [B, T, vocab] for token ids (Int32Array, B × T). */
function forward(graph, ids, b, t) {
  const positions = graph.tensor(Int32Array.from({ length: t }, (_, i) => i), [t]);
  let x = net.tok.forward(graph.tensor(ids, [b, t])).add(net.pos.forward(positions));
  for (const block of net.blocks) x = block.forward(x);
  return net.head.forward(net.ln.forward(x));
}

/** The next character's probabilities after `ids` (the last `context` of them). */
async function nextProbabilities(graph, ids, temperature = 1) {
  const t = Math.min(ids.length, config.context);
  const window = Int32Array.from(ids.slice(ids.length - t));
  graph.reset();
  const probs = graph.noGrad(() => forward(graph, window, 1, t).sliceAxis(1, t - 1, t).reshape([vocab.length]).div(temperature).softmax());
  return probs.toArray();
}

const encode = (s) => Array.from(s, (c) => Math.max(0, vocab.indexOf(c)));

/** Feed `ids` (positions cache.length, ...) through the model with `cache`;
 * the next character's probabilities. */
async function feedCached(graph, cache, ids, temperature) {
  const start = cache.length, t = ids.length;
  graph.reset();
  const probs = graph.noGrad(() => {
    const positions = graph.tensor(Int32Array.from({ length: t }, (_, i) => start + i), [t]);
    let x = net.tok.forward(graph.tensor(Int32Array.from(ids), [1, t])).add(net.pos.forward(positions));
    net.blocks.forEach((block, i) => { x = block.forwardCached(x, cache, i); });
    return net.head.forward(net.ln.forward(x)).sliceAxis(1, t - 1, t).reshape([vocab.length]).div(temperature).softmax();
  });
  cache.advance(t);
  return probs.toArray();
}

async function generate({ prompt = '\n', length = 200, temperature = 0.8, seed = 7, cached = true }) {
  const ids = encode(prompt);
  const random = rng(seed);
  const graph = kiln.graph();
  const { context, layers, heads, width } = config;
  const cache = cached ? kiln.kvCache(layers, 1, heads, width / heads, context) : null;
  let out = '';
  try {
    let pending = ids.slice(-context);
    for (let i = 0; i < length; i++) {
      let p;
      if (cache) {
        if (cache.length + pending.length > context) {
          // Full: start again from the last half of the context.
          cache.reset();
          pending = ids.slice(-(context >> 1));
        }
        p = await feedCached(graph, cache, pending, temperature);
      } else {
        p = await nextProbabilities(graph, ids, temperature);
      }
      let u = random(), next = p.length - 1;
      for (let c = 0; c < p.length; c++) { u -= p[c]; if (u <= 0) { next = c; break; } }
      ids.push(next);
      pending = [next];
      out += vocab[next];
    }
  } finally {
    cache?.free();
    graph.free();
  }
  return out;
}

async function train({ steps = 2000, batch = 16, sampleEvery = 100, sampleLength = 200 }) {
  if (training) throw new Error('already training');
  training = true;
  stopRequested = false;
  const { context } = config;
  const graph = kiln.graph();
  const random = rng(1000 + stepsDone);
  const inputs = new Int32Array(batch * context), targets = new Int32Array(batch * context);
  const started = performance.now();
  let step = 0;
  try {
    for (; step < steps && !stopRequested; step++) {
      for (let b = 0; b < batch; b++) {
        const start = Math.floor(random() * (text.length - context - 1));
        inputs.set(text.subarray(start, start + context), b * context);
        targets.set(text.subarray(start + 1, start + context + 1), b * context);
      }
      const loss = await exclusive(async () => {
        graph.reset();
        const logits = forward(graph, inputs, batch, context).reshape([batch * context, vocab.length]);
        const l = crossEntropy(logits, graph.tensor(targets, [batch * context]));
        opt.zeroGrad();
        l.backward();
        opt.step();
        return l.item();
      });
      stepsDone++;
      emit('progress', { step: step + 1, loss, seconds: (performance.now() - started) / 1000 });
      if (sampleEvery && (step + 1) % sampleEvery === 0) {
        const sample = await exclusive(() => generate({ length: sampleLength, seed: step + 1 }));
        emit('sample', { step: step + 1, text: sample });
      }
      await yieldToMessages();
    }
    return { steps: step, stopped: stopRequested, seconds: (performance.now() - started) / 1000 };
  } finally {
    graph.free();
    training = false;
  }
}

serve({
  async start({ device = 'auto', textUrl, context = 64, width = 64, layers = 2, heads = 4 }) {
    await init();
    kiln = await Kiln.create(device);
    const chars = new TextDecoder('latin1').decode(await fetchBytes(textUrl));
    vocab = Array.from(new Set(chars)).sort();
    const index = new Map(vocab.map((c, i) => [c, i]));
    text = Int32Array.from(chars, (c) => index.get(c));
    config = { context, width, layers, heads };
    const { parameters } = build();
    return { device: kiln.device, deviceInfo: kiln.deviceInfo, fallbackReason: kiln.fallbackReason ?? null, characters: text.length, vocab: vocab.length, parameters, config };
  },
  reset: build,
  train,
  stop() { stopRequested = true; return training; },
  generate,
  /** The next character's probabilities after `prompt` (the tests compare them across a checkpoint round trip). */
  async probe({ prompt }) {
    const graph = kiln.graph();
    try { return Array.from(await nextProbabilities(graph, encode(prompt))); } finally { graph.free(); }
  },
  async save() {
    const bytes = await net.all.stateDict();
    return transferable(bytes, [bytes.buffer]);
  },
  load({ bytes }) { net.all.loadStateDict(bytes); return true; },
}, ['train', 'stop']);
