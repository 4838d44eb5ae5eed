// The package's size against its budget (web/size-budget.json): what a
// browser downloads (index.js, handles.js, the wasm-bindgen glue and the .wasm),
// gzipped at level 9, measured here from pkg/ rather than trusted from the
// build's sizes.json; and the tarball holds one .wasm, shared by the
// browser and Node.js entry points.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { execFileSync } from 'node:child_process';
import { webDir } from './helpers.mjs';

const pkg = path.join(webDir, 'pkg');
const budget = JSON.parse(fs.readFileSync(path.join(webDir, 'size-budget.json'), 'utf8'));
const gz = (f) => zlib.gzipSync(fs.readFileSync(path.join(pkg, f)), { level: 9 }).length;

test('what a browser downloads fits the gzipped size budget', (t) => {
  const files = ['index.js', 'handles.js', 'web/kiln_web.js', 'web/kiln_web_bg.wasm'];
  const sizes = Object.fromEntries(files.map((f) => [f, gz(f)]));
  const total = Object.values(sizes).reduce((a, b) => a + b, 0);
  t.diagnostic(`gzipped: ${JSON.stringify(sizes)}, total ${total} bytes; budget ${budget.browser_gzip_max}, ` +
    `issue target ${budget.target_gzip}`);
  assert.ok(total <= budget.browser_gzip_max,
    `the browser download is ${total} bytes gzipped, over the budget of ${budget.browser_gzip_max} (web/size-budget.json): ` +
    'find what grew with `node scripts/wasm-sizes.mjs ../target/wasm32-unknown-unknown/wasm-release/kiln_web.wasm`');
  // naga (custom-op WGSL is compiled by the browser instead) stays out: it
  // was ~295 KB of the download. Its Rust paths appear in panic and log
  // strings whenever it is linked.
  const wasmBytes = fs.readFileSync(path.join(pkg, 'web/kiln_web_bg.wasm'));
  assert.equal(wasmBytes.indexOf('naga::'), -1, 'naga is linked into the wasm again');
  // The build's own report agrees with what is on disk.
  const reported = JSON.parse(fs.readFileSync(path.join(pkg, 'sizes.json'), 'utf8'));
  assert.equal(reported.total_gzip, total);
});

test('what a cross-origin isolated page downloads (the multi-threaded module) fits its budget', { skip: !fs.existsSync(path.join(pkg, 'web-threads')) && 'built without the multi-threaded module' }, (t) => {
  const files = ['index.js', 'handles.js', 'web-threads/kiln_web.js', 'web-threads/thread-start.js', 'web-threads/thread-worker.js', 'web-threads/kiln_web_bg.wasm'];
  const sizes = Object.fromEntries(files.map((f) => [f, gz(f)]));
  const total = Object.values(sizes).reduce((a, b) => a + b, 0);
  t.diagnostic(`gzipped: ${JSON.stringify(sizes)}, total ${total} bytes; budget ${budget.threaded_gzip_max}`);
  assert.ok(total <= budget.threaded_gzip_max,
    `the multi-threaded download is ${total} bytes gzipped, over the budget of ${budget.threaded_gzip_max} (web/size-budget.json)`);
  const reported = JSON.parse(fs.readFileSync(path.join(pkg, 'sizes.json'), 'utf8'));
  assert.equal(reported.threaded_total_gzip, total);
});

test('the tarball ships one .wasm for the browser (single-threaded) and Node.js entries, and the multi-threaded one', () => {
  const dist = path.join(webDir, 'dist');
  const tarballs = fs.readdirSync(dist).filter((f) => /^kiln-web-.*\.tgz$/.test(f));
  assert.equal(tarballs.length, 1);
  const entries = execFileSync('tar', ['-tzf', path.join(dist, tarballs[0])], { encoding: 'utf8' }).trim().split('\n');
  const wasm = entries.filter((e) => e.endsWith('.wasm'));
  const threaded = fs.existsSync(path.join(pkg, 'web-threads'));
  assert.deepEqual(wasm.sort(), [...(threaded ? ['package/web-threads/kiln_web_bg.wasm'] : []), 'package/web/kiln_web_bg.wasm']);
  assert.ok(fs.statSync(path.join(dist, tarballs[0])).size <= budget.tarball_max,
    `tarball ${fs.statSync(path.join(dist, tarballs[0])).size} bytes, budget ${budget.tarball_max}`);
  // The Node.js entry loads that same file (not a copy of its own).
  const node = fs.readFileSync(path.join(pkg, 'node.mjs'), 'utf8');
  assert.match(node, /readFileSync\(new URL\('\.\/web\/kiln_web_bg\.wasm', import\.meta\.url\)\)/);
  assert.ok(!fs.existsSync(path.join(pkg, 'node')), 'pkg/node/ (a second build) should not exist');
});
