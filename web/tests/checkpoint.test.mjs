// Checkpoints across native kiln, Node.js and Chromium (web/examples/resume.rs
// and tests/resume.mjs), on the parity run (20 steps, checkpoint after 10):
// - the transfer is exact: a checkpoint loaded on the other side and saved
//   again gives the same tensor bytes (native -> JS and JS -> native);
// - resuming on one backend is bit-identical to not stopping: native from
//   its own checkpoint, Node and Chromium (wasm CPU) from theirs, and
//   Chromium = Node (the same wasm) in every loss and checkpoint byte;
// - across native CPU and wasm CPU the runs are NOT bit-identical (their
//   kernels round differently: the uninterrupted runs already differ by an
//   ulp or two within the first 10 steps), so native -> JS and JS -> native
//   resumes are checked against the other side's uninterrupted run within
//   the parity tolerance, and the measured gap is printed; WebGPU likewise.
// Checkpoints move as files (Node: saveCheckpoint/loadCheckpoint), over HTTP
// (the page's loadCheckpoint fetches them) and as a download (the page's
// saveCheckpoint).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import * as k from '../pkg/node.mjs';
import { resumeRuns } from './resume.mjs';
import { launch, server, webDir } from './helpers.mjs';

const dir = path.join(webDir, 'test-output', 'resume');
const TOL = 1e-4;
let native, node, srv;

function runNative() {
  const out = execFileSync('cargo', ['run', '--quiet', '--release', '-p', 'kiln-web', '--example', 'resume', '--', dir],
    { cwd: path.join(webDir, '..'), encoding: 'utf8' });
  return JSON.parse(out);
}

/** Bit-identical f32 losses (native prints them with 9 significant digits). */
function sameBits(got, want, what) {
  assert.equal(got.length, want.length, `${what}: length`);
  for (let i = 0; i < got.length; i++) {
    assert.ok(Object.is(Math.fround(got[i]), Math.fround(want[i])), `${what} step ${i}: ${got[i]} vs ${want[i]}`);
  }
}

function close(got, want, what) {
  let worst = 0;
  for (let i = 0; i < got.length; i++) {
    const err = Math.abs(got[i] - want[i]) / (1 + Math.abs(want[i]));
    worst = Math.max(worst, err);
    assert.ok(err <= TOL, `${what} step ${i}: ${got[i]} vs ${want[i]}`);
  }
  return worst;
}

const bytesEqual = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
// An optimizer file's metadata is a map whose key order varies between
// saves; its tensor data (after the 8-byte length and the JSON header) is
// compared byte for byte.
const tensorData = (bytes) => bytes.slice(8 + Number(new DataView(new Uint8Array(bytes).buffer).getBigUint64(0, true)));

before(async () => {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  native = runNative();
  assert.equal(native.losses.length, 20);
  srv = await server();
});
after(async () => { await srv?.close(); });

const file = (name) => [...fs.readFileSync(path.join(dir, `${name}.safetensors`))];

test('native -> Node.js (files) -> native: exact transfer, bit-identical resume per backend, parity across', async (t) => {
  const kiln = await k.Kiln.create();
  sameBits(native.resumed, native.losses.slice(10), 'native resumed from its own step-10 checkpoint vs uninterrupted');
  node = await resumeRuns(k, kiln, (name, into) => k.loadCheckpoint(path.join(dir, `${name}.safetensors`), into));
  assert.ok(bytesEqual(node.native10Echo.model, file('native10.model')), 'native model checkpoint -> JS -> same bytes');
  assert.ok(bytesEqual(tensorData(node.native10Echo.optim), tensorData(file('native10.optim'))), 'native optimizer checkpoint -> JS -> same tensor bytes');
  sameBits(node.fromJs, node.uninterrupted.slice(10), 'Node resumed from its own step-10 checkpoint vs uninterrupted');
  assert.ok(bytesEqual(node.fromJs20, node.js20), 'Node: same model bytes after 20 steps, resumed or not');
  const cross = close(node.fromNative, native.losses.slice(10), 'native step 10 -> Node steps 11-20 vs native 20 steps');
  const base = close(node.uninterrupted, native.losses, 'Node uninterrupted vs native uninterrupted');
  // The reverse: Node's step-10 checkpoint, resumed natively.
  await k.saveCheckpoint(path.join(dir, 'js10.model.safetensors'), { stateDict: async () => new Uint8Array(node.js10.model) });
  await k.saveCheckpoint(path.join(dir, 'js10.optim.safetensors'), { stateDict: async () => new Uint8Array(node.js10.optim) });
  const back = runNative();
  assert.ok(bytesEqual(file('fromjs10.model'), node.js10.model), 'JS model checkpoint -> native -> same bytes');
  assert.ok(bytesEqual(tensorData(file('fromjs10.optim')), tensorData(node.js10.optim)), 'JS optimizer checkpoint -> native -> same tensor bytes');
  const reverse = close(back.fromJs, node.uninterrupted.slice(10), 'Node step 10 -> native steps 11-20 vs Node 20 steps');
  const ulps = (a, b) => Math.abs(new Int32Array(new Float32Array([a]).buffer)[0] - new Int32Array(new Float32Array([b]).buffer)[0]);
  const firstDiff = node.uninterrupted.findIndex((v, i) => ulps(v, native.losses[i]) !== 0);
  t.diagnostic(`resume bit-identical on native and on Node; transfer exact both ways; native vs wasm CPU: uninterrupted runs first differ at step ${firstDiff + 1} (max ${Math.max(...node.uninterrupted.map((v, i) => ulps(v, native.losses[i])))} ulp), max relative difference ${base.toExponential(2)}; native->Node resume ${cross.toExponential(2)}, Node->native resume ${reverse.toExponential(2)} (tolerance ${TOL})`);
});

test('native -> Chromium (wasm CPU, fetch + download): bit-identical to Node', async (t) => {
  assert.ok(node, 'needs the Node run');
  const browser = await launch({ webgpu: false });
  try {
    const page = await browser.newPage();
    const logs = [];
    page.on('console', (m) => logs.push(`[${m.type()}] ${m.text()}`));
    const download = page.waitForEvent('download', { timeout: 120000 });
    await page.goto(`${srv.url}/tests/checkpoint.html?device=cpu`);
    await page.waitForFunction(() => window.__kilnResume !== undefined, null, { timeout: 120000 });
    const value = await page.evaluate(() => window.__kilnResume);
    assert.ok(!value.fatal, `${value.fatal}\n${logs.join('\n')}`);
    assert.equal(value.device, 'cpu');
    assert.ok(bytesEqual(value.native10Echo.model, file('native10.model')), 'native checkpoint fetched by the page -> same bytes');
    sameBits(value.fromNative, node.fromNative, 'Chromium vs Node, resumed from native');
    sameBits(value.uninterrupted, node.uninterrupted, 'Chromium vs Node uninterrupted');
    sameBits(value.fromJs, value.uninterrupted.slice(10), 'Chromium resumed from its own checkpoint');
    assert.ok(bytesEqual(value.js10.model, node.js10.model) && bytesEqual(tensorData(value.js10.optim), tensorData(node.js10.optim)), 'Chromium\'s step-10 checkpoint = Node\'s');
    const d = await download;
    assert.equal(d.suggestedFilename(), 'kiln-model.safetensors');
    const saved = path.join(dir, 'downloaded.safetensors');
    await d.saveAs(saved);
    assert.ok(bytesEqual([...fs.readFileSync(saved)], value.js20), 'the downloaded file holds the model\'s bytes');
    const cross = close(value.fromNative, native.losses.slice(10), 'Chromium resumed from native vs native 20 steps');
    t.diagnostic(`Chromium CPU = Node bit for bit (losses and checkpoints); download verified; vs native ${cross.toExponential(2)}`);
  } finally {
    await browser.close();
  }
});
test('native -> Chromium (WebGPU): resumed within the parity tolerance', async (t) => {
  const browser = await launch({ webgpu: true });
  try {
    const page = await browser.newPage();
    const logs = [];
    page.on('console', (m) => logs.push(`[${m.type()}] ${m.text()}`));
    await page.goto(`${srv.url}/tests/checkpoint.html?device=webgpu`);
    await page.waitForFunction(() => window.__kilnResume !== undefined, null, { timeout: 300000 });
    const value = await page.evaluate(() => window.__kilnResume);
    assert.ok(!value.fatal, `${value.fatal}\n${logs.slice(0, 5).join('\n')}`);
    assert.equal(value.device, 'webgpu');
    const a = close(value.fromNative, native.losses.slice(10), 'WebGPU resumed from native vs native');
    const b = close(value.fromJs, value.uninterrupted.slice(10), 'WebGPU resumed from its own checkpoint');
    t.diagnostic(`WebGPU: max relative difference ${a.toExponential(2)} (from native), ${b.toExponential(2)} (own checkpoint); tolerance ${TOL}`);
  } finally {
    await browser.close();
  }
});
