#!/usr/bin/python3
"""Model parity test: qkv's transformer models (`qkv import / forward / train`) against PyTorch.

    /usr/bin/python3 tests/torch_model_parity.py --qkv build/qkv [--keep DIR] [--verbose]

For every case a float32 PyTorch model is built from torch.nn modules with a fixed seed
(nn.Transformer's encoder / decoder, nn.TransformerEncoderLayer, nn.TransformerEncoder,
nn.Embedding, nn.LayerNorm, nn.Linear; dropout 0, train() mode so that no fast path runs).
Its state_dict goes to <name>.npy files plus a config.json; `qkv import` turns them into a model
directory, and on the same batch (token ids saved with numpy):

  * logits     `qkv forward --out`: max|qkv - torch| / max|torch| <= 1e-4, over the valid
               positions (padded positions are excluded; classifier: all logits);
  * attention  `qkv forward --attention DIR`: every layer's and head's weights (encoder self,
               decoder self, cross) against nn.MultiheadAttention's need_weights (per head):
               qkv's error against the float64 torch model at most twice float32 torch's (floor
               1e-6), every row summing to 1;
  * loss       the loss qkv prints vs F.cross_entropy(ignore_index = pad_id): relative <= 1e-5;
  * gradients  `qkv forward --grads`: for every parameter tensor
               max|qkv - torch| / max(max|torch grad|, 1e-6) <= 1e-3 (one line per model, naming
               the worst tensor; --verbose prints every tensor); the set of gradient files must
               equal the set of torch parameters;
  * training   `qkv fit --steps 10 --lr 1e-3 --weight-decay 0.01` vs torch.optim.AdamW
               (betas 0.9/0.999, eps 1e-8) on the same batch, with --decay-all
               (AdamW(model.parameters())) and with qkv's default groups (decay only for the
               projection / feed-forward / head weights): all 10 losses within 1e-4 relative;
               and once more with the default groups and weight decay 1, where decaying the
               wrong set of parameters would move the losses far beyond the tolerance.
  * bf16       `qkv forward --precision bf16 --grads` and `qkv fit --precision bf16` against the
               torch model whose every F.linear rounds its products' inputs to bfloat16 (forward
               and both backward products; Bf16Linear): logits and each gradient by relative L2
               norm, at most half float32's distance from that reference (where no rounding
               flipped, about 1e-5 of float32's 2e-3); ten training losses within 2e-3 relative.

Cases: (1) nn.Transformer post-norm, relu, sinusoidal positions (scaled embeddings),
encoder-decoder with padded sources and padded targets; (2) nn.Transformer pre-norm, gelu, learned
positions; (3) an nn.TransformerEncoder classifier (mean pooling, key padding from lengths, tanh
gelu); (4) a GPT-style decoder (pre-norm, gelu, learned positions, tied embeddings, a padded row);
(5) a classifier with "first" pooling (forward and gradients only); (6) a raw
nn.Transformer(...).state_dict() imported with --allow-missing: every torch key must be used
unchanged, only the embeddings and the head may be missing, and its logits must match torch's
with the embeddings qkv drew; (7) failure paths: a tensor of the wrong shape must make
`qkv import` fail naming the tensor and both shapes, writing nothing, and the raw state_dict
without --allow-missing must fail naming a missing parameter.

Prints one line per check and, last, "N passed, M failed". Exit status 0 if all passed, 1 if any
failed, 2 on a usage error. Needs only torch, numpy and the standard library.
"""
import argparse
import copy
import functools
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(2)

LOGITS_TOL = 1e-4
ATTENTION_TOL = 1e-6  # weights are in [0, 1]: an absolute floor
GRAD_TOL = 1e-3
GRAD_FLOOR = 1e-6
LOSS_TOL = 1e-5
TRAIN_TOL = 1e-4
TRAIN_BF16_TOL = 2e-3
BF16_SHARE = 0.5
STEPS, LR, WD, BETAS, EPS = 10, 1e-3, 0.01, (0.9, 0.999), 1e-8
STRONG_WD = 1.0  # a third run, default groups: makes the choice of decayed parameters visible
# qkv's Parameter::decay set: the projection, feed-forward and head weights.
DECAY_SUFFIXES = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight",
                  "linear1.weight", "linear2.weight", "lm_head.weight", "classifier.weight")
QKV_TIMEOUT_S = 120


# --------------------------------------------------------------------------------------------
# Reporting and running qkv
# --------------------------------------------------------------------------------------------


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def add(self, name, ok, detail="", problems=()):
        ok = bool(ok) and not problems
        self.passed += ok
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name:44s} {detail}", flush=True)
        for p in problems:
            print(f"     - {p}", flush=True)
        return ok

    def bound(self, name, err, bound, extra=""):
        ok = np.isfinite(err) and err <= bound
        return self.add(name, ok, f"err {err:.3g} {'<=' if ok else '>'} {bound:g}{extra}")


class Runner:
    def __init__(self, qkv, root):
        self.qkv = qkv
        self.root = root

    def dir(self, *parts):
        d = os.path.join(self.root, *parts)
        os.makedirs(d, exist_ok=True)
        return d

    def run(self, args):
        # Passive OpenMP waiting: on a loaded machine (more runnable threads than cores) spinning
        # barriers make these tiny runs up to 50x slower. Results do not depend on it.
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "passive")
        p = subprocess.run([self.qkv] + [str(a) for a in args], capture_output=True, text=True, timeout=QKV_TIMEOUT_S,
                           env=env)
        return p.returncode, p.stdout, p.stderr

    def short(self, text, n=160):
        """For display: the work directory as $WORK, one line, at most n characters."""
        t = " ".join(text.replace(self.root, "$WORK").split())
        return t if len(t) <= n else t[:n - 3] + "..."


def read_safetensors(path):
    """name -> numpy array, from the safetensors layout: u64 header size, JSON header, data."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    dtypes = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[base + a:base + b], dtype=dtypes[v["dtype"]]).reshape(v["shape"])
    return out


def save_weights(d, tensors):
    os.makedirs(d, exist_ok=True)
    for name, t in tensors.items():
        np.save(os.path.join(d, name + ".npy"), t.detach().cpu().numpy().astype(np.float32))


def write_config(path, cfg):
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def rel_max(a, b, floor=0.0):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), floor))


# --------------------------------------------------------------------------------------------
# The torch models
# --------------------------------------------------------------------------------------------


def sinusoidal(T, D):
    # PE[t][2i] = sin(t / 10000^(2i/D)),  PE[t][2i+1] = cos(t / 10000^(2i/D))
    pe = np.zeros((T, D), np.float64)
    j = np.arange(0, D, 2)
    ang = np.arange(T)[:, None] / np.power(10000.0, j / D)[None, :]
    pe[:, 0::2] = np.sin(ang)
    pe[:, 1::2] = np.cos(ang[:, :D // 2])
    return torch.from_numpy(pe.astype(np.float32))


def torch_activation(name):
    if name == "gelu_tanh":
        return functools.partial(F.gelu, approximate="tanh")
    return name  # "relu" / "gelu" (erf)


def key_padding(lengths, T):
    return torch.arange(T)[None, :] >= lengths[:, None]  # True = ignore (torch convention)


def causal_mask(T):
    return nn.Transformer.generate_square_subsequent_mask(T)  # float: 0 / -inf


class Embedder(nn.Module):
    """Shared embedding logic: E[ids] (* sqrt(D)) + positions."""

    def embed_ids(self, ids, table, pos_table):
        x = table(ids)
        if self.scale:
            x = x * float(np.sqrt(self.d_model))
        T = ids.shape[1]
        if self.positional == "sinusoidal":
            x = x + sinusoidal(T, self.d_model)
        elif self.positional == "learned":
            x = x + pos_table.weight[:T]
        return x


class Seq2Seq(Embedder):
    """src_embed / tgt_embed (+ learned positions), nn.Transformer's encoder and decoder, lm_head."""

    def __init__(self, src_vocab, vocab, D, H, n_enc, n_dec, d_ff, act, norm_first, positional, max_len, scale,
                 transformer=None):
        super().__init__()
        self.d_model, self.positional, self.scale = D, positional, scale
        self.src_embed = nn.Embedding(src_vocab, D)
        self.tgt_embed = nn.Embedding(vocab, D)
        if positional == "learned":
            self.src_pos_embed = nn.Embedding(max_len, D)
            self.tgt_pos_embed = nn.Embedding(max_len, D)
        else:
            self.src_pos_embed = self.tgt_pos_embed = None
        t = transformer or nn.Transformer(D, H, n_enc, n_dec, d_ff, dropout=0.0, activation=torch_activation(act),
                                          batch_first=True, norm_first=norm_first)
        self.encoder = t.encoder
        self.decoder = t.decoder
        self.lm_head = nn.Linear(D, vocab, bias=False)

    def forward(self, b):
        src, tgt_in, lengths = b["input"], b["decoder_input"], b["lengths"]
        kpm = key_padding(lengths, src.shape[1])
        mem = self.encoder(self.embed_ids(src, self.src_embed, self.src_pos_embed), src_key_padding_mask=kpm)
        y = self.decoder(self.embed_ids(tgt_in, self.tgt_embed, self.tgt_pos_embed), mem,
                         tgt_mask=causal_mask(tgt_in.shape[1]), memory_key_padding_mask=kpm)
        return self.lm_head(y)


class GPT(Embedder):
    """embed, pos_embed, layers = nn.TransformerEncoderLayer under a causal mask, norm, lm_head."""

    def __init__(self, vocab, D, H, n_layers, d_ff, act, norm_first, positional, max_len, tie):
        super().__init__()
        self.d_model, self.positional, self.scale = D, positional, False
        self.embed = nn.Embedding(vocab, D)
        self.pos_embed = nn.Embedding(max_len, D) if positional == "learned" else None
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(D, H, d_ff, dropout=0.0, activation=torch_activation(act), batch_first=True,
                                       norm_first=norm_first) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.embed.weight

    def forward(self, b):
        ids = b["input"]
        x = self.embed_ids(ids, self.embed, self.pos_embed)
        mask = causal_mask(ids.shape[1])
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        return self.lm_head(self.norm(x))


class Classifier(Embedder):
    """embed, pos_embed, encoder = nn.TransformerEncoder(layer, n, norm=LayerNorm), pooling, classifier."""

    def __init__(self, vocab, D, H, n_layers, d_ff, act, norm_first, positional, max_len, classes, pooling):
        super().__init__()
        self.d_model, self.positional, self.scale, self.pooling = D, positional, False, pooling
        self.embed = nn.Embedding(vocab, D)
        self.pos_embed = nn.Embedding(max_len, D) if positional == "learned" else None
        layer = nn.TransformerEncoderLayer(D, H, d_ff, dropout=0.0, activation=torch_activation(act), batch_first=True,
                                           norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, n_layers, norm=nn.LayerNorm(D), enable_nested_tensor=False)
        self.classifier = nn.Linear(D, classes)

    def forward(self, b):
        ids, lengths = b["input"], b["lengths"]
        h = self.encoder(self.embed_ids(ids, self.embed, self.pos_embed),
                         src_key_padding_mask=key_padding(lengths, ids.shape[1]))
        if self.pooling == "mean":
            valid = (~key_padding(lengths, ids.shape[1])).to(h.dtype)[:, :, None]
            pooled = (h * valid).sum(1) / lengths[:, None].to(h.dtype)
        else:
            pooled = h[:, 0]
        return self.classifier(pooled)


def perturb(model, seed):
    """Biases and norm parameters start at 0 / 1 in torch: make them random so that a swapped or
    ignored bias or norm cannot go unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


class Case:
    def __init__(self, name, model, cfg, batch, valid, ignore_index, train=True):
        self.name, self.model, self.cfg, self.batch = name, model, cfg, batch
        self.valid = valid  # bool mask over logits.shape[:-1]
        self.ignore_index = ignore_index
        self.train = train

    def state_dict(self):
        sd = dict(self.model.state_dict())
        if self.cfg.get("tie_embeddings"):
            sd.pop("lm_head.weight")  # qkv's head is the embedding itself
        return sd

    def torch_batch(self):
        return {k: torch.from_numpy(v) for k, v in self.batch.items()}

    def torch_loss(self, model, tb):
        logits = model(tb)
        V = logits.shape[-1]
        loss = F.cross_entropy(logits.reshape(-1, V), tb["target"].reshape(-1), ignore_index=self.ignore_index)
        return logits, loss


def seq2seq_batch(rng, B, S, T, src_vocab, vocab, src_len, tgt_len, pad, bos):
    src = rng.integers(1, src_vocab, (B, S)).astype(np.int64)
    for b, n in enumerate(src_len):
        src[b, n:] = pad
    tgt = rng.integers(2, vocab, (B, T)).astype(np.int64)
    for b, n in enumerate(tgt_len):
        tgt[b, n:] = pad
    dec_in = np.full((B, T), pad, np.int64)
    dec_in[:, 0] = bos
    dec_in[:, 1:] = tgt[:, :-1]
    return dict(input=src, lengths=np.array(src_len, np.int64), decoder_input=dec_in, target=tgt)


def case_seq2seq_postnorm():
    torch.manual_seed(101)
    rng = np.random.default_rng(101)
    D, H, FF, SV, V, B, S, T, PAD = 32, 4, 64, 40, 50, 3, 9, 8, 0
    model = Seq2Seq(SV, V, D, H, 2, 2, FF, "relu", False, "sinusoidal", 0, scale=True)
    perturb(model, 1101)
    cfg = dict(arch="encoder-decoder", vocab_size=V, src_vocab_size=SV, d_model=D, n_heads=H, d_ff=FF,
               n_encoder_layers=2, n_decoder_layers=2, activation="relu", norm_first=False, final_norm=True,
               positional="sinusoidal", scale_embeddings=True, tie_embeddings=False, dropout=0.0, pad_id=PAD,
               norm_eps=1e-5)
    batch = seq2seq_batch(rng, B, S, T, SV, V, [S, S - 3, 4], [T, 5, 7], PAD, 1)
    return Case("seq2seq-postnorm-relu-sinusoidal", model, cfg, batch, batch["target"] != PAD, PAD)


def case_seq2seq_prenorm():
    torch.manual_seed(202)
    rng = np.random.default_rng(202)
    D, H, FF, V, B, S, T, PAD, MAXLEN = 48, 4, 96, 50, 3, 10, 7, 0, 16
    model = Seq2Seq(V, V, D, H, 2, 2, FF, "gelu", True, "learned", MAXLEN, scale=False)
    perturb(model, 1202)
    cfg = dict(arch="encoder-decoder", vocab_size=V, src_vocab_size=V, d_model=D, n_heads=H, d_ff=FF,
               n_encoder_layers=2, n_decoder_layers=2, activation="gelu", norm_first=True, final_norm=True,
               positional="learned", max_len=MAXLEN, scale_embeddings=False, tie_embeddings=False, dropout=0.0,
               pad_id=PAD)
    batch = seq2seq_batch(rng, B, S, T, V, V, [S - 3, S, S - 1], [T, 4, 6], PAD, 1)
    return Case("seq2seq-prenorm-gelu-learned", model, cfg, batch, batch["target"] != PAD, PAD)


def classifier_batch(rng, B, T, V, C, lengths, pad):
    ids = rng.integers(1, V, (B, T)).astype(np.int64)
    for b, n in enumerate(lengths):
        ids[b, n:] = pad
    return dict(input=ids, lengths=np.array(lengths, np.int64), target=rng.integers(0, C, (B,)).astype(np.int64))


def case_classifier_mean():
    torch.manual_seed(303)
    rng = np.random.default_rng(303)
    D, H, FF, V, C, B, T, MAXLEN = 32, 2, 64, 50, 5, 3, 9, 12
    model = Classifier(V, D, H, 2, FF, "gelu_tanh", False, "learned", MAXLEN, C, "mean")
    perturb(model, 1303)
    cfg = dict(arch="encoder-classifier", vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=2,
               activation="gelu_tanh", norm_first=False, final_norm=True, positional="learned", max_len=MAXLEN,
               num_classes=C, pooling="mean", dropout=0.0, pad_id=0)
    batch = classifier_batch(rng, B, T, V, C, [T, T - 4, 3], 0)
    return Case("classifier-mean-postnorm-gelutanh", model, cfg, batch, np.ones((B,), bool), -100)


def case_classifier_first():
    torch.manual_seed(505)
    rng = np.random.default_rng(505)
    D, H, FF, V, C, B, T = 32, 4, 48, 30, 4, 3, 8
    model = Classifier(V, D, H, 2, FF, "relu", True, "sinusoidal", 0, C, "first")
    perturb(model, 1505)
    cfg = dict(arch="encoder-classifier", vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=2,
               activation="relu", norm_first=True, final_norm=True, positional="sinusoidal", num_classes=C,
               pooling="first", dropout=0.0, pad_id=0)
    batch = classifier_batch(rng, B, T, V, C, [T, 5, 2], 0)
    return Case("classifier-first-prenorm-relu-sinusoidal", model, cfg, batch, np.ones((B,), bool), -100, train=False)


def case_gpt():
    torch.manual_seed(404)
    rng = np.random.default_rng(404)
    D, H, FF, V, B, T, PAD, MAXLEN = 64, 4, 128, 50, 3, 10, 0, 16
    model = GPT(V, D, H, 2, FF, "gelu", True, "learned", MAXLEN, tie=True)
    with torch.no_grad():  # N(0, 1) tied embeddings give logits of std ~sqrt(D): a loss of ~40
        model.embed.weight.mul_(0.2)
        model.pos_embed.weight.mul_(0.2)
    perturb(model, 1404)
    cfg = dict(arch="decoder", vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=2, activation="gelu",
               norm_first=True, final_norm=True, positional="learned", max_len=MAXLEN, tie_embeddings=True,
               dropout=0.0, pad_id=PAD)
    seq = rng.integers(1, V, (B, T + 1)).astype(np.int64)
    lengths = [T, 7, T]  # row 1: 7 real input tokens, then padding
    seq[1, 7:] = PAD
    batch = dict(input=np.ascontiguousarray(seq[:, :T]), target=np.ascontiguousarray(seq[:, 1:]))
    valid = np.arange(T)[None, :] < np.array(lengths)[:, None]
    return Case("gpt-prenorm-gelu-learned-tied", model, cfg, batch, valid, PAD)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def batch_args(d, batch):
    flags = dict(input="--input", lengths="--lengths", decoder_input="--decoder-input", target="--target")
    args = []
    for k, v in batch.items():
        p = os.path.join(d, k + ".npy")
        np.save(p, v)
        args += [flags[k], p]
    return args


def torch_train(case, decay_all, wd=WD):
    m = copy.deepcopy(case.model).train()
    named = list(m.named_parameters())
    if decay_all:
        opt = torch.optim.AdamW(m.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=wd)
    else:
        decay = [p for n, p in named if n.endswith(DECAY_SUFFIXES)]
        rest = [p for n, p in named if not n.endswith(DECAY_SUFFIXES)]
        opt = torch.optim.AdamW([dict(params=decay, weight_decay=wd), dict(params=rest, weight_decay=0.0)],
                                lr=LR, betas=BETAS, eps=EPS)
    tb = case.torch_batch()
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, loss = case.torch_loss(m, tb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses)


def bf16_round(t):
    return t.to(torch.bfloat16).to(torch.float32)


class Bf16Linear(torch.autograd.Function):
    """F.linear as qkv's --precision bf16 computes it: every product's inputs rounded to bfloat16
    (nearest even), sums in float32, in the forward pass (x W^T) and in both backward products
    (dy W and dy^T x); the bias and its gradient in float32."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        y = bf16_round(x) @ bf16_round(w).t()
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dyr = bf16_round(dy)
        dx = dyr @ bf16_round(w)
        dw = dyr.reshape(-1, dy.shape[-1]).t() @ bf16_round(x).reshape(-1, x.shape[-1])
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db


class Bf16Attention(torch.autograd.Function):
    """softmax(qs k^T + mask) v as qkv's attention computes it under --precision bf16 on a CPU with
    AVX512_BF16 (docs/numerics.md): every product's two operands rounded to bfloat16, sums in
    float32, the softmax in float32. Forward: S = bf16(qs) bf16(k)^T + mask, e = exp(S - rowmax),
    out = (bf16(e) bf16(v)) / rowsum(e) (qkv's tiles round e against the running max, which is
    the row's max while a row's keys fit one tile of 96, as here). Backward, from the saved
    output: P = e / rowsum(e), dV = bf16(P)^T bf16(dO), dP = bf16(dO) bf16(v)^T,
    D = rowsum(dO * out), dS = P (dP - D), dqs = bf16(dS) bf16(k), dk = bf16(dS)^T bf16(qs).
    qs: the scaled queries (B*H, Tq, hd); mask: additive, broadcastable to (B*H, Tq, Tk), or None."""

    @staticmethod
    def forward(ctx, qs, k, v, mask):
        s = bf16_round(qs) @ bf16_round(k).transpose(-2, -1)
        if mask is not None:
            s = s + mask
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.exp(s - m)
        l = e.sum(-1, keepdim=True)
        out = (bf16_round(e) @ bf16_round(v)) / l
        ctx.save_for_backward(qs, k, v, e / l, out)
        return out

    @staticmethod
    def backward(ctx, dout):
        qs, k, v, p, out = ctx.saved_tensors
        dor = bf16_round(dout)
        dv = bf16_round(p).transpose(-2, -1) @ dor
        dp = dor @ bf16_round(v).transpose(-2, -1)
        d = (dout * out).sum(-1, keepdim=True)
        ds = bf16_round(p * (dp - d))
        return ds @ bf16_round(k), ds.transpose(-2, -1) @ bf16_round(qs), dv, None


def bf16_multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
                                      bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias,
                                      training=True, key_padding_mask=None, need_weights=True, attn_mask=None,
                                      use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
                                      v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True):
    """F.multi_head_attention_forward for the models here ((T, B, E) inputs, packed projections, no
    bias_k / bias_v / zero attention / static keys, dropout 0), with its attention as Bf16Attention."""
    assert not use_separate_proj_weight and bias_k is None and bias_v is None and not add_zero_attn
    assert static_k is None and static_v is None and (dropout_p == 0.0 or not training)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    hd = embed_dim // num_heads
    q, k, v = F._in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
    heads = lambda x, t: x.contiguous().view(t, bsz * num_heads, hd).transpose(0, 1)  # (B*H, T, hd)
    q, k, v = heads(q, tgt_len), heads(k, src_len), heads(v, src_len)
    mask = None
    if attn_mask is not None:
        mask = attn_mask if attn_mask.dtype != torch.bool else \
            torch.zeros(attn_mask.shape).masked_fill(attn_mask, float("-inf"))
        if mask.dim() == 2:
            mask = mask.unsqueeze(0)
    if key_padding_mask is not None:
        kp = key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1).reshape(bsz * num_heads, 1, src_len)
        kp = torch.zeros(kp.shape).masked_fill(kp, float("-inf")) if kp.dtype == torch.bool else kp
        mask = kp if mask is None else mask + kp
    o = Bf16Attention.apply(q / math.sqrt(hd), k, v, mask)
    o = o.transpose(0, 1).contiguous().view(tgt_len * bsz, embed_dim)
    o = F.linear(o, out_proj_weight, out_proj_bias).view(tgt_len, bsz, embed_dim)
    return o, None


class bf16_products:
    """While it lives, every F.linear is Bf16Linear and, where qkv's attention multiplies in bf16
    too (`attention`: as `qkv forward --precision bf16` reports), every nn.MultiheadAttention's
    attention is Bf16Attention."""

    def __init__(self, attention):
        self.attention = attention

    def __enter__(self):
        self.plain = F.linear, F.multi_head_attention_forward
        F.linear = lambda x, w, b=None: Bf16Linear.apply(x, w, b)
        if self.attention:
            F.multi_head_attention_forward = bf16_multi_head_attention_forward

    def __exit__(self, *exc):
        F.linear, F.multi_head_attention_forward = self.plain


def torch_train_bf16(case, decay_all, attention, wd=WD):
    """torch_train with every F.linear (nn.Linear and nn.MultiheadAttention's projections) as Bf16Linear
    (and the attention as Bf16Attention where qkv's is bf16)."""
    with bf16_products(attention):
        return torch_train(case, decay_all, wd)


def torch_attention(case, dtype=torch.float32):
    """Every nn.MultiheadAttention's weights per head on the case's batch, named as qkv's
    `forward --attention` files: {"encoder.0.self": (B, H, Tq, Tk), ...}."""
    m = copy.deepcopy(case.model).to(dtype).train()
    names = {}
    for n, mod in m.named_modules():
        if isinstance(mod, nn.MultiheadAttention):
            parts = n.split(".")  # encoder.layers.0.self_attn, decoder.layers.1.multihead_attn, layers.0.self_attn
            i = parts.index("layers")
            stack = parts[i - 1] if i > 0 else "decoder"  # the GPT's layers are a decoder's
            names[mod] = f"{stack}.{parts[i + 1]}.{'cross' if parts[-1] == 'multihead_attn' else 'self'}"
    got = {}
    for mod, name in names.items():
        def forward(*args, _orig=mod.forward, _name=name, **kw):
            kw["need_weights"], kw["average_attn_weights"] = True, False
            o, w = _orig(*args, **kw)
            got[_name] = w.detach().numpy()
            return o, w
        mod.forward = forward
    with torch.no_grad():
        m(case.torch_batch())
    return got


def check_attention(case, adir, rep):
    """qkv's weights (recomputed from the flash kernel's logsumexp) against torch's need_weights,
    every layer and head, over the query rows whose keys both mask the same way: all rows but a
    decoder-only model's padded positions (qkv masks the padding keys, the torch GPT does not).
    The bound is the project's rule: qkv's error against the float64 model at most twice torch's
    own float32 error (and ATTENTION_TOL absolute, whichever is larger: the floor for a case where
    float32 torch happens to be exact)."""
    name = case.name
    t = torch_attention(case)
    t64 = torch_attention(case, torch.float64)
    q_files = sorted(f[:-4] for f in os.listdir(adir) if f.endswith(".npy")) if os.path.isdir(adir) else []
    if sorted(t) != q_files:
        rep.add(f"{name}/attention", False, "", [f"maps: qkv {q_files}, torch {sorted(t)}"])
        return
    worst, worst_name, problems, rows = -1.0, "", [], 0
    for n in q_files:
        q = np.load(os.path.join(adir, n + ".npy"))
        w = t[n]
        if q.shape != w.shape:
            problems.append(f"{n}: shape {q.shape}, torch {w.shape}")
            continue
        valid = np.ones(q.shape[0:1] + q.shape[2:3], bool)  # (B, Tq)
        if case.cfg["arch"] == "decoder":
            valid = case.valid
        pick = lambda a: a.transpose(0, 2, 1, 3)[valid]  # (rows, H, Tk)
        qv, wv, w64 = pick(q), pick(w), pick(t64[n])
        rows += qv.shape[0] * qv.shape[1]
        sums = qv.sum(-1)
        if not np.all(np.abs(sums - 1) <= 1e-5):
            problems.append(f"{n}: a row sums to {sums.flat[np.argmax(np.abs(sums - 1))]:.7f}")
        e, e32 = float(np.max(np.abs(qv - w64))), float(np.max(np.abs(wv - w64)))
        bound = max(2 * e32, ATTENTION_TOL)
        if not (e <= bound):
            problems.append(f"{n}: max |qkv - torch64| {e:.3g} > {bound:.3g} (torch float32: {e32:.3g})")
        if not (e - bound <= worst):
            worst, worst_name = e - bound, f"{n}: {e:.3g}, torch float32 {e32:.3g}"
    rep.add(f"{name}/attention", not problems and len(q_files) > 0,
            f"max |w_qkv - w_torch64| within max(2 x torch float32's, {ATTENTION_TOL:g})  ({len(q_files)} maps, "
            f"{rows} rows of every head; closest: {worst_name})", problems)


def run_model_case(case, runner, rep, verbose):
    name = case.name
    d = runner.dir(name)
    wdir, mdir, gdir = os.path.join(d, "weights"), os.path.join(d, "model"), os.path.join(d, "grads")
    save_weights(wdir, case.state_dict())
    cfg_path = os.path.join(d, "config.json")
    write_config(cfg_path, case.cfg)
    rc, out, err = runner.run(["import", "--config", cfg_path, "--weights", wdir, "--out", mdir])
    if not rep.add(f"{name}/import", rc == 0, runner.short(out), [] if rc == 0 else [f"exit {rc}: {err.strip()}"]):
        return
    bargs = batch_args(runner.dir(name, "batch"), case.batch)
    logits_path = os.path.join(d, "logits.npy")
    adir = os.path.join(d, "attention")
    rc, out, err = runner.run(["forward", "--model", mdir] + bargs + ["--out", logits_path, "--grads", gdir,
                                                                     "--attention", adir])
    if not rep.add(f"{name}/forward", rc == 0, runner.short(out), [] if rc == 0 else [f"exit {rc}: {err.strip()}"]):
        return

    # torch: logits, loss and gradients of the untrained model
    m = copy.deepcopy(case.model).train()
    tb = case.torch_batch()
    t_logits, t_loss = case.torch_loss(m, tb)
    t_loss.backward()
    t_logits = t_logits.detach().numpy()

    q_logits = np.load(logits_path)
    if q_logits.shape != t_logits.shape:
        rep.add(f"{name}/logits", False, "", [f"shape {q_logits.shape}, torch {t_logits.shape}"])
    else:
        v = case.valid
        rep.bound(f"{name}/logits", rel_max(q_logits[v], t_logits[v]), LOGITS_TOL,
                  f"  ({int(v.sum())} of {v.size} positions)")

    check_attention(case, adir, rep)

    mloss = re.search(r"loss (\S+)", out)
    q_loss = float(mloss.group(1)) if mloss else float("nan")
    rep.bound(f"{name}/loss", abs(q_loss - t_loss.item()) / abs(t_loss.item()), LOSS_TOL,
              f"  (qkv {q_loss:.7f}, torch {t_loss.item():.7f})")

    t_grads = {n: p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
               for n, p in m.named_parameters()}
    q_names = {f[:-4] for f in os.listdir(gdir) if f.endswith(".npy")}
    problems = []
    if q_names != set(t_grads):
        problems.append(f"gradient names differ: only qkv {sorted(q_names - set(t_grads))}, "
                        f"only torch {sorted(set(t_grads) - q_names)}")
    worst, worst_name = -1.0, ""
    for n in sorted(set(t_grads) & q_names):
        e = rel_max(np.load(os.path.join(gdir, n + ".npy")), t_grads[n], GRAD_FLOOR)
        if verbose:
            rep.bound(f"{name}/grad/{n}", e, GRAD_TOL)
        if not (e <= GRAD_TOL):
            problems.append(f"{n}: err {e:.3g} > {GRAD_TOL:g}")
        if not (e <= worst):
            worst, worst_name = e, n
    rep.add(f"{name}/grads", worst <= GRAD_TOL,
            f"err {worst:.3g} {'<=' if worst <= GRAD_TOL else '>'} {GRAD_TOL:g}  (worst of {len(t_grads)} tensors: "
            f"{worst_name})", problems)

    if not case.train:
        return
    # With weight decay 0.01, 10 steps of lr 1e-3 shrink a weight by only 1e-4: decaying the wrong
    # parameters changes the losses by about the tolerance. Weight decay 1 makes the parameter
    # groups visible (the line shows how far decay-all would be).
    for decay_all, wd in ((True, WD), (False, WD), (False, STRONG_WD)):
        label = ("decay-all" if decay_all else "decay-groups") + ("" if wd == WD else f"-wd{wd:g}")
        lpath = os.path.join(d, f"losses_{label}.npy")
        args = ["fit", "--model", mdir] + bargs + ["--steps", STEPS, "--lr", LR, "--weight-decay", wd,
                                                     "--beta1", BETAS[0], "--beta2", BETAS[1], "--eps", EPS,
                                                     "--losses", lpath]
        if decay_all:
            args.append("--decay-all")
        rc, out, err = runner.run(args)
        if rc != 0:
            rep.add(f"{name}/train-{label}", False, "", [f"exit {rc}: {err.strip()}"])
            continue
        q = np.load(lpath)
        t = torch_train(case, decay_all, wd)
        if q.shape != t.shape:
            rep.add(f"{name}/train-{label}", False, "", [f"{q.shape[0]} losses, torch {t.shape[0]}"])
            continue
        e = float(np.max(np.abs(q - t) / np.abs(t)))
        extra = f"  (loss {t[0]:.4f} -> {t[-1]:.4f} in {STEPS} steps)"
        if wd != WD:
            other = torch_train(case, True, wd)
            extra = f"  (loss {t[0]:.4f} -> {t[-1]:.4f}; decay-all: {np.max(np.abs(other - t) / np.abs(t)):.2g} off)"
        rep.bound(f"{name}/train-{label}", e, TRAIN_TOL, extra)

    # --precision bf16 against the same model whose linear layers round their products' inputs to
    # bfloat16 (Bf16Linear). Both sum in float32 in different orders, and a sum that lands on the
    # other side of a bfloat16 rounding boundary moves that value by 2^-8 relative; once one value
    # differs, later roundings flip more often, so the two drift apart through the layers (a
    # largest-element bound would be meaningless). The logits and every gradient are compared by
    # relative L2 norm, ||qkv - ref|| / ||ref||, against float32's distance from the same reference
    # (the rounding's own effect): qkv must be at most BF16_SHARE of it. Where no rounding flipped,
    # qkv is 1e-5 or less from the reference and float32 about 2e-3; the line shows both.
    bdir = os.path.join(d, "grads_bf16")
    blogits = os.path.join(d, "logits_bf16.npy")
    rc, out, err = runner.run(["forward", "--model", mdir] + bargs + ["--out", blogits, "--grads", bdir,
                                                                     "--precision", "bf16"])
    if not rep.add(f"{name}/forward-bf16", rc == 0, runner.short(out), [] if rc == 0 else [f"exit {rc}: {err.strip()}"]):
        return
    # qkv says whether its attention multiplies in bf16 on this CPU (AVX512_BF16); the reference follows
    attention = "linear layers and attention" in out
    if "bf16 products:" not in out:
        rep.add(f"{name}/forward-bf16-attention", False, "", ["qkv forward --precision bf16 did not say which products "
                                                              f"are bf16: {out.strip()}"])
        return
    with bf16_products(attention):
        mb = copy.deepcopy(case.model).train()
        b_logits, b_loss = case.torch_loss(mb, tb)
        b_loss.backward()
    rel = lambda a, b: float(np.linalg.norm((a - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-30))
    b_logits = b_logits.detach().numpy()
    v = case.valid
    q_b = np.load(blogits)
    e, f32_off = rel(q_b[v], b_logits[v]), rel(t_logits[v], b_logits[v])
    ok = e <= BF16_SHARE * f32_off
    rep.add(f"{name}/logits-bf16", ok, f"rel L2 {e:.3g}; float32's {f32_off:.3g} (at most {BF16_SHARE:g} of it)",
            [] if ok else [f"err {e:.3g} > {BF16_SHARE:g} x float32's {f32_off:.3g}"])
    problems, worst, worst_name = [], -1.0, ""
    for n, p in mb.named_parameters():
        ref = p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
        if not np.any(ref):
            continue
        e = rel(np.load(os.path.join(bdir, n + ".npy")), ref)
        off = rel(t_grads[n], ref)
        if not (e <= BF16_SHARE * off):
            problems.append(f"{n}: rel L2 {e:.3g} > {BF16_SHARE:g} x float32's {off:.3g}")
        if not (e / off <= worst):
            worst, worst_name = e / off, f"{n}: {e:.3g} against float32's {off:.3g}"
    rep.add(f"{name}/grads-bf16", not problems, f"worst share of float32's distance {worst:.3g} ({worst_name})",
            problems)

    # and ten training steps follow the reference's losses (summation order compounding over steps)
    lpath = os.path.join(d, "losses_bf16.npy")
    rc, out, err = runner.run(["fit", "--model", mdir] + bargs + ["--steps", STEPS, "--lr", LR, "--weight-decay", WD,
                                                                  "--beta1", BETAS[0], "--beta2", BETAS[1], "--eps",
                                                                  EPS, "--decay-all", "--precision", "bf16",
                                                                  "--losses", lpath])
    if rc != 0:
        rep.add(f"{name}/train-bf16", False, "", [f"exit {rc}: {err.strip()}"])
        return
    q = np.load(lpath)
    t = torch_train_bf16(case, True, attention)
    e = float(np.max(np.abs(q - t) / np.abs(t)))
    rep.bound(f"{name}/train-bf16", e, TRAIN_BF16_TOL, f"  (loss {t[0]:.4f} -> {t[-1]:.4f})")


def raw_transformer_case(runner, rep):
    """A raw nn.Transformer state_dict, no embeddings or head: --allow-missing."""
    name = "raw-nn.Transformer"
    torch.manual_seed(606)
    rng = np.random.default_rng(606)
    D, H, FF, V, B, S, T = 32, 4, 64, 50, 3, 8, 7
    t = nn.Transformer(D, H, 2, 1, FF, dropout=0.0, batch_first=True)
    perturb(t, 1606)
    raw = t.state_dict()
    d = runner.dir(name)
    wdir, mdir = os.path.join(d, "weights"), os.path.join(d, "model")
    save_weights(wdir, raw)
    cfg = dict(arch="encoder-decoder", vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_encoder_layers=2,
               n_decoder_layers=1, activation="relu", norm_first=False, positional="sinusoidal", dropout=0.0, pad_id=0)
    cfg_path = os.path.join(d, "config.json")
    write_config(cfg_path, cfg)

    # Without --allow-missing: an error naming a missing parameter, nothing written.
    rc, out, err = runner.run(["import", "--config", cfg_path, "--weights", wdir, "--out", mdir])
    problems = []
    if rc == 0:
        problems.append("exit 0")
    if "src_embed.weight" not in err or "missing" not in err:
        problems.append(f"stderr does not name the missing src_embed.weight: {err.strip()!r}")
    if os.path.exists(mdir):
        problems.append("wrote the model directory despite the error")
        shutil.rmtree(mdir)
    rep.add(f"{name}/import-without-allow-missing", not problems, f"rc={rc} '{runner.short(err)}'", problems)

    rc, out, err = runner.run(["import", "--config", cfg_path, "--weights", wdir, "--out", mdir, "--allow-missing",
                               "--seed", "7"])
    if not rep.add(f"{name}/import --allow-missing", rc == 0, runner.short(out), [] if rc == 0 else [f"exit {rc}: {err.strip()}"]):
        return
    st = read_safetensors(os.path.join(mdir, "model.safetensors"))
    problems = []
    missing = sorted(set(raw) - set(st))
    if missing:
        problems.append(f"torch keys not in the model: {missing}")
    extra = sorted(set(st) - set(raw))
    if extra != ["lm_head.weight", "src_embed.weight", "tgt_embed.weight"]:
        problems.append(f"qkv parameters not from the state_dict: {extra} "
                        "(expected only src_embed, tgt_embed, lm_head)")
    for k in sorted(set(raw) & set(st)):
        a = raw[k].numpy()
        if st[k].shape != a.shape or not np.array_equal(st[k], a):
            problems.append(f"{k}: stored {st[k].shape} differs from the torch tensor {tuple(a.shape)}")
    rep.add(f"{name}/keys", not problems, f"all {len(raw)} nn.Transformer keys used unchanged; "
            f"initialised: {', '.join(extra)}", problems)

    # Its logits, with the embeddings and head qkv drew, against torch.
    model = Seq2Seq(V, V, D, H, 2, 1, FF, "relu", False, "sinusoidal", 0, scale=False, transformer=t)
    with torch.no_grad():
        for k in ("src_embed.weight", "tgt_embed.weight", "lm_head.weight"):
            model.get_parameter(k).copy_(torch.from_numpy(st[k].copy()))
    batch = seq2seq_batch(rng, B, S, T, V, V, [S, 5, S - 1], [T, 6, 3], 0, 1)
    bargs = batch_args(runner.dir(name, "batch"), {k: v for k, v in batch.items() if k != "target"})
    lpath = os.path.join(d, "logits.npy")
    rc, out, err = runner.run(["forward", "--model", mdir] + bargs + ["--out", lpath])
    if rc != 0:
        rep.add(f"{name}/logits", False, "", [f"forward exit {rc}: {err.strip()}"])
        return
    with torch.no_grad():
        tl = model.train()({k: torch.from_numpy(v) for k, v in batch.items()}).numpy()
    v = batch["target"] != 0
    rep.bound(f"{name}/logits", rel_max(np.load(lpath)[v], tl[v]), LOGITS_TOL)


def wrong_shape_case(case, runner, rep):
    """One tensor of the wrong shape: import fails, naming the tensor and both shapes."""
    name = "import-wrong-shape"
    d = runner.dir(name)
    wdir, mdir = os.path.join(d, "weights"), os.path.join(d, "model")
    sd = case.state_dict()
    save_weights(wdir, sd)
    bad = "layers.1.linear1.weight"
    good_shape = tuple(sd[bad].shape)
    bad_shape = (good_shape[0], good_shape[1] + 3)
    np.save(os.path.join(wdir, bad + ".npy"), np.zeros(bad_shape, np.float32))
    cfg_path = os.path.join(d, "config.json")
    write_config(cfg_path, case.cfg)
    rc, out, err = runner.run(["import", "--config", cfg_path, "--weights", wdir, "--out", mdir])
    problems = []
    if rc == 0:
        problems.append("exit 0")
    for s in (bad, str(bad_shape), str(good_shape)):
        if s not in err:
            problems.append(f"stderr does not mention {s}: {err.strip()!r}")
    if os.path.exists(mdir):
        problems.append("wrote the model directory despite the error")
    rep.add(name, not problems, f"rc={rc} '{runner.short(err)}'", problems)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True, help="path to the qkv binary")
    ap.add_argument("--keep", default="", help="keep the weights, models, batches and outputs in this directory")
    ap.add_argument("--only", default="", help="run only cases whose name contains this text")
    ap.add_argument("--verbose", action="store_true", help="one line per gradient tensor")
    args = ap.parse_args()
    qkv = os.path.abspath(args.qkv)
    if not (os.path.isfile(qkv) and os.access(qkv, os.X_OK)):
        print(f"torch_model_parity: {qkv} is not an executable", file=sys.stderr)
        return 2
    t0 = time.time()
    print(f"qkv {qkv}; torch {torch.__version__}, numpy {np.__version__}", flush=True)
    rep = Report()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        root, cleanup = os.path.abspath(args.keep), None
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="qkv_model_parity_")
        root = cleanup.name
    try:
        runner = Runner(qkv, root)
        builders = [case_seq2seq_postnorm, case_seq2seq_prenorm, case_classifier_mean, case_gpt,
                    case_classifier_first]
        gpt = None
        for build in builders:
            case = None
            try:
                case = build()
                if case.cfg["arch"] == "decoder":
                    gpt = case
                if args.only and args.only not in case.name:
                    continue
                run_model_case(case, runner, rep, args.verbose)
            except Exception as e:  # a crash in one case must not hide the others
                rep.add(case.name if case else build.__name__, False, "", [f"exception: {type(e).__name__}: {e}"])
        for cname, fn in (("raw-nn.Transformer", lambda: raw_transformer_case(runner, rep)),
                          ("import-wrong-shape", lambda: wrong_shape_case(gpt, runner, rep))):
            if args.only and args.only not in cname:
                continue
            try:
                fn()
            except Exception as e:
                rep.add(cname, False, "", [f"exception: {type(e).__name__}: {e}"])
    finally:
        if cleanup is not None:
            cleanup.cleanup()
    print(f"runtime {time.time() - t0:.1f} s", flush=True)
    print(f"{rep.passed} passed, {rep.failed} failed", flush=True)
    return 0 if rep.failed == 0 and rep.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
