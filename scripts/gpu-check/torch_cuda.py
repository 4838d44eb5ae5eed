#!/usr/bin/env python3
"""PyTorch on CUDA, the same workloads as `kiln bench` (BENCHMARKS.md W1-W4)
plus the large product of `kiln bench --workloads GEMM4096`, for the real-GPU
check (scripts/gpu-check/run.sh). Strict FP32: TF32 is turned off, so the
matrix products do the arithmetic kiln's wgpu kernels do. One JSON line per
workload on stdout, in kiln bench's format.

Usage: python3 torch_cuda.py [--workloads W1,W2,W3,W4,GEMM4096] [--gemm-size 4096] [--gemm-repeat 4]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn

P = argparse.ArgumentParser()
P.add_argument("--workloads", default="W1,W2,W3,W4,GEMM4096")
P.add_argument("--gemm-size", type=int, default=4096)
P.add_argument("--gemm-repeat", type=int, default=4)
ARGS = P.parse_args()

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
DEV = torch.device("cuda")
SEED = 0


def timed(step, warmup, counted):
    first = None
    for i in range(warmup):
        t = time.perf_counter()
        step()
        if i == 0:
            first = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(counted):
        t = time.perf_counter()
        step()  # every step reads a value back, which synchronises
        times.append((time.perf_counter() - t) * 1e3)
    return times, first


def emit(workload, times, notes):
    print(json.dumps({
        "system": "pytorch", "backend": "cuda", "workload": workload,
        "median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4),
        "max_ms": round(max(times), 4), "threads": torch.get_num_threads(),
        "notes": notes + "; torch=%s %s tf32=off" % (torch.__version__, torch.cuda.get_device_name()),
    }), flush=True)


def train_step(model, x, y):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    lossf = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def w1():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(128, 784, generator=g).to(DEV)
    y = torch.randint(0, 10, (128,), generator=g).to(DEV)
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10)).to(DEV)
    times, first = timed(train_step(model, x, y), 20, 100)
    emit("W1", times, "MLP step, Adam (default foreach), loss.item() each step; first_step_ms=%.1f" % first)


def w2():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(64, 1, 28, 28, generator=g).to(DEV)
    y = torch.randint(0, 10, (64,), generator=g).to(DEV)
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 128), nn.ReLU(),
                          nn.Linear(128, 10)).to(DEV)
    times, first = timed(train_step(model, x, y), 5, 20)
    emit("W2", times, "CNN step, cuDNN, Adam; first_step_ms=%.1f" % first)


def w3():
    x = torch.randn(16, generator=torch.Generator().manual_seed(SEED)).to(DEV).requires_grad_(True)

    def step():
        x.grad = None
        y = x
        for _ in range(1000):
            y = torch.tanh(y * 1.0001 + 0.001)
        loss = y.sum()
        loss.backward()
        return loss.item() + x.grad[0].item()
    times, _ = timed(step, 5, 20)
    emit("W3", times, "1000-op chain fwd+bwd, eager; per-op %.2f us" % (statistics.median(times)))


def w4():
    g = torch.Generator().manual_seed(SEED)
    a = torch.randn(1024, 1024, generator=g).to(DEV)
    b = torch.randn(1024, 1024, generator=g).to(DEV)
    times, _ = timed(lambda: (a @ b).cpu(), 3, 10)
    emit("W4", times, "1024^3, C read back: %.1f GFLOP/s" % (2 * 1024**3 / (statistics.median(times) * 1e-3) / 1e9))


def gemm_large():
    n, r = ARGS.gemm_size, ARGS.gemm_repeat
    g = torch.Generator().manual_seed(SEED)
    a = torch.randn(n, n, generator=g).to(DEV)
    b = torch.randn(n, n, generator=g).to(DEV)

    def step():
        total = (a @ b).sum()
        for _ in range(1, r):
            total = total + (a @ b).sum()
        return total.item()
    times, _ = timed(step, 2, 10)
    flops = 2 * n**3 * r
    emit("GEMM_LARGE", times, "gemm_%dx%dx%d x%d per step, sum read back: %.1f GFLOP/s (best %.1f)" % (
        n, n, n, r, flops / (statistics.median(times) * 1e-3) / 1e9, flops / (min(times) * 1e-3) / 1e9))


WORK = {"W1": w1, "W2": w2, "W3": w3, "W4": w4, "GEMM4096": gemm_large}
for w in ARGS.workloads.split(","):
    WORK[w.strip().upper()]()
