#!/usr/bin/env bash
# Each wgpu matmul kernel forced (KILN_MATMUL_KERNEL) on the 4096³ product
# of `kiln bench --workloads GEMM4096`, then the same with every dispatch
# waited for and timed (KILN_WGPU_PROFILE=1), which splits a step into the
# product's kernels, the K-chunk combination and the sum; then W1, W2, W4
# with the tuner's own picks (KILN_MATMUL_TUNE_LOG=1). For a machine with a
# GPU, as run.sh:
#
#   BIN=dir-with-kiln OUT=results-dir scripts/gpu-check/kernels.sh
set -uo pipefail
BIN=${BIN:?BIN: folder with the kiln binary}
OUT=${OUT:?OUT: results folder}
mkdir -p "$OUT"
for k in tile128 tile64 vec4 staged; do
  echo "== $k"
  KILN_MATMUL_KERNEL=$k timeout 60 "$BIN/kiln" bench --device vulkan --workloads GEMM4096,W4 2>&1
done | tee "$OUT/forced.jsonl"
for k in tile128 staged; do
  echo "== $k, profiled"
  KILN_WGPU_PROFILE=1 KILN_MATMUL_KERNEL=$k timeout 60 "$BIN/kiln" bench --device vulkan --workloads GEMM4096 2>&1 | tail -25
done | tee "$OUT/profile.txt"
echo "== the tuner's picks"
KILN_MATMUL_TUNE_LOG=1 timeout 120 "$BIN/kiln" bench --device vulkan --workloads W1,W2,W4,GEMM4096 2>&1 | tee "$OUT/tuned.jsonl"
