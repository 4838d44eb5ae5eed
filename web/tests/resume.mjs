// The JavaScript half of the checkpoint tests (see web/examples/resume.rs):
// the parity run (digits MLP 64-32-10 seed 3, Adam 0.01, batch 32, shuffle
// seed 5) through the kiln-web API, run three ways on one device:
//   uninterrupted: 20 steps, saving model + optimizer after step 10 (js10);
//   fromNative:    a fresh model and optimizer loaded from native kiln's
//                  step-10 checkpoint (`native10`), then steps 11-20;
//   fromJs:        the same from this run's own js10 bytes.
// `load(name, into)` loads checkpoint `name` ('native10.model', ...) into a
// model or optimizer: from files in Node, fetched over HTTP in a page.

function fresh(k, kiln) {
  const model = kiln.mlp([64, 32, 10], 'relu', 3);
  return { model, adam: new k.Adam(model, 0.01) };
}

async function steps(k, kiln, run, data, from, to) {
  const g = kiln.graph();
  const losses = [];
  for (let step = from; step < to; step++) {
    const b = data.train.gather(data.order.subarray(step * 32, step * 32 + 32));
    g.reset();
    const loss = k.crossEntropy(run.model.forward(g.tensor(b.images, [b.size, 64])), g.tensor(b.labels, [b.size]));
    run.adam.zeroGrad();
    loss.backward();
    run.adam.step();
    losses.push(await loss.item());
  }
  g.free();
  return losses;
}

export async function resumeRuns(k, kiln, load) {
  const { train, test } = await k.loadDigits(0.2, 42);
  const data = { train, order: train.epochOrder(5, 0) };
  const out = {};

  const a = fresh(k, kiln);
  out.uninterrupted = await steps(k, kiln, a, data, 0, 10);
  out.js10 = { model: [...await a.model.stateDict()], optim: [...await a.adam.stateDict()] };
  out.uninterrupted.push(...await steps(k, kiln, a, data, 10, 20));
  out.js20 = [...await a.model.stateDict()];

  const b = fresh(k, kiln);
  await load('native10.model', b.model);
  await load('native10.optim', b.adam);
  // Written straight back: the transfer itself must be exact.
  out.native10Echo = { model: [...await b.model.stateDict()], optim: [...await b.adam.stateDict()] };
  out.fromNative = await steps(k, kiln, b, data, 10, 20);
  out.fromNative20 = [...await b.model.stateDict()];

  const c = fresh(k, kiln);
  c.model.loadStateDict(new Uint8Array(out.js10.model));
  c.adam.loadStateDict(new Uint8Array(out.js10.optim));
  out.fromJs = await steps(k, kiln, c, data, 10, 20);
  out.fromJs20 = [...await c.model.stateDict()];

  for (const r of [a, b, c]) { r.adam.free(); r.model.free(); }
  train.free(); test.free();
  return out;
}
