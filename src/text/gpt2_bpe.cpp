// GPT-2's byte-level BPE, id for id OpenAI's encoder.py (and the npm package gpt-3-encoder):
//   1. split the text with the pre-tokenisation regex (PCRE2),
//   2. map each piece's UTF-8 bytes to GPT-2's byte alphabet (bytes_to_unicode),
//   3. merge adjacent symbols by rank, every occurrence of the best pair in one left-to-right
//      pass, until no adjacent pair is a merge,
//   4. look the symbols up in encoder.json.
// Here symbols are token ids over raw bytes (the alphabet is only the files' spelling), and step 3
// is text/bpe_merge.h's heap of adjacent pairs instead of rescanning the word, so a long word
// costs O(n log n) rather than O(n^2); that header says why the result is the same.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/npy.h"
#include "qkv/tokenizer.h"
#include "text/bpe_merge.h"
#include "text/hf_export.h"
#include "text/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace qkv {

namespace {

using Json = nlohmann::json;

constexpr char kEndOfText[] = "<|endoftext|>";
constexpr size_t kCacheWords = 1 << 16;   // the per-word cache is cleared when it reaches this many
constexpr size_t kCacheMaxBytes = 256;    // longer words are not cached

// ---------------------------------------------------------------------------------------------
// The pre-tokenisation regex, JavaScript's flavour:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// PCRE2's \s (even with UCP) is not JavaScript's: it adds U+0085 and U+180E and lacks U+FEFF.
// So \s is spelled out as JavaScript defines it (WhiteSpace + LineTerminator).

constexpr char kJsSpace[] =
    R"(\t\n\x{0B}\f\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF})";

class Pretokenizer {
 public:
  Pretokenizer() {
    const std::string s = kJsSpace;
    const std::string pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)" + s + R"(\p{L}\p{N}]+|[)" + s +
                                R"(]+(?![^)" + s + R"(])|[)" + s + "]+";
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &at, nullptr);
    if (code_ == nullptr) fail("GPT-2 pre-tokenisation regex does not compile: ", message(err), " at offset ", at);
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // when JIT is unavailable the interpreter runs
  }
  ~Pretokenizer() { pcre2_code_free(code_); }
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Calls f(piece) for each match in `text` (valid UTF-8), left to right. The alternatives
  // cover every character, so the matches tile the text.
  template <class F>
  void split(std::string_view text, F&& f) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_, nullptr), pcre2_match_data_free);
    check(md != nullptr, "GPT-2 tokenizer: out of memory for regex match data");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    for (size_t at = 0; at < text.size();) {
      const int rc = pcre2_match(code_, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      check(rc > 0, "GPT-2 tokenizer: pre-tokenisation regex failed at byte offset ", at, ": ", message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      check(ov[1] > ov[0], "GPT-2 tokenizer: empty regex match at byte offset ", ov[0]);
      f(text.substr(ov[0], ov[1] - ov[0]));
      at = ov[1];
    }
  }

 private:
  static std::string message(int code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(code, buf, sizeof buf);
    return reinterpret_cast<const char*>(buf);
  }
  pcre2_code* code_ = nullptr;
};

const Pretokenizer& pretokenizer() {
  static const Pretokenizer p;
  return p;
}

// ---------------------------------------------------------------------------------------------
// The byte alphabet (bytes_to_unicode) is text::byte_alphabet().

const text::ByteAlphabet& alphabet() { return text::byte_alphabet(); }
using text::append_utf8;

// Token text in the alphabet (valid UTF-8, as nlohmann::json and check_utf8 guarantee) -> raw
// bytes; false when a character is outside the alphabet.
bool from_alphabet(std::string_view text, std::string& bytes) {
  const text::ByteAlphabet& a = alphabet();
  bytes.clear();
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (c >= 0xf0 || (c >= 0x80 && c < 0xc0)) return false;  // four-byte characters are far outside it
    if (c >= 0xe0) cp = c & 0x0f, len = 3;
    else if (c >= 0xc0) cp = c & 0x1f, len = 2;
    if (i + len > text.size()) return false;
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    if (a.to_byte(cp) < 0) return false;
    bytes += static_cast<char>(a.to_byte(cp));
    i += len;
  }
  return true;
}

// UTF-8 text quoted in a message: control bytes as \xNN, cut after about `max_len` bytes at a
// character boundary.
std::string printable(std::string_view s, size_t max_len = 40) {
  size_t n = s.size();
  if (n > max_len) {
    n = max_len;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  }
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (n < s.size()) out += "...";
  return out;
}

// Token bytes spelled in the byte alphabet, as encoder.json writes them, whole.
std::string spelled_full(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, alphabet().to_cp[b]);
  return out;
}

// ... and shortened for a message.
std::string spelled(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, alphabet().to_cp[b]);
  return printable(out);
}

// ---------------------------------------------------------------------------------------------
// encoder.json through nlohmann's SAX interface: one flat object of token -> integer id, each
// value checked as it is read. Tokens are stored as raw bytes.

class EncoderReader {
 public:
  explicit EncoderReader(const std::string& name) : name_(name) {}
  std::vector<std::pair<std::string, int64_t>> entries;  // (token bytes, id) in file order

  bool start_object(size_t) {
    if (depth_++ > 0) bad_value("an object");
    return true;
  }
  bool end_object() {
    --depth_;
    return true;
  }
  bool key(std::string& k) {
    key_ = k;
    if (!from_alphabet(k, bytes_))
      fail(name_, ": token \"", printable(k), "\" has a character outside GPT-2's byte alphabet");
    return true;
  }
  bool number_integer(Json::number_integer_t v) { return id(v < 0, v < 0 ? 0 : static_cast<uint64_t>(v), v); }
  bool number_unsigned(Json::number_unsigned_t v) { return id(false, v, v); }
  bool number_float(Json::number_float_t, const std::string& s) { bad_value(("the number " + s).c_str()); }
  bool null() { bad_value("null"); }
  bool boolean(bool) { bad_value("a boolean"); }
  bool string(std::string&) { bad_value("a string"); }
  bool binary(Json::binary_t&) { bad_value("binary data"); }
  bool start_array(size_t) { bad_value("an array"); }
  bool end_array() { return true; }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    fail(name_, ": not valid JSON: ", e.what());
  }

 private:
  // `shown` is the value as written, for the message.
  template <class T>
  bool id(bool negative, uint64_t v, T shown) {
    if (depth_ == 0) bad_value("a number");
    if (negative || v >= INT32_MAX)
      fail(name_, ": token \"", printable(key_), "\" has id ", shown, " (expected 0 <= id < 2^31 - 1)");
    entries.emplace_back(bytes_, static_cast<int64_t>(v));
    return true;
  }
  [[noreturn]] void bad_value(const char* what) {
    if (depth_ == 0) fail(name_, ": expected a JSON object of token -> id, found ", what);
    fail(name_, ": token \"", printable(key_), "\" maps to ", what, " (expected an integer id)");
  }
  const std::string& name_;
  std::string key_, bytes_;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The tokenizer

using Merge = text::BpeMerge;  // rank: the position in vocab.bpe

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(const std::string& encoder_json, const std::string& vocab_bpe, const std::string& encoder_name,
                const std::string& vocab_name)
      : encoder_json_(encoder_json), vocab_bpe_(vocab_bpe) {
    read_encoder(encoder_name);
    read_merges(vocab_name);
    pretokenizer();  // compile the regex now, so a failure shows at load time
  }

  std::string type() const override { return "gpt2"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int32_t pad_id() const override { return eot_; }
  int32_t bos_id() const override { return eot_; }
  int32_t eos_id() const override { return eot_; }

  std::vector<int32_t> encode(std::string_view text) const override {
    check_utf8(text, "GPT-2 tokenizer: text to encode");
    std::vector<int32_t> ids;
    pretokenizer().split(text, [&](std::string_view word) { bpe_word(word, ids); });
    return ids;
  }

  std::string token_bytes(int32_t id) const override {
    check(id >= 0 && id < vocab_size(), "GPT-2 tokenizer: token id ", id, " is outside [0, ", vocab_size(), ")");
    return id == eot_ ? piece(id) : tokens_[static_cast<size_t>(id)];
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    // bytes <- concat(tokens[id]) without <|endoftext|>; then invalid UTF-8 -> U+FFFD
    std::string bytes;
    for (size_t i = 0; i < ids.size(); ++i) {
      check(ids[i] >= 0 && ids[i] < vocab_size(), "GPT-2 tokenizer: decode: id ", ids[i], " at position ", i,
            " is outside [0, ", vocab_size(), ")");
      if (ids[i] != eot_) bytes += tokens_[static_cast<size_t>(ids[i])];
    }
    return utf8_replace_invalid(bytes);
  }

  // Whole characters as themselves, ASCII space and controls in the byte alphabet (Ġ, Ċ, ĉ),
  // bytes that are not part of a whole character as <0xNN>.
  std::string piece(int32_t id) const override {
    check(id >= 0 && id < vocab_size(), "GPT-2 tokenizer: piece id ", id, " is outside [0, ", vocab_size(), ")");
    if (id == eot_) return kEndOfText;
    const std::string& t = tokens_[static_cast<size_t>(id)];
    std::string out;
    for (size_t i = 0; i < t.size();) {
      const auto c = static_cast<unsigned char>(t[i]);
      if (c < 0x80) {
        if (c <= ' ' || c == 0x7f) append_utf8(out, alphabet().to_cp[c]);
        else out += static_cast<char>(c);
        ++i;
        continue;
      }
      // A whole character is one that replacing invalid sequences leaves as it is.
      const size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
      const std::string_view ch = std::string_view(t).substr(i, len);
      if (ch.size() == len && len > 1 && utf8_replace_invalid(ch) == ch) {
        out += ch;
        i += len;
      } else {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", c);
        out += buf;
        ++i;
      }
    }
    return out;
  }

  // vocab.json + merges.txt are OpenAI's two files under Hugging Face's names; tokenizer.json is
  // GPT-2's fast tokenizer over them (ByteLevel, whose pattern reads \s as Oniguruma does:
  // U+0085 and U+FEFF split otherwise than OpenAI's JavaScript regex, docs/formats.md), with
  // <|endoftext|> put before a model's input: qkv's language models learn text after it.
  std::vector<std::string> save_hf(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    write_file_atomic((d / "vocab.json").string(), encoder_json_);
    write_file_atomic((d / "merges.txt").string(), vocab_bpe_);
    Json merges = Json::array();
    std::vector<std::pair<int32_t, std::string>> ranked;
    for (const auto& [key, m] : merges_) {
      const auto a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xffffffffu);
      ranked.emplace_back(m.rank, spelled_full(tokens_[static_cast<size_t>(a)]) + " " +
                                      spelled_full(tokens_[static_cast<size_t>(b)]));
    }
    std::sort(ranked.begin(), ranked.end());
    for (auto& [rank, line] : ranked) merges.push_back(std::move(line));
    Json vocab = Json::object();
    for (size_t id = 0; id < tokens_.size(); ++id) vocab[spelled_full(tokens_[id])] = id;
    const Json bpe = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                      {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                      {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}};
    const Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                             {"use_regex", true}};
    const Json added = {text::hf_added_token(eot_, kEndOfText, true)};
    const Json eot = {{"SpecialToken", {{"id", kEndOfText}, {"type_id", 0}}}};
    const Json post = {{"type", "TemplateProcessing"},
                       {"single", {eot, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                       {"pair", {eot, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, eot, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                       {"special_tokens", {{kEndOfText, {{"id", kEndOfText}, {"ids", {eot_}}, {"tokens", {kEndOfText}}}}}}};
    write_file_atomic((d / "tokenizer.json").string(),
                      text::hf_tokenizer_file(bpe, added, nullptr, byte_level, byte_level, post));
    write_file_atomic((d / "tokenizer_config.json").string(), text::hf_tokenizer_config(*this));
    return {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"};
  }

  void save(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    write_file_atomic((d / "encoder.json").string(), encoder_json_);
    write_file_atomic((d / "vocab.bpe").string(), vocab_bpe_);
    const Json j = {{"type", "gpt2"}, {"encoder", "encoder.json"}, {"vocab", "vocab.bpe"}};
    write_file_atomic((d / kTokenizerFile).string(), j.dump(2) + "\n");
  }

 private:
  // tokens_[id] <- raw bytes of each token; ids must be exactly 0..N-1.
  void read_encoder(const std::string& name) {
    EncoderReader r(name);
    if (const size_t nul = encoder_json_.find('\0'); nul != std::string::npos)
      fail(name, ": not valid JSON: NUL byte at offset ", nul);
    Json::sax_parse(encoder_json_, &r);
    const size_t n = r.entries.size();
    check(n > 0, name, ": no tokens (expected GPT-2's token -> id object)");
    tokens_.assign(n, std::string());
    std::vector<bool> seen(n, false);
    ids_.reserve(n);
    for (const auto& [bytes, id] : r.entries) {
      if (static_cast<size_t>(id) >= n)
        fail(name, ": token \"", spelled(bytes), "\" has id ", id, " (expected ids 0..", n - 1, ", one per token)");
      if (seen[static_cast<size_t>(id)])
        fail(name, ": id ", id, " is used by both \"", spelled(tokens_[static_cast<size_t>(id)]), "\" and \"",
             spelled(bytes), "\" (expected one token per id)");
      if (!ids_.emplace(bytes, static_cast<int32_t>(id)).second)
        fail(name, ": token \"", spelled(bytes), "\" appears twice");
      seen[static_cast<size_t>(id)] = true;
      tokens_[static_cast<size_t>(id)] = bytes;
    }
    // Every byte must be a token of its own: it is where BPE starts.
    for (int b = 0; b < 256; ++b) {
      const auto it = ids_.find(std::string(1, static_cast<char>(b)));
      if (it == ids_.end())
        fail(name, ": byte 0x", hex(b), " (\"", spelled(std::string(1, static_cast<char>(b))),
             "\") is not a token (expected all 256 single bytes)");
      byte_id_[b] = it->second;
    }
    const auto eot = ids_.find(kEndOfText);
    check(eot != ids_.end(), name, ": no \"", kEndOfText, "\" token (expected GPT-2's end-of-text token)");
    eot_ = eot->second;
  }

  // merges_[(a, b)] <- (rank, id of a+b) for each line "a b"; a later duplicate wins, as in
  // OpenAI's dict(zip(merges, range(len(merges)))).
  void read_merges(const std::string& name) {
    const std::string& s = vocab_bpe_;
    std::string a, b;
    int32_t rank = 0;
    size_t line_no = 0;
    for (size_t start = 0; start < s.size();) {
      size_t end = s.find('\n', start);
      if (end == std::string::npos) end = s.size();
      std::string_view line(s.data() + start, end - start);
      start = end + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
      // parts <- the line split at runs of spaces and tabs (the alphabet has neither)
      std::vector<std::string_view> parts;
      for (size_t i = 0; i < line.size();) {
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
        const size_t j = std::min(line.find_first_of(" \t", i), line.size());
        if (j > i) parts.push_back(line.substr(i, j - i));
        i = j;
      }
      if (parts.empty()) continue;
      const std::string where = detail::concat(name, " line ", line_no, ": ");
      if (parts.size() != 2)
        fail(where, "expected a merge \"a b\" (two tokens separated by a space), found ", parts.size(), " fields");
      check_utf8(line, where + "merge");
      if (!from_alphabet(parts[0], a) || !from_alphabet(parts[1], b))
        fail(where, "merge \"", printable(line), "\" has a character outside GPT-2's byte alphabet");
      const int32_t ia = token_id(a, parts[0], where), ib = token_id(b, parts[1], where);
      const int32_t joined = token_id(a + b, std::string(parts[0]) + std::string(parts[1]), where);
      merges_.insert_or_assign(pair_key(ia, ib), Merge{rank++, joined});
    }
    check(!merges_.empty(), name, ": no merges (expected a line \"a b\" per merge)");
  }

  // The id of `bytes`, written `text` in vocab.bpe.
  int32_t token_id(const std::string& bytes, std::string_view text, const std::string& where) const {
    const auto it = ids_.find(bytes);
    if (it == ids_.end()) fail(where, "\"", printable(text), "\" is not a token of encoder.json");
    return it->second;
  }

  static std::string hex(int b) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02X", b);
    return buf;
  }

  // Appends the ids of one pre-tokenised word.
  void bpe_word(std::string_view word, std::vector<int32_t>& ids) const {
    // A single byte is its own token.
    if (word.size() == 1) {
      ids.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
      return;
    }
    check(word.size() < INT32_MAX, "GPT-2 tokenizer: a pre-tokenised word of ", word.size(),
          " bytes is too long (expected under 2^31 - 1)");
    const bool cacheable = word.size() <= kCacheMaxBytes;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (const auto it = cache_.find(std::string(word)); it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }

    // symbols <- the bytes' tokens; then OpenAI's rounds of merges (text/bpe_merge.h)
    std::vector<int32_t> sym(word.size());
    for (size_t i = 0; i < word.size(); ++i) sym[i] = byte_id_[static_cast<unsigned char>(word[i])];
    std::vector<int32_t> out = text::bpe_merge(sym, text::BpeOrder::Rounds, [&](int32_t a, int32_t b) -> const text::BpeMerge* {
      const auto it = merges_.find(pair_key(a, b));
      return it == merges_.end() ? nullptr : &it->second;
    });
    ids.insert(ids.end(), out.begin(), out.end());
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (cache_.size() >= kCacheWords) cache_.clear();
      cache_.emplace(std::string(word), std::move(out));
    }
  }

  std::string encoder_json_, vocab_bpe_;  // the files as read; save() writes them back
  std::vector<std::string> tokens_;       // id -> token bytes
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_id_{};
  int32_t eot_ = -1;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;  // word -> ids
};

}  // namespace

std::unique_ptr<Tokenizer> parse_gpt2_tokenizer(const std::string& encoder_json_bytes, const std::string& vocab_bpe_bytes,
                                                const std::string& encoder_name, const std::string& vocab_name) {
  return std::make_unique<Gpt2Tokenizer>(encoder_json_bytes, vocab_bpe_bytes, encoder_name, vocab_name);
}

}  // namespace qkv
