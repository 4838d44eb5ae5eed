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

const TOL = 1e-5;

export const tests = [
  ['device selection reports what it got', async (k, env, kiln) => {
    assert(kiln.device === env.expect, `device ${kiln.device}, expected ${env.expect} (fallbackReason: ${kiln.fallbackReason})`);
    if (env.expect === 'webgpu') {
      assert(kiln.deviceInfo.startsWith('webgpu'), `deviceInfo ${kiln.deviceInfo}`);
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
    assert(/^Add: shapes \[2\] and \[3\] do not broadcast \(at .+:\d+:\d+\)$/.test(e.message), e.message);
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

  ['an MLP learns the embedded digits with Adam', async (k, env, kiln) => {
    const { train, test } = k.loadDigits(0.2, 42);
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
