// Modules built from ops: Linear, Norm, MultiHeadAttention (self and cross), FeedForward,
// EncoderLayer, DecoderLayer. A module holds its parameters' Vars; its forward composes ops on
// the tape, so it needs no backward code of its own.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/autograd.h"
#include "qkv/model.h"
#include "qkv/ops.h"

namespace qkv::nn {

// How Model::init fills a parameter.
enum class Init {
  Zero,           // biases, norm shifts
  One,            // norm scales
  Normal,         // projections: N(0, init_std)
  Residual,       // projections into the residual stream: N(0, init_std / sqrt(2 * layers))
  Embedding,      // token embeddings: N(0, d_model^-1/2) when scaled by sqrt(d_model), else N(0, init_std)
};

// Creates named parameters (zero-filled) in a model's list, in order, with their init rule.
// With `count` set it only plans: add() adds the parameter's element count there (in double, so
// no size overflows) and allocates nothing, returning an empty Var.
struct Registry {
  std::vector<Parameter>* params;
  std::vector<Init>* inits;
  double* count = nullptr;
  Var add(const std::string& name, std::vector<int64_t> shape, bool decay, Init init);
};

// What a forward pass needs besides its inputs.
struct Context {
  Tape& tape;
  bool training = false;
  float dropout = 0.0f;
  uint64_t seed = 0;
  uint64_t next_stream = 0;  // each dropout site takes the next stream

  Var drop(const Var& x);
};

struct Linear {
  Var w, b;  // w: (Out, In)   b: (Out) or none
  void create(Registry& r, const std::string& name, int64_t out, int64_t in, bool bias, Init init);
  Var operator()(Context& c, const Var& x) const { return ops::linear(c.tape, x, w, b); }
};

struct Norm {
  NormKind kind = NormKind::LayerNorm;
  float eps = 1e-5f;
  Var g, b;  // (C); b only for LayerNorm
  void create(Registry& r, const std::string& name, int64_t C, NormKind k, double eps);
  Var operator()(Context& c, const Var& x) const;
};

struct MultiHeadAttention {
  int64_t H = 1, Hkv = 1, Dk = 0, Dv = 0, D = 0;
  bool fused = true;
  Var in_w, in_b;        // fused: in_proj_weight (H*Dk + Hkv*Dk + Hkv*Dv, D); in_proj_bias (same rows)
  Var q_w, k_w, v_w;     // separate: q/k/v_proj_weight; bias still in_proj_bias
  Linear out;            // out_proj: (D, H*Dv)
  void create(Registry& r, const std::string& name, const ModelConfig& cfg);
  // x: (B, T, D); spec carries the masks (causal, key lengths, ALiBi)
  Var self(Context& c, const Var& x, const AttentionSpec& spec, double rope_theta) const;
  // x: (B, Tq, D) queries; memory: (B, Tk, D) keys and values
  Var cross(Context& c, const Var& x, const Var& memory, const AttentionSpec& spec) const;
  int64_t rows() const { return H * Dk + Hkv * Dk + Hkv * Dv; }
};

struct FeedForwardNet {
  FeedForward kind = FeedForward::ReLU;
  Linear l1, l2;  // linear1: (d_ff or 2*d_ff for SwiGLU, D); linear2: (D, d_ff)
  void create(Registry& r, const std::string& prefix, const ModelConfig& cfg);
  Var operator()(Context& c, const Var& x) const;
};

// Self-attention + feed-forward (an encoder layer, or a decoder-only layer under a causal mask).
struct EncoderLayer {
  bool norm_first = false;
  MultiHeadAttention self_attn;
  FeedForwardNet ff;
  Norm norm1, norm2;
  void create(Registry& r, const std::string& prefix, const ModelConfig& cfg);
  Var operator()(Context& c, const Var& x, const AttentionSpec& spec, double rope_theta) const;
};

// Masked self-attention, cross-attention to the encoder output, feed-forward.
struct DecoderLayer {
  bool norm_first = false;
  MultiHeadAttention self_attn, cross_attn;
  FeedForwardNet ff;
  Norm norm1, norm2, norm3;
  void create(Registry& r, const std::string& prefix, const ModelConfig& cfg);
  Var operator()(Context& c, const Var& x, const Var& memory, const AttentionSpec& self_spec,
                 const AttentionSpec& cross_spec, double rope_theta) const;
};

}  // namespace qkv::nn
