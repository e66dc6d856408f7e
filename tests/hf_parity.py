#!/usr/bin/python3
"""Hugging Face folders: qkv against reference models written here from the published semantics.

    /usr/bin/python3 tests/hf_parity.py --qkv build/qkv [--keep DIR] [--verbose]

For each family a float32 reference is written in PyTorch from the semantics of Hugging Face's
modeling code (not copied from it): GPT-2 (GPT2LMHeadModel: learned positions, pre-norm, fused
c_attn stored as Conv1D (in, out), gelu_new, ln_f, the head tied to wte) and Llama
(LlamaForCausalLM: RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU). The test draws
random weights at shapes of its own (odd vocabularies, fewer key/value heads than heads, an
explicit head_dim, a padded row), writes an HF folder (config.json + model.safetensors, or
shards with model.safetensors.index.json; F32, F16 or BF16), and checks:

  * logits     `qkv forward --model HF_DIR --out`: max|qkv - ref| / max|ref| <= 1e-4 over the
               real positions (half-precision folders: against the reference run on the same
               rounded weights);
  * gradients  `qkv forward --target --grads`: the loss within 1e-5 relative and every
               parameter's gradient within 1e-3 of max|ref grad|, mapped back to HF's names;
  * decoding   `qkv forward --generate 6`: greedy tokens with qkv's key/value cache equal the
               reference's greedy decoding by full recomputation;
  * commands   on folders with their tokenizers (GPT-2's tokenizer.json, Llama-2's with <s>
               first, BERT's vocab.txt, Marian's source.spm + target.spm + vocab.json):
               `qkv generate`, `qkv translate` (greedy) write the reference's greedy text;
               `qkv fill-mask` the reference's top tokens and probabilities (1e-4 relative);
               `qkv classify` the reference's label and probability;
  * bad folders: a missing shard, an index naming a tensor its shard lacks, a BF16 tensor of the
               wrong byte length, an unsupported model_type, a config key that changes the math
               (rope_scaling, scale_attn_by_inverse_layer_idx), a misshapen and a missing tensor:
               exit status 2 (qkv's error status) and a message naming what is wrong; never a crash.

Prints one line per check and, last, "N passed, M failed". Exit status 0 if all passed, 1 if any
failed. Needs only torch, numpy and the standard library.
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(2)
torch.set_flush_denormal(True)

LOGITS_TOL = 1e-4
LOSS_TOL = 1e-5
GRAD_TOL = 1e-3


# ---- safetensors, written from the format's description --------------------------------------

def to_bytes(t, dtype):
    t = t.detach().contiguous()
    if dtype == "F32":
        return t.float().numpy().tobytes()
    if dtype == "F16":
        return t.half().numpy().tobytes()
    if dtype == "BF16":
        return t.bfloat16().view(torch.int16).numpy().tobytes()
    raise ValueError(dtype)


def rounded(t, dtype):
    """The float32 values a tensor stored as `dtype` holds."""
    if dtype == "F16":
        return t.half().float()
    if dtype == "BF16":
        return t.bfloat16().float()
    return t.float()


def write_safetensors(path, tensors, dtype="F32", corrupt=None):
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        b = to_bytes(t, dtype)
        if corrupt == name:
            b = b[:-2]  # one element short
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_folder(d, config, tensors, dtype="F32", shards=1, corrupt=None):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors, dtype, corrupt)
        return
    names = list(tensors)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        write_safetensors(os.path.join(d, file), {n: tensors[n] for n in part}, dtype, corrupt)
        for n in part:
            weight_map[n] = file
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)


def save_npy(path, a):
    np.save(path, a)


# ---- reference models --------------------------------------------------------------------------

def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attend(q, k, v, lengths, causal=True):
    """q (B, H, Tq, hd), k/v (B, H, Tk, hd): causal or not, keys at or past a row's length blocked."""
    B, H, T, hd = q.shape
    Tk = k.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    base = torch.ones(T, Tk, dtype=torch.bool)
    allowed = (base.tril() if causal else base)[None, None].expand(B, 1, T, Tk).clone()
    for b in range(B):
        allowed[b, :, :, lengths[b]:] = False
    s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s, dim=-1)
    w = torch.nan_to_num(w, nan=0.0)  # a padded query row sees no key; its output is not compared
    return w @ v


def gpt2_forward(W, cfg, ids, lengths, prefix):
    p = prefix
    B, T = ids.shape
    D, H = cfg["n_embd"], cfg["n_head"]
    hd = D // H
    x = W[p + "wte.weight"][ids] + W[p + "wpe.weight"][torch.arange(T)][None]
    eps = cfg["layer_norm_epsilon"]
    for i in range(cfg["n_layer"]):
        h = p + "h.%d." % i
        a = F.layer_norm(x, (D,), W[h + "ln_1.weight"], W[h + "ln_1.bias"], eps)
        qkv = a @ W[h + "attn.c_attn.weight"] + W[h + "attn.c_attn.bias"]  # Conv1D: x W, W (in, out)
        q, k, v = qkv.split(D, dim=-1)
        heads = lambda t: t.view(B, T, H, hd).transpose(1, 2)
        o = attend(heads(q), heads(k), heads(v), lengths).transpose(1, 2).reshape(B, T, D)
        x = x + o @ W[h + "attn.c_proj.weight"] + W[h + "attn.c_proj.bias"]
        a = F.layer_norm(x, (D,), W[h + "ln_2.weight"], W[h + "ln_2.bias"], eps)
        m = gelu_new(a @ W[h + "mlp.c_fc.weight"] + W[h + "mlp.c_fc.bias"])
        x = x + m @ W[h + "mlp.c_proj.weight"] + W[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (D,), W[p + "ln_f.weight"], W[p + "ln_f.bias"], eps)
    return x @ W[p + "wte.weight"].T


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(t, theta, positions):
    """rotate-half RoPE: pairs (i, i + hd/2) rotated by position * theta^(-2i/hd)."""
    hd = t.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = positions.double()[:, None] * inv[None]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    x1, x2 = t[..., : hd // 2], t[..., hd // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return t * cos + rot * sin


def llama_forward(W, cfg, ids, lengths, prefix):
    p = prefix
    B, T = ids.shape
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    G = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", D // H)
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    x = W[p + "embed_tokens.weight"][ids]
    pos = torch.arange(T)
    for i in range(cfg["num_hidden_layers"]):
        h = p + "layers.%d." % i
        a = rms_norm(x, W[h + "input_layernorm.weight"], eps)
        q = (a @ W[h + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (a @ W[h + "self_attn.k_proj.weight"].T).view(B, T, G, hd).transpose(1, 2)
        v = (a @ W[h + "self_attn.v_proj.weight"].T).view(B, T, G, hd).transpose(1, 2)
        q, k = rope(q, theta, pos), rope(k, theta, pos)
        # grouped-query: query head j reads key/value head j // (H / G)
        k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        o = attend(q, k, v, lengths).transpose(1, 2).reshape(B, T, H * hd)
        x = x + o @ W[h + "self_attn.o_proj.weight"].T
        a = rms_norm(x, W[h + "post_attention_layernorm.weight"], eps)
        m = F.silu(a @ W[h + "mlp.gate_proj.weight"].T) * (a @ W[h + "mlp.up_proj.weight"].T)
        x = x + m @ W[h + "mlp.down_proj.weight"].T
    x = rms_norm(x, W[p + "norm.weight"], eps)
    head = W[p + "embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return x @ head.T


def heads(t, H):
    B, T, W = t.shape
    return t.view(B, T, H, W // H).transpose(1, 2)


def merge(t):
    B, H, T, hd = t.shape
    return t.transpose(1, 2).reshape(B, T, H * hd)


def lin(x, W, name):
    return x @ W[name + ".weight"].T + W[name + ".bias"]


def ln(x, W, name, eps):
    return F.layer_norm(x, (x.shape[-1],), W[name + ".weight"], W[name + ".bias"], eps)


def bert_forward(W, cfg, ids, lengths, prefix, head):
    p, B, T = prefix, ids.shape[0], ids.shape[1]
    H, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
    x = W[p + "embeddings.word_embeddings.weight"][ids] + W[p + "embeddings.position_embeddings.weight"][:T][None] \
        + W[p + "embeddings.token_type_embeddings.weight"][0]
    x = ln(x, W, p + "embeddings.LayerNorm", eps)
    for i in range(cfg["num_hidden_layers"]):
        h = p + "encoder.layer.%d." % i
        q, k, v = (heads(lin(x, W, h + "attention.self." + n), H) for n in ("query", "key", "value"))
        x = ln(x + lin(merge(attend(q, k, v, lengths, causal=False)), W, h + "attention.output.dense"), W,
               h + "attention.output.LayerNorm", eps)
        f = F.gelu(lin(x, W, h + "intermediate.dense"))
        x = ln(x + lin(f, W, h + "output.dense"), W, h + "output.LayerNorm", eps)
    if head == "mlm":
        t = ln(F.gelu(lin(x, W, "cls.predictions.transform.dense")), W, "cls.predictions.transform.LayerNorm", eps)
        return t @ W[p + "embeddings.word_embeddings.weight"].T + W["cls.predictions.bias"]
    if head == "classifier":
        pooled = torch.tanh(lin(x[:, 0], W, p + "pooler.dense"))
        return lin(pooled, W, "classifier")
    return x


def split_half_positions(T, D):
    enc = np.array([[pos / np.power(10000, 2 * (j // 2) / D) for j in range(D)] for pos in range(T)])
    out = np.zeros((T, D))
    h = (D + 1) // 2
    out[:, :h] = np.sin(enc[:, 0::2])
    out[:, h:] = np.cos(enc[:, 1::2])
    return torch.tensor(out, dtype=torch.float32)


def marian_forward(W, cfg, src, src_len, tgt):
    """MarianMTModel's logits, or PegasusForConditionalGeneration's (model_type "pegasus": the same
    layers pre-norm, each stack ending in its layer_norm)."""
    D, H = cfg["d_model"], cfg["encoder_attention_heads"]
    E = W["model.shared.weight"]
    scale = math.sqrt(D) if cfg.get("scale_embedding") else 1.0
    act = F.silu if cfg["activation_function"] == "swish" else F.relu
    eps = 1e-5
    pre = cfg["model_type"] == "pegasus"

    def sub(x, f, norm):  # a sublayer with its residual: post-norm (Marian) or pre-norm (Pegasus)
        return x + f(ln(x, W, norm, eps)) if pre else ln(x + f(x), W, norm, eps)

    def attn(x, mem, pre, lengths, causal):
        q = heads(lin(x, W, pre + "q_proj"), H)
        k, v = heads(lin(mem, W, pre + "k_proj"), H), heads(lin(mem, W, pre + "v_proj"), H)
        return lin(merge(attend(q, k, v, lengths, causal)), W, pre + "out_proj")

    x = E[src] * scale + split_half_positions(src.shape[1], D)[None]
    for i in range(cfg["encoder_layers"]):
        h = "model.encoder.layers.%d." % i
        x = sub(x, lambda t: attn(t, t, h + "self_attn.", src_len, False), h + "self_attn_layer_norm")
        x = sub(x, lambda t: lin(act(lin(t, W, h + "fc1")), W, h + "fc2"), h + "final_layer_norm")
    if pre:
        x = ln(x, W, "model.encoder.layer_norm", eps)
    y = E[tgt] * scale + split_half_positions(tgt.shape[1], D)[None]
    full = [tgt.shape[1]] * tgt.shape[0]
    for i in range(cfg["decoder_layers"]):
        h = "model.decoder.layers.%d." % i
        y = sub(y, lambda t: attn(t, t, h + "self_attn.", full, True), h + "self_attn_layer_norm")
        y = sub(y, lambda t: attn(t, x, h + "encoder_attn.", src_len, False), h + "encoder_attn_layer_norm")
        y = sub(y, lambda t: lin(act(lin(t, W, h + "fc1")), W, h + "fc2"), h + "final_layer_norm")
    if pre:
        y = ln(y, W, "model.decoder.layer_norm", eps)
    return y @ E.T + W["final_logits_bias"][0]


def bert_weights(cfg, g, prefix, head, old_names=False):
    D, V, L, Fi = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    r = lambda *s, std=0.3: torch.randn(*s, generator=g) * std
    p = prefix
    W = {p + "embeddings.word_embeddings.weight": r(V, D),
         p + "embeddings.position_embeddings.weight": r(cfg["max_position_embeddings"], D),
         p + "embeddings.token_type_embeddings.weight": r(cfg["type_vocab_size"], D),
         p + "embeddings.LayerNorm.weight": 1 + r(D, std=0.1), p + "embeddings.LayerNorm.bias": r(D, std=0.1),
         p + "embeddings.position_ids": torch.arange(cfg["max_position_embeddings"])[None].float()}

    def linear(name, o, i):
        W[name + ".weight"], W[name + ".bias"] = r(o, i), r(o, std=0.1)

    def norm(name):
        W[name + ".weight"], W[name + ".bias"] = 1 + r(D, std=0.1), r(D, std=0.1)

    for i in range(L):
        h = p + "encoder.layer.%d." % i
        for n in ("query", "key", "value"):
            linear(h + "attention.self." + n, D, D)
        linear(h + "attention.output.dense", D, D)
        norm(h + "attention.output.LayerNorm")
        linear(h + "intermediate.dense", Fi, D)
        linear(h + "output.dense", D, Fi)
        norm(h + "output.LayerNorm")
    if head == "classifier":
        linear(p + "pooler.dense", D, D)
        linear("classifier", cfg["num_labels"], D)
    if head == "mlm":
        linear("cls.predictions.transform.dense", D, D)
        norm("cls.predictions.transform.LayerNorm")
        W["cls.predictions.bias"] = r(V, std=0.1)
        W["cls.predictions.decoder.weight"] = W[p + "embeddings.word_embeddings.weight"].clone()
        W["cls.predictions.decoder.bias"] = W["cls.predictions.bias"].clone()
        W["cls.seq_relationship.weight"], W["cls.seq_relationship.bias"] = r(2, D), r(2)  # unused by MLM
    return W


def old_layernorm_names(W):
    """LayerNorm.weight / .bias as the first BERT checkpoints named them: gamma / beta."""
    return {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
            for k, v in W.items()}


def marian_weights(cfg, g):
    D, V, Fi = cfg["d_model"], cfg["vocab_size"], cfg["encoder_ffn_dim"]
    r = lambda *s, std=0.3: torch.randn(*s, generator=g) * std
    W = {"model.shared.weight": r(V, D), "final_logits_bias": r(1, V, std=0.1)}
    W["model.encoder.embed_tokens.weight"] = W["model.shared.weight"].clone()
    W["model.decoder.embed_tokens.weight"] = W["model.shared.weight"].clone()
    P = cfg["max_position_embeddings"]
    W["model.encoder.embed_positions.weight"] = split_half_positions(P, D)
    W["model.decoder.embed_positions.weight"] = split_half_positions(P, D)

    def linear(name, o, i):
        W[name + ".weight"], W[name + ".bias"] = r(o, i), r(o, std=0.1)

    def norm(name):
        W[name + ".weight"], W[name + ".bias"] = 1 + r(D, std=0.1), r(D, std=0.1)

    for side, L in (("encoder", cfg["encoder_layers"]), ("decoder", cfg["decoder_layers"])):
        for i in range(L):
            h = "model.%s.layers.%d." % (side, i)
            attns = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
            for a in attns:
                for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    linear(h + a + "." + n, D, D)
                norm(h + a + "_layer_norm")
            linear(h + "fc1", Fi, D)
            linear(h + "fc2", D, Fi)
            norm(h + "final_layer_norm")
    if cfg["model_type"] == "pegasus":
        norm("model.encoder.layer_norm")
        norm("model.decoder.layer_norm")
    W["lm_head.weight"] = W["model.shared.weight"].clone()
    return W


def gpt2_weights(cfg, g, prefix, with_head, buffers):
    D, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
    Fi = cfg.get("n_inner") or 4 * D
    r = lambda *s, std=0.3: torch.randn(*s, generator=g) * std
    W = {prefix + "wte.weight": r(V, D), prefix + "wpe.weight": r(P, D)}
    for i in range(L):
        h = prefix + "h.%d." % i
        W.update({h + "ln_1.weight": 1 + r(D, std=0.1), h + "ln_1.bias": r(D, std=0.1),
                  h + "attn.c_attn.weight": r(D, 3 * D), h + "attn.c_attn.bias": r(3 * D, std=0.1),
                  h + "attn.c_proj.weight": r(D, D), h + "attn.c_proj.bias": r(D, std=0.1),
                  h + "ln_2.weight": 1 + r(D, std=0.1), h + "ln_2.bias": r(D, std=0.1),
                  h + "mlp.c_fc.weight": r(D, Fi), h + "mlp.c_fc.bias": r(Fi, std=0.1),
                  h + "mlp.c_proj.weight": r(Fi, D), h + "mlp.c_proj.bias": r(D, std=0.1)})
        if buffers:
            W[h + "attn.bias"] = torch.ones(P, P).tril()[None, None]
            W[h + "attn.masked_bias"] = torch.tensor(-1e4)
    W[prefix + "ln_f.weight"] = 1 + r(D, std=0.1)
    W[prefix + "ln_f.bias"] = r(D, std=0.1)
    if with_head:
        W["lm_head.weight"] = W[prefix + "wte.weight"].clone()
    return W


def llama_weights(cfg, g, prefix):
    D, V, L, Fi = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    H = cfg["num_attention_heads"]
    G = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", D // H)
    r = lambda *s, std=0.3: torch.randn(*s, generator=g) * std
    W = {prefix + "embed_tokens.weight": r(V, D)}
    for i in range(L):
        h = prefix + "layers.%d." % i
        W.update({h + "input_layernorm.weight": 1 + r(D, std=0.1),
                  h + "self_attn.q_proj.weight": r(H * hd, D), h + "self_attn.k_proj.weight": r(G * hd, D),
                  h + "self_attn.v_proj.weight": r(G * hd, D), h + "self_attn.o_proj.weight": r(D, H * hd),
                  h + "post_attention_layernorm.weight": 1 + r(D, std=0.1),
                  h + "mlp.gate_proj.weight": r(Fi, D), h + "mlp.up_proj.weight": r(Fi, D),
                  h + "mlp.down_proj.weight": r(D, Fi)})
    W[prefix + "norm.weight"] = 1 + r(D, std=0.1)
    if not cfg.get("tie_word_embeddings", False):
        W["lm_head.weight"] = r(V, D)
    return W


# qkv parameter name -> (HF tensors stacked along rows, each transposed or not): the test's own
# statement of how the names map, to compare gradients.
def gpt2_names(cfg, prefix):
    p = prefix
    out = {"embed.weight": [(p + "wte.weight", False)], "pos_embed.weight": [(p + "wpe.weight", False)],
           "norm.weight": [(p + "ln_f.weight", False)], "norm.bias": [(p + "ln_f.bias", False)]}
    for i in range(cfg["n_layer"]):
        h, l = p + "h.%d." % i, "layers.%d." % i
        for q, hf, t in [("norm1.weight", "ln_1.weight", False), ("norm1.bias", "ln_1.bias", False),
                         ("self_attn.in_proj_weight", "attn.c_attn.weight", True),
                         ("self_attn.in_proj_bias", "attn.c_attn.bias", False),
                         ("self_attn.out_proj.weight", "attn.c_proj.weight", True),
                         ("self_attn.out_proj.bias", "attn.c_proj.bias", False),
                         ("norm2.weight", "ln_2.weight", False), ("norm2.bias", "ln_2.bias", False),
                         ("linear1.weight", "mlp.c_fc.weight", True), ("linear1.bias", "mlp.c_fc.bias", False),
                         ("linear2.weight", "mlp.c_proj.weight", True), ("linear2.bias", "mlp.c_proj.bias", False)]:
            out[l + q] = [(h + hf, t)]
    return out


def llama_names(cfg, prefix):
    p = prefix
    out = {"embed.weight": [(p + "embed_tokens.weight", False)], "norm.weight": [(p + "norm.weight", False)]}
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = [("lm_head.weight", False)]
    for i in range(cfg["num_hidden_layers"]):
        h, l = p + "layers.%d." % i, "layers.%d." % i
        out[l + "norm1.weight"] = [(h + "input_layernorm.weight", False)]
        out[l + "self_attn.q_proj_weight"] = [(h + "self_attn.q_proj.weight", False)]
        out[l + "self_attn.k_proj_weight"] = [(h + "self_attn.k_proj.weight", False)]
        out[l + "self_attn.v_proj_weight"] = [(h + "self_attn.v_proj.weight", False)]
        out[l + "self_attn.out_proj.weight"] = [(h + "self_attn.o_proj.weight", False)]
        out[l + "norm2.weight"] = [(h + "post_attention_layernorm.weight", False)]
        out[l + "linear1.weight"] = [(h + "mlp.gate_proj.weight", False), (h + "mlp.up_proj.weight", False)]
        out[l + "linear2.weight"] = [(h + "mlp.down_proj.weight", False)]
    return out


def attention_names(out, l, h, q, k, v, o):
    out[l + "q_proj_weight"] = [(h + q + ".weight", False)]
    out[l + "k_proj_weight"] = [(h + k + ".weight", False)]
    out[l + "v_proj_weight"] = [(h + v + ".weight", False)]
    out[l + "in_proj_bias"] = [(h + q + ".bias", False), (h + k + ".bias", False), (h + v + ".bias", False)]
    out[l + "out_proj.weight"] = [(h + o + ".weight", False)]
    out[l + "out_proj.bias"] = [(h + o + ".bias", False)]


def pair(out, q, hf):
    out[q + ".weight"] = [(hf + ".weight", False)]
    out[q + ".bias"] = [(hf + ".bias", False)]


def bert_names(cfg, prefix, head):
    p = prefix
    out = {"embed.weight": [(p + "embeddings.word_embeddings.weight", False)],
           "pos_embed.weight": [(p + "embeddings.position_embeddings.weight", False)],
           "type_embed.weight": [(p + "embeddings.token_type_embeddings.weight", False)]}
    pair(out, "embed_norm", p + "embeddings.LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        h, l = p + "encoder.layer.%d." % i, "encoder.layers.%d." % i
        attention_names(out, l + "self_attn.", h, "attention.self.query", "attention.self.key", "attention.self.value",
                        "attention.output.dense")
        pair(out, l + "norm1", h + "attention.output.LayerNorm")
        pair(out, l + "linear1", h + "intermediate.dense")
        pair(out, l + "linear2", h + "output.dense")
        pair(out, l + "norm2", h + "output.LayerNorm")
    if head == "classifier":
        pair(out, "pooler", p + "pooler.dense")
        pair(out, "classifier", "classifier")
    if head == "mlm":
        pair(out, "mlm.transform", "cls.predictions.transform.dense")
        pair(out, "mlm.norm", "cls.predictions.transform.LayerNorm")
        out["mlm.bias"] = [("cls.predictions.bias", False)]
    return out


def marian_names(cfg):
    out = {"shared_embed.weight": [("model.shared.weight", False)], "lm_head.bias": [("final_logits_bias", False)]}
    for side, L in (("encoder", cfg["encoder_layers"]), ("decoder", cfg["decoder_layers"])):
        for i in range(L):
            h, l = "model.%s.layers.%d." % (side, i), "%s.layers.%d." % (side, i)
            attention_names(out, l + "self_attn.", h, "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                            "self_attn.out_proj")
            pair(out, l + "norm1", h + "self_attn_layer_norm")
            if side == "decoder":
                attention_names(out, l + "multihead_attn.", h, "encoder_attn.q_proj", "encoder_attn.k_proj",
                                "encoder_attn.v_proj", "encoder_attn.out_proj")
                pair(out, l + "norm2", h + "encoder_attn_layer_norm")
            pair(out, l + "linear1", h + "fc1")
            pair(out, l + "linear2", h + "fc2")
            pair(out, l + ("norm3" if side == "decoder" else "norm2"), h + "final_layer_norm")
    if cfg["model_type"] == "pegasus":
        pair(out, "encoder.norm", "model.encoder.layer_norm")
        pair(out, "decoder.norm", "model.decoder.layer_norm")
    return out


# ---- the checks --------------------------------------------------------------------------------

class Checks:
    def __init__(self, qkv, root, verbose):
        self.qkv, self.root, self.verbose = qkv, root, verbose
        self.passed = self.failed = 0

    def run(self, args):
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "passive")
        p = subprocess.run([self.qkv, "--threads", "2"] + [str(a) for a in args], capture_output=True, text=True,
                           timeout=600, env=env)
        return p.returncode, p.stdout, p.stderr

    def run_input(self, args, stdin):
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "passive")
        p = subprocess.run([self.qkv, "--threads", "2"] + [str(a) for a in args], capture_output=True, text=True,
                           timeout=600, env=env, input=stdin)
        return p.returncode, p.stdout, p.stderr

    def report(self, ok, what, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        line = ("PASS " if ok else "FAIL ") + what + ("  " + detail if detail else "")
        print(line.replace(self.root, "$WORK"), flush=True)


def after_eos(tokens, eos):
    """As qkv reports generated rows: a row stops at the eos, -1 after it."""
    for b in range(tokens.shape[0]):
        hits = (tokens[b] == eos).nonzero()
        if len(hits):
            tokens[b, hits[0, 0] + 1:] = -1
    return tokens


def greedy(forward, ids, n):
    """Greedy decoding by full recomputation: every step reruns the whole prefix."""
    seq = ids.clone()
    out = []
    for _ in range(n):
        T = seq.shape[1]
        logits = forward(seq, [T] * seq.shape[0])
        nxt = logits[:, -1].argmax(-1)
        out.append(nxt)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
    return torch.stack(out, dim=1)


def model_case(ck, name, family, cfg, dtype="F32", shards=1, prefix="", with_head=False, buffers=False, seed=0):
    work = os.path.join(ck.root, name)
    os.makedirs(work, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    W = gpt2_weights(cfg, g, prefix, with_head, buffers) if family == "gpt2" else llama_weights(cfg, g, prefix)
    folder = os.path.join(work, "hf")
    write_folder(folder, cfg, W, dtype, shards)
    # the reference runs on the values the folder holds
    Wr = {k: rounded(v, dtype).requires_grad_(True) for k, v in W.items()}
    fwd = (lambda ids, lengths: gpt2_forward(Wr, cfg, ids, lengths, prefix)) if family == "gpt2" else \
        (lambda ids, lengths: llama_forward(Wr, cfg, ids, lengths, prefix))
    V = cfg["vocab_size"]
    B, T = 3, 9
    ids = torch.randint(0, V, (B, T), generator=g)
    lengths = [T, 6, 4]
    save_npy(os.path.join(work, "ids.npy"), ids.numpy().astype(np.int64))
    save_npy(os.path.join(work, "lengths.npy"), np.array(lengths, dtype=np.int64))
    # targets: the next token, padding ignored through -100 (GPT-2 and Llama have no pad_id here)
    target = torch.randint(0, V, (B, T), generator=g)
    for b in range(B):
        target[b, lengths[b]:] = -100
    save_npy(os.path.join(work, "target.npy"), target.numpy().astype(np.int64))

    ref = fwd(ids, lengths)
    logits_path, grads = os.path.join(work, "logits.npy"), os.path.join(work, "grads")
    rc, out, err = ck.run(["forward", "--model", folder, "--input", os.path.join(work, "ids.npy"), "--lengths",
                           os.path.join(work, "lengths.npy"), "--target", os.path.join(work, "target.npy"),
                           "--out", logits_path, "--grads", grads])
    if rc != 0:
        ck.report(False, name + " forward", "exit %d: %s" % (rc, err.strip()))
        return
    compare_logits(ck, name, torch.from_numpy(np.load(logits_path)), ref, lengths)
    loss = F.cross_entropy(ref.reshape(-1, V), target.reshape(-1), ignore_index=-100)
    loss.backward()
    compare_loss(ck, name, out, loss)
    compare_grads(ck, name, Wr, gpt2_names(cfg, prefix) if family == "gpt2" else llama_names(cfg, prefix), grads)
    export_check(ck, name, folder, Wr)

    # greedy decoding with the cache against full recomputation
    gen_path = os.path.join(work, "generated.npy")
    prompt = ids[:, :5]
    save_npy(os.path.join(work, "prompt.npy"), prompt.numpy().astype(np.int64))
    rc, out, err = ck.run(["forward", "--model", folder, "--input", os.path.join(work, "prompt.npy"),
                           "--generate", 6, "--generated", gen_path])
    if rc != 0:
        ck.report(False, name + " decoding", "exit %d: %s" % (rc, err.strip()))
        return
    with torch.no_grad():
        want = greedy(fwd, prompt, 6)
    want = after_eos(want, cfg.get("eos_token_id"))
    got = torch.from_numpy(np.load(gen_path))
    ck.report(torch.equal(got, want), name + " decoding", "cached greedy %s vs recomputed %s" %
              (got.tolist()[0], want.tolist()[0]))


def compare_grads(ck, name, Wr, names, grads):
    files = {f[:-4] for f in os.listdir(grads)}
    worst, worst_name, missing = 0.0, "", sorted(set(names) ^ files)
    for qn, parts in names.items():
        if qn not in files:
            continue
        want = torch.cat([(Wr[h].grad.T if t else Wr[h].grad).reshape(-1) for h, t in parts])
        gq = torch.from_numpy(np.load(os.path.join(grads, qn + ".npy"))).reshape(-1)
        e = (gq - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
        if ck.verbose:
            print("   grad %-40s %.2e" % (qn, e))
        if e > worst:
            worst, worst_name = e, qn
    ck.report(worst <= GRAD_TOL and not missing, name + " gradients",
              "worst %.2e in %s (tol %.0e)%s" % (worst, worst_name, GRAD_TOL,
                                                 "; names differ: %s" % missing if missing else ""))


def compare_logits(ck, name, got, ref, valid):
    """max |got - ref| / max |ref| over the rows valid[b] positions of each batch row."""
    num = den = 0.0
    for b, n in enumerate(valid):
        num = max(num, (got[b, :n] - ref[b, :n].detach()).abs().max().item())
        den = max(den, ref[b, :n].detach().abs().max().item())
    rel = num / den
    ck.report(rel <= LOGITS_TOL, name + " logits", "max rel err %.2e (tol %.0e) over %s, max|ref| %.2f" %
              (rel, LOGITS_TOL, "x".join(map(str, ref.shape)), den))


def compare_loss(ck, name, out, loss):
    qloss = float(out.split("loss ")[1].split()[0]) if "loss " in out else float("nan")
    lrel = abs(qloss - loss.item()) / abs(loss.item())
    ck.report(lrel <= LOSS_TOL, name + " loss", "qkv %.7g torch %.7g rel %.1e" % (qloss, loss.item(), lrel))


def bert_case(ck, name, cfg, head, dtype="F32", prefix="bert.", old_names=False, seed=0):
    work = os.path.join(ck.root, name)
    os.makedirs(work, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    W = bert_weights(cfg, g, prefix, head)
    folder = os.path.join(work, "hf")
    write_folder(folder, cfg, old_layernorm_names(W) if old_names else W, dtype)
    Wr = {k: rounded(v, dtype).requires_grad_(k.endswith("weight") or k.endswith("bias")) for k, v in W.items()}
    V, B, T = cfg["vocab_size"], 3, 8
    lengths = [T, 5, 3]
    ids = torch.randint(1, V, (B, T), generator=g)  # 0 is [PAD]
    for b in range(B):
        ids[b, lengths[b]:] = 0
    save_npy(os.path.join(work, "ids.npy"), ids.numpy().astype(np.int64))
    ref = bert_forward(Wr, cfg, ids, lengths, prefix, head)
    args = ["forward", "--model", folder, "--input", os.path.join(work, "ids.npy"), "--out",
            os.path.join(work, "logits.npy")]
    if head == "mlm":
        target = torch.full((B, T), -100)
        for b in range(B):
            for t in range(0, lengths[b], 2):
                target[b, t] = int(torch.randint(0, V, (1,), generator=g))
        loss = F.cross_entropy(ref.reshape(-1, V), target.reshape(-1), ignore_index=-100)
    elif head == "classifier":
        target = torch.randint(0, cfg["num_labels"], (B,), generator=g)
        loss = F.cross_entropy(ref, target)
    else:
        target = loss = None
    if target is not None:
        save_npy(os.path.join(work, "target.npy"), target.numpy().astype(np.int64))
        args += ["--target", os.path.join(work, "target.npy"), "--grads", os.path.join(work, "grads")]
    rc, out, err = ck.run(args)
    if rc != 0:
        ck.report(False, name + " forward", "exit %d: %s" % (rc, err.strip()))
        return
    got = torch.from_numpy(np.load(os.path.join(work, "logits.npy")))
    if head == "mlm":  # the next-sentence head is in the folder, not in the model: named in a note
        ck.report("not used by this model (cls.seq_relationship.bias, cls.seq_relationship.weight)" in err,
                  name + " unused tensors noted", " ".join(err.split())[-160:])
    if head == "classifier":
        compare_logits(ck, name, got[:, None], ref[:, None], [1] * B)
    else:
        compare_logits(ck, name, got, ref, lengths)
    if loss is not None:
        loss.backward()
        compare_loss(ck, name, out, loss)
        names = bert_names(cfg, prefix, head)
        if old_names:
            names = {q: [(k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"), t)
                         for k, t in parts] for q, parts in names.items()}
            Wr = old_layernorm_names(Wr)
        compare_grads(ck, name, Wr, names, os.path.join(work, "grads"))
    export_check(ck, name, folder, old_layernorm_names(Wr) if old_names else Wr)


def marian_case(ck, name, cfg, dtype="F32", seed=0):
    work = os.path.join(ck.root, name)
    os.makedirs(work, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    W = marian_weights(cfg, g)
    folder = os.path.join(work, "hf")
    write_folder(folder, cfg, W, dtype)
    Wr = {k: rounded(v, dtype).requires_grad_(True) for k, v in W.items()}
    V, pad, eos, start = cfg["vocab_size"], cfg["pad_token_id"], cfg["eos_token_id"], cfg["decoder_start_token_id"]
    B, S, T = 3, 9, 7
    src_len = [S, 6, 4]
    # ordinary tokens: below Marian's pad (its last id; eos 0), above Pegasus's pad 0 and eos 1
    lo, hi = (1, pad) if pad == V - 1 else (2, V)
    src = torch.randint(lo, hi, (B, S), generator=g)
    for b in range(B):
        src[b, src_len[b] - 1] = eos  # Marian's tokenizer ends a source with </s>
        src[b, src_len[b]:] = pad
    tgt_full = torch.randint(lo, hi, (B, T), generator=g)
    dec_in = torch.cat([torch.full((B, 1), start), tgt_full[:, :-1]], dim=1)
    target = tgt_full.clone()
    target[2, 4:] = pad  # a shorter target: its padding is not scored
    for name_, a in (("src", src), ("dec", dec_in), ("target", target)):
        save_npy(os.path.join(work, name_ + ".npy"), a.numpy().astype(np.int64))
    ref = marian_forward(Wr, cfg, src, src_len, dec_in)
    rc, out, err = ck.run(["forward", "--model", folder, "--input", os.path.join(work, "src.npy"), "--decoder-input",
                           os.path.join(work, "dec.npy"), "--target", os.path.join(work, "target.npy"), "--out",
                           os.path.join(work, "logits.npy"), "--grads", os.path.join(work, "grads")])
    if rc != 0:
        ck.report(False, name + " forward", "exit %d: %s" % (rc, err.strip()))
        return
    compare_logits(ck, name, torch.from_numpy(np.load(os.path.join(work, "logits.npy"))), ref, [T] * B)
    loss = F.cross_entropy(ref.reshape(-1, V), target.reshape(-1), ignore_index=pad)
    loss.backward()
    compare_loss(ck, name, out, loss)
    compare_grads(ck, name, Wr, marian_names(cfg), os.path.join(work, "grads"))
    export_check(ck, name, folder, Wr)
    # greedy translation with the cache against full recomputation
    rc, out, err = ck.run(["forward", "--model", folder, "--input", os.path.join(work, "src.npy"), "--decoder-input",
                           os.path.join(work, "dec.npy"), "--generate", 6, "--generated",
                           os.path.join(work, "generated.npy")])
    if rc != 0:
        ck.report(False, name + " decoding", "exit %d: %s" % (rc, err.strip()))
        return
    with torch.no_grad():
        seq = torch.full((B, 1), start)
        for _ in range(6):
            nxt = marian_forward(Wr, cfg, src, src_len, seq)[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
        want = after_eos(seq[:, 1:].clone(), eos)
    got = torch.from_numpy(np.load(os.path.join(work, "generated.npy")))
    ck.report(torch.equal(got, want), name + " decoding", "cached greedy %s vs recomputed %s" %
              (got.tolist()[0], want.tolist()[0]))


# ---- the commands on folders with their tokenizers -----------------------------------------------

def byte_level_vocab():
    """GPT-2-shaped byte-level BPE of 100 tokens + <|endoftext|> (100): the letters, "Ġ" and
    "Ġ" + letter (merged from the two), then filler tokens that no text produces."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    toks = letters + ["\u0120"] + ["\u0120" + c for c in letters]
    toks += ["q%d" % i for i in range(100 - len(toks))]
    merges = ["\u0120 " + c for c in letters]
    return {t: i for i, t in enumerate(toks)}, merges


def metaspace_vocab():
    """Llama-2-shaped: <unk> <s> </s>, "▁", the letters, "▁" + letter, fillers up to 97."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    toks = ["<unk>", "<s>", "</s>", "\u2581"] + letters + ["\u2581" + c for c in letters]
    toks += ["Q%d" % i for i in range(97 - len(toks))]
    return {t: i for i, t in enumerate(toks)}, [["\u2581", c] for c in letters]


def write_tokenizer(folder, model, added, normalizer, pre, post, decoder, config):
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
           "pre_tokenizer": pre, "post_processor": post, "decoder": decoder, "model": model}
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def special(i, content):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def generate_case(ck, name, family, cfg, prefix, seed):
    work = os.path.join(ck.root, name)
    folder = os.path.join(work, "hf")
    os.makedirs(work, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    W = gpt2_weights(cfg, g, prefix, False, False) if family == "gpt2" else llama_weights(cfg, g, prefix)
    write_folder(folder, cfg, W)
    if family == "gpt2":
        vocab, merges = byte_level_vocab()
        bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        write_tokenizer(folder, {"type": "BPE", "vocab": vocab, "merges": merges, "unk_token": None},
                        [special(100, "<|endoftext|>")], None, bl, bl, bl,
                        {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})
        inv = {i: t for t, i in vocab.items()}
        prompt = [vocab[c] for c in ["t", "h", "e", "\u0120c", "a", "t"]]  # "the cat": the, Ġc a t
        fwd = lambda ids, lengths: gpt2_forward(W, cfg, ids, lengths, prefix)
        decode = lambda ids: "".join(inv[i] for i in ids if i in inv).replace("\u0120", " ")
    else:
        vocab, merges = metaspace_vocab()
        sA = {"Sequence": {"id": "A", "type_id": 0}}
        write_tokenizer(folder, {"type": "BPE", "vocab": vocab, "merges": merges, "unk_token": "<unk>", "fuse_unk": True,
                                 "byte_fallback": False},
                        [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
                        {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                             {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
                        None,
                        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, sA],
                         "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
                        {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                          {"type": "ByteFallback"}, {"type": "Fuse"},
                                                          {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
        inv = {i: t for t, i in vocab.items()}
        prompt = [1] + [vocab[t] for t in ["\u2581t", "h", "e", "\u2581c", "a", "t"]]  # <s> ▁t h e ▁c a t
        fwd = lambda ids, lengths: llama_forward(W, cfg, ids, lengths, prefix)
        decode = lambda ids: "".join(inv[i] for i in ids if i > 2).replace("\u2581", " ")[1:]
    rc, out, err = ck.run(["tokenize", "--model", folder, "--text", "the cat", "--special", "--ids"])
    got_ids = [int(x) for x in out.split()] if rc == 0 else err.strip()
    ck.report(got_ids == prompt, name + " tokenize", "%s vs %s" % (got_ids, prompt))
    rc, out, err = ck.run(["generate", "--model", folder, "--prompt", "the cat", "--max-len", 8])
    with torch.no_grad():
        gen = greedy(fwd, torch.tensor([prompt]), 8)[0].tolist()
    eos = cfg["eos_token_id"]
    if eos in gen:
        gen = gen[:gen.index(eos)]
    want = decode(prompt + gen)
    ck.report(rc == 0 and out.rstrip("\n") == want, name + " generate",
              "qkv %r vs reference %r %s" % (out.rstrip("\n"), want, err.strip()[-200:] if rc else ""))
    if family == "llama":  # the benchmarks take a folder too (figures, not checked)
        rc, out, err = ck.run(["bench", "decode", "--model", folder, "--prompt", 4, "--tokens", 4, "--reps", 1, "--json"])
        ck.report(rc == 0 and json.loads(out)["tokens_per_s"] > 0, name + " bench decode --model", (out + err).strip()[-120:])
        rc, out, err = ck.run(["bench", "train", "--model", folder, "--batch", 2, "--seq", 8, "--steps", 1, "--json"])
        ck.report(rc == 0 and json.loads(out)["tokens_per_s"] > 0, name + " bench train --model", (out + err).strip()[-120:])


def bert_vocab():
    words = ["word%d" % i for i in range(78)]
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words


def bert_text_case(ck, name, cfg, head, seed):
    work = os.path.join(ck.root, name)
    folder = os.path.join(work, "hf")
    os.makedirs(work, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    W = bert_weights(cfg, g, "bert.", head)
    write_folder(folder, cfg, W)
    vocab = bert_vocab()
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    idx = {t: i for i, t in enumerate(vocab)}
    if head == "mlm":
        text = "Word3 word7 [MASK] word12 . [MASK]"
        ids = [2, idx["word3"], idx["word7"], 4, idx["word12"], 1, 4, 3]  # "." is not in the vocabulary: [UNK]
        rc, out, err = ck.run(["fill-mask", "--model", folder, "--text", text, "--top-k", 5, "--json"])
        if rc != 0:
            ck.report(False, name + " fill-mask", err.strip())
            return
        res = json.loads(out)
        ck.report(res["ids"] == ids, name + " fill-mask ids", "%s vs %s" % (res["ids"], ids))
        with torch.no_grad():
            logits = bert_forward(W, cfg, torch.tensor([ids]), [len(ids)], "bert.", "mlm")[0]
        worst, same = 0.0, True
        for m in res["masks"]:
            p = torch.softmax(logits[m["position"]].double(), -1)
            top = torch.topk(p, 5)
            same &= [c["id"] for c in m["top"]] == top.indices.tolist()
            for c, want in zip(m["top"], top.values.tolist()):
                worst = max(worst, abs(c["prob"] - want) / want)
        ck.report(len(res["masks"]) == 2 and same and worst <= LOGITS_TOL, name + " fill-mask",
                  "2 masks: top-5 ids %s, worst probability error %.2e" % ("equal" if same else "differ", worst))
        try:  # the Python module, when this build has one (PYTHONPATH=build/python): the command's answer
            import qkv as qkv_python
        except ImportError:
            qkv_python = None
        if qkv_python is not None:
            got = qkv_python.Model.load(folder).fill_mask(text, top_k=5)
            want = [[(c["id"], c["token"], c["sequence"], c["prob"]) for c in m["top"]] for m in res["masks"]]
            have = [[(c["id"], c["token"], c["sequence"], c["prob"]) for c in m] for m in got]
            ck.report(have == want, name + " fill-mask from Python (import qkv) is the command's", "%s vs %s" % (have, want))
        embedding_check(ck, name, folder, W, cfg, idx)
        # refusals: no mask in the text, a bad --top-k, a model that is not a masked-language model
        for args, needle in ((["--text", "word1 word2"], "no mask token [MASK]"),
                             (["--text", "[MASK]", "--top-k", 0], "--top-k"),
                             (["--text", "[MASK]", "--top-k", "nan"], "--top-k")):
            rc, out, err = ck.run(["fill-mask", "--model", folder] + args)
            ck.report(rc == 2 and needle in err, name + " fill-mask refuses " + " ".join(map(str, args)), err.strip())
    else:
        lines = ["word3 word5 word9", "Word70 word1", ""]
        rc, out, err = ck.run_input(["classify", "--model", folder], "\n".join(lines) + "\n")
        if rc != 0:
            ck.report(False, name + " classify", err.strip())
            return
        rows = [l.split("\t") for l in out.rstrip("\n").split("\n")]
        ok = len(rows) == len(lines)
        for line, row in zip(lines, rows):
            ids = [2] + [idx[w.lower()] for w in line.split()] + [3]
            with torch.no_grad():
                p = torch.softmax(bert_forward(W, cfg, torch.tensor([ids]), [len(ids)], "bert.", "classifier")[0].double(), -1)
            label = cfg["id2label"][str(int(p.argmax()))]
            ok &= row[0] == label and abs(float(row[1]) - float(p.max())) < 1.5e-3
        ck.report(ok, name + " classify", "qkv %s" % rows)
        rc, out, err = ck.run(["fill-mask", "--model", folder, "--text", "[MASK]"])
        ck.report(rc == 2 and "fill-mask needs a masked-language model" in err, name + " fill-mask refuses a classifier",
                  err.strip())


def embedding_check(ck, name, folder, W, cfg, idx):
    """qkv serve's /v1/embeddings on the folder made a sentence-transformers model (modules.json: the
    transformer, a Pooling module, a Normalize module): mean pooling over every token ([CLS] and
    [SEP] included), then L2-normalised, against the PyTorch reference's final hidden states; and
    CLS pooling when 1_Pooling/config.json says so."""
    import http.client
    texts = ["word3 word7 word12", "Word70 word1"]
    ids = [[2] + [idx[w.lower()] for w in t.split()] + [3] for t in texts]
    with torch.no_grad():
        hidden = [bert_forward(W, cfg, torch.tensor([i]), [len(i)], "bert.", None)[0].double() for i in ids]
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}], f)
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    for mode in ("mean", "cls"):
        with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
            json.dump({"word_embedding_dimension": cfg["hidden_size"], "pooling_mode_cls_token": mode == "cls",
                       "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
                       "pooling_mode_mean_sqrt_len_tokens": False}, f)
        want = [torch.nn.functional.normalize(h.mean(0) if mode == "mean" else h[0], dim=0) for h in hidden]
        proc = subprocess.Popen([ck.qkv, "--threads", "2", "serve", "--model", folder, "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline().strip()
            if not line.startswith("http://"):
                ck.report(False, name + " embeddings (" + mode + "): the server did not start", proc.stderr.read()[-300:])
                continue
            host, port = line[len("http://"):].rstrip("/").split(":")
            c = http.client.HTTPConnection(host, int(port), timeout=120)
            c.request("POST", "/v1/embeddings", body=json.dumps({"input": texts}),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            body = json.loads(r.read())
            if r.status != 200:
                ck.report(False, name + " embeddings (" + mode + ")", str(body))
                continue
            got = [torch.tensor(d["embedding"], dtype=torch.float64) for d in body["data"]]
            worst = max(float((g - w).abs().max()) for g, w in zip(got, want))
            ck.report(len(got) == 2 and worst <= LOGITS_TOL and body["usage"]["prompt_tokens"] == sum(map(len, ids)),
                      name + " embeddings, sentence-transformers %s pooling, normalised" % mode,
                      "max |qkv - reference| = %.2e" % worst)
            if mode == "mean":  # an encoder serves no task route; its attention and health answer
                answers = {}
                for path, req in (("/v1/completions", {"prompt": "word1"}), ("/v1/attention", {"text": "word1 word2"}),
                                  ("/health", None)):
                    c.request("POST" if req else "GET", path, body=json.dumps(req) if req else None,
                              headers={"Content-Type": "application/json"})
                    r = c.getresponse()
                    answers[path] = (r.status, json.loads(r.read()))
                ck.report(answers["/v1/completions"][0] == 400 and "encoder" in answers["/v1/completions"][1]["error"]["message"]
                          and answers["/v1/attention"][0] == 200 and answers["/health"][1].get("task") == "embeddings",
                          name + " an encoder's server: 400 on completions, attention and health answer",
                          str({k: v[0] for k, v in answers.items()}))
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def marian_text_case(ck, name, cfg, seed):
    import sentencepiece as spm
    import io as _io
    work = os.path.join(ck.root, name)
    folder = os.path.join(work, "hf")
    os.makedirs(work, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    W = marian_weights(cfg, g)
    write_folder(folder, cfg, W)
    corpus = ["the cat sat on the mat", "a dog ran to the cat", "das ist ein Haus", "der Hund sah die Katze"] * 30
    models = []
    for _ in range(2):
        buf = _io.BytesIO()
        spm.set_random_generator_seed(seed)
        spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buf, vocab_size=28,
                                       model_type="unigram", unk_id=0, bos_id=-1, eos_id=1, pad_id=-1, minloglevel=2)
        models.append(buf.getvalue())
    src_sp, tgt_sp = (spm.SentencePieceProcessor(model_proto=m) for m in models)
    vocab = {"</s>": 0, "<unk>": 1}
    for sp in (src_sp, tgt_sp):
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)) and sp.id_to_piece(i) not in vocab:
                vocab[sp.id_to_piece(i)] = len(vocab)
    assert len(vocab) < cfg["pad_token_id"]
    vocab["<pad>"] = cfg["pad_token_id"]
    open(os.path.join(folder, "source.spm"), "wb").write(models[0])
    open(os.path.join(folder, "target.spm"), "wb").write(models[1])
    json.dump(vocab, open(os.path.join(folder, "vocab.json"), "w"))
    inv = {i: p for p, i in vocab.items()}
    line = "the cat sat on a mat"
    src = [vocab.get(p, 1) for p in src_sp.encode(line, out_type=str)] + [0]
    with torch.no_grad():
        seq = torch.full((1, 1), cfg["decoder_start_token_id"])
        for _ in range(8):
            nxt = marian_forward(W, cfg, torch.tensor([src]), [len(src)], seq)[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            if int(nxt) == cfg["eos_token_id"]:
                break
    gen = seq[0, 1:].tolist()
    if gen and gen[-1] == cfg["eos_token_id"]:
        gen = gen[:-1]
    want = tgt_sp.decode_pieces([inv[i] for i in gen if i not in (0, 1, cfg["pad_token_id"])]).replace("\u2581", " ").strip()
    rc, out, err = ck.run_input(["translate", "--model", folder, "--beam", 1, "--max-len", 8], line + "\n")
    ck.report(rc == 0 and out.rstrip("\n") == want, name + " translate",
              "qkv %r vs reference %r %s" % (out.rstrip("\n"), want, err.strip()[-200:] if rc else ""))


def finetune_case(ck, name, folder, task, data, use, max_len=32):
    """qkv train --init FOLDER with the folder's own tokenizer; the run's directory then works with
    `use` (a command reading stdin) and holds the tokenizer's files."""
    out_dir = os.path.join(ck.root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    data_file = os.path.join(ck.root, name + ".data")
    with open(data_file, "w") as f:
        f.write(data)
    rc, out, err = ck.run(["train", "--task", task, "--init", folder, "--data", data_file, "--out", out_dir,
                           "--steps", 4, "--max-len", max_len, "--seed", 1, "--test-fraction", 0])
    ok = rc == 0 and "fine-tuning " + folder in err and os.path.exists(os.path.join(out_dir, "qkv_tokenizer.json"))
    ck.report(ok, name + " train --init", (err.strip()[-300:] if not ok else out.strip().splitlines()[-1]))
    if not ok:
        return
    rc, out, err = ck.run_input(use + ["--model", out_dir], data.splitlines()[0].split("\t")[-1] + "\n")
    ck.report(rc == 0 and out.strip() != "", name + " " + use[0] + " after fine-tuning", (out + err).strip()[-200:])


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32", v["dtype"]
        out[k] = torch.from_numpy(np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.float32).copy()).reshape(v["shape"])
    return out


def export_check(ck, name, folder, Wr, skip=()):
    """qkv export of the folder qkv loaded: Hugging Face's names again (as its classes save them:
    GPT-2 under "transformer.", LayerNorm.weight / .bias), the same values (as float32)."""
    out = os.path.join(ck.root, name, "exported")
    rc, _, err = ck.run(["export", "--model", folder, "--out", out])
    if rc != 0:
        ck.report(False, name + " export", "exit %d: %s" % (rc, err.strip()))
        return
    got = read_safetensors(os.path.join(out, "model.safetensors"))
    cfg = json.load(open(os.path.join(out, "config.json")))
    canon = {}
    for k, v in Wr.items():
        c = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if cfg["model_type"] == "gpt2" and not c.startswith("transformer.") and not c.startswith("lm_head"):
            c = "transformer." + c
        canon[c] = v
    Wr = canon
    unknown = sorted(k for k in got if k not in Wr)
    worst, where = 0.0, ""
    for k, t in got.items():
        if k in Wr and k not in skip:
            e = (t - Wr[k].detach().float()).abs().max().item() if t.numel() else 0.0
            if e > worst:
                worst, where = e, k
    missing = sorted(k for k in Wr if k not in got and k not in skip)
    ck.report(worst == 0.0 and not unknown and cfg["model_type"] == json.load(open(os.path.join(folder, "config.json")))["model_type"],
              name + " export", "%d tensors, largest difference %.1e%s%s; not written (tied or buffers): %s" %
              (len(got), worst, " in " + where if where else "", "; unknown names %s" % unknown[:3] if unknown else "",
               ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")))


def expect_failure(ck, what, folder, needles, extra=()):
    rc, out, err = ck.run(["forward", "--model", folder, "--input", os.path.join(ck.root, "bad_ids.npy")] + list(extra))
    ok = rc == 2 and all(n in err for n in needles) and "error" in err
    ck.report(ok, "bad folder: " + what, "exit %d: %s" % (rc, " ".join(err.split())[:200]))


def bad_folders(ck, gpt2_cfg, llama_cfg):
    save_npy(os.path.join(ck.root, "bad_ids.npy"), np.array([[1, 2, 3]], dtype=np.int64))
    g = torch.Generator().manual_seed(9)
    W = gpt2_weights(gpt2_cfg, g, "", False, False)
    d = os.path.join(ck.root, "bad")

    f = os.path.join(d, "missing_shard")
    write_folder(f, gpt2_cfg, W, "F32", shards=2)
    os.remove(os.path.join(f, "model-00002-of-00002.safetensors"))
    expect_failure(ck, "missing shard", f, ["model-00002-of-00002.safetensors", "missing"])

    f = os.path.join(d, "index_names_absent_tensor")
    write_folder(f, gpt2_cfg, W, "F32", shards=2)
    idx = json.load(open(os.path.join(f, "model.safetensors.index.json")))
    idx["weight_map"]["h.0.ln_1.weight"] = "model-00002-of-00002.safetensors" \
        if idx["weight_map"]["h.0.ln_1.weight"].startswith("model-00001") else "model-00001-of-00002.safetensors"
    json.dump(idx, open(os.path.join(f, "model.safetensors.index.json"), "w"))
    expect_failure(ck, "index names a tensor its shard lacks", f, ["h.0.ln_1.weight", "does not hold it"])

    f = os.path.join(d, "bf16_wrong_length")
    write_folder(f, gpt2_cfg, W, "BF16", corrupt="h.1.mlp.c_fc.bias")
    expect_failure(ck, "BF16 tensor of the wrong byte length", f, ["h.1.mlp.c_fc.bias"])

    f = os.path.join(d, "unsupported_type")
    write_folder(f, dict(gpt2_cfg, model_type="t5"), W)
    expect_failure(ck, "unsupported model_type", f, ["model_type", "t5"])

    f = os.path.join(d, "rope_scaling")
    gl = torch.Generator().manual_seed(3)
    write_folder(f, dict(llama_cfg, rope_scaling={"type": "linear", "factor": 2.0}),
                 llama_weights(llama_cfg, gl, "model."))
    expect_failure(ck, "rope_scaling", f, ["rope_scaling", "linear"])

    f = os.path.join(d, "inverse_layer_idx")
    write_folder(f, dict(gpt2_cfg, scale_attn_by_inverse_layer_idx=True), W)
    expect_failure(ck, "scale_attn_by_inverse_layer_idx", f, ["scale_attn_by_inverse_layer_idx", "true"])

    f = os.path.join(d, "misshapen")
    W2 = dict(W)
    W2["h.1.attn.c_proj.weight"] = torch.zeros(gpt2_cfg["n_embd"], gpt2_cfg["n_embd"] + 1)
    write_folder(f, gpt2_cfg, W2)
    D = gpt2_cfg["n_embd"]
    expect_failure(ck, "misshapen tensor", f, ["h.1.attn.c_proj.weight", "(%d, %d)" % (D, D + 1), "(%d, %d)" % (D, D)])

    f = os.path.join(d, "missing_tensor")
    W3 = {k: v for k, v in W.items() if k != "h.0.mlp.c_fc.bias"}
    write_folder(f, gpt2_cfg, W3)
    expect_failure(ck, "missing tensor", f, ["h.0.mlp.c_fc.bias", "missing"])

    f = os.path.join(d, "no_weights")
    os.makedirs(f, exist_ok=True)
    json.dump(gpt2_cfg, open(os.path.join(f, "config.json"), "w"))
    expect_failure(ck, "no weight files", f, ["model.safetensors"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", required=True)
    ap.add_argument("--keep", help="work directory to keep (default: a temporary one, removed)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    root = a.keep or tempfile.mkdtemp(prefix="hf_parity.")
    os.makedirs(root, exist_ok=True)
    torch.manual_seed(0)
    ck = Checks(os.path.abspath(a.qkv), root, a.verbose)
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 101, "n_embd": 48,
            "n_head": 4, "n_layer": 2, "n_positions": 32, "n_ctx": 32, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
            "attn_pdrop": 0.1, "bos_token_id": 100, "eos_token_id": 100, "torch_dtype": "float32"}
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 64,
             "intermediate_size": 88, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 64, "hidden_act": "silu",
             "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "rope_scaling": None,
             "attention_bias": False, "pretraining_tp": 1}
    model_case(ck, "gpt2_f32_prefixed", "gpt2", gpt2, prefix="transformer.", with_head=True, buffers=True, seed=1)
    model_case(ck, "gpt2_bf16_sharded", "gpt2", dict(gpt2, n_inner=72), dtype="BF16", shards=2, seed=2)
    model_case(ck, "llama_f32_gqa", "llama", llama, prefix="model.", seed=3)
    model_case(ck, "llama_f16_tied_head_dim", "llama",
               dict(llama, tie_word_embeddings=True, head_dim=24, num_key_value_heads=1), dtype="F16",
               prefix="model.", seed=4)
    bert = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 83, "hidden_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 56, "hidden_act": "gelu",
            "max_position_embeddings": 24, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
            "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1, "classifier_dropout": None}
    bert_case(ck, "bert_mlm_f32", bert, "mlm", seed=5)
    bert_case(ck, "bert_classifier_bf16_old_names", dict(bert, architectures=["BertForSequenceClassification"],
                                                         num_labels=3, id2label={"0": "a", "1": "b", "2": "c"}),
              "classifier", dtype="BF16", old_names=True, seed=6)
    bert_case(ck, "bert_model_f16", dict(bert, architectures=["BertModel"]), "none", dtype="F16", prefix="", seed=7)
    marian = {"model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": 67, "d_model": 32,
              "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
              "encoder_ffn_dim": 48, "decoder_ffn_dim": 48, "activation_function": "swish",
              "max_position_embeddings": 64, "scale_embedding": True, "pad_token_id": 66, "eos_token_id": 0,
              "decoder_start_token_id": 66, "share_encoder_decoder_embeddings": True, "dropout": 0.1,
              "static_position_embeddings": True}
    marian_case(ck, "marian_f32", marian, seed=8)
    # Pegasus: Marian's layout, pre-norm, a final norm on each stack (qkv's translation models export as it)
    pegasus = dict(marian, model_type="pegasus", architectures=["PegasusForConditionalGeneration"],
                   activation_function="relu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    del pegasus["share_encoder_decoder_embeddings"]
    marian_case(ck, "pegasus_f32", pegasus, seed=14)
    generate_case(ck, "gpt2_text", "gpt2", gpt2, "transformer.", seed=9)
    generate_case(ck, "llama_text", "llama", llama, "model.", seed=10)
    bert_text_case(ck, "bert_mlm_text", bert, "mlm", seed=11)
    bert_text_case(ck, "bert_classifier_text", dict(bert, architectures=["BertForSequenceClassification"], num_labels=3,
                                                    id2label={"0": "a", "1": "b", "2": "c"}), "classifier", seed=12)
    marian_text_case(ck, "marian_text", marian, seed=13)
    # fine-tuning those folders with their own tokenizers
    words = ["word%d" % i for i in range(20)]
    cls_data = "".join("%s\t%s %s\n" % ("abc"[i % 3], words[i % 20], words[(i * 7) % 20]) for i in range(60))
    finetune_case(ck, "bert_finetune", os.path.join(ck.root, "bert_classifier_text", "hf"), "classify", cls_data,
                  ["classify"], max_len=16)
    tr_data = "".join("the cat sat on the mat %d\tder Hund sah die Katze %d\n" % (i, i) for i in range(40))
    finetune_case(ck, "marian_finetune", os.path.join(ck.root, "marian_text", "hf"), "translate", tr_data,
                  ["translate", "--beam", "2"])
    lm_data = "".join("the cat sat on the mat and the dog ran\n" for _ in range(40))
    finetune_case(ck, "llama_finetune", os.path.join(ck.root, "llama_text", "hf"), "lm", lm_data,
                  ["tokenize", "--ids"])
    bad_folders(ck, gpt2, llama)
    print("%d passed, %d failed" % (ck.passed, ck.failed))
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ck.failed == 0 else 1)


if __name__ == "__main__":
    main()
