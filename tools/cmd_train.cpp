// qkv train --task translate|lm|classify: from text to a trained model directory. The work is
// the library's (qkv::train_model, qkv/train_run.h; Python's qkv.train is the same function):
// this file is the command line, the signals, mpirun's ranks, the progress bar and the summary.
#include <cmath>
#include <cstdio>
#include <memory>

#include "cli_checks.h"
#include "commands.h"
#include "mpi_comm.h"
#include "qkv/qkv.h"
#include "qkv/signals.h"
#include "qkv/train_run.h"
#include "task_util.h"

namespace qkv::cli {
namespace {

int run(const TrainOptions& o) {
  // From here on SIGINT / SIGTERM only ask to stop: before training, at the next milestone of the
  // setup (nothing written); during training, at the next step (a checkpoint is saved). They are
  // taken by qkv's signal thread, never by a handler on a computing thread (qkv/signals.h).
  const StopRequest stop;
  // Started by mpirun with N > 1 ranks: data parallelism. Rank 0 writes and reports; the others
  // stay silent but for errors.
  std::unique_ptr<Communicator> comm;
  if (launched_by_mpi()) {
    comm = mpi_world();
    if (comm->size() == 1) {
      comm.reset();
    } else if (comm->rank() != 0) {
      silence_output();
    }
  }
  TrainHooks hooks;
  hooks.comm = comm.get();
  hooks.stop = &stop.flag();
  Progress bar;
  bool started = false;
  hooks.progress = [&](const LoopProgress& lp) {
    if (!started) bar.start_at(lp.start_fraction), started = true;
    char valid_text[32] = "-";
    if (std::isfinite(lp.valid_loss)) std::snprintf(valid_text, sizeof valid_text, "%.3f", lp.valid_loss);
    char s[200];
    std::snprintf(s, sizeof s, "step %lld ep %lld loss %.3f valid %s lr %.2e %.0f tok/s", static_cast<long long>(lp.step),
                  static_cast<long long>(lp.epoch), lp.loss, valid_text, lp.lr, lp.tokens_per_s);
    bar.update(lp.fraction, s);
  };
  const TrainResult result = train_model(o, hooks);
  if (result.stopped_before_training) return 130;
  const LoopResult& r = result.loop;
  const Task task = result.task;
  bar.finish();
  const bool ppl = task != Task::Classify;
  std::string best = !result.validated ? "no validation split" : "not validated yet";
  if (std::isfinite(r.best_valid_loss)) {
    char b[96];
    std::snprintf(b, sizeof b, "best validation loss %.4f", r.best_valid_loss);
    best = b;
    if (ppl) best += " (perplexity " + fmt_perplexity(r.best_valid_loss) + ")";
  }
  // "trained 1848 steps (16.3 epochs) in 9m00s", or after --resume "trained 150 more steps (254 in
  // all, 2.1 epochs) in 3m03s": this run's steps are the ones its time was spent on
  const long long run_steps = r.steps - r.start_step;
  char epochs[32];
  std::snprintf(epochs, sizeof epochs, "%.1f epoch%s", r.epochs, r.epochs == 1.0 ? "" : "s");
  if (r.start_step == 0)
    std::printf("qkv train: %s %lld step%s (%s) in %s; %s; model in %s\n", r.interrupted ? "interrupted after" : "trained",
                run_steps, run_steps == 1 ? "" : "s", epochs, fmt_duration(r.seconds).c_str(), best.c_str(),
                o.out.c_str());
  else if (run_steps == 0 && !r.interrupted)
    std::printf("qkv train: nothing to do: the run in %s is already at step %lld (%s), which meets its limit; ask "
                "for more (--steps, --epochs or --minutes); %s\n",
                o.out.c_str(), static_cast<long long>(r.steps), epochs, best.c_str());
  else
    std::printf("qkv train: %s %lld more step%s (%lld in all, %s) in %s; %s; model in %s\n",
                r.interrupted ? "interrupted after" : "trained", run_steps, run_steps == 1 ? "" : "s",
                static_cast<long long>(r.steps), epochs,
                fmt_duration(r.seconds).c_str(), best.c_str(), o.out.c_str());
  if (r.averaged > 0) {
    if (std::isnan(r.averaged_valid_loss))
      std::printf("qkv train: the mean of the last %lld snapshots is not validated (no validation split): the model "
                  "keeps the last weights\n", static_cast<long long>(r.averaged));
    else
      std::printf("qkv train: the mean of the last %lld snapshots validates at %.4f: %s\n",
                  static_cast<long long>(r.averaged), r.averaged_valid_loss,
                  r.averaged_kept ? "it is the model" : "the best single weights stay the model");
  }
  if (r.interrupted) {
    std::fprintf(stderr, "qkv train: checkpoint saved; continue with: qkv train --out %s --resume [--steps/--epochs/--minutes]\n",
                 o.out.c_str());
    return 130;
  }
  return 0;
}

}  // namespace

Runner add_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* c = app.add_subcommand("train",
                                   "Train a model from text: translation (TSV pairs), language model (text) or "
                                   "classifier (label<TAB>text). Ctrl-C saves a checkpoint; --resume continues it");
  c->add_option("--task", o->task, "translate, lm or classify")->check(CLI::IsMember({"translate", "lm", "classify"}));
  c->add_option("--data", o->data, "translate: source<TAB>target TSV; lm: text; classify: label<TAB>text TSV");
  c->add_option("--source", o->source, "translate: source sentences, one per line (with --target)");
  c->add_option("--target", o->target, "translate: target sentences, aligned with --source");
  c->add_option("--train-only", o->train_only,
                "More records in --data's format, for the training split only (never validated or tested on; any "
                "record repeating a held-out text but for case and punctuation is left out), e.g. the word and "
                "phrase pairs of `qkv data ding --phrases`. The tokenizer is trained on --data's training split");
  c->add_option("--average", o->average,
                "Checkpoint averaging: keep the weights of the last N validations (DIR/snapshots) and, when training "
                "ends, make their mean the model if it validates better than the best single one (0: off)")
      ->transform(whole(0, 1000));
  c->add_option("--train-only-ratio", o->train_only_ratio,
                "With --train-only: each epoch trains on the training split and, of a seeded shuffle of the "
                "--train-only records, the next R times as many as the split has (cycling through them); default: "
                "all of them every epoch")
      ->transform(finite(0.001, 1000));
  c->add_option("--subword-alpha", o->subword_alpha,
                "Subword sampling (translate, SentencePiece): each epoch segments the training pairs afresh, "
                "sampling each text's segmentation with probability proportional to P^A (unigram; BPE: merge "
                "dropout A); validation and test keep the usual tokens (default 0: off)")
      ->transform(finite(0.0, 1.0));
  c->add_option("--out", o->out, "The model directory to write (created)")->required();
  c->add_option("--preset", o->preset, "Model size: tiny, small or base (the 2017 base model)")
      ->check(CLI::IsMember({"tiny", "small", "base"}));
  c->add_option("--config", o->config, "A config.json for the model instead of a preset (qkv's keys, docs/formats.md; vocab_size may be left out: the tokenizer's size is the model's)")->check(CLI::ExistingFile);
  c->add_option("--init", o->init,
                "Fine-tune this model (a qkv model directory or a Hugging Face folder) instead of starting from random "
                "weights; its tokenizer too unless --tokenizer is given. --task classify on an encoder adds a head");
  c->add_option("--tokenizer", o->tokenizer,
                "A directory with qkv_tokenizer.json (e.g. a model), a SentencePiece .model file, 'byte', or gpt2:DIR "
                "(GPT-2's encoder.json + vocab.bpe in DIR) (default: train SentencePiece)");
  c->add_option("--vocab", o->vocab, "SentencePiece vocabulary size (default: the preset's)")->transform(whole(300, 1000000));
  c->add_option("--spm-type", o->spm_type, "SentencePiece model: unigram or bpe")->check(CLI::IsMember({"unigram", "bpe"}));
  c->add_option("--steps", o->steps, "Stop after N optimiser steps")->transform(whole(1, int64_t{1} << 40));
  c->add_option("--epochs", o->epochs, "Stop after N passes over the training split")->transform(whole(1, 1000000));
  c->add_option("--minutes", o->minutes, "Stop after M minutes of training")->transform(finite(0.01, 1e6));
  c->add_option("--max-tokens", o->max_tokens, "Tokens per batch, padding included (default: the preset's)")
      ->transform(whole(1, 1 << 24));
  c->add_option("--max-len", o->max_len, "Longest sequence in tokens (translate: longer pairs dropped; lm: the window)")
      ->transform(whole(2, 1 << 20));
  c->add_option("--eval-every", o->eval_every, "Validate (and save the best) every N steps (default: every epoch; with --minutes M, every M/10 minutes, 10 s to 10 min)")
      ->transform(whole(1, 1 << 30));
  c->add_option("--lr", o->lr, "Factor on the 2017 learning-rate formula d_model^-0.5 min(step^-0.5, step warmup^-1.5) (default 1)")->transform(finite(1e-6, 1e3));
  c->add_option("--warmup", o->warmup, "Warmup steps (default: the preset's)")->transform(whole(1, 1 << 30));
  c->add_option("--dropout", o->dropout, "Dropout (default 0.1)")->transform(finite(0, 0.9));
  c->add_option("--label-smoothing", o->label_smoothing, "Label smoothing (default: 0.1 translate, 0 otherwise)")
      ->transform(finite(0, 0.5));
  c->add_option("--valid-fraction", o->valid_fraction, "Held out for validation (default 0.02)")->transform(finite(0, 0.5));
  c->add_option("--test-fraction", o->test_fraction, "Held out for testing, written to DIR/test.* (default 0.02)")
      ->transform(finite(0, 0.5));
  c->add_option("--seed", o->seed, "Seed for the split, initialisation, data order and dropout")
      ->transform(seed_number());
  c->add_option("--precision", o->precision,
                "Matrix products of the forward and backward passes: f32, bf16 (inputs rounded to bfloat16, sums, "
                "weights, optimiser state and everything else float32; 1.3-1.6x faster where the CPU has bf16 dot "
                "products, AVX512_BF16 or AMX), or auto (bf16 where the CPU has them, else f32; the default: "
                "bf16 trains to the same loss curves). f32 gives the same bits whether or not the CPU has bf16 (on "
                "machines with the same instruction set). --resume keeps "
                "the run's own")
      ->check(CLI::IsMember({"f32", "bf16", "auto"}));
  c->add_flag("--resume", o->resume, "Continue the run in --out exactly where its checkpoint stopped");
  c->add_option("--parts", o->parts,
                "Split each batch into N strided parts accumulated in one step, the loss being the whole batch's: what "
                "mpirun -np N qkv train computes (one part per rank), in one process")
      ->transform(whole(1, 4096));
  c->add_option("--bucket-mb", o->bucket_mb,
                "Under mpirun: gradients are summed over the ranks in buckets of this many MiB, each as soon as the "
                "backward pass has finished it (default 4; the results do not depend on it)")
      ->transform(finite(0.001, 1024));
  return [o, c] {
    for (const CLI::Option* op : c->get_options())
      if (op->count() > 0) o->given.push_back(op->get_name());
    return run(*o);
  };
}

}  // namespace qkv::cli
