// kiln-web's API tests. One suite, run in three places: headless Chromium
// with WebGPU, headless Chromium without it (CPU fallback), and Node.js.
// `k` is the package module (after init()); `env.expect` is 'webgpu' or
// 'cpu'; `env.fallback` a RegExp the CPU fallback reason must match.

function assert(cond, message) {
  if (!cond) throw new Error(`assertion failed: ${message}`);
}
function close(a, b, tol, what) {
  assert(Math.abs(a - b) <= tol * (1 + Math.abs(b)), `${what}: ${a} vs ${b} (tol ${tol})`);
}
function allClose(a, b, tol, what) {
  assert(a.length === b.length, `${what}: length ${a.length} vs ${b.length}`);
  for (let i = 0; i < a.length; i++) close(a[i], b[i], tol, `${what}[${i}]`);
}
function throws(fn, check, what) {
  let error = null;
  try { fn(); } catch (e) { error = e; }
  assert(error !== null, `${what}: expected an exception`);
  check(error);
  return error;
}
async function rejects(promise, check, what) {
  let error = null;
  try { await promise; } catch (e) { error = e; }
  assert(error !== null, `${what}: expected a rejection`);
  check(error);
}

import { reach, exceptions } from './op-coverage.mjs';
import { trainWithFlatMemory, checkFlat } from './memory.mjs';

const TOL = 1e-5;

export const tests = [
  ['device selection reports what it got', async (k, env, kiln) => {
    assert(kiln.device === env.expect, `device ${kiln.device}, expected ${env.expect} (fallbackReason: ${kiln.fallbackReason})`);
    if (env.expect === 'webgpu') {
      assert(kiln.deviceInfo.startsWith('webgpu'), `deviceInfo ${kiln.deviceInfo}`);
      assert(!/^webgpu:\s*\(/.test(kiln.deviceInfo) && !kiln.deviceInfo.includes('unnamed'), `the adapter is named in deviceInfo: ${kiln.deviceInfo}`);
      assert(kiln.fallbackReason === undefined, 'no fallback reason on WebGPU');
    } else {
      assert(kiln.deviceInfo.startsWith('cpu'), `deviceInfo ${kiln.deviceInfo}`);
      assert(env.fallback.test(kiln.fallbackReason), `fallbackReason '${kiln.fallbackReason}' should match ${env.fallback}`);
    }
    const cpu = await k.Kiln.create('cpu');
    assert(cpu.device === 'cpu', 'Kiln.create("cpu") gives the CPU');
    cpu.free();
    await rejects(k.Kiln.create('tpu'), (e) => assert(/unknown device 'tpu'/.test(e.message), e.message), 'bad device');
  }],

  ['tensors from and to typed arrays', async (k, env, kiln) => {
    const g = kiln.graph();
    const a = g.tensor(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    assert(JSON.stringify(a.shape) === '[2,3]' && a.dtype === 'float32' && a.size === 6 && a.rank === 2, 'metadata');
    const back = await a.toArray();
    assert(back instanceof Float32Array, 'Float32Array back');
    allClose(back, [1, 2, 3, 4, 5, 6], 0, 'values');
    const labels = g.tensor(new Int32Array([3, 1, 4]), [3]);
    assert(labels.dtype === 'int32', 'int32 dtype');
    const l = await labels.toArray();
    assert(l instanceof Int32Array && l[2] === 4, 'Int32Array back');
    const plain = g.tensor([0.5, 1.5], [2]);
    allClose(await plain.toArray(), [0.5, 1.5], 0, 'number[] input');
    const p = a.sum().item();
    assert(p instanceof Promise, 'reads are Promises');
    close(await p, 21, TOL, 'item');
    throws(() => g.tensor(new Float32Array(5), [2, 3]), (e) => assert(/5 values given for shape \[2, 3\]/.test(e.message), e.message), 'size mismatch');
    g.free();
  }],

  ['arithmetic, broadcasting, matmul, activations', async (k, env, kiln) => {
    const g = kiln.graph();
    const a = g.tensor(new Float32Array([1, -2, 3, -4]), [2, 2]);
    const row = g.tensor(new Float32Array([10, 20]), [2]);
    allClose(await a.add(row).toArray(), [11, 18, 13, 16], TOL, 'add broadcast');
    allClose(await a.sub(1).mul(2).div(4).toArray(), [0, -1.5, 1, -2.5], TOL, 'scalar chain');
    allClose(await a.matmul(a).toArray(), [-5, 6, -9, 10], TOL, 'matmul');
    allClose(await a.relu().toArray(), [1, 0, 3, 0], TOL, 'relu');
    allClose(await a.abs().sqrt().toArray(), [1, Math.SQRT2, Math.sqrt(3), 2], TOL, 'abs sqrt');
    allClose(await a.tanh().toArray(), [1, -2, 3, -4].map(Math.tanh), TOL, 'tanh');
    allClose(await a.sigmoid().toArray(), [1, -2, 3, -4].map((x) => 1 / (1 + Math.exp(-x))), TOL, 'sigmoid');
    allClose(await a.exp().log().toArray(), [1, -2, 3, -4], 1e-4, 'exp log');
    allClose(await a.pow(2).toArray(), [1, 4, 9, 16], TOL, 'pow');
    allClose(await a.maximum(0).toArray(), [1, 0, 3, 0], TOL, 'maximum');
    allClose(await a.gt(0).cast('float32').toArray(), [1, 0, 1, 0], 0, 'compare + cast');
    allClose(await a.gt(0).where(a, 0).toArray(), [1, 0, 3, 0], 0, 'where');
    g.free();
  }],

  ['reductions, reshape, transpose, softmax', async (k, env, kiln) => {
    const g = kiln.graph();
    const x = g.tensor(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    allClose(await x.sum(1).toArray(), [6, 15], TOL, 'sum axis 1');
    allClose(await x.sum([0], true).toArray(), [5, 7, 9], TOL, 'sum axis 0 keepdim');
    assert(JSON.stringify(x.sum([0], true).shape) === '[1,3]', 'keepdim shape');
    close(await x.mean().item(), 3.5, TOL, 'mean');
    allClose(await x.max(1).toArray(), [3, 6], TOL, 'max');
    allClose(await x.argmax(1).toArray(), [2, 2], 0, 'argmax');
    const t = x.transpose();
    assert(JSON.stringify(t.shape) === '[3,2]', 'transpose shape');
    allClose(await t.toArray(), [1, 4, 2, 5, 3, 6], 0, 'transpose values');
    allClose(await x.reshape([3, -1]).toArray(), [1, 2, 3, 4, 5, 6], 0, 'reshape');
    assert(JSON.stringify(x.reshape([3, -1]).shape) === '[3,2]', 'reshape shape');
    const sm = await x.softmax(-1).toArray();
    const ref = (r) => { const m = Math.max(...r); const e = r.map((v) => Math.exp(v - m)); const s = e.reduce((p, q) => p + q); return e.map((v) => v / s); };
    allClose(sm, [...ref([1, 2, 3]), ...ref([4, 5, 6])], TOL, 'softmax');
    allClose(await x.logSoftmax().toArray(), [...ref([1, 2, 3]), ...ref([4, 5, 6])].map(Math.log), 1e-4, 'logSoftmax');
    g.free();
  }],

  ['backward, gradients, no-grad', async (k, env, kiln) => {
    const g = kiln.graph();
    const x = g.variable(new Float32Array([1, 2, 3]), [3]);
    const y = x.mul(x).sum();
    assert(y.requiresGrad, 'requiresGrad');
    y.backward();
    allClose(await x.grad.toArray(), [2, 4, 6], TOL, 'd(sum x^2)/dx');
    throws(() => y.backward(), (e) => assert(e.kind === 'Autograd' && /already differentiated/.test(e.message), e.message), 'second backward');
    g.reset();
    const w = kiln.param('w', new Float32Array([0.5, -1]), [2]);
    const wt = g.param(w);
    const loss = wt.mul(g.tensor(new Float32Array([3, 4]), [2])).sum();
    loss.backward();
    allClose(await w.grad(), [3, 4], TOL, 'param grad');
    g.reset();
    g.param(w).mul(2).sum().backward();
    allClose(await w.grad(), [5, 6], TOL, 'grads accumulate');
    w.zeroGrad();
    assert((await w.grad()) === undefined && !w.hasGrad, 'zeroGrad');
    g.reset();
    const frozen = g.noGrad(() => g.param(w).mul(3).sum());
    assert(!frozen.requiresGrad, 'noGrad records no gradient structure');
    throws(() => frozen.backward(), (e) => assert(e.kind === 'Autograd' && /does not require grad/.test(e.message), e.message), 'backward under noGrad');
    assert(g.gradEnabled, 'grad mode restored after noGrad');
    w.free();
    g.free();
  }],

  ['errors are JS Errors with kiln messages; stale handles throw', async (k, env, kiln) => {
    const g = kiln.graph();
    const a = g.tensor(new Float32Array([1, 2]), [2]);
    const b = g.tensor(new Float32Array([1, 2, 3]), [3]);
    const e = throws(() => a.add(b), () => {}, 'broadcast error');
    assert(e instanceof Error, 'an Error');
    assert(e.name === 'KilnError' && e.kind === 'Shape' && e.op === 'Add', `${e.name} ${e.kind} ${e.op}`);
    assert(/^Add: shapes \[2\] and \[3\] do not broadcast$/.test(e.message), `no Rust location in the message: ${e.message}`);
    assert(e instanceof k.KilnError, 'instanceof KilnError');
    assert(!(new Error('x') instanceof k.KilnError), 'a plain Error is not a KilnError');
    throws(() => a.matmul(b), (e) => assert(e.kind === 'Shape' && /MatMul|matmul/.test(e.message), e.message), 'matmul shapes');
    throws(() => a.add('x'), (e) => assert(/expected a Tensor, got the string "x"/.test(e.message), e.message), 'bad operand');
    throws(() => a.sum(7), (e) => assert(e.kind === 'OutOfRange', e.message), 'bad axis');
    const step = g.step;
    g.reset();
    assert(g.step === step + 1 && !a.isAlive, 'generation moved');
    const c = g.tensor(new Float32Array([9, 9]), [2]);
    throws(() => a.exp(), (e) => {
      assert(e.kind === 'StaleTensor', e.kind);
      assert(e.message.includes(`belongs to step ${step} of graph #${g.id}`) && e.message.includes(`now at step ${step + 1}`), e.message);
    }, 'stale handle');
    throws(() => c.add(a), (e) => assert(e.kind === 'StaleTensor', e.message), 'stale operand');
    await rejects(a.toArray(), (e) => assert(e.kind === 'StaleTensor', e.message), 'stale read');
    allClose(await c.toArray(), [9, 9], 0, 'the new tensor is fine');
    const other = kiln.graph();
    throws(() => c.add(other.tensor(new Float32Array([1, 1]), [2])), (e) => assert(/different graphs/.test(e.message), e.message), 'cross-graph');
    other.free();
    g.free();
    throws(() => c.exp(), (e) => assert(/was freed/.test(e.message), e.message), 'freed graph');
  }],

  ['per-step handles are freed at reset: memory flat over a training run without the GC', async (k, env, kiln) => {
    const webgpu = env.expect === 'webgpu';
    const r = await trainWithFlatMemory(k, kiln, { steps: webgpu ? 300 : 2000, warmup: webgpu ? 50 : 100, readEvery: webgpu ? 25 : 50 });
    checkFlat(r);
  }],

  ['parameter groups, learning-rate schedules, gradient clipping', async (k, env, kiln) => {
    // Two parameters with gradient = x (loss = sum(w * x)), updated by SGD
    // with a learning rate per group.
    const a = kiln.param('a', [1, 1], [2]);
    const b = kiln.param('b', [1, 1], [2]);
    const g = kiln.graph();
    const grads = async (xa, xb) => {
      g.reset();
      a.zeroGrad(); b.zeroGrad();
      g.param(a).mul(g.tensor(new Float32Array(xa), [2])).sum().add(g.param(b).mul(g.tensor(new Float32Array(xb), [2])).sum()).backward();
    };
    const sgd = new k.Sgd([{ params: [a], lr: 0.5 }, { params: [b] }], 0.1);
    allClose(sgd.groupLrs, [0.5, 0.1], 0, 'group lrs (the second takes the default)');
    await grads([1, 2], [3, 4]);
    sgd.step();
    allClose(await a.value(), [1 - 0.5 * 1, 1 - 0.5 * 2], 1e-6, 'group 0 moved by its lr');
    allClose(await b.value(), [1 - 0.1 * 3, 1 - 0.1 * 4], 1e-6, 'group 1 moved by the default lr');
    sgd.setGroupLrs([0.2, 0.02]);
    allClose(sgd.groupLrs, [0.2, 0.02], 1e-12, 'setGroupLrs');
    throws(() => sgd.setGroupLrs([0.1]), (e) => assert(e.kind === 'InvalidArgument' && /1 learning rates given for 2/.test(e.message), e.message), 'one rate per group');
    throws(() => new k.Sgd([{ params: [a], lr: 'x' }], 0.1), (e) => assert(e.kind === 'InvalidArgument' && /group 0: lr must be a number/.test(e.message), e.message), 'bad group');
    throws(() => new k.Sgd([{ params: [a] }, { params: [a] }], 0.1), (e) => assert(e.kind === 'InvalidArgument', e.message), 'a parameter in two groups');

    // Schedules: factors as the formulas give them.
    const wc = k.Schedule.warmupCosine(10, 110, 0.1);
    close(wc.factor(0), 0.1, 1e-12, 'warm-up starts at 1/warmup');
    close(wc.factor(5), 0.1 + 0.9 * 0.5, 1e-12, 'halfway through warm-up');
    close(wc.factor(10), 1, 1e-12, 'cosine starts at 1');
    close(wc.factor(60), 0.1 + 0.9 * 0.5, 1e-12, 'cosine halfway');
    close(wc.factor(500), 0.1, 1e-12, 'after the end: minFactor');
    close(k.Schedule.step(3, 0.5).factor(7), 0.25, 1e-12, 'step');
    close(k.Schedule.exponential(0.9).factor(2), 0.81, 1e-12, 'exponential');
    close(k.Schedule.constant().followedBy(4, k.Schedule.exponential(0.5)).factor(6), 0.25, 1e-12, 'followedBy');
    close(k.Schedule.step(1, 0.5).times(k.Schedule.linearWarmup(4, 0)).factor(2), 0.25 * 0.5, 1e-12, 'times');
    close(k.Schedule.oneCycle(100).factor(0), 1 / 25, 1e-9, 'one cycle starts at 1/divFactor');
    throws(() => k.Schedule.step(0, 0.5), (e) => assert(e.kind === 'InvalidArgument' && e.op === 'Schedule', `${e.kind} ${e.op} ${e.message}`), 'bad schedule');
    throws(() => k.Schedule.cosine(2.5), (e) => assert(e.kind === 'InvalidArgument' && /whole number/.test(e.message), e.message), 'fractional steps');

    // LrScheduler keeps the groups' ratio.
    const sched = new k.LrScheduler(sgd, k.Schedule.step(2, 0.5));
    allClose(sched.baseLrs, [0.2, 0.02], 1e-12, 'base rates');
    for (let i = 0; i < 4; i++) { sgd.step(); sched.step(); }
    assert(sched.steps === 4, `steps ${sched.steps}`);
    allClose(sgd.groupLrs, [0.05, 0.005], 1e-12, 'two halvings, ratio kept');
    allClose(sched.currentLrs, [0.05, 0.005], 1e-12, 'currentLrs');
    const again = new k.LrScheduler(sgd, k.Schedule.step(2, 0.5));
    again.loadState(2, [0.2, 0.02]);
    assert(again.steps === 2, `loaded steps ${again.steps}`);
    allClose(sgd.groupLrs, [0.1, 0.01], 1e-12, 'loadState sets the rates of the loaded step');
    throws(() => new k.LrScheduler(a, k.Schedule.constant()), (e) => assert(e.kind === 'InvalidArgument' && /expected an optimizer/.test(e.message), e.message), 'not an optimizer');
    sched.free(); again.free();

    // Clipping: gradients [3, 4] and [0, 0] have norm 5.
    await grads([3, 4], [0, 0]);
    const norm = await k.clipGradNorm([a, b], 1);
    close(norm, 5, 1e-6, 'total norm before clipping');
    allClose(await a.grad(), [0.6, 0.8], 1e-5, 'clipped to norm 1');
    await grads([3, -4], [0.25, 9]);
    k.clipGradValue([a, b], 0.5);
    allClose(await a.grad(), [0.5, -0.5], 0, 'clamped');
    allClose(await b.grad(), [0.25, 0.5], 0, 'clamped (b)');
    close(await k.clipGradNorm([a, b], 100, Infinity), 0.5, 1e-7, 'inf-norm, no clipping');
    throws(() => k.clipGradNorm([a], -1), (e) => assert(e.kind === 'InvalidArgument' && e.op === 'clip_grad_norm', e.message), 'bad max norm');

    // decaySplit: rank >= 2 decays, the rest does not; AdamW over the groups.
    const model = kiln.mlp([3, 4, 2]);
    const groups = k.decaySplit(model, 0.1);
    assert(groups.length === 2 && groups[0].weightDecay === 0.1 && groups[1].weightDecay === 0, JSON.stringify(groups.map((x) => x.weightDecay)));
    assert(groups[0].params.every((p) => p.shape.length >= 2) && groups[1].params.every((p) => p.shape.length < 2), 'split by rank');
    const adamw = new k.Adam(groups, 1e-3, undefined, undefined, undefined, undefined, true);
    allClose(adamw.groupLrs, [1e-3, 1e-3], 0, 'AdamW over two groups');
    adamw.free(); sgd.free(); model.free(); g.free(); a.free(); b.free();
  }],

  ['one error kind per mistake; KilnError is exported', async (k, env, kiln) => {
    assert(typeof k.KilnError === 'function', 'KilnError exported');
    assert(k.start === undefined && k.__wbg_init === undefined, 'no internal names exported');
    const made = new k.KilnError('Shape', 'myOp', 'myOp: bad');
    assert(made instanceof Error && made instanceof k.KilnError && made.kind === 'Shape' && made.op === 'myOp' && made.name === 'KilnError', 'constructible');
    const g = kiln.graph();
    const logits = g.zeros([2, 3]);
    const floatLabels = g.tensor(new Float32Array([0, 1]), [2]);
    const intLabels = g.tensor(new Int32Array([0, 1]), [2]);
    for (const [what, fn] of [
      ['crossEntropy', () => k.crossEntropy(logits, floatLabels)],
      ['nllLoss', () => k.nllLoss(logits, floatLabels)],
      ['oneHot', () => floatLabels.oneHot(3)],
      ['indexSelect', () => logits.indexSelect(0, floatLabels)],
      ['matmul', () => intLabels.reshape([1, 2]).matmul(logits)],
    ]) {
      throws(fn, (e) => {
        assert(e instanceof k.KilnError && e.kind === 'DType', `${what}: kind ${e.kind}: ${e.message}`);
        assert(!/\.rs:\d+/.test(e.message), `${what}: no Rust location: ${e.message}`);
      }, what);
    }
    throws(() => k.crossEntropy(logits, g.tensor(new Int32Array([0, 1, 2]), [3])), (e) => assert(e.kind === 'Shape', e.message), 'label count');
    await rejects(k.crossEntropy(logits, g.tensor(new Int32Array([0, 5]), [2])).item(),
      (e) => assert(e.kind === 'OutOfRange' && /5/.test(e.message), `bad label: ${e.kind} ${e.message}`), 'label out of range');
    g.free();
  }],
  ['integer arguments are checked, never wrapped or truncated', async (k, env, kiln) => {
    // wasm-bindgen's own integer conversions wrap (-1 -> 4294967295) and
    // truncate (2.5 -> 2); kiln takes numbers and checks them.
    const g = kiln.graph();
    const x = g.tensor(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    const labels = g.tensor(new Int32Array([0, 2]), [2]);
    for (const [what, fn, name] of [
      ['arange length -5', () => g.arange(0, 1, -5), 'length'],
      ['arange length 2^40', () => g.arange(0, 1, 2 ** 40), 'length'],
      ['arange length 2.5', () => g.arange(0, 1, 2.5), 'length'],
      ['sliceAxis start -1', () => x.sliceAxis(1, -1, 2), 'start'],
      ['sliceAxis end NaN', () => x.sliceAxis(1, 0, NaN), 'end'],
      ['sliceAxis axis 0.5', () => x.sliceAxis(0.5, 0, 1), 'axis'],
      ['chunk -1', () => x.chunk(-1), 'chunks'],
      ['topKFilter -1', () => x.topKFilter(-1), 'k'],
      ['oneHot classes -1', () => labels.oneHot(-1), 'classes'],
      ['softmax axis 2^32 - 1', () => x.softmax(2 ** 32 - 1), 'axis'],
      ['linear inFeatures -1', () => kiln.linear(-1, 3), 'inFeatures'],
      ['embedding dim 1.5', () => kiln.embedding(4, 1.5), 'dim'],
      ['conv2d outChannels undefined', () => kiln.conv2d(1, undefined, 3), 'outChannels'],
      ['kvCache capacity -2', () => kiln.kvCache(1, 1, 1, 4, -2), 'capacity'],
      ['trilMask rows -3', () => g.trilMask(-3, 3), 'rows'],
      ['randNormal seed 0.5', () => g.randNormal([2], 0.5), 'seed'],
      ['permutation n -1', () => k.permutation(-1, 0), 'n'],
    ]) {
      throws(fn, (e) => {
        assert(e instanceof k.KilnError && e.kind === 'InvalidArgument', `${what}: ${e.kind} ${e.message}`);
        assert(e.message.includes(`${name} = `), `${what}: names ${name}: ${e.message}`);
      }, what);
    }
    // Negative seeds are distinct streams, not all seed 0.
    const a = await g.randNormal([4], -1).toArray();
    const b = await g.randNormal([4], 0).toArray();
    assert(a.some((v, i) => v !== b[i]), 'seed -1 differs from seed 0');
    // A label outside 0..classes is an error (as PyTorch's one_hot), not a zero row.
    await rejects(g.tensor(new Int32Array([0, 5]), [2]).oneHot(3).toArray(),
      (e) => assert(e.kind === 'OutOfRange' && /index 5 at position 1/.test(e.message), `oneHot label: ${e.kind} ${e.message}`), 'oneHot label 5 of 3');
    allClose(await labels.oneHot(3).toArray(), [1, 0, 0, 0, 0, 1], 0, 'oneHot still works');
    g.free();
  }],
  ['objects freed by hand are refused with a KilnError, and free() twice is harmless', async (k, env, kiln) => {
    const g = kiln.graph();
    const t = g.tensor(new Float32Array([1, 2]), [2]);
    t.free();
    t.free();
    assert(t.isAlive === false, 'a freed tensor is not alive');
    const freed = (kind, name, pattern) => (e) => {
      assert(e instanceof k.KilnError && e.kind === kind && e.op === name && pattern.test(e.message), `${e.kind} ${e.op}: ${e.message}`);
    };
    throws(() => t.add(1), freed('StaleTensor', 'Tensor', /this Tensor was freed/), 'method of a freed tensor');
    await rejects(t.toArray(), freed('StaleTensor', 'Tensor', /this Tensor was freed/), 'read of a freed tensor');
    throws(() => g.tensor(new Float32Array([3, 4]), [2]).add(t), freed('StaleTensor', 'Tensor', /a Tensor passed as an argument was freed/), 'freed operand');
    const model = kiln.mlp([2, 3]);
    model.free();
    model.free();
    throws(() => model.forward(g.zeros([1, 2])), freed('InvalidArgument', 'Sequential', /this Sequential was freed/), 'freed model');
    throws(() => k.decaySplit(model, 0.1), freed('InvalidArgument', 'Sequential', /a Sequential passed as an argument was freed/), 'freed model as an argument');
    throws(() => new k.Adam(model, 1e-3), (e) => assert(e instanceof k.KilnError && e.kind === 'InvalidArgument', e.message), 'freed model given to a constructor');
    const other = kiln.graph();
    other.free();
    other.free();
    throws(() => other.zeros([1]), (e) => assert(e instanceof k.KilnError && e.kind === 'StaleTensor', e.message), 'freed graph');
    allClose(await g.tensor(new Float32Array([1, 2]), [2]).add(1).toArray(), [2, 3], 0, 'the graph still works');
    g.free();
  }],
  ['a read started before reset still resolves', async (k, env, kiln) => {
    const g = kiln.graph();
    const x = g.tensor(new Float32Array([1, 2, 3]), [3]);
    const p = x.mul(10).toArray();
    g.reset();
    g.tensor(new Float32Array([7, 7, 7]), [3]).add(1);
    allClose(await p, [10, 20, 30], TOL, 'snapshot at call time');
    g.free();
  }],

  ['free() and reset() release device memory', async (k, env, kiln) => {
    const base = kiln.liveBuffers;
    const model = kiln.mlp([8, 16, 4], 'relu', 3);
    const opt = new k.Adam(model, 1e-3);
    assert(kiln.liveBuffers > base, 'parameters and state use buffers');
    const g = kiln.graph();
    const loss = model.forward(g.tensor(new Float32Array(16), [2, 8])).square().mean();
    loss.backward();
    opt.step();
    await loss.item();
    g.reset();
    opt.zeroGrad();
    opt.free();
    model.free();
    g.free();
    assert(kiln.liveBuffers === base, `all buffers back: ${kiln.liveBuffers} vs ${base}`);
  }],

  ['Linear, Sequential, SGD on a regression', async (k, env, kiln) => {
    const lin = kiln.linear(2, 1, true, 5);
    assert(lin.inFeatures === 2 && lin.outFeatures === 1 && lin.numParameters === 3, 'linear metadata');
    const model = kiln.sequential();
    model.add(lin);
    assert(model.length === 1 && model.parameters().length === 2, 'sequential');
    const opt = new k.Sgd(model.parameters(), 0.1, 0.9);
    const xs = new Float32Array([0, 0, 1, 0, 0, 1, 1, 1, 2, 1, 1, 2]);
    const ys = new Float32Array([1, 3, -1, 1, 3, -1]); // y = 1 + 2a - 2b
    const g = kiln.graph();
    let first, last;
    for (let i = 0; i < 150; i++) {
      g.reset();
      const loss = k.mseLoss(model.forward(g.tensor(xs, [6, 2])), g.tensor(ys, [6, 1]));
      opt.zeroGrad();
      loss.backward();
      opt.step();
      last = await loss.item();
      if (first === undefined) first = last;
    }
    assert(last < 1e-3 && last < first / 100, `mse ${first} -> ${last}`);
    const w = await lin.weight.value();
    allClose(w, [2, -2], 0.05, 'learned weights');
    throws(() => model.add('swish'), (e) => assert(/unknown activation 'swish'/.test(e.message), e.message), 'bad activation');
    opt.free(); model.free(); lin.free(); g.free();
  }],

  ['every primitive of the op table is reachable from JavaScript', async (k, env, kiln) => {
    const kinds = k.opKinds();
    assert(kinds.length >= 50 && kinds.includes('MatMul'), `opKinds(): ${kinds}`);
    const missing = kinds.filter((name) => !(name in reach) && !(name in exceptions));
    assert(missing.length === 0, `ops with no JS counterpart and no declared exception: ${missing.join(', ')}`);
    for (const [name, why] of Object.entries(exceptions)) assert(typeof why === 'string' && why.length > 10, `exception ${name} needs a reason`);
    const unknown = Object.keys(reach).filter((name) => !kinds.includes(name));
    assert(unknown.length === 0, `coverage entries for ops the table does not have: ${unknown.join(', ')}`);
    const g = kiln.graph();
    for (const name of kinds) {
      if (!(name in reach)) continue;
      g.reset();
      const t = reach[name](g, kiln, k);
      await t.toArray();
      assert(g.countOps(name) >= 1, `${name}: the JS call recorded no ${name} node`);
    }
    g.free();
  }],

  ['slicing, scatter, windows, random, masks, composed ops', async (k, env, kiln) => {
    const g = kiln.graph();
    const x = g.tensor(new Float32Array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), [3, 4]);
    allClose(await x.slice([[1, 3], [0, 4, 2]]).toArray(), [4, 6, 8, 10], 0, 'multi-axis slice');
    allClose(await x.slice([null, [3, 99]]).toArray(), [3, 7, 11], 0, 'null axis, clamped end');
    const idx = g.tensor(new Int32Array([0, 2, 0]), [3]);
    allClose(await g.zeros([3]).scatterAdd(0, idx, g.tensor(new Float32Array([1, 2, 3]), [3])).toArray(), [4, 0, 2], 0, 'scatterAdd');
    const parts = x.split([1, 2], 0);
    assert(parts.length === 2 && JSON.stringify(parts[1].shape) === '[2,4]', 'split');
    assert(x.chunk(2, 1).length === 2, 'chunk');
    const im = g.tensor(new Float32Array(Array.from({ length: 16 }, (_, i) => i)), [1, 1, 4, 4]);
    allClose(await im.maxPool2d(2).toArray(), [5, 7, 13, 15], 0, 'maxPool2d');
    const cols = im.im2col(2, 2);
    assert(JSON.stringify(cols.shape) === '[1,4,4]', `im2col shape ${cols.shape}`);
    allClose(await cols.col2im([4, 4], 2, 2).toArray(), Array.from({ length: 16 }, (_, i) => i), 0, 'col2im inverts non-overlapping im2col');
    const u1 = await g.randUniform([64], 5).toArray();
    const u2 = await g.randUniform([64], 5).toArray();
    allClose(u1, u2, 0, 'same seed, same numbers');
    assert(u1.every((v) => v >= 0 && v < 1), 'uniform in [0, 1)');
    const n = await g.randNormal([1000], 3).toArray();
    const mean = n.reduce((a, b) => a + b) / n.length;
    assert(Math.abs(mean) < 0.15, `normal mean ${mean}`);
    const v = g.tensor(new Float32Array([-1, 0.5]), [2]);
    allClose(await v.erfc().toArray(), [1.8427007929, 0.4795001222], 1e-5, 'erfc');
    allClose(await g.tensor(new Float32Array([0.25, 0.5]), [2]).log1p().toArray(), [Math.log1p(0.25), Math.log1p(0.5)], 1e-6, 'log1p');
    allClose(await v.expm1().toArray(), [Math.expm1(-1), Math.expm1(0.5)], 1e-6, 'expm1');
    allClose(await v.leakyRelu(0.1).toArray(), [-0.1, 0.5], 1e-6, 'leakyRelu');
    allClose(await g.ones([2, 2]).tril().toArray(), [1, 0, 1, 1], 0, 'tril');
    allClose(await g.zeros([2, 2]).causalSoftmax().toArray(), [1, 0, 0.5, 0.5], 1e-6, 'causalSoftmax');
    const m = g.tensor(new Uint8Array([1, 0]), [2]);
    allClose(await v.maskedFill(m, 9).toArray(), [9, 0.5], 0, 'maskedFill');
    throws(() => x.slice([[0, 1, 0]]), (e) => assert(e.kind === 'InvalidArgument' && /step/.test(e.message), e.message), 'zero step');
    g.free();
  }],

  ['layers: conv, pooling, norms, embedding, dropout, flatten, attention', async (k, env, kiln) => {
    const g = kiln.graph();
    const model = kiln.sequential();
    const conv = kiln.conv2d(1, 4, 3, { padding: 1, seed: 2 });
    assert(conv.kind === 'Conv2d' && conv.numParameters === 4 * 9 + 4, `conv ${conv.kind} ${conv.numParameters}`);
    for (const layer of [conv, kiln.batchNorm2d(4), 'relu', kiln.maxPool2d(2), kiln.avgPool2d(1), kiln.adaptiveAvgPool2d(2), kiln.flatten(), kiln.layerNorm([16]), kiln.dropout(0.1, 4), kiln.linear(16, 3, true, 1)]) model.add(layer);
    const x = g.randNormal([2, 1, 8, 8], 1);
    const y = g.tensor(new Int32Array([0, 2]), [2]);
    const opt = new k.Adam(model, 1e-2);
    const loss = k.crossEntropy(model.forward(x), y);
    loss.backward();
    opt.step();
    assert(Number.isFinite(await loss.item()), 'finite loss');
    model.setTraining(false);
    g.reset();
    const out = model.forward(g.randNormal([2, 1, 8, 8], 1));
    assert(JSON.stringify(out.shape) === '[2,3]', `output shape ${out.shape}`);
    const emb = kiln.embedding(10, 4, 3);
    const e = emb.forward(g.tensor(new Int32Array([1, 9, 1]), [3]));
    const ev = await e.toArray();
    allClose(ev.slice(0, 4), ev.slice(8, 12), 0, 'same index, same row');
    const attn = kiln.multiheadAttention(8, 2, { causal: true, seed: 1 });
    assert(JSON.stringify(attn.forward(g.randNormal([1, 3, 8], 2)).shape) === '[1,3,8]', 'attention shape');
    const block = kiln.transformerBlock(8, 2, 16, 0, 1);
    assert(JSON.stringify(block.forward(g.randNormal([1, 3, 8], 2)).shape) === '[1,3,8]', 'transformer block shape');
    const q = g.randNormal([1, 3, 4], 3);
    assert(JSON.stringify(k.scaledDotProductAttention(q, q, q, undefined, true).shape) === '[1,3,4]', 'sdpa');
    throws(() => kiln.conv2d(3, 4, 3, { groups: 2 }), (e) => assert(/divisible by groups/.test(e.message), e.message), 'bad groups');
    opt.free(); model.free(); emb.free(); attn.free(); block.free(); g.free();
  }],
  ['KvCache: decoding one position at a time through forwardCached equals the full causal forward', async (k, env, kiln) => {
    const g = kiln.graph();
    const blocks = [kiln.transformerBlock(8, 2, 16, 0, 1), kiln.transformerBlock(8, 2, 16, 0, 2)];
    const x = await g.randNormal([1, 5, 8], 4).toArray();
    g.reset();
    let full = g.tensor(x, [1, 5, 8]);
    for (const b of blocks) full = b.forward(full);
    const want = await full.toArray();
    const cache = kiln.kvCache(2, 1, 2, 4, 6);
    assert(cache.length === 0 && cache.capacity === 6, `empty cache: ${cache.length}/${cache.capacity}`);
    // The first two positions at once, then one at a time.
    for (const [start, len] of [[0, 2], [2, 1], [3, 1], [4, 1]]) {
      g.reset();
      let y = g.noGrad(() => {
        let h = g.tensor(x.slice(start * 8, (start + len) * 8), [1, len, 8]);
        blocks.forEach((b, i) => { h = b.forwardCached(h, cache, i); });
        return h;
      });
      cache.advance(len);
      allClose(await y.toArray(), want.slice(start * 8, (start + len) * 8), 1e-4, `positions ${start}..${start + len}`);
    }
    assert(cache.length === 5, `length ${cache.length}`);
    throws(() => cache.advance(2), (e) => assert(e instanceof k.KilnError && e.kind === 'OutOfRange' && /capacity 6/.test(e.message), e.message), 'past the capacity');
    const lin = kiln.layerNorm([8]);
    throws(() => lin.forwardCached(g.tensor(x.slice(0, 8), [1, 1, 8]), cache, 0), (e) => assert(e.kind === 'Unsupported' && /LayerNorm/.test(e.message), e.message), 'a layer without a cache');
    throws(() => blocks[0].forwardCached(g.tensor(x.slice(0, 8), [1, 1, 8]), cache, 2), (e) => assert(e.kind === 'OutOfRange' && /layer 2/.test(e.message), e.message), 'no such layer');
    cache.reset();
    assert(cache.length === 0, 'reset empties it');
    g.reset();
    const h = g.noGrad(() => blocks.reduce((t, b, i) => b.forwardCached(t, cache, i), g.tensor(x.slice(0, 8), [1, 1, 8])));
    allClose(await h.toArray(), want.slice(0, 8), 1e-4, 'after reset, position 0 again');
    cache.free(); lin.free(); blocks.forEach((b) => b.free()); g.free();
  }],
  ['initParam: kiln-core\'s initialisers, by name', async (k, env, kiln) => {
    const values = async (...args) => { const p = kiln.initParam(...args); const v = await p.value(); p.free(); return v; };
    assert((await values('zeros', 'z', [2, 3])).every((v) => v === 0), 'zeros');
    assert((await values('ones', 'o', [4])).every((v) => v === 1), 'ones');
    assert((await values('constant', 'c', [3], 0.25)).every((v) => v === 0.25), 'constant');
    const u = await values('uniform', 'u', [1000], -2, 3, 5);
    assert(u.every((v) => v >= -2 && v <= 3) && Math.min(...u) < -1.5 && Math.max(...u) > 2.5, 'uniform in [-2, 3], spread');
    allClose(u, await values('uniform', 'u', [1000], -2, 3, 5), 0, 'the same seed, the same values');
    const n = await values('normal', 'n', [4000], 1, 2, 6);
    const mean = n.reduce((a, b) => a + b, 0) / n.length;
    const std = Math.sqrt(n.reduce((a, b) => a + (b - mean) ** 2, 0) / n.length);
    close(mean, 1, 0.1, 'normal mean'); close(std, 2, 0.05, 'normal std');
    // [out, in] = [30, 20]: fan-in 20, fan-out 30.
    const xu = await values('xavierUniform', 'w', [30, 20], 1, 7);
    const bound = Math.sqrt(6 / 50);
    assert(xu.every((v) => Math.abs(v) <= bound) && Math.max(...xu.map(Math.abs)) > 0.9 * bound, `xavierUniform within ±${bound}`);
    const kn = await values('kaimingNormal', 'w', [200, 50], 0, 8);
    close(Math.sqrt(kn.reduce((a, b) => a + b * b, 0) / kn.length), Math.sqrt(2 / 50), 0.05, 'kaimingNormal std');
    const ku = await values('kaimingUniform', 'w', [10, 24], 0, 9);
    assert(ku.every((v) => Math.abs(v) <= Math.sqrt(6 / 24)), 'kaimingUniform bound');
    close(Math.sqrt((await values('xavierNormal', 'w', [100, 100], 2, 1)).reduce((a, b) => a + b * b, 0) / 1e4), 2 * Math.sqrt(2 / 200), 0.05, 'xavierNormal std with gain 2');
    const p = kiln.initParam('normal', 'named', [2, 2]);
    assert(p.name === 'named' && JSON.stringify(Array.from(p.shape)) === '[2,2]' && p.requiresGrad, 'a trainable Param');
    p.free();
    throws(() => kiln.initParam('glorot', 'w', [2]), (e) => assert(e instanceof k.KilnError && e.kind === 'InvalidArgument' && /unknown initialiser "glorot"/.test(e.message), e.message), 'unknown kind');
    throws(() => kiln.initParam('uniform', 'w', [2], 1, 0), (e) => assert(e instanceof k.KilnError && /init::uniform/.test(e.message), e.message), 'high < low');
    throws(() => kiln.initParam('xavierUniform', 'w', []), (e) => assert(e instanceof k.KilnError && e.kind === 'Shape', e.message), 'a scalar has no fans');
  }],
  ['digits: loadDigits inflates gzipped bytes; digitsFromBytes takes the plain CSV', async (k) => {
    const csv = Array.from({ length: 10 }, (_, i) => [...Array(64).fill(i % 17), i % 10].join(',')).join('\n');
    const plain = new TextEncoder().encode(csv);
    const gz = new Uint8Array(await new Response(new Blob([plain]).stream().pipeThrough(new CompressionStream('gzip'))).arrayBuffer());
    const a = await k.loadDigits(0.2, 1, gz);
    const b = k.digitsFromBytes(plain, 0.2, 1);
    assert(a.train.length === 8 && a.test.length === 2 && b.train.length === 8, 'split of 10 samples');
    allClose(a.train.images, b.train.images, 0, 'gzipped and plain bytes give the same images');
    allClose(a.test.labels, b.test.labels, 0, 'and labels');
    throws(() => k.digitsFromBytes(gz, 0.2, 1), (e) => assert(e.kind === 'Unsupported' && /gzip/.test(e.message), e.message), 'gzip to digitsFromBytes');
    await rejects(k.loadDigits(0.2, 1, gz.subarray(0, gz.length - 12)),
      (e) => assert(e instanceof k.KilnError && e.kind === 'Io' && /corrupt or truncated/.test(e.message), e.message), 'truncated gzip');
    for (const d of [a.train, a.test, b.train, b.test]) d.free();
  }],
  ['an MLP learns the embedded digits with Adam', async (k, env, kiln) => {
    const { train, test } = await k.loadDigits(0.2, 42);
    assert(train.length === 1438 && test.length === 359 && train.features === 64 && train.classes === 10, 'digits split');
    const model = kiln.mlp([64, 32, 10], 'relu', 1);
    const opt = new k.Adam(model, 1e-2);
    const g = kiln.graph();
    const losses = [];
    for (let epoch = 0; epoch < 4; epoch++) {
      const order = train.epochOrder(7, epoch);
      for (let s = 0; s < order.length; s += 64) {
        const b = train.gather(order.subarray(s, s + 64));
        g.reset();
        const loss = k.crossEntropy(model.forward(g.tensor(b.images, [b.size, 64])), g.tensor(b.labels, [b.size]));
        opt.zeroGrad();
        loss.backward();
        opt.step();
        losses.push(await loss.item());
      }
    }
    const head = losses.slice(0, 5).reduce((a, b) => a + b) / 5;
    const tail = losses.slice(-5).reduce((a, b) => a + b) / 5;
    assert(tail < head * 0.3, `loss ${head} -> ${tail}`);
    g.reset();
    const pred = g.noGrad(() => model.forward(g.tensor(test.images, [test.length, 64])).argmax(1));
    const p = await pred.toArray();
    const labels = test.labels;
    let correct = 0;
    for (let i = 0; i < p.length; i++) correct += p[i] === labels[i] ? 1 : 0;
    assert(correct / p.length > 0.9, `test accuracy ${correct / p.length}`);
    opt.free(); model.free(); g.free(); train.free(); test.free();
  }],
  ['custom ops from JavaScript: JS forward, WGSL kernel, backward in kiln ops', async (k, env, kiln) => {
    const swishWgsl = `
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = kiln_index(wid, nwg, lid);
    if (i >= kiln_len()) {
        return;
    }
    y[i] = x[i] / (1.0 + exp(-x[i]));
}
`;
    const forward = ([x], out) => { for (let i = 0; i < x.length; i++) out[i] = x[i] / (1 + Math.exp(-x[i])); };
    const define = (name, backward) => k.findCustomOp(name) ?? k.customOp({ name, arity: 1, wgsl: swishWgsl, forward, backward });
    // d swish = s + x·s·(1 − s), s = sigmoid(x); the wrong one forgets the second term.
    const swish = define('JsSwish', ([x], y, g) => { const s = x.sigmoid(); return [g.mul(s.mul(s.neg().add(1)).mul(x).add(s))]; });
    const wrong = define('JsSwishWrong', ([x], y, g) => [g.mul(x.sigmoid())]);
    assert(swish instanceof k.CustomOp && swish.name === 'JsSwish' && swish.arity === 1 && swish.hasWgsl && swish.hasBackward, 'metadata');
    const xs = [-2, -0.5, 0, 0.5, 2, 3];
    const sig = (x) => 1 / (1 + Math.exp(-x));
    const ref = xs.map((x) => x * sig(x));
    const d1 = (x) => sig(x) + x * sig(x) * (1 - sig(x));
    const d2 = (x) => sig(x) * (1 - sig(x)) * (2 + x * (1 - 2 * sig(x)));

    // Forward on this kiln's device (on WebGPU: the WGSL kernel) and on the CPU (the JS forward).
    const g = kiln.graph();
    const y = swish.apply([g.tensor(new Float32Array(xs), [2, 3])]);
    assert(JSON.stringify(y.shape) === '[2,3]' && y.dtype === 'float32', 'shape and dtype inferred');
    allClose(await y.toArray(), ref, 1e-5, `forward on ${kiln.device}`);
    assert(g.countOps('JsSwish') === 1, 'one JsSwish node');
    const cpu = await k.Kiln.create('cpu');
    const gc = cpu.graph();
    allClose(await swish.apply([gc.tensor(new Float32Array(xs), [6])]).toArray(), ref, 1e-6, 'JS forward (f32)');

    // Gradient on this device, and the second derivative through the backward's kiln ops.
    g.reset();
    const xv = g.variable(new Float32Array(xs), [6]);
    const [dx] = g.grad(swish.apply([xv]).sum(), [xv]);
    allClose(await dx.toArray(), xs.map(d1), 1e-4, `first derivative on ${kiln.device}`);
    const [ddx] = g.grad(dx.sum(), [xv]);
    allClose(await ddx.toArray(), xs.map(d2), 1e-4, `second derivative on ${kiln.device}`);

    // Finite differences in f64 on the CPU (the JS forward gets Float64Arrays): the
    // right backward agrees, the wrong one is caught.
    const w = new Float64Array([0.3, -1.1, 0.7, 2.0, -0.4, 1.3]);
    const worstError = async (op) => {
      gc.reset();
      const x = gc.variable(new Float64Array(xs), [6]);
      op.apply([x]).mul(gc.tensor(w, [6])).sum().backward();
      const analytic = await x.grad.toArray();
      assert(analytic instanceof Float64Array, 'f64 gradient');
      let worst = 0;
      for (let i = 0; i < xs.length; i++) {
        const at = async (h) => {
          gc.reset();
          const v = new Float64Array(xs); v[i] += h;
          return op.apply([gc.tensor(v, [6])]).mul(gc.tensor(w, [6])).sum().item();
        };
        const numeric = ((await at(1e-6)) - (await at(-1e-6))) / 2e-6;
        worst = Math.max(worst, Math.abs(numeric - analytic[i]));
      }
      return worst;
    };
    const good = await worstError(swish);
    assert(good < 1e-6, `gradcheck of JsSwish: worst error ${good}`);
    const bad = await worstError(wrong);
    assert(bad > 1e-2, `a wrong backward must fail the check: worst error ${bad}`);

    // checkCustomOp: forward parity on this device, first and second order on the CPU,
    // the float32 gradient on this device; a wrong backward or a wrong WGSL kernel fails it.
    const sample = [{ values: xs, shape: [2, 3] }];
    const report = await k.checkCustomOp(swish, sample, { kiln });
    assert(report.passed && report.firstOrder && report.secondOrder, report.text);
    const onDevice = env.expect === 'webgpu';
    assert((report.parity !== null) === onDevice && (report.deviceGradient !== null) === onDevice, report.text);
    const badReport = await k.checkCustomOp(wrong, sample, { kiln });
    assert(!badReport.passed && !badReport.firstOrder.passed && /FAILED/.test(badReport.text), badReport.text);
    if (onDevice) {
      const mismatched = k.findCustomOp('JsSwishBadWgsl') ?? k.customOp({
        name: 'JsSwishBadWgsl', arity: 1, forward, wgsl: swishWgsl.replace('exp(-x[i])', 'exp(-2.0 * x[i])'),
      });
      const r = await k.checkCustomOp(mismatched, sample, { kiln });
      assert(!r.passed && !r.parity.passed && r.firstOrder === null, r.text);
    }
    await rejects(k.checkCustomOp(swish, [], { kiln }), (e) => assert(/takes 1 operands, 0 given/.test(e.message), e.message), 'checkCustomOp arity');

    // Shape inference from JS, a forward returning its values, no WGSL.
    const rowSum = k.findCustomOp('JsRowSum') ?? k.customOp({
      name: 'JsRowSum', arity: 1, outputShape: ([s]) => [s[0]],
      forward: ([x], out, [[n, m]]) => Array.from({ length: n }, (_, r) => x.slice(r * m, (r + 1) * m).reduce((a, b) => a + b, 0)),
      backward: ([x], y, g) => [g.reshape([-1, 1]).expand(x.shape)],
    });
    gc.reset();
    const m = gc.variable(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    const rs = rowSum.apply([m]);
    assert(JSON.stringify(rs.shape) === '[2]' && !rowSum.hasWgsl, 'outputShape');
    allClose(await rs.toArray(), [6, 15], 0, 'row sums');
    rs.mul(gc.tensor(new Float32Array([2, 3]), [2])).sum().backward();
    allClose(await m.grad.toArray(), [2, 2, 2, 3, 3, 3], 0, 'row-sum gradient');
    if (env.expect === 'webgpu') {
      g.reset();
      await rejects(rowSum.apply([g.tensor(new Float32Array(6), [2, 3])]).toArray(),
        (e) => assert(/JsRowSum/.test(e.message), e.message), 'an op without WGSL on WebGPU names the op');
    }

    // Errors: refused definitions and failing callbacks name the op; state stays usable.
    throws(() => k.customOp({ name: 'JsSwish', arity: 1, forward }), (e) => assert(e instanceof k.KilnError && /already exists/.test(e.message), e.message), 'duplicate name');
    throws(() => k.customOp({ name: 'JsBadWgsl', arity: 1, forward, wgsl: swishWgsl.replace('exp(-x[i])', 'exp(-x[i]') }),
      (e) => assert(/JsBadWgsl/.test(e.message) && /wgsl:\d+:\d+/.test(e.message), e.message), 'WGSL that does not parse, with the line');
    throws(() => k.customOp({ name: 'JsUnusedInput', arity: 1, forward, wgsl: swishWgsl.replace('x[i] / (1.0 + exp(-x[i]))', '1.0') }),
      (e) => assert(/JsUnusedInput/.test(e.message) && /`x` \(binding 1\) is declared but `main` never uses it/.test(e.message), e.message), 'binding contract checked at registration');
    if (env.expect === 'webgpu') {
      // A type error only a WGSL compiler sees (f32 + u32): on WebGPU the browser's compiler
      // refuses it when the op first runs, and the read fails with its message, the op and
      // the user's line; the kernel stays refused and other ops keep working.
      const typeError = k.findCustomOp('JsTypeWgsl') ?? k.customOp({
        name: 'JsTypeWgsl', arity: 1, forward, wgsl: swishWgsl.replace('x[i] / (1.0 + exp(-x[i]))', 'x[i] + 1u'),
      });
      g.reset();
      const compiled = (e) => assert(e instanceof k.KilnError && /JsTypeWgsl/.test(e.message) && /WebGPU compiler refused it/.test(e.message)
        && /wgsl:11:\d+: /.test(e.message), e.message);
      await rejects(typeError.apply([g.tensor(new Float32Array(3), [3])]).toArray(), compiled, 'browser compiler error at the read');
      g.reset();
      let again = null;
      try { await typeError.apply([g.tensor(new Float32Array(3), [3])]).toArray(); } catch (e) { again = e; }
      assert(again !== null, 'a refused kernel stays refused');
      compiled(again);
      g.reset();
      allClose(await swish.apply([g.tensor(new Float32Array([0]), [1])]).toArray(), [0], 0, 'WebGPU usable after a refused kernel');
    }
    throws(() => k.customOp({ name: 'JsNoForward', arity: 1 }), (e) => assert(/'forward'.*required/.test(e.message), e.message), 'forward required');
    throws(() => swish.apply([gc.tensor(new Float32Array(2), [2]), gc.tensor(new Float32Array(2), [2])]),
      (e) => assert(/JsSwish/.test(e.message) && /takes 1 operands, got 2/.test(e.message), e.message), 'arity');
    const throwing = k.findCustomOp('JsThrows') ?? k.customOp({ name: 'JsThrows', arity: 1, forward: () => { throw new Error('boom'); } });
    gc.reset();
    await rejects(throwing.apply([gc.tensor(new Float32Array(2), [2])]).toArray(),
      (e) => assert(/JsThrows/.test(e.message) && /threw: boom/.test(e.message), e.message), 'a throwing forward');
    const short = k.findCustomOp('JsShort') ?? k.customOp({ name: 'JsShort', arity: 1, forward: () => [1] });
    gc.reset();
    await rejects(short.apply([gc.tensor(new Float32Array(2), [2])]).toArray(),
      (e) => assert(/JsShort/.test(e.message) && /1 values for an output of 2/.test(e.message), e.message), 'wrong output length');
    const badGrad = k.findCustomOp('JsBadGrad') ?? k.customOp({ name: 'JsBadGrad', arity: 1, forward: ([x], out) => out.set(x), backward: ([x], y, g) => [g.sum()] });
    gc.reset();
    const sv = gc.variable(new Float32Array(2), [2]);
    throws(() => badGrad.apply([sv]).sum().backward(),
      (e) => assert(/JsBadGrad/.test(e.message) && /gradient of input 0 is \[\] f32 but the input is \[2\] f32/.test(e.message), e.message), 'wrong gradient shape');
    gc.reset();
    allClose(await swish.apply([gc.tensor(new Float32Array([0]), [1])]).toArray(), [0], 0, 'usable after errors');
    g.free(); gc.free(); cpu.free();
  }],

  ['customVjp from JavaScript: straight-through quantiser, gradient reversal, second order', async (k, env, kiln) => {
    // Rounding to the 1/4 grid: a custom op with a JS forward and WGSL, no gradient of its own.
    const round = k.findCustomOp('JsRoundQuarter') ?? k.customOp({
      name: 'JsRoundQuarter', arity: 1, dtypes: ['float32'],
      forward: ([x], out) => { for (let i = 0; i < x.length; i++) out[i] = Math.floor(x[i] * 4 + 0.5) / 4; },
      wgsl: `
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = kiln_index(wid, nwg, lid);
    if (i >= kiln_len()) {
        return;
    }
    y[i] = floor(x[i] * 4.0 + 0.5) / 4.0;
}
`,
    });
    const xs = [-1.3, -0.3, 0.1, 0.37, 0.9, 1.2];
    const ws = [0.5, 1, 1.5, 2, 2.5, 3];
    const quantise = (x, clip) => k.customVjp(([x]) => round.apply([x.clamp(-1, 1)]), [x],
      ([x], [y], [dy]) => [clip ? x.abs().le(1).where(dy, 0) : dy])[0];
    const g = kiln.graph();
    for (const clip of [true, false]) {
      g.reset();
      const x = g.variable(new Float32Array(xs), [6]);
      const q = quantise(x, clip);
      q.mul(g.tensor(new Float32Array(ws), [6])).sum().backward();
      allClose(await q.toArray(), [-1, -0.25, 0, 0.25, 1, 1], 0, `quantised on ${kiln.device}`);
      const grad = Array.from(await x.grad.toArray());
      const expected = xs.map((v, i) => (Math.abs(v) <= 1 ? ws[i] : 0));
      const same = grad.every((v, i) => v === expected[i]);
      // The check fails for the unclipped (wrong) backward.
      assert(same === clip, `straight-through gradient (clip ${clip}): ${grad} vs ${expected}`);
    }
    // Gradient reversal of x², and the second derivative through the JS backward.
    g.reset();
    const x = g.variable(new Float32Array([1, -2]), [2]);
    const [y] = k.customVjp(([x]) => x.mul(x), [x], ([x], ys, [dy]) => [dy.mul(x).mul(-2)]);
    const [dx] = g.grad(y.sum(), [x]);
    allClose(await dx.toArray(), [-2, 4], 0, 'reversed gradient');
    const [ddx] = g.grad(dx.sum(), [x]);
    allClose(await ddx.toArray(), [-2, -2], 0, 'second derivative of the custom gradient');
    // Errors name custom_vjp and leave the graph usable.
    g.reset();
    const z = g.variable(new Float32Array([1, 2]), [2]);
    const [bad] = k.customVjp(([x]) => x.exp(), [z], ([x], ys, [dy]) => [dy, dy]);
    throws(() => bad.sum().backward(), (e) => assert(/custom_vjp/.test(e.message) && /returned 2 gradients for 1 inputs/.test(e.message), e.message), 'wrong count');
    throws(() => k.customVjp(() => { throw new Error('inner'); }, [z], () => []),
      (e) => assert(/custom_vjp/.test(e.message) && /threw: inner/.test(e.message), e.message), 'a throwing function');
    throws(() => k.customVjp(() => 3, [z], () => []), (e) => assert(/must return a Tensor/.test(e.message), e.message), 'not a tensor');
    g.reset();
    const [ok] = k.customVjp(([x]) => x.mul(3), [g.variable(new Float32Array([1]), [1])], ([x], ys, [dy]) => [dy.mul(3)]);
    close(await ok.item(), 3, 0, 'usable after errors');
    g.free();
  }],

  // The wasm build multiplies f32 with its own SIMD kernel
  // (core/src/backend/cpu/simd_gemm.rs: 4×8 tiles, k in blocks of 256, rows
  // in blocks of 64, columns in blocks of 512, panels packed by copies or
  // 4×4 transposes): shapes on and around those edges, every transpose, on
  // the CPU (in Node this is the same wasm), against float64 sums.
  ['f32 matmul of odd shapes and transposes matches float64 (CPU kernel)', async (k) => {
    const cpu = await k.Kiln.create('cpu');
    let seed = 12345;
    const rand = (n) => Float32Array.from({ length: n }, () => { seed = (seed * 1103515245 + 12345) >>> 0; return seed / 2 ** 31 - 1; });
    const g = cpu.graph();
    for (const [m, kk, n] of [[13, 37, 21], [4, 256, 8], [67, 300, 129], [70, 520, 515], [1, 600, 9], [9, 1, 700], [3, 5, 2]]) {
      for (const [ta, tb] of [[false, false], [true, false], [false, true], [true, true]]) {
        const A = rand(m * kk), B = rand(kk * n);
        const a = ta ? g.tensor(A, [kk, m]).transpose(0, 1) : g.tensor(A, [m, kk]);
        const b = tb ? g.tensor(B, [n, kk]).transpose(0, 1) : g.tensor(B, [kk, n]);
        const got = await a.matmul(b).toArray();
        for (let i = 0; i < m; i++) {
          for (let j = 0; j < n; j++) {
            let sum = 0, mag = 0;
            for (let p = 0; p < kk; p++) {
              const x = (ta ? A[p * m + i] : A[i * kk + p]) * (tb ? B[j * kk + p] : B[p * n + j]);
              sum += x;
              mag += Math.abs(x);
            }
            const err = Math.abs(got[i * n + j] - sum);
            assert(err <= 1e-6 * mag + 1e-30, `${m}x${kk}x${n} ta=${ta} tb=${tb} at (${i}, ${j}): ${got[i * n + j]} vs ${sum}`);
          }
        }
      }
    }
    g.free();
    cpu.free();
  }],

  // The wasm build's Adam runs four lanes at a time
  // (core/src/backend/cpu/update.rs, simd::adam_f32): every lane must do
  // PyTorch's formula in f32, operation by operation, as the scalar loop
  // does — so the values and both moments equal a Math.fround reference bit
  // for bit (37 elements: nine vectors and a scalar tail), with L2 and
  // decoupled decay.
  ['Adam and AdamW steps equal an f32 reference bit for bit (CPU)', async (k) => {
    const cpu = await k.Kiln.create('cpu');
    const f = Math.fround;
    const n = 37, steps = 3, [lr, b1, b2, eps, wd] = [0.01, 0.9, 0.999, 1e-8, 0.1];
    const p0 = Float32Array.from({ length: n }, (_, i) => Math.sin(i + 1) * 2);
    const c = Float32Array.from({ length: n }, (_, i) => Math.cos(3 * i) * (i % 5 === 0 ? 1e-3 : 1));
    for (const decoupled of [false, true]) {
      const p = cpu.param('p', p0, [n]);
      const opt = new k.Adam([p], lr, b1, b2, eps, wd, decoupled);
      for (let s = 0; s < steps; s++) {
        const g = cpu.graph();
        const loss = g.param(p).mul(g.tensor(c, [n])).sum();
        opt.zeroGrad();
        loss.backward();
        opt.step();
        await loss.item();
        g.free();
      }
      const got = await p.value();
      // Adam's moments from the optimizer's checkpoint (safetensors: an
      // 8-byte header length, the JSON header, the data).
      const bytes = await opt.stateDict();
      const len = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
      const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + len)));
      const moment = (key) => {
        const [from, to] = header[`optimizer.0.${key}`].data_offsets;
        return new Float32Array(bytes.slice(8 + len + from, 8 + len + to).buffer);
      };
      const [gotM, gotV] = [moment('exp_avg'), moment('exp_avg_sq')];
      // The reference: kiln's constants are computed in f64 and rounded to
      // f32 (powi: repeated products), then every operation rounds to f32.
      const want = Float32Array.from(p0), mo = new Float32Array(n), ve = new Float32Array(n);
      let pw1 = 1, pw2 = 1;
      for (let s = 1; s <= steps; s++) {
        pw1 *= b1;
        pw2 *= b2;
        // lr / (1 - b1^t) and 1 / sqrt(1 - b2^t): kiln's step constants.
        const [stepSize, rsqrtBc2, fb1, fb2, nb1, nb2] = [lr / (1 - pw1), 1 / Math.sqrt(1 - pw2), b1, b2, 1 - b1, 1 - b2].map(f);
        const [feps, fwd, decay] = [eps, wd, 1 - lr * wd].map(f);
        for (let i = 0; i < n; i++) {
          let gi = c[i], pi = want[i];
          if (decoupled) pi = f(pi * decay); else gi = f(gi + f(fwd * pi));
          mo[i] = f(f(fb1 * mo[i]) + f(nb1 * gi));
          ve[i] = f(f(fb2 * ve[i]) + f(f(nb2 * gi) * gi));
          const denom = f(f(f(Math.sqrt(ve[i])) * rsqrtBc2) + feps);
          want[i] = f(pi - f(stepSize * f(mo[i] / denom)));
        }
      }
      for (let i = 0; i < n; i++) {
        assert(Object.is(got[i], want[i]), `decoupled=${decoupled} element ${i}: ${got[i]} vs ${want[i]}`);
        assert(Object.is(gotM[i], mo[i]) && Object.is(gotV[i], ve[i]), `decoupled=${decoupled} moments of element ${i}: ${gotM[i]}, ${gotV[i]} vs ${mo[i]}, ${ve[i]}`);
      }
      opt.free();
      p.free();
    }
    cpu.free();
  }],
];

/** Run every test; returns [{name, ok, error, ms}]. */
export async function runSuite(k, env) {
  const kiln = await k.Kiln.create();
  const results = [];
  for (const [name, fn] of tests) {
    const start = Date.now();
    try {
      await fn(k, env, kiln);
      results.push({ name, ok: true, ms: Date.now() - start });
    } catch (e) {
      results.push({ name, ok: false, error: `${e && e.stack ? e.stack : e}`, ms: Date.now() - start });
    }
  }
  results.device = { device: kiln.device, deviceInfo: kiln.deviceInfo, fallbackReason: kiln.fallbackReason, webgpuAdapter: kiln.webgpuAdapter };
  return results;
}
