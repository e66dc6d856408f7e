// Proof that the training loop learns: a decoder-only LM overfits one batch, and an
// encoder-decoder learns to copy, reverse and sort digit sequences, judged by greedy decoding
// (written here, from Model::encode and Model::decode) on held-out sequences.
//
// Everything is seeded, so a run repeats exactly for a given thread count. The step budgets
// leave a margin: while tuning, seeds 1, 2 and 3 each reached 100% on copy, reverse and sort
// within the budgets below (see the figures printed as the tests run).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "qkv/model.h"
#include "qkv/rng.h"
#include "qkv/train.h"

namespace qkv {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- a decoder-only LM memorises one batch ----------------------------------------------------------

TEST(Learn, DecoderOverfitsOneBatch) {
  ModelConfig c;
  c.arch = Arch::Decoder;
  c.vocab_size = 16;
  c.d_model = 32;
  c.n_heads = 4;
  c.d_ff = 64;
  c.n_layers = 2;
  c.max_len = 16;
  c.norm_first = true;
  c.positional = Positional::Learned;
  c.pad_id = 0;
  Model m(c);
  m.init(1);
  // 4 rows of 17 random tokens in [1, 16), each row with its own first token, so every prefix
  // is distinct and the next token is a function of it: a zero loss is reachable.
  constexpr int64_t B = 4, T = 16;
  Rng rng(2);
  std::vector<int64_t> in, tg;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> row{b + 1};
    for (int64_t t = 0; t < T; ++t) row.push_back(1 + static_cast<int64_t>(rng.below(15)));
    in.insert(in.end(), row.begin(), row.end() - 1);
    tg.insert(tg.end(), row.begin() + 1, row.end());
  }
  Batch batch;
  batch.input = Tensor::from<int64_t>({B, T}, in);
  batch.target = Tensor::from<int64_t>({B, T}, tg);

  TrainConfig tc;
  tc.schedule.lr = 1e-2;
  tc.schedule.warmup = 10;
  tc.weight_decay = 0.0;
  Trainer t(m, tc);
  constexpr int kMaxSteps = 300;
  const auto t0 = std::chrono::steady_clock::now();
  double first = 0, loss = 0;
  int steps = 0;
  while (steps < kMaxSteps) {
    const StepReport r = t.step({batch});
    ASSERT_FALSE(r.skipped) << "step " << r.step;
    if (steps == 0) first = r.loss;
    loss = r.loss;
    ++steps;
    if (loss < 0.05) break;
  }
  std::printf("[ decoder overfit ] loss %.3f -> %.4f in %d steps (bound %d), %.2f s\n", first, loss, steps, kMaxSteps,
              seconds_since(t0));
  EXPECT_GT(first, 2.0);  // about log(15) at the start
  EXPECT_LT(loss, 0.05) << "after " << steps << " steps";
}

// ---- an encoder-decoder learns copy, reverse and sort ----------------------------------------------

enum class Task { Copy, Reverse, Sort };
constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kDigit0 = 3;  // digits 0..9 are tokens 3..12
constexpr int64_t kMinLen = 6, kMaxLen = 8;

struct Example {
  std::vector<int64_t> src, tgt;  // digit tokens, no bos/eos
};

std::vector<int64_t> solve(Task task, std::vector<int64_t> s) {
  if (task == Task::Reverse) std::reverse(s.begin(), s.end());
  if (task == Task::Sort) std::sort(s.begin(), s.end());
  return s;
}

// n sequences of kMinLen..kMaxLen random digits and their answers.
std::vector<Example> sample(Rng& rng, Task task, int n) {
  std::vector<Example> out;
  for (int i = 0; i < n; ++i) {
    const int64_t len = kMinLen + static_cast<int64_t>(rng.below(kMaxLen - kMinLen + 1));
    Example e;
    for (int64_t j = 0; j < len; ++j) e.src.push_back(kDigit0 + static_cast<int64_t>(rng.below(10)));
    e.tgt = solve(task, e.src);
    out.push_back(e);
  }
  return out;
}

// input (B, kMaxLen): the digits, right-padded; decoder_input (B, kMaxLen + 1): [bos] + answer;
// target (B, kMaxLen + 1): answer + [eos]; padding is pad (ignored by the loss, masked as keys).
Batch to_batch(const std::vector<Example>& ex) {
  const int64_t B = static_cast<int64_t>(ex.size()), S = kMaxLen, T = kMaxLen + 1;
  std::vector<int64_t> in(static_cast<size_t>(B * S), kPad), dec(static_cast<size_t>(B * T), kPad),
      tg(static_cast<size_t>(B * T), kPad);
  for (int64_t b = 0; b < B; ++b) {
    const Example& e = ex[static_cast<size_t>(b)];
    const int64_t n = static_cast<int64_t>(e.src.size());
    for (int64_t j = 0; j < n; ++j) {
      in[static_cast<size_t>(b * S + j)] = e.src[static_cast<size_t>(j)];
      dec[static_cast<size_t>(b * T + 1 + j)] = e.tgt[static_cast<size_t>(j)];
      tg[static_cast<size_t>(b * T + j)] = e.tgt[static_cast<size_t>(j)];
    }
    dec[static_cast<size_t>(b * T)] = kBos;
    tg[static_cast<size_t>(b * T + n)] = kEos;
  }
  Batch batch;
  batch.input = Tensor::from<int64_t>({B, S}, in);
  batch.decoder_input = Tensor::from<int64_t>({B, T}, dec);
  batch.target = Tensor::from<int64_t>({B, T}, tg);
  return batch;
}

// Greedy decoding of every example at once: encode the sources, then repeatedly run the decoder
// over the prefix (starting at [bos]), append each row's argmax at the last position, until every
// row has produced eos or kMaxLen + 1 tokens. Returns the fraction of rows whose output before
// eos equals the answer exactly (a row that never emits eos is wrong).
double greedy_accuracy(const Model& m, const std::vector<Example>& ex) {
  const Batch batch = to_batch(ex);
  const int64_t B = batch.input.size(0);
  Tape tape;
  tape.recording = false;
  const Tensor src_lengths = m.lengths_of(batch.input);
  const Var memory = m.encode(tape, batch.input, src_lengths);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  std::vector<int64_t> prefix(static_cast<size_t>(B), kBos);  // (B, T) row-major
  for (int64_t T = 1; T <= kMaxLen + 1; ++T) {
    const Var logits = m.decode(tape, Tensor::from<int64_t>({B, T}, prefix), memory, src_lengths);  // (B, T, V)
    const int64_t V = logits->value.size(2);
    const float* p = logits->value.data<float>();
    std::vector<int64_t> next;
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      const float* row = p + (b * T + T - 1) * V;
      const int64_t best = std::max_element(row, row + V) - row;
      if (!done[static_cast<size_t>(b)]) {
        if (best == kEos)
          done[static_cast<size_t>(b)] = true;
        else
          out[static_cast<size_t>(b)].push_back(best);
      }
      all_done = all_done && done[static_cast<size_t>(b)];
      next.insert(next.end(), prefix.begin() + b * T, prefix.begin() + (b + 1) * T);
      next.push_back(best);
    }
    prefix = std::move(next);
    if (all_done) break;
  }
  int correct = 0;
  for (int64_t b = 0; b < B; ++b)
    correct += done[static_cast<size_t>(b)] && out[static_cast<size_t>(b)] == ex[static_cast<size_t>(b)].tgt;
  return static_cast<double>(correct) / static_cast<double>(B);
}

// d_model 64, 4 heads, d_ff 128, 2 + 2 layers, pre-norm, learned positions, no dropout; AdamW
// with a warmup-cosine schedule (peak 3e-3) and clipping at 1; 32 fresh random examples per step.
// Evaluation: 200 sequences from another seed. There are 10^6 + 10^7 + 10^8 possible sources and
// training sees at most 32 x 800 of them, so a test sequence was seen in training with
// probability about 2e-4: the accuracy measures the rule, not memory (and is not filtered).
void learn(Task task, const char* name, int steps) {
  ModelConfig c;
  c.arch = Arch::EncoderDecoder;
  c.vocab_size = 13;
  c.d_model = 64;
  c.n_heads = 4;
  c.d_ff = 128;
  c.n_encoder_layers = 2;
  c.n_decoder_layers = 2;
  c.norm_first = true;
  c.positional = Positional::Learned;
  c.max_len = 16;
  c.pad_id = kPad;
  c.bos_id = kBos;
  c.eos_id = kEos;
  Model m(c);
  m.init(1);
  TrainConfig tc;
  tc.schedule.kind = ScheduleKind::WarmupCosine;
  tc.schedule.lr = 3e-3;
  tc.schedule.warmup = steps / 10;
  tc.schedule.total = steps;
  tc.schedule.min_lr = 3e-4;
  tc.clip_norm = 1.0;
  tc.seed = 1;
  Trainer t(m, tc);
  Rng data(8);
  const auto t0 = std::chrono::steady_clock::now();
  double loss = 0;
  for (int s = 0; s < steps; ++s) {
    const StepReport r = t.step({to_batch(sample(data, task, 32))});
    ASSERT_FALSE(r.skipped) << name << ": step " << r.step;
    loss = r.loss;
  }
  const double train_s = seconds_since(t0);
  Rng held_out(20240601);
  const double acc = greedy_accuracy(m, sample(held_out, task, 200));
  std::printf("[ %-7s ] %d steps, final loss %.4f, greedy exact match %.1f%% on 200 held-out, %.1f s (+%.1f s eval)\n",
              name, steps, loss, 100 * acc, train_s, seconds_since(t0) - train_s);
  EXPECT_GE(acc, 0.99) << name;
}

TEST(Learn, EncoderDecoderCopies) { learn(Task::Copy, "copy", 400); }
TEST(Learn, EncoderDecoderReverses) { learn(Task::Reverse, "reverse", 600); }
TEST(Learn, EncoderDecoderSorts) { learn(Task::Sort, "sort", 800); }

}  // namespace
}  // namespace qkv
