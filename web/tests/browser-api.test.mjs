// The API suite in headless Chromium, twice: with WebGPU enabled (asserting
// the WebGPU path was taken) and without it (asserting the CPU fallback).
import { test, before, after } from 'node:test';
import { launch, server, openAndWait } from './helpers.mjs';

let srv;
before(async () => { srv = await server(); });
after(async () => { await srv.close(); });

async function runIn(t, { webgpu, expect, fallback }) {
  const browser = await launch({ webgpu });
  try {
    const url = `${srv.url}/tests/api.html?expect=${expect}&fallback=${encodeURIComponent(fallback)}`;
    const { value, logs } = await openAndWait(browser, url, '__kilnResults');
    if (value.fatal) throw new Error(`page failed: ${value.fatal}\n${logs.join('\n')}`);
    t.diagnostic(`device: ${JSON.stringify(value.device)}`);
    for (const r of value.results) {
      await t.test(r.name, () => { if (!r.ok) throw new Error(`${r.error}\n${logs.join('\n')}`); });
    }
  } finally {
    await browser.close();
  }
}

test('Chromium without WebGPU: the CPU fallback', (t) =>
  runIn(t, { webgpu: false, expect: 'cpu', fallback: 'navigator\\.gpu is missing|returned no adapter' }));

test('Chromium with --enable-unsafe-webgpu: the WebGPU backend', (t) =>
  runIn(t, { webgpu: true, expect: 'webgpu', fallback: '^$' }));
