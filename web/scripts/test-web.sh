#!/usr/bin/env bash
# kiln-web's tests: builds the npm package (cargo + wasm-bindgen, release
# profile `wasm-release`), then runs the browser tests (headless Debian Chromium via
# playwright-core), the Node tests, the tarball install test and the
# browser/native parity test with node's test runner.
# Installs what it needs first, skipping whatever is present:
#   Debian chromium + chromium-driver, the wasm32 target, wasm-bindgen-cli
#   (the exact version of the wasm-bindgen crate), the pinned nightly
#   toolchain with rust-src (for the wasm's std), npm packages.
set -euo pipefail
cd "$(dirname "$0")/.."
WASM_BINDGEN_VERSION=0.2.130   # must equal the `wasm-bindgen = "=…"` pin in web/Cargo.toml

if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$WASM_BINDGEN_VERSION" ]; then
  cargo install wasm-bindgen-cli --version "=$WASM_BINDGEN_VERSION"
fi
# The wasm is built with a pinned nightly and its rust-src (std rebuilt with
# panic=immediate-abort, scripts/build.mjs); the rest of kiln uses stable.
NIGHTLY=$(sed -n "s/^const NIGHTLY = '\(.*\)';.*/\1/p" scripts/build.mjs)
if ! rustup run "$NIGHTLY" rustc --version >/dev/null 2>&1 \
   || ! rustup component list --installed --toolchain "$NIGHTLY" 2>/dev/null | grep -q '^rust-src'; then
  rustup toolchain install "$NIGHTLY" --profile minimal --component rust-src
fi
if [ ! -d node_modules/playwright-core ] || [ ! -d node_modules/binaryen ] || [ ! -d node_modules/terser ]; then
  npm ci --no-audit --no-fund
fi

# The native half of the parity test compiles while build.mjs runs: its
# wasm-opt passes use one core for about two minutes.
cargo build --quiet --release -p kiln-web --example parity &
parity_build=$!
node scripts/build.mjs --pack
wait "$parity_build"
# Portable numerics: the wasm's std math must be the libm crate's source.
./scripts/check-libm.sh
mkdir -p test-output
cargo run --quiet --release -p kiln-web --example parity > test-output/parity-native.json
export KILN_PARITY_JSON="$PWD/test-output/parity-native.json"
node --test --test-concurrency=1 tests/*.test.mjs
echo "kiln-web: browser, Node, package and parity tests passed; package size $(cat pkg/sizes.json)"
