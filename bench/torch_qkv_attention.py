#!/usr/bin/python3
"""qkv.torch.attention against PyTorch's math attention, from Python (figures, not a test).

    PYTHONPATH=build/python bench/torch_qkv_attention.py [--T 512,1024,2048,4096,8192] [--heads 8] [--dim 64]
                                                         [--threads 2] [--reps 3]

Causal self-attention, batch 1, float32, on PyTorch tensors with requires_grad. For each T:
the best time of --reps runs of the forward pass and of forward + backward, and the peak memory
above the inputs (the process's peak resident set, each measurement in a process of its own).
PyTorch's math path is what PyTorch 1.13 runs on a CPU (softmax(q k^T / sqrt(d) + mask) v, the
T x T matrix held; torch.set_flush_denormal(True), its threads set to --threads). Then the
binding's overhead per call at T = 16 and 64: a Python loop over qkv.attention on NumPy arrays
against the same calls timed inside C++ (qkv._qkv._time_attention).
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time


def one(impl, T, mode, heads, dim, threads, reps):
    import torch
    torch.set_flush_denormal(True)
    torch.set_num_threads(threads)
    import qkv
    import qkv.torch as qt
    qkv.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, T, dim, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(1, heads, T, dim, generator=g)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1) if impl == "torch" else None

    def run():
        if impl == "torch":
            s = (q @ k.transpose(-1, -2)) / math.sqrt(dim)
            out = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        else:
            out = qt.attention(q, k, v, causal=True)
        if mode == "fwd+bwd":
            out.backward(dout)
        return out

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        with torch.set_grad_enabled(mode == "fwd+bwd"):
            run()
        best = min(best, time.perf_counter() - t0)
        q.grad = k.grad = v.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": best, "peak_mib": (peak - base) / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", default="512,1024,2048,4096,8192")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--one", nargs=3, metavar=("IMPL", "T", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.one[2], a.heads, a.dim, a.threads, a.reps)))
        return
    import qkv
    print("causal self-attention, batch 1, %d heads, head dim %d, float32, %d threads; qkv's kernels: %s" %
          (a.heads, a.dim, a.threads, os.popen("grep -m1 -o -w avx512f /proc/cpuinfo").read().strip() and "avx512"
           or "avx2"))
    print("%6s %9s %14s %14s %8s %16s %16s %8s" % ("T", "pass", "torch ms", "qkv ms", "speed", "torch MiB",
                                                 "qkv MiB", "memory"))
    for T in [int(x) for x in a.T.split(",")]:
        for mode in ("fwd", "fwd+bwd"):
            r = {}
            for impl in ("torch", "qkv"):
                p = subprocess.run([sys.executable, __file__, "--one", impl, str(T), mode, "--heads", str(a.heads),
                                    "--dim", str(a.dim), "--threads", str(a.threads), "--reps", str(a.reps)],
                                   capture_output=True, text=True)
                r[impl] = json.loads(p.stdout) if p.returncode == 0 else None
            t, q = r["torch"], r["qkv"]
            if not t or not q:
                print("%6d %9s failed: %s" % (T, mode, r))
                continue
            print("%6d %9s %14.1f %14.1f %7.1fx %16.0f %16.0f %7.1fx" % (
                T, mode, 1000 * t["seconds"], 1000 * q["seconds"], t["seconds"] / q["seconds"], t["peak_mib"],
                q["peak_mib"], t["peak_mib"] / max(q["peak_mib"], 1)))
    import numpy as np
    qkv.set_num_threads(a.threads)
    print("\nthe binding's overhead per call (NumPy arrays, causal, %d heads, head dim %d):" % (a.heads, a.dim))
    for T in (16, 64):
        q, k, v = (np.random.default_rng(i).standard_normal((1, a.heads, T, a.dim)).astype(np.float32) for i in range(3))
        n = 2000
        cpp = qkv._qkv._time_attention(q, k, v, True, n)
        qkv.attention(q, k, v, causal=True)
        t0 = time.perf_counter()
        for _ in range(n):
            qkv.attention(q, k, v, causal=True)
        py = (time.perf_counter() - t0) / n
        print("  T = %3d: C++ API %.1f us, from Python %.1f us: %.1f us a call" % (T, 1e6 * cpp, 1e6 * py,
                                                                               1e6 * (py - cpp)))


if __name__ == "__main__":
    main()
