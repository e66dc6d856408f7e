// A model directory as qkv's commands and its server open it for inference (qkv's own, a Hugging
// Face folder or a GGUF file), and the token ids each task's model reads. Internal: shared by the
// command line (tools/) and the server (src/serve/).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/model.h"
#include "qkv/quant.h"
#include "qkv/task.h"
#include "qkv/tokenizer.h"

namespace qkv {

// Model::load, and for a Hugging Face folder a note on standard error naming the tensors the
// model does not use (as transformers warns: a BertForPreTraining checkpoint's next-sentence head
// under a masked-LM model, say).
// `dtype` is --dtype: "" loads the weights as stored, a type packs them as they load (LoadOptions),
// with a note on standard error naming the matrices that fell back to bf16.
Model load_model(const std::string& dir, const std::string& dtype = "");

// What a model directory does: its task.json, or for a Hugging Face folder (which has none) what
// its architecture says (a decoder generates, an encoder-decoder translates, a sequence
// classifier labels with config.json's id2label names, in id order).
TaskInfo model_task_info(const std::string& dir);

// --dtype: the weight type of a model's projection matrices (qkv/quant.h), packed at load.
// dtype_of names --dtype in its error and gives nothing for "" (the weights as stored).
std::optional<WType> dtype_of(const std::string& dtype);
// The note on standard error naming the matrices that --dtype `dtype` packed as bf16 instead
// (`fallback`, as LoadOptions::fallback or Model::pack_weights report them); nothing when none.
void note_dtype_fallback(const std::vector<std::string>& fallback, const std::string& dtype);

// The model's logits for one row of token ids, without a tape: (1, T, V) for a language or
// masked-language model, (1, C) for a classifier.
Tensor logits_of(const Model& model, const std::vector<int32_t>& ids);

// A language model's prompt as the model reads it: a Hugging Face tokenizer's special tokens
// (Llama's <s>); qkv's GPT-2 models learned text after <|endoftext|>; an empty prompt starts from
// bos (or eos). Throws qkv::Error when the tokenizer has neither.
std::vector<int32_t> prompt_ids(const Tokenizer& tok, std::string_view text);

// A translation model's source as its encoder reads it: the tokenizer's own special tokens
// around `ids` (Marian's </s>), or eos appended for qkv's tokenizers, which have none.
std::vector<int32_t> source_ids(const Tokenizer& tok, std::vector<int32_t> ids);

// A classifier's input: encode_input cut to max_len, and eos for a text with no tokens at all.
std::vector<int32_t> classifier_ids(const Tokenizer& tok, std::string_view text, int64_t max_len);

// The `k` most probable tokens at each position of `at` in logits (1, T, V): softmax in double
// (the maximum subtracted first), ordered by logit, ties by id. Throws qkv::Error naming `model`
// when a logit is not finite.
struct TokenChoice {
  int32_t id = 0;
  float logit = 0;
  double prob = 0;
};
std::vector<std::vector<TokenChoice>> top_tokens(const Tensor& logits, const std::vector<size_t>& at, int64_t k,
                                                 const std::string& model);

// What an attention trace of `text` feeds a model, as its commands build it: a translation
// model's decoder input (bos, then the text's tokens), a classifier's input, a language model's
// prompt. trace_batch: the batch trace_attention reads, one row (a translation model: `src`, made
// with source_ids, as the encoder's input and `ids` as the decoder's).
std::vector<int32_t> trace_ids(const Tokenizer& tok, const ModelConfig& c, const TaskInfo& info, std::string_view text);
Batch trace_batch(const std::vector<int32_t>& ids, const std::vector<int32_t>& src);

// The text of a generated sequence: its tokens up to the end-of-sequence token that ends it.
std::string output_text(const Tokenizer& tok, std::vector<int32_t> tokens);

}  // namespace qkv
