// qkv/train_run.h: `qkv train` as a function, from text files to a trained model directory.
//
//   read the data -> split train / valid / test (seeded) -> tokenizer (given, or SentencePiece
//   trained on the training split) -> token ids -> a model from a preset, a config or --init ->
//   run_training (qkv/task.h) -> the model directory
//
// The directory holds everything needed to use and to resume the model: config.json,
// model.safetensors (the best validation loss), qkv_tokenizer.json (+ its files), task.json,
// train.json (these options), checkpoint.safetensors (the last state), metrics.jsonl, loss.svg,
// and the held-out test and validation splits (test.tsv / valid.tsv, or .txt) for `qkv eval`.
// The command line (`qkv train --help`) and Python's qkv.train() are this function.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qkv/distributed.h"
#include "qkv/task.h"
#include "qkv/train.h"

namespace qkv {

// Every option of `qkv train`, named as its flags (--max-tokens is max_tokens); the defaults are
// the command's. Messages about an option name its flag.
struct TrainOptions {
  // What train.json keeps, so that --resume reads and batches the same data.
  std::string task = "translate", data, source, target, train_only, preset = "tiny";
  int64_t max_tokens = 0, max_len = 0, eval_every = 0;  // 0: the preset's (eval_every: see --eval-every)
  int64_t average = 0;          // checkpoint averaging over the last N validations (0: off)
  double valid_fraction = 0.02, test_fraction = 0.02;
  double train_only_ratio = 0;  // 0: every --train-only record every epoch
  double subword_alpha = 0;     // subword sampling (0: off)
  uint64_t seed = 1;
  // The rest.
  std::string out, config, tokenizer, spm_type = "unigram", init, precision = "auto";
  int64_t vocab = 0, steps = 0, epochs = 0, warmup = -1, parts = 1;
  double bucket_mb = 4;
  double minutes = 0, lr = 0, dropout = -1, label_smoothing = -1;  // < 0 (0 for lr): the default
  bool resume = false;
  // The options the caller gave, as flags ("--preset"): an option a run would not use (--vocab
  // with a given tokenizer, anything but the limits with --resume) is refused by name, not
  // ignored. `task` counts as given when "--task" is listed.
  std::vector<std::string> given;
};

struct TrainHooks {
  // Data parallelism over the communicator's ranks (null: this process alone). Rank 0 reads the
  // data and writes the directory; every rank calls train_model with the same options.
  Communicator* comm = nullptr;
  // Set (by a signal, a callback, another thread): before training, stop at the next milestone of
  // the set-up with nothing written; during training, after the step, with a checkpoint saved.
  const std::atomic<bool>* stop = nullptr;
  // Each step's figures (with the run's fraction done, for a progress bar).
  std::function<void(const LoopProgress&)> progress;
  // What the run says on the way ("training a SentencePiece vocabulary of 4000...", notes); null:
  // each line to stderr after "qkv train: ".
  std::function<void(const std::string&)> log;
};

struct TrainResult {
  bool stopped_before_training = false;  // hooks.stop was set before training began: nothing written
  LoopResult loop;                       // steps, epochs, time, validation losses, interrupted
  bool validated = false;                // the run has a validation split
  Task task = Task::Translate;
  int64_t parameters = 0;
  std::string out;                       // the model directory
};

// Runs `qkv train` with these options. Throws qkv::Error (naming the option, file or key) on bad
// options or data, before anything is written; an interrupted run (hooks.stop) returns with
// loop.interrupted set and its checkpoint saved.
TrainResult train_model(TrainOptions options, const TrainHooks& hooks = {});

}  // namespace qkv
