// qkv/generate.h: sequential generation with a key/value cache (the chapter's "sequential
// generation"; its next chapter's logits -> probabilities -> next token).
//
// Each new token runs the decoder once: its keys and values are appended to a per-layer cache,
// so a step costs O(current length), not O(length^2). For an encoder-decoder the source is
// encoded once and each cross-attention layer's keys and values are computed once per source.
// Requests of unequal lengths run as one batch: every row has its own length, and each step
// attends over that row's keys only.
//
//   GenerateConfig g;                 // greedy, 64 new tokens
//   g.sampling.greedy = false;        // sample: temperature, top-k, top-p, repetition penalty
//   g.sampling.seed = 7;              // same seed, same samples
//   auto out = generate(model, {{bos, 17, 5}}, g);   // decoder-only: continue each prompt
//   auto tr = translate(model, {{12, 9, 4, eos}}, g);  // encoder-decoder: one output per source
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "qkv/model.h"
#include "qkv/rng.h"

namespace qkv {

struct SamplingConfig {
  bool greedy = true;               // argmax (ties: the lowest id); false: sample
  float temperature = 1.0f;         // logits / temperature before softmax (> 0)
  int64_t top_k = 0;                // keep the k most probable tokens (0: all)
  float top_p = 1.0f;               // keep the smallest set whose probability reaches p (1: all)
  float repetition_penalty = 1.0f;  // CTRL: a token already in the row has its logit divided by
                                    // this when positive, multiplied when negative (1: off)
  uint64_t seed = 0;                // samples are a function of (seed, inputs)
  int64_t vocab_limit = 0;          // > 0: choose only among ids below it (a Hugging Face model pads its
                                    // embedding table past its tokenizer; those rows have no text)
  // OpenAI's logit_bias: (id, b) adds b to that token's logit before the choice (after the
  // repetition penalty, before the temperature): -100 all but bans a token, +100 all but forces
  // it. The log-probabilities reported are the model's own, without the bias.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // OpenAI's presence and frequency penalties over the tokens generated so far (not the prompt):
  // z_t <- z_t - frequency_penalty * count_t - presence_penalty * (count_t > 0), after the
  // repetition penalty, before logit_bias (0: off; OpenAI allows [-2, 2]).
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
};

struct GenerateConfig {
  int64_t max_new_tokens = 64;  // tokens generated per row at most (the eos included)
  SamplingConfig sampling;
  int64_t beam_size = 1;        // > 1: beam search (deterministic; with sampling.greedy = false an error)
  bool beam_search = false;     // true: beam search even with beam_size 1 (which equals greedy)
  int64_t num_return = 1;       // beam search: the num_return best hypotheses of each request, best
                                // first (1 <= num_return <= beam_size); the output then holds
                                // B * num_return Generations, request b's at b * num_return + i
  double length_penalty = 1.0;  // beam hypotheses rank by logprob / length^length_penalty
  int64_t eos_id = -2;          // generation of a row stops at this token; -2: the config's eos_id;
                                // -1: never (max_new_tokens only)
  bool use_cache = true;        // false: recompute every prefix from scratch each step (the
                                // slow twin the cache is tested against)
  // Attention capture (for maps): the weights of one head of one layer for every generated
  // token. Decoder-only: self-attention over prompt + generated tokens (prompt rows included);
  // encoder-decoder: cross-attention over the source. layer -1: the last.
  bool capture_attention = false;
  int64_t attention_layer = -1;
  int64_t attention_head = 0;
  // Called once per step, after that step's tokens are chosen (step 0: the token after the
  // prompt), with the step's index: for progress and for timing each step (`qkv bench decode`).
  // An exception it throws ends the generation.
  std::function<void(int64_t step)> on_step;
  // Without beam search: called for each token as it is chosen, with its row (a translation or
  // prompt), before on_step (streaming). An exception it throws ends the generation.
  std::function<void(int64_t row, int32_t token)> on_token;
};

struct Generation {
  std::vector<int32_t> tokens;  // the generated tokens (the eos included when one ended the row)
  double logprob = 0;           // sum of log p(token) under the model's softmax (temperature 1)
  bool finished = false;        // true: stopped at eos; false: hit max_new_tokens
  // With capture_attention: rows x cols weights, row-major. Decoder-only: one row per position
  // (prompt, then generated tokens except the last), cols = all positions; encoder-decoder: one
  // row per generated token, cols = source length. Row i sums to 1 over its allowed columns.
  std::vector<float> attention;
  int64_t attention_rows = 0, attention_cols = 0;
};

// Decoder-only: continues each prompt (non-empty; ids in the vocabulary). Prompt + max_new_tokens
// must fit max_len for learned positions. A logit that is NaN or infinite (a model whose weights
// hold NaN or infinity, or overflow) is an error, never a token: generate and translate throw
// qkv::Error naming the row and step.
std::vector<Generation> generate(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateConfig& config);

// Encoder-decoder: one output per source, starting from the config's bos_id (which must be set),
// then, when given, source b's target prefix: tokens forced as the translation's start (CTranslate2's
// target_prefix). Generations hold the tokens after the prefix, and their log-probability.
std::vector<Generation> translate(const Model& model, const std::vector<std::vector<int32_t>>& sources,
                                  const GenerateConfig& config,
                                  const std::vector<std::vector<int32_t>>& target_prefixes = {});

// Decoder-only scoring helper: log-probabilities of the next token after each prompt, (B, V)
// row-major, using the cache path. For tests and `qkv generate --top`.
std::vector<std::vector<float>> next_token_logprobs(const Model& model, const std::vector<std::vector<int32_t>>& prompts);

// Decoder-only scoring of a whole sequence (what an evaluation harness asks of "echo" with
// logprobs): for each position t >= 1, log p(ids[t] | ids[0..t-1]) and, with top > 0, the `top`
// most probable tokens there with their log-probabilities (most probable first, ties by id), all
// from one parallel forward pass, log-softmax in double. Position 0 has none (NaN, empty).
struct TokenScores {
  std::vector<double> logprob;                                    // (T), [0] NaN
  std::vector<std::vector<std::pair<int32_t, double>>> top;       // (T), [0] empty
};
TokenScores score_tokens(const Model& model, const std::vector<int32_t>& ids, int64_t top);

// The token a sampling configuration picks from one row of logits (V), given the row's tokens so
// far (for the penalties; history[generated_from ..] are the generated ones, which presence and
// frequency penalties count): what generate() does at each step, for schedulers that drive
// decoding themselves. Greedy ignores `rng`.
int32_t choose_token(const float* logits, int64_t V, const std::vector<int32_t>& history, const SamplingConfig& s,
                     Rng& rng, size_t generated_from = 0);
// log softmax of one row of logits, in double.
std::vector<double> log_softmax_row(const float* logits, int64_t V);

// Continuous batching for a decoder-only model: up to `slots` sequences, each with its own
// key/value cache. A sequence joins between steps (its prompt runs alone, then its keys and
// values are copied into the batch) and leaves when its caller removes it; each step runs one
// token for every busy slot, at that slot's own position, as one batch of only the busy rows. A
// sequence's results do not depend on what shares the batch: the steps' products are
// batch-invariant (qkv::BatchInvariantGemm), and attention and norms work row by row. One thread
// uses an object at a time.
//
// Prompts run in chunks of `prompt_chunk` tokens that start at multiples of it (positions 0 ..
// C-1, C .. 2C-1, ...; the last chunk may be shorter), so a chunk's keys and values depend only on
// the tokens up to its end. That makes prompt reuse exact: with a prompt cache, the keys and
// values of each prompt's whole chunks are kept in a tree of chunks (prompts that share a prefix
// share its chunks; least recently used leaves first out, within `prompt_cache_bytes`), and a
// later prompt that starts with the same tokens copies the longest such prefix instead of
// recomputing it; everything after it runs the same chunks a fresh run would, so the logits are
// bitwise those of a run without the cache. (A prefix's keys and values from decoding steps are
// never reused: steps compute them with other products than prompts.)
//
// The price: a chunk's products pack the weights again (and dequantise quantised ones), so
// chunks of 128 tokens run a 1,024-token prompt 1.3x (float32) to 1.6x (Q4_0) slower than one
// pass (BENCHMARKS.md). Without a prompt cache, prompt_chunk 0 runs each prompt in one pass.
struct DecodeSlotsOptions {
  int64_t prompt_chunk = 0;        // prompt tokens run together (1 .. 65536); 0: the whole prompt
  int64_t prompt_cache_bytes = 0;  // keys and values of past prompts kept for reuse (needs chunks); 0: none
};

class DecodeSlots {
 public:
  // slots 1 .. 64; max_len: the longest sequence (prompt + generated) a slot holds.
  DecodeSlots(const Model& model, int64_t slots, int64_t max_len, const DecodeSlotsOptions& options = {});
  ~DecodeSlots();
  DecodeSlots(const DecodeSlots&) = delete;
  DecodeSlots& operator=(const DecodeSlots&) = delete;

  int64_t slots() const { return slots_; }
  int64_t max_len() const { return max_len_; }
  int64_t free_slots() const;
  // Tokens in the slot's cache (0: free).
  int64_t length(int64_t slot) const;

  // Runs `prompt` (non-empty, ids in the vocabulary, at most max_len) into a free slot and
  // returns it; *logits <- the logits (V) of the token after the prompt. With `reuse` the prompt
  // cache is read (the longest cached prefix of whole chunks, leaving at least the last token to
  // run) and then keeps this prompt's whole chunks; *reused <- the prompt tokens not recomputed.
  // Throws qkv::Error when no slot is free.
  int64_t add(const std::vector<int32_t>& prompt, std::vector<float>* logits, bool reuse = true,
              int64_t* reused = nullptr);
  // One token for each busy slot, (slot, token) for every busy slot exactly once, the token
  // appended at the slot's next position. Returns the next-token logits, one row of V per entry of
  // `feed`, in its order.
  std::vector<float> step(const std::vector<std::pair<int64_t, int32_t>>& feed);
  // Frees the slot.
  void remove(int64_t slot);

  // The prompt cache: the distinct prefixes it holds (the tree's leaves), and the tokens and bytes
  // of its chunks (a chunk shared by several prefixes counted once).
  struct CacheStats {
    int64_t entries = 0, tokens = 0, bytes = 0;
  };
  CacheStats prompt_cache() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t slots_, max_len_;
};

}  // namespace qkv
