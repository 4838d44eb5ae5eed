#!/usr/bin/env node
// A tiny static server for web/: the demos at /demo/ (an index page: digits,
// MNIST CNN, Shakespeare GPT), the benchmark page at /bench/, the browser
// test pages at /tests/. `npm run demo` starts it. Every response carries
// the COOP/COEP headers that make a page cross-origin isolated (so kiln
// loads its multi-threaded module) unless its URL has ?coi=0.
// Usage: node scripts/serve.mjs [--port N] [--mnist DIR] [--shakespeare FILE]
//   --port 0: any free port.
//   --mnist DIR: serve DIR's MNIST IDX files (train-images-idx3-ubyte.gz, ...)
//     to the MNIST demo instead of the 1,000/200-image subset in demo/mnist/data/.
//   --shakespeare FILE: serve FILE (plain or gzipped text) to the GPT demo
//     instead of the 64 KB excerpt in demo/gpt/data/.
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const types = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.mjs': 'text/javascript; charset=utf-8',
  '.wasm': 'application/wasm', '.json': 'application/json', '.css': 'text/css', '.png': 'image/png', '.ts': 'text/plain',
};

/** `data`: replacements for the demos' served data, { mnist: DIR, shakespeare: FILE }. */
export function serve(port = 0, data = {}) {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://localhost');
    let file = path.normalize(path.join(root, decodeURIComponent(url.pathname)));
    if (!file.startsWith(root)) { res.writeHead(403).end(); return; }
    if (url.pathname === '/') { res.writeHead(302, { location: '/demo/' }).end(); return; }
    const mnist = url.pathname.match(/^\/demo\/mnist\/data\/([a-z0-9-]+-ubyte\.gz)$/);
    if (data.mnist && mnist) file = path.join(data.mnist, mnist[1]);
    if (data.shakespeare && url.pathname === '/demo/gpt/data/shakespeare.txt') file = data.shakespeare;
    if (fs.existsSync(file) && fs.statSync(file).isDirectory()) {
      // Relative URLs in the page need the trailing slash.
      if (!url.pathname.endsWith('/')) { res.writeHead(302, { location: `${url.pathname}/` }).end(); return; }
      file = path.join(file, 'index.html');
    }
    fs.readFile(file, (err, body) => {
      if (err) { res.writeHead(404, { 'content-type': 'text/plain' }).end(`not found: ${url.pathname}`); return; }
      const headers = { 'content-type': types[path.extname(file)] || 'application/octet-stream', 'cache-control': 'no-store' };
      // Cross-origin isolation (SharedArrayBuffer: kiln's multi-threaded
      // module) unless the URL asks for none with ?coi=0.
      if (url.searchParams.get('coi') !== '0') {
        headers['cross-origin-opener-policy'] = 'same-origin';
        headers['cross-origin-embedder-policy'] = 'require-corp';
      }
      res.writeHead(200, headers);
      res.end(body);
    });
  });
  return new Promise((resolve) => server.listen(port, '127.0.0.1', () => resolve(server)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const flag = (name) => { const i = process.argv.indexOf(`--${name}`); return i > 0 ? process.argv[i + 1] : undefined; };
  const port = Number(flag('port') ?? 8080);
  const data = { mnist: flag('mnist') && path.resolve(flag('mnist')), shakespeare: flag('shakespeare') && path.resolve(flag('shakespeare')) };
  if (!fs.existsSync(path.join(root, 'pkg', 'index.js'))) {
    console.error('web/pkg/ is missing: run `npm run build` first (needs cargo, the wasm-bindgen CLI and the nightly toolchain: see README.md).');
    process.exit(1);
  }
  const server = await serve(port, data);
  const { port: p } = server.address();
  console.log(`kiln demos:     http://127.0.0.1:${p}/demo/  (digits MLP, MNIST CNN, Shakespeare GPT)`);
  if (data.mnist) console.log(`  MNIST from ${data.mnist}`);
  if (data.shakespeare) console.log(`  Shakespeare from ${data.shakespeare}`);
  console.log(`kiln benchmark: http://127.0.0.1:${p}/bench/`);
}
