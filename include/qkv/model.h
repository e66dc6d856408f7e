// qkv/model.h: the chapter's transformer family, built from the ops in qkv/ops.h.
//
//   Decoder            a decoder-only language model (GPT, Llama): causal self-attention layers
//   EncoderDecoder     the 2017 translation model: encoder, decoder with cross-attention (Marian)
//   EncoderClassifier  an encoder whose pooled output feeds a classification head
//   EncoderMLM         an encoder with a masked-LM head (BERT)
//   Encoder            the bare encoder: its final hidden states
//
// Hugging Face folders (config.json with "model_type") load too: qkv/hf.h.
//
// A model on disk is a directory holding config.json (ModelConfig) and model.safetensors (the
// parameters, float32), the Hugging Face convention. Parameter names follow PyTorch's
// state_dicts: the layers of nn.TransformerEncoder / nn.TransformerDecoder
// ("encoder.layers.0.self_attn.in_proj_weight", "decoder.layers.1.multihead_attn.out_proj.bias",
// "linear1.weight", "norm1.weight", ...), so those weights load directly. docs/formats.md lists
// every name and shape.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qkv/autograd.h"
#include "qkv/config.h"
#include "qkv/quant.h"
#include "qkv/ops.h"
#include "qkv/tensor.h"

namespace qkv {

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

// How Model::load (and load_hf_model, the GGUF reader) bring a model in for inference.
struct LoadOptions {
  // Pack the weights to this type as they are read (Model::pack_weights' rule, one matrix at a
  // time, so the float32 values of all of them are never held at once). Unset: as stored (float32,
  // or the packed types of a directory written by qkv quantize, which refuses another type).
  std::optional<WType> dtype;
  std::vector<std::string>* fallback = nullptr;  // receives pack_weights' bf16 fallbacks
};

class Model {
 public:
  // Parameters allocated and zero; call init() or load weights. A config whose float32 weights
  // alone would exceed the memory available is refused first (qkv::Error naming the keys).
  explicit Model(ModelConfig config);
  // The same with the parameters allocated but not zeroed, for a loader that fills every one.
  struct Uninitialised {};
  Model(ModelConfig config, Uninitialised);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelConfig& config() const { return config_; }
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  const Parameter* find(const std::string& name) const;
  int64_t num_parameters() const;
  // For inference: packs every projection matrix (each 2-D parameter under weight decay) to `t`,
  // so that ops::linear multiplies by it (qkv/quant.h), and the output layer and the token
  // embedding tables to Q8_0 for Q4_0 and to `t` otherwise, as llama.cpp keeps them at 8 bits or
  // more (the lookup dequantises its rows). A matrix whose rows are not whole blocks of 32 cannot
  // take Q8_0 or Q4_0: it is packed as bf16 and named in `fallback` when given. The float32
  // values of a packed matrix are freed: the model is for inference from then on (training,
  // state_dict and export refuse it; save() writes the packed values, as qkv quantize does).
  // F32 packs nothing. Returns the number of matrices packed.
  int64_t pack_weights(WType t, std::vector<std::string>* fallback = nullptr);
  // The same for one parameter, by name (a loader packs each as it is read); false when the rule
  // keeps it float32.
  bool pack_parameter(const std::string& name, WType t, std::vector<std::string>* fallback = nullptr);
  // For a loader: when that rule packs `name` under `t`, packs it from float32 rows produced by
  // read(first_row, n, dst) a few MiB at a time (its float32 values are never held) and returns
  // true; otherwise returns false, and the loader fills the float32 values itself.
  bool pack_parameter_from(const std::string& name, WType t,
                           const std::function<void(int64_t, int64_t, float*)>& read,
                           std::vector<std::string>* fallback = nullptr);
  // Takes an already packed matrix for parameter `name` (a packed file's tensor): it must be one
  // that pack_weights packs, with the parameter's shape; its float32 values are freed.
  void adopt_packed(const std::string& name, std::shared_ptr<const PackedWeight> w);
  // The type the weights were packed to (F32: none packed).
  WType weight_type() const { return weight_type_; }
  // For a loader of packed files: the type that names the model's packing (the projections').
  void set_weight_type(WType t) { weight_type_ = t; }
  // An error, starting with `what`, when a packed matrix has no float32 values (training,
  // export, state_dict need them).
  void check_not_packed(const char* what) const;
  // Bytes the products read per token: packed matrices at their packed size, the rest float32
  // (less the unused rows of a learned position table).
  double weight_bytes_per_token() const;
  // The number of parameters `config` implies, counted without allocating anything (the same
  // construction, planned); a double, since a hostile config may imply more than 2^63.
  static double parameter_count(const ModelConfig& config);

  // Random initialisation from `seed` (normal(0, init_std) projections, residual projections
  // scaled by 1/sqrt(2 * layers), unit norms, zero biases). Same seed, same weights.
  void init(uint64_t seed);

  // Logits: (B, T, V) for Decoder and EncoderMLM, (B, T', V) for EncoderDecoder, (B, num_classes)
  // for EncoderClassifier; for a bare Encoder its final hidden states (B, T, d_model).
  Var logits(Tape& tape, const Batch& batch, const ForwardOptions& opt = {}) const;
  // The final hidden states (B, T, d_model) of ids (B, T): the last layer's output after the final
  // norm, before any head (embeddings pool them). Rows past input_lengths[b] (when given, else
  // pad_id's) are padding the attention does not see. Not for encoder-decoder models (encode).
  Var hidden_states(Tape& tape, const Tensor& ids, const Tensor& input_lengths = Tensor()) const;
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

  // Name -> tensor (shared with the model, not copied). A packed model (pack_weights) has no
  // float32 values to give: an error.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // Copies values in. Every parameter must be present with its exact shape (the error names the
  // tensor and both shapes) unless allow_missing; unknown names are errors.
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& tensors, bool allow_missing = false);

  // dir/config.json and dir/model.safetensors, each written atomically. A packed model's packed
  // matrices are written as they are held (docs/formats.md, "Packed model directories").
  void save(const std::string& dir) const;
  static Model load(const std::string& dir, const LoadOptions& opt = {});

  // The modules behind the parameters (src/models/model_impl.h), for cached inference.
  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  WType pack_type_of(const Parameter& p, WType t, bool* fell_back) const;

  ModelConfig config_;
  std::vector<Parameter> params_;
  std::unique_ptr<Impl> impl_;
  WType weight_type_ = WType::F32;
};

// Teacher forcing: the decoder input for `target` (B, T) is [bos, target[:, :-1]], so position t
// predicts target[t] having seen only the targets before it (under the causal mask).
Tensor shift_right(const Tensor& target, int64_t bos_id);

}  // namespace qkv
