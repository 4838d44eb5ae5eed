#!/usr/bin/env node
// Builds the npm package into web/pkg/ and (with --pack) its tarball into
// web/dist/:
//   pkg/web/   cargo + wasm-bindgen --target web: the one .wasm and its ES-module glue
//   pkg/index.js, index.d.ts             browser entry: init() + the API
//   pkg/node.mjs                         Node entry: the same glue, the same
//                                        .wasm read from disk (initSync), init() a no-op
//   pkg/node.cjs                         CommonJS: require(esm) of node.mjs
//   pkg/package.json, README.md          from web/npm/
// The wasm is built once with the `wasm-release` profile (size first, LTO,
// one codegen unit) and shrunk with wasm-opt from the npm `binaryen` package.
// Prints the gzipped sizes and the largest crates in the code
// (scripts/wasm-sizes.mjs, from cargo's output, which still has names).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { wasmSizes } from './wasm-sizes.mjs';
import { minify } from 'terser';
import { shortenNames } from './short-names.mjs';
import { guardGlue } from './guard-glue.mjs';

const web = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
// KILN_WEB_PKG: build into another directory (e.g. to test a change while
// pkg/ is in use); the default is web/pkg.
const pkg = process.env.KILN_WEB_PKG ? path.resolve(process.env.KILN_WEB_PKG) : path.join(web, 'pkg');
const args = new Set(process.argv.slice(2));
const features = process.env.KILN_WEB_FEATURES || '';
// The nightly the wasm is built with (test-web.sh installs it with rust-src).
const NIGHTLY = 'nightly-2026-05-19';

function run(cmd, argv, opts = {}) {
  console.log(`$ ${cmd} ${argv.join(' ')}`);
  execFileSync(cmd, argv, { stdio: 'inherit', cwd: web, ...opts });
}

fs.rmSync(pkg, { recursive: true, force: true });
// The wasm is built with a pinned nightly toolchain, for one reason: its
// standard library rebuilt with the `immediate-abort` panic strategy
// (-Zbuild-std, rust-src): panics become a bare wasm trap, so none of std's
// panic printing, location formatting or unwinding glue is linked (about
// -27 KB gzipped, web/README.md, Size). kiln returns errors and never
// panics on bad input: errors reach JS as KilnError exceptions as before;
// only a kiln bug would now trap without a message. Everything else in the
// workspace builds with the stable toolchain. KILN_WEB_NIGHTLY=0 builds
// with the default toolchain and std's usual panics (for comparisons).
const nightly = process.env.KILN_WEB_NIGHTLY !== '0';
// WASM SIMD (128-bit): every browser the package targets has it
// (Chromium 91+, Firefox 89+, Safari 16.4+, Node 16+); kiln's f32 GEMM
// (core/src/backend/cpu/simd_gemm.rs) and rustc's auto-vectorised loops use
// it. KILN_WEB_SIMD=0 builds without (for comparisons).
const simd = process.env.KILN_WEB_SIMD !== '0';
// The multi-threaded module (pkg/web-threads/), loaded instead of the
// single-threaded one by pages that are cross-origin isolated: shared
// memory (+atomics: std rebuilt with them, so nightly only) and Web Workers
// running the f32 GEMM's parts (kiln-core backend/cpu/threads.rs).
// KILN_WEB_THREADS=0 leaves it out.
const threaded = nightly && simd && process.env.KILN_WEB_THREADS !== '0';

/** cargo + wasm-bindgen + wasm-opt into pkg/<dir>/kiln_web{.js,_bg.wasm}; returns the cargo output's path. */
function buildWasm(dir, { threads }) {
  // Its own target directory: other RUSTFLAGS (and std built with atomics).
  const targetDir = path.join(web, '..', 'target', ...(threads ? ['wasm-threads'] : []));
  const argv = [threads ? 'rustc' : 'build', '--lib', '--target', 'wasm32-unknown-unknown', '--profile', 'wasm-release', '--target-dir', targetDir];
  if (features) argv.push('--features', features);
  // std's `optimize_for_size` feature: smaller algorithms in core/alloc
  // (sorting, formatting, ...); same results (-10.8 KB gzipped, README Size).
  if (nightly) argv.push('-Zbuild-std=std,panic_abort', '-Zbuild-std-features=optimize_for_size');
  const env = { ...process.env };
  const rustflags = [env.CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS ?? ''];
  if (simd) rustflags.push('-C target-feature=+simd128');
  if (threads) {
    // Atomics (std rebuilt with them); the shared memory must declare a
    // maximum: 2 GiB.
    rustflags.push('-C target-feature=+atomics,+bulk-memory,+mutable-globals -C link-arg=--max-memory=2147483648');
  }
  if (nightly) {
    env.RUSTUP_TOOLCHAIN = NIGHTLY;
    // No file/line/column in #[track_caller] locations: the bindings leave
    // kiln's Rust locations out of the messages JS sees (src/error.rs), so
    // their strings need not be in the wasm.
    rustflags.push('-Zunstable-options -C panic=immediate-abort -Zlocation-detail=none');
  }
  env.CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS = rustflags.join(' ').trim();
  if (threads) {
    // The link of the .wasm alone (`cargo rustc -- ...`): a shared memory,
    // imported (each Worker instantiates the module on the page's), and the
    // thread-local storage exports wasm-bindgen's thread glue sets up. This
    // rustc no longer adds them for +atomics by itself.
    argv.push('--', ...['--shared-memory', '--import-memory', '--export=__wasm_init_tls', '--export=__tls_size',
      '--export=__tls_align', '--export=__tls_base'].flatMap((a) => ['-C', `link-arg=${a}`]));
  }
  run('cargo', argv, { env });
  const built = path.join(targetDir, 'wasm32-unknown-unknown', 'wasm-release', 'kiln_web.wasm');
  // The ES-module glue and the .d.ts (wasm-bindgen CLI, the crate's exact
  // version: test-web.sh installs it).
  run('wasm-bindgen', ['--target', 'web', '--out-dir', path.join(pkg, dir), '--out-name', 'kiln_web', '--weak-refs', built]);
  const wasm = path.join(pkg, dir, 'kiln_web_bg.wasm');
  // Wrong argument types are refused in the glue before they reach wasm
  // (scripts/guard-glue.mjs): a number for a string parameter corrupted
  // wasm's allocator.
  console.log(`guarded glue helpers (${dir}): ${guardGlue(path.join(pkg, dir, 'kiln_web.js'))}`);
  // One- and two-letter names for the imports and exports the glue links
  // (scripts/short-names.mjs): -6.0 KB wasm, -3.3 KB glue, gzipped.
  // KILN_WEB_SHORT_NAMES=0 keeps wasm-bindgen's names.
  if (process.env.KILN_WEB_SHORT_NAMES !== '0') {
    console.log(`short names (${dir}): ${JSON.stringify(shortenNames(wasm, path.join(pkg, dir, 'kiln_web.js')))}`);
  }
  const before = fs.statSync(wasm).size;
  // The features rustc's wasm32 target enables by default; wasm-opt must be
  // told, or it refuses the module.
  run(path.join(web, 'node_modules', '.bin', 'wasm-opt'), [
    '-Oz', '--converge', '--strip-debug', '--strip-producers',
    '--enable-bulk-memory', '--enable-mutable-globals', '--enable-nontrapping-float-to-int',
    '--enable-sign-ext', '--enable-reference-types', '--enable-multivalue',
    ...(simd ? ['--enable-simd'] : []), ...(threads ? ['--enable-threads'] : []),
    wasm, '-o', wasm,
  ]);
  console.log(`wasm-opt (${dir}): ${before} -> ${fs.statSync(wasm).size} bytes`);
  return built;
}
const rawWasm = buildWasm('web', { threads: false });
// wasm-bindgen's typings of the raw module's exports name them as it made
// them, before short-names.mjs renamed them (`__wbg_adam_free` is `a` in the
// .wasm): they would describe exports the module does not have, and nothing
// imports them (the API's types are kiln_web.d.ts and index.d.ts). Left out
// of the package (-25 KB raw in the tarball).
fs.rmSync(path.join(pkg, 'web', 'kiln_web_bg.wasm.d.ts'), { force: true });
if (threaded) {
  buildWasm('web-threads', { threads: true });
  // Only the glue and the wasm are used; the typings are web/'s.
  for (const f of ['kiln_web.d.ts', 'kiln_web_bg.wasm.d.ts']) fs.rmSync(path.join(pkg, 'web-threads', f), { force: true });
  for (const f of ['thread-worker.js', 'thread-start.js']) fs.copyFileSync(path.join(web, 'npm', f), path.join(pkg, 'web-threads', f));
}

// The generated typings: without the internal start function, and without
// [Symbol.dispose] members, which need TypeScript's esnext lib (the
// methods exist at run time; free() is the portable spelling).
{
  const dts = path.join(pkg, 'web', 'kiln_web.d.ts');
  const text = fs.readFileSync(dts, 'utf8')
    .replace(/(\/\*\*(?:(?!\*\/)[\s\S])*\*\/\s*)?export function start\(\): void;\n?/, '')
    .split('\n')
    .filter((line) => !/^\s*\[Symbol\.dispose\]\(\): void;\s*$/.test(line))
    .join('\n');
  fs.writeFileSync(dts, text);
}

// Entry points. Only the public API is exported: not wasm-bindgen's
// internals (__wbg_*, initSync) nor the module's start function.
const internal = (n) => n.startsWith('__') || n === 'initSync' || n === 'start' || n === 'default';
const glue = await import(pathToFileURL(path.join(pkg, 'web', 'kiln_web.js')));
const names = Object.keys(glue).filter((n) => !internal(n));
// Classes are re-exported with their prototypes patched by handles.js (the
// ones users construct, behind its argument-checking Proxy); functions are
// exported wrapped by handles.js.
const isClass = (n) => typeof glue[n] === 'function' && typeof glue[n].prototype?.free === 'function';
const classes = names.filter(isClass);
const functions = names.filter((n) => !isClass(n));
const scoped = `import { scopeHandles } from './handles.js';
const scoped = scopeHandles(glue, KilnError);
export const { ${functions.join(', ')} } = scoped;
export const { ${classes.join(', ')} } = { ...glue, ...scoped };`;
fs.copyFileSync(path.join(web, 'npm', 'handles.js'), path.join(pkg, 'handles.js'));
// KilnError: the errors kiln throws are Errors named 'KilnError' with kind
// and op (made in Rust, src/error.rs); instanceof KilnError recognises
// them, and users can make their own.
const kilnError = `/** What kiln throws: an Error with the broad kind of mistake and the refusing op. */
class KilnError extends Error {
  constructor(kind, op, message) { super(message); this.name = 'KilnError'; this.kind = kind; this.op = op; }
  static [Symbol.hasInstance](value) {
    return value instanceof Error && value.name === 'KilnError' && typeof value.kind === 'string' && typeof value.op === 'string';
  }
}
// The JavaScript-only entry points refuse bad arguments and report failed
// reads and writes the way the wasm-backed ones do: as KilnErrors.
const badArgument = (op, expected, v) => new KilnError('InvalidArgument', op, op + ': expected ' + expected + ', got ' +
  (v === null ? 'null' : typeof v === 'string' ? 'the string ' + JSON.stringify(v) : Array.isArray(v) ? 'an array' : typeof v));
const ioFailed = (op, what, e) => e instanceof KilnError ? e : new KilnError('Io', op, op + ': ' + what + ' failed: ' + (e && e.message));
const checkTarget = (op, v, method) => {
  if (v === null || typeof v !== 'object' || typeof v[method] !== 'function') throw badArgument(op, 'an object with ' + method + '()', v);
};`;
// Checkpoint helpers: in a page, save = download and load = fetch a URL or
// read an uploaded File/Blob; in Node, files. Both also accept bytes.
const checkpointsWeb = `/** Download from.stateDict() as a file called name; resolves to the bytes. */
export async function saveCheckpoint(name, from) {
  if (typeof name !== 'string') throw badArgument('saveCheckpoint', 'a file name', name);
  checkTarget('saveCheckpoint', from, 'stateDict');
  const bytes = await from.stateDict();
  const url = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
  const a = document.createElement('a');
  a.href = url; a.download = name; a.style.display = 'none';
  document.body.appendChild(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
  return bytes;
}
/** Load a checkpoint into \`into\` from a URL (fetched), an uploaded File/Blob, or bytes; resolves to the bytes. */
export async function loadCheckpoint(source, into) {
  const op = 'loadCheckpoint';
  checkTarget(op, into, 'loadStateDict');
  let bytes;
  if (source instanceof Uint8Array) bytes = source;
  else if (typeof source === 'string' || source instanceof URL) {
    let response;
    try { response = await fetch(source); } catch (e) { throw ioFailed(op, 'fetching ' + source, e); }
    if (!response.ok) throw new KilnError('Io', op, op + ': fetching ' + source + ' gave HTTP ' + response.status);
    bytes = new Uint8Array(await response.arrayBuffer());
  } else if (source !== null && typeof source === 'object' && typeof source.arrayBuffer === 'function') bytes = new Uint8Array(await source.arrayBuffer());
  else throw badArgument(op, 'a URL, a File or Blob, or a Uint8Array', source);
  into.loadStateDict(bytes);
  return bytes;
}`;
const checkpointsNode = `/** Write from.stateDict() to the file at path; resolves to the bytes. */
async function saveCheckpoint(path, from) {
  const op = 'saveCheckpoint';
  if (typeof path !== 'string' && !(path instanceof URL)) throw badArgument(op, 'a file path', path);
  checkTarget(op, from, 'stateDict');
  const bytes = await from.stateDict();
  try { nodeFs.writeFileSync(path, bytes); } catch (e) { throw ioFailed(op, 'writing ' + path, e); }
  return bytes;
}
/** Load a checkpoint into \`into\` from a file path, a Blob, or bytes; resolves to the bytes. */
async function loadCheckpoint(source, into) {
  const op = 'loadCheckpoint';
  checkTarget(op, into, 'loadStateDict');
  let bytes;
  if (source instanceof Uint8Array) bytes = source;
  else if (typeof source === 'string' || source instanceof URL) {
    try { bytes = new Uint8Array(nodeFs.readFileSync(source)); } catch (e) { throw ioFailed(op, 'reading ' + source, e); }
  } else if (source !== null && typeof source === 'object' && typeof source.arrayBuffer === 'function') bytes = new Uint8Array(await source.arrayBuffer());
  else throw badArgument(op, 'a file path, a Blob, or a Uint8Array', source);
  into.loadStateDict(bytes);
  return bytes;
}`;
// The digits ship beside the wasm (web/digits.csv.gz), loaded on demand.
fs.copyFileSync(path.join(web, '..', 'core', 'data', 'digits.csv.gz'), path.join(pkg, 'web', 'digits.csv.gz'));
const digitsDoc = (source) => `/**
 * The 1,797 UCI 8x8 handwritten digits (CC BY 4.0) from the package's
 * web/digits.csv.gz (or from source: ${source} or the bytes, gzipped or
 * not), shuffled
 * with seed and split; resolves to { train, test }.
 */`;
// Gzipped bytes are inflated here, with the platform's DecompressionStream
// (browsers, Node.js >= 18): the wasm has no inflater (kiln-core without its
// \`gzip\` feature), and digitsFromBytes takes the CSV's plain bytes.
const inflateDigits = `const MAX_DIGITS_CSV = 64 << 20;
async function inflateDigits(bytes) {
  if (bytes.length < 2 || bytes[0] !== 0x1f || bytes[1] !== 0x8b) return bytes;
  const parts = [];
  let total = 0;
  try {
    const reader = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip')).getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.length;
      if (total > MAX_DIGITS_CSV) {
        await reader.cancel();
        throw new KilnError('Io', 'loadDigits', 'loadDigits: the digits CSV inflates to more than ' + MAX_DIGITS_CSV + ' bytes');
      }
      parts.push(value);
    }
  } catch (e) {
    if (e instanceof KilnError) throw e;
    throw new KilnError('Io', 'loadDigits', 'loadDigits: the gzip data is corrupt or truncated (' + e.message + ')');
  }
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}`;
const digitsWeb = `${inflateDigits}
${digitsDoc('a URL')}
export async function loadDigits(testFraction, seed, source) {
  let bytes = source;
  if (!(bytes instanceof Uint8Array)) {
    if (source != null && typeof source !== 'string' && !(source instanceof URL)) throw badArgument('loadDigits', 'a URL or a Uint8Array', source);
    const url = source ?? new URL('./web/digits.csv.gz', import.meta.url);
    let response;
    try { response = await fetch(url); } catch (e) { throw ioFailed('loadDigits', 'fetching ' + url, e); }
    if (!response.ok) throw new KilnError('Io', 'loadDigits', 'loadDigits: fetching ' + url + ' gave HTTP ' + response.status);
    bytes = new Uint8Array(await response.arrayBuffer());
  }
  return digitsFromBytes(await inflateDigits(bytes), testFraction, seed);
}`;
const digitsNode = `${inflateDigits}
${digitsDoc('a file path or URL')}
export async function loadDigits(testFraction, seed, source) {
  let bytes = source;
  if (!(bytes instanceof Uint8Array)) {
    if (source != null && typeof source !== 'string' && !(source instanceof URL)) throw badArgument('loadDigits', 'a file path, a URL or a Uint8Array', source);
    const file = source ?? new URL('./web/digits.csv.gz', import.meta.url);
    try { bytes = new Uint8Array(nodeFs.readFileSync(file)); } catch (e) { throw ioFailed('loadDigits', 'reading ' + file, e); }
  }
  return digitsFromBytes(await inflateDigits(bytes), testFraction, seed);
}`;
// checkCustomOp: kiln's Rust check_custom_op for ops registered from JS,
// written with the public API (it needs a CPU Kiln: \`KilnClass\` is bound by
// each entry point).
const checkCustomOpSource = `/** Check a custom op as kiln's Rust check_custom_op does: its float32 forward on options.kiln's device
 *  (on WebGPU: the WGSL kernel) against the CPU forward, and its backward against central finite
 *  differences: first and second order in float64 on the CPU, and the float32 gradient computed on
 *  the device. Resolves to a report; report.passed says whether every check passed. */
async function checkCustomOp(op, inputs, options = {}) {
  const name = 'checkCustomOp';
  checkTarget(name, op, 'apply');
  if (!Array.isArray(inputs) || inputs.length !== op.arity) {
    throw new KilnError('InvalidArgument', name, name + ': ' + op.name + ' takes ' + op.arity + ' operands, ' + (Array.isArray(inputs) ? inputs.length : 'no array') + ' given');
  }
  const eps = options.eps ?? 1e-6, atol = options.atol ?? 1e-5, rtol = options.rtol ?? 1e-4;
  const deviceAtol = options.deviceAtol ?? 1e-4, deviceRtol = options.deviceRtol ?? 1e-3;
  const cpu = await KilnClass.create('cpu');
  const device = options.kiln && options.kiln.device !== 'cpu' ? options.kiln : null;
  const report = { op: op.name, device: device ? device.deviceInfo : null, parity: null, firstOrder: null, secondOrder: null, deviceGradient: null, passed: true, text: '' };
  const compare = (expected, actual, a, r) => {
    let worst = 0, index = 0;
    for (let i = 0; i < expected.length; i++) {
      const d = Math.abs(actual[i] - expected[i]);
      const ratio = Number.isNaN(expected[i]) && Number.isNaN(actual[i]) ? 0 : Number.isNaN(d) ? Infinity : d / (a + r * Math.abs(expected[i]));
      if (i === 0 || ratio > worst) { worst = ratio; index = i; }
    }
    return { passed: worst <= 1 && expected.length === actual.length, worst, index, expected: expected[index], actual: actual[index] };
  };
  const values = (x, Type, k, i, h) => { const v = Type.from(x.values); if (h) v[i] += h; return v; };
  const graphs = [];
  const graphOn = (kiln) => { const g = kiln.graph(); graphs.push(g); return g; };
  const gc = graphOn(cpu);
  try {
    const forward = async (g, Type) => {
      g.reset();
      return Array.from(await op.apply(inputs.map((x) => g.tensor(Type.from(x.values), x.shape))).toArray());
    };
    if (device) report.parity = compare(await forward(gc, Float32Array), await forward(graphOn(device), Float32Array), atol, rtol);
    if (op.hasBackward && options.gradients !== false) {
      gc.reset();
      const outShape = op.apply(inputs.map((x) => gc.tensor(Float64Array.from(x.values), x.shape))).shape;
      const size = outShape.reduce((a, b) => a * b, 1);
      const w = Float64Array.from({ length: size }, (_, i) => 0.5 + ((i * 7) % 11) / 10);
      const v = inputs.map((x) => Float64Array.from(x.values, (_, i) => 1 - ((i * 5) % 9) / 8));
      // The scalar checked: loss = sum(w * op(xs)); its gradient, and h = sum_k sum(v_k * dloss/dx_k).
      const loss = (g, xs, Type) => op.apply(xs).mul(g.tensor(Type.from(w), outShape)).sum();
      const gradients = async (g, Type, k, i, h) => {
        g.reset();
        const xs = inputs.map((x, j) => g.variable(values(x, Type, j, i, j === k ? h : 0), x.shape));
        const grads = g.grad(loss(g, xs, Type), xs);
        return { g, xs, grads, read: async () => Promise.all(grads.map(async (t) => Array.from(await t.toArray()))) };
      };
      const lossAt = async (k, i, h) => { gc.reset(); return loss(gc, inputs.map((x, j) => gc.tensor(values(x, Float64Array, j, i, j === k ? h : 0), x.shape)), Float64Array).item(); };
      const hAt = async (k, i, h) => {
        const { g, grads } = await gradients(gc, Float64Array, k, i, h);
        let total = 0;
        for (let j = 0; j < grads.length; j++) total += await grads[j].mul(g.tensor(v[j], inputs[j].shape)).sum().item();
        return total;
      };
      const numeric = async (f) => {
        const out = [];
        for (let k = 0; k < inputs.length; k++) for (let i = 0; i < inputs[k].values.length; i++) out.push(((await f(k, i, eps)) - (await f(k, i, -eps))) / (2 * eps));
        return out;
      };
      const first = (await (await gradients(gc, Float64Array, 0, 0, 0)).read()).flat();
      const firstNumeric = await numeric(lossAt);
      report.firstOrder = compare(firstNumeric, first, atol, rtol);
      const { g, xs, grads } = await gradients(gc, Float64Array, 0, 0, 0);
      let hSum = null;
      for (let j = 0; j < grads.length; j++) { const t = grads[j].mul(g.tensor(v[j], inputs[j].shape)).sum(); hSum = hSum ? hSum.add(t) : t; }
      const second = (await Promise.all(g.grad(hSum, xs).map(async (t) => Array.from(await t.toArray())))).flat();
      report.secondOrder = compare(await numeric(hAt), second, atol, rtol);
      if (device) {
        const dev = await gradients(graphOn(device), Float32Array, 0, 0, 0);
        report.deviceGradient = compare(firstNumeric, (await dev.read()).flat(), deviceAtol, deviceRtol);
      }
    }
  } finally {
    for (const g of graphs) g.free();
    cpu.free();
  }
  const line = (what, c) => c ? '  ' + what + ': ' + (c.passed ? 'passed' : 'FAILED') + ' (worst at element ' + c.index + ': expected ' + c.expected + ', got ' + c.actual + ', ' + c.worst.toFixed(3) + ' of tolerance)\\n' : '';
  report.passed = [report.parity, report.firstOrder, report.secondOrder, report.deviceGradient].every((c) => c === null || c.passed);
  report.text = 'checkCustomOp ' + op.name + ': ' + (report.passed ? 'passed' : 'FAILED') + '\\n'
    + line('forward on ' + report.device + ' vs cpu', report.parity)
    + (report.firstOrder ? line('cpu float64 first order', report.firstOrder) + line('cpu float64 second order', report.secondOrder) : '  gradients not checked\\n')
    + line('gradient on ' + report.device + ' (float32)', report.deviceGradient);
  return report;
}`;
// The browser entry picks its module at init(): the multi-threaded one
// (web-threads/, shared memory + Web Workers) when the page is
// cross-origin isolated and has SharedArrayBuffer and Worker, else the
// single-threaded one (web/). Either glue is loaded on demand (a page
// downloads one), and the API's classes and functions are bound to it:
// the exports are \`let\` bindings that init() sets (ES module bindings are
// live, so \`import { Kiln } from 'kiln-web'\` sees them once init() ran).
// Its /** doc comments */ are left out (they are in index.d.ts, which
// editors read; index.js is downloaded): -0.6 KB gzipped.
const stripDocs = (js) => js.replace(/^[ \t]*\/\*\*[\s\S]*?\*\/[ \t]*\n/gm, '');
fs.writeFileSync(path.join(pkg, 'index.js'), stripDocs(`// kiln-web for browsers and bundlers. Call \`await init()\` once before anything else.
import { scopeHandles } from './handles.js';
export let ${[...classes, ...functions].join(', ')};
let KilnClass;
${kilnError}
export { KilnError };
${checkpointsWeb}
${digitsWeb}
${checkCustomOpSource}
export { checkCustomOp };

const THREADED_BUILD = ${threaded};
let threading = { threads: 1, module: 'none', reason: 'init() has not run yet' };
/** The CPU path init() chose: threads (1 = single-threaded), the module ('single-threaded' or 'multi-threaded') and why. */
export function threadInfo() { return { ...threading }; }

async function load(input, options) {
  const hc = globalThis.navigator && navigator.hardwareConcurrency;
  const threads = Math.max(1, Math.floor(options.threads ?? (hc > 0 ? hc : 1)));
  const why = !THREADED_BUILD ? 'the package was built without the multi-threaded module'
    : input !== undefined ? 'init() was given a module to load'
    : threads < 2 ? 'threads: ' + threads
    : globalThis.crossOriginIsolated !== true ? 'the page is not cross-origin isolated (no COOP/COEP headers)'
    : typeof SharedArrayBuffer !== 'function' || typeof Worker !== 'function' ? 'no SharedArrayBuffer or Worker' : null;
  if (!why) return (await import('./web-threads/thread-start.js')).start(threads);
  const glue = await import('./web/kiln_web.js');
  await glue.default(input === undefined ? undefined : { module_or_path: input });
  return { glue, info: { threads: 1, module: 'single-threaded', reason: why } };
}

let ready = null;
/**
 * Load the WebAssembly module (idempotent). \`input\`: optional URL, Response or bytes of kiln_web_bg.wasm
 * (then the single-threaded module is used). \`options.threads\`: threads for the CPU path when the page is
 * cross-origin isolated (default navigator.hardwareConcurrency; 1 = single-threaded). An options object
 * may also be the only argument.
 */
export function init(input, options) {
  if (options === undefined && input !== null && typeof input === 'object' && Object.getPrototypeOf(input) === Object.prototype) {
    options = input; input = undefined;
  }
  if (!ready) {
    ready = load(input, options || {}).then(({ glue, info }) => {
      KilnClass = glue.Kiln;
      ({ ${[...classes, ...functions].join(', ')} } = { ...glue, ...scopeHandles(glue, KilnError) });
      threading = info;
    });
  }
  return ready;
}
`));
// Node.js runs the browser glue on the same .wasm, loaded synchronously
// from the package directory (one copy of the module in the package).
fs.writeFileSync(path.join(pkg, 'node.mjs'), `// kiln-web for Node.js as an ES module: the browser build's glue and .wasm, loaded from disk.
import nodeFs from 'node:fs';
import * as glue from './web/kiln_web.js';
glue.initSync({ module: nodeFs.readFileSync(new URL('./web/kiln_web_bg.wasm', import.meta.url)) });
${kilnError}
export { KilnError };
${scoped}
${checkpointsNode}
const KilnClass = glue.Kiln;
${checkCustomOpSource}
export { saveCheckpoint, loadCheckpoint, checkCustomOp };
${digitsNode}
/** Nothing to load in Node.js: the module is ready when imported. */
export function init() { return Promise.resolve(); }
/** The CPU path: in Node.js always the single-threaded module. */
export function threadInfo() { return { threads: 1, module: 'single-threaded', reason: 'Node.js uses the single-threaded module' }; }
`);
// CommonJS: Node.js >= 20.19 / 22.12 loads the ES module synchronously.
fs.writeFileSync(path.join(pkg, 'node.cjs'), `// kiln-web for Node.js (CPU backend) from CommonJS: the ES module entry, loaded with require(esm).
module.exports = require('./node.mjs');
`);
fs.writeFileSync(path.join(pkg, 'index.d.ts'), `export { ${names.join(', ')} } from './web/kiln_web.js';
import type { Dataset } from './web/kiln_web.js';
/**
 * The 1,797 UCI 8x8 handwritten digits (CC BY 4.0), pixels in [0, 1]:
 * loaded from the package's web/digits.csv.gz (fetched in a page, read in
 * Node.js) or from \`source\` (a URL, a file path in Node.js, or the bytes),
 * shuffled with \`seed\` (default 42) and split so that round(1797 ×
 * testFraction) samples (default 0.2) form the test set.
 */
export function loadDigits(testFraction?: number, seed?: number, source?: string | URL | Uint8Array): Promise<{ train: Dataset; test: Dataset }>;
/** Type-only declarations of the wasm module (custom ops). */
export type { CustomOpSpec, HostTypedArray } from './web/kiln_web.js';
/** The broad kinds of mistake kiln reports. */
export type KilnErrorKind = 'Shape' | 'DType' | 'OutOfRange' | 'InvalidArgument' | 'Autograd' | 'Backend' | 'Unsupported' | 'Io' | 'StaleTensor';
/** What kiln throws (and Promises reject with): kind says what sort of mistake, op which operation refused. */
export class KilnError extends Error {
  constructor(kind: KilnErrorKind, op: string, message: string);
  readonly kind: KilnErrorKind;
  readonly op: string;
}
/** Anything with a checkpoint: models, layers, optimizers. */
export interface Checkpointable {
  stateDict(): Promise<Uint8Array>;
  loadStateDict(bytes: Uint8Array): void;
}
/**
 * Save from.stateDict() (safetensors, native kiln's format and keys). In a
 * page: a download named target; in Node.js: the file at path target.
 */
export function saveCheckpoint(target: string, from: Pick<Checkpointable, 'stateDict'>): Promise<Uint8Array>;
/**
 * Load a checkpoint into \`into\`. source: bytes, a Blob/File (an upload), or a
 * string/URL (in a page: fetched; in Node.js: a file path).
 */
export function loadCheckpoint(source: string | URL | Blob | Uint8Array, into: Pick<Checkpointable, 'loadStateDict'>): Promise<Uint8Array>;
import type { CustomOp as CustomOpType, Kiln as KilnType } from './web/kiln_web.js';
/** One comparison of checkCustomOp: the worst element, as a fraction of the tolerance (<= 1 passes). */
export interface CustomOpCheck { passed: boolean; worst: number; index: number; expected: number; actual: number; }
/** What checkCustomOp found; null for a check that did not run (no device, no backward). */
export interface CustomOpReport {
  op: string; device: string | null; passed: boolean; text: string;
  parity: CustomOpCheck | null; firstOrder: CustomOpCheck | null; secondOrder: CustomOpCheck | null; deviceGradient: CustomOpCheck | null;
}
/**
 * Check a custom op (as the Rust check_custom_op does): its float32 forward on \`options.kiln\`'s device (WebGPU:
 * the WGSL kernel) against the CPU forward, and its backward against central finite differences, first and
 * second order in float64 on the CPU and the float32 gradient on the device. \`inputs\`: one per operand, values
 * in the op's smooth domain. \`gradients: false\` for a backward that is deliberately not the derivative.
 */
export function checkCustomOp(
  op: CustomOpType,
  inputs: Array<{ values: ArrayLike<number>; shape: number[] }>,
  options?: { kiln?: KilnType; gradients?: boolean; eps?: number; atol?: number; rtol?: number; deviceAtol?: number; deviceRtol?: number },
): Promise<CustomOpReport>;
/**
 * Load the WebAssembly module; call once (it is idempotent) before using
 * the API. In Node.js it resolves at once. \`input\`: optional URL, Response
 * or bytes of kiln_web_bg.wasm, when the default location does not fit.
 */
export function init(input?: string | URL | Response | BufferSource | WebAssembly.Module, options?: InitOptions): Promise<void>;
export function init(options: InitOptions): Promise<void>;
/** init()'s options. */
export interface InitOptions {
  /** Threads for the CPU path when the page is cross-origin isolated (default navigator.hardwareConcurrency; 1 = single-threaded). */
  threads?: number;
}
/**
 * The CPU path init() chose: \`threads\` (1 = single-threaded), \`module\` ('multi-threaded' when the page is
 * cross-origin isolated and has SharedArrayBuffer and Worker, else 'single-threaded'; 'none' before init())
 * and \`reason\`. The thread count also appears in a CPU Kiln's deviceInfo.
 */
export function threadInfo(): { threads: number; module: 'single-threaded' | 'multi-threaded' | 'none'; reason: string };
`);

// The JavaScript a page downloads is minified (terser: comments and
// whitespace out, local names shortened; exported names, class names and
// property names stay): wasm-bindgen's glue carries every Rust doc comment
// as JSDoc, which index.d.ts and web/kiln_web.d.ts already give editors.
// 34.5 -> 17.1 KB gzipped (web/README.md, Size). The Node.js entry points
// (node.mjs, node.cjs) are not downloaded and stay as written; they import
// the same minified glue. KILN_WEB_MINIFY=0 leaves the JS as generated.
if (process.env.KILN_WEB_MINIFY !== '0') {
  const downloaded = ['index.js', 'handles.js', 'web/kiln_web.js',
    ...(threaded ? ['web-threads/kiln_web.js', 'web-threads/thread-start.js', 'web-threads/thread-worker.js'] : [])];
  for (const f of downloaded) {
    const file = path.join(pkg, f);
    const result = await minify(fs.readFileSync(file, 'utf8'), {
      module: true,
      compress: { passes: 2 },
      mangle: true,
      keep_classnames: true,
      // wasm-bindgen's pointer to the typings (Deno and some bundlers read it).
      format: { comments: /@ts-self-types/ },
    });
    fs.writeFileSync(file, result.code + '\n');
  }
}

// Metadata and README.
const version = /\[workspace\.package\][^[]*?version\s*=\s*"([^"]+)"/s.exec(fs.readFileSync(path.join(web, '..', 'Cargo.toml'), 'utf8'))[1];
const manifest = JSON.parse(fs.readFileSync(path.join(web, 'npm', 'package.json'), 'utf8'));
manifest.version = version;
fs.writeFileSync(path.join(pkg, 'package.json'), JSON.stringify(manifest, null, 2) + '\n');
fs.copyFileSync(path.join(web, 'npm', 'README.md'), path.join(pkg, 'README.md'));

// Sizes: what a browser downloads (the entry, the glue and the .wasm;
// not the digits, fetched only by loadDigits), gzipped.
const gz = (f) => zlib.gzipSync(fs.readFileSync(f), { level: 9 }).length;
const wasmFile = path.join(pkg, 'web', 'kiln_web_bg.wasm');
const jsFiles = ['index.js', 'handles.js', 'web/kiln_web.js'].map((f) => path.join(pkg, f));
const sizes = {
  wasm_bytes: fs.statSync(wasmFile).size, wasm_gzip: gz(wasmFile),
  js_bytes: jsFiles.reduce((a, f) => a + fs.statSync(f).size, 0), js_gzip: jsFiles.reduce((a, f) => a + gz(f), 0),
};
sizes.total_gzip = sizes.wasm_gzip + sizes.js_gzip;
// What a cross-origin isolated page downloads instead: the same entry, the
// multi-threaded glue and .wasm, and the thread Worker's script (its
// Workers fetch the glue again, from the HTTP cache).
if (threaded) {
  const tWasm = path.join(pkg, 'web-threads', 'kiln_web_bg.wasm');
  const tJs = ['index.js', 'handles.js', 'web-threads/kiln_web.js', 'web-threads/thread-start.js', 'web-threads/thread-worker.js'].map((f) => path.join(pkg, f));
  sizes.threaded_wasm_bytes = fs.statSync(tWasm).size;
  sizes.threaded_wasm_gzip = gz(tWasm);
  sizes.threaded_js_gzip = tJs.reduce((a, f) => a + gz(f), 0);
  sizes.threaded_total_gzip = sizes.threaded_wasm_gzip + sizes.threaded_js_gzip;
}
fs.writeFileSync(path.join(pkg, 'sizes.json'), JSON.stringify(sizes) + '\n');
console.log(`size: ${JSON.stringify(sizes)}`);
// Where the code is, by crate (cargo's module, before wasm-opt, has names).
const raw = rawWasm;
if (fs.existsSync(raw)) {
  const r = wasmSizes(fs.readFileSync(raw));
  const code = r.functions.reduce((a, f) => a + f.bytes, 0);
  console.log(`code by crate, before wasm-opt (${code} bytes): ` +
    r.crates.slice(0, 12).map((c) => `${c.crate.split(' ')[0]} ${(100 * c.bytes / code).toFixed(1)}%`).join(', '));
}

if (args.has('--pack')) {
  const dist = path.join(web, 'dist');
  fs.mkdirSync(dist, { recursive: true });
  for (const f of fs.readdirSync(dist)) if (f.endsWith('.tgz')) fs.rmSync(path.join(dist, f));
  run('npm', ['pack', '--pack-destination', dist], { cwd: pkg });
}
