// Shared by `qkv train`, `translate`, `generate`, `classify` and `eval`: reading a task's data
// into token-id examples, and a progress line. Opening a model and the token ids each task reads
// are the library's (models/model_dir.h, shared with the server), included here for them.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/model_dir.h"
#include "train/task_data.h"
#include "qkv/data.h"
#include "qkv/model.h"
#include "qkv/task.h"
#include "qkv/tokenizer.h"

namespace qkv::cli {

// Progress on stderr: a redrawn bar on a terminal, else a line every `every_s` seconds.
class Progress {
 public:
  explicit Progress(double every_s = 15);
  // The fraction already done when this session began (a resumed run): the ETA is the time this
  // session took for the part it did, scaled to what is left.
  void start_at(double fraction) { start_fraction_ = fraction > 0 && fraction < 1 ? fraction : 0; }
  void update(double fraction, const std::string& status);
  void finish();

 private:
  bool tty_;
  double every_s_, last_ = -1e9, start_fraction_ = 0;
  std::chrono::steady_clock::time_point t0_;
  bool drawn_ = false;
};

// --dtype, on every command that runs a model: the weight type of its projection matrices
// (qkv/quant.h), packed at load. The help text is shared; dtype_of (models/model_dir.h) reads it.
extern const char* const kDtypeHelp;
// Packs a model made in memory (bench's presets) for --dtype.
void pack_for_dtype(Model& m, const std::string& dtype);

}  // namespace qkv::cli
