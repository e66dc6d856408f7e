// Attention maps of one forward pass: the model's own layers, run once with a cache per layer
// whose modules keep their queries, keys and logsumexp (nn::KVCache::keep_inputs).
#include "qkv/inspect.h"

#include <algorithm>
#include <utility>

#include "models/model_impl.h"
#include "qkv/error.h"

namespace qkv {

std::vector<float> AttentionMap::weights(int64_t b, int64_t h, int64_t r0, int64_t r1) const {
  const int64_t B = q.size(0), H = heads(), G = k.size(1), Tk = cols();
  check(b >= 0 && b < B, "attention map: batch row ", b, " is outside [0, ", B, ")");
  check(h >= 0 && h < H, "attention map: head ", h, " is outside [0, ", H, ")");
  check(r0 >= 0 && r0 <= r1 && r1 <= rows(), "attention map: rows [", r0, ", ", r1, ") are outside [0, ", rows(), "]");
  check(!spec.mask && !spec.bool_mask, "attention map: explicit mask tensors are not kept");
  if (r0 == r1) return {};
  // one head of one row: its queries, its group's keys, its logsumexp, its ALiBi slope
  const int64_t g = h / (H / G);
  AttentionSpec s = spec;
  if (s.alibi) s.alibi_slopes = {s.alibi_slopes.empty() ? alibi_slopes(H)[static_cast<size_t>(h)]
                                                        : s.alibi_slopes[static_cast<size_t>(h)]};
  if (s.key_lengths) s.key_lengths = s.key_lengths->slice(0, b, b + 1).contiguous();
  const Tensor qh = q.slice(0, b, b + 1).slice(1, h, h + 1).contiguous();
  const Tensor kh = k.slice(0, b, b + 1).slice(1, g, g + 1).contiguous();
  const Tensor lh = lse.slice(0, b, b + 1).slice(1, h, h + 1).contiguous();
  const Tensor w = attention_weights(qh, kh, lh, s, r0, r1).contiguous();  // (1, 1, r1 - r0, Tk)
  check(w.numel() == (r1 - r0) * Tk, "attention map: internal: ", w.numel(), " weights for ", r1 - r0, " x ", Tk);
  std::vector<float> out(w.data<float>(), w.data<float>() + w.numel());
  // exp(s - lse) inherits lse's float32 rounding as one factor exp(-delta) per row: for scores in
  // the hundreds that is ~1e-5 on a weight near 1. The row's sum (in double) divides it out.
  for (int64_t r = 0; r < r1 - r0; ++r) {
    float* row = out.data() + r * Tk;
    double sum = 0;
    for (int64_t j = 0; j < Tk; ++j) sum += row[j];
    if (sum > 0)
      for (int64_t j = 0; j < Tk; ++j) row[j] = static_cast<float>(row[j] / sum);
  }
  return out;
}

namespace {

// Caches for `layers` layers of B rows and T positions, each module keeping its inputs.
std::vector<nn::LayerCache> keeping_caches(const ModelConfig& c, size_t layers, int64_t B, int64_t T) {
  std::vector<nn::LayerCache> caches(layers);
  for (nn::LayerCache& lc : caches) {
    lc.self.k = Tensor::empty({B, c.kv_heads(), T, c.head_dim_k()});
    lc.self.v = Tensor::empty({B, c.kv_heads(), T, c.head_dim_v()});
    lc.self.keep_inputs = lc.cross.keep_inputs = true;
  }
  return caches;
}

void collect(std::vector<AttentionMap>& out, std::vector<nn::LayerCache>& caches, const char* stack, bool cross) {
  for (size_t l = 0; l < caches.size(); ++l) {
    for (nn::KVCache* kv : {&caches[l].self, cross ? &caches[l].cross : nullptr}) {
      if (!kv) continue;
      check(kv->kept_q.defined(), "trace_attention: internal: layer ", l, " kept nothing");
      out.push_back({stack, kv == &caches[l].self ? "self" : "cross", static_cast<int64_t>(l), std::move(kv->kept_q),
                     std::move(kv->kept_k), std::move(kv->kept_lse), std::move(kv->kept_spec)});
    }
  }
}

}  // namespace

AttentionTrace trace_attention(const Model& model, const Batch& batch) {
  model.check_batch(batch);
  const ModelConfig& c = model.config();
  const Model::Impl& m = model.impl();
  const Tensor lengths = Model::Impl::resolve_lengths(model, batch.input, batch.input_lengths);
  Tape tape;
  tape.recording = false;
  AttentionTrace t;
  const int64_t B = batch.input.size(0), T = batch.input.size(1);
  // every token of a row at once, from position 0: one uniform step over a cache of exactly T
  const nn::Step step{std::vector<int64_t>(static_cast<size_t>(B), 0), T};
  nn::Context ctx{tape, false, 0.0f, 0, 0, &step};
  if (c.arch == Arch::EncoderDecoder) {
    // the encoder over T source positions, the decoder over Td target positions: a step each
    const int64_t Td = batch.decoder_input.size(1);
    const nn::Step dstep{std::vector<int64_t>(static_cast<size_t>(B), 0), Td};
    nn::Context dctx{tape, false, 0.0f, 0, 0, &dstep};
    std::vector<nn::LayerCache> enc = keeping_caches(c, m.stack.layers.size(), B, T);
    std::vector<nn::LayerCache> dec = keeping_caches(c, m.decoder.layers.size(), B, Td);
    Model::Impl::Pass p{.ids = batch.decoder_input, .lengths = lengths, .src = batch.input, .encoder = &ctx,
                        .caches = &dec, .encoder_caches = &enc};
    t.logits = m.forward(dctx, p)->value;
    collect(t.maps, enc, "encoder", false);
    collect(t.maps, dec, "decoder", true);
    return t;
  }
  const bool causal = c.arch == Arch::Decoder;
  std::vector<nn::LayerCache> caches = keeping_caches(c, m.stack.layers.size(), B, T);
  Model::Impl::Pass p{.ids = batch.input, .lengths = lengths, .causal = causal, .caches = &caches};
  t.logits = m.forward(ctx, p)->value;
  collect(t.maps, caches, causal ? "decoder" : "encoder", false);
  return t;
}

}  // namespace qkv
