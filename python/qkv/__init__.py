"""qkv from Python: exact tiled CPU attention with a backward pass, and qkv's models.

    import numpy as np, qkv
    q = np.random.randn(2, 8, 1024, 64).astype(np.float32)
    k = np.random.randn(2, 2, 1024, 64).astype(np.float32)   # grouped-query: 2 key/value heads
    v = np.random.randn(2, 2, 1024, 32).astype(np.float32)   # Dv may differ from Dk
    out, lse = qkv.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = qkv.attention_backward(q, k, v, out, lse, np.ones_like(out), causal=True)

    m = qkv.Model.load("models/tiny")            # qkv's directory, a Hugging Face folder, a GGUF file
    m.generate("And God said", max_new_tokens=20, temperature=0)

    qkv.train(task="lm", data="kjv.txt", out="models/kjv", preset="tiny", minutes=2,
              progress=lambda p: print(p["step"], p["loss"]))

PyTorch: qkv.torch (autograd.Function, scaled_dot_product_attention, an nn.Module). Every
function: docs/python.md. Errors from qkv are qkv.Error (a ValueError) carrying qkv's message.
"""
from . import _qkv
import os as _os
import sys as _sys
import time as _time

from ._qkv import Error, Model, alibi_slopes, num_threads, set_num_threads

__all__ = ["attention", "attention_backward", "attention_weights", "alibi_slopes", "Model", "Error", "train",
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


def train(*, out, task=None, data=None, source=None, target=None, train_only=None, train_only_ratio=None,
          subword_alpha=None, preset=None, config=None, init=None, tokenizer=None, vocab=None, spm_type=None,
          steps=None, epochs=None, minutes=None, max_tokens=None, max_len=None, eval_every=None, lr=None,
          warmup=None, dropout=None, label_smoothing=None, valid_fraction=None, test_fraction=None, seed=None,
          precision=None, average=None, resume=None, parts=None, bucket_mb=None, progress=None, log=True):
    """Trains a model as `qkv train` does, into the directory `out`; returns a dict of what the run did.

    The options are the command's (`qkv train --help`), named as its flags with '_' for '-':
    max_tokens is --max-tokens. An option left at None takes the command's default; an option the
    run would not use (vocab with a given tokenizer, anything but the limits with resume=True) is
    refused, as on the command line. Give a limit: steps, epochs or minutes.

    progress: called after every step with a dict (step, epoch, loss, lr, tokens_per_s, elapsed_s,
        fraction of the limit or None, start_fraction (done before this call), evaluated, valid_loss
        or None, best); returning False stops the run after that step with its checkpoint saved
        (resume=True continues it). None (the default): with log=True, qkv train's progress line on
        sys.stderr (redrawn on a terminal, else a line every 15 s) with an ETA; False: none.
    log: True prints the run's notes to sys.stderr ("qkv train: ..."), False is silent, a callable
        gets each line.
    An exception in a callback (Ctrl-C's KeyboardInterrupt included) stops the run the same way, then
    is raised. Bad options or data raise qkv.Error naming the option or file before anything is
    written. The model directory loads with qkv.Model.load(out).

    Returns {"out", "steps" (in all), "start_step" (done before this call, by the run it resumed),
    "epochs", "seconds" (this call's), "parameters", "best_valid_loss", "last_valid_loss" (None
    without a validation split), "interrupted", "stopped_before_training", "averaged",
    "averaged_valid_loss", "averaged_kept"}.
    """
    options = {k: v for k, v in dict(
        out=out, task=task, data=data, source=source, target=target, train_only=train_only,
        train_only_ratio=train_only_ratio, subword_alpha=subword_alpha, preset=preset, config=config, init=init,
        tokenizer=tokenizer, vocab=vocab, spm_type=spm_type, steps=steps, epochs=epochs, minutes=minutes,
        max_tokens=max_tokens, max_len=max_len, eval_every=eval_every, lr=lr, warmup=warmup, dropout=dropout,
        label_smoothing=label_smoothing, valid_fraction=valid_fraction, test_fraction=test_fraction, seed=seed,
        precision=precision, average=average, resume=resume, parts=parts, bucket_mb=bucket_mb).items()
        if v is not None}
    options = {k: _os.fspath(v) if k in _PATH_OPTIONS and hasattr(v, "__fspath__") else v for k, v in options.items()}
    bar = None
    if progress is None and log is True:
        progress = bar = _ProgressBar()
    elif progress is False or progress is None:
        progress = None
    elif not callable(progress):
        raise TypeError("progress: expected None, False or a callable, got " + type(progress).__name__)
    if log is True:
        def log(line):
            print("qkv train: " + line, file=_sys.stderr, flush=True)
    elif log is False or log is None:
        def log(line):
            pass
    elif not callable(log):
        raise TypeError("log: expected True, False or a callable, got " + type(log).__name__)
    try:
        return _qkv.train(options, progress, log)
    finally:
        if bar is not None:
            bar.finish()


def _duration(s):
    if s < 60:
        return "%.1fs" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    return "%dh%02dm" % (s // 3600, s // 60 % 60)


class _ProgressBar:
    """qkv train's progress line on sys.stderr: redrawn in place on a terminal, else a line at the
    first step, every 15 s and at the end; the ETA scales this call's time to what is left."""

    def __init__(self, every=15.0):
        self.tty = _sys.stderr.isatty()
        self.every, self.t0, self.last, self.drawn = every, _time.monotonic(), None, False

    def __call__(self, p):
        elapsed = _time.monotonic() - self.t0
        f = p["fraction"]
        done = f is not None and f >= 1
        if not self.tty and self.last is not None and elapsed - self.last < self.every and not done:
            return
        self.last = elapsed
        eta = "?"
        if f is not None and f - p["start_fraction"] > 0.001:
            eta = _duration(elapsed * (1 - f) / (f - p["start_fraction"]))
        filled = round((f or 0) * 24)
        valid = "-" if p["valid_loss"] is None else "%.3f" % p["valid_loss"]
        line = "[%s%s] %s step %d ep %d loss %.3f valid %s lr %.2e %.0f tok/s | %s ETA %s" % (
            "#" * filled, "." * (24 - filled), "  ?%" if f is None else "%3.0f%%" % (100 * f), p["step"], p["epoch"],
            p["loss"], valid, p["lr"], p["tokens_per_s"], _duration(elapsed), eta)
        if self.tty:
            _sys.stderr.write("\r" + line + "\033[K")
            self.drawn = True
        else:
            _sys.stderr.write(line + "\n")
        _sys.stderr.flush()

    def finish(self):
        if self.tty and self.drawn:
            _sys.stderr.write("\n")
            _sys.stderr.flush()


_PATH_OPTIONS = {"out", "data", "source", "target", "train_only", "config", "init", "tokenizer"}
