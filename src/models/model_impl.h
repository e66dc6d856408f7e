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
#include <cstdint>
#include <vector>

#include "nn/layers.h"
#include "qkv/model.h"

namespace qkv {

struct Model::Impl {
  Arch arch = Arch::Decoder;
  std::vector<nn::Init> inits;
  nn::Embedder embed;           // the tokens (encoder-decoder: the target's)
  nn::Embedder src_embed;       // encoder-decoder: the source's
  nn::EncoderStack stack;       // decoder-only: "layers.i", "norm"; otherwise the encoder: "encoder.*"
  nn::DecoderStack decoder;     // encoder-decoder: "decoder.*"
  nn::LMHead lm_head;           // decoder-only, encoder-decoder
  nn::ClassifierHead classifier;  // encoder-classifier
  nn::MaskedLMHead mlm;           // encoder-mlm

  // The one forward composition. Training (Model::logits, encode, decode), cached decoding
  // (src/infer/generate.cpp) and tracing (trace_attention) all run it; they differ only in the
  // Context (tape, dropout, the decoding Step) and the caches they pass:
  //   memory <- encoder(src_embed(src))            encoder-decoder, unless `memory` is given
  //   x      <- stack(embed(ids))                  causal for a decoder; the decoder over memory
  //   out    <- head(x), or head(x[b, last[b]])    lm_head, classifier, masked-LM head, or x itself
  struct Pass {
    Tensor ids{};      // (B, T): the tokens (an encoder-decoder's: the decoder's input); undefined: encode only
    Tensor lengths{};  // (B) or undefined: key lengths of the input (an encoder-decoder's: of the source)
    Tensor src{};      // encoder-decoder: the source ids (B, S), encoded when `memory` is not given
    Var memory{};      // encoder-decoder: the encoder's output (B, S, D); set when this pass encodes
    bool causal = true;                                     // decoder-only: the self-attention mask
    nn::Context* encoder = nullptr;                         // the encoder's context when not c's
    std::vector<nn::LayerCache>* caches = nullptr;          // the decoder side's (or the only stack's)
    std::vector<nn::LayerCache>* encoder_caches = nullptr;  // the encoder's
    const std::vector<int64_t>* last = nullptr;             // the head sees row b's token last[b] only
    bool hidden = false;                                    // stop before the head: the final hidden states
  };
  // The head's output: logits, or the hidden states of a bare encoder; with `last`, (B, V).
  // An encoder-decoder pass without ids returns the memory.
  Var forward(nn::Context& c, Pass& p) const;

  // The attention masks of the stacks: self-attention (causal in a decoder; key lengths, when
  // given, block padding) and the decoder's cross-attention over the source.
  static AttentionSpec self_spec(bool causal, const Tensor& lengths);
  static AttentionSpec cross_spec(const Tensor& src_lengths);
  // A batch's input lengths: the given ones (checked against ids), or derived from pad_id, or
  // undefined (every row all T).
  static Tensor resolve_lengths(const Model& m, const Tensor& ids, const Tensor& given);
};

}  // namespace qkv
