// train.json in a `qkv train` output directory: the options that decide which data a run reads
// and how it splits and batches it. `qkv train` writes it when a run starts; --resume reads it
// back, so `qkv train --out DIR --resume` needs no other option.
#pragma once
#include <cstdint>
#include <string>

namespace qkv::cli {

struct RunOptions {
  std::string task = "translate", data, source, target, preset = "tiny";
  int64_t max_tokens = 0, max_len = 0, eval_every = 0;  // 0: the preset's (eval_every: every epoch)
  double valid_fraction = 0.02, test_fraction = 0.02;
  uint64_t seed = 1;
};

// Overwrites each field of `o` that `text` (train.json's bytes; `path` names the file in
// messages) holds under the field's name; the file's other keys (options --resume does not take
// back) are ignored. A qkv::Error names the file and the key for: text that is not a JSON
// object (a NUL byte included), a key that appears twice, or a value of the wrong type or outside what `qkv train`
// accepts: task translate|lm|classify, preset tiny|small|base, data/source/target strings,
// max_tokens 0 or 1..2^24, max_len 0 or 2..2^20, eval_every 0..2^30, valid_fraction and
// test_fraction in [0, 0.5], seed an integer in 0..2^64-1.
void read_train_json(const std::string& text, const std::string& path, RunOptions& o);

}  // namespace qkv::cli
