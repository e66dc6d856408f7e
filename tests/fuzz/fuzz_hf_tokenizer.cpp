// Hugging Face tokenizer.json: parse_hf_tokenizer(tokenizer.json). The input up to its first NUL
// byte is tokenizer.json (JSON never holds a NUL), the rest a text to encode (made valid UTF-8).
// An accepted file must encode the text and a fixed sample into ids inside its vocabulary, put
// its special tokens around them inside the vocabulary too, decode any ids of its vocabulary to
// valid UTF-8, and name every id's piece.
#include <algorithm>

#include "fuzz_util.h"
#include "qkv/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  const size_t cut = std::min(in.find('\0'), in.size());
  const std::string json = in.substr(0, cut), text = cut < in.size() ? in.substr(cut + 1) : std::string();
  std::unique_ptr<Tokenizer> tok;
  if (!fuzz::accepts([&] { tok = parse_hf_tokenizer(json, "tokenizer.json"); })) return 0;
  const int64_t V = tok->vocab_size();
  if (V <= 0) fuzz::finding("a tokenizer.json with an empty vocabulary accepted");
  const std::string texts[] = {"Hello world, the cat's 42 caf\xc3\xa9s!\n\t \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac [MASK] <s>",
                               utf8_replace_invalid(text.substr(0, 512))};
  for (const std::string& t : texts) {
    std::vector<int32_t> ids;
    // a pattern that backtracks past PCRE2's match limit is an error, not a hang
    if (!fuzz::accepts([&] { ids = tok->encode(t); })) continue;
    const std::vector<int32_t> with = tok->with_special_tokens(ids);
    for (int32_t id : with) {
      if (id < 0 || id >= V) fuzz::finding("encode / with_special_tokens gave an id outside the vocabulary");
      tok->piece(id);
    }
    std::string back;
    if (!fuzz::accepts([&] { back = tok->decode(with); })) continue;
    if (invalid_utf8_offset(back) >= 0) fuzz::finding("decode gave invalid UTF-8");
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < std::min<int64_t>(V, 512); ++id) tok->piece(id), all.push_back(id);
  std::string back;
  if (fuzz::accepts([&] { back = tok->decode(all); }) && invalid_utf8_offset(back) >= 0)
    fuzz::finding("decode of the vocabulary gave invalid UTF-8");
  return 0;
}
