// SentencePiece models: a thin wrapper over sentencepiece::SentencePieceProcessor, plus training
// in memory (sentences from a vector, the model returned as a serialized proto, no files).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/tokenizer.h"

namespace qkv {

namespace {

using Json = nlohmann::json;

// A SentencePiece status as words for a user: its message without the code name and the
// "./src/file.cc(232) [condition] " place that SentencePiece's checks put in front of it.
std::string status_text(const sentencepiece::util::Status& st, const char* if_empty) {
  std::string m = st.error_message() ? st.error_message() : "";
  if (const size_t cc = m.find(".cc("); cc != std::string::npos) {
    const size_t close = m.find(')', cc);
    m.erase(0, close == std::string::npos ? m.size() : close + 1);
    while (!m.empty() && m.front() == ' ') m.erase(0, 1);
    if (!m.empty() && m.front() == '[') {
      const size_t end = m.find("] ");
      m.erase(0, end == std::string::npos ? m.size() : end + 2);
    }
  }
  while (!m.empty() && (m.back() == ' ' || m.back() == '\n')) m.pop_back();
  return m.empty() ? if_empty : m;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp) : sp_(std::move(sp)) {}

  std::string type() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_->GetPieceSize(); }
  int32_t pad_id() const override { return sp_->pad_id(); }
  int32_t bos_id() const override { return sp_->bos_id(); }
  int32_t eos_id() const override { return sp_->eos_id(); }

  std::vector<int32_t> encode(std::string_view text) const override {
    check_utf8(text, "SentencePiece tokenizer: text to encode");
    std::vector<int> ids;
    const auto status = sp_->Encode(text, &ids);
    check(status.ok(), "SentencePiece tokenizer: encode failed: ", status_text(status, "no reason given"));
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  // SentencePiece drops control pieces (pad, bos, eos) itself and joins byte pieces.
  std::string decode(const std::vector<int32_t>& ids) const override {
    const int64_t n = vocab_size();
    for (size_t i = 0; i < ids.size(); ++i)
      check(ids[i] >= 0 && ids[i] < n, "SentencePiece tokenizer: decode: id ", ids[i], " at position ", i,
            " is outside [0, ", n, ")");
    std::string text;
    const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    check(status.ok(), "SentencePiece tokenizer: decode failed: ", status_text(status, "no reason given"));
    return utf8_replace_invalid(text);
  }

  std::string piece(int32_t id) const override {
    check(id >= 0 && id < vocab_size(), "SentencePiece tokenizer: piece id ", id, " is outside [0, ", vocab_size(), ")");
    return sp_->IdToPiece(id);
  }

  void save(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    write_file_atomic((d / "tokenizer.model").string(), sp_->serialized_model_proto());
    const Json j = {{"type", "sentencepiece"}, {"model", "tokenizer.model"}};
    write_file_atomic((d / "tokenizer.json").string(), j.dump(2) + "\n");
  }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// The training sentences, handed to SentencePiece one by one without copying.
class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }  // OK

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};

// A double as text that reads back as the same value.
std::string exact(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

}  // namespace

std::unique_ptr<Tokenizer> parse_sentencepiece(const std::string& model_proto, const std::string& name) {
  check(!model_proto.empty(), name, ": empty file (expected a serialized SentencePiece model)");
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(model_proto);
  check(status.ok(), name, ": not a SentencePiece model (", status_text(status, "its bytes are not a serialized ModelProto"), ")");
  check(sp->GetPieceSize() > 0, name, ": SentencePiece model has no pieces");
  return std::make_unique<SentencePieceTokenizer>(std::move(sp));
}

std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string>& sentences,
                                               const SentencePieceTrainOptions& opt) {
  // Options and sentences, checked before SentencePiece sees them.
  const char* ctx = "train_sentencepiece: ";
  check(opt.model_type == "unigram" || opt.model_type == "bpe", ctx, "model_type \"", opt.model_type,
        "\" (expected \"unigram\" or \"bpe\")");
  check(opt.vocab_size > 4 && opt.vocab_size <= INT32_MAX, ctx, "vocab_size ", opt.vocab_size,
        " (expected 5 .. 2^31-1: four specials and at least one piece)");
  check(opt.character_coverage > 0 && opt.character_coverage <= 1, ctx, "character_coverage ",
        opt.character_coverage, " (expected a value in (0, 1])");
  check(opt.max_sentences > 0, ctx, "max_sentences ", opt.max_sentences, " (expected at least 1)");
  check(opt.threads >= 1 && opt.threads <= 128, ctx, "threads ", opt.threads, " (expected 1 .. 128)");
  check(!sentences.empty(), ctx, "no sentences to train on");
  for (size_t i = 0; i < sentences.size(); ++i) check_utf8(sentences[i], detail::concat(ctx, "sentence ", i));

  // Lossless by construction: identity normalisation, spaces kept, unknown characters as bytes.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", opt.model_type},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"character_coverage", exact(opt.character_coverage)},
      {"input_sentence_size", std::to_string(opt.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(opt.threads)},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"byte_fallback", "true"},
      // A small corpus may not support the requested size: unigram then stops below it rather
      // than failing ("Vocabulary size too high").
      {"hard_vocab_limit", "false"},
      {"minloglevel", "100"},  // no INFO, WARNING or ERROR lines on stderr: failures come back as a Status
  };
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(opt.seed));
  VectorIterator it(sentences);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  check(status.ok(), ctx, "SentencePiece training failed: ", status_text(status, "no reason given"));
  return parse_sentencepiece(model, "the trained SentencePiece model");
}

}  // namespace qkv
