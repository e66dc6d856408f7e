// Cached generation: the model's own modules (norms, feed-forward, projections) run step by step
// without a tape, and self-attention reads its keys and values from a per-layer cache instead of
// recomputing them. Greedy, sampling and beam search share one Session.
#include "qkv/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "kernels/train_isa.h"
#include "models/model_impl.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/ops.h"
#include "qkv/parallel.h"
#include "qkv/rng.h"

namespace qkv {
namespace {

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();

// One row's captured attention: for each fed position (or generated token), its weights.
using CaptureRows = std::vector<std::vector<float>>;

// The decoder of a model, run token by token over a cache: the model's own parts (embedder,
// stack, head) with a LayerCache per layer, or with none (use_cache = false: every step
// recomputes the whole prefix through the training forward pass, the slow twin the cache is
// tested against). Row b's tokens sit at cache indices 0, 1, ... (its positions); rows may have
// different lengths.
class Session {
 public:
  // name: the API function, for messages ("generate", "translate")
  Session(const Model& model, int64_t B, int64_t Tmax, const GenerateConfig& g, const char* name)
      : cfg_(model.config()), m_(model.impl()), name_(name), B_(B), Tmax_(Tmax), cached_(g.use_cache) {
    tape_.recording = false;
    const bool encdec = cfg_.arch == Arch::EncoderDecoder;
    const int64_t L = encdec ? static_cast<int64_t>(m_.decoder.layers.size()) : static_cast<int64_t>(m_.stack.layers.size());
    const int64_t G = cfg_.kv_heads(), Dk = cfg_.head_dim_k(), Dv = cfg_.head_dim_v();
    if (cached_) {
      caches_.resize(static_cast<size_t>(L));
      for (nn::LayerCache& lc : caches_) {
        lc.self.k = Tensor::empty({B, G, Tmax, Dk});
        lc.self.v = Tensor::empty({B, G, Tmax, Dv});
      }
    }
    check(cached_ || !g.capture_attention, name_, ": attention capture needs the cache (use_cache)");
    if (g.capture_attention) {
      capture_layer_ = g.attention_layer < 0 ? L + g.attention_layer : g.attention_layer;
      check(capture_layer_ >= 0 && capture_layer_ < L, name_, ": attention_layer ", g.attention_layer,
            " is outside the model's ", L, encdec ? " decoder layers" : " layers");
      check(g.attention_head >= 0 && g.attention_head < cfg_.n_heads, name_, ": attention_head ", g.attention_head,
            " is outside the model's ", cfg_.n_heads, " heads");
      // decoder-only: self-attention over prompt + generated; encoder-decoder: cross-attention
      nn::LayerCache& lc = caches_[static_cast<size_t>(capture_layer_)];
      (encdec ? lc.cross : lc.self).capture_head = g.attention_head;
      captured_.resize(static_cast<size_t>(B));
    }
  }

  // Encoder-decoder: the encoder output (B, S, D) and source lengths (B). Each cross-attention
  // layer computes its keys and values from it on the first step (with the cache: once).
  void set_memory(const Tensor& memory, const Tensor& src_lengths) {
    src_lengths_ = src_lengths;
    memory_ = make_var(memory);
  }

  // Runs ids (B, Tn), row-major, through the decoder: row b's token i at position pos[b] + i.
  // Either every pos[b] is equal or Tn == 1 (nn::Step); without the cache, every pos[b] is 0.
  // Returns the logits (B, V) of token last[b] of each row.
  // `rows` < B: only the cache's first `rows` rows run (DecodeSlots keeps its busy rows there).
  // head = false: the stack only (a prompt chunk whose logits nobody reads); returns the hidden
  // states of the `last` tokens.
  Tensor run(const std::vector<int64_t>& ids, int64_t Tn, const std::vector<int64_t>& pos,
             const std::vector<int64_t>& last, int64_t rows = -1, bool head = true) {
    const int64_t R = rows < 0 ? B_ : rows;
    check(R >= 1 && R <= B_ && static_cast<int64_t>(pos.size()) == R, name_, ": internal: ", R, " rows of ", B_);
    nn::Step step{pos, Tn};
    check(step.uniform() || Tn == 1, name_, ": internal: ragged positions need one token per step");
    check(cached_ || std::all_of(pos.begin(), pos.end(), [](int64_t p) { return p == 0; }), name_,
          ": internal: without the cache every step starts at position 0");
    for (int64_t b = 0; b < R; ++b)
      check(pos[b] + Tn <= Tmax_, name_, ": position ", pos[b] + Tn - 1, " is beyond the cache's ", Tmax_);
    Tensor idt({R, Tn}, DType::I64);
    std::copy(ids.begin(), ids.end(), idt.data<int64_t>());
    nn::Context c{tape_, false, 0.0f, 0, 0, cached_ ? &step : nullptr};
    Model::Impl::Pass p{.ids = idt, .lengths = src_lengths_, .memory = memory_, .caches = cached_ ? &caches_ : nullptr,
                        .last = &last, .hidden = !head};
    Tensor logits = m_.forward(c, p)->value;
    collect_capture(pos, Tn);
    return logits;
  }

  // Cache rows reordered: new row r <- old row from[r] (beam search). Cross-attention caches stay:
  // a request's beams share its source.
  void reorder(const std::vector<int64_t>& from, int64_t filled) {
    for (nn::LayerCache& lc : caches_) {
      lc.self.k = gather_rows(lc.self.k, from, filled);
      lc.self.v = gather_rows(lc.self.v, from, filled);
    }
    if (!captured_.empty()) {
      std::vector<CaptureRows> old = captured_;
      for (int64_t r = 0; r < B_; ++r) captured_[r] = old[from[r]];
    }
  }

  std::vector<CaptureRows>& captured() { return captured_; }

  // Floats of keys and values per position, over all layers.
  int64_t floats_per_position() const {
    int64_t n = 0;
    for (const nn::LayerCache& lc : caches_) n += lc.self.k.size(1) * (lc.self.k.size(3) + lc.self.v.size(3));
    return n;
  }

  // Positions start .. start + n - 1 of row `row`'s self-attention caches to or from `buf`, n *
  // floats_per_position() floats: per layer, keys then values, per head, n positions each.
  void save_positions(int64_t row, int64_t start, int64_t n, float* buf) const { move(row, start, n, buf, true); }
  void load_positions(int64_t row, int64_t start, int64_t n, const float* buf) {
    move(row, start, n, const_cast<float*>(buf), false);  // only read when loading
  }

  // Row `to` of this session's self-attention caches <- row `from` of `other`'s, positions
  // 0 .. filled - 1 (a prompt run alone, moved into a slot).
  void copy_row_from(const Session& other, int64_t from, int64_t to, int64_t filled) {
    for (size_t l = 0; l < caches_.size(); ++l) {
      for (const bool keys : {true, false}) {
        const Tensor& src = keys ? other.caches_[l].self.k : other.caches_[l].self.v;
        Tensor& dst = keys ? caches_[l].self.k : caches_[l].self.v;
        // (B, G, T, D): each head's first `filled` positions
        const int64_t G = dst.size(1), D = dst.size(3), Ts = src.size(2), Td = dst.size(2);
        for (int64_t g = 0; g < G; ++g)
          std::copy(src.data<float>() + ((from * G + g) * Ts) * D, src.data<float>() + ((from * G + g) * Ts + filled) * D,
                    dst.data<float>() + ((to * G + g) * Td) * D);
      }
    }
  }

 private:
  void move(int64_t row, int64_t start, int64_t n, float* buf, bool out) const {
    check(start >= 0 && n >= 0 && start + n <= Tmax_, name_, ": internal: positions ", start, " .. ", start + n - 1,
          " in a cache of ", Tmax_);
    for (const nn::LayerCache& lc : caches_)
      for (const Tensor* t : {&lc.self.k, &lc.self.v}) {
        const int64_t G = t->size(1), D = t->size(3);
        float* base = t->data<float>();  // a handle: const here is the session's, not the buffer's
        for (int64_t g = 0; g < G; ++g) {
          float* at = base + ((row * G + g) * Tmax_ + start) * D;
          if (out) std::copy(at, at + n * D, buf);
          else std::copy(buf, buf + n * D, at);
          buf += n * D;
        }
      }
  }

  // The captured head's weights of this step, appended per row: decoder-only, one row per fed
  // position (over keys 0 .. that position); encoder-decoder, the last fed token's row over the
  // source.
  void collect_capture(const std::vector<int64_t>& pos, int64_t Tn) {
    if (capture_layer_ < 0) return;
    const nn::LayerCache& lc = caches_[static_cast<size_t>(capture_layer_)];
    if (cfg_.arch == Arch::EncoderDecoder) {
      const Tensor& w = lc.cross.captured;  // (B, Tn, S)
      const int64_t S = w.size(2);
      for (int64_t b = 0; b < B_; ++b) {
        const float* row = w.data<float>() + (b * Tn + Tn - 1) * S;
        captured_[b].emplace_back(row, row + S);
      }
      return;
    }
    const Tensor& w = lc.self.captured;  // (B, Tn, Tk)
    const int64_t Tk = w.size(2);
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t i = 0; i < Tn; ++i) {
        const int64_t p = pos[b] + i;
        const float* row = w.data<float>() + (b * Tn + i) * Tk;
        CaptureRows& rows = captured_[b];
        if (static_cast<int64_t>(rows.size()) <= p) rows.resize(static_cast<size_t>(p + 1));
        rows[p].assign(row, row + p + 1);
      }
  }

  Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& from, int64_t filled) const {
    // t: (B, G, Tmax, D); copies the first `filled` positions of each row
    const int64_t G = t.size(1), D = t.size(3);
    Tensor out = Tensor::empty(t.shape());
    for (int64_t r = 0; r < B_; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const float* s = t.data<float>() + ((from[r] * G + g) * Tmax_) * D;
        std::copy(s, s + filled * D, out.data<float>() + ((r * G + g) * Tmax_) * D);
      }
    return out;
  }

  const ModelConfig& cfg_;
  const Model::Impl& m_;
  const char* name_;
  int64_t B_, Tmax_;
  bool cached_;
  Tape tape_;
  std::vector<nn::LayerCache> caches_;
  Var memory_;
  Tensor src_lengths_;
  int64_t capture_layer_ = -1;
  std::vector<CaptureRows> captured_;
};

// log sum_j exp(z_j), in double, the largest subtracted first.
double logsumexp(const float* z, int64_t V) {
  double m = kNegInfD;
  for (int64_t j = 0; j < V; ++j) m = std::max(m, static_cast<double>(z[j]));
  double s = 0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(z[j]) - m);
  return m + std::log(s);
}

// The same on the CPU's vectors (float exponentials summed in float within blocks of the row and in
// double across them; kernels::sum_exp): for the log-probability of each sampled token, which
// decoding computes once per token over the whole vocabulary (the scalar loop's libm exp took
// 3-4% of a decoding step of a 135M-parameter model).
double logsumexp_fast(const float* z, int64_t V) {
  static const kernels::TrainIsa k = kernels::train_isa(active_isa());
  const float m = k.row_max(z, V);
  if (!std::isfinite(m)) return logsumexp(z, V);  // -inf everywhere, or NaN/inf: the careful path
  return static_cast<double>(m) + std::log(k.sum_exp(z, V, m, nullptr));
}

// log softmax of one row of logits, in double.
std::vector<double> log_softmax(const float* z, int64_t V) {
  const double lse = logsumexp(z, V);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) out[j] = static_cast<double>(z[j]) - lse;
  return out;
}

// The next token of one row: greedy or sampled, after the repetition penalty.
int32_t choose(const float* logits, int64_t V, const std::vector<int32_t>& history, const SamplingConfig& s, Rng& rng,
               size_t generated_from = 0) {
  // V <- the ids that may be chosen: the rows past vocab_limit are never candidates
  if (s.vocab_limit > 0 && s.vocab_limit < V) V = s.vocab_limit;
  // greedy without a penalty: the first largest logit (what the double copy below would pick: the
  // widening is exact and keeps the order)
  const bool counted = s.presence_penalty != 0.0f || s.frequency_penalty != 0.0f;
  if (s.greedy && s.repetition_penalty == 1.0f && s.logit_bias.empty() && !counted)
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  std::vector<double> z(logits, logits + V);
  // z_t <- z_t / penalty (z_t > 0) or z_t * penalty (z_t <= 0), once per token in the history
  if (s.repetition_penalty != 1.0f) {
    const std::set<int32_t> seen(history.begin(), history.end());
    for (int32_t t : seen)
      if (t < V) z[t] = z[t] > 0 ? z[t] / s.repetition_penalty : z[t] * s.repetition_penalty;
  }
  // z_t <- z_t - frequency * count_t - presence * (count_t > 0), count_t: t among the generated
  if (counted && generated_from < history.size()) {
    std::map<int32_t, int64_t> count;
    for (size_t i = generated_from; i < history.size(); ++i) ++count[history[i]];
    for (const auto& [t, c] : count)
      if (t >= 0 && t < V)
        z[t] -= static_cast<double>(s.frequency_penalty) * static_cast<double>(c) + static_cast<double>(s.presence_penalty);
  }
  for (const auto& [t, b] : s.logit_bias)
    if (t >= 0 && t < V) z[t] += b;
  if (s.greedy) return static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
  // z <- z / temperature ; keep the top_k largest ; p <- softmax(z) ; keep the top_p nucleus
  // (tokens ranked by logit, ties by id; no ranking needed without top-k or top-p)
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
  if (s.top_p < 1.0f) {
    std::sort(order.begin(), order.end(), before);
  } else if (s.top_k > 0 && s.top_k < V) {
    std::partial_sort(order.begin(), order.begin() + s.top_k, order.end(), before);
  } else {
    std::swap(order[0], order[std::max_element(z.begin(), z.end()) - z.begin()]);  // zmax first
  }
  int64_t keep = V;
  if (s.top_k > 0) keep = std::min<int64_t>(keep, s.top_k);
  const double zmax = z[order[0]];
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += p[i] = std::exp((z[order[i]] - zmax) / s.temperature);
  if (s.top_p < 1.0f) {
    double cum = 0;
    int64_t n = 0;
    while (n < keep) {
      cum += p[n++] / sum;
      if (cum >= s.top_p) break;
    }
    keep = std::max<int64_t>(1, n);
    sum = 0;
    for (int64_t i = 0; i < keep; ++i) sum += p[i];
  }
  // u ~ U[0, sum): the first token whose cumulative mass passes u
  const double u = rng.uniform() * sum;
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) return order[i];
  }
  return order[keep - 1];
}

int64_t resolve_eos(const GenerateConfig& g, const ModelConfig& c) { return g.eos_id == -2 ? c.eos_id : g.eos_id; }

void check_ids(const char* fn, const std::vector<std::vector<int32_t>>& rows, int64_t V, const char* what) {
  for (size_t b = 0; b < rows.size(); ++b) {
    check(!rows[b].empty(), fn, ": ", what, " ", b, " is empty");
    for (size_t i = 0; i < rows[b].size(); ++i)
      check(rows[b][i] >= 0 && rows[b][i] < V, fn, ": ", what, " ", b, " token ", i, " = ", rows[b][i],
            " is outside the vocabulary [0, ", V, ")");
  }
}

void check_config(const char* fn, const GenerateConfig& g) {
  check(g.max_new_tokens >= 1, fn, ": max_new_tokens must be >= 1, got ", g.max_new_tokens);
  check(g.beam_size >= 1, fn, ": beam_size must be >= 1, got ", g.beam_size);
  check(g.sampling.temperature > 0, fn, ": temperature must be > 0, got ", g.sampling.temperature);
  check(g.sampling.top_k >= 0, fn, ": top_k must be >= 0, got ", g.sampling.top_k);
  check(g.sampling.top_p > 0 && g.sampling.top_p <= 1, fn, ": top_p must be in (0, 1], got ", g.sampling.top_p);
  check(g.sampling.repetition_penalty > 0, fn, ": repetition_penalty must be > 0, got ",
        g.sampling.repetition_penalty);
  check(std::isfinite(g.sampling.presence_penalty) && std::isfinite(g.sampling.frequency_penalty), fn,
        ": presence_penalty and frequency_penalty must be finite, got ", g.sampling.presence_penalty, " and ",
        g.sampling.frequency_penalty);
  for (const auto& [t, b] : g.sampling.logit_bias)
    check(t >= 0 && std::isfinite(b), fn, ": logit_bias holds token ", t, " with bias ", b,
          " (expected an id >= 0 and a finite bias)");
  check(g.use_cache || !g.capture_attention, fn, ": attention capture needs the cache (use_cache)");
  check(std::isfinite(g.length_penalty), fn, ": length_penalty must be finite, got ", g.length_penalty);
  const bool beams = g.beam_size > 1 || g.beam_search;
  check(g.sampling.greedy || !beams, fn, ": sampling (greedy = false) and beam search (beam_size ", g.beam_size,
        ") exclude each other: beam search keeps the most probable continuations, it draws none");
  const int64_t most = beams ? g.beam_size : 1;
  check(g.num_return >= 1 && g.num_return <= most, fn, ": num_return = ", g.num_return, ", expected 1 .. ", most,
        beams ? " (the beam size)" : " (without beam search each row has one continuation)");
}

// Every logit a decision reads is finite. A NaN or infinite logit (weights holding NaN or
// infinity, or activations that overflow) would otherwise become an arbitrary token, often the
// end of the sequence: an empty output reported as a result.
void check_finite_logits(const float* z, int64_t V, const char* what, int64_t row, int64_t step) {
  for (int64_t j = 0; j < V; ++j)
    if (!std::isfinite(z[j]))
      throw Error(detail::concat(what, ": the model's logits are not finite (token ", j, " of row ", row, " is ", z[j],
                                 " at step ", step + 1,
                                 "): its weights hold NaN or infinity, or its activations overflow"));
}

// The shared driver. Each of the B * K rows holds a sequence (prefix + generated tokens); `feed`
// runs the rows' newest tokens (or, without the cache, every row's whole sequence) and returns
// the next-token logits (B * K, V).
struct Driver {
  const Model& model;
  const GenerateConfig& g;
  int64_t V, eos;
  int64_t B, K;              // requests, beams per request
  Session& session;
  std::vector<std::vector<int32_t>> seq;  // (B * K): prefix + generated
  std::vector<int64_t> prefix;            // (B * K): prefix length
  bool decoder_only;

  const char* name() const { return decoder_only ? "generate" : "translate"; }

  // Logits for the next token of every row, given that the rows' sequences grew by one token
  // since the last call (or are new when first).
  Tensor next_logits(bool first) {
    const int64_t R = B * K;
    if (first || !g.use_cache) {
      // prefill: every row's whole sequence, right-padded with its first token
      int64_t Tn = 0;
      for (const auto& s : seq) Tn = std::max<int64_t>(Tn, static_cast<int64_t>(s.size()));
      std::vector<int64_t> ids(static_cast<size_t>(R * Tn)), pos(static_cast<size_t>(R), 0), last(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r) {
        const auto& s = seq[r];
        for (int64_t i = 0; i < Tn; ++i) ids[r * Tn + i] = i < static_cast<int64_t>(s.size()) ? s[i] : s[0];
        last[r] = static_cast<int64_t>(s.size()) - 1;
      }
      return session.run(ids, Tn, pos, last);
    }
    std::vector<int64_t> ids(static_cast<size_t>(R)), pos(static_cast<size_t>(R)), last(static_cast<size_t>(R), 0);
    for (int64_t r = 0; r < R; ++r) {
      ids[r] = seq[r].back();
      pos[r] = static_cast<int64_t>(seq[r].size()) - 1;
    }
    return session.run(ids, 1, pos, last);
  }

  std::vector<Generation> sample() {
    Rng rng(g.sampling.seed);
    std::vector<Generation> out(static_cast<size_t>(B));
    std::vector<bool> done(static_cast<size_t>(B), false);
    Tensor logits = next_logits(true);
    for (int64_t step = 0; step < g.max_new_tokens; ++step) {
      for (int64_t b = 0; b < B; ++b) {
        if (done[b]) continue;
        const float* z = logits.data<float>() + b * V;
        check_finite_logits(z, V, name(), b, step);
        const int32_t t = choose(z, V, seq[b], g.sampling, rng, seq[b].size() - out[b].tokens.size());
        out[b].logprob += static_cast<double>(z[t]) - logsumexp_fast(z, V);  // log_softmax(z)[t]
        out[b].tokens.push_back(t);
        seq[b].push_back(t);
        if (t == eos) done[b] = out[b].finished = true;
        if (g.on_token) g.on_token(b, t);
      }
      if (g.on_step) g.on_step(step);
      if (step + 1 == g.max_new_tokens || std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
      // A finished row keeps being fed its last token at its last position: harmless, it is
      // never read again.
      for (int64_t b = 0; b < B; ++b)
        if (done[b]) seq[b].pop_back();
      logits = next_logits(false);
      for (int64_t b = 0; b < B; ++b)
        if (done[b]) seq[b].push_back(out[b].tokens.back());
    }
    return out;
  }

  std::vector<Generation> beam_search() {
    struct Hyp {
      double score;  // normalised
      double logprob;
      std::vector<int32_t> tokens;
      CaptureRows attention;
    };
    const int64_t R = B * K;
    std::vector<double> score(static_cast<size_t>(R), kNegInfD);  // running beams' log-probabilities
    for (int64_t b = 0; b < B; ++b) score[b * K] = 0;  // only beam 0 is alive at first
    std::vector<std::vector<Hyp>> finished(static_cast<size_t>(B));
    std::vector<bool> done(static_cast<size_t>(B), false);
    auto norm = [&](double lp, size_t len) { return lp / std::pow(static_cast<double>(len), g.length_penalty); };
    Tensor logits = next_logits(true);
    for (int64_t step = 0; step < g.max_new_tokens; ++step) {
      std::vector<int64_t> from(static_cast<size_t>(R));
      std::vector<int32_t> token(static_cast<size_t>(R));
      std::vector<double> new_score(static_cast<size_t>(R), kNegInfD);
      const bool last_step = step + 1 == g.max_new_tokens;
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t j = 0; j < K; ++j) from[b * K + j] = b * K + j, token[b * K + j] = seq[b * K + j].back();
        if (done[b]) continue;
        // candidates: the 2K best continuations of each live beam, ranked by total log-probability
        struct Cand {
          double s;
          int64_t j;
          int32_t t;
        };
        std::vector<Cand> cands;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t r = b * K + j;
          if (score[r] == kNegInfD) continue;
          check_finite_logits(logits.data<float>() + r * V, V, name(), b, step);
          const std::vector<double> lp = log_softmax(logits.data<float>() + r * V, V);
          // candidates come from the ids below vocab_limit (the rows past it have no text)
          const int64_t Vc = g.sampling.vocab_limit > 0 ? std::min(V, g.sampling.vocab_limit) : V;
          std::vector<int32_t> idx(static_cast<size_t>(Vc));
          std::iota(idx.begin(), idx.end(), 0);
          const int64_t n = std::min<int64_t>(2 * K, Vc);
          std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t x, int32_t y) {
            return lp[x] > lp[y] || (lp[x] == lp[y] && x < y);
          });
          for (int64_t i = 0; i < n; ++i) cands.push_back({score[r] + lp[idx[i]], j, idx[i]});
        }
        std::stable_sort(cands.begin(), cands.end(), [](const Cand& x, const Cand& y) {
          return x.s > y.s || (x.s == y.s && (x.j < y.j || (x.j == y.j && x.t < y.t)));
        });
        int64_t kept = 0;
        for (size_t rank = 0; rank < cands.size() && kept < K; ++rank) {
          const Cand& c = cands[rank];
          const int64_t r = b * K + c.j;
          std::vector<int32_t> toks(seq[r].begin() + prefix[r], seq[r].end());
          toks.push_back(c.t);
          if (c.t == eos) {
            if (static_cast<int64_t>(rank) < K) {
              CaptureRows att;
              if (!session.captured().empty()) att = session.captured()[r];
              finished[b].push_back({norm(c.s, toks.size()), c.s, toks, att});
            }
            continue;
          }
          from[b * K + kept] = r;
          token[b * K + kept] = c.t;
          new_score[b * K + kept] = c.s;
          ++kept;
        }
        if (static_cast<int64_t>(finished[b].size()) >= K) done[b] = true;
      }
      // the beams move: rows, caches and scores follow their sources
      std::vector<std::vector<int32_t>> new_seq(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r) new_seq[r] = seq[from[r]];
      for (int64_t b = 0; b < B; ++b)
        if (!done[b])
          for (int64_t j = 0; j < K; ++j) new_seq[b * K + j].push_back(token[b * K + j]);
      int64_t filled = 0;
      for (const auto& s : seq) filled = std::max<int64_t>(filled, static_cast<int64_t>(s.size()));
      if (g.use_cache) session.reorder(from, filled);
      seq = std::move(new_seq);
      for (int64_t b = 0; b < B; ++b)
        if (!done[b])
          for (int64_t j = 0; j < K; ++j) score[b * K + j] = new_score[b * K + j];
      if (g.on_step) g.on_step(step);
      if (last_step || std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
      // done requests' rows: fed their last token again at its position (ignored)
      std::vector<bool> grew(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r) grew[r] = !done[r / K];
      for (int64_t r = 0; r < R; ++r)
        if (!grew[r]) seq[r].push_back(seq[r].back());
      logits = next_logits(false);
      for (int64_t r = 0; r < R; ++r)
        if (!grew[r]) seq[r].pop_back();
    }
    const int64_t n = g.num_return;
    std::vector<Generation> out(static_cast<size_t>(B * n));
    for (int64_t b = 0; b < B; ++b) {
      // Requests without K finished hypotheses also rank their live beams.
      if (!done[b])
        for (int64_t j = 0; j < K; ++j) {
          const int64_t r = b * K + j;
          if (score[r] == kNegInfD) continue;
          std::vector<int32_t> toks(seq[r].begin() + prefix[r], seq[r].end());
          CaptureRows att;
          if (!session.captured().empty()) att = session.captured()[r];
          finished[b].push_back({norm(score[r], toks.size()), score[r], toks, att});
        }
      // the n best, best first (ties: the earlier found)
      std::vector<Hyp>& hyps = finished[b];
      std::stable_sort(hyps.begin(), hyps.end(), [](const Hyp& x, const Hyp& y) { return x.score > y.score; });
      check(static_cast<int64_t>(hyps.size()) >= n, name(), ": beam search found ", hyps.size(),
            " hypotheses for request ", b, ", fewer than num_return = ", n);
      for (int64_t i = 0; i < n; ++i) {
        const Hyp& h = hyps[static_cast<size_t>(i)];
        Generation& o = out[b * n + i];
        o.tokens = h.tokens;
        o.logprob = h.logprob;
        o.finished = !h.tokens.empty() && h.tokens.back() == eos;
        attach(o, h.attention, prefix[b * K]);
      }
    }
    return out;
  }

  // Copies captured rows into a Generation as a dense rows x cols matrix. Decoder-only: the
  // fed positions, prompt + generated - 1 (the last token is never fed); encoder-decoder: one
  // row per generated token.
  void attach(Generation& gen, const CaptureRows& rows, int64_t prefix_len) const {
    if (rows.empty()) return;
    const int64_t want = decoder_only ? prefix_len + static_cast<int64_t>(gen.tokens.size()) - 1
                                      : static_cast<int64_t>(gen.tokens.size());
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(rows.size()), want);
    int64_t cols = 0;
    for (int64_t i = 0; i < n; ++i) cols = std::max<int64_t>(cols, static_cast<int64_t>(rows[i].size()));
    gen.attention.assign(static_cast<size_t>(n * cols), 0.0f);
    for (int64_t i = 0; i < n; ++i) std::copy(rows[i].begin(), rows[i].end(), gen.attention.begin() + i * cols);
    gen.attention_rows = n;
    gen.attention_cols = cols;
  }
};

}  // namespace

int32_t choose_token(const float* logits, int64_t V, const std::vector<int32_t>& history, const SamplingConfig& s,
                     Rng& rng, size_t generated_from) {
  return choose(logits, V, history, s, rng, generated_from);
}

std::vector<double> log_softmax_row(const float* logits, int64_t V) { return log_softmax(logits, V); }

// Busy slots occupy the cache's first rows, so a step runs only them: slot s sits at row
// row[s]; removing a slot moves the last busy row into its place. Steps run their products
// batch-invariantly (qkv::BatchInvariantGemm), so a sequence's logits are bitwise the same
// whichever rows run beside it.
struct DecodeSlots::Impl {
  // The prompt cache is a tree of chunks: a chunk's keys and values depend on every token before
  // it, so a node is a chunk's tokens under its parent (the chunks before it). Prompts that share
  // a prefix share its nodes (a system prompt is kept once, whatever follows it). A prompt reuses
  // the longest path of nodes its chunks match; the least recently used leaves go first when the
  // budget is passed.
  struct Node {
    int64_t parent = -1;  // -1: the prompt's first chunk
    std::vector<int32_t> tokens;
    std::unique_ptr<float[]> kv;  // Session::save_positions of the chunk's positions
    uint64_t used = 0;            // the clock when last read or written
    int64_t children = 0;
  };
  const Model& model;
  DecodeSlotsOptions opt;
  Session batch;
  std::vector<int64_t> len;    // per slot: tokens in its cache, 0 when free
  std::vector<int64_t> row;    // per slot: its cache row, -1 when free
  std::vector<int64_t> owner;  // per busy row: its slot
  std::map<int64_t, Node> nodes;                                   // the prompt cache, by id
  std::map<std::pair<int64_t, std::vector<int32_t>>, int64_t> child;  // (parent, chunk tokens) -> id
  int64_t next_node = 0, per_position = 0;
  uint64_t clock = 0;
  Impl(const Model& m, int64_t slots, int64_t max_len, const DecodeSlotsOptions& o)
      : model(m), opt(o), batch(m, slots, max_len, GenerateConfig{}, "DecodeSlots"), len(static_cast<size_t>(slots), 0),
        row(static_cast<size_t>(slots), -1), per_position(batch.floats_per_position()) {}

  int64_t chunk_bytes() const { return opt.prompt_chunk * per_position * static_cast<int64_t>(sizeof(float)); }

  // The nodes of `prompt`'s first `chunks` whole chunks that the cache holds, in order (the path
  // stops at the first chunk it lacks).
  std::vector<int64_t> path(const std::vector<int32_t>& prompt, int64_t chunks) const {
    std::vector<int64_t> out;
    const int64_t C = opt.prompt_chunk;
    int64_t parent = -1;
    for (int64_t k = 0; k < chunks; ++k) {
      const auto it = child.find({parent, std::vector<int32_t>(prompt.begin() + k * C, prompt.begin() + (k + 1) * C)});
      if (it == child.end()) break;
      out.push_back(parent = it->second);
    }
    return out;
  }

  // Drops the least recently used leaf that is not in `keep`; false when there is none.
  bool evict(const std::vector<int64_t>& keep) {
    auto lru = nodes.end();
    for (auto it = nodes.begin(); it != nodes.end(); ++it)
      if (it->second.children == 0 && std::find(keep.begin(), keep.end(), it->first) == keep.end() &&
          (lru == nodes.end() || it->second.used < lru->second.used))
        lru = it;
    if (lru == nodes.end()) return false;
    Node& n = lru->second;
    if (n.parent >= 0) --nodes.at(n.parent).children;
    child.erase({n.parent, n.tokens});
    nodes.erase(lru);
    return true;
  }

  // Keeps the whole chunks of a prompt just run in row 0 of `one`: the chunks the cache lacks are
  // added under the ones it has, as long as the budget holds (evicting other leaves first).
  void keep(const std::vector<int32_t>& prompt, const Session& one) {
    const int64_t C = opt.prompt_chunk, chunks = static_cast<int64_t>(prompt.size()) / C;
    std::vector<int64_t> have = path(prompt, chunks);
    ++clock;
    for (int64_t id : have) nodes.at(id).used = clock;
    for (auto k = static_cast<int64_t>(have.size()); k < chunks; ++k) {
      while (static_cast<int64_t>(nodes.size() + 1) * chunk_bytes() > opt.prompt_cache_bytes)
        if (!evict(have)) return;
      Node n;
      n.parent = have.empty() ? -1 : have.back();
      n.tokens.assign(prompt.begin() + k * C, prompt.begin() + (k + 1) * C);
      n.kv.reset(new float[static_cast<size_t>(C * per_position)]);  // every float written below
      one.save_positions(0, k * C, C, n.kv.get());
      n.used = clock;
      if (n.parent >= 0) ++nodes.at(n.parent).children;
      const int64_t id = next_node++;
      child[{n.parent, n.tokens}] = id;
      nodes.emplace(id, std::move(n));
      have.push_back(id);
    }
  }
};

DecodeSlots::DecodeSlots(const Model& model, int64_t slots, int64_t max_len, const DecodeSlotsOptions& options)
    : slots_(slots), max_len_(max_len) {
  const ModelConfig& c = model.config();
  check(c.arch == Arch::Decoder, "DecodeSlots: the model is ", arch_name(c.arch), "; slots hold decoder-only models");
  check(slots >= 1 && slots <= 64, "DecodeSlots: slots ", slots, " (expected 1 .. 64: steps are batch-invariant up to 64 rows)");
  check(max_len >= 1, "DecodeSlots: max_len ", max_len, " (expected >= 1)");
  check(c.positional != Positional::Learned || max_len <= c.max_len, "DecodeSlots: max_len ", max_len,
        " exceeds the model's ", c.max_len, " learned positions");
  check(options.prompt_chunk >= 0 && options.prompt_chunk <= 65536, "DecodeSlots: prompt_chunk ",
        options.prompt_chunk, " (expected 0 .. 65536; 0: each prompt in one pass)");
  check(options.prompt_cache_bytes >= 0, "DecodeSlots: prompt_cache_bytes ", options.prompt_cache_bytes,
        " (expected >= 0)");
  check(options.prompt_cache_bytes == 0 || options.prompt_chunk >= 1,
        "DecodeSlots: a prompt cache needs prompts in chunks (prompt_chunk >= 1): reuse is exact only at chunk edges");
  impl_ = std::make_unique<Impl>(model, slots, max_len, options);
}

DecodeSlots::~DecodeSlots() = default;

int64_t DecodeSlots::free_slots() const { return slots_ - static_cast<int64_t>(impl_->owner.size()); }

int64_t DecodeSlots::length(int64_t slot) const {
  check(slot >= 0 && slot < slots_, "DecodeSlots: slot ", slot, " is outside [0, ", slots_, ")");
  return impl_->len[static_cast<size_t>(slot)];
}

DecodeSlots::CacheStats DecodeSlots::prompt_cache() const {
  CacheStats st;
  for (const auto& [id, n] : impl_->nodes) st.entries += n.children == 0;
  st.tokens = static_cast<int64_t>(impl_->nodes.size()) * impl_->opt.prompt_chunk;
  st.bytes = static_cast<int64_t>(impl_->nodes.size()) * impl_->chunk_bytes();
  return st;
}

int64_t DecodeSlots::add(const std::vector<int32_t>& prompt, std::vector<float>* logits, bool reuse, int64_t* reused) {
  const ModelConfig& c = impl_->model.config();
  check_ids("DecodeSlots", {prompt}, c.vocab_size, "prompt");
  const auto P = static_cast<int64_t>(prompt.size());
  check(P <= max_len_, "DecodeSlots: a prompt of ", P, " tokens is longer than the slots' max_len ", max_len_);
  const auto it = std::find(impl_->row.begin(), impl_->row.end(), int64_t{-1});
  check(it != impl_->row.end(), "DecodeSlots: no free slot (", slots_, " busy)");
  const int64_t slot = it - impl_->row.begin();
  const bool cached = reuse && impl_->opt.prompt_cache_bytes > 0;
  // the prompt alone, chunk by chunk after what the cache holds, then its keys and values into
  // the next free row
  Session one(impl_->model, 1, P, GenerateConfig{}, "DecodeSlots");
  int64_t from = 0;
  if (cached) {
    // the longest cached path of whole chunks, leaving at least the prompt's last token to run
    const int64_t C = impl_->opt.prompt_chunk;
    const std::vector<int64_t> have = impl_->path(prompt, (P - 1) / C);
    ++impl_->clock;
    for (size_t k = 0; k < have.size(); ++k) {
      Impl::Node& n = impl_->nodes.at(have[k]);
      one.load_positions(0, static_cast<int64_t>(k) * C, C, n.kv.get());
      n.used = impl_->clock;
    }
    from = static_cast<int64_t>(have.size()) * C;
  }
  const std::vector<int64_t> ids(prompt.begin(), prompt.end());
  Tensor z;
  const int64_t C = impl_->opt.prompt_chunk > 0 ? impl_->opt.prompt_chunk : P;
  for (int64_t at = from; at < P;) {
    const int64_t end = std::min(P, (at / C + 1) * C);
    const std::vector<int64_t> chunk(ids.begin() + at, ids.begin() + end);
    z = one.run(chunk, end - at, {at}, {end - at - 1}, -1, end == P);
    at = end;
  }
  check_finite_logits(z.data<float>(), c.vocab_size, "DecodeSlots", slot, 0);
  if (cached) impl_->keep(prompt, one);
  const auto r = static_cast<int64_t>(impl_->owner.size());
  impl_->batch.copy_row_from(one, 0, r, P);
  impl_->owner.push_back(slot);
  impl_->row[static_cast<size_t>(slot)] = r;
  impl_->len[static_cast<size_t>(slot)] = P;
  if (logits) logits->assign(z.data<float>(), z.data<float>() + c.vocab_size);
  if (reused) *reused = from;
  return slot;
}

std::vector<float> DecodeSlots::step(const std::vector<std::pair<int64_t, int32_t>>& feed) {
  const ModelConfig& c = impl_->model.config();
  const int64_t V = c.vocab_size;
  const auto busy = static_cast<int64_t>(impl_->owner.size());
  std::vector<int> fed(static_cast<size_t>(slots_), 0);
  for (const auto& [slot, token] : feed) {
    check(slot >= 0 && slot < slots_ && impl_->row[static_cast<size_t>(slot)] >= 0, "DecodeSlots: step feeds slot ",
          slot, ", which is not busy");
    check(++fed[static_cast<size_t>(slot)] == 1, "DecodeSlots: step feeds slot ", slot, " twice");
    check(token >= 0 && token < V, "DecodeSlots: token ", token, " is outside the vocabulary [0, ", V, ")");
    check(impl_->len[static_cast<size_t>(slot)] < max_len_, "DecodeSlots: slot ", slot, " is full (max_len ", max_len_, ")");
  }
  for (int64_t s = 0; s < slots_; ++s)
    check(fed[s] || impl_->row[static_cast<size_t>(s)] < 0, "DecodeSlots: step must feed every busy slot; slot ", s,
          " is busy and not fed");
  if (busy == 0) return {};
  // the busy rows, each its token at its slot's next position
  std::vector<int64_t> ids(static_cast<size_t>(busy), 0), pos(static_cast<size_t>(busy), 0),
      last(static_cast<size_t>(busy), 0);
  for (const auto& [slot, token] : feed) {
    const int64_t r = impl_->row[static_cast<size_t>(slot)];
    ids[r] = token, pos[r] = impl_->len[static_cast<size_t>(slot)];
  }
  Tensor z;
  {
    BatchInvariantGemm invariant;
    z = impl_->batch.run(ids, 1, pos, last, busy);
  }
  std::vector<float> out(feed.size() * static_cast<size_t>(V));
  for (size_t i = 0; i < feed.size(); ++i) {
    const int64_t slot = feed[i].first, r = impl_->row[static_cast<size_t>(slot)];
    check_finite_logits(z.data<float>() + r * V, V, "DecodeSlots", slot, impl_->len[static_cast<size_t>(slot)]);
    std::copy(z.data<float>() + r * V, z.data<float>() + (r + 1) * V, out.begin() + static_cast<int64_t>(i) * V);
    ++impl_->len[static_cast<size_t>(slot)];
  }
  return out;
}

void DecodeSlots::remove(int64_t slot) {
  check(slot >= 0 && slot < slots_, "DecodeSlots: slot ", slot, " is outside [0, ", slots_, ")");
  const int64_t r = impl_->row[static_cast<size_t>(slot)];
  if (r < 0) return;
  // the last busy row moves into the freed one
  const auto last = static_cast<int64_t>(impl_->owner.size()) - 1;
  if (r != last) {
    const int64_t moved = impl_->owner[static_cast<size_t>(last)];
    impl_->batch.copy_row_from(impl_->batch, last, r, impl_->len[static_cast<size_t>(moved)]);
    impl_->owner[static_cast<size_t>(r)] = moved;
    impl_->row[static_cast<size_t>(moved)] = r;
  }
  impl_->owner.pop_back();
  impl_->row[static_cast<size_t>(slot)] = -1;
  impl_->len[static_cast<size_t>(slot)] = 0;
}

std::vector<Generation> generate(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateConfig& g) {
  const ModelConfig& c = model.config();
  check(c.arch == Arch::Decoder, "generate: the model is ", arch_name(c.arch),
        "; generate continues decoder-only models (use translate for encoder-decoder)");
  check_config("generate", g);
  if (prompts.empty()) return {};
  check_ids("generate", prompts, c.vocab_size, "prompt");
  const int64_t B = static_cast<int64_t>(prompts.size()), K = g.beam_size;
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  const int64_t Tmax = longest + g.max_new_tokens;
  if (c.positional == Positional::Learned)
    check(Tmax - 1 <= c.max_len, "generate: prompt (", longest, " tokens) + max_new_tokens (", g.max_new_tokens,
          ") needs ", Tmax - 1, " positions; the model has max_len ", c.max_len);
  Session session(model, B * K, Tmax, g, "generate");
  Driver d{model, g, c.vocab_size, resolve_eos(g, c), B, K, session, {}, {}, true};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < K; ++j) {
      d.seq.push_back(prompts[b]);
      d.prefix.push_back(static_cast<int64_t>(prompts[b].size()));
    }
  std::vector<Generation> out = K > 1 || g.beam_search ? d.beam_search() : d.sample();
  if (K == 1 && !g.beam_search && g.capture_attention)
    for (int64_t b = 0; b < B; ++b) {
      d.attach(out[b], session.captured()[b], static_cast<int64_t>(prompts[b].size()));
    }
  return out;
}

std::vector<Generation> translate(const Model& model, const std::vector<std::vector<int32_t>>& sources,
                                  const GenerateConfig& g, const std::vector<std::vector<int32_t>>& target_prefixes) {
  const ModelConfig& c = model.config();
  check(c.arch == Arch::EncoderDecoder, "translate: the model is ", arch_name(c.arch), ", not encoder-decoder");
  check(c.bos_id >= 0 && c.bos_id < c.vocab_size, "translate: the model's config needs a bos_id in [0, ",
        c.vocab_size, "), got ", c.bos_id);
  check_config("translate", g);
  if (sources.empty()) return {};
  check_ids("translate", sources, c.source_vocab(), "source");
  const int64_t B = static_cast<int64_t>(sources.size()), K = g.beam_size, R = B * K;
  check(target_prefixes.empty() || static_cast<int64_t>(target_prefixes.size()) == B, "translate: ",
        target_prefixes.size(), " target prefixes for ", B, " sources");
  int64_t longest_prefix = 0;
  for (size_t b = 0; b < target_prefixes.size(); ++b) {
    longest_prefix = std::max<int64_t>(longest_prefix, static_cast<int64_t>(target_prefixes[b].size()));
    for (size_t i = 0; i < target_prefixes[b].size(); ++i)
      check(target_prefixes[b][i] >= 0 && target_prefixes[b][i] < c.vocab_size, "translate: target prefix ", b,
            " token ", i, " = ", target_prefixes[b][i], " is outside the vocabulary [0, ", c.vocab_size, ")");
  }
  int64_t S = 0;
  for (const auto& s : sources) S = std::max<int64_t>(S, static_cast<int64_t>(s.size()));
  if (c.positional == Positional::Learned) {
    check(S <= c.max_len, "translate: a source of ", S, " tokens exceeds the model's max_len ", c.max_len);
    check(longest_prefix + g.max_new_tokens <= c.max_len, "translate: a target prefix of ", longest_prefix,
          " tokens + max_new_tokens ", g.max_new_tokens, " exceed max_len ", c.max_len);
  }
  // memory <- encoder(sources), right-padded; each row repeated for its K beams
  Tensor src({R, S}, DType::I64), len({R}, DType::I64);
  const int64_t pad = c.pad_id >= 0 ? c.pad_id : 0;
  for (int64_t r = 0; r < R; ++r) {
    const auto& s = sources[r / K];
    for (int64_t i = 0; i < S; ++i) src.data<int64_t>()[r * S + i] = i < static_cast<int64_t>(s.size()) ? s[i] : pad;
    len.data<int64_t>()[r] = static_cast<int64_t>(s.size());
  }
  Tape tape;
  tape.recording = false;
  const Tensor memory = model.encode(tape, src, len)->value;
  Session session(model, R, longest_prefix + g.max_new_tokens, g, "translate");
  session.set_memory(memory, len);
  Driver d{model, g, c.vocab_size, resolve_eos(g, c), B, K, session, {}, {}, false};
  // each row starts from bos, then its target prefix (forced, as CTranslate2's target_prefix)
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int32_t> start = {static_cast<int32_t>(c.bos_id)};
    if (!target_prefixes.empty())
      start.insert(start.end(), target_prefixes[r / K].begin(), target_prefixes[r / K].end());
    d.prefix.push_back(static_cast<int64_t>(start.size()));
    d.seq.push_back(std::move(start));
  }
  std::vector<Generation> out = K > 1 || g.beam_search ? d.beam_search() : d.sample();
  if (K == 1 && !g.beam_search && g.capture_attention)
    for (int64_t b = 0; b < B; ++b) d.attach(out[b], session.captured()[b], d.prefix[static_cast<size_t>(b)]);
  return out;
}

TokenScores score_tokens(const Model& model, const std::vector<int32_t>& ids, int64_t top) {
  const ModelConfig& c = model.config();
  check(c.arch == Arch::Decoder, "score_tokens: the model is ", arch_name(c.arch), ", not decoder-only");
  check(top >= 0, "score_tokens: top = ", top, ", expected >= 0");
  check_ids("score_tokens", {ids}, c.vocab_size, "sequence");
  const auto T = static_cast<int64_t>(ids.size());
  Batch b;
  b.input = Tensor::from<int64_t>({1, T}, std::vector<int64_t>(ids.begin(), ids.end()));
  Tape tape;
  tape.recording = false;
  const Tensor logits = model.logits(tape, b)->value.contiguous();  // (1, T, V)
  const int64_t V = c.vocab_size;
  TokenScores out;
  out.logprob.assign(static_cast<size_t>(T), std::numeric_limits<double>::quiet_NaN());
  out.top.resize(static_cast<size_t>(T));
  for (int64_t t = 1; t < T; ++t) {
    const float* row = logits.data<float>() + (t - 1) * V;
    check_finite_logits(row, V, "score_tokens", 0, t - 1);
    const std::vector<double> lp = log_softmax(row, V);
    out.logprob[static_cast<size_t>(t)] = lp[static_cast<size_t>(ids[static_cast<size_t>(t)])];
    if (top == 0) continue;
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = std::min(top, V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t z) { return lp[a] > lp[z] || (lp[a] == lp[z] && a < z); });
    for (int64_t i = 0; i < k; ++i) out.top[static_cast<size_t>(t)].emplace_back(order[i], lp[order[i]]);
  }
  return out;
}

std::vector<std::vector<float>> next_token_logprobs(const Model& model,
                                                    const std::vector<std::vector<int32_t>>& prompts) {
  const ModelConfig& c = model.config();
  check(c.arch == Arch::Decoder, "next_token_logprobs: the model is ", arch_name(c.arch), ", not decoder-only");
  if (prompts.empty()) return {};
  check_ids("next_token_logprobs", prompts, c.vocab_size, "prompt");
  GenerateConfig g;
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  Session session(model, B, longest, g, "next_token_logprobs");
  Driver d{model, g, c.vocab_size, -1, B, 1, session, prompts, {}, true};
  const Tensor logits = d.next_logits(true);
  std::vector<std::vector<float>> out;
  for (int64_t b = 0; b < B; ++b) {
    check_finite_logits(logits.data<float>() + b * c.vocab_size, c.vocab_size, "next_token_logprobs", b, 0);
    const std::vector<double> lp = log_softmax(logits.data<float>() + b * c.vocab_size, c.vocab_size);
    out.emplace_back(lp.begin(), lp.end());
  }
  return out;
}

}  // namespace qkv
