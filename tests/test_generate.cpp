// Cached generation (qkv/generate.h): the cache changes nothing but the cost. Cached decoding
// gives exactly the tokens of full recomputation for every position scheme, norm placement,
// grouped KV heads and encoder-decoders; next-token log-probabilities match the full forward
// pass; batched requests of unequal lengths equal one-at-a-time; beam size 1 equals greedy; a
// seed fixes the samples; top-k 1 is greedy; captured attention rows are distributions; every
// head of trace_attention (qkv/inspect.h) equals what generation captures for that head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "error_testing.h"
#include "qkv/generate.h"
#include "qkv/inspect.h"
#include "qkv/model.h"

namespace qkv {
namespace {

using testing::error_of;

ModelConfig decoder_config(Positional pos) {
  ModelConfig c;
  c.arch = Arch::Decoder;
  c.vocab_size = 23;
  c.d_model = 16;
  c.n_heads = 4;
  c.d_ff = 32;
  c.n_layers = 2;
  c.positional = pos;
  c.max_len = 64;
  c.norm_first = true;
  c.eos_id = 1;
  c.init_std = 0.3;  // sharp distributions, so the greedy path is far from ties
  return c;
}

ModelConfig encdec_config() {
  ModelConfig c;
  c.arch = Arch::EncoderDecoder;
  c.vocab_size = 19;
  c.src_vocab_size = 21;
  c.d_model = 16;
  c.n_heads = 2;
  c.d_ff = 24;
  c.n_encoder_layers = 2;
  c.n_decoder_layers = 2;
  c.positional = Positional::Sinusoidal;
  c.pad_id = 0;
  c.bos_id = 2;
  c.eos_id = 3;
  c.init_std = 0.3;
  return c;
}

Model make(const ModelConfig& c, uint64_t seed = 5) {
  Model m(c);
  m.init(seed);
  return m;
}

const std::vector<std::vector<int32_t>> kPrompts = {{4, 9, 7, 12, 5}, {6}, {11, 3, 8}};

GenerateConfig greedy(int64_t n, bool cache) {
  GenerateConfig g;
  g.max_new_tokens = n;
  g.use_cache = cache;
  g.eos_id = -1;  // run the full length: more positions compared
  return g;
}

std::vector<std::vector<int32_t>> tokens_of(const std::vector<Generation>& gs) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& g : gs) out.push_back(g.tokens);
  return out;
}

struct DecoderCase {
  const char* name;
  ModelConfig config;
};

std::vector<DecoderCase> decoder_cases() {
  std::vector<DecoderCase> cases;
  for (Positional p : {Positional::Sinusoidal, Positional::Learned, Positional::Rope, Positional::Alibi,
                       Positional::None})
    cases.push_back({positional_name(p), decoder_config(p)});
  ModelConfig llama = decoder_config(Positional::Rope);  // GQA, RMSNorm, SwiGLU, separate Q/K/V
  llama.n_kv_heads = 2;
  llama.norm = NormKind::RMSNorm;
  llama.activation = Activation::SiLU;
  llama.gated = true;
  llama.bias = false;
  llama.fused_qkv = false;
  llama.tie_embeddings = true;
  cases.push_back({"llama-like", llama});
  ModelConfig post = decoder_config(Positional::Learned);  // post-norm, Dk != Dv
  post.norm_first = false;
  post.d_k = 6;
  post.d_v = 3;
  cases.push_back({"post-norm Dk!=Dv", post});
  return cases;
}

TEST(Generate, CachedEqualsFullRecomputation) {
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const Model m = make(dc.config);
    const auto cached = generate(m, kPrompts, greedy(12, true));
    const auto full = generate(m, kPrompts, greedy(12, false));
    ASSERT_EQ(cached.size(), kPrompts.size());
    EXPECT_EQ(tokens_of(cached), tokens_of(full));
    for (size_t b = 0; b < cached.size(); ++b) {
      EXPECT_EQ(cached[b].tokens.size(), 12u);
      EXPECT_NEAR(cached[b].logprob, full[b].logprob, 1e-4 * (1 + std::abs(full[b].logprob)));
    }
  }
}

TEST(Generate, NextTokenLogprobsMatchTheFullForwardPass) {
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const Model m = make(dc.config);
    const std::vector<std::vector<int32_t>> prompts = {{4, 9, 7, 12, 5, 6, 2}};
    const auto lp = next_token_logprobs(m, prompts);
    Tape tape;
    tape.recording = false;
    Batch batch;
    batch.input = Tensor::from<int64_t>({1, 7}, {4, 9, 7, 12, 5, 6, 2});
    const Tensor logits = m.logits(tape, batch)->value;  // (1, 7, V)
    const int64_t V = dc.config.vocab_size;
    const float* z = logits.data<float>() + 6 * V;
    double mx = z[0], s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(z[j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(z[j] - mx);
    for (int64_t j = 0; j < V; ++j) EXPECT_NEAR(lp[0][j], z[j] - mx - std::log(s), 2e-5) << "token " << j;
  }
}

TEST(Generate, BatchedRequestsOfUnequalLengthsEqualOneAtATime) {
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const Model m = make(dc.config);
    const auto batched = generate(m, kPrompts, greedy(9, true));
    for (size_t b = 0; b < kPrompts.size(); ++b) {
      const auto alone = generate(m, {kPrompts[b]}, greedy(9, true));
      EXPECT_EQ(batched[b].tokens, alone[0].tokens) << "request " << b;
    }
  }
}

TEST(Generate, StopsAtEosAndReportsIt) {
  ModelConfig c = decoder_config(Positional::Learned);
  const Model m = make(c);
  // Find the greedy continuation, then declare its third token the eos.
  const auto free_run = generate(m, {kPrompts[0]}, greedy(8, true));
  GenerateConfig g = greedy(8, true);
  g.eos_id = free_run[0].tokens[2];
  const auto stopped = generate(m, {kPrompts[0]}, g);
  const size_t first = static_cast<size_t>(std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), g.eos_id) -
                                           free_run[0].tokens.begin());
  EXPECT_TRUE(stopped[0].finished);
  ASSERT_EQ(stopped[0].tokens.size(), first + 1);
  EXPECT_TRUE(std::equal(stopped[0].tokens.begin(), stopped[0].tokens.end(), free_run[0].tokens.begin()));
  EXPECT_FALSE(free_run[0].finished);
}

TEST(Generate, OnStepSeesEveryStepOnceInOrderAndCanStopIt) {
  ModelConfig c = decoder_config(Positional::Learned);
  const Model m = make(c);
  const auto free_run = generate(m, {kPrompts[0]}, greedy(8, true));
  for (const bool beam : {false, true}) {
    SCOPED_TRACE(beam ? "beam search" : "greedy");
    std::vector<int64_t> seen;
    GenerateConfig g = greedy(8, true);
    g.beam_search = beam;
    g.on_step = [&](int64_t step) { seen.push_back(step); };
    const auto out = generate(m, {kPrompts[0]}, g);
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(out[0].tokens, free_run[0].tokens);  // watching changes nothing
    // an eos at step 2 ends the steps there
    seen.clear();
    g.eos_id = free_run[0].tokens[2];
    const size_t first = static_cast<size_t>(std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), g.eos_id) -
                                             free_run[0].tokens.begin());
    generate(m, {kPrompts[0]}, g);
    EXPECT_EQ(seen.size(), first + 1);
    // a hook that throws ends the generation with its error
    g.eos_id = -1;
    g.on_step = [](int64_t step) {
      if (step == 3) throw Error("stop at 3");
    };
    EXPECT_THROW(generate(m, {kPrompts[0]}, g), Error);
  }
}

TEST(Generate, BeamSizeOneEqualsGreedy) {
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const Model m = make(dc.config);
    GenerateConfig g = greedy(10, true);
    g.eos_id = 1;
    const auto gr = generate(m, kPrompts, g);
    g.beam_search = true;  // the beam search driver with one beam
    const auto beam = generate(m, kPrompts, g);
    EXPECT_EQ(tokens_of(gr), tokens_of(beam));
    for (size_t b = 0; b < gr.size(); ++b) {
      EXPECT_EQ(gr[b].finished, beam[b].finished);
      EXPECT_NEAR(gr[b].logprob, beam[b].logprob, 1e-4);
    }
  }
  // And for an encoder-decoder.
  const Model ed = make(encdec_config());
  const std::vector<std::vector<int32_t>> src = {{5, 9, 4, 7}, {8, 6}};
  GenerateConfig g = greedy(10, true);
  g.eos_id = 3;
  const auto gr = translate(ed, src, g);
  g.beam_search = true;
  EXPECT_EQ(tokens_of(translate(ed, src, g)), tokens_of(gr));
}

TEST(Generate, BeamScoresAreTheModelsLogprobs) {
  const Model m = make(decoder_config(Positional::Rope));
  GenerateConfig g = greedy(6, true);
  g.beam_size = 3;
  const auto out = generate(m, kPrompts, g);
  for (size_t b = 0; b < kPrompts.size(); ++b) {
    // Re-score the chosen continuation token by token with the model.
    std::vector<int32_t> seq = kPrompts[b];
    double lp = 0;
    for (int32_t t : out[b].tokens) {
      lp += next_token_logprobs(m, {seq})[0][t];
      seq.push_back(t);
    }
    EXPECT_NEAR(out[b].logprob, lp, 1e-4) << "request " << b;
  }
  // Beam search with the cache equals beam search recomputing everything.
  g.use_cache = false;
  EXPECT_EQ(tokens_of(generate(m, kPrompts, g)), tokens_of(out));
}

TEST(Generate, SamplingIsReproducibleAndTopKOneIsGreedy) {
  const Model m = make(decoder_config(Positional::Sinusoidal), 9);
  GenerateConfig g = greedy(16, true);
  g.sampling.greedy = false;
  g.sampling.temperature = 1.5f;
  g.sampling.seed = 42;
  const auto a = generate(m, kPrompts, g);
  const auto b = generate(m, kPrompts, g);
  EXPECT_EQ(tokens_of(a), tokens_of(b));
  g.sampling.seed = 43;
  EXPECT_NE(tokens_of(generate(m, kPrompts, g)), tokens_of(a));
  g.sampling.top_p = 0.9f;
  g.sampling.top_k = 5;
  g.sampling.repetition_penalty = 1.3f;
  EXPECT_EQ(tokens_of(generate(m, kPrompts, g)), tokens_of(generate(m, kPrompts, g)));
  // top_k = 1 and a tiny top_p leave only the argmax
  GenerateConfig k1 = g;
  k1.sampling.top_k = 1;
  k1.sampling.repetition_penalty = 1.0f;
  GenerateConfig p0 = k1;
  p0.sampling.top_k = 0;
  p0.sampling.top_p = 1e-6f;
  const auto want = tokens_of(generate(m, kPrompts, greedy(16, true)));
  EXPECT_EQ(tokens_of(generate(m, kPrompts, k1)), want);
  EXPECT_EQ(tokens_of(generate(m, kPrompts, p0)), want);
}

TEST(Generate, RepetitionPenaltyDiscouragesRepeats) {
  const Model m = make(decoder_config(Positional::Learned));
  GenerateConfig g = greedy(30, true);
  auto distinct = [](const std::vector<int32_t>& t) {
    std::vector<int32_t> s = t;
    std::sort(s.begin(), s.end());
    return std::unique(s.begin(), s.end()) - s.begin();
  };
  const auto plain = generate(m, {{4}}, g);
  g.sampling.repetition_penalty = 50.0f;
  const auto penalised = generate(m, {{4}}, g);
  EXPECT_GT(distinct(penalised[0].tokens), distinct(plain[0].tokens));
}

// logit_bias (OpenAI's): +100 on a token makes every greedy and sampled choice that token; -100 on
// the token greedy picks first moves that choice; the reported log-probability stays the model's; a
// NaN bias is refused.
TEST(Generate, LogitBiasForcesAndBansTokens) {
  const Model m = make(decoder_config(Positional::Learned));
  GenerateConfig g = greedy(8, true);
  const auto plain = generate(m, {{4}}, g);
  g.sampling.logit_bias = {{7, 100.0f}};
  const auto forced = generate(m, {{4}}, g);
  EXPECT_EQ(forced[0].tokens, std::vector<int32_t>(8, 7));
  GenerateConfig sampled = g;
  sampled.sampling.greedy = false;
  sampled.sampling.seed = 3;
  EXPECT_EQ(generate(m, {{4}}, sampled)[0].tokens, std::vector<int32_t>(8, 7));
  g.sampling.logit_bias = {{plain[0].tokens[0], -100.0f}};
  const auto banned = generate(m, {{4}}, g);
  EXPECT_NE(banned[0].tokens[0], plain[0].tokens[0]);
  // a bias on the tokens greedy picks anyway changes no choice, and the reported log-probability
  // stays the model's (not the biased distribution's)
  GenerateConfig one = greedy(1, true);
  const auto first = generate(m, {{4}}, one);
  one.sampling.logit_bias = {{first[0].tokens[0], 5.0f}};
  const auto nudged = generate(m, {{4}}, one);
  ASSERT_EQ(nudged[0].tokens, first[0].tokens);
  EXPECT_EQ(nudged[0].logprob, first[0].logprob);
  g.sampling.logit_bias = {{3, std::nanf("")}};
  EXPECT_NE(error_of([&] { generate(m, {{4}}, g); }).find("logit_bias holds token 3"), std::string::npos);
}

// translate's target prefixes (CTranslate2's target_prefix): forcing the first k tokens greedy
// chose gives the rest of greedy's translation, with the rest's log-probability; another prefix
// steers it; prefixes are checked.
TEST(Generate, TargetPrefixForcesATranslationsStart) {
  const Model ed = make(encdec_config());
  const std::vector<std::vector<int32_t>> src = {{5, 9, 3, 7}, {11, 2}};
  GenerateConfig g = greedy(10, false);
  g.eos_id = -1;
  const auto full = translate(ed, src, g);
  for (const int64_t beam : {int64_t{1}, int64_t{3}}) {
    GenerateConfig gp = g;
    gp.beam_size = beam;
    const auto ref = beam == 1 ? full : translate(ed, src, gp);
    std::vector<std::vector<int32_t>> prefixes;
    for (const auto& r : ref) prefixes.emplace_back(r.tokens.begin(), r.tokens.begin() + 3);
    gp.max_new_tokens = 7;
    const auto rest = translate(ed, src, gp, prefixes);
    for (size_t b = 0; b < src.size(); ++b) {
      EXPECT_EQ(rest[b].tokens, std::vector<int32_t>(ref[b].tokens.begin() + 3, ref[b].tokens.end()))
          << "beam " << beam << " row " << b;
    }
  }
  double prefix_lp = 0;  // log p of greedy's first 3 tokens, from a 3-token translation
  GenerateConfig three = g;
  three.max_new_tokens = 3;
  prefix_lp = translate(ed, {src[0]}, three)[0].logprob;
  GenerateConfig seven = g;
  seven.max_new_tokens = 7;
  const auto rest0 = translate(ed, {src[0]}, seven, {std::vector<int32_t>(full[0].tokens.begin(), full[0].tokens.begin() + 3)});
  EXPECT_NEAR(rest0[0].logprob, full[0].logprob - prefix_lp, 1e-4);
  // a prefix greedy would not choose changes what follows it in general, and starts nothing else
  std::vector<int32_t> other = {full[0].tokens[0] == 4 ? 6 : 4};
  const auto steered = translate(ed, {src[0]}, seven, {other});
  EXPECT_EQ(steered[0].tokens.size(), 7u);
  EXPECT_NE(error_of([&] { translate(ed, src, g, {{1}}); }).find("1 target prefixes for 2 sources"), std::string::npos);
  EXPECT_NE(error_of([&] { translate(ed, {src[0]}, g, {{-3}}); }).find("is outside the vocabulary"), std::string::npos);
}

// presence and frequency penalties (OpenAI's) count only the generated tokens: history[generated_from ..].
TEST(Generate, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  const float z[] = {0.0f, 1.0f, 0.9f, 0.5f};
  const std::vector<int32_t> history = {2, 2, 1, 1, 3};  // prompt {2, 2}, then 1, 1, 3 generated
  Rng rng(1);
  SamplingConfig s;
  EXPECT_EQ(choose_token(z, 4, history, s, rng, 2), 1);
  s.frequency_penalty = 0.2f;  // z1 = 1 - 2 x 0.2 = 0.6 < z2 = 0.9 (the prompt's 2s do not count)
  EXPECT_EQ(choose_token(z, 4, history, s, rng, 2), 2);
  EXPECT_EQ(choose_token(z, 4, history, s, rng, 0), 1);  // counting the prompt: z2 = 0.5 < z1 = 0.6
  s.frequency_penalty = 0.0f;
  s.presence_penalty = 0.05f;  // z1 = 0.95 > 0.9
  EXPECT_EQ(choose_token(z, 4, history, s, rng, 2), 1);
  s.presence_penalty = 0.2f;  // z1 = 0.8, z3 = 0.3 < z2 = 0.9
  EXPECT_EQ(choose_token(z, 4, history, s, rng, 2), 2);
  s.presence_penalty = 0.0f;
  s.frequency_penalty = -1.0f;  // negative: generated tokens favoured, z1 = 3, z3 = 1.5
  EXPECT_EQ(choose_token(z, 4, history, s, rng, 2), 1);
  // through generate(): a strong frequency penalty spreads a greedy continuation over more tokens
  const Model m = make(decoder_config(Positional::Learned));
  GenerateConfig g = greedy(12, true);
  const auto distinct = [](std::vector<int32_t> t) {
    std::sort(t.begin(), t.end());
    return std::unique(t.begin(), t.end()) - t.begin();
  };
  const auto plain = generate(m, {{4}}, g);
  g.sampling.frequency_penalty = 50.0f;
  EXPECT_EQ(distinct(generate(m, {{4}}, g)[0].tokens), 12);
  EXPECT_LE(distinct(plain[0].tokens), 12);
  g.sampling.frequency_penalty = std::nanf("");
  EXPECT_NE(error_of([&] { generate(m, {{4}}, g); }).find("frequency_penalty must be finite"), std::string::npos);
}

// score_tokens (one parallel pass) against next_token_logprobs (the cache path) on every prefix:
// each token's log-probability and the top tokens agree to float rounding; position 0 has none.
TEST(Generate, ScoreTokensIsTheNextTokenLogprobOfEveryPrefix) {
  const Model m = make(decoder_config(Positional::Learned));
  const std::vector<int32_t> ids = {4, 9, 2, 17, 5, 5, 20, 1};
  const TokenScores s = score_tokens(m, ids, 3);
  ASSERT_EQ(s.logprob.size(), ids.size());
  EXPECT_TRUE(std::isnan(s.logprob[0]) && s.top[0].empty());
  for (size_t t = 1; t < ids.size(); ++t) {
    const std::vector<float> lp = next_token_logprobs(m, {std::vector<int32_t>(ids.begin(), ids.begin() + t)})[0];
    EXPECT_NEAR(s.logprob[t], lp[static_cast<size_t>(ids[t])], 1e-5) << t;
    ASSERT_EQ(s.top[t].size(), 3u);
    const auto best = std::max_element(lp.begin(), lp.end()) - lp.begin();
    EXPECT_EQ(s.top[t][0].first, best) << t;
    EXPECT_NEAR(s.top[t][0].second, lp[static_cast<size_t>(best)], 1e-5);
    EXPECT_GE(s.top[t][0].second, s.top[t][1].second);
    EXPECT_GE(s.top[t][1].second, s.top[t][2].second);
  }
  EXPECT_TRUE(score_tokens(m, ids, 0).top[3].empty());
  EXPECT_NE(error_of([&] { score_tokens(m, {4, 99}, 1); }).find("outside the vocabulary"), std::string::npos);
}

TEST(Translate, CachedEqualsFullRecomputationAndBatchesEqualSingles) {
  for (bool norm_first : {false, true}) {
    ModelConfig c = encdec_config();
    c.norm_first = norm_first;
    if (norm_first) {
      c.positional = Positional::Learned;
      c.max_len = 32;
      c.n_kv_heads = 1;
      c.fused_qkv = false;
    }
    SCOPED_TRACE(norm_first ? "pre-norm, learned, GQA, separate" : "post-norm, sinusoidal");
    const Model m = make(c);
    const std::vector<std::vector<int32_t>> src = {{5, 9, 4, 7, 11}, {8, 6}, {20, 13, 12}};
    GenerateConfig g = greedy(10, true);
    const auto cached = translate(m, src, g);
    g.use_cache = false;
    const auto full = translate(m, src, g);
    EXPECT_EQ(tokens_of(cached), tokens_of(full));
    for (size_t b = 0; b < src.size(); ++b) {
      const auto alone = translate(m, {src[b]}, greedy(10, true));
      EXPECT_EQ(alone[0].tokens, cached[b].tokens) << "source " << b;
    }
    // beam search: cache and recomputation agree
    GenerateConfig bg = greedy(8, true);
    bg.beam_size = 3;
    bg.eos_id = 3;
    const auto bc = translate(m, src, bg);
    bg.use_cache = false;
    EXPECT_EQ(tokens_of(translate(m, src, bg)), tokens_of(bc));
  }
}

TEST(Generate, CapturedAttentionRowsAreDistributions) {
  const Model m = make(decoder_config(Positional::Rope));
  GenerateConfig g = greedy(5, true);
  g.capture_attention = true;
  g.attention_head = 2;
  const auto out = generate(m, {kPrompts[0], kPrompts[1]}, g);
  for (size_t b = 0; b < 2; ++b) {
    const Generation& r = out[b];
    const int64_t fed = static_cast<int64_t>(kPrompts[b].size() + r.tokens.size()) - 1;
    ASSERT_EQ(r.attention_rows, fed);
    ASSERT_EQ(r.attention_cols, fed);
    for (int64_t i = 0; i < fed; ++i) {
      double s = 0;
      for (int64_t j = 0; j < fed; ++j) {
        const float w = r.attention[i * fed + j];
        if (j > i) {
          EXPECT_EQ(w, 0.0f) << "row " << i << " sees the future";
        }
        s += w;
      }
      EXPECT_NEAR(s, 1.0, 1e-5) << "row " << i;
    }
  }
  const Model ed = make(encdec_config());
  GenerateConfig tg = greedy(4, true);
  tg.capture_attention = true;
  const auto tr = translate(ed, {{5, 9, 4}, {8, 6, 7, 10, 11}}, tg);
  ASSERT_EQ(tr[0].attention_rows, 4);
  ASSERT_EQ(tr[0].attention_cols, 5);  // the batch's longest source; padding gets weight 0
  for (int64_t i = 0; i < 4; ++i) {
    double s = 0;
    for (int64_t j = 0; j < 5; ++j) s += tr[0].attention[i * 5 + j];
    EXPECT_NEAR(s, 1.0, 1e-5);
    EXPECT_EQ(tr[0].attention[i * 5 + 3], 0.0f);
    EXPECT_EQ(tr[0].attention[i * 5 + 4], 0.0f);
  }
}

Tensor ids_tensor(const std::vector<std::vector<int32_t>>& rows, int64_t pad) {
  int64_t T = 0;
  for (const auto& r : rows) T = std::max<int64_t>(T, static_cast<int64_t>(r.size()));
  Tensor t = Tensor::zeros({static_cast<int64_t>(rows.size()), T}, DType::I64);
  for (size_t b = 0; b < rows.size(); ++b)
    for (int64_t i = 0; i < T; ++i)
      t.data<int64_t>()[static_cast<int64_t>(b) * T + i] = i < static_cast<int64_t>(rows[b].size()) ? rows[b][i] : pad;
  return t;
}

// Every layer and head of trace_attention against generation's capture of that one head (which
// slices nothing: the kernel's whole (B, H) weights), for every position scheme (ALiBi's per-head
// slopes, RoPE), grouped KV heads and Dk != Dv; the trace's logits are the forward pass's.
TEST(TraceAttention, EveryHeadEqualsGenerationsCaptureForThatHead) {
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const Model m = make(dc.config);
    const std::vector<int32_t>& prompt = kPrompts[0];
    const auto T = static_cast<int64_t>(prompt.size());
    Batch b;
    b.input = ids_tensor({prompt}, 0);
    const AttentionTrace t = trace_attention(m, b);
    Tape tape;
    tape.recording = false;
    const Tensor full = m.logits(tape, b)->value;
    ASSERT_EQ(t.logits.shape(), full.shape());
    for (int64_t i = 0; i < full.numel(); ++i) EXPECT_NEAR(t.logits.data<float>()[i], full.data<float>()[i], 1e-4);
    ASSERT_EQ(static_cast<int64_t>(t.maps.size()), dc.config.n_layers);
    for (const AttentionMap& a : t.maps) {
      EXPECT_EQ(a.stack, "decoder");
      EXPECT_EQ(a.kind, "self");
      ASSERT_EQ(a.heads(), dc.config.n_heads);
      ASSERT_EQ(a.rows(), T);
      ASSERT_EQ(a.cols(), T);
      for (int64_t h = 0; h < a.heads(); ++h) {
        GenerateConfig g = greedy(1, true);
        g.capture_attention = true;
        g.attention_layer = a.layer;
        g.attention_head = h;
        const Generation cap = generate(m, {prompt}, g)[0];
        ASSERT_EQ(cap.attention_rows, T);
        ASSERT_EQ(cap.attention_cols, T);
        // in two blocks of rows, as a server recomputes them
        std::vector<float> w = a.weights(0, h, 0, 2);
        const std::vector<float> rest = a.weights(0, h, 2, T);
        w.insert(w.end(), rest.begin(), rest.end());
        for (int64_t i = 0; i < T * T; ++i)
          EXPECT_NEAR(w[i], cap.attention[i], 2e-6) << "layer " << a.layer << " head " << h << " element " << i;
      }
    }
  }
}

TEST(TraceAttention, EncoderDecoderMapsAndPadding) {
  const Model m = make(encdec_config());
  const std::vector<std::vector<int32_t>> src = {{5, 9, 4}, {8, 6, 7, 10, 11}};
  const int64_t layer = 1, head = 1;
  GenerateConfig g = greedy(4, true);
  g.capture_attention = true;
  g.attention_layer = layer;
  g.attention_head = head;
  const auto tr = translate(m, src, g);
  // the decoder reads [bos, t1, t2, t3]: its cross-attention rows are the capture's four rows
  std::vector<std::vector<int32_t>> dec;
  for (const Generation& r : tr) dec.push_back({2, r.tokens[0], r.tokens[1], r.tokens[2]});
  Batch b;
  b.input = ids_tensor(src, 0);
  b.decoder_input = ids_tensor(dec, 0);
  const AttentionTrace t = trace_attention(m, b);
  ASSERT_EQ(t.maps.size(), 2u + 2u * 2u);  // encoder self x 2, then (self, cross) per decoder layer
  EXPECT_EQ(t.maps[0].stack, "encoder");
  EXPECT_EQ(t.maps[0].kind, "self");
  const AttentionMap& cross = t.maps[2 + 2 * layer + 1];
  ASSERT_EQ(cross.kind, "cross");
  ASSERT_EQ(cross.layer, layer);
  for (size_t r = 0; r < src.size(); ++r) {
    const std::vector<float> w = cross.weights(static_cast<int64_t>(r), head, 0, 4);
    ASSERT_EQ(tr[r].attention_rows, 4);
    ASSERT_EQ(tr[r].attention_cols, 5);
    for (int64_t i = 0; i < 20; ++i) EXPECT_NEAR(w[i], tr[r].attention[i], 2e-6) << "row " << r << " element " << i;
  }
  // the padded source: its encoder self-attention gives the padding keys weight 0, rows sum to 1
  for (int64_t h = 0; h < 2; ++h) {
    const std::vector<float> w = t.maps[0].weights(0, h, 0, 5);
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_EQ(w[i * 5 + 3], 0.0f);
      EXPECT_EQ(w[i * 5 + 4], 0.0f);
      EXPECT_NEAR(w[i * 5] + w[i * 5 + 1] + w[i * 5 + 2], 1.0, 1e-6);
    }
  }
  EXPECT_NE(error_of([&] { (void)cross.weights(2, 0, 0, 1); }).find("batch row 2"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)cross.weights(0, 2, 0, 1); }).find("head 2"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)cross.weights(0, 0, 3, 5); }).find("rows [3, 5)"), std::string::npos);
}

TEST(Generate, BadRequestsGiveClearErrors) {
  const Model m = make(decoder_config(Positional::Learned));
  EXPECT_NE(error_of([&] { generate(m, {{}}, greedy(3, true)); }).find("prompt 0 is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { generate(m, {{4, 99}}, greedy(3, true)); }).find("outside the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([&] { generate(m, {{4}}, greedy(100, true)); }).find("max_len 64"), std::string::npos);
  GenerateConfig g = greedy(3, true);
  g.sampling.temperature = 0;
  EXPECT_NE(error_of([&] { generate(m, {{4}}, g); }).find("temperature"), std::string::npos);
  g = greedy(3, true);
  g.capture_attention = true;
  g.attention_layer = 7;
  EXPECT_NE(error_of([&] { generate(m, {{4}}, g); }).find("attention_layer 7"), std::string::npos);
  EXPECT_NE(error_of([&] { translate(m, {{4}}, greedy(3, true)); }).find("not encoder-decoder"), std::string::npos);
  const Model ed = make(encdec_config());
  EXPECT_NE(error_of([&] { generate(ed, {{4}}, greedy(3, true)); }).find("decoder-only"), std::string::npos);
  EXPECT_TRUE(generate(m, {}, greedy(3, true)).empty());
  // translate's errors say translate, not generate
  g = greedy(3, true);
  g.capture_attention = true;
  g.attention_layer = 7;
  EXPECT_NE(error_of([&] { translate(ed, {{4}}, g); }).find("translate: attention_layer 7 is outside the model's 2 decoder layers"),
            std::string::npos);
  g = greedy(3, true);
  g.length_penalty = std::numeric_limits<double>::quiet_NaN();
  g.beam_size = 2;
  EXPECT_NE(error_of([&] { translate(ed, {{4}}, g); }).find("translate: length_penalty must be finite"),
            std::string::npos);
}

// NaN or infinite logits are an error naming the row and step, on every decoding path: they used
// to become some token (often eos: an empty output), reported as a result.
TEST(Generate, NonFiniteLogitsAreAnErrorNotATokens) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), FLT_MAX}) {
    SCOPED_TRACE(::testing::Message() << "lm_head row 5 = " << bad);
    Model m = make(decoder_config(Positional::Sinusoidal));
    Model ed = make(encdec_config());
    for (Model* model : {&m, &ed}) {
      Tensor& w = model->find("lm_head.weight")->var->value;
      std::fill(w.data<float>() + 5 * w.size(1), w.data<float>() + 6 * w.size(1), bad);
    }
    GenerateConfig greedy_g = greedy(4, true), sample_g = greedy(4, true), beam_g = greedy(4, true);
    sample_g.sampling.greedy = false;
    beam_g.beam_size = 3;
    for (const GenerateConfig* g : {&greedy_g, &sample_g, &beam_g}) {
      EXPECT_NE(error_of([&] { generate(m, kPrompts, *g); }).find("generate: the model's logits are not finite (token 5 of row 0"),
                std::string::npos);
      EXPECT_NE(error_of([&] { translate(ed, {{5, 9, 4}}, *g); }).find("translate: the model's logits are not finite"),
                std::string::npos);
    }
    EXPECT_NE(error_of([&] { next_token_logprobs(m, kPrompts); }).find("logits are not finite"), std::string::npos);
  }
}

// Beam search draws nothing: asking it to sample is an error, not a silently deterministic run.
TEST(Generate, SamplingWithBeamSearchIsRefused) {
  const Model m = make(decoder_config(Positional::Rope));
  GenerateConfig g = greedy(4, true);
  g.sampling.greedy = false;
  g.beam_size = 4;
  EXPECT_NE(error_of([&] { generate(m, kPrompts, g); }).find("sampling (greedy = false) and beam search"),
            std::string::npos);
  g.beam_size = 1;
  g.beam_search = true;
  EXPECT_NE(error_of([&] { generate(m, kPrompts, g); }).find("exclude each other"), std::string::npos);
  const Model ed = make(encdec_config());
  EXPECT_NE(error_of([&] { translate(ed, {{5}}, g); }).find("translate: sampling"), std::string::npos);
}

// num_return = n: the n best hypotheses of each request, distinct, best first; the first is what
// num_return = 1 gives.
TEST(Generate, NumReturnGivesTheBestDistinctBeams) {
  const Model m = make(decoder_config(Positional::Rope));
  const Model ed = make(encdec_config());
  GenerateConfig g = greedy(6, true);
  g.eos_id = 1;
  g.beam_size = 4;
  const auto one = generate(m, kPrompts, g);
  const auto one_tr = translate(ed, {{5, 9, 4, 7}, {8, 6}}, g);
  g.num_return = 3;
  for (bool encdec : {false, true}) {
    SCOPED_TRACE(encdec ? "translate" : "generate");
    const auto& first = encdec ? one_tr : one;
    const auto out = encdec ? translate(ed, {{5, 9, 4, 7}, {8, 6}}, g) : generate(m, kPrompts, g);
    ASSERT_EQ(out.size(), first.size() * 3);
    for (size_t b = 0; b < first.size(); ++b) {
      EXPECT_EQ(out[b * 3].tokens, first[b].tokens) << "request " << b;
      std::set<std::vector<int32_t>> distinct;
      for (size_t i = 0; i < 3; ++i) distinct.insert(out[b * 3 + i].tokens);
      EXPECT_EQ(distinct.size(), 3u) << "request " << b;
      auto score = [&](const Generation& x) {
        return x.logprob / std::pow(static_cast<double>(x.tokens.size()), g.length_penalty);
      };
      EXPECT_GE(score(out[b * 3]), score(out[b * 3 + 1]));
      EXPECT_GE(score(out[b * 3 + 1]), score(out[b * 3 + 2]));
    }
  }
  g.num_return = 5;
  EXPECT_NE(error_of([&] { generate(m, kPrompts, g); }).find("num_return = 5, expected 1 .. 4"), std::string::npos);
  g = greedy(4, true);
  g.num_return = 2;
  EXPECT_NE(error_of([&] { generate(m, kPrompts, g); }).find("num_return = 2, expected 1 .. 1"), std::string::npos);
}


// Continuous batching: sequences that join and leave a DecodeSlots batch between steps get the
// tokens generate() gives each alone, and the logits of a sequence do not depend on what else
// shares the batch (bitwise).
TEST(DecodeSlots, JoinAndLeaveBetweenStepsEqualsGenerateAlone) {
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const Model m = make(dc.config);
    const int64_t V = dc.config.vocab_size, n = 9;
    // request r joins at step joins[r]; each runs n greedy tokens, then leaves
    const std::vector<int64_t> joins = {0, 3, 3, 6};
    const std::vector<std::vector<int32_t>> prompts = {kPrompts[0], kPrompts[1], kPrompts[2], {5, 5}};
    DecodeSlots slots(m, 3, 32);  // 4 requests through 3 slots: the last waits for a free one
    std::vector<int64_t> slot(prompts.size(), -1);
    std::vector<std::vector<int32_t>> got(prompts.size());
    std::vector<std::vector<float>> first_logits(prompts.size());
    Rng rng(0);
    size_t next = 0;
    for (int64_t step = 0; step < 64; ++step) {
      // join: the requests whose turn has come, while a slot is free
      while (next < prompts.size() && joins[next] <= step && slots.free_slots() > 0) {
        std::vector<float> z;
        slot[next] = slots.add(prompts[next], &z);
        first_logits[next] = z;
        got[next].push_back(choose_token(z.data(), V, prompts[next], SamplingConfig{}, rng));
        ++next;
      }
      std::vector<std::pair<int64_t, int32_t>> feed;
      std::vector<size_t> who;
      for (size_t r = 0; r < prompts.size(); ++r) {
        if (slot[r] < 0) continue;
        if (static_cast<int64_t>(got[r].size()) == n) {  // done: leave
          slots.remove(slot[r]);
          slot[r] = -2;
          continue;
        }
        feed.emplace_back(slot[r], got[r].back());
        who.push_back(r);
      }
      if (feed.empty() && next == prompts.size()) break;
      if (feed.empty()) continue;
      const std::vector<float> z = slots.step(feed);
      for (size_t i = 0; i < who.size(); ++i) {
        std::vector<int32_t> hist = prompts[who[i]];
        hist.insert(hist.end(), got[who[i]].begin(), got[who[i]].end());
        got[who[i]].push_back(choose_token(z.data() + i * V, V, hist, SamplingConfig{}, rng));
      }
    }
    for (size_t r = 0; r < prompts.size(); ++r) {
      const auto alone = generate(m, {prompts[r]}, greedy(n, true));
      EXPECT_EQ(got[r], alone[0].tokens) << "request " << r;
    }
    // a sequence's step logits are bitwise the same alone and beside others that join and leave
    {
      const auto run = [&](bool crowd) {
        DecodeSlots ds(m, 4, 32);
        std::vector<float> z;
        const int64_t a = ds.add(prompts[0], &z);
        std::vector<std::vector<float>> seen;
        int64_t b = -1, c = -1;
        int32_t tok = 3;
        for (int step = 0; step < 6; ++step) {
          if (crowd && step == 1) b = ds.add(prompts[1], &z);
          if (crowd && step == 2) c = ds.add(prompts[2], &z);
          if (crowd && step == 4) ds.remove(b), b = -1;  // a row moves
          std::vector<std::pair<int64_t, int32_t>> feed = {{a, tok}};
          if (b >= 0) feed.emplace_back(b, 5);
          if (c >= 0) feed.emplace_back(c, 6);
          const std::vector<float> out = ds.step(feed);
          seen.emplace_back(out.begin(), out.begin() + V);
        }
        return seen;
      };
      EXPECT_EQ(run(false), run(true));
    }
    // the same prompt alone in an empty batch: bitwise the same first and next logits
    DecodeSlots solo(m, 3, 32);
    std::vector<float> z;
    const int64_t s = solo.add(prompts[3], &z);
    EXPECT_EQ(z, first_logits[3]);
    EXPECT_EQ(solo.length(s), 2);
    EXPECT_EQ(solo.free_slots(), 2);
  }
}

// Prompt reuse: prompts run in chunks at fixed positions, so a prompt that starts with a cached
// prefix of whole chunks gives bitwise the logits (and steps) of a run without the cache.
TEST(DecodeSlots, PromptCacheReusesWholeChunksAndChangesNoBit) {
  const int64_t C = 4;
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const Model m = make(dc.config);
    const int64_t V = dc.config.vocab_size;
    const std::vector<int32_t> a = {4, 9, 7, 12, 5, 6, 11, 3, 8, 10, 2};  // 11 tokens: 8 cached
    std::vector<int32_t> b = a;                                          // a growing chat: 17
    b.insert(b.end(), {7, 7, 13, 4, 20, 9});
    std::vector<int32_t> c(a.begin(), a.begin() + 5);  // shares 5 tokens: one chunk reused
    c.insert(c.end(), {14, 15, 16});
    const std::vector<int32_t> d(a.begin(), a.begin() + 8);  // all cached: its last chunk still runs
    struct Case {
      std::vector<int32_t> prompt;
      int64_t reused;
    };
    const std::vector<Case> cases = {{a, 0}, {b, 8}, {c, 4}, {d, 4}, {a, 8}, {{5}, 0}};
    // each request: its first logits and 5 greedy steps, with the cache and without
    const auto run = [&](DecodeSlots& ds, const std::vector<int32_t>& p, bool reuse, int64_t* reused) {
      std::vector<float> z;
      const int64_t s = ds.add(p, &z, reuse, reused);
      std::vector<std::vector<float>> seen = {z};
      for (int i = 0; i < 5; ++i) {
        const auto t = static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
        z = ds.step({{s, t}});
        seen.push_back(z);
      }
      ds.remove(s);
      return seen;
    };
    DecodeSlots cached(m, 2, 32, {C, 1 << 20}), fresh(m, 2, 32, {C, 0});
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      int64_t reused = -1, none = -1;
      const auto with = run(cached, cases[i].prompt, true, &reused);
      const auto without = run(fresh, cases[i].prompt, true, &none);
      EXPECT_EQ(reused, cases[i].reused);
      EXPECT_EQ(none, 0);
      EXPECT_EQ(with, without);  // bitwise
    }
    // kept: a's two chunks, b's two more under them, c's second chunk under a's first: 5 chunks,
    // 2 distinct prefixes (b's and c's); d, the second a and the 1-token prompt add nothing
    DecodeSlots::CacheStats st = cached.prompt_cache();
    const int64_t per_token = st.bytes / st.tokens;
    EXPECT_EQ(st.entries, 2);
    EXPECT_EQ(st.tokens, 5 * C);
    int64_t G = dc.config.kv_heads(), Dk = dc.config.head_dim_k(), Dv = dc.config.head_dim_v();
    EXPECT_EQ(per_token, dc.config.n_layers * G * (Dk + Dv) * 4);
    // reuse = false neither reads nor keeps
    int64_t reused = -1;
    run(cached, b, false, &reused);
    EXPECT_EQ(reused, 0);
    EXPECT_EQ(cached.prompt_cache().tokens, st.tokens);
    // chunked prompts stay within float32 rounding of one pass (and give generate's tokens)
    DecodeSlots one_pass(m, 1, 32, {0, 0});
    std::vector<float> z1, z2;
    one_pass.add(b, &z1);
    fresh.add(b, &z2);
    for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(z1[v], z2[v], 1e-4f * (1 + std::fabs(z1[v])));
    // a budget of 3 chunks: a's 2 are kept, then b's third (its fourth finds no leaf to evict
    // outside its own path); c's second chunk evicts b's third, the least recently used leaf
    DecodeSlots small(m, 1, 32, {C, 3 * C * per_token});
    run(small, a, true, &reused);
    EXPECT_EQ(small.prompt_cache().tokens, 2 * C);
    run(small, b, true, &reused);
    EXPECT_EQ(reused, 8);
    EXPECT_EQ(small.prompt_cache().tokens, 3 * C);
    run(small, c, true, &reused);
    EXPECT_EQ(reused, 4);  // c's first chunk is a's
    EXPECT_EQ(small.prompt_cache().tokens, 3 * C);
    EXPECT_EQ(small.prompt_cache().entries, 2);  // a's second chunk and c's
    run(small, b, true, &reused);
    EXPECT_EQ(reused, 8);  // a's two chunks are still there; b's third is not
    const auto again = run(small, b, true, &reused);
    EXPECT_EQ(reused, 12);
    DecodeSlots fresh_b(m, 1, 32, {C, 0});
    EXPECT_EQ(again, run(fresh_b, b, true, &reused));
  }
}

TEST(DecodeSlots, MisuseGivesClearErrors) {
  const Model m = make(decoder_config(Positional::Learned));
  DecodeSlots slots(m, 2, 8);
  std::vector<float> z;
  const int64_t a = slots.add({4, 9}, &z);
  EXPECT_NE(error_of([&] { slots.step({}); }).find("must feed every busy slot"), std::string::npos);
  EXPECT_NE(error_of([&] { slots.step({{a, 4}, {a, 5}}); }).find("twice"), std::string::npos);
  EXPECT_NE(error_of([&] { slots.step({{1 - a, 4}, {a, 4}}); }).find("not busy"), std::string::npos);
  EXPECT_NE(error_of([&] { slots.step({{a, 99}}); }).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(error_of([&] { slots.add(std::vector<int32_t>(9, 4), &z); }).find("longer than the slots' max_len"),
            std::string::npos);
  slots.add({4}, &z);
  EXPECT_NE(error_of([&] { slots.add({4}, &z); }).find("no free slot"), std::string::npos);
  EXPECT_NE(error_of([&] { DecodeSlots(m, 2, 65); }).find("learned positions"), std::string::npos);
  EXPECT_NE(error_of([&] { DecodeSlots(m, 65, 8); }).find("1 .. 64"), std::string::npos);
  EXPECT_NE(error_of([&] { DecodeSlots(make(encdec_config()), 2, 8); }).find("decoder-only"), std::string::npos);
  EXPECT_NE(error_of([&] { DecodeSlots(m, 2, 8, {-1, 0}); }).find("prompt_chunk -1"), std::string::npos);
  EXPECT_NE(error_of([&] { DecodeSlots(m, 2, 8, {0, 1024}); }).find("needs prompts in chunks"), std::string::npos);
  EXPECT_NE(error_of([&] { DecodeSlots(m, 2, 8, {4, -1}); }).find("prompt_cache_bytes -1"), std::string::npos);
}

// A Hugging Face model pads its embedding table past its tokenizer: the rows past vocab_limit
// have no text, so they are never chosen, greedy or sampled, however high their logits.
TEST(Generate, VocabLimitNeverChoosesPaddedRows) {
  const int64_t V = 8, limit = 5;
  std::vector<float> z = {0.1f, 0.5f, 0.2f, 0.4f, 0.3f, 9.0f, 8.0f, 7.0f};  // the padding rows win
  SamplingConfig s;
  s.vocab_limit = limit;
  Rng rng(1);
  EXPECT_EQ(choose_token(z.data(), V, {}, s, rng), 1);  // the best id below the limit
  s.vocab_limit = 0;
  EXPECT_EQ(choose_token(z.data(), V, {}, s, rng), 5);  // without the limit: the padding row
  s.vocab_limit = limit;
  s.greedy = false;
  s.repetition_penalty = 1.5f;
  for (const float temperature : {0.5f, 1.0f, 100.0f}) {
    s.temperature = temperature;
    for (int i = 0; i < 500; ++i) {
      const int32_t t = choose_token(z.data(), V, {6, 7, 1}, s, rng);  // history holds padded ids too
      ASSERT_GE(t, 0);
      ASSERT_LT(t, limit) << "temperature " << temperature;
    }
  }
}

// ... and generation, greedy, sampled and by beam search, keeps below it.
TEST(Generate, VocabLimitHoldsForGreedySamplingAndBeams) {
  const Model m = make(decoder_config(Positional::Rope));  // 23 ids
  for (const int64_t beam : {1, 3}) {
    for (const bool sample : {false, true}) {
      if (beam > 1 && sample) continue;
      GenerateConfig g = greedy(12, false);
      g.beam_size = beam;
      g.sampling.greedy = !sample;
      g.sampling.vocab_limit = 6;
      std::set<int32_t> unlimited;
      for (const auto& gen : generate(m, kPrompts, g))
        for (int32_t t : gen.tokens) EXPECT_LT(t, 6) << "beam " << beam << " sample " << sample;
      g.sampling.vocab_limit = 0;
      for (const auto& gen : generate(m, kPrompts, g)) unlimited.insert(gen.tokens.begin(), gen.tokens.end());
      EXPECT_GT(*unlimited.rbegin(), 6) << "the test needs a model that picks the padded ids without the limit";
    }
  }
}

}  // namespace
}  // namespace qkv
