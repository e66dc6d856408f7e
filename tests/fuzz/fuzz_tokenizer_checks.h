// What every accepted tokenizer must do, whichever file it came from (the HF targets share it):
// encode a fixed sample into ids inside its vocabulary, put its special tokens around them inside
// the vocabulary too, decode to valid UTF-8, and name every id's piece.
#pragma once
#include <algorithm>

#include "fuzz_util.h"
#include "qkv/tokenizer.h"

namespace qkv::fuzz {

inline void exercise_tokenizer(const Tokenizer& tok, const std::string& extra_text = "") {
  const int64_t V = tok.vocab_size();
  if (V <= 0) finding("a tokenizer with an empty vocabulary accepted");
  const std::string texts[] = {"Hello world, the cat's 42 caf\xc3\xa9s!\n\t \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac [MASK] <s>",
                               utf8_replace_invalid(extra_text.substr(0, 512))};
  for (const std::string& t : texts) {
    std::vector<int32_t> ids;
    if (!accepts([&] { ids = tok.encode(t); })) continue;
    const std::vector<int32_t> with = tok.with_special_tokens(ids);
    for (int32_t id : with) {
      if (id < 0 || id >= V) finding("encode / with_special_tokens gave an id outside the vocabulary");
      tok.piece(id);
    }
    std::string back;
    if (accepts([&] { back = tok.decode(with); }) && invalid_utf8_offset(back) >= 0)
      finding("decode gave invalid UTF-8");
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < std::min<int64_t>(V, 512); ++id) tok.piece(id), all.push_back(id);
  std::string back;
  if (accepts([&] { back = tok.decode(all); }) && invalid_utf8_offset(back) >= 0)
    finding("decode of the vocabulary gave invalid UTF-8");
}

}  // namespace qkv::fuzz
