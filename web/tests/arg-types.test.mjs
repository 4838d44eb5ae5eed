// Wrong JavaScript types for every argument of every public method,
// setter, constructor and function (Node.js, CPU): each call either works
// or throws a KilnError, and the module stays usable after it. Before
// scripts/guard-glue.mjs, a number for a string parameter
// (`tensor.cast(3)`) corrupted wasm's allocator ("memory access out of
// bounds"), and null for an array or a wrong class object gave bare
// TypeErrors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as k from '../pkg/node.mjs';

const wrongs = [3, 'x', {}, [], null, undefined, true, -1, NaN, 1e300, [1, 'a'], ['f32'], new Float32Array(2), () => 1, 2 ** 40, Symbol('s'), 10n];
const show = (v) => typeof v === 'symbol' ? 'Symbol()' : typeof v === 'bigint' ? `${v}n` : typeof v === 'function' ? 'a function'
  : Array.isArray(v) ? JSON.stringify(v) : ArrayBuffer.isView(v) ? v.constructor.name : typeof v === 'string' ? JSON.stringify(v) : String(v);
// Argument lists: the wrong value at one position (earlier ones 1), or everywhere.
const argLists = (w, positions) => [...positions.map((p) => Array.from({ length: p + 1 }, (_, i) => (i === p ? w : 1))), [w, w, w, w, w, w]];

test('wrong argument types give KilnErrors and leave the module usable', async () => {
  await k.init();
  const kiln = await k.Kiln.create('cpu');
  const healthy = async () => {
    const g = kiln.graph();
    const r = Array.from(await g.tensor(new Float32Array([1, 2]), [2]).add(1).toArray());
    g.free();
    return r[0] === 2 && r[1] === 3;
  };
  const digits = new TextEncoder().encode((Array.from({ length: 64 }, (_, i) => i % 17).join(',') + ',3\n').repeat(4));
  const param = () => kiln.param('w', new Float32Array([1, 2]), [2]);
  const makers = {
    Kiln: () => kiln,
    Graph: () => kiln.graph(),
    Tensor: () => kiln.graph().variable(new Float32Array([1, 2, 3, 4]), [2, 2]),
    Param: param,
    Linear: () => kiln.linear(2, 2),
    Layer: () => kiln.layerNorm([2]),
    Sequential: () => kiln.mlp([2, 3, 2]),
    Adam: () => new k.Adam([param()], 0.1),
    Sgd: () => new k.Sgd([param()], 0.1),
    Schedule: () => k.Schedule.cosine(10),
    LrScheduler: () => new k.LrScheduler(new k.Sgd([param()], 0.1), k.Schedule.cosine(10)),
    KvCache: () => kiln.kvCache(1, 1, 1, 2, 4),
    Dataset: () => k.digitsFromBytes(digits, 0.5, 1).train,
  };
  // Methods that take a callback or end an object's life are left out.
  const skip = new Set(['constructor', 'free', 'noGrad', 'reset']);
  const failures = [];
  let calls = 0;
  const attempt = async (label, f) => {
    calls++;
    try {
      const r = f();
      if (r instanceof Promise) await r;
    } catch (e) {
      if (!(e instanceof k.KilnError)) failures.push(`${label}: ${e?.name}: ${e?.message}`);
      else if (!e.message.startsWith(e.op) && !/^(this|a |graph #)/.test(e.message)) failures.push(`${label}: message does not name the op: ${e.message}`);
    }
    if (!(await healthy())) throw new Error(`the module gives wrong results after ${label}`);
  };
  for (const [name, make] of Object.entries(makers)) {
    const C = k[name];
    for (const key of Object.getOwnPropertyNames(C.prototype)) {
      if (skip.has(key) || key.startsWith('__')) continue;
      const d = Object.getOwnPropertyDescriptor(C.prototype, key);
      for (const w of wrongs) {
        if (typeof d.value === 'function') {
          for (const args of argLists(w, [0, 1, 2, 3])) await attempt(`${name}.${key}(${args.map(show)})`, () => make()[key](...args));
        } else if (d.set) {
          await attempt(`${name}.${key} = ${show(w)}`, () => { make()[key] = w; });
        }
      }
    }
    for (const key of Object.getOwnPropertyNames(C)) {
      if (typeof C[key] !== 'function' || skip.has(key) || key.startsWith('__')) continue;
      for (const w of wrongs) for (const args of argLists(w, [0, 1, 2])) await attempt(`${name}.${key}(${args.map(show)})`, () => C[key](...args));
    }
    if (/\bconstructor\s*\(/.test(Function.prototype.toString.call(C))) {
      for (const w of wrongs) for (const args of argLists(w, [0, 1, 2])) await attempt(`new ${name}(${args.map(show)})`, () => new C(...args));
    }
  }
  const functions = ['clipGradNorm', 'clipGradValue', 'crossEntropy', 'crossEntropyProbs', 'customOp', 'customVjp', 'decaySplit',
    'digitsFromBytes', 'findCustomOp', 'mseLoss', 'nllLoss', 'permutation', 'scaledDotProductAttention', 'saveCheckpoint',
    'loadCheckpoint', 'checkCustomOp', 'loadDigits'];
  for (const f of functions) {
    assert.equal(typeof k[f], 'function', f);
    for (const w of wrongs) for (const args of argLists(w, [0, 1, 2])) await attempt(`${f}(${args.map(show)})`, () => k[f](...args));
  }
  assert.ok(calls > 10000, `only ${calls} calls were made`);
  assert.deepEqual(failures.slice(0, 20), [], `${failures.length} calls did not throw a KilnError`);
  // The Proxy that checks constructor arguments keeps the classes usable as classes.
  const sgd = new k.Sgd([param()], 0.1);
  assert.ok(sgd instanceof k.Sgd);
  assert.equal(sgd.constructor, k.Sgd);
  assert.equal(typeof k.Schedule.cosine, 'function');
  class MySgd extends k.Sgd {}
  assert.ok(new MySgd([param()], 0.1) instanceof MySgd);
});
