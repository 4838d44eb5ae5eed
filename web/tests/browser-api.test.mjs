// The API suite in headless Chromium, twice: with WebGPU enabled (asserting
// the WebGPU path was taken) and without it (asserting the CPU fallback).
import { test, before, after } from 'node:test';
import { launch, server, openAndWait } from './helpers.mjs';

let srv;
before(async () => { srv = await server(); });
after(async () => { await srv.close(); });

// PENDING: kiln-wgsl's WGSL kernels do not compile in Chromium yet (Tint
// rejects the constant-expression NaN/inf in binary.wgsl,
// `bitcast<f32>(0x7fc00000u)`), so kiln's WebGPU self-test fails and the CPU
// is used. Until that is fixed the WebGPU run is reported as TODO (it runs
// and prints its failures without failing the suite); KILN_WEBGPU_STRICT=1
// makes it count.
const WEBGPU_TODO = process.env.KILN_WEBGPU_STRICT === '1' ? false
  : 'pending kiln-wgsl: Tint rejects NaN/inf constant expressions in binary.wgsl (set KILN_WEBGPU_STRICT=1 to enforce)';

async function runIn(t, { webgpu, expect, fallback, todo = false }) {
  const browser = await launch({ webgpu });
  try {
    const url = `${srv.url}/tests/api.html?expect=${expect}&fallback=${encodeURIComponent(fallback)}`;
    const { value, logs } = await openAndWait(browser, url, '__kilnResults');
    if (value.fatal) throw new Error(`page failed: ${value.fatal}\n${logs.join('\n')}`);
    t.diagnostic(`device: ${JSON.stringify(value.device)}`);
    for (const r of value.results) {
      await t.test(r.name, { todo }, () => { if (!r.ok) throw new Error(`${r.error}\n${logs.join('\n')}`); });
    }
  } finally {
    await browser.close();
  }
}

test('Chromium without WebGPU: the CPU fallback', (t) =>
  runIn(t, { webgpu: false, expect: 'cpu', fallback: 'navigator\\.gpu is missing|returned no adapter' }));

test('Chromium with --enable-unsafe-webgpu: the WebGPU backend', { todo: WEBGPU_TODO }, (t) =>
  runIn(t, { webgpu: true, expect: 'webgpu', fallback: '^$', todo: WEBGPU_TODO }));
