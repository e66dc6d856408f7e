// qkv/inspect.h: every attention map of one forward pass, for looking at.
//
// The chapter's warning stands: a weight is part of the computation, not an explanation of it.
//
// trace_attention() runs a model over a batch once, through the same layers as Model::logits
// (with a per-layer cache, as generation's prefill does) and keeps, for every attention module,
// what the flash kernel read and saved: its queries, keys and per-row logsumexp. A head's weights
// are then recomputed a block of rows at a time (qkv::attention_weights), so a long input never
// needs every head's full Tq x Tk matrix at once.
//
//   AttentionTrace t = trace_attention(model, batch);
//   for (const AttentionMap& m : t.maps)             // encoder self, decoder self, cross; layer by layer
//     std::vector<float> w = m.weights(0, h, 0, m.rows());   // row b = 0, head h: rows x cols
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/model.h"
#include "qkv/tensor.h"

namespace qkv {

struct AttentionMap {
  std::string stack;  // "encoder" (an encoder's or an encoder-decoder's encoder) or "decoder"
  std::string kind;   // "self" or "cross" (the decoder of an encoder-decoder, over the source)
  int64_t layer = 0;  // index within its stack
  Tensor q, k, lse;   // (B, H, Tq, Dk), (B, G, Tk, Dk), (B, H, Tq): what the flash kernel read and saved
  AttentionSpec spec; // the masks it ran under (causal, key lengths, ALiBi)

  int64_t heads() const { return q.size(1); }
  int64_t rows() const { return q.size(2); }
  int64_t cols() const { return k.size(2); }
  // Row b of the batch, head h, query rows [r0, r1): (r1 - r0) x cols() weights, row-major. A row
  // sums to 1 over its allowed keys (0 elsewhere); a row with no allowed key is all 0. Each row
  // is exp(s - lse), then divided by its own sum (which removes lse's float32 rounding).
  std::vector<float> weights(int64_t b, int64_t h, int64_t r0, int64_t r1) const;
};

struct AttentionTrace {
  std::vector<AttentionMap> maps;  // encoder layers first, then decoder layers (self, then cross)
  Tensor logits;                   // what Model::logits gives for the batch
};

// Checks the batch as Model::check_batch does. Inference only (no dropout, no tape).
AttentionTrace trace_attention(const Model& model, const Batch& batch);

}  // namespace qkv
