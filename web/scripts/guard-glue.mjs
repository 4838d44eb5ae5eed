// Type guards for wasm-bindgen's argument helpers in the generated glue.
//
// The glue trusts its callers' types. A number where a string parameter
// is declared (`tensor.cast(3)`) reaches `passStringToWasm0` with no
// `length`: it asks wasm for a zero-byte string, then reallocates it as if
// it had a size, which corrupts the allocator ("memory access out of
// bounds", and the module is unusable afterwards). `null` for a byte or
// number array dies on `null.length`, and a wrong class object gives a bare
// `Error("expected instance of Schedule")`.
//
// `guardGlue(file)` rewrites those helpers in place so that each refuses a
// wrong type with a TypeError (marked `kilnArgument`) before anything
// reaches wasm; handles.js turns such an error into the KilnError
// (`InvalidArgument`, named after the method) that every other bad argument
// gives. Each rewrite must find its helper when the glue defines it, so a
// wasm-bindgen update that renames one fails the build instead of silently
// dropping a guard.

import fs from 'node:fs';

// How a wrong argument is named in the message, as kiln-web's Rust side
// names it (web/src/tensor_api.rs, `describe`).
const WHAT = `function kilnWhat(v) {
    if (v === null) return 'null';
    if (typeof v === 'string') return 'the string ' + JSON.stringify(v);
    if (Array.isArray(v)) return 'an array';
    return typeof v;
}
function kilnArgError(message) {
    const e = new TypeError(message);
    e.kilnArgument = true;
    return e;
}
`;

const rewrites = [
  {
    helper: /function _assertClass\(instance, klass\) \{/,
    from: /throw new Error\(`expected instance of \$\{klass\.name\}`\);/,
    to: 'throw kilnArgError(`expected a ${klass.name}, got ${kilnWhat(instance)}`);',
  },
  {
    helper: /function passStringToWasm0\(arg, malloc, realloc\) \{/,
    from: /(function passStringToWasm0\(arg, malloc, realloc\) \{\n)/,
    to: "$1    if (typeof arg !== 'string') throw kilnArgError(`expected a string, got ${kilnWhat(arg)}`);\n",
  },
  {
    helper: /function passArray\w*ToWasm0\(arg, malloc\) \{/,
    from: /(function passArray\w*ToWasm0\(arg, malloc\) \{\n)/g,
    to: '$1    if (!Array.isArray(arg) && !ArrayBuffer.isView(arg)) throw kilnArgError(`expected an array or a typed array, got ${kilnWhat(arg)}`);\n',
  },
];

/** Rewrites the glue at `file`; returns how many helpers were guarded. */
export function guardGlue(file) {
  let js = fs.readFileSync(file, 'utf8');
  let guarded = 0;
  for (const { helper, from, to } of rewrites) {
    const defined = (js.match(new RegExp(helper.source, 'g')) ?? []).length;
    if (defined === 0) continue;
    const found = (js.match(new RegExp(from.source, 'g')) ?? []).length;
    if (found !== defined) {
      throw new Error(`guard-glue: ${file} defines ${helper.source} ${defined} time(s) but the guard's pattern matched ${found}; update scripts/guard-glue.mjs for this wasm-bindgen`);
    }
    js = js.replace(from, to);
    guarded += found;
  }
  if (guarded > 0) js += '\n' + WHAT;
  fs.writeFileSync(file, js);
  return guarded;
}
