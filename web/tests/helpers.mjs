// Shared by the browser tests: the static server and headless Chromium.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { serve } from '../scripts/serve.mjs';

export const webDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const outDir = path.join(webDir, 'test-output');
fs.mkdirSync(outDir, { recursive: true });

export const CHROMIUM = process.env.KILN_CHROMIUM || '/usr/bin/chromium';

/** Headless Debian Chromium; `webgpu` adds --enable-unsafe-webgpu (SwiftShader's adapter here). */
export async function launch({ webgpu }) {
  const args = [
    '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ];
  if (webgpu) args.push('--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-webgpu-adapter=swiftshader');
  // launch() gives every browser a fresh temporary profile (--user-data-dir).
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args });
}

export async function server() {
  const s = await serve(0);
  return { url: `http://127.0.0.1:${s.address().port}`, close: () => new Promise((r) => s.close(r)) };
}

/** Open a page, collect its console, wait for window[key]. */
export async function openAndWait(browser, url, key, timeoutMs = 120000) {
  const page = await browser.newPage();
  const logs = [];
  page.on('console', (m) => logs.push(`[${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`[pageerror] ${e.message}`));
  await page.goto(url);
  try {
    await page.waitForFunction((k) => window[k] !== undefined, key, { timeout: timeoutMs });
  } catch (e) {
    throw new Error(`${url}: ${key} never appeared (${e.message})\n${logs.join('\n')}`);
  }
  return { page, logs, value: await page.evaluate((k) => window[k], key) };
}

/** Whether this Chromium exposes a WebGPU adapter with --enable-unsafe-webgpu. */
export async function webgpuAvailable(browser, url) {
  const page = await browser.newPage();
  await page.goto(`${url}/tests/api.html?probe`);
  const r = await page.evaluate(async () => {
    if (!navigator.gpu) return 'no navigator.gpu';
    const a = await navigator.gpu.requestAdapter();
    return a ? 'adapter' : 'no adapter';
  });
  await page.close();
  return r;
}

export function tmpDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}
