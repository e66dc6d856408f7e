"""qkv from Python: exact tiled CPU attention with a backward pass, and qkv's models.

    import numpy as np, qkv
    q = np.random.randn(2, 8, 1024, 64).astype(np.float32)
    k = np.random.randn(2, 2, 1024, 64).astype(np.float32)   # grouped-query: 2 key/value heads
    v = np.random.randn(2, 2, 1024, 32).astype(np.float32)   # Dv may differ from Dk
    out, lse = qkv.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = qkv.attention_backward(q, k, v, out, lse, np.ones_like(out), causal=True)

    m = qkv.Model.load("models/tiny")            # qkv's directory, a Hugging Face folder, a GGUF file
    m.generate("And God said", max_new_tokens=20, temperature=0)

PyTorch: qkv.torch (autograd.Function, scaled_dot_product_attention, an nn.Module). Every
function: docs/python.md. Errors from qkv are qkv.Error (a ValueError) carrying qkv's message.
"""
from . import _qkv
from ._qkv import Error, Model, alibi_slopes, num_threads, set_num_threads

__all__ = ["attention", "attention_backward", "attention_weights", "alibi_slopes", "Model", "Error",
           "num_threads", "set_num_threads"]

_SPEC_DOC = """
    q (B, H, Tq, Dk), k (B, Hkv, Tk, Dk), v (B, Hkv, Tk, Dv), or without B, or (T, D): NumPy arrays.
    float32 C-contiguous arrays are read in place (no copy); others are converted once to float32
    (impl="reference" keeps float64 inputs in float64). Hkv must divide H.
    mask: additive float32, broadcastable to (B, H, Tq, Tk), -inf blocks.
    bool_mask: bool, broadcastable to (B, H, Tq, Tk), True = may attend.
    key_lengths: (B,) integers: keys j >= key_lengths[b] are blocked.
    causal: False, True (= "bottom-right": the last query sees the last key), "top-left".
    window: None or w >= 1: a sliding window of w keys (causal: p-w+1 .. p; else |j - p| < w).
    alibi: False, True (the standard slopes) or one slope per query head.
    scale: None (1 / sqrt(Dk)) or a number.
    impl: "flash" (tiled, float32), "reference" (float64 oracle), "reference32" (plain float32).
    threads: 0 (qkv's default) or the threads to use.
    A query row with no allowed key outputs zeros (never NaN).
"""


def attention(q, k, v, *, mask=None, bool_mask=None, key_lengths=None, causal=False, window=None, alibi=False,
              scale=None, impl="flash", threads=0, return_lse=False):
    out, lse = _qkv.attention(q, k, v, mask=mask, bool_mask=bool_mask, key_lengths=key_lengths, causal=causal,
                              window=window, alibi=alibi, scale=scale, impl=impl, threads=threads)
    return (out, lse) if return_lse else out


def attention_backward(q, k, v, out, lse, dout, *, mask=None, bool_mask=None, key_lengths=None, causal=False,
                       window=None, alibi=False, scale=None, impl="flash", threads=0):
    return _qkv.attention_backward(q, k, v, out, lse, dout, mask=mask, bool_mask=bool_mask, key_lengths=key_lengths,
                                   causal=causal, window=window, alibi=alibi, scale=scale, impl=impl, threads=threads)


def attention_weights(q, k, lse, row_begin=0, row_end=None, *, mask=None, bool_mask=None, key_lengths=None,
                      causal=False, window=None, alibi=False, scale=None, threads=0):
    if row_end is None:
        row_end = q.shape[-2]
    return _qkv.attention_weights(q, k, lse, row_begin, row_end, mask=mask, bool_mask=bool_mask,
                                  key_lengths=key_lengths, causal=causal, window=window, alibi=alibi, scale=scale,
                                  impl="flash", threads=threads)


attention.__doc__ = """softmax(q k^T * scale + masks) v; with return_lse, (out, lse): lse (..., Tq) is the log-sum-exp
    of each query row's scores, which attention_backward and attention_weights take.""" + _SPEC_DOC
attention_backward.__doc__ = """(dq, dk, dv): the gradients of sum(out * dout), from attention()'s out and lse and the same
    options.""" + _SPEC_DOC
attention_weights.__doc__ = """The attention weights of query rows [row_begin, row_end): (..., rows, Tk), recomputed from
    the saved lse a block of rows at a time (the full Tq x Tk matrix is never needed).""" + _SPEC_DOC
