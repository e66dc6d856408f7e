// qkv/task.h: the three jobs a model is trained for (translation, language modelling,
// classification), their examples as token ids, batching, evaluation, and the training loop
// behind `qkv train`: batches by length under a token budget, validation at intervals, the best
// weights and the last checkpoint kept, metrics as JSONL and a loss curve as SVG, and an exact
// resume.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qkv/model.h"
#include "qkv/train.h"

namespace qkv {

enum class Task { Translate, LanguageModel, Classify };
const char* task_name(Task t);                 // "translate", "lm", "classify"
Task parse_task(const std::string& name);      // the inverse; the error lists the names

// task.json in a model directory: what the model was trained for, so `qkv translate`,
// `generate`, `classify` and `eval` can check they are given the right kind of model.
struct TaskInfo {
  Task task = Task::Translate;
  std::vector<std::string> labels;  // classify: class index -> label text
  int64_t max_len = 0;              // longest training sequence in tokens (lm: the window)
  void save(const std::string& dir) const;  // atomic
  static TaskInfo load(const std::string& dir);  // validated; errors name dir/task.json
};

// One example as token ids. translate: src and tgt (each ending in eos); lm: src is a window of
// T + 1 tokens (input src[:-1], target src[1:]); classify: src and label.
struct Example {
  std::vector<int32_t> src, tgt;
  int64_t label = -1;
};

// The length that counts against a batch's token budget.
int64_t example_length(Task task, const Example& e);

// A padded batch for the model (pad_id from its config; bos for the shifted decoder input).
Batch make_batch(const ModelConfig& cfg, Task task, const std::vector<Example>& examples,
                 const std::vector<int64_t>& indices);

struct EvalResult {
  double loss = 0;        // mean token (or example) cross-entropy, nats
  int64_t count = 0;      // tokens (translate, lm) or examples (classify) scored
  double accuracy = 0;    // classify: fraction right; others: next-token accuracy
};
// Mean loss over examples, no dropout, batched under max_tokens.
EvalResult evaluate(const Model& model, Task task, const std::vector<Example>& examples, int64_t max_tokens);

struct LoopConfig {
  int64_t max_steps = 0;      // stop after this many optimiser steps (0: no limit)
  int64_t max_epochs = 0;     // ... or epochs (0: no limit)
  double max_minutes = 0;     // ... or minutes of training (0: no limit)
  int64_t max_tokens = 4096;  // token budget of a batch, padding included
  int64_t eval_every = 0;     // validate every this many steps (0: once per epoch, or by the clock)
  double eval_every_seconds = 0;  // with eval_every = 0: validate every this many seconds of this
                                  // run instead of once per epoch (0: once per epoch)
  uint64_t seed = 0;          // data order
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by SIGINT): checkpoint and return
  // Each global batch in this many strided parts, accumulated in one step (needs the trainer's
  // token_mean): what `parts` data-parallel ranks compute. With a communicator on the trainer
  // the parts are its ranks, rank r training on part r; rank 0 alone validates, writes the
  // checkpoint, the metrics and the model, and reports progress. Only rank 0 passes the examples
  // (the others pass empty vectors, and no file in out_dir is read on them): it sends every rank
  // the lengths, its share of the validation split, and each epoch the examples of its parts.
  int64_t parts = 1;
  // A pool drawn from epoch by epoch (qkv train --train-only with --train-only-ratio): when
  // `core` >= 0, examples [0, core) are trained on every epoch and examples [core, n) are a pool
  // of which each epoch adds the next `pool_per_epoch` (at most the pool's size) of one seeded
  // shuffle of the pool, cyclically: epoch e takes shuffle[(e p + i) mod P] for i < p. With
  // ranks, rank 0's `core` and `pool_per_epoch` count (the others may pass any values).
  int64_t core = -1;
  int64_t pool_per_epoch = 0;
  // Checkpoint averaging: at every validation the weights are also written to
  // out_dir/snapshots/step-NNNNNNNNN.safetensors, the last `average` of them kept; when training
  // ends, their mean (summed in double) is validated, and it becomes the model directory's
  // weights if its loss is below the best single one. 0 or 1: off.
  int64_t average = 0;
  // Subword sampling: when set, the training examples of epoch e are resample(e, train) (as many
  // as `train`, in its order: the same records, other segmentations), drawn when the epoch
  // begins; validation keeps its examples. A function of e and train alone, so a resumed run
  // sees what the uninterrupted one saw. One process only (not with a communicator).
  std::function<std::vector<Example>(int64_t epoch, const std::vector<Example>& train)> resample;
};

struct LoopProgress {
  int64_t step = 0, epoch = 0;
  double loss = 0, lr = 0;     // this step's
  double tokens_per_s = 0;     // target tokens (classify: input tokens) per second, since start or resume
  double elapsed_s = 0;
  double fraction = -1;        // of the run's limit, 0..1 (-1: no limit known)
  double start_fraction = 0;   // ... already done when this session began (resume)
  bool evaluated = false;      // this step ended with validation
  double valid_loss = 0;       // the latest validation loss (NaN: none yet, in this run or the checkpoint)
  bool best = false;           // ... and it is the best so far (weights saved)
};

struct LoopResult {
  int64_t steps = 0;            // optimiser steps done in total (resumed runs included)
  int64_t start_step = 0;       // ... of which done before this run (by the run it resumed)
  int64_t epochs_done = 0;      // whole epochs done in total
  double epochs = 0;            // epochs in total, the current one's done fraction included
  double best_valid_loss = 0;
  double last_valid_loss = 0;
  double seconds = 0;           // this run's training time
  bool interrupted = false;     // stopped by LoopConfig::stop
  double step_seconds = 0;      // in Trainer::step (this run)
  double comm_seconds = 0;      // ... of which summing over the ranks (data parallelism)
  int64_t averaged = 0;         // LoopConfig::average: the snapshots averaged at the end (0: none)
  double averaged_valid_loss = 0;  // ... their mean's validation loss (NaN: no validation split)
  bool averaged_kept = false;      // ... which became the model directory's weights
};

// Trains the trainer's model. Writes into out_dir (which exists):
//   config.json + model.safetensors   the weights with the best validation loss so far
//   checkpoint.safetensors            the last state (weights, AdamW, step, RNG, data position)
//   metrics.jsonl                     one JSON object per logged step and per validation
//   loss.svg                          training and validation loss against step
//   snapshots/                        with LoopConfig::average, the weights at the last validations
// With resume, continues from out_dir/checkpoint.safetensors exactly (same batches, same
// dropout, bit for bit) and keeps the metrics already written.
LoopResult run_training(Trainer& trainer, Task task, const std::vector<Example>& train,
                        const std::vector<Example>& valid, const std::string& out_dir, const LoopConfig& config,
                        bool resume, const std::function<void(const LoopProgress&)>& on_progress = {});

}  // namespace qkv
