// qkv_tokenizer.json: load_tokenizer(dir), which reads dir/qkv_tokenizer.json and the files it names.
// The directory also holds valid files of each kind (encoder.json, vocab.bpe, tokenizer.model),
// so the input decides which are loaded.
#include "fuzz_util.h"
#include "qkv/npy.h"
#include "tiny_tokenizers.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace qkv;
  const auto [encoder, merges] = fuzz::tiny_gpt2();
  fuzz::put_file("encoder.json", encoder);
  fuzz::put_file("vocab.bpe", merges);
  fuzz::tiny_sentencepiece("unigram", 320, fuzz::scratch_dir());  // tokenizer.model (+ a qkv_tokenizer.json, replaced)
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  fuzz::put_file("qkv_tokenizer.json", in);
  std::unique_ptr<Tokenizer> tok;
  if (!fuzz::accepts([&] { tok = load_tokenizer(fuzz::scratch_dir()); })) return 0;
  if (in.find('\0') != std::string::npos) fuzz::finding("qkv_tokenizer.json with a NUL byte accepted");
  if (fuzz::json_repeats_a_key(in)) fuzz::finding("qkv_tokenizer.json with a repeated key accepted");
  const std::vector<int32_t> ids = tok->encode("Hello, caf\xc3\xa9!");
  tok->decode(ids);
  return 0;
}
