// qkv::train_model (qkv/train_run.h), `qkv train` as a library function: its hooks (progress,
// log, stop), exact resume after a stop, and the options' ranges checked for every caller with
// nothing written. The command line's own behaviour is tests/cli_*.py's.
#include "qkv/train_run.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "qkv/train.h"

namespace qkv {
namespace {

using testing::contains;
using testing::error_of;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

TrainOptions tiny_lm(const TempDir& dir, const std::string& out) {
  std::string text;
  const char* words[] = {"zero", "one", "two", "three", "four", "five"};
  for (int i = 0; i < 120; ++i) text += std::string("let there be ") + words[i % 6] + " and " + words[(i * 7) % 6] + "\n";
  write_bytes(dir / "lm.txt", text);
  TrainOptions o;
  o.task = "lm";
  o.data = dir / "lm.txt";
  o.out = dir / out;
  o.tokenizer = "byte";
  o.max_len = 16;
  o.eval_every = 3;
  o.steps = 6;
  o.seed = 4;
  return o;
}

TEST(TrainModel, ReportsEveryStepThroughItsHooksAndWritesTheDirectory) {
  const TempDir dir("train_run");
  std::vector<int64_t> steps;
  std::vector<std::string> lines;
  TrainHooks hooks;
  hooks.progress = [&](const LoopProgress& p) { steps.push_back(p.step); };
  hooks.log = [&](const std::string& line) { lines.push_back(line); };
  const TrainResult r = train_model(tiny_lm(dir, "run"), hooks);
  EXPECT_FALSE(r.stopped_before_training);
  EXPECT_FALSE(r.loop.interrupted);
  EXPECT_EQ(r.loop.steps, 6);
  EXPECT_TRUE(r.validated);
  EXPECT_TRUE(std::isfinite(r.loop.best_valid_loss));
  EXPECT_EQ(r.task, Task::LanguageModel);
  EXPECT_GT(r.parameters, 0);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  bool model_line = false;
  for (const std::string& l : lines) model_line |= contains(l, "parameters") && contains(l, dir / "run");
  EXPECT_TRUE(model_line);
  for (const char* f : {"config.json", "model.safetensors", "checkpoint.safetensors", "train.json", "task.json",
                        "metrics.jsonl"})
    EXPECT_TRUE(std::filesystem::exists(dir / (std::string("run/") + f))) << f;
  // the default precision is auto: bf16 where the CPU has bf16 dot products, else float32
  EXPECT_EQ(checkpoint_precision(dir / "run/checkpoint.safetensors"),
            bf16_gemm_native() ? Precision::BF16 : Precision::F32);
}

TEST(TrainModel, AStopAfterAStepSavesACheckpointThatResumesExactly) {
  const TempDir dir("train_run");
  const int threads = num_threads();
  train_model(tiny_lm(dir, "whole"), {});
  std::atomic<bool> stop{false};
  TrainHooks hooks;
  hooks.stop = &stop;
  hooks.progress = [&](const LoopProgress& p) { stop = p.step == 2; };
  hooks.log = [](const std::string&) {};
  TrainResult r = train_model(tiny_lm(dir, "parts"), hooks);
  EXPECT_TRUE(r.loop.interrupted);
  EXPECT_EQ(r.loop.steps, 2);
  TrainOptions more;
  more.out = dir / "parts";
  more.resume = true;
  more.steps = 6;
  more.given = {"--out", "--resume", "--steps"};
  r = train_model(more, {});
  EXPECT_EQ(r.loop.start_step, 2);
  EXPECT_EQ(r.loop.steps, 6);
  EXPECT_EQ(num_threads(), threads);
  EXPECT_EQ(read_bytes(dir / "parts/model.safetensors"), read_bytes(dir / "whole/model.safetensors"));
}

TEST(TrainModel, AStopBeforeTrainingWritesNothing) {
  const TempDir dir("train_run");
  std::atomic<bool> stop{true};
  TrainHooks hooks;
  hooks.stop = &stop;
  hooks.log = [](const std::string&) {};
  const TrainResult r = train_model(tiny_lm(dir, "run"), hooks);
  EXPECT_TRUE(r.stopped_before_training);
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
}

TEST(TrainModel, EveryOptionsRangeIsCheckedBeforeAnythingIsWritten) {
  const TempDir dir("train_run");
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* words;
    void (*set)(TrainOptions&, double, double);
  };
  const Case cases[] = {
      {"--lr nan", [](TrainOptions& o, double n, double) { o.lr = n; }},
      {"--minutes inf", [](TrainOptions& o, double, double i) { o.minutes = i; }},
      {"--dropout -inf", [](TrainOptions& o, double, double i) { o.dropout = -i; }},
      {"--label-smoothing 0.7", [](TrainOptions& o, double, double) { o.label_smoothing = 0.7; }},
      {"--valid-fraction nan", [](TrainOptions& o, double n, double) { o.valid_fraction = n; }},
      {"--bucket-mb 0", [](TrainOptions& o, double, double) { o.bucket_mb = 0; }},
      {"--subword-alpha 1.5", [](TrainOptions& o, double, double) { o.subword_alpha = 1.5; }},
      {"--steps -1", [](TrainOptions& o, double, double) { o.steps = -1; }},
      {"--vocab 20", [](TrainOptions& o, double, double) { o.vocab = 20; }},
      {"--max-len 1", [](TrainOptions& o, double, double) { o.max_len = 1; }},
      {"--warmup 0", [](TrainOptions& o, double, double) { o.warmup = 0; }},
      {"--parts 0", [](TrainOptions& o, double, double) { o.parts = 0; }},
      {"--average -2", [](TrainOptions& o, double, double) { o.average = -2; }},
      {"--precision fp8", [](TrainOptions& o, double, double) { o.precision = "fp8"; }},
      {"--spm-type word", [](TrainOptions& o, double, double) { o.spm_type = "word"; }},
      {"--out: the model directory to write is required", [](TrainOptions& o, double, double) { o.out.clear(); }},
      {"--preset huge", [](TrainOptions& o, double, double) { o.preset = "huge"; }},
      {"give a limit", [](TrainOptions& o, double, double) { o.steps = 0; }},
  };
  for (const Case& c : cases) {
    TrainOptions o = tiny_lm(dir, "run");
    c.set(o, nan, inf);
    const std::string e = error_of([&] { train_model(o, {}); });
    EXPECT_TRUE(contains(e, c.words)) << c.words << ": " << e;
    EXPECT_FALSE(std::filesystem::exists(dir / "run")) << c.words;
  }
}

}  // namespace
}  // namespace qkv
