#!/usr/bin/python3
"""K-quant GGUF files in qkv: what converting Q4_K, Q5_K and Q6_K to Q8_0 costs in perplexity.

    /usr/bin/python3 bench/kquant_perplexity.py --qkv build/qkv --model DIR [--data TEXT] [--work DIR]

DIR is a trained Llama-shaped qkv language model whose matrices' rows are whole super-blocks of
256 (d_model and d_ff multiples of 256; the real checkpoints in ../shared/realmodel are 64 wide,
too narrow for K-quants). The script exports it as a float32 GGUF file (`qkv export --format gguf`),
rewrites its matrices as K-quant super-blocks in the mixes below (tests/gguf_test.py's
`pack_kquant`, a plain rounding quantiser written from the layout), and scores each file with
`qkv forward --target` on the model's held-out test lines (or --data), tokenized by the model's
own tokenizer (`qkv tokenize`) and cut into windows of 128 next-token predictions:

  - the float32 file;
  - each K-quant file as qkv runs it (K-quant matrices converted to Q8_0 at load);
  - a float32 file holding exactly the values the K-quant blocks hold (what a K-quant product
    computes with, before its own activation rounding).

The second against the third is the conversion's cost; the third against the first is the
K-quants' own rounding (with this quantiser; llama.cpp's search rounds somewhat closer). Then
greedy continuations: 64 tokens from the start of each of 16 test windows, with each type and
file, against float32's: the tokens equal position by position, and the mean length of the
common prefix.
Figures, not a test: tests/gguf_test.py checks the conversion bit for bit.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import gguf_test as g  # noqa: E402

# name -> {tensor role: type}; roles not named stay as exported (float32)
MIXES = {
    # llama.cpp's Q4_K_M keeps attn_v and ffn_down at Q6_K in some layers and the output at Q6_K;
    # here every layer's attn_v and ffn_down are Q6_K (a little more precise than Q4_K_M)
    "Q4_K_M-like": {"attn_q": g.Q4_K, "attn_k": g.Q4_K, "attn_v": g.Q6_K, "attn_output": g.Q4_K,
                    "ffn_gate": g.Q4_K, "ffn_up": g.Q4_K, "ffn_down": g.Q6_K, "token_embd": g.Q4_K,
                    "output": g.Q6_K},
    "Q5_K_M-like": {"attn_q": g.Q5_K, "attn_k": g.Q5_K, "attn_v": g.Q6_K, "attn_output": g.Q5_K,
                    "ffn_gate": g.Q5_K, "ffn_up": g.Q5_K, "ffn_down": g.Q6_K, "token_embd": g.Q5_K,
                    "output": g.Q6_K},
    "all Q4_K": {r: g.Q4_K for r in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                                     "token_embd", "output")},
    "all Q6_K": {r: g.Q6_K for r in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                                     "token_embd", "output")},
}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("FAIL %s\n%s" % (" ".join(cmd), p.stderr[-2000:]))
    return p.stdout + p.stderr


def windows(qkv, model, data, work, T=128, most=1000):
    """The text's token ids as (inputs, targets) .npy files: windows of T + 1 tokens."""
    out = run([qkv, "tokenize", "--model", model, "--ids", "--special", "--text", open(data, encoding="utf-8").read()])
    ids = [int(x) for x in out.split()]
    rows = [ids[i:i + T + 1] for i in range(0, len(ids) - T - 1, T)][:most]
    arr = np.array(rows, dtype=np.int64)
    inp, tgt = os.path.join(work, "in.npy"), os.path.join(work, "tgt.npy")
    np.save(inp, arr[:, :-1])
    np.save(tgt, arr[:, 1:])
    return inp, tgt, arr.shape


def perplexity(qkv, model, ids, dtype=None):
    out = run([qkv, "--threads", "2", "forward", "--model", model, "--input", ids[0], "--target", ids[1]] +
              (["--dtype", dtype] if dtype else []))
    m = re.search(r"loss ([0-9.]+)", out)
    if not m:
        raise SystemExit("no loss in qkv forward's output:\n" + out)
    return float(np.exp(float(m.group(1))))


def greedy(qkv, model, starts, out, dtype=None):
    run([qkv, "--threads", "2", "forward", "--model", model, "--input", starts, "--generate", "64", "--generated", out] +
        (["--dtype", dtype] if dtype else []))
    return np.load(out)


def agreement(a, b):
    """(fraction of positions with the same token, mean common-prefix length) of two (rows, n) arrays."""
    same = a == b
    prefix = [int(np.argmin(r)) if not r.all() else len(r) for r in same]
    return float(same.mean()), float(np.mean(prefix))


def role(name):
    # blk.N.attn_q.weight -> attn_q; token_embd.weight -> token_embd
    parts = name.split(".")
    return parts[2] if parts[0] == "blk" else parts[0]


def rewrite(kv, tensors, mix, path_kq, path_exact):
    """The K-quant file and the float32 file of the values its blocks hold."""
    kq, exact = [], []
    for name, (ne, typ, data) in tensors.items():
        t = mix.get(role(name)) if len(ne) == 2 and ne[0] % 256 == 0 else None
        if t is None or typ != g.F32:
            kq.append((name, ne, typ, data))
            exact.append((name, ne, typ, data))
            continue
        w = np.frombuffer(data, dtype=np.float32).reshape(ne[1], ne[0])
        raw, values = g.pack_kquant(t, w)
        kq.append((name, ne, t, raw))
        exact.append((name, ne, g.F32, np.ascontiguousarray(values, dtype=np.float32).tobytes()))
    items = [(k, kind, v) + ((elem,) if elem is not None else ()) for k, (kind, v, elem) in kv.items()]
    g.write(path_kq, g.gguf(items, kq))
    g.write(path_exact, g.gguf(items, exact))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--model", required=True, help="a trained Llama-shaped qkv language model directory")
    ap.add_argument("--data", help="text to score (default: the model directory's test split)")
    ap.add_argument("--work")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="kquant_perplexity.")
    os.makedirs(work, exist_ok=True)
    data = a.data or os.path.join(a.model, "test.txt")
    f32 = os.path.join(work, "f32.gguf")
    run([a.qkv, "export", "--model", a.model, "--format", "gguf", "--out", f32])
    kv, tensors = g.read_gguf(f32, kinds=True)
    ids = windows(a.qkv, a.model, data, work)
    base_dir = perplexity(a.qkv, a.model, ids)
    base = perplexity(a.qkv, f32, ids)
    print("model %s, scored on %s: %d windows of %d tokens" % (a.model, data, ids[2][0], ids[2][1] - 1))
    print("%-14s %12s %10s" % ("file", "perplexity", "vs f32"))
    print("%-14s %12.4f %10s   (the qkv directory itself: %.4f)" % ("f32", base, "", base_dir))
    for dtype in ("bf16", "int8", "q4"):
        p = perplexity(a.qkv, f32, ids, dtype)
        print("%-14s %12.4f %+9.3f%%   (qkv --dtype %s on the float32 file)" % (dtype, p, 100 * (p / base - 1), dtype))
    kq_files = {}
    for name, mix in MIXES.items():
        tag = name.replace(" ", "_")
        kq, exact = os.path.join(work, tag + ".gguf"), os.path.join(work, tag + "-exact.gguf")
        rewrite(kv, tensors, mix, kq, exact)
        kq_files[name] = kq
        p_kq = perplexity(a.qkv, kq, ids)
        p_ex = perplexity(a.qkv, exact, ids)
        print("%-14s %12.4f %+9.3f%%   its exact values in float32: %.4f (%+.3f%% of f32); the conversion to Q8_0: "
              "%+.3f%%" % (name, p_kq, 100 * (p_kq / base - 1), p_ex, 100 * (p_ex / base - 1), 100 * (p_kq / p_ex - 1)))

    # greedy continuations from the first 8 tokens of 16 test windows
    starts = os.path.join(work, "starts.npy")
    np.save(starts, np.load(ids[0])[:16, :8])
    ref = greedy(a.qkv, f32, starts, os.path.join(work, "gen-f32.npy"))
    print("greedy continuations, 16 prompts of 8 tokens, 64 tokens each, against float32's:")
    print("%-14s %16s %22s" % ("file", "same tokens", "mean common prefix"))
    runs = [(d, f32, d) for d in ("bf16", "f16", "int8", "q4")] + [(n, f, None) for n, f in kq_files.items()]
    for name, model, dtype in runs:
        got = greedy(a.qkv, model, starts, os.path.join(work, "gen.npy"), dtype)
        same, prefix = agreement(got, ref)
        print("%-14s %15.1f%% %16.1f of 64" % (name, 100 * same, prefix))


if __name__ == "__main__":
    main()
