#!/usr/bin/env node
// Builds the npm package into web/pkg/ and (with --pack) its tarball into
// web/dist/:
//   pkg/web/   wasm-pack --target web    (ES module for browsers and bundlers)
//   pkg/node/  wasm-pack --target nodejs (CommonJS for Node.js)
//   pkg/index.js, index.d.ts             browser entry: init() + the API
//   pkg/node.cjs, node.mjs               Node entry: the same API, init() a no-op
//   pkg/package.json, README.md          from web/npm/
// The wasm is built once per target with the `wasm-release` profile (size
// first: opt-level "s", LTO, one codegen unit) and shrunk with wasm-opt from
// the npm `binaryen` package. Prints the gzipped sizes.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const web = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = path.join(web, 'pkg');
const args = new Set(process.argv.slice(2));
const features = process.env.KILN_WEB_FEATURES || '';

function run(cmd, argv, opts = {}) {
  console.log(`$ ${cmd} ${argv.join(' ')}`);
  execFileSync(cmd, argv, { stdio: 'inherit', cwd: web, ...opts });
}

fs.rmSync(pkg, { recursive: true, force: true });
for (const [target, dir] of [['web', 'web'], ['nodejs', 'node']]) {
  const argv = ['build', '--target', target, '--out-dir', `pkg/${dir}`, '--out-name', 'kiln_web',
    '--profile', 'wasm-release', '--weak-refs', '--no-pack', '--no-opt', '--no-gitignore', '--mode', 'no-install'];
  if (features) argv.push('--', '--features', features);
  run('wasm-pack', argv);
  const wasm = path.join(pkg, dir, 'kiln_web_bg.wasm');
  const before = fs.statSync(wasm).size;
  // The features rustc's wasm32 target enables by default; wasm-opt must be
  // told, or it refuses the module.
  run(path.join(web, 'node_modules', '.bin', 'wasm-opt'), [
    '-Os', '--strip-debug', '--strip-producers',
    '--enable-bulk-memory', '--enable-mutable-globals', '--enable-nontrapping-float-to-int',
    '--enable-sign-ext', '--enable-reference-types', '--enable-multivalue',
    wasm, '-o', wasm,
  ]);
  console.log(`wasm-opt: ${dir} ${before} -> ${fs.statSync(wasm).size} bytes`);
}

// CommonJS marker for the Node build (the package itself is "type": "module").
fs.writeFileSync(path.join(pkg, 'node', 'package.json'), '{ "type": "commonjs" }\n');

// Entry points.
const require = createRequire(import.meta.url);
const names = Object.keys(require(path.join(pkg, 'node', 'kiln_web.js'))).filter((n) => !n.startsWith('__') && n !== 'initSync');
fs.writeFileSync(path.join(pkg, 'index.js'), `// kiln-web for browsers and bundlers. Call \`await init()\` once before anything else.
import wasmInit from './web/kiln_web.js';
export * from './web/kiln_web.js';

let ready = null;
/** Load the WebAssembly module (idempotent). \`input\`: optional URL, Response or bytes of kiln_web_bg.wasm. */
export function init(input) {
  if (!ready) ready = wasmInit(input === undefined ? undefined : { module_or_path: input }).then(() => undefined);
  return ready;
}
`);
fs.writeFileSync(path.join(pkg, 'node.cjs'), `// kiln-web for Node.js (CPU backend). The module loads synchronously; init() exists for symmetry.
const kiln = require('./node/kiln_web.js');
module.exports = { ...kiln, init: () => Promise.resolve() };
`);
fs.writeFileSync(path.join(pkg, 'node.mjs'), `// kiln-web for Node.js as an ES module.
import { createRequire } from 'node:module';
const kiln = createRequire(import.meta.url)('./node/kiln_web.js');
${names.map((n) => `export const ${n} = kiln.${n};`).join('\n')}
/** Nothing to load in Node.js: the module is ready when imported. */
export function init() { return Promise.resolve(); }
`);
fs.writeFileSync(path.join(pkg, 'index.d.ts'), `export * from './web/kiln_web.js';
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

// Sizes: what a browser downloads (the web build's .wasm + .js), gzipped.
const gz = (f) => zlib.gzipSync(fs.readFileSync(f), { level: 9 }).length;
const wasmFile = path.join(pkg, 'web', 'kiln_web_bg.wasm');
const jsFile = path.join(pkg, 'web', 'kiln_web.js');
const sizes = {
  wasm_bytes: fs.statSync(wasmFile).size, wasm_gzip: gz(wasmFile),
  js_bytes: fs.statSync(jsFile).size, js_gzip: gz(jsFile),
};
sizes.total_gzip = sizes.wasm_gzip + sizes.js_gzip;
fs.writeFileSync(path.join(pkg, 'sizes.json'), JSON.stringify(sizes) + '\n');
console.log(`size: ${JSON.stringify(sizes)}`);

if (args.has('--pack')) {
  const dist = path.join(web, 'dist');
  fs.mkdirSync(dist, { recursive: true });
  for (const f of fs.readdirSync(dist)) if (f.endsWith('.tgz')) fs.rmSync(path.join(dist, f));
  run('npm', ['pack', '--pack-destination', dist], { cwd: pkg });
}
