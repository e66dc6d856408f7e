// tokenizer_config.json beside a fixed, valid tokenizer.json (a byte-level BPE with special
// tokens): parse_hf_tokenizer(tokenizer.json, config). The config names the special tokens (a
// string, or an AddedToken object), clean_up_tokenization_spaces, and so on. An accepted pair must
// behave as every tokenizer does (fuzz_tokenizer_checks.h).
#include "fuzz_tokenizer_checks.h"

namespace {

// Five tokens, two merges, three special tokens: small enough to fuzz fast.
const char* kTokenizerJson = R"({"version": "1.0", "truncation": null, "padding": null,
 "added_tokens": [{"id": 5, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true},
                  {"id": 6, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true},
                  {"id": 7, "content": "<pad>", "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true}],
 "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
 "model": {"type": "BPE", "unk_token": "a", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4},
           "merges": ["a b", "ab c"]}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  std::unique_ptr<Tokenizer> tok;
  if (!fuzz::accepts([&] { tok = parse_hf_tokenizer(kTokenizerJson, "tokenizer.json", in, "tokenizer_config.json"); }))
    return 0;
  fuzz::exercise_tokenizer(*tok, "abc cab <s> b </s>");
  return 0;
}
