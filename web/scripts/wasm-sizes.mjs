#!/usr/bin/env node
// What takes the room in a .wasm: code bytes per crate (from the function
// names in the module's `name` section), the data segments, and the largest
// functions. Run it on a module that still has its names, e.g. cargo's
// output before wasm-opt strips them:
//   node scripts/wasm-sizes.mjs ../target/wasm32-unknown-unknown/wasm-release/kiln_web.wasm [--top 30] [--json]
// Crate totals are of raw (uncompressed) code bytes; gzip shrinks all
// crates by roughly the same factor, so the shares carry over.
import fs from 'node:fs';

export function wasmSizes(bytes) {
  let pos = 0;
  const u8 = () => bytes[pos++];
  const leb = () => {
    let result = 0, shift = 0, b;
    do { b = u8(); result += (b & 0x7f) * 2 ** shift; shift += 7; } while (b & 0x80);
    return result;
  };
  const name = () => { const n = leb(); const s = Buffer.from(bytes.subarray(pos, pos + n)).toString('utf8'); pos += n; return s; };
  if (bytes.length < 8 || bytes.readUInt32LE(0) !== 0x6d736100) throw new Error('not a wasm module');
  pos = 8;
  const sections = [];
  let importedFunctions = 0;
  let bodies = [];
  const names = new Map();
  while (pos < bytes.length) {
    const id = u8();
    const size = leb();
    const start = pos;
    const end = pos + size;
    let label = ['custom', 'type', 'import', 'function', 'table', 'memory', 'global', 'export', 'start', 'element', 'code', 'data', 'datacount', 'tag'][id] ?? `section ${id}`;
    if (id === 0) label = `custom:${name()}`;
    if (id === 2) {
      const count = leb();
      for (let i = 0; i < count; i++) {
        name(); name();
        const kind = u8();
        if (kind === 0) { leb(); importedFunctions++; }
        else if (kind === 1) { u8(); const flags = leb(); leb(); if (flags & 1) leb(); }
        else if (kind === 2) { const flags = leb(); leb(); if (flags & 1) leb(); }
        else if (kind === 3) { u8(); u8(); }
        else if (kind === 4) { u8(); leb(); }
      }
    } else if (id === 10) {
      const count = leb();
      for (let i = 0; i < count; i++) { const len = leb(); bodies.push(len); pos += len; }
    } else if (label === 'custom:name') {
      while (pos < end) {
        const sub = u8();
        const len = leb();
        const subEnd = pos + len;
        if (sub === 1) {
          const count = leb();
          for (let i = 0; i < count; i++) { const index = leb(); names.set(index, name()); }
        }
        pos = subEnd;
      }
    }
    sections.push({ section: label, bytes: size });
    pos = end;
    void start;
  }
  const functions = bodies.map((len, i) => ({ name: names.get(importedFunctions + i) ?? `func[${importedFunctions + i}]`, bytes: len }));
  const crates = new Map();
  for (const f of functions) {
    const c = crateOf(f.name);
    crates.set(c, (crates.get(c) ?? 0) + f.bytes);
  }
  return {
    total: bytes.length,
    named: names.size > 0,
    sections: sections.sort((a, b) => b.bytes - a.bytes),
    crates: [...crates].map(([crate, b]) => ({ crate, bytes: b })).sort((a, b) => b.bytes - a.bytes),
    functions: functions.sort((a, b) => b.bytes - a.bytes),
  };
}

// The crate a function belongs to: the first path segment of its
// (demangled or legacy-mangled) Rust name; for a trait impl
// (`<a::B as c::D>::f`) the implementing type's crate.
export function crateOf(fn) {
  let s = fn;
  if (s.startsWith('_R')) {
    // v0 mangling: the crate root is `C`, an optional `s<hash>_`, then <len><name>.
    const m = /C(?:s[0-9A-Za-z]*_)?(\d+)/.exec(s);
    if (m) return clean(s.substr(m.index + m[0].length, Number(m[1])));
  }
  if (s.startsWith('_ZN')) {
    // Legacy mangling: the first <len><segment>, with $LT$, .. and friends spelled out.
    const m = /^_ZN(\d+)/.exec(s);
    if (m) {
      s = s.substr(3 + m[1].length, Number(m[1]))
        .replace(/^_(?=\$)/, '').replace(/\$LT\$/g, '<').replace(/\$GT\$/g, '>').replace(/\$u20\$/g, ' ')
        .replace(/\$RF\$/g, '&').replace(/\.\./g, '::');
      if (!s.includes('::')) return clean(s);
    }
  }
  while (s.startsWith('<') || s.startsWith('&') || s.startsWith('dyn ') || s.startsWith('mut ')) {
    s = s.replace(/^(<|&|dyn |mut )/, '');
  }
  const m = /^([A-Za-z_][A-Za-z0-9_]*)::/.exec(s);
  if (m) return clean(m[1]);
  if (/^func\[\d+\]$/.test(fn)) return '(unnamed)';
  return '(other: ' + (/^[A-Za-z_]+/.exec(s)?.[0] ?? fn.slice(0, 20)) + ')';
}
const clean = (c) => (['core', 'alloc', 'std'].includes(c) ? `${c} (generic code instantiated by callers)` : c);

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  const file = args.find((a) => !a.startsWith('--') && !/^\d+$/.test(a));
  const topAt = args.indexOf('--top');
  const top = topAt >= 0 ? Number(args[topAt + 1]) : 25;
  const r = wasmSizes(fs.readFileSync(file));
  if (args.includes('--json')) {
    console.log(JSON.stringify({ ...r, functions: r.functions.slice(0, top) }, null, 1));
  } else {
    const code = r.functions.reduce((a, f) => a + f.bytes, 0);
    console.log(`${file}: ${r.total} bytes${r.named ? '' : ' (no name section: crates unknown)'}`);
    console.log('sections:');
    for (const s of r.sections.slice(0, 8)) console.log(`  ${String(s.bytes).padStart(9)}  ${s.section}`);
    console.log(`code by crate (of ${code} code bytes):`);
    for (const c of r.crates.slice(0, top)) console.log(`  ${String(c.bytes).padStart(9)}  ${(100 * c.bytes / code).toFixed(1).padStart(5)} %  ${c.crate}`);
    console.log('largest functions:');
    for (const f of r.functions.slice(0, top)) console.log(`  ${String(f.bytes).padStart(9)}  ${f.name.slice(0, 140)}`);
  }
}
