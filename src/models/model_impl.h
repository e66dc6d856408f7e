// Model's internals: the parts its parameters belong to. Shared by the model (src/models) and
// cached inference (src/infer), which runs the same parts with a key/value cache; not installed.
//
// An architecture is a composition of parts (src/nn/layers.h):
//   Decoder            embed -> stack (causal) -> lm_head
//   EncoderClassifier  embed -> stack -> classifier (pooled)
//   EncoderMLM         embed -> stack -> mlm (masked-LM head)
//   Encoder            embed -> stack (its hidden states are the output)
//   EncoderDecoder     src_embed -> stack = the encoder;  embed -> decoder (cross-attending) -> lm_head
#pragma once
#include <vector>

#include "nn/layers.h"
#include "qkv/model.h"

namespace qkv {

struct Model::Impl {
  std::vector<nn::Init> inits;
  nn::Embedder embed;           // the tokens (encoder-decoder: the target's)
  nn::Embedder src_embed;       // encoder-decoder: the source's
  nn::EncoderStack stack;       // decoder-only: "layers.i", "norm"; otherwise the encoder: "encoder.*"
  nn::DecoderStack decoder;     // encoder-decoder: "decoder.*"
  nn::LMHead lm_head;           // decoder-only, encoder-decoder
  nn::ClassifierHead classifier;  // encoder-classifier
  nn::MaskedLMHead mlm;           // encoder-mlm

  // The attention masks of the stacks: self-attention (causal in a decoder; key lengths, when
  // given, block padding) and the decoder's cross-attention over the source.
  static AttentionSpec self_spec(bool causal, const Tensor& lengths);
  static AttentionSpec cross_spec(const Tensor& src_lengths);
  // A batch's input lengths: the given ones (checked against ids), or derived from pad_id, or
  // undefined (every row all T).
  static Tensor resolve_lengths(const Model& m, const Tensor& ids, const Tensor& given);
};

}  // namespace qkv
