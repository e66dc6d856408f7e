// OPUS-MT's vocab.json (piece -> id, shared by both languages) beside two fixed, valid
// SentencePiece models (source.spm, target.spm: the seed model of fuzz_sentencepiece):
// load_tokenizer(dir) on a Marian folder. An accepted folder must behave as every tokenizer does
// (fuzz_tokenizer_checks.h).
#include <filesystem>

#include "fuzz_tokenizer_checks.h"
#include "qkv/files.h"

#ifndef QKV_FUZZ_SEEDS
#error "QKV_FUZZ_SEEDS: the directory of tests/fuzz/corpus"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/marian";
    std::filesystem::create_directories(d);
    const std::string spm = read_file(std::string(QKV_FUZZ_SEEDS) + "/sentencepiece/unigram.model", "seed model");
    fuzz::put_file("marian/source.spm", spm);
    fuzz::put_file("marian/target.spm", spm);
    return d;
  }();
  fuzz::put_file("marian/vocab.json", fuzz::bytes(data, size));
  std::unique_ptr<Tokenizer> tok;
  if (!fuzz::accepts([&] { tok = load_tokenizer(dir); })) return 0;
  fuzz::exercise_tokenizer(*tok);
  return 0;
}
