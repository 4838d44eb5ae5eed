// The work the thread tests compare across the multi-threaded module (a
// cross-origin isolated page), the single-threaded one (a page without
// isolation) and Node.js: products big enough to be shared among the GEMM
// threads (m·n·k >= 2^20, m >= 32; every transpose; row counts that do not
// divide evenly into parts), and a few W1-like training steps (MLP, Adam).
// Returns FNV-1a digests of the outputs' bytes (bit-for-bit comparison)
// and a few values for the messages.

function fnv(array) {
  const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
  let h = 0x811c9dc5;
  for (let i = 0; i < bytes.length; i++) { h ^= bytes[i]; h = Math.imul(h, 0x01000193) >>> 0; }
  return h.toString(16).padStart(8, '0');
}

export async function threadWork(k) {
  const kiln = await k.Kiln.create('cpu');
  let seed = 777;
  const rand = (n) => Float32Array.from({ length: n }, () => { seed = (seed * 1103515245 + 12345) >>> 0; return seed / 2 ** 31 - 1; });
  const g = kiln.graph();
  const products = [];
  for (const [m, kk, n] of [[128, 784, 512], [203, 300, 257], [512, 128, 784], [37, 1100, 90]]) {
    for (const [ta, tb] of [[false, false], [true, false], [false, true], [true, true]]) {
      const A = rand(m * kk), B = rand(kk * n);
      const a = ta ? g.tensor(A, [kk, m]).transpose(0, 1) : g.tensor(A, [m, kk]);
      const b = tb ? g.tensor(B, [n, kk]).transpose(0, 1) : g.tensor(B, [kk, n]);
      const out = await a.matmul(b).toArray();
      products.push({ shape: `${m}x${kk}x${n} ta=${ta} tb=${tb}`, digest: fnv(out), first: out[0] });
    }
    g.reset();
  }
  // W1's model, smaller batch: 5 steps; the losses and every parameter after.
  const model = kiln.mlp([784, 256, 256, 10], 'relu', 1);
  const opt = new k.Adam(model, 1e-3);
  const images = rand(64 * 784);
  const labels = Int32Array.from(rand(64), (v) => Math.floor((v + 1) * 5) % 10);
  const losses = [];
  for (let step = 0; step < 5; step++) {
    g.reset();
    const loss = k.crossEntropy(model.forward(g.tensor(images, [64, 784])), g.tensor(labels, [64]));
    opt.zeroGrad();
    loss.backward();
    opt.step();
    losses.push(await loss.item());
  }
  const params = fnv(await model.stateDict());
  g.free();
  const deviceInfo = kiln.deviceInfo;
  kiln.free();
  return { deviceInfo, threadInfo: k.threadInfo(), products, losses, params };
}
