// The JavaScript half of the parity run (see web/examples/parity.rs): the
// same data, model, seeds and steps through the kiln-web API.
export async function parityLosses(k, kiln) {
  const { train, test } = await k.loadDigits(0.2, 42);
  const model = kiln.mlp([64, 32, 10], 'relu', 3);
  const adam = new k.Adam(model, 0.01);
  const g = kiln.graph();
  const order = train.epochOrder(5, 0);
  const losses = [];
  for (let step = 0; step < 25; step++) {
    const b = train.gather(order.subarray(step * 32, step * 32 + 32));
    g.reset();
    const loss = k.crossEntropy(model.forward(g.tensor(b.images, [b.size, 64])), g.tensor(b.labels, [b.size]));
    adam.zeroGrad();
    loss.backward();
    adam.step();
    losses.push(await loss.item());
  }
  adam.free(); model.free(); g.free(); train.free(); test.free();
  return losses;
}
