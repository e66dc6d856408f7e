// The parts a model is built from, each a module made of ops: Linear, Norm, Positions (one unit
// per positional scheme), Embedder, MultiHeadAttention (self and cross), FeedForwardNet,
// EncoderLayer and DecoderLayer, the two stacks, and the heads (LMHead, ClassifierHead).
// A module holds its parameters' Vars; its forward composes ops on the tape, so it needs no
// backward code of its own.
//
// Every layer's forward pass exists once. Training and full recomputation call it with no cache;
// cached generation (src/infer/generate.cpp) calls the same function with a LayerCache and a
// Step in the Context: self-attention then appends its new keys and values to the cache and
// attends over it, cross-attention computes the memory's keys and values once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/autograd.h"
#include "qkv/config.h"
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
  bool zero = true;  // false: allocated, not zeroed (a loader fills every parameter)
  Var add(const std::string& name, std::vector<int64_t> shape, bool decay, Init init);
};

// Where the tokens of one cached decoding step sit: row b's token i at position pos[b] + i.
// Either every pos[b] is equal (a prefill of right-padded rows: a row's padding comes after its
// tokens, so the causal mask hides it, and later steps overwrite its cache entries) or Tn == 1.
struct Step {
  std::vector<int64_t> pos;  // (B)
  int64_t Tn = 1;
  bool uniform() const;
};

// What a forward pass needs besides its inputs.
struct Context {
  Tape& tape;
  bool training = false;
  float dropout = 0.0f;
  uint64_t seed = 0;
  uint64_t next_stream = 0;      // each dropout site takes the next stream
  const Step* step = nullptr;    // cached decoding: where the new tokens sit; nullptr: positions 0 .. T-1

  Var drop(const Var& x);
};

// Keys and values of one attention module while decoding.
// Self-attention: k (B, G, Tmax, Dk), v (B, G, Tmax, Dv); row b holds positions 0 .. pos[b]+Tn-1.
// Cross-attention: k (B, S, G*Dk), v (B, S, G*Dv), computed from the memory on the first step.
// With capture_head >= 0 the module keeps that head's weights of the last step: (B, Tn, Tk).
// With keep_inputs the module keeps what the flash kernel read and saved on its last step: the
// queries (B, H, Tn, Dk), keys (B, G, Tk, Dk), logsumexp (B, H, Tn) and the spec, from which any
// head's weights can be recomputed a block of rows at a time (qkv/inspect.h).
struct KVCache {
  Tensor k, v;
  int64_t capture_head = -1;
  Tensor captured;
  bool keep_inputs = false;
  Tensor kept_q, kept_k, kept_lse;
  AttentionSpec kept_spec;
};

// A layer's decoding state: its self-attention cache and (decoder layers) its cross-attention's.
struct LayerCache {
  KVCache self, cross;
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

// What a positional scheme does inside self-attention: RoPE rotates queries and keys by their
// positions; ALiBi adds -slope_h |i - j| to the scores. Cross-attention gets neither.
struct AttentionPositions {
  double rope_theta = 0;  // > 0: RoPE (rotate-half form) with this base
  bool alibi = false;
};

// One positional scheme, everything it does in one place: added to the token embeddings
// (sinusoidal, interleaved or split-half; learned) or applied inside attention (RoPE, ALiBi), or
// nothing (none). Positions are 0 .. T-1, or the Context's Step while decoding.
struct Positions {
  Positional kind = Positional::None;
  int64_t max_len = 0;  // learned: the table's rows
  double rope_theta = 0;
  Var table;            // learned: (max_len, D)
  void create(Registry& r, const std::string& name, const ModelConfig& cfg);
  // x + P[position] (sinusoidal, learned); x itself otherwise.   x: (B, T, D)
  Var embed(Context& c, const Var& x) const;
  AttentionPositions attention() const;
};

// Token ids to vectors: E[ids] (times sqrt(d_model) when scaled), plus positions, plus the
// token-type embedding (type 0 for every token), then a norm (BERT), then dropout.
struct Embedder {
  Var table;   // (V, D)
  float scale = 1.0f;
  Positions positions;
  Var types;   // (type_vocab_size, D) or none
  Norm norm;
  bool has_norm = false;
  // The table alone (the positions are created separately, so that parameters keep their order).
  void create_table(Registry& r, const std::string& name, int64_t vocab, const ModelConfig& cfg);
  // The token-type table and the norm, as the config asks ("type_embed", "embed_norm").
  void create_extras(Registry& r, const std::string& prefix, const ModelConfig& cfg);
  Var operator()(Context& c, const Tensor& ids) const;   // ids (B, T) -> (B, T, D)
};

struct MultiHeadAttention {
  int64_t H = 1, Hkv = 1, Dk = 0, Dv = 0, D = 0;
  bool fused = true;
  AttentionPositions pos;  // self-attention: from the model's Positions
  Var in_w, in_b;        // fused: in_proj_weight (H*Dk + Hkv*Dk + Hkv*Dv, D); in_proj_bias (same rows)
  Var q_w, k_w, v_w;     // separate: q/k/v_proj_weight; bias still in_proj_bias
  Linear out;            // out_proj: (D, H*Dv)
  void create(Registry& r, const std::string& name, const ModelConfig& cfg, AttentionPositions pos = {});
  // x: (B, T, D); spec carries the masks (causal, key lengths). With a cache (and c.step), x holds
  // the step's new tokens; their keys and values join the cache first.
  Var self(Context& c, const Var& x, const AttentionSpec& spec, KVCache* cache = nullptr) const;
  // x: (B, Tq, D) queries; memory: (B, Tk, D) keys and values (with a filled cache, memory may
  // be null: its keys and values are the cache's).
  Var cross(Context& c, const Var& x, const Var& memory, const AttentionSpec& spec, KVCache* cache = nullptr) const;
  int64_t rows() const { return H * Dk + Hkv * Dk + Hkv * Dv; }

 private:
  Var cached_self(Context& c, const Var& x, const AttentionSpec& spec, KVCache& cache) const;
  Var cached_cross(Context& c, const Var& x, const Var& memory, const AttentionSpec& spec, KVCache& cache) const;
  // The flash kernel over the cache's keys and values, the captured head's weights, the output projection.
  Var attend(Context& c, const Tensor& qT, const Tensor& kT, const Tensor& vT, const AttentionSpec& spec,
             KVCache& cache) const;
};

struct FeedForwardNet {
  Activation act = Activation::ReLU;
  bool gated = false;
  Linear l1, l2;  // linear1: (d_ff, or 2*d_ff when gated: [gate | value], D); linear2: (D, d_ff)
  void create(Registry& r, const std::string& prefix, const ModelConfig& cfg);
  Var operator()(Context& c, const Var& x) const;
};

// Self-attention + feed-forward (an encoder layer, or a decoder-only layer under a causal mask).
struct EncoderLayer {
  bool norm_first = false;
  MultiHeadAttention self_attn;
  FeedForwardNet ff;
  Norm norm1, norm2;
  void create(Registry& r, const std::string& prefix, const ModelConfig& cfg, AttentionPositions pos);
  Var operator()(Context& c, const Var& x, const AttentionSpec& spec, LayerCache* cache = nullptr) const;
};

// Masked self-attention, cross-attention to the encoder output, feed-forward.
struct DecoderLayer {
  bool norm_first = false;
  MultiHeadAttention self_attn, cross_attn;
  FeedForwardNet ff;
  Norm norm1, norm2, norm3;
  void create(Registry& r, const std::string& prefix, const ModelConfig& cfg, AttentionPositions pos);
  Var operator()(Context& c, const Var& x, const Var& memory, const AttentionSpec& self_spec,
                 const AttentionSpec& cross_spec, LayerCache* cache = nullptr) const;
};

// A stack of layers and its optional final norm. caches: one per layer while decoding, or null.
struct EncoderStack {
  std::vector<EncoderLayer> layers;
  Norm norm;
  bool has_norm = false;
  void create(Registry& r, const std::string& prefix, int64_t n, const ModelConfig& cfg, AttentionPositions pos);
  Var operator()(Context& c, Var x, const AttentionSpec& spec, std::vector<LayerCache>* caches = nullptr) const;
};

struct DecoderStack {
  std::vector<DecoderLayer> layers;
  Norm norm;
  bool has_norm = false;
  void create(Registry& r, const std::string& prefix, int64_t n, const ModelConfig& cfg, AttentionPositions pos);
  Var operator()(Context& c, Var x, const Var& memory, const AttentionSpec& self_spec, const AttentionSpec& cross_spec,
                 std::vector<LayerCache>* caches = nullptr) const;
};

// Hidden states to vocabulary logits: x W^T (+ b). W is its own parameter or the embedding (tied);
// b (logits_bias) is Marian's final_logits_bias.
struct LMHead {
  Var w, b;
  void create(Registry& r, const std::string& name, int64_t vocab, const ModelConfig& cfg, const Var& tied);
  Var operator()(Context& c, const Var& x) const { return ops::linear(c.tape, x, w, b); }
};

// Pooled classification: mean over each row's real tokens or its first token, then (pooler)
// tanh(dense(.)) as BERT's pooler, then a linear layer.
struct ClassifierHead {
  Pooling pooling = Pooling::Mean;
  bool has_pooler = false;
  Linear pooler;  // (D, D)
  Linear out;     // (num_classes, D)
  void create(Registry& r, const std::string& pooler_name, const std::string& name, const ModelConfig& cfg);
  Var operator()(Context& c, const Var& x, const Tensor& lengths) const;
};

// BERT's masked-LM head: norm(f(x W_t^T + b_t)) W^T + b, W the embedding when tied.
struct MaskedLMHead {
  Activation act = Activation::GeluErf;
  Linear transform;  // (D, D)
  Norm norm;
  LMHead decoder;    // (V, D) tied or not, with its bias
  void create(Registry& r, const std::string& prefix, int64_t vocab, const ModelConfig& cfg, const Var& tied);
  Var operator()(Context& c, const Var& x) const;
};

}  // namespace qkv::nn
