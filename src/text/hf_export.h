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
// For a translator's export: rewrites DIR/tokenizer.json (as save_hf wrote it) with a
// post-processor that appends the tokenizer's end-of-sequence token to every encoded text (a
// TemplateProcessing "$A </s>", in place of the file's own, which is a language model's: GPT-2's
// puts <|endoftext|> first), so that Hugging Face's tokenizer(text) gives the encoder the source
// qkv gives it (source_ids), as Marian's and Pegasus's own tokenizers do. Does nothing where the
// tokenizer adds special tokens of its own (its source_ids are those) or DIR has no
// tokenizer.json; returns whether it rewrote the file.
bool hf_sources_end_with_eos(const std::string& dir, const Tokenizer& tok);

}  // namespace qkv::text
