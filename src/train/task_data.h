// A task's data: records read from files (translation pairs, labelled texts, text lines), split,
// and made token-id examples. Shared by `qkv train` (qkv::train_model, qkv/train_run.h), `qkv eval`,
// `translate`, `generate` and `classify`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/data.h"
#include "qkv/model.h"
#include "qkv/task.h"
#include "qkv/tokenizer.h"

namespace qkv {

// A task's raw records: translate (source, target), classify (label, text), lm (text lines).
struct RawData {
  std::vector<TextPair> pairs;
  std::vector<LabeledText> labeled;
  std::vector<std::string> lines;
  int64_t size() const;
  ReadReport report;
  std::string path;
  std::string part;  // "training split", "validation split", ... ("" = the whole file)
  // "FILE" or "FILE (validation split)": what a message about these records names.
  std::string describe() const { return part.empty() ? path : path + " (" + part + ")"; }
};
// --data FILE (TSV for translate and classify, text for lm), or --source/--target files.
RawData read_task_data(Task task, const std::string& data, const std::string& source, const std::string& target);
RawData subset(const RawData& d, const std::vector<int64_t>& idx);

// Every text of the records (sources and targets), for training a tokenizer.
std::vector<std::string> all_texts(const RawData& d);

// The records of `extra` none of whose texts is a near-copy (near_copy_key, qkv/data.h) of a
// text in `held_out`; *dropped counts the others. --train-only data passes through it, so that
// no held-out sentence reaches training in another form.
RawData without_near_copies(const RawData& extra, const std::vector<const RawData*>& held_out, int64_t* dropped);

struct Encoded {
  std::vector<Example> examples;
  int64_t dropped = 0;         // translate: pairs longer than max_len tokens (skipped)
  int64_t unknown_labels = 0;  // classify with skip_unknown_labels: records left out
  int64_t window = 0;          // lm: the window used (max_len, or less for a short text)
  std::string note;            // what was done differently from what was asked, for the user
  std::vector<size_t> kept;    // translate: the index in d.pairs of each example
};
// Token ids: translate src/tgt + eos (pairs over max_len dropped); lm: lines + eos packed into
// windows of max_len + 1 (a text shorter than that gives one window of all its tokens, and a
// note); classify: text truncated to max_len, label by index in `labels` (an unknown label is an
// error naming it, or with skip_unknown_labels the record is left out and counted).
Encoded encode_task(Task task, const RawData& d, const Tokenizer& tok, int64_t max_len,
                    const std::vector<std::string>& labels, bool skip_unknown_labels = false);

// Writes records as the task's file format (TSV or text), atomically.
void write_task_data(Task task, const RawData& d, const std::string& path);

// "12m05s", "3.2s"
std::string fmt_duration(double seconds);

// The perplexity exp(loss) readable at any size: "305.88", "1.098e+230", and beyond what a
// double holds (a loss over ~709.8 nats) still as a number, "3.162e+347"; never cut to a few
// characters of digits.
std::string fmt_perplexity(double loss);

}  // namespace qkv
