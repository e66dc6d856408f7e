"""qkv.torch: qkv's kernels as a torch.autograd.Function, PyTorch 2's scaled_dot_product_attention
signature and nn.MultiheadAttention's drop-in, against PyTorch's float64 math path (outputs and
gradients, every mask kind, grouped-query heads, Dk != Dv), gradcheck through the float64
oracle, no copies of contiguous float32 tensors, and a small training loop whose losses match."""
import math

import pytest
import torch

import qkv.torch as qt

torch.manual_seed(0)


def math_attention(q, k, v, causal=False, window=None, alibi=False, mask=None, bool_mask=None, key_lengths=None,
                   scale=None):
    """PyTorch's math path (what torch 1.13 runs), in whatever dtype it is given."""
    H, Hkv, Tq, Tk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k = k.repeat_interleave(H // Hkv, 1)
    v = v.repeat_interleave(H // Hkv, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    p = torch.arange(Tq)[:, None] + (0 if causal == "top-left" else Tk - Tq)
    j = torch.arange(Tk)[None, :]
    allowed = torch.ones(q.shape[0], H, Tq, Tk, dtype=torch.bool)
    if causal:
        allowed &= j <= p
    if window:
        allowed &= (j > p - window) if causal else ((j - p).abs() < window)
    if bool_mask is not None:
        allowed &= bool_mask
    if key_lengths is not None:
        allowed &= j[None, None] < key_lengths[:, None, None, None]
    if alibi:
        slopes = torch.tensor(qt._qkv.alibi_slopes(H), dtype=q.dtype)
        s = s - slopes[None, :, None, None] * (p - j).abs()[None, None].to(q.dtype)
    if mask is not None:
        s = s + mask.to(q.dtype)
    s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)  # a row with no allowed key: zeros (qkv's rule)
    return w @ v


KINDS = {
    "plain": {},
    "causal": {"causal": True},
    "causal top-left": {"causal": "top-left"},
    "window": {"causal": True, "window": 4},
    "alibi": {"alibi": True, "causal": True},
    "additive mask": {"mask": True},
    "bool mask": {"bool_mask": True},
    "key lengths": {"key_lengths": True},
}


def kind_kwargs(name, B, H, Tq, Tk):
    kw = dict(KINDS[name])
    if kw.get("mask"):
        kw["mask"] = torch.randn(1, H, Tq, Tk)
    if kw.get("bool_mask"):
        kw["bool_mask"] = torch.rand(B, 1, Tq, Tk) < 0.7
    if kw.get("key_lengths"):
        kw["key_lengths"] = torch.tensor([Tk, 2])
    return kw


@pytest.mark.parametrize("name", sorted(KINDS))
def test_outputs_and_gradients_match_the_float64_math_path(name):
    B, H, Hkv, Tq, Tk = 2, 4, 2, 6, 10
    q64 = torch.randn(B, H, Tq, 16, dtype=torch.float64, requires_grad=True)
    k64 = torch.randn(B, Hkv, Tk, 16, dtype=torch.float64, requires_grad=True)
    v64 = torch.randn(B, Hkv, Tk, 8, dtype=torch.float64, requires_grad=True)
    kw = kind_kwargs(name, B, H, Tq, Tk)
    q, k, v = (x.detach().float().requires_grad_() for x in (q64, k64, v64))
    out = qt.attention(q, k, v, **kw)
    want = math_attention(q64, k64, v64, **kw)
    dout = torch.randn_like(want)
    (out * dout.float()).sum().backward()
    (want * dout).sum().backward()
    assert out.dtype == torch.float32 and out.shape == want.shape
    assert (out.double() - want).abs().max() < 2e-5
    for g, w in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert (g.double() - w).abs().max() < 5e-5 * (1 + w.abs().max())


@pytest.mark.parametrize("name", ["causal", "window", "alibi", "bool mask", "key lengths", "additive mask"])
def test_gradcheck_through_the_float64_oracle(name):
    B, H, Tq, Tk = 2, 2, 3, 5
    q = torch.randn(B, H, Tq, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, 1, Tk, 4, dtype=torch.float64, requires_grad=True)   # grouped-query
    v = torch.randn(B, 1, Tk, 3, dtype=torch.float64, requires_grad=True)   # Dv != Dk
    kw = kind_kwargs(name, B, H, Tq, Tk)
    assert torch.autograd.gradcheck(lambda q, k, v: qt.attention(q, k, v, impl="reference", **kw), (q, k, v))


def test_contiguous_float32_tensors_are_not_copied():
    q, k, v = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)
    for x in (q, k, v):
        x.requires_grad_()
    before, numpy_before = qt.tensor_copies(), qt._qkv.input_copies()
    out = qt.attention(q, k, v, causal=True)
    out.backward(torch.randn_like(out))  # (out.sum()'s gradient is an expanded view: that one is copied)
    assert qt.tensor_copies() == before and qt._qkv.input_copies() == numpy_before
    strided = lambda x: x.detach().transpose(2, 3).contiguous().transpose(2, 3)  # same shape, not contiguous
    qt.attention(strided(q), strided(k), v, causal=False)  # converted, once each
    assert qt.tensor_copies() == before + 2


def test_scaled_dot_product_attention_has_pytorch_2s_semantics():
    # is_causal is PyTorch's top-left mask; a bool mask is True where attention is allowed
    q, k, v = torch.randn(3, 5, 7, 8), torch.randn(3, 5, 9, 8), torch.randn(3, 5, 9, 6)
    out = qt.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = math_attention(q.double(), k.double(), v.double(), causal="top-left")
    assert (out.double() - want).abs().max() < 2e-5
    allow = torch.rand(7, 9) < 0.7
    out = qt.scaled_dot_product_attention(q, k, v, attn_mask=allow)
    assert (out.double() - math_attention(q.double(), k.double(), v.double(), bool_mask=allow)).abs().max() < 2e-5
    add = torch.randn(7, 9)
    out = qt.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=0.2)
    assert (out.double() - math_attention(q.double(), k.double(), v.double(), mask=add, scale=0.2)).abs().max() < 2e-5
    assert qt.scaled_dot_product_attention(q[0], k[0], v[0]).shape == (5, 7, 6)
    with pytest.raises(ValueError, match="dropout"):
        qt.scaled_dot_product_attention(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_is_a_drop_in_for_torchs(batch_first):
    E, H, N, L = 32, 4, 3, 9
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first)
    ours = qt.MultiheadAttention(E, H, batch_first=batch_first)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, L, E) if batch_first else torch.randn(L, N, E)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)  # PyTorch's: True = not allowed
    pad = torch.zeros(N, L, dtype=torch.bool)
    pad[1, 6:] = True
    for kw in ({}, {"attn_mask": causal}, {"key_padding_mask": pad}, {"attn_mask": causal, "key_padding_mask": pad}):
        a, wa = ref(x, x, x, **kw)
        b, wb = ours(x, x, x, **kw)
        assert (a - b).abs().max() < 1e-5 and (wa - wb).abs().max() < 1e-5, kw
    a, _ = ref(x, x, x, attn_mask=causal)
    b, _ = ours(x, x, x, attn_mask=causal)
    a.square().sum().backward()
    b.square().sum().backward()
    for (n, p), q in zip(ref.named_parameters(), ours.parameters()):
        assert (p.grad - q.grad).abs().max() < 1e-4 * (1 + p.grad.abs().max()), n


def test_a_training_loop_matches_the_math_path():
    # the same tiny causal language model, its attention from PyTorch or from qkv: equal losses
    def run(attention_module):
        torch.manual_seed(3)
        emb = torch.nn.Embedding(20, 32)
        mha = attention_module(32, 4, batch_first=True)
        head = torch.nn.Linear(32, 20)
        params = list(emb.parameters()) + list(mha.parameters()) + list(head.parameters())
        opt = torch.optim.Adam(params, lr=1e-2)
        data = torch.randint(0, 20, (8, 17), generator=torch.Generator().manual_seed(5))
        mask = torch.ones(16, 16, dtype=torch.bool).triu(1)
        losses = []
        for _ in range(15):
            x = emb(data[:, :-1])
            h, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
            loss = torch.nn.functional.cross_entropy(head(x + h).reshape(-1, 20), data[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    theirs, ours = run(torch.nn.MultiheadAttention), run(qt.MultiheadAttention)
    assert theirs[-1] < theirs[0] - 0.3  # it learns
    assert max(abs(a - b) for a, b in zip(theirs, ours)) < 1e-4, (theirs, ours)
