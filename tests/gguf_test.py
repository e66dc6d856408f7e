#!/usr/bin/python3
"""GGUF files (llama.cpp's format), written here from the published specification, read by qkv.

    /usr/bin/python3 tests/gguf_test.py --qkv build/qkv [--realmodel ../shared/realmodel] [--work DIR]

A writer of GGUF version 3 (header, typed metadata, tensor infos, aligned data) and of each block
type's packing, in NumPy, from the format's description: F32, F16, BF16, Q8_0 and Q4_0 (GGUF's
quantisers), and Q4_K, Q5_K and Q6_K (random super-blocks, dequantised here by the layout's rules).
The Llama weights are written as llama.cpp's converter leaves them: Q and K rows in the
interleaved-pair order of its RoPE, which qkv must put back. Checks:
  - each type's file gives logits bitwise equal to a Hugging Face folder holding the same weights
    (float32 for F32; loaded with --dtype f16 / bf16 / int8 / q4 where the file holds those
    packings: qkv's own packing of the same values is byte for byte the file's); K-quant files
    equal the folder of the NumPy-dequantised weights loaded with --dtype int8 (qkv converts
    K-quants to Q8_0);
  - the SentencePiece tokenizer from tokenizer.ggml.* encodes as a reference BPE-by-score
    encoder, with <s> first as tokenizer.ggml.add_bos_token asks; generate runs on the file;
    byte-level BPE ("gpt2") tokenizers with the gpt2, smollm, llama-bpe and qwen2 pre-tokenizers encode as
    the tokenizer.json Hugging Face has for such a model (written here from its format);
  - qkv quantize writes a directory from the file that gives the same logits, and qkv export
    --format gguf writes that directory back as GGUF with every tensor's bytes and the metadata of
    the original file; a float32 Llama folder exports as F32 with the same logits; a GPT-2-shaped
    model is refused;
  - hostile files (bad magic, version 1, big-endian, counts near 2^64, strings past the end,
    unknown value types, nested arrays, duplicate keys and tensors, 0 or 5 dimensions, rows that
    are not whole blocks, unread types, unaligned or overlapping or truncated data, a bad
    alignment, missing tensors, unsupported architectures and RoPE scaling) each give one clear
    error and exit 2, never a crash;
  - with --realmodel: stories260K as a Q8_0 GGUF file with its tok512 tokenizer equals its
    Hugging Face folder under --dtype int8, and the tokenizer equals llama2.c's encoder.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import realmodel_quant as rq  # noqa: E402  (llama2.c reading, HF folders, the reference encoder)

F32, F16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 8, 12, 13, 14, 30
U8, I8, U16, I16, U32, I32, KF32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)

failed = 0


def ok(cond, what):
    global failed
    print("%s %s" % ("PASS" if cond else "FAIL", what))
    failed += not cond


# ---- the format ---------------------------------------------------------------------------

def gstr(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", KF32: "<f", BOOL: "<B", U64: "<Q",
          I64: "<q", F64: "<d"}


def gvalue(kind, v, elem=None):
    if kind == STRING:
        return gstr(v)
    if kind == ARRAY:
        out = struct.pack("<IQ", elem, len(v))
        return out + b"".join(gvalue(elem, x) for x in v)
    return struct.pack(SCALAR[kind], v)


def gguf(kv, tensors, alignment=32, version=3):
    """kv: [(key, kind, value[, elem])]; tensors: [(name, ne, type, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for item in kv:
        key, kind, value = item[:3]
        out += gstr(key) + struct.pack("<I", kind) + gvalue(kind, value, item[3] if len(item) > 3 else None)
    offset, blobs = 0, []
    for name, ne, typ, data in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", typ, offset)
        blobs.append(data)
        offset += (len(data) + alignment - 1) // alignment * alignment
    out += b"\0" * ((alignment - len(out) % alignment) % alignment)
    for b in blobs:
        out += b + b"\0" * ((alignment - len(b) % alignment) % alignment)
    return out


# ---- block packings ---------------------------------------------------------------------------

def f16_bits(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def bf16_bits(w):
    b = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7fff + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def pack_q8_0(w):
    """GGUF's Q8_0: per 32, d = max|x| / 127 (stored as float16), q = round(x / d) half away from zero."""
    x = w.reshape(-1, 32).astype(np.float32)
    d = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    v = (x * inv).astype(np.float64)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    blocks = np.zeros((len(x), 34), dtype=np.uint8)
    blocks[:, 0:2] = f16_bits(d).reshape(-1, 1).view(np.uint8).reshape(-1, 2)
    blocks[:, 2:] = q.view(np.uint8)
    return blocks.tobytes()


def pack_q4_0(w):
    """GGUF's Q4_0: m the element of largest magnitude, d = m / -8, q = min(15, trunc(x / d + 8.5)),
    element j in the low nibble of byte j, element j + 16 in its high nibble."""
    x = w.reshape(-1, 32).astype(np.float32)
    m = x[np.arange(len(x)), np.argmax(np.abs(x), axis=1)][:, None]
    d = (m / np.float32(-8)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(15, np.trunc(x * inv + np.float32(8.5))).astype(np.uint8)
    blocks = np.zeros((len(x), 18), dtype=np.uint8)
    blocks[:, 0:2] = f16_bits(d).reshape(-1, 1).view(np.uint8).reshape(-1, 2)
    blocks[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return blocks.tobytes()


def scale_min_k4(j, s):
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


KQ_SIZE = {Q4_K: 144, Q5_K: 176, Q6_K: 210}


def kquant_values(typ, raw):
    """The float32 weights that super-blocks of `typ` hold (uint8 array (nb, size)), by the layout's
    rules (float32 arithmetic in the order the rules state): (nb, 256)."""
    nb = len(raw)
    out = np.zeros((nb, 256), dtype=np.float32)
    for b in range(nb):
        blk = raw[b]
        if typ in (Q4_K, Q5_K):
            D, M = np.float32(blk[0:2].view(np.float16)[0]), np.float32(blk[2:4].view(np.float16)[0])
            sc = blk[4:16]
            qh = blk[16:48] if typ == Q5_K else None
            qs = blk[48:176] if typ == Q5_K else blk[16:144]
            y = []
            for s in range(4):
                q = qs[32 * s:32 * s + 32].astype(np.int32)
                for half in range(2):
                    scv, mv = scale_min_k4(2 * s + half, sc)
                    v = (q & 0xF) if half == 0 else (q >> 4)
                    if typ == Q5_K:
                        v = v + np.where(qh.astype(np.int32) & (1 << (2 * s + half)), 16, 0)
                    y.append((D * np.float32(scv)) * v.astype(np.float32) - M * np.float32(mv))
            out[b] = np.concatenate(y)
        else:
            D = np.float32(blk[208:210].view(np.float16)[0])
            ql, qh, sc = blk[0:128].astype(np.int32), blk[128:192].astype(np.int32), blk[192:208].view(np.int8)
            y = np.zeros(256, dtype=np.float32)
            for n in range(2):
                L, H, S = ql[64 * n:64 * n + 64], qh[32 * n:32 * n + 32], sc[8 * n:8 * n + 8].astype(np.float32)
                for l in range(32):
                    i = l // 16
                    q1 = ((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32
                    q2 = ((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32
                    q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
                    q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
                    base = 128 * n
                    y[base + l] = D * S[i] * np.float32(q1)
                    y[base + l + 32] = D * S[i + 2] * np.float32(q2)
                    y[base + l + 64] = D * S[i + 4] * np.float32(q3)
                    y[base + l + 96] = D * S[i + 6] * np.float32(q4)
            out[b] = y
    return out


def random_kquant(rng, typ, rows, cols):
    """Random super-blocks of `typ` with small finite scales, and their weights dequantised by the
    layout's rules."""
    nb = rows * cols // 256
    raw = rng.integers(0, 256, size=(nb, KQ_SIZE[typ]), dtype=np.uint8)
    d = rng.uniform(0.0005, 0.003, size=nb).astype(np.float16)
    dmin = rng.uniform(0.0, 0.002, size=nb).astype(np.float16)
    if typ in (Q4_K, Q5_K):
        raw[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
        raw[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    else:
        raw[:, 208:210] = d.view(np.uint8).reshape(-1, 2)
    return raw.tobytes(), kquant_values(typ, raw).reshape(rows, cols)


def pack_kquant(typ, w):
    """float32 weights (rows, cols; cols a multiple of 256) as super-blocks of `typ`, written from the
    layout alone with a plain rounding quantiser (llama.cpp searches for better scales, so its files
    round somewhat more closely; the layout and its reading are the same). Q4_K / Q5_K: per 32 the
    range [min(0, lo), hi] in 15 / 31 steps, the steps and minima as 6-bit multiples of the
    super-block's float16 d and dmin; Q6_K: per 16 a signed step max|x| / 32 as an int8 multiple of
    d, q in [-32, 31]. Returns (bytes, the values the blocks hold)."""
    x = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, 256)
    nb = len(x)
    raw = np.zeros((nb, KQ_SIZE[typ]), dtype=np.uint8)
    if typ in (Q4_K, Q5_K):
        nmax = 15 if typ == Q4_K else 31
        sub = x.reshape(nb, 8, 32)
        lo = np.minimum(sub.min(axis=2), 0)
        step = (sub.max(axis=2) - lo) / nmax  # (nb, 8)
        mn = -lo
        d = (step.max(axis=1) / 63).astype(np.float16)
        dmin = (mn.max(axis=1) / 63).astype(np.float16)
        D, M = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
        sc = np.clip(np.rint(np.where(D > 0, step / np.where(D > 0, D, 1), 0)), 0, 63).astype(np.int32)
        m = np.clip(np.rint(np.where(M > 0, mn / np.where(M > 0, M, 1), 0)), 0, 63).astype(np.int32)
        d1, m1 = (D * sc.astype(np.float32))[:, :, None], (M * m.astype(np.float32))[:, :, None]
        q = np.clip(np.rint(np.where(d1 > 0, (sub + m1) / np.where(d1 > 0, d1, 1), 0)), 0, nmax).astype(np.int32)
        raw[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
        raw[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
        s12 = np.zeros((nb, 12), dtype=np.int32)
        for j in range(4):  # the inverse of scale_min_k4
            s12[:, j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
            s12[:, j + 4] = m[:, j] | ((m[:, j + 4] >> 4) << 6)
            s12[:, j + 8] = (sc[:, j + 4] & 0xF) | ((m[:, j + 4] & 0xF) << 4)
        raw[:, 4:16] = s12
        qs = np.zeros((nb, 128), dtype=np.int32)
        qh = np.zeros((nb, 32), dtype=np.int32)
        for s in range(4):
            lo4, hi4 = q[:, 2 * s], q[:, 2 * s + 1]
            qs[:, 32 * s:32 * s + 32] = (lo4 & 0xF) | ((hi4 & 0xF) << 4)
            qh |= ((lo4 >> 4) & 1) << (2 * s) | ((hi4 >> 4) & 1) << (2 * s + 1)
        if typ == Q5_K:
            raw[:, 16:48] = qh
            raw[:, 48:176] = qs
        else:
            raw[:, 16:144] = qs
    elif typ == Q6_K:
        sub = x.reshape(nb, 16, 16)
        at = np.abs(sub).argmax(axis=2)
        big = np.take_along_axis(sub, at[:, :, None], axis=2)[:, :, 0]
        step = big / -32  # the largest magnitude lands on -32 (q in [-32, 31])
        d = (np.abs(step).max(axis=1) / 127).astype(np.float16)
        D = d.astype(np.float32)[:, None]
        sc = np.clip(np.rint(np.where(D > 0, step / np.where(D > 0, D, 1), 0)), -128, 127).astype(np.int32)
        d1 = (D * sc.astype(np.float32))[:, :, None]
        q = np.clip(np.rint(np.where(d1 != 0, sub / np.where(d1 != 0, d1, 1), 0)), -32, 31).astype(np.int32) + 32
        q = q.reshape(nb, 256)
        ql = np.zeros((nb, 128), dtype=np.int32)
        qh = np.zeros((nb, 64), dtype=np.int32)
        for n in range(2):
            q1, q2, q3, q4 = (q[:, 128 * n + 32 * k:128 * n + 32 * k + 32] for k in range(4))
            ql[:, 64 * n:64 * n + 32] = (q1 & 0xF) | ((q3 & 0xF) << 4)
            ql[:, 64 * n + 32:64 * n + 64] = (q2 & 0xF) | ((q4 & 0xF) << 4)
            qh[:, 32 * n:32 * n + 32] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
        raw[:, 0:128] = ql
        raw[:, 128:192] = qh
        raw[:, 192:208] = sc.astype(np.int8).view(np.uint8)
        raw[:, 208:210] = d.view(np.uint8).reshape(-1, 2)
    else:
        raise ValueError(typ)
    return raw.tobytes(), kquant_values(typ, raw).reshape(w.shape)


def pack(typ, w):
    w = np.ascontiguousarray(w, dtype=np.float32)
    if typ == F32:
        return w.tobytes()
    if typ == F16:
        return w.astype(np.float16).tobytes()
    if typ == BF16:
        return bf16_bits(w).tobytes()
    if typ == Q8_0:
        return pack_q8_0(w)
    if typ == Q4_0:
        return pack_q4_0(w)
    raise ValueError(typ)


def unpack_exact(typ, w):
    """The float32 values a packing holds (for the Hugging Face folder to compare with)."""
    if typ == F16:
        return w.astype(np.float16).astype(np.float32)
    if typ == BF16:
        return (bf16_bits(w).astype(np.uint32) << 16).view(np.float32).reshape(w.shape)
    return w


# ---- a Llama as a GGUF file -------------------------------------------------------------------

def llama_kv(cfg, tokens=None, scores=None, types=None):
    kv = [("general.architecture", STRING, "llama"), ("general.name", STRING, "qkv test"),
          ("llama.context_length", U32, cfg["seq"]), ("llama.embedding_length", U32, cfg["dim"]),
          ("llama.block_count", U32, cfg["layers"]), ("llama.feed_forward_length", U32, cfg["hidden"]),
          ("llama.rope.dimension_count", U32, cfg["dim"] // cfg["heads"]),
          ("llama.attention.head_count", U32, cfg["heads"]), ("llama.attention.head_count_kv", U32, cfg["kv_heads"]),
          ("llama.attention.layer_norm_rms_epsilon", KF32, 1e-5), ("llama.rope.freq_base", KF32, 10000.0),
          ("general.file_type", U32, 1)]
    if tokens is not None:
        kv += [("tokenizer.ggml.model", STRING, "llama"), ("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
               ("tokenizer.ggml.scores", ARRAY, scores, KF32), ("tokenizer.ggml.token_type", ARRAY, types, I32),
               ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
               ("tokenizer.ggml.unknown_token_id", U32, 0), ("tokenizer.ggml.add_bos_token", BOOL, 1)]
    return kv


def llama_tensors(cfg, t, typ, table_typ=None, kquant=None):
    """llama.cpp's tensors from llama2.c-layout weights (Q and K already in interleaved order).
    typ: the projections' type; table_typ: the embedding's and output's; kquant: {name: bytes} to
    use instead of packing (K-quant blocks)."""
    table_typ = typ if table_typ is None else table_typ
    kquant = kquant or {}
    out = []

    def add(name, a, ty):
        if name in kquant:
            out.append((name, [a.shape[-1]] + ([a.shape[0]] if a.ndim == 2 else []), kquant[name][0], kquant[name][1]))
            return
        ne = [a.shape[1], a.shape[0]] if a.ndim == 2 else [a.shape[0]]
        if ty in (Q8_0, Q4_0) and ne[0] % 32:
            ty = BF16  # rows that are not whole blocks (stories260K's 172): bf16, as qkv's own packing falls back
        out.append((name, ne, ty, pack(ty, a)))

    add("token_embd.weight", t["emb"], table_typ)
    for i in range(cfg["layers"]):
        b = "blk.%d." % i
        add(b + "attn_norm.weight", t["att_norm"][i], F32)
        add(b + "attn_q.weight", t["wq"][i], typ)
        add(b + "attn_k.weight", t["wk"][i], typ)
        add(b + "attn_v.weight", t["wv"][i], typ)
        add(b + "attn_output.weight", t["wo"][i], typ)
        add(b + "ffn_norm.weight", t["ffn_norm"][i], F32)
        add(b + "ffn_gate.weight", t["w1"][i], typ)
        add(b + "ffn_down.weight", t["w2"][i], typ)
        add(b + "ffn_up.weight", t["w3"][i], typ)
    add("output_norm.weight", t["norm"], F32)
    if not cfg["shared"]:
        add("output.weight", t["cls"], table_typ)
    return out


def random_llama(rng, dim=256, hidden=512, layers=2, heads=4, kv_heads=2, vocab=300, seq=64, shared=False):
    hd = dim // heads
    n = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)  # noqa: E731
    t = {"emb": n(vocab, dim), "att_norm": 1 + n(layers, dim), "wq": n(layers, dim, dim),
         "wk": n(layers, kv_heads * hd, dim), "wv": n(layers, kv_heads * hd, dim), "wo": n(layers, dim, dim),
         "ffn_norm": 1 + n(layers, dim), "w1": n(layers, hidden, dim), "w2": n(layers, dim, hidden),
         "w3": n(layers, hidden, dim), "norm": 1 + n(dim)}
    if not shared:
        t["cls"] = n(vocab, dim)
    cfg = dict(dim=dim, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, vocab=vocab, seq=seq,
               shared=shared)
    return cfg, t


def read_gguf(path, kinds=False):
    """A minimal reader (for checking what qkv writes): {key: value}, {name: (ne, type, bytes)}; with
    kinds, each key's (kind, value, element kind or None), to write it back."""
    with open(path, "rb") as f:
        data = f.read()
    at = [0]

    def take(fmt):
        v = struct.unpack_from(fmt, data, at[0])
        at[0] += struct.calcsize(fmt)
        return v[0]

    def string():
        n = take("<Q")
        s = data[at[0]:at[0] + n].decode("utf-8")
        at[0] += n
        return s

    def value(kind):
        if kind == STRING:
            return string()
        if kind == ARRAY:
            elem, n = take("<I"), take("<Q")
            return [value(elem) for _ in range(n)]
        return take(SCALAR[kind])

    assert data[:4] == b"GGUF"
    at[0] = 4
    take("<I")
    n_t, n_kv = take("<Q"), take("<Q")
    kv, kv_kinds = {}, {}
    for _ in range(n_kv):
        key = string()
        kind = take("<I")
        elem = struct.unpack_from("<I", data, at[0])[0] if kind == ARRAY else None
        kv[key] = value(kind)
        kv_kinds[key] = (kind, kv[key], elem)
    infos = []
    for _ in range(n_t):
        name = string()
        ne = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, ne, take("<I"), take("<Q")))
    align = kv.get("general.alignment", 32)
    base = (at[0] + align - 1) // align * align
    size = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q8_0: (32, 34), Q4_0: (32, 18), Q4_K: (256, 144), Q5_K: (256, 176),
            Q6_K: (256, 210)}
    tensors = {}
    for name, ne, typ, off in infos:
        blk, b = size[typ]
        n = int(np.prod(ne[1:])) * ne[0] // blk * b
        tensors[name] = (ne, typ, data[base + off:base + off + n])
    return (kv_kinds if kinds else kv), tensors


def run(cmd, want_rc=0):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if want_rc is not None and p.returncode != want_rc:
        raise SystemExit("FAIL %s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-3000:]))
    return p


def logits(qkv, model, ids_path, out, dtype=None):
    cmd = [qkv, "--threads", "2", "forward", "--model", model, "--input", ids_path, "--out", out]
    if dtype:
        cmd += ["--dtype", dtype]
    run(cmd)
    return np.load(out)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def write_seeds(out):
    """Small valid files for fuzz_gguf: a Llama with a tokenizer in Q8_0 / F16, K-quant tensors."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(5)
    cfg, t = random_llama(rng, dim=32, hidden=64, layers=1, heads=2, kv_heads=1, vocab=8, seq=16, shared=True)
    pieces = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "ab"]
    kv = llama_kv(cfg, pieces, [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0], [2, 3, 3, 1, 1, 1, 1, 1])
    write(os.path.join(out, "llama_q8_0.gguf"), gguf(kv, llama_tensors(cfg, t, Q8_0)))
    write(os.path.join(out, "llama_f16_bf16.gguf"), gguf(kv, llama_tensors(cfg, t, F16, BF16)))
    tens = []
    for name, typ in (("a", Q4_K), ("b", Q5_K), ("c", Q6_K), ("d", Q4_0)):
        raw = random_kquant(rng, typ, 1, 256)[0] if typ != Q4_0 else pack_q4_0(rng.standard_normal(32))
        tens.append((name, [256 if typ != Q4_0 else 32], typ, raw))
    write(os.path.join(out, "kquants.gguf"), gguf([("general.alignment", U32, 64)], tens, alignment=64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--realmodel")
    ap.add_argument("--work")
    ap.add_argument("--write-seeds", metavar="DIR", help="write the fuzz target's seed files (tests/fuzz/corpus/gguf) and exit")
    a = ap.parse_args()
    if a.write_seeds:
        write_seeds(a.write_seeds)
        return
    work = a.work or tempfile.mkdtemp(prefix="gguf_test.")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(21)
    qkv = a.qkv
    ids = rng.integers(0, 300, size=(2, 12)).astype(np.int64)
    ids_path = os.path.join(work, "ids.npy")
    np.save(ids_path, ids)

    # ---- each type against a Hugging Face folder holding the same weights ----
    for shared in (False, True):
        cfg, t = random_llama(rng, shared=shared)
        tag = "tied" if shared else "untied"
        for typ, table, dtype, name in ((F32, F32, None, "F32"), (F16, F16, "f16", "F16"), (BF16, BF16, "bf16", "BF16"),
                                        (Q8_0, Q8_0, "int8", "Q8_0"), (Q4_0, Q8_0, "q4", "Q4_0 (tables Q8_0)")):
            path = os.path.join(work, "%s-%s.gguf" % (tag, name.split()[0]))
            write(path, gguf(llama_kv(cfg), llama_tensors(cfg, t, typ, table)))
            exact = {k: (unpack_exact(typ if k not in ("emb", "cls") else table, v)
                         if k not in ("att_norm", "ffn_norm", "norm") else v) for k, v in t.items()}
            folder = os.path.join(work, "%s-%s-hf" % (tag, name.split()[0]))
            rq.hf_folder(cfg, exact, folder)
            got = logits(qkv, path, ids_path, os.path.join(work, "g.npy"))
            want = logits(qkv, folder, ids_path, os.path.join(work, "w.npy"), dtype)
            ok(got.shape == want.shape and np.array_equal(got, want),
               "%s %s GGUF: logits bitwise equal to the Hugging Face folder%s (max diff %.3g)" %
               (tag, name, " under --dtype " + dtype if dtype else "", float(np.abs(got - want).max())))

    # ---- K-quants: converted to Q8_0 from their dequantised values ----
    # (a vocabulary of 6000: the Q6_K output layer is 1.2 MiB, so qkv dequantises it in two pieces)
    cfg, t = random_llama(rng, vocab=6000)
    kq, deq = {}, dict(t)
    kinds = {"attn_q": Q4_K, "attn_k": Q5_K, "attn_v": Q6_K, "attn_output": Q4_K, "ffn_gate": Q5_K, "ffn_down": Q6_K,
             "ffn_up": Q4_K}
    key = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo", "ffn_gate": "w1", "ffn_down": "w2",
           "ffn_up": "w3"}
    deq = {k: v.copy() for k, v in t.items()}
    for i in range(cfg["layers"]):
        for g, typ in kinds.items():
            rows, cols = t[key[g]][i].shape
            raw, w = random_kquant(rng, typ, rows, cols)
            kq["blk.%d.%s.weight" % (i, g)] = (typ, raw)
            deq[key[g]][i] = w
    # the embedding and output at Q6_K too (llama.cpp's Q4_K_M keeps its output at Q6_K)
    for name, k in (("token_embd.weight", "emb"), ("output.weight", "cls")):
        raw, w = random_kquant(rng, Q6_K, *t[k].shape)
        kq[name] = (Q6_K, raw)
        deq[k] = w
    path = os.path.join(work, "kquant.gguf")
    write(path, gguf(llama_kv(cfg), llama_tensors(cfg, t, F32, kquant=kq)))
    folder = os.path.join(work, "kquant-hf")
    rq.hf_folder(cfg, deq, folder)
    p = run([qkv, "--threads", "2", "forward", "--model", path, "--input", ids_path, "--out",
             os.path.join(work, "g.npy")])
    got = np.load(os.path.join(work, "g.npy"))
    want = logits(qkv, folder, ids_path, os.path.join(work, "w.npy"), "int8")
    ok(np.array_equal(got, want), "Q4_K + Q5_K + Q6_K GGUF: logits bitwise equal to the folder of the NumPy-dequantised "
       "weights under --dtype int8 (max diff %.3g)" % float(np.abs(got - want).max()))
    ok("packed as q8_0" in p.stderr, "the K-quant conversion is said on stderr: %s" % p.stderr.strip()[:160])
    # K-quants written from float weights (pack_kquant: bench/kquant_perplexity.py's files): each
    # layout's reading of them is close to the weights (a misplaced nibble, bit or scale would not
    # be), and qkv runs such a file as the folder of the values it holds under --dtype int8
    w = (rng.standard_normal((8, 512)) * 0.05).astype(np.float32)
    for typ, name, bound in ((Q4_K, "Q4_K", 0.1), (Q5_K, "Q5_K", 0.05), (Q6_K, "Q6_K", 0.025)):
        raw, v = pack_kquant(typ, w)
        rel = float(np.sqrt(((v - w) ** 2).mean()) / w.std())
        ok(len(raw) == 16 * KQ_SIZE[typ] and rel < bound,
           "pack_kquant %s: %d bytes, rms error %.4f of the weights' deviation (below %g)" % (name, len(raw), rel, bound))
    cfg2, t2 = random_llama(rng)
    kq2, held = {}, {k: v.copy() for k, v in t2.items()}
    for i in range(cfg2["layers"]):
        for gname, typ in kinds.items():
            raw, held[key[gname]][i] = pack_kquant(typ, t2[key[gname]][i])
            kq2["blk.%d.%s.weight" % (i, gname)] = (typ, raw)
    for name, k in (("token_embd.weight", "emb"), ("output.weight", "cls")):
        raw, held[k] = pack_kquant(Q6_K, t2[k])
        kq2[name] = (Q6_K, raw)
    path2, folder2 = os.path.join(work, "kquant-packed.gguf"), os.path.join(work, "kquant-packed-hf")
    write(path2, gguf(llama_kv(cfg2), llama_tensors(cfg2, t2, F32, kquant=kq2)))
    rq.hf_folder(cfg2, held, folder2)
    got = logits(qkv, path2, ids_path, os.path.join(work, "g.npy"))
    want = logits(qkv, folder2, ids_path, os.path.join(work, "w.npy"), "int8")
    ok(np.array_equal(got, want), "packed K-quant GGUF: logits bitwise equal to its values' folder under --dtype int8")
    # --dtype f32: every K-quant matrix dequantised whole into float32 (the 1.2 MiB output layer in
    # two pieces), the same floats as the NumPy-dequantised folder's
    got = logits(qkv, path, ids_path, os.path.join(work, "g.npy"), "f32")
    want = logits(qkv, folder, ids_path, os.path.join(work, "w.npy"))
    ok(np.array_equal(got, want), "K-quant GGUF under --dtype f32: logits bitwise equal to the dequantised folder's "
       "(max diff %.3g)" % float(np.abs(got - want).max()))
    # --dtype on a GGUF file packs from the dequantised values
    got = logits(qkv, path, ids_path, os.path.join(work, "g.npy"), "bf16")
    want = logits(qkv, folder, ids_path, os.path.join(work, "w.npy"), "bf16")
    ok(np.array_equal(got, want), "K-quant GGUF under --dtype bf16 equals the dequantised folder under --dtype bf16")

    # ---- the tokenizer, generate, quantize ----
    cfg, t = random_llama(rng, vocab=300)
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    words = ["\u2581", "\u2581t", "he", "\u2581the", "\u2581a", "an", "\u2581an", "d", "\u2581and", "in", "\u2581in",
             "t", "h", "e", "a", "n", "i", "s", "\u2581s", "o", "\u2581o", "r", "\u2581r", "w", "\u2581w", "l",
             "ll", "\u2581c", "c", "at", "\u2581cat", "\u2581sat"]
    pieces += words
    pieces += ["<x%d>" % i for i in range(300 - len(pieces))]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces) - 259)]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(pieces) - 259)
    path = os.path.join(work, "tok.gguf")
    write(path, gguf(llama_kv(cfg, pieces, scores, types), llama_tensors(cfg, t, Q8_0)))
    ref_pieces = [p.replace("\u2581", " ") if i >= 259 else p for i, p in enumerate(pieces)]
    ref_pieces[1:3] = ["\n<s>\n", "\n</s>\n"]
    for text in ("the cat sat", "a cat and the hat", "in the  sand, ok?", "\u00e9t\u00e9 \U0001F600"):
        p = run([qkv, "tokenize", "--model", path, "--ids", "--special", "--text", text])
        got = [int(x) for x in p.stdout.split()]
        want = rq.encode(text, ref_pieces, scores)
        ok(got == want, "tokenizer.ggml.* (SentencePiece) encodes %r as the reference BPE-by-score encoder: %s" %
           (text, got))
    p = run([qkv, "--threads", "2", "generate", "--model", path, "--prompt", "the cat", "--max-len", "5"])
    ok(p.stdout.startswith("the cat"), "generate --model FILE.gguf: %r" % p.stdout.strip()[:60])
    # tokenizer.chat_template: the prompt qkv's chat route builds, against Jinja2 with the file's
    # special tokens (by their ids) as transformers passes them
    import jinja2.sandbox
    tpl = ("{{ bos_token }}{% for m in messages %}{{ '[' + m['role'] | upper + '] ' + m['content'] | trim }}"
           "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
           "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")
    chat_path = os.path.join(work, "chat.gguf")
    write(chat_path, gguf(llama_kv(cfg, pieces, scores, types) + [("tokenizer.chat_template", STRING, tpl)],
                          llama_tensors(cfg, t, Q8_0)))
    msgs = [{"role": "system", "content": " be brief "}, {"role": "user", "content": "the cat"},
            {"role": "assistant", "content": "sat"}, {"role": "user", "content": "and?"}]
    with open(os.path.join(work, "msgs.json"), "w") as f:
        json.dump(msgs, f)
    p = run([qkv, "chat-template", "--model", chat_path, "--messages", os.path.join(work, "msgs.json")])
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    want = env.from_string(tpl).render(messages=msgs, add_generation_prompt=True, bos_token="<s>", eos_token="</s>",
                                       unk_token="<unk>")
    ok(p.stdout == want, "tokenizer.chat_template of a GGUF file: the prompt Jinja2 renders (%r)" % p.stdout[:60])
    p = run([qkv, "chat-template", "--model", path, "--messages", os.path.join(work, "msgs.json")], want_rc=2)
    ok("has no chat template" in p.stderr, "a GGUF file without tokenizer.chat_template: %s" % p.stderr.strip()[:100])
    qdir = os.path.join(work, "quantized")
    run([qkv, "quantize", "--model", path, "--out", qdir])  # the file's types, as they are
    a1 = logits(qkv, path, ids_path, os.path.join(work, "g.npy"))
    a2 = logits(qkv, qdir, ids_path, os.path.join(work, "w.npy"))
    ok(np.array_equal(a1, a2), "qkv quantize of a Q8_0 GGUF file (no --dtype): the directory gives the file's logits")
    # a file whose feed-forward output stays F32 amid Q8_0 matrices: still named q8_0, loads back
    mixed = os.path.join(work, "mixed.gguf")
    kq = {"blk.%d.ffn_down.weight" % i: (F32, t["w2"][i].astype(np.float32).tobytes()) for i in range(cfg["layers"])}
    write(mixed, gguf(llama_kv(cfg, pieces, scores, types), llama_tensors(cfg, t, Q8_0, kquant=kq)))
    mdir = os.path.join(work, "mixed-q")
    p = run([qkv, "quantize", "--model", mixed, "--out", mdir])
    m1 = logits(qkv, mixed, ids_path, os.path.join(work, "g.npy"))
    m2 = logits(qkv, mdir, ids_path, os.path.join(work, "w.npy"))
    ok("q8_0 weights" in p.stdout and np.array_equal(m1, m2),
       "quantize of a mixed Q8_0/F32 file: %s; the directory gives the file's logits" % p.stdout.strip()[:80])
    p = run([qkv, "quantize", "--model", folder, "--out", os.path.join(work, "nodtype")], want_rc=None)
    ok(p.returncode == 2 and "give --dtype" in p.stderr, "quantize of a float32 folder without --dtype: refused")
    p = run([qkv, "tokenize", "--model", qdir, "--ids", "--special", "--text", "the cat sat"])
    ok([int(x) for x in p.stdout.split()] == rq.encode("the cat sat", ref_pieces, scores),
       "the quantized directory keeps the tokenizer and its <s>")

    # ---- byte-level BPE ("gpt2") tokenizers: as the tokenizer.json Hugging Face has for them ----
    def bytes_to_unicode():
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        cs, k = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + k)
                k += 1
        return [chr(c) for _, c in sorted(zip(bs, cs))]
    alphabet = bytes_to_unicode()
    merges = ["\u0120 t", "h e", "\u0120t he", "\u0120 c", "a t", "\u0120c at", "1 2", "\u0120 s", "\u0120s at", "o n"]
    vocab = alphabet + [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|begin|>"]
    btypes = [1] * (len(vocab) - 2) + [3, 3]
    cfg, t = random_llama(rng, vocab=len(vocab))
    texts = ["the cat sat on 12 mats", "The  cat\n\nsat!", "caf\u00e9 123 \U0001F600 it's", "<|endoftext|>the",
             "cafe\u0301 IT'S 1234"]
    for pre, add_bos in (("gpt2", False), ("smollm", False), ("llama-bpe", True), ("qwen2", False)):
        kv = llama_kv(cfg)
        kv += [("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, pre),
               ("tokenizer.ggml.tokens", ARRAY, vocab, STRING), ("tokenizer.ggml.merges", ARRAY, merges, STRING),
               ("tokenizer.ggml.token_type", ARRAY, btypes, I32),
               ("tokenizer.ggml.bos_token_id", U32, len(vocab) - 1), ("tokenizer.ggml.eos_token_id", U32, len(vocab) - 2),
               ("tokenizer.ggml.add_bos_token", BOOL, int(add_bos))]
        gpath = os.path.join(work, "bpe-%s.gguf" % pre)
        write(gpath, gguf(kv, llama_tensors(cfg, t, F32)))
        # the tokenizer.json of such a model, written here from Hugging Face's format
        bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": pre not in ("llama-bpe", "qwen2")}
        # Llama 3's split; Qwen2's takes digits one at a time (\p{N} for \p{N}{1,3})
        llama3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}%s| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+") % ("" if pre == "qwen2" else "{1,3}")
        pre_tok = (bl if pre == "gpt2" else
                   {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, bl]} if pre == "smollm"
                   else {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": llama3},
                                                                "behavior": "Isolated", "invert": False}, bl]})
        post = None
        if add_bos:
            b = vocab[-1]
            post = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": b, "type_id": 0}},
                                                             {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {b: {"id": b, "ids": [len(vocab) - 1], "tokens": [b]}}}
        tj = {"version": "1.0", "truncation": None, "padding": None,
              "added_tokens": [{"id": i, "content": vocab[i], "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": True} for i in (len(vocab) - 2, len(vocab) - 1)],
              "normalizer": {"type": "NFC"} if pre == "qwen2" else None, "pre_tokenizer": pre_tok, "post_processor": post,
              "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
              "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                        "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                        "vocab": {v: i for i, v in enumerate(vocab)}, "merges": merges}}
        tdir = os.path.join(work, "bpe-%s-hf" % pre)
        os.makedirs(tdir, exist_ok=True)
        with open(os.path.join(tdir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        with open(os.path.join(tdir, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": vocab[-1], "eos_token": vocab[-2]}, f)
        for text in texts:
            a_ = run([qkv, "tokenize", "--model", gpath, "--ids", "--special", "--text", text]).stdout.split()
            b_ = run([qkv, "tokenize", "--model", tdir, "--ids", "--special", "--text", text]).stdout.split()
            ok(a_ == b_ and len(a_) > 0, "tokenizer.ggml.pre %s: %r as its tokenizer.json encodes it: %s" % (pre, text, a_))
        if pre in ("smollm", "qwen2"):
            ids_ = [int(x) for x in run([qkv, "tokenize", "--model", gpath, "--ids", "--text", "12"]).stdout.split()]
            ok(ids_ == [vocab.index("1"), vocab.index("2")], "%s splits digits one by one: %s" % (pre, ids_))
        if pre == "llama-bpe":
            ids_ = [int(x) for x in run([qkv, "tokenize", "--model", gpath, "--ids", "--text", "12"]).stdout.split()]
            ok(ids_ == [vocab.index("12")], "llama-bpe keeps up to 3 digits together (then merged): %s" % ids_)
        if pre == "qwen2":
            a_ = run([qkv, "tokenize", "--model", gpath, "--ids", "--text", "cafe\u0301"]).stdout.split()
            b_ = run([qkv, "tokenize", "--model", gpath, "--ids", "--text", "caf\u00e9"]).stdout.split()
            ok(a_ == b_, "qwen2 normalises to NFC: a decomposed e + acute encodes as the composed one: %s" % a_)
        if pre == "gpt2":
            ids_ = [int(x) for x in run([qkv, "tokenize", "--model", gpath, "--ids", "--text", " the cat"]).stdout.split()]
            ok(ids_ == [vocab.index("\u0120the"), vocab.index("\u0120cat")], "gpt2 merges ' the cat' to two tokens: %s" % ids_)
    bad = os.path.join(work, "bpe-bad.gguf")
    write(bad, gguf(llama_kv(cfg) + [("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "qwen9"),
                                     ("tokenizer.ggml.tokens", ARRAY, vocab, STRING),
                                     ("tokenizer.ggml.merges", ARRAY, merges, STRING)], llama_tensors(cfg, t, F32)))
    p = run([qkv, "tokenize", "--model", bad, "--text", "x"], want_rc=None)
    ok(p.returncode == 2 and "tokenizer.ggml.pre \"qwen9\" is not read" in p.stderr, "an unknown pre-tokenizer is refused: %s" %
       p.stderr.strip()[:120])

    # ---- export --format gguf: the packed directory back to GGUF, byte for byte ----
    back = os.path.join(work, "exported.gguf")
    p = run([qkv, "export", "--model", qdir, "--format", "gguf", "--out", back])
    kv0, t0 = read_gguf(path)
    kv1, t1 = read_gguf(back)
    ok(set(t0) == set(t1) and all(t0[n] == t1[n] for n in t0),
       "export --format gguf of the quantized directory: every tensor (ggml shape, type, bytes) as the original file")
    same_kv = [k for k in kv0 if k.startswith("llama.") or k.startswith("tokenizer.ggml.")]
    ok(all(kv1.get(k) == kv0[k] or (isinstance(kv0[k], float) and abs(kv1.get(k, 1e9) - kv0[k]) < 1e-12)
           for k in same_kv if k != "tokenizer.ggml.add_space_prefix"),
       "the exported metadata (llama.*, tokenizer.ggml.*) equals the original's: %s" %
       [k for k in same_kv if kv1.get(k) != kv0[k]])
    a3 = logits(qkv, back, ids_path, os.path.join(work, "w.npy"))
    ok(np.array_equal(a1, a3), "the exported file gives the original file's logits")
    # a float32 Hugging Face folder: F32 tensors, logits equal
    cfg, t = random_llama(rng)
    folder = os.path.join(work, "export-hf")
    rq.hf_folder(cfg, t, folder)
    f32 = os.path.join(work, "export-f32.gguf")
    p = run([qkv, "export", "--model", folder, "--format", "gguf", "--out", f32])
    ok("no tokenizer written" in p.stderr, "a folder without a tokenizer: said (%s)" % p.stderr.strip()[:120])
    g1 = logits(qkv, f32, ids_path, os.path.join(work, "g.npy"))
    g2 = logits(qkv, folder, ids_path, os.path.join(work, "w.npy"))
    ok(np.array_equal(g1, g2), "export --format gguf of a float32 Llama folder: the file's logits equal the folder's")
    ok(read_gguf(f32)[1]["blk.0.attn_q.weight"][2] == t["wq"][0].astype(np.float32).tobytes(),
       "its Q rows are back in llama.cpp's interleaved order (the bytes this test would write)")
    # a model that is not Llama-shaped is refused by name
    gpt = os.path.join(work, "gpt.json")
    with open(gpt, "w") as f:
        json.dump({"arch": "decoder", "vocab_size": 32, "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                   "positional": "learned", "max_len": 16, "norm_first": True}, f)
    run([qkv, "init", "--config", gpt, "--out", os.path.join(work, "gptdir")])
    p = run([qkv, "export", "--model", os.path.join(work, "gptdir"), "--format", "gguf", "--out",
             os.path.join(work, "gpt.gguf")], want_rc=None)
    ok(p.returncode == 2 and "Llama-shaped" in p.stderr and not os.path.exists(os.path.join(work, "gpt.gguf")),
       "export --format gguf of a GPT-2-shaped model: refused, nothing written (%s)" % p.stderr.strip()[:150])

    # ---- hostile files: one clear error each ----
    cfg, t = random_llama(rng, dim=64, hidden=128, vocab=40, heads=4, kv_heads=2)
    kv, tens = llama_kv(cfg), llama_tensors(cfg, t, F32)
    good = gguf(kv, tens)
    base = b"GGUF" + struct.pack("<I", 3)

    def meta(items, n_tensors=0):
        out = base + struct.pack("<QQ", n_tensors, len(items))
        for key, kind, value in items:
            out += gstr(key) + struct.pack("<I", kind) + value
        return out + b"\0" * 64

    cases = [
        ("bad magic", b"GGML" + good[4:], "a file that is not GGUF"),
        ("version 1", b"GGUF" + struct.pack("<I", 1) + good[8:], "GGUF version 1"),
        ("big-endian", b"GGUF" + struct.pack(">I", 3) + good[8:], "big-endian"),
        ("truncated header", good[:20], "too short"),
        ("2^64-1 metadata entries", base + struct.pack("<QQ", 0, 2**64 - 1) + b"\0" * 64, "metadata entries"),
        ("2^63 tensors", base + struct.pack("<QQ", 2**63, 0) + b"\0" * 64, "tensors, more than"),
        ("a string past the end", base + struct.pack("<QQ", 0, 1) + struct.pack("<Q", 2**40) + b"abc" + b"\0" * 64,
         "claims 1099511627776 bytes"),
        ("unknown value type", meta([("k", 13, b"")]), "unknown value type 13"),
        ("array of arrays", meta([("k", ARRAY, struct.pack("<IQ", ARRAY, 1))]), "an array of arrays"),
        ("array count near 2^64", meta([("k", ARRAY, struct.pack("<IQ", U32, 2**64 - 2))]), "more than the"),
        ("a bool of 2", meta([("k", BOOL, b"\2")]), "a bool byte is 2"),
        ("a key twice", meta([("k", U8, b"\1"), ("k", U8, b"\1")]), "\"k\" appears twice"),
        ("alignment 24", gguf(kv + [("general.alignment", U32, 24)], tens), "general.alignment"),
        ("a tensor of Q4_1", gguf(kv, [(n, ne, 3 if n == "blk.0.attn_q.weight" else ty, d) for n, ne, ty, d in tens]),
         "has type Q4_1 (3), which qkv does not read"),
        ("a tensor of an unknown type", gguf(kv, [(n, ne, 99 if i == 0 else ty, d) for i, (n, ne, ty, d) in
                                                 enumerate(tens)]), "has unknown type 99"),
        ("5 dimensions", gguf(kv, [(n, ne + [1] * (5 - len(ne)) if i == 0 else ne, ty, d) for i, (n, ne, ty, d) in
                                   enumerate(tens)]), "5 dimensions"),
        ("a dimension of 0", gguf(kv, [(n, [0] + ne[1:] if i == 0 else ne, ty, d) for i, (n, ne, ty, d) in
                                       enumerate(tens)]), "dimension 0 is 0"),
        ("rows that are not whole Q8_0 blocks", gguf(kv, [(n, [48, 2], Q8_0, b"\0" * 102) if i == 0 else (n, ne, ty, d)
                                                          for i, (n, ne, ty, d) in enumerate(tens)]),
         "are not whole Q8_0 blocks"),
        ("a tensor name twice", gguf(kv, tens + [tens[0]]), "appears twice"),
        ("data past the end", good[:-64], "runs past the end of the file"),
        ("a missing tensor", gguf(kv, [x for x in tens if x[0] != "blk.1.ffn_up.weight"]),
         "tensor \"blk.1.ffn_up.weight\" is missing"),
        ("a misshapen tensor", gguf(kv, [(n, [64, 8], ty, d[:64 * 8 * 4]) if n == "blk.0.attn_k.weight" else
                                         (n, ne, ty, d) for n, ne, ty, d in tens]), "has ggml shape (64, 8)"),
        ("architecture gpt2", gguf([("general.architecture", STRING, "gpt2")] + kv[1:], tens),
         "general.architecture is \"gpt2\""),
        ("rope scaling", gguf(kv + [("llama.rope.scaling.type", STRING, "yarn")], tens), "scaled RoPE"),
        ("no block count", gguf([x for x in kv if x[0] != "llama.block_count"], tens),
         "\"llama.block_count\" is missing"),
        ("head count of 0", gguf([x if x[0] != "llama.attention.head_count" else (x[0], U32, 0) for x in kv], tens),
         "\"llama.attention.head_count\" is 0"),
        ("a string block count", gguf([x if x[0] != "llama.block_count" else (x[0], STRING, "2") for x in kv], tens),
         "is a string; expected an integer"),
    ]
    # an unaligned offset and overlapping tensors: edit the first tensor info's offset
    def with_offset(buf, name, offset):
        i = buf.index(gstr(name)) + len(gstr(name))
        dims = struct.unpack("<I", buf[i:i + 4])[0]
        at = i + 4 + 8 * dims + 4
        return buf[:at] + struct.pack("<Q", offset) + buf[at + 8:]
    cases.append(("an unaligned offset", with_offset(good, "blk.0.attn_q.weight", 8), "not a multiple of the alignment"))
    cases.append(("overlapping tensors", with_offset(good, "blk.0.attn_q.weight", 0), "overlaps tensor"))
    for what, data, needle in cases:
        path = os.path.join(work, "bad.gguf")
        write(path, data)
        p = run([qkv, "forward", "--model", path, "--input", ids_path], want_rc=None)
        ok(p.returncode == 2 and needle in p.stderr and p.stderr.count("\n") <= 2,
           "hostile GGUF, %s: exit %d, %s" % (what, p.returncode, p.stderr.strip()[:200]))

    # ---- the real checkpoint ----
    if a.realmodel and os.path.exists(os.path.join(a.realmodel, "stories260K.bin")):
        cfg, t = rq.read_llama2c(os.path.join(a.realmodel, "stories260K.bin"))
        pieces, scores = rq.read_tok512(os.path.join(a.realmodel, "tok512.bin"), cfg["vocab"])
        tokens = [p.strip("\n") if i < 3 else p if i < 259 else p.replace(" ", "\u2581") for i, p in enumerate(pieces)]
        types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
        path = os.path.join(work, "stories260K.Q8_0.gguf")
        write(path, gguf(llama_kv(cfg, tokens, scores, types), llama_tensors(cfg, t, Q8_0)))
        folder = os.path.join(work, "stories260K-hf")
        rq.hf_folder(cfg, t, folder)
        ids = np.array([[1, 403, 407, 261, 378, 300, 263, 332]], dtype=np.int64)
        np.save(ids_path, ids)
        got = logits(qkv, path, ids_path, os.path.join(work, "g.npy"))
        want = logits(qkv, folder, ids_path, os.path.join(work, "w.npy"), "int8")
        ok(np.array_equal(got, want), "stories260K as Q8_0 GGUF: logits bitwise equal to its folder under --dtype int8")
        text = "Once upon a time, there was a little girl named Lily."
        p = run([qkv, "tokenize", "--model", path, "--ids", "--special", "--text", text])
        ok([int(x) for x in p.stdout.split()] == rq.encode(text, pieces, scores),
           "stories260K's tok512 from tokenizer.ggml.*: the ids of llama2.c's encoder")
        p = run([qkv, "--threads", "2", "generate", "--model", path, "--prompt", "Once upon a time", "--max-len", "30"])
        print("  stories260K.Q8_0.gguf continues: %r" % p.stdout.strip()[:200])
    else:
        print("SKIP the real checkpoint: --realmodel not given or stories260K.bin not there")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
