#!/usr/bin/env node
// A tiny static server for web/: the demo at /demo/, the benchmark page at
// /bench/, the browser test page at /tests/. `npm run demo` starts it.
// Usage: node scripts/serve.mjs [--port N]   (0 = any free port)
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const types = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.mjs': 'text/javascript; charset=utf-8',
  '.wasm': 'application/wasm', '.json': 'application/json', '.css': 'text/css', '.png': 'image/png', '.ts': 'text/plain',
};

export function serve(port = 0) {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://localhost');
    let file = path.normalize(path.join(root, decodeURIComponent(url.pathname)));
    if (!file.startsWith(root)) { res.writeHead(403).end(); return; }
    if (url.pathname === '/') { res.writeHead(302, { location: '/demo/' }).end(); return; }
    if (fs.existsSync(file) && fs.statSync(file).isDirectory()) file = path.join(file, 'index.html');
    fs.readFile(file, (err, body) => {
      if (err) { res.writeHead(404, { 'content-type': 'text/plain' }).end(`not found: ${url.pathname}`); return; }
      res.writeHead(200, { 'content-type': types[path.extname(file)] || 'application/octet-stream', 'cache-control': 'no-store' });
      res.end(body);
    });
  });
  return new Promise((resolve) => server.listen(port, '127.0.0.1', () => resolve(server)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const i = process.argv.indexOf('--port');
  const port = i > 0 ? Number(process.argv[i + 1]) : 8080;
  if (!fs.existsSync(path.join(root, 'pkg', 'index.js'))) {
    console.error('web/pkg/ is missing: run `npm run build` first (needs wasm-pack and cargo).');
    process.exit(1);
  }
  const server = await serve(port);
  const { port: p } = server.address();
  console.log(`kiln demo:      http://127.0.0.1:${p}/demo/`);
  console.log(`kiln benchmark: http://127.0.0.1:${p}/bench/`);
}
