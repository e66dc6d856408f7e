// GPT-2 byte-level BPE: parse_gpt2_tokenizer(encoder.json, vocab.bpe). The input up to its
// first NUL byte is encoder.json (JSON never holds a NUL), the rest vocab.bpe. An accepted
// pair must encode text and decode it back unchanged (every byte is a token), and name every
// id's piece.
#include <algorithm>

#include "fuzz_util.h"
#include "qkv/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  const size_t cut = std::min(in.find('\0'), in.size());
  const std::string encoder = in.substr(0, cut), merges = cut < in.size() ? in.substr(cut + 1) : std::string();
  std::unique_ptr<Tokenizer> tok;
  if (!fuzz::accepts([&] { tok = parse_gpt2_tokenizer(encoder, merges); })) return 0;
  if (tok->vocab_size() < 257) fuzz::finding("a GPT-2 vocabulary without all 256 bytes and <|endoftext|> accepted");
  // Text: a fixed sample, then the merges file itself made valid UTF-8 (it spells the tokens).
  const std::string texts[] = {"Hello world, the cat's 42 caf\xc3\xa9s!\n\t \xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac",
                               utf8_replace_invalid(merges.substr(0, 512))};
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tok->encode(text);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) fuzz::finding("encode returned an id outside the vocabulary");
      tok->piece(id);
    }
    if (tok->decode(ids) != text) fuzz::finding("GPT-2 decode(encode(text)) != text");
  }
  for (int32_t id = 0; id < std::min<int64_t>(tok->vocab_size(), 1024); ++id) tok->piece(id);
  return 0;
}
