#!/usr/bin/env bash
# The real-GPU check (issue 10): kiln's wgpu backend on the machine's Vulkan
# driver, W1-W4, the W1/W2 GEMM shapes and a 4096³ product, interleaved with
# PyTorch on CUDA (strict FP32) running the same workloads, then kiln's wgpu
# test binaries. Meant for a machine with a GPU and no toolchain: it runs
# binaries built elsewhere.
#
#   BIN=dir-with-kiln-and-test-binaries OUT=results-dir scripts/gpu-check/run.sh
#
# $BIN holds `kiln`, optionally `matmul_kernels` (kiln-wgsl's example) and
# tests/<name> test binaries (built with `cargo test --release --no-run`). Results: $OUT/kiln-*.jsonl,
# $OUT/torch-*.jsonl, $OUT/tests.log, $OUT/gpu.txt.
set -uo pipefail
BIN=${BIN:?BIN: folder with the kiln binary}
OUT=${OUT:?OUT: results folder}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"

{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv 2>&1
  uptime
} | tee "$OUT/gpu.txt"

round() {
  local r=$1
  echo "== round $r: kiln (wgpu, Vulkan)"
  KILN_MATMUL_TUNE_LOG=1 timeout 240 "$BIN/kiln" bench --device vulkan --workloads W1,W2,W3,W4,GEMM4096 2>&1 \
    | tee "$OUT/kiln-$r.jsonl"
  echo "== round $r: PyTorch CUDA"
  timeout 120 python3 "$HERE/torch_cuda.py" 2>&1 | tee "$OUT/torch-$r.jsonl"
}
round 1
echo "== kiln GEMM shapes of W1/W2"
timeout 120 "$BIN/kiln" bench --device vulkan --workloads GEMM 2>&1 | tee "$OUT/kiln-gemm-shapes.jsonl"
round 2
echo "== optimizer updates one kernel per tensor (KILN_GROUPED_UPDATE=0) against grouped (=1)"
for g in 0 1 0 1; do
  KILN_GROUPED_UPDATE=$g timeout 120 "$BIN/kiln" bench --device vulkan --workloads W1,W2 2>&1 \
    | sed "s/^/grouped=$g /" | tee -a "$OUT/kiln-grouped-update.jsonl"
done
if [ -x "$BIN/matmul_kernels" ]; then
  echo "== each wgpu matmul kernel, forced (GFLOP/s, C read back)"
  timeout 120 "$BIN/matmul_kernels" 4096 4096 4096 1024 1024 1024 128 784 512 2>&1 | tee "$OUT/matmul-kernels.txt"
fi
echo "== where a W1 and a W2 step's time goes (KILN_WGPU_PROFILE=1, each dispatch waited for)" | tee -a "$OUT/matmul-kernels.txt"
KILN_WGPU_PROFILE=1 timeout 120 "$BIN/kiln" bench --device vulkan --workloads W1,W2 2>&1 | tail -60 | tee -a "$OUT/matmul-kernels.txt"

echo "== wgpu test binaries" | tee "$OUT/tests.log"
for t in "$BIN"/tests/*; do
  [ -x "$t" ] || continue
  echo "-- $(basename "$t")" | tee -a "$OUT/tests.log"
  CI=1 timeout 150 "$t" --test-threads=4 2>&1 | tail -25 | tee -a "$OUT/tests.log"
done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv 2>&1 | tee -a "$OUT/gpu.txt"
