#!/usr/bin/env node
// Writes the small data files the demos serve (committed under demo/*/data/),
// from the original files, so that anyone can regenerate or enlarge them:
//   node scripts/make-demo-data.mjs --mnist DIR [--train N] [--test N]
//   node scripts/make-demo-data.mjs --shakespeare FILE [--chars N]
// MNIST: the first N images of the original IDX files (train and test),
// written back as gzipped IDX with the header's count changed.
// Shakespeare: the first N characters of the plain text (gzipped or not).
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';

const demo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'demo');
const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : fallback;
};
const read = (file) => {
  const bytes = fs.readFileSync(file);
  return bytes[0] === 0x1f && bytes[1] === 0x8b ? zlib.gunzipSync(bytes) : bytes;
};

/** The first `count` items of an IDX file (magic, dims as big-endian u32, then u8 data). */
function idxHead(bytes, count) {
  const dims = bytes[3];
  const header = 4 + 4 * dims;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let item = 1;
  for (let d = 1; d < dims; d++) item *= view.getUint32(4 + 4 * d);
  const total = view.getUint32(4);
  if (count > total) throw new Error(`asked for ${count} items, the file has ${total}`);
  const out = Buffer.from(bytes.subarray(0, header + count * item));
  out.writeUInt32BE(count, 4);
  return out;
}

const mnist = arg('mnist');
if (mnist) {
  const sizes = { train: Number(arg('train', 1000)), t10k: Number(arg('test', 200)) };
  for (const [set, count] of Object.entries(sizes)) for (const kind of ['images-idx3', 'labels-idx1']) {
    const name = `${set}-${kind}-ubyte.gz`;
    const out = zlib.gzipSync(idxHead(read(path.join(mnist, name)), count), { level: 9 });
    fs.writeFileSync(path.join(demo, 'mnist', 'data', name), out);
    console.log(`demo/mnist/data/${name}: ${count} items, ${out.length} B`);
  }
}
const text = arg('shakespeare');
if (text) {
  const chars = Number(arg('chars', 65536));
  const excerpt = read(text).toString('latin1').slice(0, chars).replace(/\r\n/g, '\n');
  const file = path.join(demo, 'gpt', 'data', 'shakespeare.txt');
  fs.writeFileSync(file, excerpt);
  console.log(`demo/gpt/data/shakespeare.txt: ${excerpt.length} characters`);
}
