// Modules: each forward is a composition of ops (qkv/ops.h); backward comes from the tape.
#include "nn/layers.h"

#include <algorithm>
#include <cmath>

#include "kernels/positional.h"
#include "kernels/rope.h"
#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv::nn {

Var Registry::add(const std::string& name, std::vector<int64_t> shape, bool decay, Init init) {
  if (count) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    *count += n;
    return nullptr;
  }
  Var v = make_var(zero ? Tensor(std::move(shape), DType::F32) : Tensor::empty(std::move(shape), DType::F32), true);
  params->push_back({name, v, decay});
  inits->push_back(init);
  return v;
}

bool Step::uniform() const {
  return std::all_of(pos.begin(), pos.end(), [&](int64_t p) { return p == pos[0]; });
}

Var Context::drop(const Var& x) {
  if (!training || dropout <= 0.0f) return x;
  return ops::dropout(tape, x, dropout, seed, next_stream++);
}

void Linear::create(Registry& r, const std::string& name, int64_t out, int64_t in, bool bias, Init init) {
  w = r.add(name + ".weight", {out, in}, true, init);
  if (bias) b = r.add(name + ".bias", {out}, false, Init::Zero);
}

void Norm::create(Registry& r, const std::string& name, int64_t C, NormKind k, double e) {
  kind = k;
  eps = static_cast<float>(e);
  g = r.add(name + ".weight", {C}, false, Init::One);
  if (k == NormKind::LayerNorm) b = r.add(name + ".bias", {C}, false, Init::Zero);
}

Var Norm::operator()(Context& c, const Var& x) const {
  return kind == NormKind::LayerNorm ? ops::layer_norm(c.tape, x, g, b, eps) : ops::rms_norm(c.tape, x, g, eps);
}

// ---- positions ---------------------------------------------------------------------------------

void Positions::create(Registry& r, const std::string& name, const ModelConfig& cfg) {
  kind = cfg.positional;
  max_len = cfg.max_len;
  rope_theta = cfg.rope_theta;
  if (kind == Positional::Learned) table = r.add(name + ".weight", {cfg.max_len, cfg.d_model}, false, Init::Normal);
}

AttentionPositions Positions::attention() const {
  AttentionPositions a;
  if (kind == Positional::Rope) a.rope_theta = rope_theta;
  a.alibi = kind == Positional::Alibi;
  return a;
}

Var Positions::embed(Context& c, const Var& x) const {
  const bool sinusoidal = kind == Positional::Sinusoidal || kind == Positional::SinusoidalSplitHalf;
  if (!sinusoidal && kind != Positional::Learned) return x;
  const Tensor& X = x->value;
  const int64_t B = X.size(0), T = X.size(1), D = X.size(2);
  const kernels::SinusoidalLayout layout =
      kind == Positional::SinusoidalSplitHalf ? kernels::SinusoidalLayout::SplitHalf : kernels::SinusoidalLayout::Interleaved;
  const Step* s = c.step;
  check(!s || static_cast<int64_t>(s->pos.size()) == B, "positions: the step has ", s ? s->pos.size() : 0,
        " rows, the batch ", B);
  const int64_t first = s ? *std::min_element(s->pos.begin(), s->pos.end()) : 0;
  const int64_t last = s ? *std::max_element(s->pos.begin(), s->pos.end()) + T - 1 : T - 1;
  check(first >= 0, "positions: position ", first, " is negative");
  check(kind != Positional::Learned || last < max_len, "positions: position ", last,
        " is beyond the model's max_len ", max_len, " (its learned positions)");
  if (!s || s->uniform()) {
    // x[b, t] <- x[b, t] + P[p0 + t]
    const int64_t p0 = s ? s->pos[0] : 0;
    if (kind == Positional::Learned) return ops::add_positions(c.tape, x, table, p0);
    Tensor pe({T, D}, DType::F32);
    kernels::sinusoidal_positions(pe.data<float>(), T, D, p0, layout);
    return ops::add_positions(c.tape, x, make_var(pe), 0);
  }
  // Rows at different positions (one token each, decoding): x[b, 0] <- x[b, 0] + P[pos_b]
  check(T == 1, "positions: rows at different positions need one token each, got ", T);
  Tensor pe({B, 1, D}, DType::F32);
  for (int64_t b = 0; b < B; ++b) {
    float* row = pe.data<float>() + b * D;
    if (kind == Positional::Learned) {
      const float* src = table->value.data<float>() + s->pos[b] * D;
      std::copy(src, src + D, row);
    } else {
      kernels::sinusoidal_positions(row, 1, D, s->pos[b], layout);
    }
  }
  return ops::add(c.tape, x, make_var(pe));
}

void Embedder::create_table(Registry& r, const std::string& name, int64_t vocab, const ModelConfig& cfg) {
  table = r.add(name, {vocab, cfg.d_model}, false, Init::Embedding);
  scale = cfg.scale_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(cfg.d_model))) : 1.0f;
}

void Embedder::create_extras(Registry& r, const std::string& prefix, const ModelConfig& cfg) {
  if (cfg.type_vocab_size > 0) types = r.add(prefix + "type_embed.weight", {cfg.type_vocab_size, cfg.d_model}, false, Init::Normal);
  has_norm = cfg.embed_norm;
  if (has_norm) norm.create(r, prefix + "embed_norm", cfg.d_model, NormKind::LayerNorm, cfg.norm_eps);
}

Var Embedder::operator()(Context& c, const Tensor& ids) const {
  // x <- E[ids] (* sqrt(d_model)) + P[positions] (+ T[0]) ; norm ; dropout
  Var x = ops::embedding(c.tape, ids, table);
  if (scale != 1.0f) x = ops::scale(c.tape, x, scale);
  x = positions.embed(c, x);
  if (types) {
    // every token of type 0 (single-segment input)
    const Tensor zeros = Tensor::zeros(ids.shape(), DType::I64);
    x = ops::add(c.tape, x, ops::embedding(c.tape, zeros, types));
  }
  if (has_norm) x = norm(c, x);
  return c.drop(x);
}

// ---- attention ---------------------------------------------------------------------------------

namespace {

// Columns [begin, begin + width) of a (B, T, R) tensor, as a new contiguous (B, T, width) one.
Tensor columns(const Tensor& t, int64_t begin, int64_t width) {
  const int64_t B = t.size(0), T = t.size(1), R = t.size(2);
  if (begin == 0 && width == R) return t;
  Tensor out = Tensor::empty({B, T, width});
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < B * T; ++r) std::copy(src + r * R + begin, src + r * R + begin + width, dst + r * width);
  return out;
}

}  // namespace

void MultiHeadAttention::create(Registry& r, const std::string& name, const ModelConfig& cfg, AttentionPositions p) {
  H = cfg.n_heads;
  Hkv = cfg.kv_heads();
  Dk = cfg.head_dim_k();
  Dv = cfg.head_dim_v();
  D = cfg.d_model;
  fused = cfg.fused_qkv;
  pos = p;
  if (fused) {
    in_w = r.add(name + ".in_proj_weight", {rows(), D}, true, Init::Normal);
  } else {
    q_w = r.add(name + ".q_proj_weight", {H * Dk, D}, true, Init::Normal);
    k_w = r.add(name + ".k_proj_weight", {Hkv * Dk, D}, true, Init::Normal);
    v_w = r.add(name + ".v_proj_weight", {Hkv * Dv, D}, true, Init::Normal);
  }
  if (cfg.bias) in_b = r.add(name + ".in_proj_bias", {rows()}, false, Init::Zero);
  out.create(r, name + ".out_proj", D, H * Dv, cfg.bias, Init::Residual);
}

Var MultiHeadAttention::self(Context& c, const Var& x, const AttentionSpec& spec_in, KVCache* cache) const {
  if (cache) return cached_self(c, x, spec_in, *cache);
  AttentionSpec spec = spec_in;
  spec.alibi = spec.alibi || pos.alibi;
  ops::HeadLayout hl{H, Hkv, Dk, Dv, 0, 0, 0, pos.rope_theta, 0, 0};
  Var o;
  if (fused) {
    // qkv <- x W_in^T + b_in: [Q | K | V] columns
    Var qkv = ops::linear(c.tape, x, in_w, in_b);
    hl.k_col = H * Dk;
    hl.v_col = H * Dk + Hkv * Dk;
    o = ops::attention(c.tape, qkv, qkv, qkv, hl, spec);
  } else {
    Var q = ops::linear(c.tape, x, q_w, in_b, 0, -1, 0);
    Var k = ops::linear(c.tape, x, k_w, in_b, 0, -1, H * Dk);
    Var v = ops::linear(c.tape, x, v_w, in_b, 0, -1, H * Dk + Hkv * Dk);
    o = ops::attention(c.tape, q, k, v, hl, spec);
  }
  return out(c, o);
}

Var MultiHeadAttention::cached_self(Context& c, const Var& x, const AttentionSpec& spec_in, KVCache& kv) const {
  check(c.step != nullptr, "attention: a cache needs the step's positions");
  check(!c.tape.recording, "attention: the key/value cache is for inference (the tape must not record)");
  const Step& s = *c.step;
  const int64_t B = x->value.size(0), Tn = x->value.size(1), G = Hkv, Tmax = kv.k.size(2);
  const bool uniform = s.uniform();
  check(uniform || Tn == 1, "attention: rows at different positions need one token each, got ", Tn);
  for (int64_t b = 0; b < B; ++b)
    check(s.pos[b] + Tn <= Tmax, "attention: position ", s.pos[b] + Tn - 1, " is beyond the cache's ", Tmax);
  // q, k, v <- x W^T + b   (B, Tn, H*Dk), (B, Tn, G*Dk), (B, Tn, G*Dv)
  Tensor q, k, v;
  if (fused) {
    const Tensor all = ops::linear(c.tape, x, in_w, in_b)->value;
    q = columns(all, 0, H * Dk);
    k = columns(all, H * Dk, G * Dk);
    v = columns(all, H * Dk + G * Dk, G * Dv);
  } else {
    const std::vector<Var> qkv = ops::linear_parts(c.tape, x, {q_w, k_w, v_w}, in_b, {0, H * Dk, H * Dk + G * Dk});
    q = qkv[0]->value, k = qkv[1]->value, v = qkv[2]->value;
  }
  // RoPE: rotate q and k by each row's positions
  if (pos.rope_theta > 0) {
    for (int64_t b = 0; b < B; ++b) {
      kernels::rope_apply(q.data<float>() + b * Tn * H * Dk, 1, Tn, H, Dk, H * Dk, s.pos[b], pos.rope_theta, false,
                          num_threads());
      kernels::rope_apply(k.data<float>() + b * Tn * G * Dk, 1, Tn, G, Dk, G * Dk, s.pos[b], pos.rope_theta, false,
                          num_threads());
    }
  }
  // cache[b, g, pos_b + i] <- k[b, i, g], v[b, i, g]
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tn; ++i)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t t = s.pos[b] + i;
        const float* ks = k.data<float>() + (b * Tn + i) * G * Dk + g * Dk;
        const float* vs = v.data<float>() + (b * Tn + i) * G * Dv + g * Dv;
        std::copy(ks, ks + Dk, kv.k.data<float>() + ((b * G + g) * Tmax + t) * Dk);
        std::copy(vs, vs + Dv, kv.v.data<float>() + ((b * G + g) * Tmax + t) * Dv);
      }
  // o <- softmax(q k^T / sqrt(Dk) + mask) v over each row's keys 0 .. its position
  const int64_t Tk = uniform ? s.pos[0] + Tn : *std::max_element(s.pos.begin(), s.pos.end()) + 1;
  const Tensor qT = q.as_strided({B, H, Tn, Dk}, {Tn * H * Dk, Dk, H * Dk, 1}, 0);
  const Tensor kT = kv.k.as_strided({B, G, Tk, Dk}, {G * Tmax * Dk, Tmax * Dk, Dk, 1}, 0);
  const Tensor vT = kv.v.as_strided({B, G, Tk, Dv}, {G * Tmax * Dv, Tmax * Dv, Dv, 1}, 0);
  AttentionSpec spec = spec_in;
  spec.alibi = spec.alibi || pos.alibi;
  spec.align = Align::BottomRight;  // query i sits at key index Tk - Tn + i = pos + i
  if (!uniform) {
    // each row sees its keys 0 .. pos_b (what the causal mask gives its one query)
    Tensor len({B}, DType::I64);
    for (int64_t b = 0; b < B; ++b) len.data<int64_t>()[b] = s.pos[b] + 1;
    spec.key_lengths = len;
    spec.causal = false;
  }
  return attend(c, qT, kT, vT, spec, kv);
}

Var MultiHeadAttention::attend(Context& c, const Tensor& qT, const Tensor& kT, const Tensor& vT,
                               const AttentionSpec& spec, KVCache& kv) const {
  // qT (B, H, Tn, Dk), kT (B, G, Tk, Dk), vT (B, G, Tk, Dv)
  const int64_t B = qT.size(0), Tn = qT.size(2), Tk = kT.size(2);
  const AttentionOutput o = attention(qT, kT, vT, spec);
  if (kv.keep_inputs) {
    kv.kept_q = qT.contiguous();
    kv.kept_k = kT.contiguous();
    kv.kept_lse = o.lse;
    kv.kept_spec = spec;
  }
  if (kv.capture_head >= 0) {
    // that head's weights, recomputed from the saved logsumexp: (B, Tn, Tk)
    const Tensor w = attention_weights(qT, kT, o.lse, spec, 0, Tn);  // (B, H, Tn, Tk)
    kv.captured = Tensor::empty({B, Tn, Tk});
    for (int64_t b = 0; b < B; ++b) {
      const float* src = w.data<float>() + (b * H + kv.capture_head) * Tn * Tk;
      std::copy(src, src + Tn * Tk, kv.captured.data<float>() + b * Tn * Tk);
    }
  }
  // out <- concat_h(o_h) W_o^T + b_o
  const Tensor heads = o.out.permute({0, 2, 1, 3}).contiguous().view({B, Tn, H * Dv});
  return out(c, make_var(heads));
}

Var MultiHeadAttention::cross(Context& c, const Var& x, const Var& memory, const AttentionSpec& spec,
                              KVCache* cache) const {
  if (cache) return cached_cross(c, x, memory, spec, *cache);
  ops::HeadLayout hl{H, Hkv, Dk, Dv, 0, 0, 0, 0.0, 0, 0};
  Var o;
  if (fused) {
    // q <- x W_in[Q rows]^T;  kv <- memory W_in[K, V rows]^T
    Var q = ops::linear(c.tape, x, in_w, in_b, 0, H * Dk);
    Var kv = ops::linear(c.tape, memory, in_w, in_b, H * Dk, rows());
    hl.v_col = Hkv * Dk;
    o = ops::attention(c.tape, q, kv, kv, hl, spec);
  } else {
    Var q = ops::linear(c.tape, x, q_w, in_b, 0, -1, 0);
    Var k = ops::linear(c.tape, memory, k_w, in_b, 0, -1, H * Dk);
    Var v = ops::linear(c.tape, memory, v_w, in_b, 0, -1, H * Dk + Hkv * Dk);
    o = ops::attention(c.tape, q, k, v, hl, spec);
  }
  return out(c, o);
}

Var MultiHeadAttention::cached_cross(Context& c, const Var& x, const Var& memory, const AttentionSpec& spec,
                                     KVCache& kv) const {
  check(!c.tape.recording, "attention: the key/value cache is for inference (the tape must not record)");
  const int64_t G = Hkv;
  if (!kv.k.defined()) {
    // the memory's keys and values, once: [K | V] <- memory W_in[K, V rows]^T + b
    check(memory != nullptr, "cross-attention: the first step needs the encoder output");
    if (fused) {
      const Tensor both = ops::linear(c.tape, memory, in_w, in_b, H * Dk, rows())->value;
      kv.k = columns(both, 0, G * Dk);
      kv.v = columns(both, G * Dk, G * Dv);
    } else {
      kv.k = ops::linear(c.tape, memory, k_w, in_b, 0, -1, H * Dk)->value;
      kv.v = ops::linear(c.tape, memory, v_w, in_b, 0, -1, H * Dk + G * Dk)->value;
    }
  }
  const int64_t B = x->value.size(0), Tn = x->value.size(1), S = kv.k.size(1);
  // q <- x W_q^T + b_q
  const Tensor q = fused ? ops::linear(c.tape, x, in_w, in_b, 0, H * Dk)->value
                         : ops::linear(c.tape, x, q_w, in_b, 0, -1, 0)->value;
  const Tensor qT = q.as_strided({B, H, Tn, Dk}, {Tn * H * Dk, Dk, H * Dk, 1}, 0);
  const Tensor kT = kv.k.as_strided({B, G, S, Dk}, {S * G * Dk, Dk, G * Dk, 1}, 0);
  const Tensor vT = kv.v.as_strided({B, G, S, Dv}, {S * G * Dv, Dv, G * Dv, 1}, 0);
  return attend(c, qT, kT, vT, spec, kv);
}

// ---- feed-forward, layers, stacks --------------------------------------------------------------

void FeedForwardNet::create(Registry& r, const std::string& prefix, const ModelConfig& cfg) {
  act = cfg.activation;
  gated = cfg.gated;
  const int64_t inner = gated ? 2 * cfg.d_ff : cfg.d_ff;
  l1.create(r, prefix + "linear1", inner, cfg.d_model, cfg.bias, Init::Normal);
  l2.create(r, prefix + "linear2", cfg.d_model, cfg.d_ff, cfg.bias, Init::Residual);
}

Var FeedForwardNet::operator()(Context& c, const Var& x) const {
  // linear2(dropout(f(linear1(x)))), as PyTorch's TransformerEncoderLayer; gated: f(gate) * value
  Var h = l1(c, x);
  h = gated ? ops::gated(c.tape, h, act) : ops::activation(c.tape, h, act);
  return l2(c, c.drop(h));
}

void EncoderLayer::create(Registry& r, const std::string& prefix, const ModelConfig& cfg, AttentionPositions pos) {
  norm_first = cfg.norm_first;
  self_attn.create(r, prefix + "self_attn", cfg, pos);
  ff.create(r, prefix, cfg);
  norm1.create(r, prefix + "norm1", cfg.d_model, cfg.norm, cfg.norm_eps);
  norm2.create(r, prefix + "norm2", cfg.d_model, cfg.norm, cfg.norm_eps);
}

Var EncoderLayer::operator()(Context& c, const Var& x, const AttentionSpec& spec, LayerCache* cache) const {
  KVCache* kv = cache ? &cache->self : nullptr;
  if (norm_first) {
    // x <- x + drop(sa(norm1(x)));  x <- x + drop(ff(norm2(x)))
    Var h = ops::add(c.tape, x, c.drop(self_attn.self(c, norm1(c, x), spec, kv)));
    return ops::add(c.tape, h, c.drop(ff(c, norm2(c, h))));
  }
  // x <- norm1(x + drop(sa(x)));  x <- norm2(x + drop(ff(x)))
  Var h = norm1(c, ops::add(c.tape, x, c.drop(self_attn.self(c, x, spec, kv))));
  return norm2(c, ops::add(c.tape, h, c.drop(ff(c, h))));
}

void DecoderLayer::create(Registry& r, const std::string& prefix, const ModelConfig& cfg, AttentionPositions pos) {
  norm_first = cfg.norm_first;
  self_attn.create(r, prefix + "self_attn", cfg, pos);
  cross_attn.create(r, prefix + "multihead_attn", cfg);
  ff.create(r, prefix, cfg);
  norm1.create(r, prefix + "norm1", cfg.d_model, cfg.norm, cfg.norm_eps);
  norm2.create(r, prefix + "norm2", cfg.d_model, cfg.norm, cfg.norm_eps);
  norm3.create(r, prefix + "norm3", cfg.d_model, cfg.norm, cfg.norm_eps);
}

Var DecoderLayer::operator()(Context& c, const Var& x, const Var& memory, const AttentionSpec& self_spec,
                             const AttentionSpec& cross_spec, LayerCache* cache) const {
  KVCache* skv = cache ? &cache->self : nullptr;
  KVCache* ckv = cache ? &cache->cross : nullptr;
  if (norm_first) {
    Var h = ops::add(c.tape, x, c.drop(self_attn.self(c, norm1(c, x), self_spec, skv)));
    h = ops::add(c.tape, h, c.drop(cross_attn.cross(c, norm2(c, h), memory, cross_spec, ckv)));
    return ops::add(c.tape, h, c.drop(ff(c, norm3(c, h))));
  }
  Var h = norm1(c, ops::add(c.tape, x, c.drop(self_attn.self(c, x, self_spec, skv))));
  h = norm2(c, ops::add(c.tape, h, c.drop(cross_attn.cross(c, h, memory, cross_spec, ckv))));
  return norm3(c, ops::add(c.tape, h, c.drop(ff(c, h))));
}

namespace {
std::string layer_name(const std::string& prefix, int64_t i) { return prefix + "layers." + std::to_string(i) + "."; }

LayerCache* cache_of(std::vector<LayerCache>* caches, size_t l, size_t n) {
  if (!caches) return nullptr;
  check(caches->size() == n, "stack: ", caches->size(), " layer caches for ", n, " layers");
  return &(*caches)[l];
}
}  // namespace

void EncoderStack::create(Registry& r, const std::string& prefix, int64_t n, const ModelConfig& cfg,
                          AttentionPositions pos) {
  layers.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) layers[static_cast<size_t>(i)].create(r, layer_name(prefix, i), cfg, pos);
  has_norm = cfg.final_norm;
  if (has_norm) norm.create(r, prefix + "norm", cfg.d_model, cfg.norm, cfg.norm_eps);
}

Var EncoderStack::operator()(Context& c, Var x, const AttentionSpec& spec, std::vector<LayerCache>* caches) const {
  for (size_t l = 0; l < layers.size(); ++l) x = layers[l](c, x, spec, cache_of(caches, l, layers.size()));
  return has_norm ? norm(c, x) : x;
}

void DecoderStack::create(Registry& r, const std::string& prefix, int64_t n, const ModelConfig& cfg,
                          AttentionPositions pos) {
  layers.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) layers[static_cast<size_t>(i)].create(r, layer_name(prefix, i), cfg, pos);
  has_norm = cfg.final_norm;
  if (has_norm) norm.create(r, prefix + "norm", cfg.d_model, cfg.norm, cfg.norm_eps);
}

Var DecoderStack::operator()(Context& c, Var x, const Var& memory, const AttentionSpec& self_spec,
                             const AttentionSpec& cross_spec, std::vector<LayerCache>* caches) const {
  for (size_t l = 0; l < layers.size(); ++l)
    x = layers[l](c, x, memory, self_spec, cross_spec, cache_of(caches, l, layers.size()));
  return has_norm ? norm(c, x) : x;
}

// ---- heads -------------------------------------------------------------------------------------

void LMHead::create(Registry& r, const std::string& name, int64_t vocab, const ModelConfig& cfg, const Var& tied) {
  w = cfg.tie_embeddings ? tied : r.add(name + ".weight", {vocab, cfg.d_model}, true, Init::Normal);
  if (cfg.logits_bias) b = r.add(name + ".bias", {vocab}, false, Init::Zero);
}

void ClassifierHead::create(Registry& r, const std::string& pooler_name, const std::string& name,
                            const ModelConfig& cfg) {
  pooling = cfg.pooling;
  has_pooler = cfg.pooler;
  if (has_pooler) pooler.create(r, pooler_name, cfg.d_model, cfg.d_model, true, Init::Normal);
  out.create(r, name, cfg.num_classes, cfg.d_model, true, Init::Normal);
}

Var ClassifierHead::operator()(Context& c, const Var& x, const Tensor& lengths) const {
  Var pooled = pooling == Pooling::Mean ? ops::mean_pool(c.tape, x, lengths) : ops::first_token(c.tape, x);
  if (!has_pooler) return out(c, pooled);
  // BERT: tanh(dense(first)), dropout, classifier
  pooled = ops::activation(c.tape, pooler(c, pooled), Activation::Tanh);
  return out(c, c.drop(pooled));
}

void MaskedLMHead::create(Registry& r, const std::string& prefix, int64_t vocab, const ModelConfig& cfg,
                          const Var& tied) {
  act = cfg.activation;
  transform.create(r, prefix + "transform", cfg.d_model, cfg.d_model, true, Init::Normal);
  norm.create(r, prefix + "norm", cfg.d_model, NormKind::LayerNorm, cfg.norm_eps);
  decoder.w = cfg.tie_embeddings ? tied : r.add(prefix + "decoder.weight", {vocab, cfg.d_model}, true, Init::Normal);
  decoder.b = r.add(prefix + "bias", {vocab}, false, Init::Zero);
}

Var MaskedLMHead::operator()(Context& c, const Var& x) const {
  return decoder(c, norm(c, ops::activation(c.tape, transform(c, x), act)));
}

}  // namespace qkv::nn
