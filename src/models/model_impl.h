// Model's internals: the modules behind its parameter list. Shared by the model (src/models)
// and cached inference (src/infer), which runs the same modules step by step; not installed.
#pragma once
#include <vector>

#include "nn/layers.h"
#include "qkv/model.h"

namespace qkv {

struct Model::Impl {
  std::vector<nn::Init> inits;
  // Decoder / EncoderClassifier: embed, pos_embed, layers (decoder: "layers.i", classifier:
  // "encoder.layers.i"), norm. EncoderDecoder: src_* / tgt_*, enc_layers, dec_layers.
  Var embed, pos_embed, src_embed, src_pos_embed;
  std::vector<nn::EncoderLayer> enc_layers;
  std::vector<nn::DecoderLayer> dec_layers;
  nn::Norm enc_norm, dec_norm;
  bool has_enc_norm = false, has_dec_norm = false;
  Var lm_head;            // (V, D): its own weight or the embedding when tied
  nn::Linear classifier;  // (num_classes, D)
};

}  // namespace qkv
