// The API suite in Node.js (CPU: Node has no WebGPU).
import { test } from 'node:test';
import * as k from '../pkg/node.mjs';
import { runSuite } from './suite.mjs';

test('kiln-web API in Node.js (CPU)', async (t) => {
  await k.init();
  const results = await runSuite(k, { expect: 'cpu', fallback: /navigator\.gpu is missing/ });
  for (const r of results) {
    await t.test(r.name, () => { if (!r.ok) throw new Error(r.error); });
  }
});
