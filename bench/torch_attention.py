#!/usr/bin/python3
"""PyTorch 1.13's attention on the same shapes as `qkv bench attention`, for BENCHMARKS.md.

Runs with Debian's interpreter (/usr/bin/python3, python3-torch). Torch 1.13 has no public
fused attention on the CPU: this is its math path, matmul + softmax + matmul, float32, with
all cores (torch.set_num_threads), best of --reps. Prints one line per case and the GEMM
ceiling torch reaches on the same machine.
"""
import argparse
import os
import json
import time

import torch_best  # before torch: OpenBLAS's best kernel for this CPU

OPENBLAS_PICKED, OPENBLAS_SET = torch_best.choose_openblas_kernel()
import torch  # noqa: E402


def best_time(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq", default="512,1024,2048,4096")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="do not flush denormals (to measure what flushing is worth; slower)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    # Denormal numbers slow PyTorch's CPU kernels several-fold once they appear (an AVX-512
    # machine ran GPT-2-small training at 52-145 tokens/s without this, a steady 158 with it).
    torch.set_flush_denormal(not a.keep_denormals)
    torch.manual_seed(0)
    n = 2048
    x, y = torch.randn(n, n), torch.randn(n, n)
    gemm = 2 * n**3 / best_time(lambda: torch.mm(x, y), a.reps) / 1e9
    rows = []
    for T in [int(t) for t in a.seq.split(",")]:
        q, k, v = (torch.randn(1, a.heads, T, a.dim) for _ in range(3))
        dout = torch.randn(1, a.heads, T, a.dim)
        for causal in (False, True):
            mask = torch.full((T, T), float("-inf")).triu(1) if causal else None

            def fwd(q=q, k=k, v=v, mask=mask):
                s = (q @ k.transpose(-2, -1)) * (a.dim ** -0.5)
                if mask is not None:
                    s = s + mask
                return torch.softmax(s, dim=-1) @ v

            def fwd_bwd():
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                fwd(qq, kk, vv).backward(dout)

            for name, fn, mult in (("fwd", lambda: fwd(), 1.0), ("fwd+bwd", fwd_bwd, 3.5)):
                with torch.no_grad() if name == "fwd" else torch.enable_grad():
                    t = best_time(fn, a.reps)
                flops = 4.0 * T * T * a.dim * a.heads * (0.5 if causal else 1.0) * mult
                rows.append({"impl": "torch-math", "pass": name, "T": T, "causal": causal, "seconds": t,
                             "gflops": flops / t / 1e9})
    kernel = os.environ.get("OPENBLAS_CORETYPE", OPENBLAS_PICKED)
    if a.json:
        print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "gemm_gflops": gemm,
                          "openblas": kernel, "flush_denormal": not a.keep_denormals, "results": rows}, indent=2))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, OpenBLAS {kernel}, denormals "
          f"{'kept' if a.keep_denormals else 'flushed'}, torch.mm {n}x{n}x{n} = {gemm:.1f} GFLOP/s")
    print(f"{'impl':10} {'pass':8} {'T':>6} {'causal':7} {'time (s)':>10} {'GFLOP/s':>9} {'%mm':>6}")
    for r in rows:
        print(f"{r['impl']:10} {r['pass']:8} {r['T']:6d} {'yes' if r['causal'] else 'no':7} {r['seconds']:10.4f} "
              f"{r['gflops']:9.1f} {100 * r['gflops'] / gemm:5.1f}%")


if __name__ == "__main__":
    main()
