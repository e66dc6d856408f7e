"""qkv's flash attention for PyTorch: forward and backward are qkv's tiled kernels, on the tensors'
own memory (CPU, contiguous float32 tensors are not copied; results are tensors over qkv's memory).

    import torch, qkv.torch
    out = qkv.torch.attention(q, k, v, causal=True)                  # autograd: out.sum().backward()
    out = qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # PyTorch 2's signature
    layer = qkv.torch.MultiheadAttention(512, 8, batch_first=True)  # nn.MultiheadAttention's drop-in

PyTorch 1.13 (Debian 12's) has no fused CPU attention: its attention holds the T x T matrix.
docs/python.md lists every option; they are qkv.attention's.
"""
import torch
import torch.nn.functional as F

from . import _qkv

__all__ = ["attention", "scaled_dot_product_attention", "Attention", "MultiheadAttention", "tensor_copies"]

_copies = 0  # tensors converted (another dtype, not contiguous) since the start: tests hold "no copy" with it


def tensor_copies():
    """Tensors this module had to convert (dtype or layout) before handing them to qkv."""
    return _copies


def _numpy(t, name, dtype=torch.float32):
    """A NumPy view of a CPU tensor's memory; a converted copy when its dtype or layout differs."""
    global _copies
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("%s: qkv runs on the CPU; the tensor is on %s" % (name, t.device))
    t = t.detach()
    if t.dtype != dtype or not t.is_contiguous():
        t = t.to(dtype).contiguous()
        _copies += 1
    return t.numpy()


def _options(mask, bool_mask, key_lengths, causal, window, alibi, scale, impl, threads):
    return dict(mask=None if mask is None else _numpy(mask, "mask"),
                bool_mask=None if bool_mask is None else _numpy(bool_mask, "bool_mask", torch.bool),
                key_lengths=None if key_lengths is None else _numpy(key_lengths, "key_lengths", torch.int64),
                causal=causal, window=window, alibi=alibi, scale=scale, impl=impl, threads=threads)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opts):
        dt = torch.float64 if opts["impl"] == "reference" and q.dtype == torch.float64 else torch.float32
        qn, kn, vn = _numpy(q, "q", dt), _numpy(k, "k", dt), _numpy(v, "v", dt)
        out, lse = _qkv.attention(qn, kn, vn, **opts)
        out, lse = torch.from_numpy(out), torch.from_numpy(lse)
        ctx.opts, ctx.dt = opts, dt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _qkv.attention_backward(_numpy(q, "q", ctx.dt), _numpy(k, "k", ctx.dt), _numpy(v, "v", ctx.dt),
                                             out.numpy(), lse.numpy(), _numpy(dout, "dout", ctx.dt), **ctx.opts)
        cast = lambda g, like: torch.from_numpy(g).to(like.dtype)
        return cast(dq, q), cast(dk, k), cast(dv, v), None


def attention(q, k, v, *, mask=None, bool_mask=None, key_lengths=None, causal=False, window=None, alibi=False,
              scale=None, impl="flash", threads=0, return_lse=False):
    """softmax(q k^T * scale + masks) v on qkv's kernels, differentiable in q, k and v.

    q (B, H, Tq, Dk), k (B, Hkv, Tk, Dk), v (B, Hkv, Tk, Dv) (or without B, or (T, D)); Hkv divides H,
    Dv may differ from Dk. mask: additive float (broadcastable to (B, H, Tq, Tk), -inf blocks);
    bool_mask: True = may attend; key_lengths (B,); causal: False, True / "bottom-right", "top-left";
    window: w keys; alibi: True or one slope per head; scale: default 1 / sqrt(Dk). impl "reference"
    runs the float64 oracle (float64 tensors stay float64: torch.autograd.gradcheck). The masks take
    no gradient. With return_lse, (out, lse).
    """
    opts = _options(mask, bool_mask, key_lengths, causal, window, alibi, scale, impl, threads)
    out, lse = _Attention.apply(q, k, v, opts)
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """PyTorch 2's torch.nn.functional.scaled_dot_product_attention on qkv's kernels (no dropout).

    query (..., L, E), key (..., S, E), value (..., S, Ev); key and value may have fewer heads than
    query (grouped-query attention). attn_mask: bool (True takes part in attention) or additive
    float, broadcastable to (..., L, S). is_causal: PyTorch's top-left causal mask.
    """
    if dropout_p != 0.0:
        raise ValueError("dropout_p: qkv's attention has no dropout; got %r" % (dropout_p,))
    if attn_mask is not None and is_causal:
        raise ValueError("attn_mask and is_causal: PyTorch refuses both at once; so does qkv")
    lead = query.shape[:-2]
    q, k, v = query, key, value
    if query.dim() > 4 or query.dim() == 3:  # (N, L, E) or more leading dims -> (B, H, L, E)
        q = query.reshape(-1, 1, *query.shape[-2:]) if query.dim() == 3 else query.flatten(0, -4)
        k = key.reshape(-1, 1, *key.shape[-2:]) if key.dim() == 3 else key.flatten(0, -4)
        v = value.reshape(-1, 1, *value.shape[-2:]) if value.dim() == 3 else value.flatten(0, -4)
        if attn_mask is not None and attn_mask.dim() >= 3:
            attn_mask = attn_mask.reshape(-1, 1, *attn_mask.shape[-2:]) if attn_mask.dim() == 3 \
                else attn_mask.flatten(0, -4)
    kw = {}
    if attn_mask is not None:
        kw["bool_mask" if attn_mask.dtype == torch.bool else "mask"] = attn_mask
    out = attention(q, k, v, causal="top-left" if is_causal else False, scale=scale, **kw)
    return out.reshape(*lead, out.shape[-2], out.shape[-1])


class Attention(torch.nn.Module):
    """The attention formula as a module: forward(q, k, v, mask=None, bool_mask=None, key_lengths=None)
    with the options fixed at construction (causal, window, alibi, scale, impl, threads)."""

    def __init__(self, causal=False, window=None, alibi=False, scale=None, impl="flash", threads=0):
        super().__init__()
        self.options = dict(causal=causal, window=window, alibi=alibi, scale=scale, impl=impl, threads=threads)

    def forward(self, q, k, v, mask=None, bool_mask=None, key_lengths=None):
        return attention(q, k, v, mask=mask, bool_mask=bool_mask, key_lengths=key_lengths, **self.options)


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with its attention on qkv's kernels: the same parameters (a state
    dict loads either way), projections and masks. Not supported: dropout > 0 while training,
    add_bias_kv, add_zero_attn. need_weights returns the weights recomputed from the log-sum-exp
    (averaged over heads unless average_attn_weights=False)."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        if add_bias_kv or add_zero_attn:
            raise ValueError("qkv.torch.MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim,
                         batch_first=batch_first, device=device, dtype=dtype)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if self.training and self.dropout > 0:
            raise ValueError("qkv.torch.MultiheadAttention: attention dropout is not supported (dropout=%g)" %
                             self.dropout)
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(1 - self.batch_first), key.unsqueeze(1 - self.batch_first), \
                value.unsqueeze(1 - self.batch_first)
        if not self.batch_first:  # (L, N, E) -> (N, L, E)
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        N, L, E = query.shape
        S, H = key.shape[1], self.num_heads
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        q = F.linear(query, w_q, b_q).reshape(N, L, H, -1).transpose(1, 2)
        k = F.linear(key, w_k, b_k).reshape(N, S, H, -1).transpose(1, 2)
        v = F.linear(value, w_v, b_v).reshape(N, S, H, -1).transpose(1, 2)
        kw = {}
        # PyTorch's masks: attn_mask bool True = NOT allowed (or additive float), (L, S) or (N*H, L, S);
        # key_padding_mask bool True = padding (or additive float), (N, S)
        allow = None
        add = None
        if attn_mask is not None:
            m = attn_mask.reshape(N, H, L, S) if attn_mask.dim() == 3 else attn_mask
            if m.dtype == torch.bool:
                allow = ~m
            else:
                add = m.to(q.dtype)
        if key_padding_mask is not None:
            p = key_padding_mask.reshape(N, 1, 1, S)
            if p.dtype == torch.bool:
                allow = ~p if allow is None else allow & ~p
            else:
                add = p.to(q.dtype) if add is None else add + p.to(q.dtype)
        if allow is not None:
            kw["bool_mask"] = allow.expand(N, H, L, S) if allow.dim() == 4 else allow
        if add is not None:
            kw["mask"] = add
        causal = "top-left" if (is_causal and attn_mask is None) else False
        out, lse = attention(q, k, v, causal=causal, return_lse=True, **kw)
        out = self.out_proj(out.transpose(1, 2).reshape(N, L, E))
        if not self.batch_first:
            out = out.transpose(0, 1)
        if not batched:
            out = out.squeeze(1 - self.batch_first)
        weights = None
        if need_weights:
            w = torch.from_numpy(_qkv.attention_weights(
                _numpy(q, "q"), _numpy(k, "k"), lse.numpy(), 0, L,
                mask=None if add is None else _numpy(kw["mask"], "mask"),
                bool_mask=None if allow is None else _numpy(kw["bool_mask"], "bool_mask", torch.bool),
                causal=causal))
            weights = w.mean(1) if average_attn_weights else w
            if not batched:
                weights = weights.squeeze(0)
        return out, weights
