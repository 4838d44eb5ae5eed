#!/usr/bin/env bash
# Portable numerics (docs/portable-numerics.md) rest on one fact: the wasm's
# std math functions (compiler-builtins' copy of libm, in the pinned nightly's
# rust-src) are the same source as the `libm` crate that native kiln calls in
# portable numerics. This compares the files of every function kiln calls
# (and what they call), ignoring cfgs for x86 without SSE2 (neither target
# is that) and one integer-division macro; it fails on any other difference,
# e.g. after the nightly pin or the libm version moves.
set -euo pipefail
cd "$(dirname "$0")/../.."
NIGHTLY=$(sed -n "s/^const NIGHTLY = '\(.*\)';.*/\1/p" web/scripts/build.mjs)
CB="$(rustc +"$NIGHTLY" --print sysroot)/lib/rustlib/src/rust/library/compiler-builtins/libm/src/math"
CRATE="$(cargo metadata --format-version 1 --locked 2>/dev/null \
  | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const p=JSON.parse(s).packages.find(p=>p.name==="libm");console.log(require("path").dirname(p.manifest_path))})')/src/math"
normalise() {
  grep -v -e 'x86_no_sse' -e 'target_arch = "x86"' -e 'clippy' "$1" \
    | sed -E 's/div!\(([^,]+), ([0-9]+)\)/(\1) \/ \2/'
}
bad=0
for f in log logf sin sinf cos cosf tanh tanhf pow powf exp expf expm1 expm1f \
         k_sin k_cos k_sinf k_cosf rem_pio2 rem_pio2f rem_pio2_large; do
  if ! diff -q <(normalise "$CRATE/$f.rs") <(normalise "$CB/$f.rs") >/dev/null; then
    echo "check-libm: $f.rs differs between $CRATE and $CB" >&2
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "check-libm: the wasm's std math is the libm crate's source ($NIGHTLY)"
exit "$bad"
