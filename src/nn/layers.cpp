// Modules: each forward is a composition of ops (qkv/ops.h); backward comes from the tape.
#include "nn/layers.h"

#include "qkv/error.h"

namespace qkv::nn {

Var Registry::add(const std::string& name, std::vector<int64_t> shape, bool decay, Init init) {
  if (count) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    *count += n;
    return nullptr;
  }
  Var v = make_var(Tensor(std::move(shape), DType::F32), true);
  params->push_back({name, v, decay});
  inits->push_back(init);
  return v;
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

void MultiHeadAttention::create(Registry& r, const std::string& name, const ModelConfig& cfg) {
  H = cfg.n_heads;
  Hkv = cfg.kv_heads();
  Dk = cfg.head_dim_k();
  Dv = cfg.head_dim_v();
  D = cfg.d_model;
  fused = cfg.fused_qkv;
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

Var MultiHeadAttention::self(Context& c, const Var& x, const AttentionSpec& spec, double rope_theta) const {
  ops::HeadLayout hl{H, Hkv, Dk, Dv, 0, 0, 0, rope_theta, 0, 0};
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

Var MultiHeadAttention::cross(Context& c, const Var& x, const Var& memory, const AttentionSpec& spec) const {
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

void FeedForwardNet::create(Registry& r, const std::string& prefix, const ModelConfig& cfg) {
  kind = cfg.activation;
  const int64_t inner = kind == FeedForward::SwiGLU ? 2 * cfg.d_ff : cfg.d_ff;
  l1.create(r, prefix + "linear1", inner, cfg.d_model, cfg.bias, Init::Normal);
  l2.create(r, prefix + "linear2", cfg.d_model, cfg.d_ff, cfg.bias, Init::Residual);
}

Var FeedForwardNet::operator()(Context& c, const Var& x) const {
  // linear2(dropout(f(linear1(x)))), as PyTorch's TransformerEncoderLayer
  Var h = l1(c, x);
  switch (kind) {
    case FeedForward::ReLU: h = ops::activation(c.tape, h, Activation::ReLU); break;
    case FeedForward::Gelu: h = ops::activation(c.tape, h, Activation::GeluErf); break;
    case FeedForward::GeluTanh: h = ops::activation(c.tape, h, Activation::GeluTanh); break;
    case FeedForward::SwiGLU: h = ops::swiglu(c.tape, h); break;
  }
  return l2(c, c.drop(h));
}

void EncoderLayer::create(Registry& r, const std::string& prefix, const ModelConfig& cfg) {
  norm_first = cfg.norm_first;
  self_attn.create(r, prefix + "self_attn", cfg);
  ff.create(r, prefix, cfg);
  norm1.create(r, prefix + "norm1", cfg.d_model, cfg.norm, cfg.norm_eps);
  norm2.create(r, prefix + "norm2", cfg.d_model, cfg.norm, cfg.norm_eps);
}

Var EncoderLayer::operator()(Context& c, const Var& x, const AttentionSpec& spec, double rope_theta) const {
  if (norm_first) {
    // x <- x + drop(sa(norm1(x)));  x <- x + drop(ff(norm2(x)))
    Var h = ops::add(c.tape, x, c.drop(self_attn.self(c, norm1(c, x), spec, rope_theta)));
    return ops::add(c.tape, h, c.drop(ff(c, norm2(c, h))));
  }
  // x <- norm1(x + drop(sa(x)));  x <- norm2(x + drop(ff(x)))
  Var h = norm1(c, ops::add(c.tape, x, c.drop(self_attn.self(c, x, spec, rope_theta))));
  return norm2(c, ops::add(c.tape, h, c.drop(ff(c, h))));
}

void DecoderLayer::create(Registry& r, const std::string& prefix, const ModelConfig& cfg) {
  norm_first = cfg.norm_first;
  self_attn.create(r, prefix + "self_attn", cfg);
  cross_attn.create(r, prefix + "multihead_attn", cfg);
  ff.create(r, prefix, cfg);
  norm1.create(r, prefix + "norm1", cfg.d_model, cfg.norm, cfg.norm_eps);
  norm2.create(r, prefix + "norm2", cfg.d_model, cfg.norm, cfg.norm_eps);
  norm3.create(r, prefix + "norm3", cfg.d_model, cfg.norm, cfg.norm_eps);
}

Var DecoderLayer::operator()(Context& c, const Var& x, const Var& memory, const AttentionSpec& self_spec,
                             const AttentionSpec& cross_spec, double rope_theta) const {
  if (norm_first) {
    Var h = ops::add(c.tape, x, c.drop(self_attn.self(c, norm1(c, x), self_spec, rope_theta)));
    h = ops::add(c.tape, h, c.drop(cross_attn.cross(c, norm2(c, h), memory, cross_spec)));
    return ops::add(c.tape, h, c.drop(ff(c, norm3(c, h))));
  }
  Var h = norm1(c, ops::add(c.tape, x, c.drop(self_attn.self(c, x, self_spec, rope_theta))));
  h = norm2(c, ops::add(c.tape, h, c.drop(cross_attn.cross(c, h, memory, cross_spec))));
  return norm3(c, ops::add(c.tape, h, c.drop(ff(c, h))));
}

}  // namespace qkv::nn
