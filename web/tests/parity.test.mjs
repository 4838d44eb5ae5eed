// Parity: the seeded training run of web/examples/parity.rs, natively (CPU,
// rayon + AVX GEMM) and through the JS API in Chromium and in Node (CPU,
// single-threaded wasm GEMM), gives the same losses within
// |a - b| <= TOL * (1 + |b|) at every step. The native losses come from
// running the example now (or from $KILN_PARITY_JSON, written by it).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import * as k from '../pkg/node.mjs';
import { parityLosses } from './parity.mjs';
import { launch, server, openAndWait, webDir } from './helpers.mjs';

const TOL = 1e-4;
let native, srv;

before(async () => {
  const json = process.env.KILN_PARITY_JSON
    ? fs.readFileSync(process.env.KILN_PARITY_JSON, 'utf8')
    : execFileSync('cargo', ['run', '--quiet', '--release', '-p', 'kiln-web', '--example', 'parity'], { cwd: path.join(webDir, '..'), encoding: 'utf8' });
  native = JSON.parse(json).losses;
  assert.equal(native.length, 25);
  srv = await server();
});
after(async () => { await srv?.close(); });

function compare(t, got, what) {
  assert.equal(got.length, native.length);
  let worst = 0;
  for (let i = 0; i < got.length; i++) {
    const err = Math.abs(got[i] - native[i]) / (1 + Math.abs(native[i]));
    worst = Math.max(worst, err);
    assert.ok(err <= TOL, `${what} step ${i}: ${got[i]} vs native ${native[i]}`);
  }
  t.diagnostic(`${what}: max relative difference ${worst.toExponential(2)} over ${got.length} steps (tolerance ${TOL}); loss ${native[0].toFixed(4)} -> ${native.at(-1).toFixed(4)}`);
  assert.ok(native.at(-1) < native[0] * 0.6, 'the run trains');
}

test('Node.js (wasm CPU) matches native', async (t) => {
  const kiln = await k.Kiln.create();
  compare(t, await parityLosses(k, kiln), 'node');
});

test('Chromium (wasm CPU) matches native', async (t) => {
  const browser = await launch({ webgpu: false });
  try {
    const { value, logs } = await openAndWait(browser, `${srv.url}/tests/parity.html?device=cpu`, '__kilnParity');
    assert.ok(!value.fatal, `${value.fatal}\n${logs.join('\n')}`);
    assert.equal(value.device, 'cpu');
    compare(t, value.losses, 'chromium cpu');
  } finally {
    await browser.close();
  }
});

// PENDING with the WebGPU run of browser-api.test.mjs: kiln-wgsl's kernels
// do not compile in Chromium yet, so there is no WebGPU device to compare.
test('Chromium (WebGPU) matches native', async (t) => {
  const browser = await launch({ webgpu: true });
  try {
    const { value, logs } = await openAndWait(browser, `${srv.url}/tests/parity.html?device=webgpu`, '__kilnParity');
    assert.ok(!value.fatal, `${value.fatal}\n${logs.slice(0, 5).join('\n')}`);
    assert.equal(value.device, 'webgpu');
    compare(t, value.losses, 'chromium webgpu');
  } finally {
    await browser.close();
  }
});
