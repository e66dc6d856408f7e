// train.json in a `qkv train` output directory: the options that decide which data a run reads
// and how it splits and batches it. `qkv train` writes it when a run starts; --resume reads it
// back, so `qkv train --out DIR --resume` needs no other option.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/train_run.h"

namespace qkv {

// A data file as the run found it when it started: its size and a 64-bit FNV-1a hash of its bytes.
struct DataFile {
  std::string path;
  uint64_t bytes = 0;
  std::string fnv1a64;  // 16 lowercase hex digits
};

// TrainOptions (qkv/train_run.h) with what train.json records about the run besides them.
struct RunOptions : TrainOptions {
  std::vector<DataFile> data_files;  // as read back ("data_files"); written by qkv train
  bool data_files_given = false;     // train.json has "data_files" (older ones do not)
  // As read back, never applied: the run's --init ("init") and the size of the tokenizer it
  // started with ("tokenizer_vocab"; 0 when train.json predates it), to tell a replaced tokenizer.
  std::string init_recorded;
  int64_t tokenizer_vocab = 0;
};

// Overwrites each field of `o` that `text` (train.json's bytes; `path` names the file in
// messages) holds under the field's name; the file's other keys (options --resume does not take
// back) are ignored. A qkv::Error names the file and the key for: text that is not a JSON
// object (a NUL byte included), a key that appears twice, or a value of the wrong type or outside what `qkv train`
// accepts: task translate|lm|classify, preset tiny|small|base, data/source/target strings,
// max_tokens 0 or 1..2^24, max_len 0 or 2..2^20, train_only a string, train_only_ratio 0 or 0.001..1000, subword_alpha 0 or (0, 1], average 0..1000, eval_every 0..2^30, init a string (read into
// init_recorded), tokenizer_vocab 0 or 1..2^31-1, valid_fraction and
// test_fraction in [0, 0.5], seed an integer in 0..2^64-1, data_files an array of
// {"path": string, "bytes": integer, "fnv1a64": 16 hex digits}.
void read_train_json(const std::string& text, const std::string& path, RunOptions& o);

}  // namespace qkv
