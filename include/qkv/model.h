// qkv/model.h: the chapter's transformer family, built from the ops in qkv/ops.h.
//
//   Decoder            a decoder-only language model (GPT): causal self-attention layers
//   EncoderDecoder     the 2017 translation model: encoder, decoder with cross-attention
//   EncoderClassifier  an encoder whose pooled output feeds a classification head
//
// A model on disk is a directory holding config.json (ModelConfig) and model.safetensors (the
// parameters, float32), the Hugging Face convention. Parameter names follow PyTorch's
// state_dicts: the layers of nn.TransformerEncoder / nn.TransformerDecoder
// ("encoder.layers.0.self_attn.in_proj_weight", "decoder.layers.1.multihead_attn.out_proj.bias",
// "linear1.weight", "norm1.weight", ...), so those weights load directly. docs/formats.md lists
// every name and shape.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qkv/autograd.h"
#include "qkv/ops.h"
#include "qkv/tensor.h"

namespace qkv {

enum class Arch { Decoder, EncoderDecoder, EncoderClassifier };
enum class Positional { Sinusoidal, Learned, Rope, Alibi, None };
enum class NormKind { LayerNorm, RMSNorm };
enum class FeedForward { ReLU, Gelu, GeluTanh, SwiGLU };
enum class Pooling { Mean, First };

struct ModelConfig {
  Arch arch = Arch::Decoder;
  int64_t vocab_size = 0;      // token vocabulary (encoder-decoder: the target side)
  int64_t src_vocab_size = 0;  // encoder-decoder source vocabulary; 0: vocab_size
  int64_t d_model = 512;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 0;      // grouped-query attention; 0: n_heads
  int64_t d_k = 0;             // per-head query/key size; 0: d_model / n_heads
  int64_t d_v = 0;             // per-head value size; 0: d_k
  int64_t d_ff = 2048;         // feed-forward inner size (SwiGLU: of each of its two halves)
  int64_t n_layers = 6;        // Decoder and EncoderClassifier
  int64_t n_encoder_layers = 6, n_decoder_layers = 6;  // EncoderDecoder
  FeedForward activation = FeedForward::ReLU;
  NormKind norm = NormKind::LayerNorm;
  double norm_eps = 1e-5;
  bool norm_first = false;     // false: post-norm (the 2017 transformer); true: pre-norm (GPT-2)
  bool final_norm = true;      // a norm after the last layer of each stack ("norm", "encoder.norm", ...)
  Positional positional = Positional::Sinusoidal;
  int64_t max_len = 1024;      // learned positions: table size
  double rope_theta = 10000.0;
  bool scale_embeddings = false;  // embeddings times sqrt(d_model), as in the 2017 paper
  bool tie_embeddings = false;    // the output projection is the (target) embedding matrix
  bool bias = true;               // biases in the projections and feed-forward layers
  bool fused_qkv = true;          // one in_proj_weight, or q/k/v_proj_weight
  double dropout = 0.0;           // residual, embedding and feed-forward dropout while training
  int64_t num_classes = 0;        // EncoderClassifier
  Pooling pooling = Pooling::Mean;
  int64_t pad_id = -1;            // token id of padding (ignored by the loss); -1: none
  int64_t bos_id = -1, eos_id = -1;
  double init_std = 0.02;

  // Resolved sizes.
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_dim_k() const { return d_k > 0 ? d_k : d_model / n_heads; }
  int64_t head_dim_v() const { return d_v > 0 ? d_v : head_dim_k(); }
  int64_t source_vocab() const { return src_vocab_size > 0 ? src_vocab_size : vocab_size; }

  // Throws qkv::Error naming the first invalid field.
  void validate() const;
  std::string to_json() const;
  // Unknown or repeated keys, wrong types, integers past int64, invalid values and a NUL byte are
  // errors naming `source` and the key.
  static ModelConfig from_json(const std::string& text, const std::string& source);
  static ModelConfig load(const std::string& path);
};

// One batch. Ids are int32 or int64, right-padded.
struct Batch {
  Tensor input;          // (B, T): tokens (Decoder, EncoderClassifier) or the source (EncoderDecoder)
  Tensor input_lengths;  // (B), optional: real length of each input row; keys beyond it are masked.
                         // Undefined: derived from pad_id when the config has one, else all T.
  Tensor decoder_input;  // (B, T'), EncoderDecoder: the target shifted right (teacher forcing)
  Tensor target;         // (B, T) or (B, T') next tokens, or (B) class labels; optional
};

// What a batch's tensors are called in error messages (a command line passes its flags and
// files: "--input x.npy").
struct BatchNames {
  std::string input = "input", input_lengths = "input_lengths", decoder_input = "decoder_input", target = "target";
};

struct ForwardOptions {
  bool training = false;     // dropout on
  uint64_t dropout_seed = 0; // dropout masks are a function of (seed, site, element)
};

class Model {
 public:
  // Parameters allocated and zero; call init() or load weights. A config whose float32 weights
  // alone would exceed the memory available is refused first (qkv::Error naming the keys).
  explicit Model(ModelConfig config);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelConfig& config() const { return config_; }
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  const Parameter* find(const std::string& name) const;
  int64_t num_parameters() const;
  // The number of parameters `config` implies, counted without allocating anything (the same
  // construction, planned); a double, since a hostile config may imply more than 2^63.
  static double parameter_count(const ModelConfig& config);

  // Random initialisation from `seed` (normal(0, init_std) projections, residual projections
  // scaled by 1/sqrt(2 * layers), unit norms, zero biases). Same seed, same weights.
  void init(uint64_t seed);

  // Logits: (B, T, V) for Decoder, (B, T', V) for EncoderDecoder, (B, num_classes) for
  // EncoderClassifier.
  Var logits(Tape& tape, const Batch& batch, const ForwardOptions& opt = {}) const;
  // Checks a batch against this model before any work, every message naming the tensor as
  // `names` calls it: int ids shaped (B, T) with B, T >= 1 (decoder_input (B, T'), encoder-decoder
  // only and then required), ids in the vocabulary (the source vocabulary for an encoder-decoder's
  // input), rows within max_len for learned positions, input_lengths (B) in [0, T], and a target
  // (when given) shaped like the logits without their last dimension, holding classes or the
  // ignored id (pad_id; -100 for a classifier or without pad_id).
  void check_batch(const Batch& batch, const BatchNames& names = {}) const;
  // Mean cross-entropy of logits against batch.target (pad_id ignored).
  Var loss(Tape& tape, const Var& logits, const Batch& batch, float label_smoothing = 0.0f,
           int64_t* n_counted = nullptr) const;

  // EncoderDecoder pieces, for generation: the encoder output (B, S, d_model), and the logits of
  // decoder_input (B, T') given it.
  Var encode(Tape& tape, const Tensor& src, const Tensor& src_lengths, const ForwardOptions& opt = {}) const;
  Var decode(Tape& tape, const Tensor& decoder_input, const Var& memory, const Tensor& src_lengths,
             const ForwardOptions& opt = {}) const;

  // Lengths of right-padded rows: the position after the last non-pad token (all T if pad_id < 0).
  Tensor lengths_of(const Tensor& ids) const;

  // Name -> tensor (shared with the model, not copied).
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // Copies values in. Every parameter must be present with its exact shape (the error names the
  // tensor and both shapes) unless allow_missing; unknown names are errors.
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& tensors, bool allow_missing = false);

  // dir/config.json and dir/model.safetensors, each written atomically.
  void save(const std::string& dir) const;
  static Model load(const std::string& dir);

  // The modules behind the parameters (src/models/model_impl.h), for cached inference.
  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  ModelConfig config_;
  std::vector<Parameter> params_;
  std::unique_ptr<Impl> impl_;
};

// Teacher forcing: the decoder input for `target` (B, T) is [bos, target[:, :-1]], so position t
// predicts target[t] having seen only the targets before it (under the causal mask).
Tensor shift_right(const Tensor& target, int64_t bos_id);

const char* arch_name(Arch a);
const char* positional_name(Positional p);

}  // namespace qkv
