#!/usr/bin/env bash
# Runs the counting allocator of `kiln bench` (native/src/bench/host_heap.rs,
# the one `unsafe impl` of the kiln crate) under Miri, installed as the
# global allocator of a throw-away crate that includes the file by path: the
# kiln crate itself cannot build under Miri (wgpu, plotters, FFI), but this
# module needs nothing but std. Needs the nightly toolchain with the miri
# component (`rustup component add miri --toolchain nightly`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "miri-host-heap"
version = "0.0.0"
edition = "2021"
publish = false
[workspace]
TOML
cat > "$dir/src/lib.rs" <<RS
#[path = "$root/native/src/bench/host_heap.rs"]
pub mod host_heap;

// Every allocation of the test binary (the harness's threads, Vec growth,
// Box, String) goes through the counting allocator.
#[global_allocator]
static ALLOCATOR: host_heap::CountingAllocator = host_heap::CountingAllocator;

#[cfg(test)]
mod as_global_allocator {
    #[test]
    fn collections_through_the_counting_allocator() {
        let before = crate::host_heap::counts().expect("installed");
        let mut v: Vec<u64> = Vec::new();
        for i in 0..1000 {
            v.push(i);
        }
        let s: String = v.iter().map(|n| n.to_string()).collect();
        let b = Box::new([7u8; 4096]);
        v.shrink_to_fit();
        assert_eq!(v.iter().sum::<u64>(), 499_500);
        assert_eq!(b.iter().map(|&x| x as usize).sum::<usize>(), 7 * 4096);
        assert!(s.len() > 1000);
        let after = crate::host_heap::counts().unwrap();
        assert!(after.0 > before.0 && after.1 >= before.1 + 4096, "{before:?} -> {after:?}");
    }
}
RS
cd "$dir"
cargo +nightly miri test "$@"
