// Pieces of a Hugging Face tokenizer.json that qkv's own tokenizers write when exported
// (Tokenizer::save_hf); defined in hf_tokenizer.cpp.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "qkv/tokenizer.h"

namespace qkv::text {

// One entry of "added_tokens" (special tokens are not normalized).
nlohmann::json hf_added_token(int32_t id, const std::string& content, bool special);
// tokenizer_config.json: PreTrainedTokenizerFast, the special tokens by their spelling.
std::string hf_tokenizer_config(const Tokenizer& tok);
// A whole tokenizer.json (version 1.0, no truncation or padding).
std::string hf_tokenizer_file(nlohmann::json model, nlohmann::json added, nlohmann::json normalizer,
                              nlohmann::json pre, nlohmann::json decoder, nlohmann::json post = nullptr);

}  // namespace qkv::text
