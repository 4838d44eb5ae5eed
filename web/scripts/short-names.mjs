// Short names for the links between the .wasm and its wasm-bindgen glue.
//
// wasm-bindgen names each import after the JS it calls plus a 16-hex-digit
// hash (`__wbg_new_8a6f238a6ece86ea`) and each export after the Rust item
// (`tensor_maxPool2dBackward`); every name is spelled in the .wasm and again
// in the glue, ~500 names, and the hashes do not compress. Renamed here to
// `a`, `b`, ... `aa`, ... in both, right after wasm-bindgen (before wasm-opt
// and terser). Only names whose every use in the glue is the one this
// rewrites are renamed, so nothing else can break:
//   - an export, where the glue only reaches the module's exports as
//     `wasm.NAME` (checked: no other way to read `wasm`'s members);
//   - an import, when its name occurs once in the glue, as a key (`NAME:`)
//     of the import object;
//   - the import module's name, when it occurs once, as a quoted key.
// Everything else keeps its name (memory, for one, is passed around).
import fs from 'node:fs';

/** Rewrites the .wasm at `wasmPath` and the glue at `jsPath` in place; returns what was renamed. */
export function shortenNames(wasmPath, jsPath) {
  const bytes = fs.readFileSync(wasmPath);
  let js = fs.readFileSync(jsPath, 'utf8');
  const sections = readSections(bytes);
  const imports = sections.find((s) => s.id === 2);
  const exports = sections.find((s) => s.id === 7);
  const importList = imports ? readImports(imports.payload) : [];
  const exportList = exports ? readExports(exports.payload) : [];

  const count = (re) => (js.match(re) || []).length;
  const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const ident = (name) => new RegExp(`(?<![\\w$])${esc(name)}(?![\\w$])`, 'g');
  // The glue must reach the exports only as `wasm.NAME`.
  const otherAccess = /(?<![\w$])wasm\s*\[|\.exports\s*\[|Object\.(keys|entries|values)\(\s*wasm\s*\)/;
  if (otherAccess.test(js)) throw new Error(`short-names: ${jsPath} reads the wasm exports other than as wasm.NAME`);

  const taken = new Set([...importList.map((i) => i.field), ...exportList.map((e) => e.name)]);
  let next = 0;
  const fresh = () => {
    for (;;) {
      let n = next++, s = '';
      do { s = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'[n % 52] + s; n = Math.floor(n / 52) - 1; } while (n >= 0);
      if (!taken.has(s)) return s;
    }
  };
  const renamed = { exports: 0, imports: 0, modules: 0 };

  // Exports: rename where the glue uses them (as wasm.NAME only, checked above).
  for (const e of exportList) {
    const uses = new RegExp(`(?<![\\w$])wasm\\.${esc(e.name)}(?![\\w$])`, 'g');
    if (count(uses) === 0) continue;
    const short = fresh();
    js = js.replace(uses, `wasm.${short}`);
    e.name = short;
    renamed.exports++;
  }
  // Imports: the object key `NAME:` that is the name's one occurrence.
  for (const i of importList) {
    if (count(ident(i.field)) !== 1) continue;
    const key = new RegExp(`(?<![\\w$])${esc(i.field)}(?=\\s*:)`);
    if (!key.test(js)) continue;
    const short = fresh();
    js = js.replace(key, short);
    i.field = short;
    renamed.imports++;
  }
  // Import modules: a quoted key that occurs once.
  for (const module of new Set(importList.map((i) => i.module))) {
    const quoted = new RegExp(`(["'])${esc(module)}\\1(?=\\s*:)`);
    if (count(new RegExp(`["']${esc(module)}["']`, 'g')) !== 1 || !quoted.test(js)) continue;
    const short = fresh();
    js = js.replace(quoted, `"${short}"`);
    for (const i of importList) if (i.module === module) i.module = short;
    renamed.modules++;
  }

  const out = [bytes.subarray(0, 8)];
  for (const s of sections) {
    const payload = s.id === 2 ? writeImports(importList) : s.id === 7 ? writeExports(exportList) : s.payload;
    out.push(Buffer.from([s.id]), leb(payload.length), payload);
  }
  fs.writeFileSync(wasmPath, Buffer.concat(out));
  fs.writeFileSync(jsPath, js);
  return renamed;
}

function leb(n) {
  const b = [];
  do {
    let byte = n & 0x7f;
    n = Math.floor(n / 128);
    if (n) byte |= 0x80;
    b.push(byte);
  } while (n);
  return Buffer.from(b);
}
const name = (s) => { const b = Buffer.from(s, 'utf8'); return Buffer.concat([leb(b.length), b]); };

function reader(bytes, pos = 0) {
  const r = {
    pos,
    u8: () => bytes[r.pos++],
    leb: () => { let v = 0, shift = 0, b; do { b = bytes[r.pos++]; v += (b & 0x7f) * 2 ** shift; shift += 7; } while (b & 0x80); return v; },
    name: () => { const n = r.leb(); const s = bytes.subarray(r.pos, r.pos + n).toString('utf8'); r.pos += n; return s; },
  };
  return r;
}

function readSections(bytes) {
  if (bytes.length < 8 || bytes.readUInt32LE(0) !== 0x6d736100) throw new Error('short-names: not a wasm module');
  const r = reader(bytes, 8);
  const sections = [];
  while (r.pos < bytes.length) {
    const id = r.u8();
    const size = r.leb();
    sections.push({ id, payload: bytes.subarray(r.pos, r.pos + size) });
    r.pos += size;
  }
  return sections;
}

// An import's description is kept as its bytes (only the names change).
function readImports(payload) {
  const r = reader(payload);
  const n = r.leb();
  const list = [];
  const limits = () => { const flags = r.leb(); r.leb(); if (flags & 1) r.leb(); };
  for (let k = 0; k < n; k++) {
    const module = r.name();
    const field = r.name();
    const start = r.pos;
    const kind = r.u8();
    if (kind === 0) r.leb(); // function: type index
    else if (kind === 1) { r.u8(); limits(); } // table: element type, limits
    else if (kind === 2) limits(); // memory
    else if (kind === 3) { r.u8(); r.u8(); } // global: value type, mutability
    else if (kind === 4) { r.u8(); r.leb(); } // tag
    else throw new Error(`short-names: unknown import kind ${kind}`);
    list.push({ module, field, desc: payload.subarray(start, r.pos) });
  }
  if (r.pos !== payload.length) throw new Error('short-names: the import section did not parse');
  return list;
}

function writeImports(list) {
  return Buffer.concat([leb(list.length), ...list.flatMap((i) => [name(i.module), name(i.field), i.desc])]);
}

function readExports(payload) {
  const r = reader(payload);
  const n = r.leb();
  const list = [];
  for (let k = 0; k < n; k++) {
    const n2 = r.name();
    const kind = r.u8();
    const index = r.leb();
    list.push({ name: n2, kind, index });
  }
  if (r.pos !== payload.length) throw new Error('short-names: the export section did not parse');
  return list;
}

function writeExports(list) {
  return Buffer.concat([leb(list.length), ...list.flatMap((e) => [name(e.name), Buffer.from([e.kind]), leb(e.index)])]);
}
