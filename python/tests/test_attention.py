"""qkv.attention on NumPy arrays: every mask kind against a float64 reference written here from the
formula, the backward pass against the float64 oracle, no copies of float32 C-contiguous input,
results over qkv's memory, the GIL released while the kernel runs, errors that name the problem."""
import threading
import time

import numpy as np
import pytest

import qkv

RNG = np.random.default_rng(7)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def reference(q, k, v, mask=None, bool_mask=None, key_lengths=None, causal=False, window=None, alibi=False,
              scale=None):
    """softmax(q k^T * scale + masks) v in float64, from the published semantics (docs/numerics.md):
    query i sits at p = i + Tk - Tq (bottom-right) or p = i (top-left); causal sees j <= p; a window
    of w sees p-w < j <= p (causal) or |j - p| < w; ALiBi adds -slope_h |p - j|; a row with no
    allowed key gives zeros."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, H, Tq, Dk = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) * (scale if scale is not None else 1 / np.sqrt(Dk))
    top_left = causal == "top-left"
    p = np.arange(Tq)[:, None] + (0 if top_left else Tk - Tq)
    j = np.arange(Tk)[None, :]
    allowed = np.ones((B, H, Tq, Tk), bool)
    if causal:
        allowed &= j <= p
    if window:
        allowed &= (j > p - window) if causal else (np.abs(j - p) < window)
    if bool_mask is not None:
        allowed &= np.broadcast_to(bool_mask, allowed.shape)
    if key_lengths is not None:
        allowed &= j[None, None] < np.asarray(key_lengths)[:, None, None, None]
    if alibi:
        slopes = np.asarray(qkv.alibi_slopes(H) if alibi is True else alibi, np.float64)
        s = s - slopes[None, :, None, None] * np.abs(p - j)[None, None]
    if mask is not None:
        s = s + np.broadcast_to(np.asarray(mask, np.float64), s.shape)
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    w = np.where(z > 0, e / np.where(z > 0, z, 1), 0)
    return w @ v


CASES = {
    "plain": {},
    "causal bottom-right": {"causal": True},
    "causal top-left": {"causal": "top-left"},
    "window causal": {"causal": True, "window": 5},
    "window both sides": {"window": 4},
    "alibi causal": {"causal": True, "alibi": True},
    "alibi slopes": {"alibi": [0.5, 0.25, 0.125, 0.0625]},
    "additive mask": {"mask": "additive"},
    "bool mask": {"bool_mask": "bool"},
    "key lengths": {"key_lengths": [9, 3]},
    "scale": {"scale": 0.3, "causal": True},
}


def case_kwargs(name, Tq, Tk):
    kw = dict(CASES[name])
    if kw.get("mask") == "additive":
        m = randn(1, 4, Tq, Tk)
        m[:, :, :, ::3] = -np.inf
        kw["mask"] = m
    if kw.get("bool_mask") == "bool":
        kw["bool_mask"] = RNG.random((2, 1, Tq, Tk)) < 0.6
    return kw


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_mask_matches_the_float64_reference(name):
    # grouped-query heads (4 over 2), Dk != Dv, Tq != Tk
    Tq, Tk = 7, 11
    q, k, v = randn(2, 4, Tq, 16), randn(2, 2, Tk, 16), randn(2, 2, Tk, 8)
    kw = case_kwargs(name, Tq, Tk)
    out = qkv.attention(q, k, v, **kw)
    want = reference(q, k, v, **kw)
    assert out.shape == (2, 4, Tq, 8) and out.dtype == np.float32
    assert np.abs(out - want).max() < 2e-5 * (1 + np.abs(want).max())
    assert not np.isnan(out).any()


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_matches_the_float64_oracle(name):
    Tq, Tk = 6, 9
    q, k, v = randn(2, 4, Tq, 8), randn(2, 2, Tk, 8), randn(2, 2, Tk, 4)
    kw = case_kwargs(name, Tq, Tk)
    out, lse = qkv.attention(q, k, v, return_lse=True, **kw)
    dout = randn(*out.shape)
    got = qkv.attention_backward(q, k, v, out, lse, dout, **kw)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    o64, l64 = qkv.attention(q64, k64, v64, impl="reference", return_lse=True, **kw)
    want = qkv.attention_backward(q64, k64, v64, o64, l64, dout.astype(np.float64), impl="reference", **kw)
    for g, w, x in zip(got, want, (q, k, v)):
        assert g.shape == x.shape and g.dtype == np.float32 and w.dtype == np.float64
        assert np.abs(g - w).max() < 5e-5 * (1 + np.abs(w).max())


def test_the_oracle_backward_matches_finite_differences():
    q, k, v = (randn(1, 2, 4, 3).astype(np.float64) for _ in range(3))
    kw = {"causal": True, "alibi": True}
    out, lse = qkv.attention(q, k, v, impl="reference", return_lse=True, **kw)
    dout = np.ones_like(out)
    dq, dk, dv = qkv.attention_backward(q, k, v, out, lse, dout, impl="reference", **kw)
    eps = 1e-6
    for x, g in ((q, dq), (k, dk), (v, dv)):
        for idx in [(0, 0, 1, 2), (0, 1, 3, 0), (0, 1, 0, 1)]:
            x[idx] += eps
            up = qkv.attention(q, k, v, impl="reference", **kw).sum()
            x[idx] -= 2 * eps
            down = qkv.attention(q, k, v, impl="reference", **kw).sum()
            x[idx] += eps
            assert abs((up - down) / (2 * eps) - g[idx]) < 1e-6


def test_a_row_with_no_allowed_key_is_zero_not_nan():
    q, k, v = randn(1, 1, 3, 4), randn(1, 1, 5, 4), randn(1, 1, 5, 4)
    out, lse = qkv.attention(q, k, v, key_lengths=[0], return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()
    dq, dk, dv = qkv.attention_backward(q, k, v, out, lse, np.ones_like(out), key_lengths=[0])
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


def test_shapes_without_batch_and_heads():
    q, k, v = randn(5, 8), randn(7, 8), randn(7, 3)
    out = qkv.attention(q, k, v, causal=True)
    assert out.shape == (5, 3)
    assert np.abs(out - reference(q[None, None], k[None, None], v[None, None], causal=True)[0, 0]).max() < 1e-5
    assert qkv.attention(randn(2, 5, 8), randn(2, 7, 8), randn(2, 7, 8)).shape == (2, 5, 8)


def test_float32_c_contiguous_input_is_read_in_place_and_results_wrap_qkv_memory():
    q, k, v = randn(2, 4, 33, 16), randn(2, 4, 40, 16), randn(2, 4, 40, 16)
    before = qkv._qkv.input_copies()
    out, lse = qkv.attention(q, k, v, causal=True, return_lse=True)
    qkv.attention_backward(q, k, v, out, lse, np.ones_like(out), causal=True)
    assert qkv._qkv.input_copies() == before  # nothing converted
    assert qkv._qkv._address(q) == q.ctypes.data  # the kernel reads the array's own memory
    # the result is a view over memory qkv allocated, owned by its base, alive after the call
    assert not out.flags.owndata and out.base is not None and out.flags.writeable
    saved = out.copy()
    del lse
    import gc
    gc.collect()
    assert np.array_equal(out, saved)
    # float64 and strided arrays are converted, once each
    qkv.attention(q.astype(np.float64), k, v)
    assert qkv._qkv.input_copies() == before + 1
    qkv.attention(np.swapaxes(np.swapaxes(q, 2, 3).copy(), 2, 3), k, v)
    assert qkv._qkv.input_copies() == before + 2
    odd = np.frombuffer(b"\0" + q.tobytes(), np.float32, count=q.size, offset=1).reshape(q.shape)  # unaligned
    assert not odd.flags.aligned and np.array_equal(qkv.attention(odd, k, v), qkv.attention(q, k, v))
    assert qkv._qkv.input_copies() == before + 3


def test_the_gil_is_released_while_the_kernel_runs():
    # thread A runs a long attention; thread B, started once A is inside the call, gets the GIL
    # back from its sleep while A is still inside: impossible if A held the GIL
    q, k, v = randn(1, 8, 1536, 64), randn(1, 8, 1536, 64), randn(1, 8, 1536, 64)
    t0 = time.perf_counter()
    qkv.attention(q, k, v, threads=1)
    one = time.perf_counter() - t0
    inside, done, seen = threading.Event(), threading.Event(), []

    def a():
        inside.set()
        qkv.attention(q, k, v, threads=1)
        done.set()

    def b():
        inside.wait()
        time.sleep(min(0.05, one / 4))
        seen.append(done.is_set())

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    ta.join(), tb.join()
    assert seen == [False], "thread B ran only after A's kernel: the GIL was held (one call: %.3f s)" % one


def test_errors_are_qkv_errors_with_qkv_messages():
    q, k, v = randn(1, 4, 3, 8), randn(1, 3, 5, 8), randn(1, 3, 5, 8)
    with pytest.raises(qkv.Error, match="must divide"):
        qkv.attention(q, k, v)
    with pytest.raises(ValueError, match="causal"):
        qkv.attention(q, randn(1, 2, 5, 8), randn(1, 2, 5, 8), causal="left")
    with pytest.raises(ValueError, match="window"):
        qkv.attention(q, randn(1, 2, 5, 8), randn(1, 2, 5, 8), window=0)
    with pytest.raises(TypeError, match="bool"):
        qkv.attention(q, randn(1, 2, 5, 8), randn(1, 2, 5, 8), bool_mask=np.ones((3, 5), np.float32))
    with pytest.raises(TypeError, match="NumPy array"):
        qkv.attention("q", k, v)
    with pytest.raises(qkv.Error, match="mask"):
        qkv.attention(q, randn(1, 2, 5, 8), randn(1, 2, 5, 8), mask=np.full((3, 5), np.nan, np.float32))


def test_attention_weights_are_the_softmax_rows():
    q, k = randn(1, 2, 6, 8), randn(1, 2, 9, 8)
    out, lse = qkv.attention(q, k, k, causal=True, return_lse=True)
    w = qkv.attention_weights(q, k, lse, 2, 5, causal=True)
    assert w.shape == (1, 2, 3, 9)
    s = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)) / np.sqrt(8)
    p = np.arange(6)[:, None] + 3
    s = np.where(np.arange(9)[None, :] <= p, s, -np.inf)
    want = np.exp(s - s.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    assert np.abs(w - want[:, :, 2:5]).max() < 1e-5
