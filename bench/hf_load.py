#!/usr/bin/python3
"""Loading a Hugging Face folder: peak resident memory and time (figures, not a test).

    /usr/bin/python3 bench/hf_load.py --qkv build/qkv [--work DIR] [--repeat 3]

Writes a GPT-2-small-shaped folder (vocab 50257, 768 wide, 12 layers, 1024 positions: 124.4 M
parameters) with random weights, once as F32 and once as BF16, and runs
`qkv forward --model DIR --input <one token>` on each: the load, then a forward pass over one
token, whose activations are a few hundred KiB. For each it prints the peak resident set
(wait4's ru_maxrss, from a small wrapper process) against the float32 weight bytes, with and
without the process's own baseline (the same command on a 2-layer, 8-wide GPT-2 folder: the
binary, its libraries, thread stacks), and the wall time (best of --repeat runs; the folder was
just written, so it is in the page cache: a cold disk adds its read time).
"""
import argparse
import gc
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch


def write_safetensors(path, tensors, dtype):
    header, at = {}, 0
    for name, t in tensors.items():
        n = t.numel() * (4 if dtype == "F32" else 2)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [at, at + n]}
        at += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in tensors.values():
            if dtype == "F32":
                f.write(t.numpy().tobytes())
            else:
                f.write(t.bfloat16().view(torch.int16).numpy().tobytes())


def gpt2_folder(d, V, D, L, P, dtype):
    os.makedirs(d, exist_ok=True)
    cfg = {"model_type": "gpt2", "vocab_size": V, "n_embd": D, "n_head": max(1, D // 64), "n_layer": L,
           "n_positions": P, "bos_token_id": V - 1, "eos_token_id": V - 1}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.02
    W = {"wte.weight": r(V, D), "wpe.weight": r(P, D)}
    for i in range(L):
        h = "h.%d." % i
        W.update({h + "ln_1.weight": torch.ones(D), h + "ln_1.bias": torch.zeros(D),
                  h + "attn.c_attn.weight": r(D, 3 * D), h + "attn.c_attn.bias": torch.zeros(3 * D),
                  h + "attn.c_proj.weight": r(D, D), h + "attn.c_proj.bias": torch.zeros(D),
                  h + "ln_2.weight": torch.ones(D), h + "ln_2.bias": torch.zeros(D),
                  h + "mlp.c_fc.weight": r(D, 4 * D), h + "mlp.c_fc.bias": torch.zeros(4 * D),
                  h + "mlp.c_proj.weight": r(4 * D, D), h + "mlp.c_proj.bias": torch.zeros(D)})
    W["ln_f.weight"], W["ln_f.bias"] = torch.ones(D), torch.zeros(D)
    write_safetensors(os.path.join(d, "model.safetensors"), W, dtype)
    return sum(t.numel() for t in W.values())


# Measured from a small wrapper process, not from this one: a child's ru_maxrss counts the pages
# it shares with its parent between fork and exec, and this process holds torch and the weights.
WRAPPER = r"""
import os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = p.stderr.read().decode()
_, status, usage = os.wait4(p.pid, 0)
print(usage.ru_maxrss * 1024, time.perf_counter() - t0, status)
sys.stderr.write(err)
"""


def run(qkv, folder, ids):
    out = subprocess.run([sys.executable, "-c", WRAPPER, qkv, "--threads", "2", "forward", "--model", folder,
                          "--input", ids], capture_output=True, text=True)
    rss, wall, status = out.stdout.split()
    if int(status) != 0:
        sys.exit("qkv failed on %s: %s" % (folder, out.stderr))
    return int(rss), float(wall)  # ru_maxrss is in KiB on Linux


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--work")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="hf_load.")
    ids = os.path.join(work, "one.npy")
    np.save(ids, np.array([[7]], dtype=np.int64))
    tiny = os.path.join(work, "tiny")
    gpt2_folder(tiny, 50257, 8, 2, 16, "F32")
    base = min(run(a.qkv, tiny, ids)[0] for _ in range(a.repeat))
    print("baseline (a 2-layer, 8-wide GPT-2 with the same vocabulary): peak RSS %.1f MiB" % (base / 2**20))
    for dtype in ("F32", "BF16"):
        folder = os.path.join(work, dtype)
        n = gpt2_folder(folder, 50257, 768, 12, 1024, dtype)
        gc.collect()
        file_bytes = os.path.getsize(os.path.join(folder, "model.safetensors"))
        weights = 4 * n
        runs = [run(a.qkv, folder, ids) for _ in range(a.repeat)]
        rss = min(r[0] for r in runs)
        wall = min(r[1] for r in runs)
        print("GPT-2 small, %s file (%.1f MiB): %.1f M parameters = %.1f MiB as float32; peak RSS %.1f MiB = %.3fx "
              "the weights (%.3fx over the baseline); load + one-token forward %.2f s (best of %d)" %
              (dtype, file_bytes / 2**20, n / 1e6, weights / 2**20, rss / 2**20, rss / weights,
               (rss - base) / weights, wall, a.repeat))
        shutil.rmtree(folder)
    if not a.work:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
