// Seeded random calls of the tensor API with shapes, dtypes and arguments
// chosen to be wrong as often as right (Node.js, CPU): every call either
// works or throws a KilnError whose message names its op and never points
// into Rust's standard library; reading the results works; and after the
// run the module still computes correctly. Then corrupted checkpoints:
// every mutated or truncated state dict either loads or is refused with a
// KilnError, and a refused one leaves the model as it was.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as k from '../pkg/node.mjs';

function rng(seed) {
  let s = seed >>> 0 || 1;
  const next = () => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s / 4294967296; };
  const pick = (a) => a[Math.floor(next() * a.length)];
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  return { next, pick, int };
}

test('random tensor calls work or throw KilnErrors', async () => {
  await k.init();
  const kiln = await k.Kiln.create('cpu');
  const failures = [];
  let calls = 0, ok = 0;
  for (const seed of [1, 2, 3]) {
    const { next, pick, int } = rng(seed);
    const weird = [0, 1, 2, 3, -1, -2, 0.5, 1.5, NaN, Infinity, -Infinity, 2 ** 31, 2 ** 32, -(2 ** 31), 2 ** 53, 1e300, -0, 64, 1e9];
    const num = () => (next() < 0.6 ? int(-1, 4) : pick(weird));
    const axis = () => (next() < 0.7 ? int(-3, 3) : num());
    const axes = () => pick([undefined, null, axis(), [axis()], [axis(), axis()], [], [0, 0]]);
    const dtypes = ['f32', 'f64', 'i32', 'bool', 'float32', 'int32', 'u8', ''];
    const shape = () => Array.from({ length: int(0, 4) }, () => (next() < 0.1 ? 0 : int(1, 4)));
    const weirdShape = () => (next() < 0.8 ? shape() : pick([[-1], [2 ** 31], [1e9, 1e9], [NaN], [1.5], [0, 1e12], [3, -2], Array(40).fill(1)]));
    const g = kiln.graph();
    const pool = [];
    const fresh = () => {
      const sh = shape();
      const n = sh.reduce((a, b) => a * b, 1);
      const dt = pick(['f32', 'f32', 'f64', 'i32', 'bool']);
      const Arr = { f32: Float32Array, f64: Float64Array, i32: Int32Array, bool: Uint8Array }[dt];
      const data = Arr.from({ length: n }, () => (dt === 'bool' ? int(0, 1) : dt === 'i32' ? int(-3, 5) : pick([0, 1, -1, 0.5, 2, -3, NaN, Infinity, 1e-30])));
      return next() < 0.5 && (dt === 'f32' || dt === 'f64') ? g.variable(data, sh) : g.tensor(data, sh);
    };
    const T = () => (pool.length && next() < 0.85 ? pick(pool) : fresh());
    const TorN = () => (next() < 0.7 ? T() : num());
    const pair = () => (next() < 0.5 ? num() : [num(), num()]);
    const ranges = (t) => Array.from({ length: int(0, t.rank + 1) }, () => pick([null, [num(), num()], [num(), num(), num()], [0, 1]]));
    const unary = ['abs', 'cos', 'erf', 'erfc', 'exp', 'expm1', 'gelu', 'log', 'log1p', 'logicalNot', 'mish', 'neg', 'recip', 'relu', 'sigmoid', 'sign', 'silu', 'sin', 'softsign', 'sqrt', 'square', 'tanh'];
    const binary = ['add', 'div', 'eq', 'ge', 'gt', 'le', 'lt', 'maximum', 'minimum', 'mul', 'ne', 'pow', 'sub'];
    const reduce = ['argmax', 'argmin', 'max', 'mean', 'min', 'prod', 'sum'];
    const ops = [
      ...unary.map((m) => [m, (t) => t[m]()]),
      ...binary.map((m) => [m, (t) => t[m](TorN())]),
      ...reduce.map((m) => [m, (t) => t[m](axes(), pick([undefined, true, false]))]),
      ['cast', (t) => t.cast(pick(dtypes))],
      ['causalSoftmax', (t) => t.causalSoftmax(pick([undefined, num()]))],
      ['chunk', (t) => t.chunk(num(), pick([undefined, axis()]))],
      ['clamp', (t) => t.clamp(num(), num())],
      ['col2im', (t) => t.col2im(pair(), pair(), pick([undefined, pair()]), pick([undefined, pair()]))],
      ['expand', (t) => t.expand(weirdShape())],
      ['groupNorm', (t) => t.groupNorm(num(), pick([undefined, num()]))],
      ['im2col', (t) => t.im2col(pair(), pick([undefined, pair()]), pick([undefined, pair()]))],
      ['indexSelect', (t) => t.indexSelect(axis(), T())],
      ['logSoftmax', (t) => t.logSoftmax(pick([undefined, axis()]))],
      ['logsumexp', (t) => t.logsumexp(pick([axis(), [axis()], []]), pick([undefined, true]))],
      ['maskedFill', (t) => t.maskedFill(T(), num())],
      ['maskedSoftmax', (t) => t.maskedSoftmax(pick([undefined, null, T()]), pick([undefined, axis()]))],
      ['matmul', (t) => t.matmul(T())],
      ['matmulT', (t) => t.matmulT(T(), next() < 0.5, next() < 0.5)],
      ['maxPool2d', (t) => t.maxPool2d(pair(), pick([undefined, pair()]), pick([undefined, pair()]))],
      ['maxPool2dBackward', (t) => t.maxPool2dBackward(T(), pair(), pick([undefined, pair()]))],
      ['multinomial', (t) => t.multinomial(num())],
      ['oneHot', (t) => t.oneHot(num(), pick([undefined, ...dtypes]))],
      ['permute', (t) => t.permute(Array.from({ length: int(0, 4) }, axis))],
      ['reshape', (t) => t.reshape(weirdShape())],
      ['rmsNorm', (t) => t.rmsNorm(num(), pick([undefined, num()]))],
      ['scatterAdd', (t) => t.scatterAdd(axis(), T(), T())],
      ['slice', (t) => t.slice(ranges(t))],
      ['sliceAxis', (t) => t.sliceAxis(axis(), num(), num(), pick([undefined, num()]))],
      ['sliceBackward', (t) => t.sliceBackward(weirdShape(), ranges(t))],
      ['softmax', (t) => t.softmax(pick([undefined, axis()]))],
      ['split', (t) => t.split(Array.from({ length: int(0, 3) }, num), pick([undefined, axis()]))],
      ['topKFilter', (t) => t.topKFilter(num())],
      ['transpose', (t) => t.transpose(pick([undefined, axis()]), pick([undefined, axis()]))],
      ['tril', (t) => t.tril(pick([undefined, num()]))],
      ['var', (t) => t.var(pick([axis(), [axis()]]), pick([undefined, true]), pick([undefined, num()]))],
      ['where', (t) => t.where(TorN(), TorN())],
      ['crossEntropy', (t) => k.crossEntropy(t, T())],
      ['nllLoss', (t) => k.nllLoss(t, T())],
      ['mseLoss', (t) => k.mseLoss(t, T())],
      ['scaledDotProductAttention', (t) => k.scaledDotProductAttention(t, T(), T(), pick([undefined, null, T()]), pick([undefined, true]))],
      ['arange', () => g.arange(num(), num(), num(), pick([undefined, ...dtypes]))],
      ['concat', () => g.concat(Array.from({ length: int(0, 3) }, T), axis())],
      ['full', () => g.full(weirdShape(), num(), pick([undefined, ...dtypes]))],
      ['randNormal', () => g.randNormal(weirdShape(), num())],
      ['grad', (t) => g.grad(t, Array.from({ length: int(0, 2) }, T))],
      ['backward', (t) => t.backward(pick([undefined, null, T()]))],
    ];
    for (let i = 0; i < 1500; i++) {
      if (next() < 0.01) { g.reset(); pool.length = 0; }
      const [name, f] = pick(ops);
      let t;
      try { t = T(); } catch { continue; }
      const what = `seed ${seed} call ${i}: ${name} on ${t.dtype}[${t.shape}]`;
      calls++;
      try {
        const r = f(t);
        for (const o of Array.isArray(r) ? r : [r]) {
          if (o instanceof k.Tensor) {
            if (next() < 0.5) await o.toArray();
            if (pool.length < 40) pool.push(o);
          }
        }
        ok++;
      } catch (e) {
        if (!(e instanceof k.KilnError)) failures.push(`${what}: ${e?.name}: ${e?.message}`);
        else if (/library\/|rustc|\.cargo|panicked/.test(e.message) || !e.message) failures.push(`${what}: message ${JSON.stringify(e.message)}`);
      }
    }
    g.free();
  }
  assert.deepEqual(failures.slice(0, 10), [], `${failures.length} of ${calls} calls failed badly`);
  assert.ok(ok > calls / 5 && ok < calls, `${ok} of ${calls} calls worked: the mix should hold both`);
  const g = kiln.graph();
  assert.deepEqual(Array.from(await g.tensor(new Float32Array([1, 2]), [2]).mul(3).toArray()), [3, 6]);
  g.free();
});

test('corrupted checkpoints are refused and leave the model as it was', async () => {
  await k.init();
  const kiln = await k.Kiln.create('cpu');
  const model = kiln.mlp([3, 4, 2], 'relu', 1);
  const adam = new k.Adam(model, 0.01);
  const g = kiln.graph();
  model.forward(g.tensor(new Float32Array(6).fill(0.5), [2, 3])).square().sum().backward();
  adam.step();
  g.free();
  const sources = [[model, await model.stateDict()], [adam, await adam.stateDict()]];
  const before = Array.from(await model.stateDict());
  const { next, int } = rng(7);
  const failures = [];
  let refused = 0;
  for (let i = 0; i < 3000; i++) {
    const [target, good] = sources[i % 2];
    let bytes = Uint8Array.from(good);
    const how = int(0, 2);
    if (how === 0) bytes = bytes.slice(0, int(0, bytes.length - 1));
    else if (how === 1) for (let j = int(1, 4); j > 0; j--) bytes[int(0, Math.min(bytes.length, 400) - 1)] = int(0, 255);
    else for (let j = 0; j < 8; j++) bytes[int(0, 7)] = int(0, 255);
    try {
      target.loadStateDict(bytes);
      target.loadStateDict(good);
    } catch (e) {
      if (!(e instanceof k.KilnError)) failures.push(`mutation ${i}: ${e?.name}: ${e?.message}`);
      refused++;
    }
    if (next() < 0.02) assert.deepEqual(Array.from(await model.stateDict()), before, `the model changed after mutation ${i}`);
  }
  assert.deepEqual(failures.slice(0, 10), [], `${failures.length} loads failed badly`);
  assert.ok(refused > 1000, `only ${refused} corrupted checkpoints were refused`);
  assert.deepEqual(Array.from(await model.stateDict()), before);
});
