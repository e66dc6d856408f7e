#!/usr/bin/env python3
"""PyTorch's cached greedy decoding at batch 1 on the GPT-2-small shape, for `qkv bench decode`.

Usage: /usr/bin/python3 bench/torch_decode.py [--prompt 16] [--tokens 64] [--reps 3] [--threads N] [--json]

A GPT-2-shaped decoder (12 layers, d_model 768, 12 heads, FFN 3072, vocabulary 50257, learned
positions, pre-norm, tanh-GELU, tied embeddings) with its own key/value cache: each step runs
the new token through the layers, appends its keys and values to per-layer tensors and attends
over them. Random weights, float32, torch.inference_mode. Timed as qkv times itself: (prefill +
tokens steps) - (prefill + 1 step), per token, best of reps.
"""
import argparse
import json
import math
import os
import time

import torch_best  # before torch: OpenBLAS's best kernel for this CPU

OPENBLAS_PICKED, OPENBLAS_SET = torch_best.choose_openblas_kernel()
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, D, H, F_):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, F_)
        self.fc2 = nn.Linear(F_, D)

    def forward(self, x, cache):
        B, T, D = x.shape
        H, Dh = self.H, D // self.H
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, H, Dh).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        s = q @ k.transpose(-1, -2) / math.sqrt(Dh)
        Tk = k.shape[2]
        if T > 1:  # causal within the new tokens, bottom-right aligned
            mask = torch.ones(T, Tk, dtype=torch.bool).tril(diagonal=Tk - T)
            s = s.masked_fill(~mask, float("-inf"))
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.out(o)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x, (k, v)


class GPT(nn.Module):
    def __init__(self, V=50257, D=768, H=12, L=12, F_=3072, max_len=1024):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Embedding(max_len, D)
        self.layers = nn.ModuleList(Layer(D, H, F_) for _ in range(L))
        self.norm = nn.LayerNorm(D)

    def forward(self, ids, pos0, caches):
        T = ids.shape[1]
        x = self.embed(ids) + self.pos(torch.arange(pos0, pos0 + T))
        new = []
        for layer, c in zip(self.layers, caches):
            x, kv = layer(x, c)
            new.append(kv)
        logits = F.linear(self.norm(x[:, -1]), self.embed.weight)  # tied output projection
        return logits, new

    def generate(self, prompt, n):
        caches = [None] * len(self.layers)
        logits, caches = self(prompt, 0, caches)
        pos = prompt.shape[1]
        out = []
        for _ in range(n):
            tok = logits.argmax(-1, keepdim=True)
            out.append(tok)
            if len(out) == n:
                break
            logits, caches = self(tok, pos, caches)
            pos += 1
        return torch.cat(out, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (default: all cores)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="do not flush denormals (to measure what flushing is worth; slower)")
    a = ap.parse_args()
    # Best settings: one thread per core (Debian's torch may start with fewer).
    torch.set_num_threads(a.threads if a.threads > 0 else os.cpu_count())
    # Denormal numbers slow PyTorch's CPU kernels several-fold once they appear (an AVX-512
    # machine ran GPT-2-small training at 52-145 tokens/s without this, a steady 158 with it).
    torch.set_flush_denormal(not a.keep_denormals)
    torch.manual_seed(0)
    m = GPT().eval()
    prompt = torch.randint(0, 50257, (1, a.prompt))
    with torch.inference_mode():
        m.generate(prompt, 4)
        best = float("inf")
        for _ in range(a.reps):
            t0 = time.perf_counter()
            m.generate(prompt, 1)
            t1 = time.perf_counter()
            m.generate(prompt, a.tokens + 1)
            t2 = time.perf_counter()
            best = min(best, ((t2 - t1) - (t1 - t0)) / a.tokens)
    kernel = os.environ.get("OPENBLAS_CORETYPE", OPENBLAS_PICKED)
    r = {"tokens_per_s": 1 / best, "ms_per_token": 1e3 * best, "threads": torch.get_num_threads(),
         "torch": torch.__version__, "openblas": kernel, "flush_denormal": not a.keep_denormals}
    if a.json:
        print(json.dumps(r))
    else:
        print(f"torch {torch.__version__} decode: gpt2-small, batch 1, {torch.get_num_threads()} threads: "
              f"{1e3 * best:.2f} ms/token = {1 / best:.1f} tokens/s (OpenBLAS {kernel}, denormals "
              f"{'kept' if a.keep_denormals else 'flushed'})")


if __name__ == "__main__":
    main()
