// qkv bench train: training throughput (forward + backward + AdamW) in tokens/s and the
// process's peak resident memory, for the reference shapes or any config.json.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_checks.h"
#include "commands.h"
#include "qkv/qkv.h"
#include "task_util.h"

namespace qkv::cli {
namespace {

struct TrainBenchOptions {
  std::string model = "gpt2-small";
  std::string config, precision = "f32";
  int64_t batch = 4, seq = 256;
  int steps = 6, warmup = 1;
  bool json = false;
};

}  // namespace

ModelConfig bench_preset(const std::string& name) {
  ModelConfig c;
  if (name == "gpt2-small") {
    // GPT-2 small: 12 layers, d_model 768, 12 heads, FFN 3072, vocabulary 50257, learned
    // positions, pre-norm, tanh-GELU, tied embeddings.
    c.arch = Arch::Decoder;
    c.vocab_size = 50257;
    c.d_model = 768;
    c.n_heads = 12;
    c.d_ff = 3072;
    c.n_layers = 12;
    c.activation = Activation::GeluTanh;
    c.norm_first = true;
    c.positional = Positional::Learned;
    c.max_len = 1024;
    c.tie_embeddings = true;
  } else if (name == "transformer-base") {
    // The 2017 base model: 6 + 6 layers, d_model 512, 8 heads, FFN 2048, ReLU, post-norm,
    // sinusoidal positions, embeddings scaled by sqrt(d_model) and shared with the output
    // projection; a 32000-token shared vocabulary.
    c.arch = Arch::EncoderDecoder;
    c.vocab_size = 32000;
    c.d_model = 512;
    c.n_heads = 8;
    c.d_ff = 2048;
    c.n_encoder_layers = 6;
    c.n_decoder_layers = 6;
    c.positional = Positional::Sinusoidal;
    c.scale_embeddings = true;
    c.tie_embeddings = true;
  } else {
    throw Error(detail::concat("bench train: unknown --model '", name, "' (gpt2-small, transformer-base, or --config)"));
  }
  c.validate();
  return c;
}

namespace {

Tensor random_ids(int64_t B, int64_t T, int64_t V, Rng& rng) {
  Tensor t({B, T}, DType::I64);
  for (int64_t i = 0; i < B * T; ++i) t.data<int64_t>()[i] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

int run_bench_train(const TrainBenchOptions& o) {
  // --model: a preset, or a directory (qkv's or a Hugging Face folder) whose weights are loaded
  const bool from_dir = o.config.empty() && (o.model != "gpt2-small" && o.model != "transformer-base");
  std::optional<Model> loaded;
  if (from_dir) loaded.emplace(load_model(o.model));
  const ModelConfig cfg = from_dir ? loaded->config() : o.config.empty() ? bench_preset(o.model) : ModelConfig::load(o.config);
  const std::string name = o.config.empty() ? o.model : o.config;
  // learned positions end at max_len: a longer sequence has no position to embed
  check(cfg.positional != Positional::Learned || o.seq <= cfg.max_len, "--seq ", o.seq, ": ", name,
        " has learned positions for ", cfg.max_len, " tokens; give --seq ", cfg.max_len, " or less");
  // the logits and their gradient alone, (B, T, V) floats each: a lower bound on what a step
  // needs, refused before anything is allocated when even that cannot fit
  std::string source;
  const double avail = available_memory_bytes(&source);
  const double logits = 2.0 * 4.0 * static_cast<double>(o.batch) * static_cast<double>(o.seq) *
                        static_cast<double>(cfg.arch == Arch::EncoderClassifier ? cfg.num_classes : cfg.vocab_size);
  check(avail < 0 || logits <= avail, "--batch ", o.batch, " --seq ", o.seq, ": the logits of one step and their "
        "gradient alone take ", static_cast<int64_t>(logits / (1 << 20)), " MiB, more than the ",
        static_cast<int64_t>(avail / (1 << 20)), " MiB of memory available (", source, ")");
  // the ceiling of the products the step runs: float32's, or bf16's (its rounding included)
  const bool bf16 = parse_precision(o.precision, "--precision") == Precision::BF16;
  const Ceiling measured = [&] {
    std::optional<Bf16Matmul> scope;
    if (bf16) scope.emplace();
    return measure_gemm_ceiling(2048, 3);
  }();
  const double ceiling = measured.gflops;
  if (!measured.warning().empty()) std::fprintf(stderr, "qkv bench train: %s\n", measured.warning().c_str());
  Model model = [&] {
    if (from_dir) return std::move(*loaded);
    try {
      Model m(cfg);
      m.init(1);
      return m;
    } catch (const Error& e) {  // a config too large for this machine: name the file
      throw Error(detail::concat(name, ": ", e.what()));
    }
  }();
  TrainConfig tc;
  tc.schedule.lr = 1e-4;
  tc.clip_norm = 1.0;
  tc.precision = parse_precision(o.precision, "--precision");
  Trainer trainer(model, tc);
  Rng rng(7);
  const bool encdec = cfg.arch == Arch::EncoderDecoder;
  auto make_batch = [&] {
    Batch b;
    b.input = random_ids(o.batch, o.seq, encdec ? cfg.source_vocab() : cfg.vocab_size, rng);
    if (encdec) b.decoder_input = random_ids(o.batch, o.seq, cfg.vocab_size, rng);
    b.target = cfg.arch == Arch::EncoderClassifier ? random_ids(o.batch, 1, cfg.num_classes, rng).view({o.batch})
                                                    : random_ids(o.batch, o.seq, cfg.vocab_size, rng);
    return b;
  };
  const bool tty = isatty(fileno(stderr)) != 0;
  double total = 0, best = 1e30;
  double last_loss = 0;
  const int all = o.warmup + o.steps;
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < all; ++s) {
    const Batch b = make_batch();
    const auto t0 = std::chrono::steady_clock::now();
    last_loss = trainer.step({b}).loss;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= o.warmup) {
      total += dt;
      best = std::min(best, dt);
    }
    if (tty) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\rbench train %s: step %d/%d  %.2f s/step  [%.0fs, ETA %.0fs]\033[K", name.c_str(), s + 1,
                   all, dt, el, el / (s + 1) * (all - s - 1));
    }
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  const double per_step = total / o.steps;
  const double tokens = static_cast<double>(o.batch * o.seq);
  // Matmul FLOPs per token: 6 per parameter that multiplies activations (not position tables;
  // the tied embedding counts once, as the output projection), plus attention scores and
  // values: 6 * 2 * T * d per layer forward+backward (halved for causal self-attention).
  int64_t n_mm = model.num_parameters();
  if (const Parameter* p = model.find("pos_embed.weight")) n_mm -= p->var->value.numel();
  if (encdec) n_mm -= model.find("src_embed.weight")->var->value.numel();
  const double T = static_cast<double>(o.seq), d = static_cast<double>(cfg.n_heads * cfg.head_dim_k());
  double attn = 0;
  if (cfg.arch == Arch::Decoder) attn = cfg.n_layers * 6.0 * 2 * T * d * 0.5;
  if (cfg.arch == Arch::EncoderClassifier) attn = cfg.n_layers * 6.0 * 2 * T * d;
  if (encdec) attn = cfg.n_encoder_layers * 6.0 * 2 * T * d + cfg.n_decoder_layers * 6.0 * 2 * T * d * 1.5;
  // Encoder-decoder: the encoder's matmuls run on the source tokens too (same count here).
  const double flops_tok = 6.0 * static_cast<double>(n_mm) + attn;
  const double gflops = flops_tok * tokens / per_step / 1e9;
  const double peak_mib = static_cast<double>(proc_status_kb("VmHWM")) / 1024.0;
  if (o.json) {
    nlohmann::json j = {{"model", name},          {"parameters", model.num_parameters()},
                        {"batch", o.batch},       {"seq", o.seq},
                        {"precision", o.precision}, {"bf16_native", bf16_gemm_native()},
                        {"steps", o.steps},       {"threads", num_threads()},
                        {"s_per_step", per_step}, {"best_s_per_step", best},
                        {"tokens_per_s", tokens / per_step},
                        {"est_gflops", gflops},   {"gemm_ceiling_gflops", ceiling},
                        {"peak_rss_mib", peak_mib}, {"last_loss", last_loss}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const BlasInfo bi = blas_info();
  std::printf("qkv bench train: %s, %lld parameters, batch %lld x %lld tokens, %d threads, GEMM %s, %s products%s\n",
              name.c_str(), static_cast<long long>(model.num_parameters()), static_cast<long long>(o.batch),
              static_cast<long long>(o.seq), num_threads(), bi.gemm.c_str(), o.precision.c_str(),
              o.precision == "bf16" ? (bf16_gemm_native() ? " (bf16 dot products)" : " (no bf16 dot products on this CPU: "
                                                                                      "rounded, then float32 products)")
                                    : "");
  std::printf("  step (fwd + bwd + AdamW): mean %.3f s, best %.3f s over %d steps (after %d warmup)\n", per_step, best,
              o.steps, o.warmup);
  std::printf("  throughput: %.1f tokens/s%s\n", tokens / per_step, encdec ? " (target tokens; as many source tokens)" : "");
  std::printf("  estimated matmul rate: %.1f GFLOP/s = %.0f%% of the %.1f GFLOP/s %s ceiling\n", gflops,
              100.0 * gflops / ceiling, ceiling, bf16 ? "bf16 GEMM (2048^3, rounding included)" : "SGEMM");
  std::printf("  peak resident memory (whole process): %.0f MiB\n", peak_mib);
  return 0;
}

}  // namespace

Runner add_bench_train(CLI::App& bench) {
  auto o = std::make_shared<TrainBenchOptions>();
  CLI::App* c = bench.add_subcommand("train", "Training throughput: tokens/s and peak memory of fwd + bwd + AdamW");
  c->add_option("--model", o->model,
                "gpt2-small, transformer-base, or a model directory (qkv's or a Hugging Face folder) to train from")
      ->check(preset_or_model_dir({"gpt2-small", "transformer-base"}));
  c->add_option("--config", o->config, "Benchmark this config.json instead of a preset")->check(CLI::ExistingFile);
  c->add_option("--batch", o->batch, "Sequences per step")->transform(whole(1, 1 << 20));
  c->add_option("--seq", o->seq, "Tokens per sequence (source and target for encoder-decoder)")
      ->transform(whole(1, 1 << 20));
  c->add_option("--steps", o->steps, "Timed steps")->transform(whole(1, 1000000));
  c->add_option("--warmup", o->warmup, "Untimed steps first")->transform(whole(0, 1000000));
  c->add_option("--precision", o->precision,
                 "Matrix products in f32, or bf16 (inputs rounded to bfloat16, sums in float32; as qkv train --precision)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  c->add_flag("--json", o->json, "Print JSON");
  return [o] { return run_bench_train(*o); };
}

}  // namespace qkv::cli
