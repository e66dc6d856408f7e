#!/usr/bin/python3
"""Parity test: `qkv attend` against PyTorch on random inputs.

    /usr/bin/python3 tests/torch_parity.py --qkv build/qkv

For every case the same float32 inputs go to `qkv attend` (through .npy files in a temporary
directory) and to plain "math" attention in PyTorch -- matmul, add the bias / masks, softmax,
matmul, autograd for the gradients -- computed twice: in float64 (the truth) and in float32
(the baseline). qkv's float32 results are judged the FlashAttention way (docs: DESIGN.md,
"Tolerances"): for each quantity X in out, dq, dk, dv, lse, weights

    |X_qkv - X_f64|_max  <=  bound = max(2 * |X_torch_f32 - X_f64|_max, 1e-6 * |X_f64|_max) + 1e-6

i.e. at most about twice the error of plain float32 PyTorch on the same inputs, with a floor of a
few float32 ulps of the largest value. The weights, which qkv recomputes as exp(s - lse) from the
float32 lse, get one more term, elementwise: w_ij * eps32 * |lse_i| (one float32 ulp of lse_i
turned into a relative error of w_ij). Beyond the bounds, every case also checks:
  * no NaN anywhere, shapes and dtype (float32) as documented, results keep q's rank;
  * a query row with no allowed key has out == 0 and dq == 0 exactly, weights == 0, lse == -inf;
  * a key no query may attend to gets dk == 0 and dv == 0 exactly;
  * weight rows sum to 1 (or exactly 0 for a fully masked row).
PyTorch's softmax gives NaN on a fully masked row, so the torch reference zeroes such rows
explicitly (scores replaced by 0 before the softmax, probabilities multiplied by 0 after it).

One case checks the composition with torch.nn.MultiheadAttention (projections, key_padding_mask,
per-head weights, gradients through the projections), and a few bad inputs must make qkv exit
with code 2 after one line "qkv: error: ..." on stderr, writing nothing.

Prints one line per case and, last, "N passed, M failed". Exit status 0 only if all passed.
Needs only torch, numpy and the standard library; deterministic (fixed seeds, one torch thread).
"""
import argparse
import copy
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

IMPLS = ("flash", "reference")
QUANTITIES = ("out", "dq", "dk", "dv", "lse", "weights")
REL_FLOOR = 1e-6  # bound floor, relative to the largest |value| of the quantity
ABS_FLOOR = 1e-6  # and absolute
EPS32 = float(np.finfo(np.float32).eps)  # 2^-23
SUM_TOL = 1e-5  # |sum_j w_ij - 1| for a row with an allowed key
QKV_TIMEOUT_S = 120


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def make_case(name, seed, B=None, H=None, Hkv=None, Tq=37, Tk=None, Dk=16, Dv=None, spec=None, impls=IMPLS,
              q_scale=1.0, prepare=None):
    """q: (B, H, Tq, Dk), k: (B, Hkv, Tk, Dk), v: (B, Hkv, Tk, Dv); B and/or H None = lower rank.

    `prepare(rng, case)` may add masks to case["spec"] (it sees the drawn q, k, v)."""
    rng = np.random.default_rng(seed)
    Tk = Tq if Tk is None else Tk
    Dv = Dk if Dv is None else Dv
    Hkv = H if Hkv is None else Hkv
    lead_q = tuple(x for x in (B, H) if x is not None)
    lead_k = tuple(x for x in (B, Hkv) if x is not None)
    q = randn(rng, *lead_q, Tq, Dk) * np.float32(q_scale)
    k = randn(rng, *lead_k, Tk, Dk)
    v = randn(rng, *lead_k, Tk, Dv)
    dout = randn(rng, *lead_q, Tq, Dv)
    case = dict(name=name, q=q, k=k, v=v, dout=dout, spec=dict(spec or {}), impls=impls,
                qkv_k=None, qkv_v=None)
    if prepare is not None:
        prepare(rng, case)
    return case


def dims4(case):
    q4, k4, v4 = (to4d(case[x]) for x in ("q", "k", "v"))
    B, H, Tq, Dk = q4.shape
    _, Hkv, Tk, Dv = v4.shape
    return B, H, Hkv, Tq, Tk, Dk, Dv


def to4d(a):
    while a.ndim < 4:
        a = a[None]
    return a


# --------------------------------------------------------------------------------------------
# The torch reference
# --------------------------------------------------------------------------------------------


def allowed_and_bias(spec, B, H, Tq, Tk):
    """Allowed (query, key) pairs (B, H, Tq, Tk) bool, and the additive bias (float64, 0 where
    blocked), from the mask rules: causal / window / ALiBi positions p = i + Tk - Tq unless
    --causal=top-left (p = i)."""
    shape = (B, H, Tq, Tk)
    allowed = np.ones(shape, dtype=bool)
    bias = np.zeros(shape, dtype=np.float64)
    causal = spec.get("causal")
    top_left = causal == "top-left"
    p = np.arange(Tq)[:, None] + (0 if top_left else Tk - Tq)  # (Tq, 1)
    j = np.arange(Tk)[None, :]  # (1, Tk)
    if causal:
        allowed &= j <= p
    w = spec.get("window", 0)
    if w > 0:
        allowed &= j >= p - w + 1
        if not causal:
            allowed &= j <= p + w - 1
    if spec.get("key_lengths") is not None:
        kl = spec["key_lengths"].astype(np.int64)
        allowed &= (np.arange(Tk)[None, :] < kl[:, None])[:, None, None, :]
    if spec.get("bool_mask") is not None:
        allowed &= np.broadcast_to(spec["bool_mask"], shape)
    if spec.get("mask") is not None:
        m = np.broadcast_to(spec["mask"].astype(np.float64), shape)
        allowed &= m != -np.inf
        bias += np.where(m == -np.inf, 0.0, m)
    if spec.get("alibi"):
        slopes = np.array(alibi_slopes(H), np.float32).astype(np.float64)  # qkv keeps float32 slopes
        bias -= slopes[None, :, None, None] * np.abs(p - j)[None, None]
    bias[~allowed] = 0.0
    return allowed, bias


def alibi_slopes(H):
    """Press et al. (2022): 2^(-8 (h+1) / H) for H a power of two; otherwise the slopes of the
    closest smaller power of two c, then every other slope of 2c."""
    def pow2(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    c = 1 << (H.bit_length() - 1)
    return pow2(c) + alibi_slopes(2 * c)[0::2][:H - c] if c != H else pow2(H)


def torch_attention(case, dtype):
    """Math attention in `dtype` from the same float32 inputs. Returns float64 numpy arrays,
    all 4-D: out, lse, weights, dq, dk, dv."""
    spec = case["spec"]
    B, H, Hkv, Tq, Tk, Dk, Dv = dims4(case)
    allowed_np, bias_np = allowed_and_bias(spec, B, H, Tq, Tk)
    scale = spec.get("scale", 1.0 / math.sqrt(Dk))
    q = torch.tensor(to4d(case["q"]), dtype=dtype, requires_grad=True)
    k = torch.tensor(to4d(case["k"]), dtype=dtype, requires_grad=True)
    v = torch.tensor(to4d(case["v"]), dtype=dtype, requires_grad=True)
    dout = torch.tensor(to4d(case["dout"]), dtype=dtype)
    allowed = torch.tensor(allowed_np)
    bias = torch.tensor(bias_np, dtype=dtype)
    row_any = allowed.any(dim=-1, keepdim=True)  # (B, H, Tq, 1)
    # Grouped-query attention: query head h uses kv head h // (H / Hkv).
    ke = k.repeat_interleave(H // Hkv, dim=1)
    ve = v.repeat_interleave(H // Hkv, dim=1)
    s = torch.matmul(q, ke.transpose(-1, -2)) * scale + bias
    s = s.masked_fill(~allowed, -math.inf)
    s = s.masked_fill(~row_any, 0.0)  # a fully masked row: finite dummies, zeroed below
    p = torch.softmax(s, dim=-1) * row_any
    out = torch.matmul(p, ve)
    (out * dout).sum().backward()
    with torch.no_grad():
        lse = torch.logsumexp(s, dim=-1).masked_fill(~row_any[..., 0], -math.inf)
    f = lambda t: t.detach().to(torch.float64).numpy()
    return dict(out=f(out), lse=f(lse), weights=f(p), dq=f(q.grad), dk=f(k.grad), dv=f(v.grad)), allowed_np


# --------------------------------------------------------------------------------------------
# Running qkv
# --------------------------------------------------------------------------------------------


class Runner:
    def __init__(self, qkv, tmp):
        self.qkv = qkv
        self.tmp = tmp
        self.n = 0

    def path(self, stem):
        self.n += 1
        return os.path.join(self.tmp, f"{self.n:04d}_{stem}.npy")

    def save(self, stem, a):
        p = self.path(stem)
        np.save(p, a)
        return p

    def run(self, args):
        r = subprocess.run([self.qkv] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=QKV_TIMEOUT_S)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

    def attend(self, q, k, v, spec, impl, dout=None, want=QUANTITIES):
        """Runs `qkv attend`; returns ({name: array}, error text or None)."""
        args = ["attend", "--impl", impl, "--q", self.save("q", q), "--k", self.save("k", k),
                "--v", self.save("v", v)]
        outs = {x: self.path(x) for x in want if x in ("out", "lse", "weights")}
        if dout is not None:
            args += ["--dout", self.save("dout", dout)]
            outs.update({x: self.path(x) for x in want if x in ("dq", "dk", "dv")})
        for x, p in outs.items():
            args += ["--" + x, p]
        if spec.get("mask") is not None:
            args += ["--mask", self.save("mask", spec["mask"])]
        if spec.get("bool_mask") is not None:
            args += ["--bool-mask", self.save("bool_mask", spec["bool_mask"])]
        if spec.get("key_lengths") is not None:
            args += ["--key-lengths", self.save("key_lengths", spec["key_lengths"])]
        if spec.get("causal"):
            args += ["--causal" if spec.get("bare_causal") else "--causal=" + spec["causal"]]
        if spec.get("window"):
            args += ["--window", str(spec["window"])]
        if spec.get("alibi"):
            args += ["--alibi"]
        if spec.get("scale") is not None:
            args += ["--scale", repr(float(spec["scale"]))]
        rc, _, err = self.run(args)
        if rc != 0:
            return None, f"qkv exited with {rc}: {err.strip()}"
        try:
            return {x: np.load(p) for x, p in outs.items()}, None
        except Exception as e:  # a missing or unreadable result
            return None, f"could not read qkv's results: {e}"


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


def compare(got, truth, base, extra=None):
    """Max abs error of `got` (float32) and of `base` (torch float32) against `truth` (float64)
    over the finite entries of truth; infinite entries of truth must match exactly. `extra`
    (broadcastable to truth) widens the bound elementwise. Returns (err, bound, problems), the
    bound being the largest elementwise one."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf in a broken result: reported below
        return _compare(got.astype(np.float64), truth, base, extra)


def _compare(got, truth, base, extra):
    problems = []
    fin = np.isfinite(truth)
    if not np.array_equal(got[~fin], truth[~fin]):
        bad = np.argwhere((got != truth) & ~fin)[0]
        problems.append(f"at {tuple(bad)}: expected {truth[tuple(bad)]}, got {got[tuple(bad)]}")
    if not fin.any():
        return 0.0, ABS_FLOOR, problems
    diff = np.where(fin, np.abs(got - np.where(fin, truth, 0.0)), 0.0)
    diff = np.where(np.isnan(diff), np.inf, diff)
    err = float(diff.max())
    err32 = float(np.where(fin, np.abs(base - np.where(fin, truth, 0.0)), 0.0).max())
    mag = float(np.abs(np.where(fin, truth, 0.0)).max())
    bound0 = max(2.0 * err32, REL_FLOOR * mag) + ABS_FLOOR
    bounds = np.broadcast_to(bound0 + (0.0 if extra is None else extra), diff.shape)
    bound = float(bounds.max())
    if not np.all(diff <= bounds):
        at = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff - bounds)), diff.shape))
        err, bound = float(diff[at]), float(bounds[at])
        problems.append(f"max error {err:.3e} at {at} (qkv {got[at]:.9g}, float64 {truth[at]:.9g}, "
                        f"torch float32 {base[at]:.9g}) exceeds the bound {bound:.3e} "
                        f"(torch float32 error {err32:.3e}, max |value| {mag:.3g})")
    return err, bound, problems


def expected_shapes(case):
    q, k, v = case["q"], case["k"], case["v"]
    Tk, Dv = v.shape[-2], v.shape[-1]
    return dict(out=q.shape[:-1] + (Dv,), lse=q.shape[:-1], weights=q.shape[:-1] + (Tk,),
                dq=q.shape, dk=k.shape, dv=v.shape)


def check_attend(case, impl, runner, truth, base, allowed):
    """Runs one case with one impl; returns (line pieces, problems)."""
    qkv_k = case["qkv_k"] if case["qkv_k"] is not None else case["k"]
    qkv_v = case["qkv_v"] if case["qkv_v"] is not None else case["v"]
    res, err = runner.attend(case["q"], qkv_k, qkv_v, case["spec"], impl, dout=case["dout"])
    if err:
        return {}, [err]
    problems = []
    shapes = expected_shapes(case)
    errs = {}
    got4 = {}
    for x in QUANTITIES:
        a = res[x]
        if a.dtype != np.float32 or a.shape != shapes[x]:
            problems.append(f"{x}: expected float32 {shapes[x]}, got {a.dtype} {a.shape}")
            continue
        if np.isnan(a).any():
            problems.append(f"{x}: {int(np.isnan(a).sum())} NaN entries, first at {tuple(np.argwhere(np.isnan(a))[0])}")
        a4 = a.reshape(truth[x].shape)
        got4[x] = a4
        extra = None
        if x == "weights":
            # qkv recomputes the weights as exp(s - lse) from the float32 lse: one float32 ulp of
            # lse (its rounding to float32 and its own error) becomes a relative error of w.
            lse = truth["lse"][..., None]
            extra = EPS32 * truth["weights"] * np.abs(np.where(np.isfinite(lse), lse, 0.0))
        e, bound, pr = compare(a4, truth[x], base[x], extra)
        errs[x] = (e, bound)
        problems += [f"{x}: {p}" for p in pr]
    # Exact zeros for fully masked rows and for keys nobody may attend to.
    empty = ~allowed.any(axis=-1)  # (B, H, Tq)
    B, H, Hkv, Tq, Tk, Dk, Dv = dims4(case)
    key_unused = ~allowed.reshape(B, Hkv, H // Hkv, Tq, Tk).any(axis=(2, 3))  # (B, Hkv, Tk)
    exact = [("out", empty, 0.0), ("dq", empty, 0.0), ("weights", empty, 0.0), ("lse", empty, -np.inf),
             ("dk", key_unused, 0.0), ("dv", key_unused, 0.0)]
    for x, where, val in exact:
        if x in got4 and where.any():
            sel = got4[x][where]
            if not np.all(sel == val):
                problems.append(f"{x}: {int((sel != val).sum())} entries of fully blocked "
                                f"{'rows' if x in ('out', 'dq', 'weights', 'lse') else 'keys'} "
                                f"differ from {val} (e.g. {sel[sel != val][0]!r})")
    if "weights" in got4:
        sums = got4["weights"].astype(np.float64).sum(axis=-1)
        dev = np.abs(np.where(empty, sums, sums - 1.0))
        if not np.all(dev[~empty] <= SUM_TOL) or not np.all(sums[empty] == 0.0):
            at = tuple(int(i) for i in np.unravel_index(int(np.nanargmax(dev)), dev.shape))
            problems.append(f"weights: row {at} sums to {sums[at]!r} (expected {0 if empty[at] else 1})")
    return errs, problems


def fmt_errs(errs, names=QUANTITIES, labels=None):
    labels = labels or {}
    parts = []
    for x in names:
        if x in errs:
            e, b = errs[x]
            parts.append(f"{labels.get(x, x)} {e:.2e}{' <=' if e <= b else ' > '}{b:.2e}")
        else:
            parts.append(f"{labels.get(x, x)} -")
    return "  ".join(parts)


# --------------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------------


def float_mask(shape, rng, p_block=0.25, empty_rows=()):
    """Random additive mask: N(0, 1) biases, -inf with probability p_block, and the listed rows
    (index tuples into the leading dims + row) all -inf."""
    m = rng.standard_normal(shape).astype(np.float32)
    m[rng.random(shape) < p_block] = -np.inf
    for r in empty_rows:
        m[r] = -np.inf
    return m


def cases():
    C = []
    C.append(make_case("plain", 1, B=2, H=4, Tq=37, Dk=16))
    C.append(make_case("cross-tq19-tk53-dk24-dv40", 2, B=2, H=4, Tq=19, Tk=53, Dk=24, Dv=40))
    C.append(make_case("causal-br-tq<tk", 3, B=2, H=4, Tq=19, Tk=53, Dk=16,
                       spec=dict(causal="bottom-right")))
    C.append(make_case("causal-br-tq>tk-empty-rows", 4, B=2, H=2, Tq=53, Tk=19, Dk=16, Dv=8,
                       spec=dict(causal="bottom-right", bare_causal=True)))
    C.append(make_case("causal-tl-tq<tk", 5, B=2, H=2, Tq=30, Tk=45, Dk=16, spec=dict(causal="top-left")))
    C.append(make_case("causal-tl-tq>tk", 6, B=2, H=2, Tq=45, Tk=30, Dk=16, spec=dict(causal="top-left")))
    C.append(make_case("window8-causal", 7, B=2, H=4, Tq=37, Dk=16, spec=dict(causal="bottom-right", window=8)))
    C.append(make_case("window6-noncausal", 8, B=2, H=4, Tq=37, Dk=16, spec=dict(window=6)))
    C.append(make_case("window4-noncausal-tq20-tk50", 9, B=1, H=2, Tq=20, Tk=50, Dk=16, spec=dict(window=4)))
    C.append(make_case("window5-causal-tl-tq50-tk20", 10, B=1, H=2, Tq=50, Tk=20, Dk=16,
                       spec=dict(causal="top-left", window=5)))
    C.append(make_case("alibi-h8", 11, B=2, H=8, Tq=37, Dk=16, spec=dict(alibi=True)))
    C.append(make_case("alibi-h2-noncausal-tq30-tk20", 33, B=2, H=2, Tq=30, Tk=20, Dk=16, spec=dict(alibi=True)))
    C.append(make_case("alibi-h6-not-power-of-two", 34, B=1, H=6, Tq=25, Dk=16, spec=dict(alibi=True)))
    C.append(make_case("alibi-h4-causal-tq20-tk45", 12, B=1, H=4, Tq=20, Tk=45, Dk=16,
                       spec=dict(alibi=True, causal="bottom-right")))

    def mask_b1(rng, c):  # (B, 1, Tq, Tk): shared by the heads; rows 3 and 10 of batch 1 empty
        B, H, Hkv, Tq, Tk, Dk, Dv = dims4(c)
        c["spec"]["mask"] = float_mask((B, 1, Tq, Tk), rng, empty_rows=[(1, 0, 3), (1, 0, 10), (0, 0, Tq - 1)])
    C.append(make_case("float-mask-b1tqtk-empty-rows", 13, B=2, H=4, Tq=37, Tk=41, Dk=16, prepare=mask_b1))

    def mask_full(rng, c):  # (B, H, Tq, Tk), half the entries blocked; one head's row 0 empty
        B, H, Hkv, Tq, Tk, Dk, Dv = dims4(c)
        c["spec"]["mask"] = float_mask((B, H, Tq, Tk), rng, p_block=0.5, empty_rows=[(0, 2, 0)])
    C.append(make_case("float-mask-bhtqtk", 14, B=2, H=3, Tq=29, Tk=33, Dk=16, prepare=mask_full))

    def mask_2d(rng, c):  # (Tq, Tk) broadcast over B and H
        c["spec"]["mask"] = float_mask((c["q"].shape[-2], c["k"].shape[-2]), rng, empty_rows=[(5,)])
    C.append(make_case("float-mask-tqtk-causal", 15, B=2, H=2, Tq=25, Tk=30, Dk=16,
                       spec=dict(causal="bottom-right"), prepare=mask_2d))

    def bool_full(rng, c):
        B, H, Hkv, Tq, Tk, Dk, Dv = dims4(c)
        m = rng.random((B, H, Tq, Tk)) < 0.7
        m[1, 0, 7, :] = False
        m[0, 3, 0, :] = False
        c["spec"]["bool_mask"] = m
    C.append(make_case("bool-mask-bhtqtk-empty-rows", 16, B=2, H=4, Tq=37, Tk=40, Dk=16, prepare=bool_full))

    def bool_pad(rng, c):  # (B, 1, 1, Tk): padding-style
        B, H, Hkv, Tq, Tk, Dk, Dv = dims4(c)
        m = np.ones((B, 1, 1, Tk), dtype=bool)
        m[0, 0, 0, 30:] = False
        m[1, 0, 0, ::3] = False
        c["spec"]["bool_mask"] = m
    C.append(make_case("bool-mask-b11tk", 17, B=2, H=2, Tq=21, Tk=40, Dk=16, prepare=bool_pad))

    C.append(make_case("key-lengths-int32-with-0", 18, B=3, H=2, Tq=23, Tk=31, Dk=16,
                       spec=dict(key_lengths=np.array([31, 12, 0], np.int32))))
    C.append(make_case("key-lengths-int64-causal", 19, B=2, H=2, Tq=31, Tk=31, Dk=16,
                       spec=dict(key_lengths=np.array([5, 31], np.int64), causal="bottom-right")))

    def nan_padding(rng, c):  # keys past the length are "never read": fill them with NaN for qkv
        kl = c["spec"]["key_lengths"]
        c["qkv_k"], c["qkv_v"] = c["k"].copy(), c["v"].copy()
        for b, n in enumerate(kl):
            c["qkv_k"][b, :, n:] = np.nan
            c["qkv_v"][b, :, n:] = np.nan
    C.append(make_case("key-lengths-nan-padding", 20, B=3, H=2, Tq=17, Tk=90, Dk=16,
                       spec=dict(key_lengths=np.array([90, 70, 0], np.int32)), prepare=nan_padding))

    C.append(make_case("gqa-h8-hkv2-causal", 21, B=2, H=8, Hkv=2, Tq=29, Tk=35, Dk=16,
                       spec=dict(causal="bottom-right")))

    def mqa_mask(rng, c):  # per-query-head bool mask on top of MQA
        B, H, Hkv, Tq, Tk, Dk, Dv = dims4(c)
        m = rng.random((1, H, Tq, Tk)) < 0.6
        m[0, 1, 4, :] = False
        c["spec"]["bool_mask"] = m
    C.append(make_case("mqa-h4-hkv1-bool-mask", 22, B=2, H=4, Hkv=1, Tq=27, Tk=27, Dk=16, Dv=24, prepare=mqa_mask))
    C.append(make_case("rank2-td-causal", 23, Tq=29, Tk=31, Dk=8, Dv=12, spec=dict(causal="bottom-right")))

    def rank3_bool(rng, c):
        m = rng.random((c["q"].shape[-2], c["k"].shape[-2])) < 0.8
        m[2, :] = False
        c["spec"]["bool_mask"] = m
    C.append(make_case("rank3-htd-bool-mask", 24, H=3, Tq=26, Tk=22, Dk=16, prepare=rank3_bool))
    C.append(make_case("rank3-htd-gqa-keylen", 25, H=4, Hkv=2, Tq=19, Dk=16,
                       spec=dict(key_lengths=np.array([11], np.int32))))
    C.append(make_case("scale-0.9", 26, B=2, H=4, Tq=37, Dk=16, spec=dict(scale=0.9)))
    C.append(make_case("scale-0.05-tq>tk", 27, B=1, H=2, Tq=40, Tk=24, Dk=32, spec=dict(scale=0.05)))

    def combo_mask(rng, c):
        B, H, Hkv, Tq, Tk, Dk, Dv = dims4(c)
        c["spec"]["mask"] = float_mask((B, 1, 1, Tk), rng, p_block=0.1)
    C.append(make_case("combo-causal-keylen-alibi", 28, B=3, H=4, Tq=30, Tk=70, Dk=16, Dv=20,
                       spec=dict(causal="bottom-right", alibi=True, key_lengths=np.array([70, 45, 0], np.int64))))
    C.append(make_case("combo-causal-tl-window-alibi-mask", 29, B=2, H=2, Tq=33, Tk=40, Dk=16,
                       spec=dict(causal="top-left", alibi=True, window=9), prepare=combo_mask))
    # Several tiles of queries (48) and keys (64) in the flash kernel.
    C.append(make_case("multiblock-causal-gqa", 30, B=1, H=4, Hkv=2, Tq=150, Tk=170, Dk=32, Dv=48,
                       spec=dict(causal="bottom-right")))

    def mb_mask(rng, c):
        B, H, Hkv, Tq, Tk, Dk, Dv = dims4(c)
        c["spec"]["mask"] = float_mask((B, H, Tq, Tk), rng, p_block=0.3,
                                       empty_rows=[(0, 0, 47), (0, 0, 48), (0, 1, 99)])
        c["spec"]["key_lengths"] = np.array([120], np.int32)
    C.append(make_case("multiblock-mask-keylen", 31, B=1, H=2, Tq=100, Tk=130, Dk=16, prepare=mb_mask))
    C.append(make_case("peaky-softmax-q-x4", 32, B=2, H=2, Tq=37, Tk=45, Dk=16, q_scale=4.0,
                       spec=dict(causal="bottom-right")))
    return C


def run_case(case, runner):
    truth, allowed = torch_attention(case, torch.float64)
    base, _ = torch_attention(case, torch.float32)
    results = []
    for impl in case["impls"]:
        errs, problems = check_attend(case, impl, runner, truth, base, allowed)
        results.append((f"{case['name']}/{impl}", fmt_errs(errs), problems))
    return results


def float64_input_case(runner):
    """float64 .npy inputs are accepted and converted: same results as the float32 files."""
    c = make_case("float64-inputs", 40, B=2, H=2, Tq=13, Tk=17, Dk=8, spec=dict(causal="bottom-right"))
    truth, allowed = torch_attention(c, torch.float64)
    base, _ = torch_attention(c, torch.float32)
    out = []
    for impl in IMPLS:
        c64 = dict(c, q=c["q"].astype(np.float64), k=c["k"].astype(np.float64), v=c["v"].astype(np.float64),
                   dout=c["dout"].astype(np.float64))
        errs, problems = check_attend(c64, impl, runner, truth, base, allowed)
        out.append((f"float64-inputs/{impl}", fmt_errs(errs), problems))
    return out


def mha_case(runner):
    """torch.nn.MultiheadAttention (cross attention, key_padding_mask) rebuilt around qkv:
    projections from in_proj_weight, qkv attend per head with --key-lengths, out_proj; per-head
    weights against need_weights=True, average_attn_weights=False; gradients with respect to the
    module's query and key/value inputs."""
    torch.manual_seed(1234)
    rng = np.random.default_rng(41)
    E, nh, B, T, S = 32, 4, 2, 11, 17
    hd = E // nh
    lengths = np.array([17, 9], np.int64)
    mha32 = torch.nn.MultiheadAttention(E, nh, bias=False, batch_first=True).eval()
    mha64 = copy.deepcopy(mha32).double()
    x_np, mem_np, dy_np = randn(rng, B, T, E), randn(rng, B, S, E), randn(rng, B, T, E)
    kpm = torch.tensor(np.arange(S)[None, :] >= lengths[:, None])  # True = ignore (module convention)

    def module(m, dtype):
        x = torch.tensor(x_np, dtype=dtype, requires_grad=True)
        mem = torch.tensor(mem_np, dtype=dtype, requires_grad=True)
        y, w = m(x, mem, mem, key_padding_mask=kpm, need_weights=True, average_attn_weights=False)
        (y * torch.tensor(dy_np, dtype=dtype)).sum().backward()
        f = lambda t: t.detach().to(torch.float64).numpy()
        return dict(out=f(y), weights=f(w), dq=f(x.grad), dk=f(mem.grad))

    truth, base = module(mha64, torch.float64), module(mha32, torch.float32)
    W = mha64.in_proj_weight.detach().numpy()
    Wq, Wk, Wv = W[:E], W[E:2 * E], W[2 * E:]
    Wo = mha64.out_proj.weight.detach().numpy()
    heads = lambda a: a.reshape(a.shape[0], a.shape[1], nh, hd).transpose(0, 2, 1, 3)  # (B, nh, T, hd)
    unheads = lambda a: a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], E)
    x64, mem64, dy64 = (a.astype(np.float64) for a in (x_np, mem_np, dy_np))
    q = np.ascontiguousarray(heads(x64 @ Wq.T).astype(np.float32))
    k = np.ascontiguousarray(heads(mem64 @ Wk.T).astype(np.float32))
    v = np.ascontiguousarray(heads(mem64 @ Wv.T).astype(np.float32))
    dz = np.ascontiguousarray(heads(dy64 @ Wo).astype(np.float32))  # dL/dZ for y = concat(Z) Wo^T
    results = []
    for impl in IMPLS:
        res, err = runner.attend(q, k, v, dict(key_lengths=lengths), impl, dout=dz,
                                 want=("out", "weights", "dq", "dk", "dv"))
        if err:
            results.append((f"mha-module-keypadding/{impl}", "", [err]))
            continue
        got = dict(out=unheads(res["out"].astype(np.float64)) @ Wo.T,
                   weights=res["weights"],
                   dq=unheads(res["dq"].astype(np.float64)) @ Wq,
                   dk=unheads(res["dk"].astype(np.float64)) @ Wk + unheads(res["dv"].astype(np.float64)) @ Wv)
        errs, problems = {}, []
        for x in ("out", "weights", "dq", "dk"):
            if np.isnan(got[x]).any():
                problems.append(f"{x}: NaN")
            e, b, pr = compare(got[x], truth[x], base[x])
            errs[x] = (e, b)
            problems += [f"{x}: {p}" for p in pr]
        line = fmt_errs(errs, ("out", "dq", "dk", "weights"), dict(dq="dx", dk="dmem"))
        results.append((f"mha-module-keypadding/{impl}", line, problems))
    return results


def bad_input_cases(runner):
    """Each must exit 2, print exactly one stderr line starting 'qkv: error:', write no output."""
    rng = np.random.default_rng(50)
    q, k, v = randn(rng, 2, 2, 5, 8), randn(rng, 2, 2, 6, 8), randn(rng, 2, 2, 6, 8)
    pq, pk, pv = runner.save("q", q), runner.save("k", k), runner.save("v", v)
    corrupt = runner.path("corrupt")
    with open(corrupt, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\xff\xff{'descr': '<f4', 'fortran_order': Fal" + bytes(rng.integers(0, 256, 40, np.uint8)))
    garbage = runner.path("garbage")
    with open(garbage, "wb") as f:
        f.write(bytes(rng.integers(0, 256, 200, np.uint8)))
    truncated = runner.path("truncated")
    with open(runner.save("full", k), "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[:-20])
    bad = [
        ("shape-mismatch-dk", dict(k=runner.save("k_dk9", randn(rng, 2, 2, 6, 9)))),
        ("shape-mismatch-tk", dict(v=runner.save("v_tk7", randn(rng, 2, 2, 7, 8)))),
        ("hkv-does-not-divide-h", dict(q=runner.save("q_h3", randn(rng, 2, 3, 5, 8)))),
        ("corrupt-npy-header", dict(k=corrupt)),
        ("garbage-npy", dict(q=garbage)),
        ("truncated-npy", dict(k=truncated)),
        ("key-length-over-tk", dict(extra=["--key-lengths", runner.save("kl", np.array([6, 7], np.int32))])),
        ("bool-mask-wrong-dtype", dict(extra=["--bool-mask", runner.save("bm", np.ones((5, 6), np.float32))])),
        ("mask-not-broadcastable", dict(extra=["--mask", runner.save("m", np.zeros((4, 6), np.float32))])),
        ("output-dir-missing", dict(extra=["--lse", os.path.join(runner.tmp, "no_such_dir", "lse.npy")])),
    ]
    results = []
    for name, o in bad:
        out = runner.path("out_bad")
        args = ["attend", "--q", o.get("q", pq), "--k", o.get("k", pk), "--v", o.get("v", pv), "--out", out]
        args += o.get("extra", [])
        problems = []
        for impl in IMPLS:
            rc, so, se = runner.run(args + ["--impl", impl])
            lines = se.strip("\n").split("\n") if se.strip() else []
            if rc != 2:
                problems.append(f"{impl}: exit code {rc}, expected 2 (stderr: {se.strip()!r})")
            if len(lines) != 1 or not lines[0].startswith("qkv: error:"):
                problems.append(f"{impl}: expected one stderr line 'qkv: error: ...', got {se!r}")
            if os.path.exists(out):
                problems.append(f"{impl}: wrote {os.path.basename(out)} despite the error")
                os.remove(out)
        results.append((f"bad-input/{name}", f"rc=2 '{lines[0][:90] if lines else ''}'", problems))
    return results


def weights_rows_case(runner):
    """--weights with --rows BEGIN:END: only those query rows, recomputed from lse."""
    rng = np.random.default_rng(77)
    B, H, Tq, Tk, D = 2, 3, 29, 41, 16
    q, k, v = (randn(rng, B, H, t, D) for t in (Tq, Tk, Tk))
    paths = [runner.save(n, a) for n, a in (("q", q), ("k", k), ("v", v))]
    w_path, z_path = runner.path("weights_rows"), runner.path("z")
    base = ["attend", "--q", paths[0], "--k", paths[1], "--v", paths[2], "--out", z_path, "--causal"]
    rc, _, err = runner.run(base + ["--weights", w_path, "--rows", "5:12"])
    problems = []
    if rc != 0:
        return [("weights-rows", "", [f"qkv exited with {rc}: {err.strip()}"])]
    w = np.load(w_path)
    s = torch.from_numpy(q).double() @ torch.from_numpy(k).double().transpose(-2, -1) / np.sqrt(D)
    allowed = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
    truth = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)[:, :, 5:12].numpy()
    if w.shape != (B, H, 7, Tk):
        problems.append(f"--rows 5:12 gave shape {w.shape}, expected {(B, H, 7, Tk)}")
    else:
        err_w = float(np.abs(w - truth).max())
        if not err_w <= 1e-5:
            problems.append(f"weights rows 5:12 differ from torch by {err_w:.3g} (bound 1e-5)")
    for bad in ("12:5", "0:99", "x:3", "7"):
        rc, _, err = runner.run(base + ["--weights", runner.path("w_bad"), "--rows", bad])
        if rc != 2 or not err.startswith("qkv: error:") or "--rows" not in err:
            problems.append(f"--rows {bad}: exit {rc}, stderr {err.strip()!r}; expected exit 2 and a --rows error")
    rc, _, err = runner.run(base + ["--rows", "0:3"])
    if rc != 2:
        problems.append(f"--rows without --weights: exit {rc}, expected 2")
    return [("weights-rows", f"shape {tuple(w.shape)}", problems)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True, help="path to the qkv binary")
    ap.add_argument("--only", default="", help="run only cases whose name contains this text")
    args = ap.parse_args()
    qkv = os.path.abspath(args.qkv)
    if not os.access(qkv, os.X_OK):
        print(f"torch_parity: {qkv} is not an executable", file=sys.stderr)
        return 2
    t0 = time.time()
    passed = failed = 0
    print(f"qkv {qkv}; torch {torch.__version__}, numpy {np.__version__}; "
          f"bound = max(2 * err_torch_f32, {REL_FLOOR:g} * max|f64|) + {ABS_FLOOR:g}", flush=True)
    with tempfile.TemporaryDirectory(prefix="qkv_torch_parity_") as tmp:
        runner = Runner(qkv, tmp)
        groups = [(c["name"], (lambda c=c: run_case(c, runner))) for c in cases()]
        groups += [("float64-inputs", lambda: float64_input_case(runner)),
                   ("mha-module-keypadding", lambda: mha_case(runner)),
                   ("weights-rows", lambda: weights_rows_case(runner)),
                   ("bad-input", lambda: bad_input_cases(runner))]
        for gname, fn in groups:
            if args.only and args.only not in gname:
                continue
            try:
                results = fn()
            except Exception as e:  # a crash in one case must not hide the others
                results = [(gname, "", [f"exception: {type(e).__name__}: {e}"])]
            for name, line, problems in results:
                ok = not problems
                passed += ok
                failed += not ok
                print(f"{'PASS' if ok else 'FAIL'} {name:42s} {line}", flush=True)
                for p in problems:
                    print(f"     - {p}", flush=True)
    print(f"runtime {time.time() - t0:.1f} s", flush=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
