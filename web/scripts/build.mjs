#!/usr/bin/env node
// Builds the npm package into web/pkg/ and (with --pack) its tarball into
// web/dist/:
//   pkg/web/   wasm-pack --target web: the one .wasm and its ES-module glue
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

const web = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = path.join(web, 'pkg');
const args = new Set(process.argv.slice(2));
const features = process.env.KILN_WEB_FEATURES || '';

function run(cmd, argv, opts = {}) {
  console.log(`$ ${cmd} ${argv.join(' ')}`);
  execFileSync(cmd, argv, { stdio: 'inherit', cwd: web, ...opts });
}

fs.rmSync(pkg, { recursive: true, force: true });
{
  const argv = ['build', '--target', 'web', '--out-dir', 'pkg/web', '--out-name', 'kiln_web',
    '--profile', 'wasm-release', '--weak-refs', '--no-pack', '--no-opt', '--no-gitignore', '--mode', 'no-install'];
  if (features) argv.push('--', '--features', features);
  run('wasm-pack', argv);
  const wasm = path.join(pkg, 'web', 'kiln_web_bg.wasm');
  const before = fs.statSync(wasm).size;
  // The features rustc's wasm32 target enables by default; wasm-opt must be
  // told, or it refuses the module.
  run(path.join(web, 'node_modules', '.bin', 'wasm-opt'), [
    '-Oz', '--strip-debug', '--strip-producers',
    '--enable-bulk-memory', '--enable-mutable-globals', '--enable-nontrapping-float-to-int',
    '--enable-sign-ext', '--enable-reference-types', '--enable-multivalue',
    wasm, '-o', wasm,
  ]);
  console.log(`wasm-opt: ${before} -> ${fs.statSync(wasm).size} bytes`);
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
// Classes are re-exported as they are (handles.js patches their
// prototypes); functions are exported wrapped by handles.js.
const isClass = (n) => typeof glue[n] === 'function' && typeof glue[n].prototype?.free === 'function';
const classes = names.filter(isClass);
const functions = names.filter((n) => !isClass(n));
const scoped = `import { scopeHandles } from './handles.js';
const scoped = scopeHandles(glue, KilnError);
export const { ${functions.join(', ')} } = scoped;`;
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
}`;
// Checkpoint helpers: in a page, save = download and load = fetch a URL or
// read an uploaded File/Blob; in Node, files. Both also accept bytes.
const checkpointsWeb = `/** Download from.stateDict() as a file called name; resolves to the bytes. */
export async function saveCheckpoint(name, from) {
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
  let bytes;
  if (source instanceof Uint8Array) bytes = source;
  else if (typeof source === 'string' || source instanceof URL) {
    const response = await fetch(source);
    if (!response.ok) throw new KilnError('Io', 'loadCheckpoint', 'loadCheckpoint: fetching ' + source + ' gave HTTP ' + response.status);
    bytes = new Uint8Array(await response.arrayBuffer());
  } else bytes = new Uint8Array(await source.arrayBuffer());
  into.loadStateDict(bytes);
  return bytes;
}`;
const checkpointsNode = `/** Write from.stateDict() to the file at path; resolves to the bytes. */
async function saveCheckpoint(path, from) {
  const bytes = await from.stateDict();
  nodeFs.writeFileSync(path, bytes);
  return bytes;
}
/** Load a checkpoint into \`into\` from a file path, a Blob, or bytes; resolves to the bytes. */
async function loadCheckpoint(source, into) {
  let bytes;
  if (source instanceof Uint8Array) bytes = source;
  else if (typeof source === 'string' || source instanceof URL) bytes = new Uint8Array(nodeFs.readFileSync(source));
  else bytes = new Uint8Array(await source.arrayBuffer());
  into.loadStateDict(bytes);
  return bytes;
}`;
// The digits ship beside the wasm (web/digits.csv.gz), loaded on demand.
fs.copyFileSync(path.join(web, '..', 'core', 'data', 'digits.csv.gz'), path.join(pkg, 'web', 'digits.csv.gz'));
const digitsDoc = (source) => `/**
 * The 1,797 UCI 8x8 handwritten digits (CC BY 4.0) from the package's
 * web/digits.csv.gz (or from source: ${source} or the bytes), shuffled
 * with seed and split; resolves to { train, test }.
 */`;
const digitsWeb = `${digitsDoc('a URL')}
export async function loadDigits(testFraction, seed, source) {
  let bytes = source;
  if (!(bytes instanceof Uint8Array)) {
    const url = source ?? new URL('./web/digits.csv.gz', import.meta.url);
    const response = await fetch(url);
    if (!response.ok) throw new KilnError('Io', 'loadDigits', 'loadDigits: fetching ' + url + ' gave HTTP ' + response.status);
    bytes = new Uint8Array(await response.arrayBuffer());
  }
  return digitsFromBytes(bytes, testFraction, seed);
}`;
const digitsNode = `${digitsDoc('a file path or URL')}
export async function loadDigits(testFraction, seed, source) {
  const bytes = source instanceof Uint8Array ? source
    : new Uint8Array(nodeFs.readFileSync(source ?? new URL('./web/digits.csv.gz', import.meta.url)));
  return glue.digitsFromBytes(bytes, testFraction, seed);
}`;
fs.writeFileSync(path.join(pkg, 'index.js'), `// kiln-web for browsers and bundlers. Call \`await init()\` once before anything else.
import wasmInit, * as glue from './web/kiln_web.js';
export { ${classes.join(', ')} } from './web/kiln_web.js';
${kilnError}
export { KilnError };
${scoped}
${checkpointsWeb}
${digitsWeb}

let ready = null;
/** Load the WebAssembly module (idempotent). \`input\`: optional URL, Response or bytes of kiln_web_bg.wasm. */
export function init(input) {
  if (!ready) ready = wasmInit(input === undefined ? undefined : { module_or_path: input }).then(() => undefined);
  return ready;
}
`);
// Node.js runs the browser glue on the same .wasm, loaded synchronously
// from the package directory (one copy of the module in the package).
fs.writeFileSync(path.join(pkg, 'node.mjs'), `// kiln-web for Node.js as an ES module: the browser build's glue and .wasm, loaded from disk.
import nodeFs from 'node:fs';
import * as glue from './web/kiln_web.js';
glue.initSync({ module: nodeFs.readFileSync(new URL('./web/kiln_web_bg.wasm', import.meta.url)) });
export { ${classes.join(', ')} } from './web/kiln_web.js';
${kilnError}
export { KilnError };
${scoped}
${checkpointsNode}
export { saveCheckpoint, loadCheckpoint };
${digitsNode}
/** Nothing to load in Node.js: the module is ready when imported. */
export function init() { return Promise.resolve(); }
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
/**
 * Load the WebAssembly module; call once (it is idempotent) before using
 * the API. In Node.js it resolves at once. \`input\`: optional URL, Response
 * or bytes of kiln_web_bg.wasm, when the default location does not fit.
 */
export function init(input?: string | URL | Response | BufferSource | WebAssembly.Module): Promise<void>;
`);

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
fs.writeFileSync(path.join(pkg, 'sizes.json'), JSON.stringify(sizes) + '\n');
console.log(`size: ${JSON.stringify(sizes)}`);
// Where the code is, by crate (cargo's module, before wasm-opt, has names).
const raw = path.join(web, '..', 'target', 'wasm32-unknown-unknown', 'wasm-release', 'kiln_web.wasm');
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
