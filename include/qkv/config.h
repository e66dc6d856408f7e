// qkv/config.h: ModelConfig, what a model is made of (config.json in a model directory), and
// the enums it names. Validation and the JSON form are in src/models/config.cpp.
#pragma once
#include <cstdint>
#include <string>

#include "qkv/activation.h"

namespace qkv {

// Decoder: a causal stack and an LM head (GPT, Llama). EncoderDecoder: the 2017 translation model.
// EncoderClassifier: an encoder, pooled, and a classification head (BERT for sequence
// classification). EncoderMLM: an encoder and a masked-LM head (BERT for masked LM). Encoder: the
// bare encoder, whose output is its final hidden states (BertModel).
enum class Arch { Decoder, EncoderDecoder, EncoderClassifier, EncoderMLM, Encoder };
// Sinusoidal: the 2017 paper's interleaved sin/cos columns; SinusoidalSplitHalf: all sines, then
// all cosines (Hugging Face's Marian).
enum class Positional { Sinusoidal, Learned, Rope, Alibi, None, SinusoidalSplitHalf };
enum class NormKind { LayerNorm, RMSNorm };
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
  int64_t d_ff = 2048;         // feed-forward inner size (gated: of each of its two halves)
  int64_t n_layers = 6;        // Decoder and EncoderClassifier
  int64_t n_encoder_layers = 6, n_decoder_layers = 6;  // EncoderDecoder
  Activation activation = Activation::ReLU;
  bool gated = false;          // feed-forward f(x W1) * (x W3) (SwiGLU: silu, gated), as Llama
  NormKind norm = NormKind::LayerNorm;
  double norm_eps = 1e-5;
  bool norm_first = false;     // false: post-norm (the 2017 transformer); true: pre-norm (GPT-2)
  bool final_norm = true;      // a norm after the last layer of each stack ("norm", "encoder.norm", ...)
  Positional positional = Positional::Sinusoidal;
  int64_t max_len = 1024;      // learned positions: table size
  double rope_theta = 10000.0;
  bool scale_embeddings = false;  // embeddings times sqrt(d_model), as in the 2017 paper
  bool tie_embeddings = false;    // the output projection is the (target) embedding matrix
  bool share_embeddings = false;  // encoder-decoder: one embedding matrix for source and target
  int64_t type_vocab_size = 0;    // token-type (segment) embeddings added to the input (BERT); 0: none
  bool embed_norm = false;        // a LayerNorm over the embeddings (BERT)
  bool logits_bias = false;       // a bias on the LM head's logits (Marian's final_logits_bias)
  bool pooler = false;            // classifier: dense + tanh over the pooled vector first (BERT's pooler)
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

const char* arch_name(Arch a);
const char* positional_name(Positional p);

}  // namespace qkv
