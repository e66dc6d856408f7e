// A GGUF file's tokenizer (tokenizer.ggml.*). "llama": the pieces, scores and types as a
// SentencePiece ModelProto (BPE by score, byte fallback, the dummy prefix), handed to the
// SentencePiece library itself, which is what llama.cpp's tokenizer reproduces.
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/gguf.h"
#include "qkv/tokenizer.h"

namespace qkv {

namespace {

// The protocol-buffer wire format, just enough to write a ModelProto.
class WireWriter {
 public:
  void varint(uint64_t field, uint64_t v) {
    key(field, 0);
    raw_varint(v);
  }
  void fixed32(uint64_t field, float f) {
    key(field, 5);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>((u >> (8 * i)) & 0xff);
  }
  void bytes(uint64_t field, const std::string& b) {
    key(field, 2);
    raw_varint(b.size());
    out_ += b;
  }
  const std::string& str() const { return out_; }

 private:
  void key(uint64_t field, int wire) { raw_varint(field << 3 | static_cast<uint64_t>(wire)); }
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }
  std::string out_;
};

// SentencePiece's piece types (sentencepiece_model.proto), the same numbers as GGUF's token types.
enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

bool is_byte_piece(const std::string& p) {
  return p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && std::isxdigit(static_cast<unsigned char>(p[3])) &&
         std::isxdigit(static_cast<unsigned char>(p[4]));
}

std::unique_ptr<Tokenizer> spm_tokenizer(const GgufFile& f) {
  const std::string& file = f.path();
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  check(tokens && tokens->kind == GgufValue::Array && tokens->elem == GgufValue::String, file,
        ": metadata \"tokenizer.ggml.tokens\" (an array of strings) is missing");
  const size_t n = tokens->strings.size();
  check(n >= 3 && n <= (size_t{1} << 24), file, ": \"tokenizer.ggml.tokens\" holds ", n, " tokens (expected 3 to 2^24)");
  const GgufValue* scores = f.find("tokenizer.ggml.scores");
  check(scores && scores->kind == GgufValue::Array && scores->elem != GgufValue::String && scores->numbers.size() == n,
        file, ": \"tokenizer.ggml.scores\" must be ", n, " numbers, one per token (a SentencePiece model ranks its "
        "merges by them)");
  const GgufValue* types = f.find("tokenizer.ggml.token_type");
  check(!types || (types->kind == GgufValue::Array && types->elem != GgufValue::String && types->numbers.size() == n),
        file, ": \"tokenizer.ggml.token_type\" must be ", n, " integers, one per token");
  const int64_t N = static_cast<int64_t>(n);
  const int64_t unk = f.integer_or("tokenizer.ggml.unknown_token_id", 0, 0, N - 1),
                bos = f.integer_or("tokenizer.ggml.bos_token_id", 1, 0, N - 1),
                eos = f.integer_or("tokenizer.ggml.eos_token_id", 2, 0, N - 1),
                pad = f.integer_or("tokenizer.ggml.padding_token_id", -1, -1, N - 1);
  WireWriter model;
  int bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string& p = tokens->strings[i];
    check(!p.empty() && p.find('\0') == std::string::npos && invalid_utf8_offset(p) < 0, file,
          ": token ", i, " of \"tokenizer.ggml.tokens\" is empty, holds a NUL byte or is not UTF-8");
    const double sc = scores->numbers[i];
    check(std::isfinite(sc), file, ": \"tokenizer.ggml.scores\"[", i, "] is ", sc, "; expected a finite number");
    int type = kNormal;
    if (types) {
      const double t = types->numbers[i];
      check(t >= 1 && t <= 6 && t == std::floor(t), file, ": \"tokenizer.ggml.token_type\"[", i, "] is ", t,
            " (expected 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused or 6 byte)");
      type = static_cast<int>(t);
    } else {
      type = static_cast<int64_t>(i) == unk ? kUnknown
             : static_cast<int64_t>(i) == bos || static_cast<int64_t>(i) == eos ? kControl
             : is_byte_piece(p) ? kByte : kNormal;
    }
    check(type != kByte || is_byte_piece(p), file, ": token ", i, " \"", p, "\" is a byte token but not <0xNN>");
    bytes += type == kByte;
    WireWriter piece;
    piece.bytes(1, p);
    piece.fixed32(2, static_cast<float>(sc));
    piece.varint(3, static_cast<uint64_t>(type));
    model.bytes(1, piece.str());
  }
  WireWriter trainer;
  trainer.varint(3, 2);  // model_type: BPE
  trainer.varint(4, n);  // vocab_size
  trainer.varint(35, bytes == 256 ? 1 : 0);  // byte_fallback, where every byte has its piece
  trainer.varint(40, static_cast<uint64_t>(unk));
  trainer.varint(41, static_cast<uint64_t>(bos));
  trainer.varint(42, static_cast<uint64_t>(eos));
  trainer.varint(43, static_cast<uint64_t>(pad));  // -1 as a two's-complement varint when none
  trainer.bytes(45, tokens->strings[static_cast<size_t>(unk)]);
  trainer.bytes(46, tokens->strings[static_cast<size_t>(bos)]);
  trainer.bytes(47, tokens->strings[static_cast<size_t>(eos)]);
  if (pad >= 0) trainer.bytes(48, tokens->strings[static_cast<size_t>(pad)]);
  model.bytes(2, trainer.str());
  WireWriter norm;
  norm.bytes(1, "identity");
  norm.varint(3, f.boolean_or("tokenizer.ggml.add_space_prefix", true) ? 1 : 0);  // add_dummy_prefix
  norm.varint(4, 0);  // remove_extra_whitespaces: no (Llama keeps every space)
  norm.varint(5, 1);  // escape_whitespaces: spaces as U+2581
  model.bytes(3, norm.str());
  return parse_sentencepiece(model.str(), file + " (its tokenizer.ggml.* SentencePiece model)",
                             f.boolean_or("tokenizer.ggml.add_bos_token", true),
                             f.boolean_or("tokenizer.ggml.add_eos_token", false));
}

// Llama 3's pre-tokenizer split (its tokenizer.json's Split pattern).
constexpr char kLlama3Split[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
// Qwen2's: Llama 3's with single digits (\p{N} instead of \p{N}{1,3}).
constexpr char kQwen2Split[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// "gpt2": byte-level BPE (tokens as GPT-2's byte alphabet spells them, tokenizer.ggml.merges "a b"),
// written as the tokenizer.json Hugging Face has for the same model and run by qkv's reader of it.
std::unique_ptr<Tokenizer> bpe_tokenizer(const GgufFile& f) {
  using Json = nlohmann::json;
  const std::string& file = f.path();
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  check(tokens && tokens->kind == GgufValue::Array && tokens->elem == GgufValue::String, file,
        ": metadata \"tokenizer.ggml.tokens\" (an array of strings) is missing");
  const GgufValue* merges = f.find("tokenizer.ggml.merges");
  check(merges && merges->kind == GgufValue::Array && merges->elem == GgufValue::String, file,
        ": metadata \"tokenizer.ggml.merges\" (an array of strings \"a b\") is missing");
  const size_t n = tokens->strings.size();
  const GgufValue* types = f.find("tokenizer.ggml.token_type");
  check(!types || (types->kind == GgufValue::Array && types->elem != GgufValue::String && types->numbers.size() == n),
        file, ": \"tokenizer.ggml.token_type\" must be ", n, " integers, one per token");
  const std::string pre = f.string_or("tokenizer.ggml.pre", "default");
  const Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  Json pre_tokenizer, normalizer = nullptr;
  if (pre == "default" || pre == "gpt2") {
    pre_tokenizer = byte_level;
  } else if (pre == "smollm") {
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  } else if (pre == "llama-bpe" || pre == "qwen2") {
    // Llama 3 and Qwen2 split with their own pattern, then map bytes without GPT-2's regex; Qwen2's
    // tokenizer.json also normalises to NFC first
    Json bl = byte_level;
    bl["use_regex"] = false;
    const char* split = pre == "qwen2" ? kQwen2Split : kLlama3Split;
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers",
                      {{{"type", "Split"}, {"pattern", {{"Regex", split}}}, {"behavior", "Isolated"}, {"invert", false}},
                       bl}}};
    if (pre == "qwen2") normalizer = {{"type", "NFC"}};
  } else {
    fail(file, ": tokenizer.ggml.pre \"", pre, "\" is not read (qkv reads default, gpt2, smollm, llama-bpe and qwen2)");
  }
  Json vocab = Json::object(), added = Json::array();
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = tokens->strings[i];
    check(invalid_utf8_offset(t) < 0 && !t.empty(), file, ": token ", i, " of \"tokenizer.ggml.tokens\" is empty or not UTF-8");
    check(!vocab.contains(t), file, ": token ", i, " \"", t, "\" of \"tokenizer.ggml.tokens\" appears twice");
    vocab[t] = i;
    const int type = types ? static_cast<int>(types->numbers[i]) : 1;
    if (type == 3 || type == 4)
      added.push_back({{"id", i}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", type == 3}});
  }
  const int64_t N = static_cast<int64_t>(n);
  const int64_t bos = f.integer_or("tokenizer.ggml.bos_token_id", -1, -1, N - 1),
                eos = f.integer_or("tokenizer.ggml.eos_token_id", -1, -1, N - 1),
                pad = f.integer_or("tokenizer.ggml.padding_token_id", -1, -1, N - 1);
  Json post = nullptr;
  if (bos >= 0 && f.boolean_or("tokenizer.ggml.add_bos_token", pre == "llama-bpe")) {
    const std::string b = tokens->strings[static_cast<size_t>(bos)];
    post = {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair",
             {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
              {{"SpecialToken", {{"id", b}, {"type_id", 1}}}},
              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
            {"special_tokens", {{b, {{"id", b}, {"ids", {bos}}, {"tokens", {b}}}}}}};
  }
  const Json tj = {{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added},
                   {"normalizer", normalizer},
                   {"pre_tokenizer", pre_tokenizer},
                   {"post_processor", post},
                   {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                   {"model",
                    {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                     {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                     {"vocab", vocab}, {"merges", merges->strings}}}};
  Json config = Json::object();
  if (bos >= 0) config["bos_token"] = tokens->strings[static_cast<size_t>(bos)];
  if (eos >= 0) config["eos_token"] = tokens->strings[static_cast<size_t>(eos)];
  if (pad >= 0) config["pad_token"] = tokens->strings[static_cast<size_t>(pad)];
  return parse_hf_tokenizer(tj.dump(), file + " (its tokenizer.ggml.* byte-level BPE)", config.dump(),
                            file + " (its tokenizer.ggml.*_token_id)");
}

}  // namespace

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& f) {
  const std::string kind = f.string_or("tokenizer.ggml.model", "");
  check(!kind.empty(), f.path(), ": no tokenizer (metadata \"tokenizer.ggml.model\" is missing)");
  if (kind == "llama") return spm_tokenizer(f);
  if (kind == "gpt2") return bpe_tokenizer(f);
  fail(f.path(), ": tokenizer.ggml.model \"", kind, "\" is not read (qkv reads \"llama\", SentencePiece, and \"gpt2\", ",
       "byte-level BPE)");
}

}  // namespace qkv
