// train.json: read_train_json (src/train/train_json.cpp), what `qkv train --resume` (and qkv.train) reads.
#include "fuzz_util.h"
#include "train/train_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = qkv::fuzz::bytes(data, size);
  qkv::RunOptions o;
  if (!qkv::fuzz::accepts([&] { qkv::read_train_json(in, "train.json", o); })) return 0;
  if (in.find('\0') != std::string::npos) qkv::fuzz::finding("train.json with a NUL byte accepted");
  if (qkv::fuzz::json_repeats_a_key(in)) qkv::fuzz::finding("train.json with a repeated key accepted");
  return 0;
}
