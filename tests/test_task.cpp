// The training loop behind `qkv train` (qkv/task.h): batches, evaluation, the files it writes,
// and an exact resume: N steps straight equal N/2, stop, resume, N/2 more, bit for bit, for the
// translation, language-model and classification tasks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/data.h"
#include "qkv/safetensors.h"
#include "qkv/task.h"

namespace qkv {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::TempDir;

// Reverse-the-digits translation, next-digit LM windows, parity classification: tiny and seeded.
std::vector<Example> make_examples(Task task, int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<Example> out;
  for (int i = 0; i < n; ++i) {
    Example e;
    const int len = 2 + static_cast<int>(rng.below(6));
    for (int j = 0; j < len; ++j) e.src.push_back(4 + static_cast<int32_t>(rng.below(10)));
    switch (task) {
      case Task::Translate:
        e.tgt.assign(e.src.rbegin(), e.src.rend());
        e.src.push_back(2);
        e.tgt.push_back(2);
        break;
      case Task::LanguageModel:
        e.src.resize(9, 5);
        break;
      case Task::Classify: {
        int s = 0;
        for (int32_t t : e.src) s += t;
        e.label = s % 2;
        break;
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

ModelConfig config_for(Task task) {
  ModelConfig c;
  c.vocab_size = 16;
  c.d_model = 16;
  c.n_heads = 2;
  c.d_ff = 32;
  c.n_layers = 1;
  c.n_encoder_layers = c.n_decoder_layers = 1;
  c.norm_first = true;
  c.dropout = 0.1;  // dropout on: the resumed run must replay the same masks
  c.pad_id = 0;
  c.bos_id = 1;
  c.eos_id = 2;
  switch (task) {
    case Task::Translate: c.arch = Arch::EncoderDecoder; break;
    case Task::LanguageModel:
      c.arch = Arch::Decoder;
      c.positional = Positional::Learned;
      c.max_len = 16;
      break;
    case Task::Classify:
      c.arch = Arch::EncoderClassifier;
      c.num_classes = 2;
      break;
  }
  return c;
}

TrainConfig train_config() {
  TrainConfig tc;
  tc.schedule.kind = ScheduleKind::Constant;
  tc.schedule.lr = 3e-3;
  tc.clip_norm = 1.0;
  tc.seed = 3;
  return tc;
}

LoopConfig loop(int64_t steps) {
  LoopConfig lc;
  lc.max_steps = steps;
  lc.max_tokens = 48;
  lc.eval_every = 4;
  lc.seed = 11;
  return lc;
}

// Trains the run `lc` describes (weights from init(1), train_config()) into dir and stops it, as
// Ctrl-C would, after `steps` steps.
LoopResult run_stopped(Task task, const std::vector<Example>& train, const std::vector<Example>& valid,
                       const std::filesystem::path& dir, LoopConfig lc, int64_t steps) {
  std::atomic<bool> stop{false};
  Model m(config_for(task));
  m.init(1);
  Trainer t(m, train_config());
  lc.stop = &stop;
  int64_t calls = 0;
  return run_training(t, task, train, valid, dir.string(), lc, false, [&](const LoopProgress&) {
    if (++calls == steps) stop = true;
  });
}

// Resumes the run in dir to lc's limits, from a model and trainer whose own weights and settings
// are not the run's (the checkpoint must bring them all).
LoopResult run_resumed(Task task, const std::vector<Example>& train, const std::vector<Example>& valid,
                       const std::filesystem::path& dir, const LoopConfig& lc) {
  Model m(config_for(task));
  m.init(5);
  Trainer t(m, TrainConfig{});
  return run_training(t, task, train, valid, dir.string(), lc, true);
}

TEST(Task, BatchesPadShiftAndLabel) {
  const std::vector<Example> ex = make_examples(Task::Translate, 3, 1);
  const Batch b = make_batch(config_for(Task::Translate), Task::Translate, ex, {0, 2});
  ASSERT_EQ(b.input.size(0), 2);
  const int64_t T = b.target.size(1);
  // decoder input is [bos, tgt[:-1]] and the target is tgt, padded with pad_id
  EXPECT_EQ(b.decoder_input.data<int64_t>()[0], 1);
  for (int64_t i = 1; i < static_cast<int64_t>(ex[0].tgt.size()); ++i)
    EXPECT_EQ(b.decoder_input.data<int64_t>()[i], ex[0].tgt[i - 1]);
  for (int64_t i = static_cast<int64_t>(ex[0].tgt.size()); i < T; ++i) EXPECT_EQ(b.target.data<int64_t>()[i], 0);
  EXPECT_EQ(b.input_lengths.data<int64_t>()[1], static_cast<int64_t>(ex[2].src.size()));
  const std::vector<Example> lm = make_examples(Task::LanguageModel, 2, 1);
  const Batch l = make_batch(config_for(Task::LanguageModel), Task::LanguageModel, lm, {1});
  ASSERT_EQ(l.input.size(1), 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(l.input.data<int64_t>()[i], lm[1].src[i]);
    EXPECT_EQ(l.target.data<int64_t>()[i], lm[1].src[i + 1]);
  }
  const std::vector<Example> cl = make_examples(Task::Classify, 2, 1);
  const Batch c = make_batch(config_for(Task::Classify), Task::Classify, cl, {0, 1});
  EXPECT_EQ(c.target.data<int64_t>()[1], cl[1].label);
}

// "loss" of each metrics.jsonl line that has one, as written (17 significant digits).
std::vector<std::string> train_losses(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(read_bytes(path));
  std::string line;
  while (std::getline(in, line)) {
    const size_t p = line.find("\"loss\":");
    if (p == std::string::npos) continue;
    const size_t e = line.find_first_of(",}", p);
    const size_t q = line.find("\"step\":");
    out.push_back(line.substr(p, e - p) + " @ " + line.substr(q, line.find_first_of(",}", q) - q));
  }
  return out;
}

TEST(Task, ResumeIsExactForEveryTask) {
  for (Task task : {Task::Translate, Task::LanguageModel, Task::Classify}) {
    SCOPED_TRACE(task_name(task));
    const std::vector<Example> train = make_examples(task, 40, 5), valid = make_examples(task, 8, 6);
    TempDir straight("task_a"), split("task_b");
    {
      Model m(config_for(task));
      m.init(1);
      Trainer t(m, train_config());
      const LoopResult r = run_training(t, task, train, valid, straight.path().string(), loop(14), false);
      EXPECT_EQ(r.steps, 14);
      EXPECT_FALSE(r.interrupted);
    }
    {
      Model m(config_for(task));
      m.init(1);
      Trainer t(m, train_config());
      run_training(t, task, train, valid, split.path().string(), loop(6), false);
    }
    {
      Model m(config_for(task));
      m.init(99);  // overwritten by the checkpoint
      Trainer t(m, TrainConfig{});
      const LoopResult r = run_training(t, task, train, valid, split.path().string(), loop(14), true);
      EXPECT_EQ(r.steps, 14);
    }
    EXPECT_EQ(read_bytes(straight / "checkpoint.safetensors"), read_bytes(split / "checkpoint.safetensors"))
        << "the last state differs after the resume";
    // Every step's training loss, bit for bit (the split run also validated when its first half ended).
    EXPECT_EQ(train_losses(straight / "metrics.jsonl"), train_losses(split / "metrics.jsonl"));
    EXPECT_EQ(train_losses(straight / "metrics.jsonl").size(), 14u);
    const std::vector<std::string> files = straight.entries();
    for (const char* f : {"config.json", "loss.svg", "metrics.jsonl", "model.safetensors", "checkpoint.safetensors"})
      EXPECT_NE(std::find(files.begin(), files.end(), f), files.end()) << f << " not written";
  }
}

TEST(Task, LearnsAndKeepsTheBestWeights) {
  const std::vector<Example> train = make_examples(Task::Classify, 200, 7), valid = make_examples(Task::Classify, 40, 8);
  TempDir dir("task_learn");
  Model m(config_for(Task::Classify));
  m.init(2);
  const double before = evaluate(m, Task::Classify, valid, 64).loss;
  Trainer t(m, train_config());
  LoopConfig lc = loop(0);
  lc.max_epochs = 3;
  lc.eval_every = 0;  // once per epoch
  const LoopResult r = run_training(t, Task::Classify, train, valid, dir.path().string(), lc, false);
  EXPECT_EQ(r.epochs_done, 3);
  EXPECT_LT(r.best_valid_loss, before);
  // the directory's weights are the best ones: their validation loss is the best seen
  const Model best = Model::load(dir.path().string());
  EXPECT_NEAR(evaluate(best, Task::Classify, valid, 64).loss, r.best_valid_loss, 1e-6);
}

// metrics.jsonl is written before the checkpoint: a run that dies between the two (here: the
// checkpoint cannot be written) keeps the metrics of every step up to it. (Written the other way
// round, a kill -9 after the checkpoint's rename lost those lines for good: the resumed run starts
// after them.)
TEST(Task, MetricsAreWrittenBeforeTheCheckpoint) {
  const std::vector<Example> train = make_examples(Task::LanguageModel, 30, 9);
  TempDir dir("task_metrics_first");
  std::filesystem::create_directory(dir / "checkpoint.safetensors");  // the checkpoint's write fails
  Model m(config_for(Task::LanguageModel));
  m.init(1);
  Trainer t(m, train_config());
  LoopConfig lc = loop(8);  // evaluations at steps 4 and 8
  EXPECT_THROW(run_training(t, Task::LanguageModel, train, {}, dir.path().string(), lc, false), Error);
  EXPECT_EQ(t.steps_done(), 4);
  const std::string metrics = testing::read_bytes(dir / "metrics.jsonl");
  for (const char* step : {"\"step\":1,", "\"step\":2,", "\"step\":3,", "\"step\":4,"})
    EXPECT_NE(metrics.find(step), std::string::npos) << step << " missing from metrics.jsonl:\n" << metrics;
}

TEST(Task, StopFlagCheckpointsAndReturns) {
  const std::vector<Example> train = make_examples(Task::LanguageModel, 30, 9);
  TempDir dir("task_stop");
  Model m(config_for(Task::LanguageModel));
  m.init(1);
  Trainer t(m, train_config());
  std::atomic<bool> stop{false};
  LoopConfig lc = loop(1000);
  lc.stop = &stop;
  int calls = 0;
  const LoopResult r = run_training(t, Task::LanguageModel, train, {}, dir.path().string(), lc, false,
                                    [&](const LoopProgress& p) {
                                      if (++calls == 3) stop = true;
                                      EXPECT_GE(p.fraction, 0.0);
                                    });
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.steps, 3);
  Model again(config_for(Task::LanguageModel));
  Trainer t2(again, train_config());
  t2.load_checkpoint(dir / "checkpoint.safetensors");
  EXPECT_EQ(t2.steps_done(), 3);
}

// The number of batches of each epoch's plan, as run_training plans them.
std::vector<int64_t> plan_sizes(Task task, const std::vector<Example>& ex, const LoopConfig& lc, int epochs) {
  std::vector<int64_t> lengths;
  for (const Example& e : ex) lengths.push_back(std::max<int64_t>(1, example_length(task, e)));
  std::vector<int64_t> sizes;
  for (int e = 0; e < epochs; ++e)
    sizes.push_back(static_cast<int64_t>(
        plan_epoch(lengths, lc.max_tokens, lc.seed, e, lc.core, lc.pool_per_epoch).batches.size()));
  return sizes;
}

// Epoch plans under a token budget differ in length from epoch to epoch (a shorter second epoch
// once read past the end of its plan: a crash at the first epoch boundary). Every epoch runs its
// own plan to its end, validates there, the progress fraction climbs to 1, and a run stopped in
// the middle of a later epoch resumes bit for bit.
TEST(Task, EpochsWhosePlansDifferInLengthTrainResumeAndReportProgress) {
  const Task task = Task::Translate;
  const std::vector<Example> train = make_examples(task, 400, 21), valid = make_examples(task, 8, 22);
  LoopConfig lc = loop(0);
  lc.max_epochs = 2;
  lc.eval_every = 0;   // at the end of every epoch
  lc.max_tokens = 12;  // more than one pool of 100 batches: the pools, and so the batch count, differ by epoch
  std::vector<int64_t> sizes;
  for (lc.seed = 11; lc.seed < 300; ++lc.seed) {
    sizes = plan_sizes(task, train, lc, 2);
    if (sizes[1] < sizes[0]) break;  // a shorter epoch right after the first
  }
  ASSERT_LT(sizes[1], sizes[0]) << "no seed gives plans of different lengths: the test would test nothing";
  const int64_t total = sizes[0] + sizes[1];

  TempDir straight("epochs_a"), split("epochs_b");
  std::vector<double> fractions;
  std::vector<int64_t> epoch_of_step;
  {
    Model m(config_for(task));
    m.init(1);
    Trainer t(m, train_config());
    const LoopResult r = run_training(t, task, train, valid, straight.path().string(), lc, false,
                                      [&](const LoopProgress& p) {
                                        fractions.push_back(p.fraction);
                                        epoch_of_step.push_back(p.epoch);
                                      });
    EXPECT_EQ(r.epochs_done, 2);
    EXPECT_EQ(r.steps, total) << "every epoch runs all of its own plan";
  }
  ASSERT_EQ(static_cast<int64_t>(fractions.size()), total);
  for (size_t i = 1; i < fractions.size(); ++i) EXPECT_GE(fractions[i], fractions[i - 1]) << "at step " << i + 1;
  EXPECT_GT(fractions.front(), 0.0);
  EXPECT_DOUBLE_EQ(fractions.back(), 1.0);
  // the steps of epoch e are exactly its plan's batches
  for (int e = 0; e < 2; ++e)
    EXPECT_EQ(std::count(epoch_of_step.begin(), epoch_of_step.end(), e), sizes[static_cast<size_t>(e)]) << "epoch " << e;
  // one validation at the end of each epoch
  int64_t validations = 0;
  {
    std::istringstream in(read_bytes(straight / "metrics.jsonl"));
    std::string line;
    while (std::getline(in, line)) validations += line.find("\"valid_loss\"") != std::string::npos;
  }
  EXPECT_EQ(validations, 2);

  // stopped 3 steps into the shorter second epoch, then resumed to the end
  {
    const LoopResult r = run_stopped(task, train, valid, split.path(), lc, sizes[0] + 3);
    EXPECT_TRUE(r.interrupted);
    EXPECT_EQ(r.steps, sizes[0] + 3);
  }
  {
    Model m(config_for(task));
    m.init(7);
    Trainer t(m, TrainConfig{});
    std::vector<double> resumed;
    double start = -1;
    const LoopResult r = run_training(t, task, train, valid, split.path().string(), lc, true,
                                      [&](const LoopProgress& p) {
                                        resumed.push_back(p.fraction);
                                        start = p.start_fraction;
                                        EXPECT_FALSE(std::isnan(p.valid_loss)) << "the checkpoint's validation loss is known";
                                      });
    EXPECT_EQ(r.steps, total);
    EXPECT_EQ(r.epochs_done, 2);
    ASSERT_EQ(static_cast<int64_t>(resumed.size()), sizes[1] - 3);
    EXPECT_NEAR(start, (1.0 + 3.0 / static_cast<double>(sizes[1])) / 2.0, 1e-12) << "where the resumed session began";
    EXPECT_DOUBLE_EQ(resumed.back(), 1.0);
  }
  EXPECT_EQ(read_bytes(straight / "checkpoint.safetensors"), read_bytes(split / "checkpoint.safetensors"))
      << "the resumed run differs from the straight one";
}

// The pool (--train-only-ratio): every epoch plans all of [0, core) and the next slice of one
// shuffle of the pool, consecutive epochs taking consecutive slices, cycling; without a pool the
// plan is batch_by_length's.
TEST(Task, EpochPlansDrawFromThePoolInSlices) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < 50; ++i) lengths.push_back(1 + (i * 7) % 9);
  for (int64_t e : {0, 3}) {
    const BatchPlan a = plan_epoch(lengths, 20, 5, e), b = batch_by_length(lengths, 20, 5 + 7919 * e, true);
    EXPECT_EQ(a.batches, b.batches);
    EXPECT_EQ(plan_epoch(lengths, 20, 5, e, 50, 10).batches, b.batches) << "core = n: no pool";
  }
  const int64_t core = 30, per = 8, P = 20;
  std::vector<int64_t> seen_from_pool;
  for (int64_t e = 0; e < 5; ++e) {
    const BatchPlan plan = plan_epoch(lengths, 20, 5, e, core, per);
    std::vector<int64_t> all;
    for (const auto& b : plan.batches) {
      int64_t tokens = 0;
      for (int64_t i : b) tokens = std::max(tokens, lengths[static_cast<size_t>(i)]);
      EXPECT_TRUE(b.size() == 1 || tokens * static_cast<int64_t>(b.size()) <= 20) << "the budget holds";
      all.insert(all.end(), b.begin(), b.end());
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), static_cast<size_t>(core + per)) << "epoch " << e;
    EXPECT_EQ(std::unique(all.begin(), all.end()), all.end()) << "each example at most once";
    for (int64_t i = 0; i < core; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i) << "the core, every epoch";
    seen_from_pool.insert(seen_from_pool.end(), all.begin() + core, all.end());
    EXPECT_EQ(plan.batches, plan_epoch(lengths, 20, 5, e, core, per).batches) << "a function of its arguments";
  }
  // 5 epochs x 8 = 40 draws from a pool of 20: each pool example exactly twice (slices cycle)
  std::sort(seen_from_pool.begin(), seen_from_pool.end());
  for (int64_t i = 0; i < P; ++i)
    EXPECT_EQ(std::count(seen_from_pool.begin(), seen_from_pool.end(), core + i), 2) << core + i;
  // a slice larger than the pool takes the whole pool once
  std::vector<int64_t> all;
  for (const auto& b : plan_epoch(lengths, 20, 5, 2, core, 1000).batches) all.insert(all.end(), b.begin(), b.end());
  EXPECT_EQ(all.size(), lengths.size());
  EXPECT_CONTAINS(error_of([&] { plan_epoch(lengths, 20, 5, 0, core, -1); }), "pool_per_epoch = -1");
  EXPECT_CONTAINS(error_of([&] { plan_epoch(lengths, 20, 5, -1); }), "epoch = -1");
}

// A pooled run resumes bit for bit across an epoch boundary, like any other.
TEST(Task, PooledRunResumesExactly) {
  const Task task = Task::Translate;
  const std::vector<Example> train = make_examples(task, 60, 31), valid = make_examples(task, 8, 32);
  LoopConfig lc = loop(0);
  lc.max_epochs = 3;
  lc.eval_every = 0;
  lc.core = 20;
  lc.pool_per_epoch = 15;
  const std::vector<int64_t> sizes = plan_sizes(task, train, lc, 3);
  TempDir straight("pool_a"), split("pool_b");
  {
    Model m(config_for(task));
    m.init(1);
    Trainer t(m, train_config());
    const LoopResult r = run_training(t, task, train, valid, straight.path().string(), lc, false);
    EXPECT_EQ(r.steps, sizes[0] + sizes[1] + sizes[2]);
  }
  run_stopped(task, train, valid, split.path(), lc, sizes[0] + 2);
  run_resumed(task, train, valid, split.path(), lc);
  EXPECT_EQ(read_bytes(straight / "checkpoint.safetensors"), read_bytes(split / "checkpoint.safetensors"));
}

// Subword sampling (LoopConfig::resample): each epoch trains on the examples resample gives for
// it, asked for once as the epoch begins, and a resumed run asks for the same epochs' examples
// and ends bitwise where the uninterrupted one did.
TEST(Task, ResampledEpochsTrainAndResumeExactly) {
  const Task task = Task::Translate;
  const std::vector<Example> train = make_examples(task, 24, 41), valid = make_examples(task, 6, 42);
  // epoch e: each example's target shifted by e positions (other tokens, other lengths for some)
  std::vector<int64_t> asked;
  const auto resample = [&](int64_t epoch, const std::vector<Example>& given) {
    asked.push_back(epoch);
    EXPECT_EQ(given.size(), train.size());
    std::vector<Example> out(given);
    for (size_t i = 0; i < out.size(); ++i)
      if ((i + static_cast<size_t>(epoch)) % 3 == 0 && out[i].tgt.size() > 2) out[i].tgt.erase(out[i].tgt.begin());
    return out;
  };
  LoopConfig lc = loop(0);
  lc.max_epochs = 3;
  lc.eval_every = 0;
  lc.resample = resample;
  TempDir straight("resample_a"), plain("resample_p"), split("resample_b");
  int64_t steps = 0;
  {
    Model m(config_for(task));
    m.init(1);
    Trainer t(m, train_config());
    steps = run_training(t, task, train, valid, straight.path().string(), lc, false).steps;
  }
  // each epoch once, as it begins (and epoch 3, planned as the loop reaches its limit)
  EXPECT_EQ(asked, (std::vector<int64_t>{0, 1, 2, 3}));
  {
    LoopConfig without = lc;
    without.resample = nullptr;
    Model m(config_for(task));
    m.init(1);
    Trainer t(m, train_config());
    run_training(t, task, train, valid, plain.path().string(), without, false);
  }
  EXPECT_NE(read_bytes(straight / "checkpoint.safetensors"), read_bytes(plain / "checkpoint.safetensors"))
      << "the resampled examples were not trained on";
  asked.clear();
  run_stopped(task, train, valid, split.path(), lc, steps / 2);
  run_resumed(task, train, valid, split.path(), lc);
  EXPECT_EQ(read_bytes(straight / "checkpoint.safetensors"), read_bytes(split / "checkpoint.safetensors"));
  EXPECT_GE(asked.size(), 3u);
}

// Checkpoint averaging: the last N validations' weights are kept as snapshots (so also across a
// resume), and their mean, if it validates better than every single one, is the model.
// Without eval_every, eval_every_seconds validates by the clock instead of at each epoch's end:
// a due time at every step validates at every step; one never reached, only at the end.
TEST(Task, ValidationByTheClock) {
  const Task task = Task::Translate;
  const std::vector<Example> train = make_examples(task, 40, 41), valid = make_examples(task, 8, 42);
  auto validations = [&](double seconds) {
    TempDir dir("clock");
    LoopConfig lc = loop(6);
    lc.eval_every = 0;
    lc.eval_every_seconds = seconds;
    Model m(config_for(task));
    m.init(1);
    Trainer t(m, train_config());
    run_training(t, task, train, valid, dir.path().string(), lc, false);
    int64_t n = 0;
    std::istringstream in(read_bytes(dir / "metrics.jsonl"));
    std::string line;
    while (std::getline(in, line)) n += line.find("\"valid_loss\"") != std::string::npos;
    return n;
  };
  EXPECT_EQ(validations(1e-9), 6);
  EXPECT_EQ(validations(1e9), 1);
}

TEST(Task, CheckpointAveragingKeepsTheLastSnapshotsAndTheirMean) {
  const Task task = Task::Translate;
  const std::vector<Example> train = make_examples(task, 40, 41), valid = make_examples(task, 8, 42);
  LoopConfig lc = loop(14);  // validations at steps 4, 8, 12 and 14 (the end)
  lc.average = 3;
  TempDir straight("avg_a"), split("avg_b");
  LoopResult r;
  {
    Model m(config_for(task));
    m.init(1);
    Trainer t(m, train_config());
    r = run_training(t, task, train, valid, straight.path().string(), lc, false);
  }
  const std::vector<std::string> names = {"step-000000008.safetensors", "step-000000012.safetensors",
                                          "step-000000014.safetensors"};
  std::vector<std::string> kept;
  for (const auto& e : std::filesystem::directory_iterator(straight / "snapshots")) kept.push_back(e.path().filename());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, names);
  EXPECT_EQ(r.averaged, 3);
  ASSERT_TRUE(std::isfinite(r.averaged_valid_loss));
  // the mean, summed in double, and its validation loss
  std::vector<SafetensorsFile> snaps;
  for (const std::string& n : names) snaps.push_back(read_safetensors(straight / ("snapshots/" + n)));
  Model mean(config_for(task));
  std::vector<std::pair<std::string, Tensor>> mean_sd;
  for (auto& [name, t] : mean.state_dict()) {
    Tensor avg(t.shape(), DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) {
      double sum = 0;
      for (const SafetensorsFile& f : snaps) sum += f.find(name)->data<float>()[i];
      avg.data<float>()[i] = static_cast<float>(sum / 3.0);
    }
    mean_sd.emplace_back(name, std::move(avg));
  }
  mean.load_state_dict(mean_sd);
  EXPECT_EQ(evaluate(mean, task, valid, 48).loss, r.averaged_valid_loss);
  const Model saved = Model::load(straight.path().string());
  double best_single = std::numeric_limits<double>::infinity();
  {
    std::istringstream in(read_bytes(straight / "metrics.jsonl"));
    std::string line;
    while (std::getline(in, line))
      if (const size_t p = line.find("\"valid_loss\":"); p != std::string::npos)
        best_single = std::min(best_single, std::stod(line.substr(p + 13)));
  }
  EXPECT_EQ(r.averaged_kept, r.averaged_valid_loss < best_single);
  const auto saved_sd = saved.state_dict();
  const Tensor& got = saved_sd.front().second;
  const Tensor& want = r.averaged_kept ? mean_sd.front().second : got;
  EXPECT_EQ(std::vector<float>(got.data<float>(), got.data<float>() + got.numel()),
            std::vector<float>(want.data<float>(), want.data<float>() + want.numel()));
  EXPECT_NEAR(evaluate(saved, task, valid, 48).loss, std::min(best_single, r.averaged_valid_loss), 1e-6);

  // stopped after step 6 and resumed: the same snapshots, bit for bit
  run_stopped(task, train, valid, split.path(), lc, 6);
  run_resumed(task, train, valid, split.path(), lc);
  for (const std::string& n : names)
    EXPECT_EQ(read_bytes(straight / ("snapshots/" + n)), read_bytes(split / ("snapshots/" + n))) << n;
  EXPECT_EQ(read_bytes(straight / "model.safetensors"), read_bytes(split / "model.safetensors"));
}

// Everything read back from a checkpoint is input: the data position and the moments included.
TEST(Task, ResumeRejectsACheckpointThatCannotBeTrue) {
  const Task task = Task::Classify;
  const std::vector<Example> train = make_examples(task, 30, 3);
  TempDir dir("resume_bad");
  const std::string ckpt = dir / "checkpoint.safetensors";
  Model m(config_for(task));
  m.init(1);
  Trainer t(m, train_config());
  auto resume_error = [&](const std::string& state) {
    t.save_checkpoint(ckpt, state);
    Model again(config_for(task));
    Trainer t2(again, train_config());
    return error_of([&] { run_training(t2, task, train, {}, dir.path().string(), loop(50), true); });
  };
  EXPECT_NE(resume_error(R"({"epoch": 0, "batch": -3})").find("out of range"), std::string::npos);
  EXPECT_NE(resume_error(R"({"epoch": -1, "batch": 0})").find("out of range"), std::string::npos);
  EXPECT_NE(resume_error(R"({"epoch": 18446744073709551615, "batch": 0})").find("out of range"), std::string::npos);
  EXPECT_NE(resume_error(R"({"epoch": 0, "batch": 100000})").find("beyond that epoch's"), std::string::npos);
  EXPECT_NE(resume_error(R"({"epoch": 0, "batch": 0, "best": -1})").find("\"best\""), std::string::npos);
  EXPECT_NE(resume_error(R"({"epoch": 0, "batch": 0, "last_valid": "x"})").find("\"last_valid\""), std::string::npos);
  EXPECT_NE(resume_error(R"({"epoch": 0.5, "batch": 0})").find("no data position"), std::string::npos);

  // AdamW's second moment must be >= 0 and both moments finite
  t.save_checkpoint(ckpt, R"({"epoch": 0, "batch": 0})");
  auto with_moment = [&](const std::string& prefix, float value) {
    SafetensorsFile f = read_safetensors(ckpt);
    for (auto& [name, tensor] : f.tensors)
      if (name.rfind(prefix, 0) == 0) {
        tensor = tensor.clone();
        tensor.data<float>()[0] = value;
        break;
      }
    const std::string bad = dir / "bad.safetensors";
    write_safetensors(bad, f.tensors, f.metadata);
    Model again(config_for(task));
    Trainer t2(again, train_config());
    return error_of([&] { t2.load_checkpoint(bad); });
  };
  EXPECT_NE(with_moment("adam_v.", -1.0f).find("second moment >= 0"), std::string::npos);
  EXPECT_NE(with_moment("adam_v.", std::nanf("")).find("second moment >= 0"), std::string::npos);
  EXPECT_NE(with_moment("adam_m.", std::numeric_limits<float>::infinity()).find("finite first moment"),
            std::string::npos);
}

TEST(Task, ErrorsNameTheProblem) {
  TempDir dir("task_err");
  Model m(config_for(Task::Classify));
  Trainer t(m, train_config());
  EXPECT_NE(error_of([&] { run_training(t, Task::Classify, {}, {}, dir.path().string(), loop(3), false); })
                .find("training set is empty"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              run_training(t, Task::Classify, make_examples(Task::Classify, 4, 1), {}, dir.path().string(), LoopConfig{},
                           false);
            }).find("give a limit"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              run_training(t, Task::Classify, make_examples(Task::Classify, 4, 1), {}, dir.path().string(), loop(3),
                           true);
            }).find("checkpoint.safetensors"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_task("summarise"); }).find("translate, lm or classify"), std::string::npos);
  EXPECT_NE(error_of([&] { TaskInfo::load(dir.path().string()); }).find("task.json"), std::string::npos);
  // Found by fuzzing (tests/fuzz/fuzz_task_json.cpp): parts of the file silently dropped.
  const std::string file = dir / "task.json";
  const auto load_error = [&](const std::string& text) {
    testing::write_bytes(file, text);
    return error_of([&] { TaskInfo::load(dir.path().string()); });
  };
  EXPECT_NE(load_error(std::string(R"({"task": "lm"})") + '\0' + "garbage")
                .find(file + ": not valid JSON: NUL byte at offset 14"),
            std::string::npos);
  EXPECT_NE(load_error(R"({"task": "classify", "task": "lm"})").find(file + ": duplicate key \"task\""),
            std::string::npos);
  EXPECT_NE(load_error(R"({"task": "classify", "labels": ["a", "b", "a"]})").find("label \"a\" appears twice"),
            std::string::npos);
  EXPECT_EQ(load_error(R"({"task": "classify", "labels": ["a", "b"], "max_len": 3})"), "no exception");
}

}  // namespace
}  // namespace qkv
