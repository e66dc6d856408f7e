// BERT's vocab.txt (a token per line, id = line number), read as transformers converts a
// BertTokenizer: load_wordpiece_vocab(dir). The input up to its first NUL byte is vocab.txt, the
// rest (if any) tokenizer_config.json. An accepted folder must behave as every tokenizer does
// (fuzz_tokenizer_checks.h).
#include <filesystem>

#include "fuzz_tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  const size_t cut = std::min(in.find('\0'), in.size());
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/bert";
    std::filesystem::create_directories(d);
    return d;
  }();
  fuzz::put_file("bert/vocab.txt", in.substr(0, cut));
  std::error_code ec;
  std::filesystem::remove(dir + "/tokenizer_config.json", ec);
  if (cut < in.size()) fuzz::put_file("bert/tokenizer_config.json", in.substr(cut + 1));
  std::unique_ptr<Tokenizer> tok;
  if (!fuzz::accepts([&] { tok = load_wordpiece_vocab(dir); })) return 0;
  fuzz::exercise_tokenizer(*tok);
  return 0;
}
