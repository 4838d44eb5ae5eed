#!/usr/bin/env node
// `npm run bench`: W1–W4 of BENCHMARKS.md in headless Chromium (WebGPU
// when kiln can use it, else the wasm CPU path), printing the JSON lines.
// Options: --quick (short smoke run), --cpu (force the CPU),
// --workloads W1,W4 (a subset; default all four), --threads N (the CPU
// path's threads; default: the browser's hardwareConcurrency, the page
// being cross-origin isolated; 1 = the single-threaded module).
import { fileURLToPath } from 'node:url';
import { launch, server } from '../tests/helpers.mjs';

export async function runBench({ quick = false, cpu = false, workloads = null, threads = null } = {}) {
  const srv = await server();
  const browser = await launch({ webgpu: !cpu });
  try {
    const page = await browser.newPage();
    const logs = [];
    page.on('console', (m) => logs.push(m.text()));
    // A page that fails to load its module never sets __kilnBench: fail
    // now with the error rather than at the 30-minute timeout.
    let pageError = null;
    page.on('pageerror', (e) => { pageError = e; });
    const q = new URLSearchParams();
    if (quick) q.set('quick', '1');
    if (cpu) q.set('device', 'cpu');
    if (workloads) q.set('workloads', workloads);
    if (threads) q.set('threads', String(threads));
    await page.goto(`${srv.url}/bench/?${q}`);
    const deadline = Date.now() + 1800000;
    for (;;) {
      if (pageError) throw new Error(`the benchmark page failed: ${pageError.message}\n${logs.join('\n')}`);
      if (await page.evaluate(() => window.__kilnBench && (window.__kilnBench.done || window.__kilnBench.error))) break;
      if (Date.now() > deadline) throw new Error(`the benchmark page did not finish in 30 minutes\n${logs.join('\n')}`);
      await new Promise((r) => setTimeout(r, 500));
    }
    const result = await page.evaluate(() => window.__kilnBench);
    if (result.error) throw new Error(`${result.error}\n${logs.join('\n')}`);
    return result.lines;
  } finally {
    await browser.close();
    await srv.close();
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf('--workloads');
  const workloads = at > 0 ? process.argv[at + 1] : null;
  const th = process.argv.indexOf('--threads');
  const lines = await runBench({ quick: process.argv.includes('--quick'), cpu: process.argv.includes('--cpu'), workloads,
    threads: th > 0 ? Number(process.argv[th + 1]) : null });
  for (const line of lines) console.log(line);
}
