// qkv bench decode: cached greedy decoding at batch 1, in tokens/s, against the memory-bandwidth
// bound (every weight is read once per token: weight bytes / the machine's read bandwidth,
// measured in the same run).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_checks.h"
#include "commands.h"
#include "qkv/qkv.h"
#include "task_util.h"

namespace qkv::cli {
namespace {

struct DecodeBenchOptions {
  std::string model = "gpt2-small";
  int64_t prompt = 16, tokens = 64;
  int reps = 3;
  bool json = false;
  std::string dtype;
};

int run_bench_decode(const DecodeBenchOptions& o) {
  // --model: the preset (random weights), or a directory whose weights are loaded
  const bool preset = o.model == "gpt2-small" || o.model == "transformer-base";
  Model model = preset ? Model(bench_preset(o.model)) : load_model(o.model, o.dtype);
  if (preset) {
    model.init(1);
    pack_for_dtype(model, o.dtype);
  }
  const WType wt = model.weight_type();
  const ModelConfig& cfg = model.config();
  check(cfg.arch == Arch::Decoder, "bench decode: --model ", o.model, " is a ", arch_name(cfg.arch),
        " model; decode measures a decoder-only model (gpt2-small, or a gpt2 / llama directory)");
  check(cfg.positional != Positional::Learned || o.prompt + o.tokens + 1 <= cfg.max_len, "bench decode: --prompt ",
        o.prompt, " + --tokens ", o.tokens, " do not fit the model's ", cfg.max_len, " learned positions");
  Rng rng(3);
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < o.prompt; ++i) prompt.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size))));
  GenerateConfig g;
  g.eos_id = -1;
  // One run times both parts: the clock is read after every step. The prompt: from the call to
  // the first token (the prefill and its choice); decoding: from the first token to the last, over
  // --tokens steps. Best of --reps for each. (Differencing two runs' totals instead went negative
  // on small models, where the runs' noise exceeds the steps' time.)
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> stamps;
  g.on_step = [&](int64_t) { stamps.push_back(Clock::now()); };
  auto run = [&](int64_t n, double* prefill, double* per_token) {
    g.max_new_tokens = n + 1;
    stamps.clear();
    stamps.reserve(static_cast<size_t>(n + 1));
    const auto t0 = Clock::now();
    generate(model, {prompt}, g);
    check(static_cast<int64_t>(stamps.size()) == n + 1, "bench decode: expected ", n + 1, " steps, saw ", stamps.size());
    *prefill = std::chrono::duration<double>(stamps.front() - t0).count();
    *per_token = std::chrono::duration<double>(stamps.back() - stamps.front()).count() / static_cast<double>(n);
  };
  double prefill_s = 0, best = 0;
  run(std::min<int64_t>(o.tokens, 4), &prefill_s, &best);  // warm-up: caches, allocator, BLAS threads
  prefill_s = best = 1e30;
  for (int r = 0; r < o.reps; ++r) {
    double p = 0, t = 0;
    run(o.tokens, &p, &t);
    prefill_s = std::min(prefill_s, p);
    best = std::min(best, t);
  }
  const double tok_s = 1.0 / best;
  const double prompt_tok_s = static_cast<double>(o.prompt) / prefill_s;
  // bytes read per token: every parameter (packed ones at their size) but the unused rows of the
  // position table
  const double bytes = model.weight_bytes_per_token();
  const double bw = read_bandwidth_gbs(1024, 5);
  const double bound = bw * 1e9 / bytes;
  if (o.json) {
    nlohmann::json j = {{"model", o.model},        {"batch", 1},           {"prompt", o.prompt},
                        {"tokens", o.tokens},      {"threads", num_threads()}, {"dtype", wtype_name(wt)}, {"tokens_per_s", tok_s},
                        {"ms_per_token", 1e3 * best}, {"prompt_tokens_per_s", prompt_tok_s},
                        {"weight_mib", bytes / (1 << 20)},
                        {"read_bandwidth_gbs", bw}, {"bound_tokens_per_s", bound}, {"fraction_of_bound", tok_s / bound}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("qkv bench decode: %s (%s weights), batch 1, prompt %lld, %lld new tokens (greedy, KV cache), %d threads\n",
              o.model.c_str(), wtype_name(wt), static_cast<long long>(o.prompt), static_cast<long long>(o.tokens), num_threads());
  std::printf("  decode: %.2f ms/token = %.1f tokens/s (best of %d)\n", 1e3 * best, tok_s, o.reps);
  std::printf("  prompt: %lld tokens in %.1f ms = %.1f tokens/s (the prefill and the first token's choice)\n",
              static_cast<long long>(o.prompt), 1e3 * prefill_s, prompt_tok_s);
  std::printf("  bound: %.0f MiB of weights per token at %.1f GB/s read bandwidth = %.1f tokens/s; qkv reaches %.0f%%\n",
              bytes / (1 << 20), bw, bound, 100 * tok_s / bound);
  return 0;
}

}  // namespace

Runner add_bench_decode(CLI::App& bench) {
  auto o = std::make_shared<DecodeBenchOptions>();
  CLI::App* c = bench.add_subcommand("decode", "Decoding tokens/s at batch 1 against the memory-bandwidth bound");
  c->add_option("--model", o->model, "gpt2-small (random weights), or a decoder's directory (qkv's or a Hugging Face folder)")
      ->check(preset_or_model_dir({"gpt2-small"}));
  c->add_option("--prompt", o->prompt, "Prompt tokens")->transform(whole(1, 512));
  c->add_option("--tokens", o->tokens, "Tokens generated per timed run")->transform(whole(2, 512));
  c->add_option("--reps", o->reps, "Timed runs (the best is reported)")->transform(whole(1, 100));
  c->add_option("--dtype", o->dtype, kDtypeHelp);
  c->add_flag("--json", o->json, "Print JSON");
  return [o] { return run_bench_decode(*o); };
}

}  // namespace qkv::cli
