// 20,000 training steps in Node.js with no handle freed by hand and no
// forced GC: wasm memory, live tensor handles and device buffers stay flat
// after warm-up (tests/memory.mjs). The suite runs shorter versions in
// Chromium (CPU and WebGPU).
import { test } from 'node:test';
import * as k from '../pkg/node.mjs';
import { trainWithFlatMemory, checkFlat } from './memory.mjs';

test('20,000 steps in Node.js: memory and handles flat after warm-up, without the GC', async (t) => {
  const kiln = await k.Kiln.create();
  const started = performance.now();
  const r = await trainWithFlatMemory(k, kiln, { steps: 20000, warmup: 200, readEvery: 100 });
  t.diagnostic(`${((performance.now() - started) / 1000).toFixed(1)} s; ${JSON.stringify(r)}`);
  checkFlat(r);
  kiln.free();
});
