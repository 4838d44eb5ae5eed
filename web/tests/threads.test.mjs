// The CPU path's threads in Chromium: a cross-origin isolated page (serve.mjs
// sends COOP/COEP) loads the multi-threaded module and reports its threads
// in threadInfo() and deviceInfo; a page without isolation (?coi=0) falls
// back to the single-threaded module by itself and says why. Products and
// training steps are bit-identical in both and in Node.js: the threads split
// a GEMM's output rows, never a sum.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { launch, server, openAndWait, webDir } from './helpers.mjs';
import { threadWork } from './threads-work.mjs';

const threadedBuild = fs.existsSync(path.join(webDir, 'pkg', 'web-threads', 'kiln_web_bg.wasm'));
let srv, browser, node;
before(async () => {
  srv = await server();
  browser = await launch({ webgpu: false });
  node = await threadWork(await import('../pkg/node.mjs'));
});
after(async () => { await browser?.close(); await srv?.close(); });

async function page(query) {
  const { value, logs, page: p } = await openAndWait(browser, `${srv.url}/tests/threads.html?${query}`, '__kilnThreads', 300000);
  await p.close();
  if (value.fatal) throw new Error(`page failed: ${value.fatal}\n${logs.join('\n')}`);
  return value;
}

function sameResults(t, got, want, what) {
  for (let i = 0; i < want.products.length; i++) {
    const [g, w] = [got.products[i], want.products[i]];
    assert.equal(g.digest, w.digest, `${what}: product ${w.shape} differs from Node.js (first element ${g.first} vs ${w.first})`);
  }
  assert.deepEqual(got.losses, want.losses, `${what}: training losses differ from Node.js`);
  assert.equal(got.params, want.params, `${what}: parameters after 5 Adam steps differ from Node.js`);
  t.diagnostic(`${what}: ${want.products.length} products and 5 training steps bit-identical to Node.js (losses ${got.losses.map((l) => l.toFixed(5)).join(', ')})`);
}

test('cross-origin isolated page: the multi-threaded module, threads > 1, same bits as Node.js', { skip: !threadedBuild && 'built without the multi-threaded module (KILN_WEB_THREADS=0)' }, async (t) => {
  for (const threads of [4, 2]) {
    const r = await page(`threads=${threads}`);
    t.diagnostic(`threads=${threads}: ${JSON.stringify(r.threadInfo)}; deviceInfo ${r.deviceInfo}`);
    assert.equal(r.crossOriginIsolated, true);
    assert.equal(r.threadInfo.module, 'multi-threaded');
    assert.equal(r.threadInfo.threads, threads, r.threadInfo.reason);
    assert.match(r.deviceInfo, new RegExp(`^cpu \\(${threads} threads, simd128\\)$`));
    t.diagnostic(`threads=${threads}: the Workers ran ${r.workerParts} GEMM parts`);
    assert.ok(r.workerParts > 0, 'the Workers ran no part of any product');
    sameResults(t, r, node, `${threads} threads`);
  }
});

test('page without cross-origin isolation: falls back to one thread and says why', async (t) => {
  const r = await page('coi=0');
  t.diagnostic(`${JSON.stringify(r.threadInfo)}; deviceInfo ${r.deviceInfo}`);
  assert.equal(r.crossOriginIsolated, false);
  assert.equal(r.threadInfo.module, 'single-threaded');
  assert.equal(r.threadInfo.threads, 1);
  assert.match(r.threadInfo.reason, threadedBuild ? /not cross-origin isolated/ : /without the multi-threaded module/);
  assert.equal(r.deviceInfo, 'cpu (single-threaded, simd128)');
  sameResults(t, r, node, 'single-threaded page');
});

test('threads: 1 on an isolated page: the single-threaded module', async () => {
  const r = await page('threads=1');
  assert.equal(r.threadInfo.module, 'single-threaded');
  assert.equal(r.deviceInfo, 'cpu (single-threaded, simd128)');
});
