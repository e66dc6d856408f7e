// SentencePiece: parse_sentencepiece (a serialized ModelProto, what tokenizer.model holds). The
// parsing is libsentencepiece's (not instrumented for coverage, so libFuzzer sees little of
// it); qkv's side must refuse what the library refuses with a qkv::Error, and a model it
// accepts must encode, decode and name pieces without crashing.
#include "fuzz_util.h"
#include "qkv/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = parse_sentencepiece(fuzz::bytes(data, size), "tokenizer.model");
  } catch (const Error& e) {
    // parse_sentencepiece turns an exception from the library into a qkv::Error as a last
    // resort; each such case wants its own check in front of the library.
    if (std::string(e.what()).find("library threw") != std::string::npos) fuzz::finding(e.what());
    return 0;
  }
  const int64_t n = tok->vocab_size();
  fuzz::accepts([&] {
    const std::vector<int32_t> ids = tok->encode("Hello world, the cat's 42 caf\xc3\xa9s! \xe6\x97\xa5\xe6\x9c\xac");
    for (int32_t id : ids)
      if (id < 0 || id >= n) fuzz::finding("encode returned an id outside the vocabulary");
    tok->decode(ids);
  });
  for (int32_t id = 0; id < std::min<int64_t>(n, 1024); ++id) tok->piece(id);
  fuzz::accepts([&] { tok->decode({0, static_cast<int32_t>(n - 1)}); });
  return 0;
}
