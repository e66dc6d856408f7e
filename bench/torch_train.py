#!/usr/bin/env python3
"""PyTorch's training throughput on the shapes of `qkv bench train`, for comparison.

Usage: /usr/bin/python3 bench/torch_train.py --model gpt2-small|transformer-base
           [--batch 4] [--seq 256] [--steps 6] [--warmup 1] [--threads N] [--autocast-bf16] [--json]

The same models as qkv's presets, built from torch.nn (nn.TransformerEncoderLayer /
nn.Transformer), trained with torch.optim.AdamW (fused=False, foreach=True: PyTorch 1.13's
fastest CPU path) and clip_grad_norm_, on random tokens. Reports tokens/s over the timed steps
and the process's peak resident memory (ru_maxrss). Run it in its own process, as qkv's bench.

Give PyTorch its best settings: threads = cores (the default here), denormals flushed, and
OpenBLAS's best kernel for the CPU (torch_best.py: OPENBLAS_CORETYPE, printed below).
"""
import argparse
import ctypes
import json
import math
import os
import resource
import sys
import time

import torch_best  # before torch: OpenBLAS's best kernel for this CPU

OPENBLAS_PICKED, OPENBLAS_SET = torch_best.choose_openblas_kernel()
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F


def blas_corename():
    for lib in ("libopenblas.so.0", "libopenblasp.so.0", "libopenblaso.so.0"):
        try:
            h = ctypes.CDLL(lib, mode=ctypes.RTLD_NOLOAD) if hasattr(ctypes, "RTLD_NOLOAD") else ctypes.CDLL(lib)
            h.openblas_get_corename.restype = ctypes.c_char_p
            return h.openblas_get_corename().decode()
        except OSError:
            continue
    return "unknown"


class GPT(nn.Module):
    def __init__(self, V=50257, D=768, H=12, L=12, F_=3072, max_len=1024):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.pos_embed = nn.Embedding(max_len, D)
        gelu_tanh = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D, H, F_, dropout=0.0, activation=gelu_tanh, batch_first=True, norm_first=True)
            for _ in range(L))
        self.norm = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        T = ids.shape[1]
        x = self.embed(ids) + self.pos_embed(torch.arange(T))
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        return self.lm_head(self.norm(x))


class Base(nn.Module):
    def __init__(self, V=32000, D=512, H=8, L=6, F_=2048):
        super().__init__()
        self.D = D
        self.src_embed = nn.Embedding(V, D)  # as qkv: separate source and target tables,
        self.embed = nn.Embedding(V, D)      # the target one tied to the output projection
        self.transformer = nn.Transformer(D, H, L, L, F_, dropout=0.0, batch_first=True)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.embed.weight

    def pe(self, T):
        pos = torch.arange(T, dtype=torch.float64)[:, None]
        i = torch.arange(0, self.D, 2, dtype=torch.float64)
        ang = pos / torch.pow(10000.0, i / self.D)
        pe = torch.zeros(T, self.D, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(ang)
        pe[:, 1::2] = torch.cos(ang)
        return pe.float()

    def forward(self, src, tgt):
        s = self.src_embed(src) * math.sqrt(self.D) + self.pe(src.shape[1])
        t = self.embed(tgt) * math.sqrt(self.D) + self.pe(tgt.shape[1])
        T = tgt.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        return self.lm_head(self.transformer(s, t, tgt_mask=mask))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2-small", choices=["gpt2-small", "transformer-base"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--autocast-bf16", action="store_true",
                    help="run forward and loss under torch.autocast('cpu', dtype=torch.bfloat16) (PyTorch's bf16 "
                         "mixed precision; float32 master weights and optimiser)")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="do not flush denormals (to measure what flushing is worth; slower)")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    # Denormal numbers slow PyTorch's CPU kernels several-fold once they appear (an AVX-512
    # machine ran GPT-2-small training at 52-145 tokens/s without this, a steady 158 with it).
    torch.set_flush_denormal(not a.keep_denormals)
    torch.manual_seed(1)
    encdec = a.model == "transformer-base"
    model = Base() if encdec else GPT()
    V = 32000 if encdec else 50257
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    params = sum(p.numel() for p in model.parameters())
    times, loss = [], float("nan")
    for s in range(a.warmup + a.steps):
        x = torch.randint(0, V, (a.batch, a.seq))
        y = torch.randint(0, V, (a.batch, a.seq))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast_bf16):
            logits = model(x, torch.randint(0, V, (a.batch, a.seq))) if encdec else model(x)
            l = F.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1))
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = l.item()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
        print(f"step {s + 1}/{a.warmup + a.steps}: {dt:.3f} s", file=sys.stderr)
    per = sum(times) / len(times)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out = {"model": a.model, "parameters": params, "batch": a.batch, "seq": a.seq, "steps": a.steps,
           "threads": torch.get_num_threads(), "s_per_step": per, "best_s_per_step": min(times),
           "tokens_per_s": a.batch * a.seq / per, "peak_rss_mib": peak, "last_loss": loss,
           "precision": "autocast-bf16" if a.autocast_bf16 else "f32",
           "torch": torch.__version__, "blas_core": blas_corename(), "blas_core_before": OPENBLAS_PICKED, "flush_denormal": not a.keep_denormals}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"torch {torch.__version__} bench train: {a.model}, {params} parameters, batch {a.batch} x {a.seq}, "
              f"{out['threads']} threads, OpenBLAS core {out['blas_core']}, {out['precision']}")
        print(f"  step (fwd + bwd + AdamW): mean {per:.3f} s, best {min(times):.3f} s over {a.steps} steps")
        print(f"  throughput: {out['tokens_per_s']:.1f} tokens/s")
        print(f"  peak resident memory (whole process): {peak:.0f} MiB")


if __name__ == "__main__":
    main()
