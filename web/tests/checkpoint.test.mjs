// Checkpoints across native kiln, Node.js and Chromium (web/examples/resume.rs
// and tests/resume.mjs), on the parity run (20 steps, checkpoint after 10):
// - the transfer is exact: a checkpoint loaded on the other side and saved
//   again gives the same tensor bytes (native -> JS and JS -> native);
// - resuming on one backend is bit-identical to not stopping: native from
//   its own checkpoint, Node and Chromium (wasm CPU) from theirs, and
//   Chromium = Node (the same wasm) in every loss and checkpoint byte;
// - native kiln in portable numerics (KILN_CPU_NUMERICS=portable,
//   docs/portable-numerics.md) and wasm CPU are bit-identical: 10 native
//   steps, saved, resumed for 10 in Node or Chromium, give the losses and
//   the model bytes of 20 native steps, bit for bit; and the reverse (10
//   wasm steps resumed natively = 20 wasm steps);
// - native kiln in its default numerics (the gemm crate's FMA kernels,
//   glibc's logf) is checked against wasm within the parity tolerance, and
//   the measured gap is printed; WebGPU likewise.
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
// The default (native numerics) run writes its checkpoints apart.
const fastDir = path.join(webDir, 'test-output', 'resume-native-numerics');
const TOL = 1e-4;
let native, fast, node, srv;

/** The native half, in portable numerics unless `numerics` says otherwise. */
function runNative(numerics = 'portable', into = dir) {
  const out = execFileSync('cargo', ['run', '--quiet', '--release', '-p', 'kiln-web', '--example', 'resume', '--', into],
    { cwd: path.join(webDir, '..'), encoding: 'utf8', env: { ...process.env, KILN_CPU_NUMERICS: numerics } });
  const value = JSON.parse(out);
  assert.equal(value.device.includes('portable numerics'), numerics === 'portable', value.device);
  return value;
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
  for (const d of [dir, fastDir]) {
    fs.rmSync(d, { recursive: true, force: true });
    fs.mkdirSync(d, { recursive: true });
  }
  native = runNative();
  assert.equal(native.losses.length, 20);
  fast = runNative('native', fastDir);
  assert.equal(fast.losses.length, 20);
  srv = await server();
});
after(async () => { await srv?.close(); });

const file = (name) => [...fs.readFileSync(path.join(dir, `${name}.safetensors`))];

test('native (portable numerics) -> Node.js (files) -> native: exact transfer, bit-identical resumes across native and wasm', async (t) => {
  const kiln = await k.Kiln.create();
  sameBits(native.resumed, native.losses.slice(10), 'native resumed from its own step-10 checkpoint vs uninterrupted');
  node = await resumeRuns(k, kiln, (name, into) => k.loadCheckpoint(path.join(dir, `${name}.safetensors`), into));
  assert.ok(bytesEqual(node.native10Echo.model, file('native10.model')), 'native model checkpoint -> JS -> same bytes');
  assert.ok(bytesEqual(tensorData(node.native10Echo.optim), tensorData(file('native10.optim'))), 'native optimizer checkpoint -> JS -> same tensor bytes');
  sameBits(node.fromJs, node.uninterrupted.slice(10), 'Node resumed from its own step-10 checkpoint vs uninterrupted');
  assert.ok(bytesEqual(node.fromJs20, node.js20), 'Node: same model bytes after 20 steps, resumed or not');
  // Across native (portable numerics) and wasm: the same bits.
  sameBits(node.uninterrupted, native.losses, 'Node uninterrupted vs native uninterrupted');
  sameBits(node.fromNative, native.losses.slice(10), 'native step 10 -> Node steps 11-20 vs native 20 steps');
  assert.ok(bytesEqual(node.fromNative20, file('native20.model')), 'native 10 + Node 10 steps: the model bytes of native 20 steps');
  assert.ok(bytesEqual(node.js20, file('native20.model')), 'Node 20 steps: the model bytes of native 20 steps');
  // The reverse: Node's step-10 checkpoint, resumed natively.
  await k.saveCheckpoint(path.join(dir, 'js10.model.safetensors'), { stateDict: async () => new Uint8Array(node.js10.model) });
  await k.saveCheckpoint(path.join(dir, 'js10.optim.safetensors'), { stateDict: async () => new Uint8Array(node.js10.optim) });
  const back = runNative();
  assert.ok(bytesEqual(file('fromjs10.model'), node.js10.model), 'JS model checkpoint -> native -> same bytes');
  assert.ok(bytesEqual(tensorData(file('fromjs10.optim')), tensorData(node.js10.optim)), 'JS optimizer checkpoint -> native -> same tensor bytes');
  sameBits(back.fromJs, node.uninterrupted.slice(10), 'Node step 10 -> native steps 11-20 vs Node 20 steps');
  assert.ok(bytesEqual(file('fromjs20.model'), node.js20), 'Node 10 + native 10 steps: the model bytes of Node 20 steps');
  // Native kiln in its default numerics: within the tolerance only.
  const base = close(node.uninterrupted, fast.losses, 'Node uninterrupted vs native (native numerics) uninterrupted');
  const ulps = (a, b) => Math.abs(new Int32Array(new Float32Array([a]).buffer)[0] - new Int32Array(new Float32Array([b]).buffer)[0]);
  const firstDiff = node.uninterrupted.findIndex((v, i) => ulps(v, fast.losses[i]) !== 0);
  t.diagnostic(`resume bit-identical on native and on Node; transfer exact both ways; native (portable numerics) = wasm CPU bit for bit: losses and model bytes, native->Node and Node->native resumes; native default numerics vs wasm CPU: uninterrupted runs first differ at step ${firstDiff + 1} (max ${Math.max(...node.uninterrupted.map((v, i) => ulps(v, fast.losses[i])))} ulp), max relative difference ${base.toExponential(2)} (tolerance ${TOL})`);
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
    sameBits(value.fromNative, native.losses.slice(10), 'native (portable) step 10 -> Chromium steps 11-20 vs native 20 steps');
    sameBits(value.uninterrupted, native.losses, 'Chromium uninterrupted vs native (portable) uninterrupted');
    sameBits(value.uninterrupted, node.uninterrupted, 'Chromium vs Node uninterrupted');
    sameBits(value.fromJs, value.uninterrupted.slice(10), 'Chromium resumed from its own checkpoint');
    assert.ok(bytesEqual(value.js10.model, node.js10.model) && bytesEqual(tensorData(value.js10.optim), tensorData(node.js10.optim)), 'Chromium\'s step-10 checkpoint = Node\'s');
    const d = await download;
    assert.equal(d.suggestedFilename(), 'kiln-model.safetensors');
    const saved = path.join(dir, 'downloaded.safetensors');
    await d.saveAs(saved);
    assert.ok(bytesEqual([...fs.readFileSync(saved)], value.js20), 'the downloaded file holds the model\'s bytes');
    t.diagnostic('Chromium CPU = Node = native (portable numerics) bit for bit (losses and checkpoints); download verified');
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
