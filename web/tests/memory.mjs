// Memory over a long training run without the garbage collector's help:
// the per-step tensor handles are freed by graph.reset() (see
// npm/handles.js), so after warm-up neither wasm linear memory nor the
// count of live handles may grow. No handle is freed by hand here and no
// gc() is forced. Shared by the suite (Node, Chromium CPU and WebGPU,
// short runs) and memory.test.mjs (20,000 steps in Node).
export async function trainWithFlatMemory(k, kiln, { steps, warmup, readEvery }) {
  const model = kiln.mlp([8, 16, 3]);
  const opt = new k.Adam(model, 1e-2);
  const g = kiln.graph();
  const x = new Float32Array(32 * 8).map((_, i) => Math.sin(i * 0.7));
  const y = new Int32Array(32).map((_, i) => i % 3);
  const out = { steps, warmup, first: undefined, last: undefined, freedPerReset: new Set(), madePerStep: new Set() };
  for (let s = 0; s < steps; s++) {
    const before = k.liveTensorHandles();
    g.reset();
    const afterReset = k.liveTensorHandles();
    if (s > 0) out.freedPerReset.add(before - afterReset);
    const loss = k.crossEntropy(model.forward(g.tensor(x, [32, 8])), g.tensor(y, [32]));
    opt.zeroGrad(); loss.backward(); opt.step();
    if (s % readEvery === 0 || s === steps - 1) {
      const v = await loss.item();
      out.first ??= v;
      out.last = v;
    }
    out.madePerStep.add(k.liveTensorHandles() - afterReset);
    const memory = k.wasmMemoryBytes();
    const handles = k.liveTensorHandles();
    if (s === warmup) {
      out.memoryAtWarmup = memory; out.handlesAtWarmup = handles; out.buffersAtWarmup = kiln.liveBuffers;
      out.maxMemory = memory; out.maxHandles = handles; out.maxBuffers = kiln.liveBuffers;
    } else if (s > warmup) {
      out.maxMemory = Math.max(out.maxMemory, memory);
      out.maxHandles = Math.max(out.maxHandles, handles);
      out.maxBuffers = Math.max(out.maxBuffers, kiln.liveBuffers);
    }
  }
  out.memoryAtEnd = k.wasmMemoryBytes();
  out.handlesAtEnd = k.liveTensorHandles();
  g.free();
  out.handlesAfterFree = k.liveTensorHandles();
  opt.free();
  model.free();
  out.freedPerReset = [...out.freedPerReset];
  out.madePerStep = [...out.madePerStep];
  return out;
}

/** The checks, shared: throws an Error naming what grew. */
export function checkFlat(r) {
  const fail = (what) => { throw new Error(`${what}: ${JSON.stringify(r)}`); };
  if (!(r.last < r.first * 0.5)) fail('the model did not train');
  if (r.maxMemory !== r.memoryAtWarmup) fail(`wasm memory grew after warm-up (${r.memoryAtWarmup} -> ${r.maxMemory} bytes)`);
  if (r.maxHandles !== r.handlesAtWarmup) fail(`live tensor handles grew after warm-up (${r.handlesAtWarmup} -> ${r.maxHandles})`);
  if (r.maxBuffers !== r.buffersAtWarmup) fail(`live device buffers grew after warm-up (${r.buffersAtWarmup} -> ${r.maxBuffers})`);
  // Every reset freed exactly the handles its step made.
  if (r.madePerStep.length !== 1 || r.freedPerReset.length !== 1 || r.madePerStep[0] !== r.freedPerReset[0] || r.madePerStep[0] < 3) {
    fail('each reset must free the handles of its step');
  }
  if (r.handlesAfterFree !== r.handlesAtEnd - r.madePerStep[0]) fail('graph.free() must free the last step\'s handles');
}
