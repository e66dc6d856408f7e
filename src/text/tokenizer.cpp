// Tokenizers: UTF-8 checking and repair, the byte tokenizer, and loading a saved tokenizer
// directory (tokenizer.json naming the kind and its files). GPT-2 BPE lives in gpt2_bpe.cpp,
// SentencePiece in sentencepiece_tokenizer.cpp.
#include "qkv/tokenizer.h"

#include "qkv/gguf.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/json_strict.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "text/hf_export.h"

namespace qkv {

namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// UTF-8 (Unicode 15, table 3-7: the well-formed byte sequences)

enum class Utf8Fault { None, Stray, Overlong, Surrogate, TooLarge, NeverUsed, Truncated };

struct Utf8Step {
  size_t len;       // bytes of the character, or of the maximal invalid subpart starting here
  Utf8Fault fault;  // None for a whole character
};

// The character (or maximal invalid subpart) starting at s[i], i < n.
Utf8Step utf8_step(const unsigned char* s, size_t n, size_t i) {
  const unsigned char b = s[i];
  if (b < 0x80) return {1, Utf8Fault::None};
  if (b < 0xc0) return {1, Utf8Fault::Stray};
  if (b < 0xc2) return {1, Utf8Fault::Overlong};
  if (b >= 0xf8) return {1, Utf8Fault::NeverUsed};
  if (b >= 0xf5) return {1, Utf8Fault::TooLarge};
  const size_t need = b < 0xe0 ? 1 : b < 0xf0 ? 2 : 3;  // continuation bytes
  // The second byte's range is narrower after E0 (overlong), ED (surrogates), F0 (overlong) and
  // F4 (above U+10FFFF); every other continuation byte is 80..BF.
  unsigned char lo = 0x80, hi = 0xbf;
  Utf8Fault narrow = Utf8Fault::Truncated;
  if (b == 0xe0) lo = 0xa0, narrow = Utf8Fault::Overlong;
  if (b == 0xed) hi = 0x9f, narrow = Utf8Fault::Surrogate;
  if (b == 0xf0) lo = 0x90, narrow = Utf8Fault::Overlong;
  if (b == 0xf4) hi = 0x8f, narrow = Utf8Fault::TooLarge;
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= n) return {k, Utf8Fault::Truncated};
    const unsigned char c = s[i + k];
    const bool continuation = c >= 0x80 && c <= 0xbf;
    if (k == 1 && continuation && (c < lo || c > hi)) return {1, narrow};
    if (!continuation) return {k, Utf8Fault::Truncated};
  }
  return {need + 1, Utf8Fault::None};
}

std::string hex_bytes(const unsigned char* s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%s0x%02X", i ? " " : "", s[i]);
    out += buf;
  }
  return out;
}

const char* fault_text(Utf8Fault f) {
  switch (f) {
    case Utf8Fault::Stray: return "a continuation byte with no lead byte";
    case Utf8Fault::Overlong: return "an overlong encoding";
    case Utf8Fault::Surrogate: return "an encoded surrogate (U+D800..U+DFFF)";
    case Utf8Fault::TooLarge: return "a value above U+10FFFF";
    case Utf8Fault::NeverUsed: return "a byte that never occurs in UTF-8";
    case Utf8Fault::Truncated: return "a truncated sequence";
    case Utf8Fault::None: break;
  }
  return "valid";
}

// ---------------------------------------------------------------------------------------------
// Files

std::string join(const std::string& dir, const std::string& name) { return (std::filesystem::path(dir) / name).string(); }

// The value of `key`: a plain file name inside the tokenizer directory.
std::string file_field(const Json& j, const char* key, const std::string& file) {
  const auto it = j.find(key);
  if (it == j.end()) fail(file, ": missing \"", key, "\" (expected the name of a file beside tokenizer.json)");
  if (!it->is_string()) fail(file, ": \"", key, "\" is ", it->type_name(), " (expected a file name string)");
  const std::string name = it->get<std::string>();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    fail(file, ": \"", key, "\" is \"", name, "\" (expected a plain file name inside the tokenizer directory)");
  return name;
}

// Rejects keys other than `allowed` (a tokenizer.json written by a newer qkv, or a typo).
void only_keys(const Json& j, std::initializer_list<const char*> allowed, const std::string& type,
               const std::string& file) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* a : allowed) known = known || it.key() == a;
    if (known) continue;
    std::string list;
    for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + "\"" + a + "\"";
    fail(file, ": unexpected key \"", it.key(), "\" for type \"", type, "\" (expected only ", list, ")");
  }
}

// ---------------------------------------------------------------------------------------------
// Byte tokenizer: pad=0, bos=1, eos=2, byte b -> 3+b

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kPad = 0, kBos = 1, kEos = 2, kFirstByte = 3, kVocab = 259;

  std::string type() const override { return "byte"; }
  int64_t vocab_size() const override { return kVocab; }
  int32_t pad_id() const override { return kPad; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }

  std::vector<int32_t> encode(std::string_view text) const override {
    check_utf8(text, "byte tokenizer: text to encode");
    // ids[i] <- 3 + text[i]
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = kFirstByte + static_cast<unsigned char>(text[i]);
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    // bytes <- ids - 3, specials dropped; then invalid UTF-8 -> U+FFFD
    std::string bytes;
    bytes.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      check_id(ids[i], i);
      if (ids[i] >= kFirstByte) bytes += static_cast<char>(ids[i] - kFirstByte);
    }
    return utf8_replace_invalid(bytes);
  }

  std::string token_bytes(int32_t id) const override {
    check(id >= 0 && id < kVocab, "byte tokenizer: token id ", id, " is outside [0, ", kVocab, ")");
    return id >= kFirstByte ? std::string(1, static_cast<char>(id - kFirstByte)) : piece(id);
  }

  // Printable ASCII as itself, space as "▁", any other byte as <0xNN>.
  std::string piece(int32_t id) const override {
    check(id >= 0 && id < kVocab, "byte tokenizer: piece id ", id, " is outside [0, ", kVocab, ")");
    if (id == kPad) return "<pad>";
    if (id == kBos) return "<s>";
    if (id == kEos) return "</s>";
    const int b = id - kFirstByte;
    if (b == ' ') return "\u2581";
    if (b > ' ' && b < 0x7f) return std::string(1, static_cast<char>(b));
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    return buf;
  }

  void save(const std::string& dir) const override {
    write_file_atomic(join(dir, kTokenizerFile), Json{{"type", "byte"}}.dump(2) + "\n");
  }

  // A BPE without merges whose vocabulary is the 256 byte tokens <0xNN> (at 3 + byte) after
  // <pad>, <s>, </s>: byte fallback turns every character into its bytes, the ids this gives.
  std::vector<std::string> save_hf(const std::string& dir) const override {
    Json vocab = {{"<pad>", kPad}, {"<s>", kBos}, {"</s>", kEos}};
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      vocab[buf] = kFirstByte + b;
    }
    const Json model = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                        {"byte_fallback", true}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", Json::array()}};
    const Json added = {text::hf_added_token(kPad, "<pad>", true), text::hf_added_token(kBos, "<s>", true),
                        text::hf_added_token(kEos, "</s>", true)};
    const Json decoder = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
    write_file_atomic(join(dir, "tokenizer.json"), text::hf_tokenizer_file(model, added, nullptr, nullptr, decoder));
    write_file_atomic(join(dir, "tokenizer_config.json"), text::hf_tokenizer_config(*this));
    return {"tokenizer.json", "tokenizer_config.json"};
  }

 private:
  static void check_id(int32_t id, size_t pos) {
    check(id >= 0 && id < kVocab, "byte tokenizer: decode: id ", id, " at position ", pos, " is outside [0, ", kVocab,
          ")");
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// UTF-8

size_t decode_utf8(std::string_view text, size_t i, char32_t& cp) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const Utf8Step st = utf8_step(s, text.size(), i);
  if (st.fault != Utf8Fault::None) return 0;
  // cp <- the lead byte's payload bits, then 6 bits from each continuation byte
  static constexpr unsigned char kLeadMask[] = {0, 0x7f, 0x1f, 0x0f, 0x07};
  char32_t v = s[i] & kLeadMask[st.len];
  for (size_t k = 1; k < st.len; ++k) v = (v << 6) | (s[i + k] & 0x3f);
  cp = v;
  return st.len;
}

int64_t invalid_utf8_offset(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const Utf8Step st = utf8_step(s, n, i);
    if (st.fault != Utf8Fault::None) return static_cast<int64_t>(i);
    i += st.len;
  }
  return -1;
}

void check_utf8(std::string_view text, std::string_view what) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const Utf8Step st = utf8_step(s, n, i);
    if (st.fault == Utf8Fault::None) {
      i += st.len;
      continue;
    }
    // shown <- the bytes the lead byte claims (a truncated sequence: up to the byte that cut it
    // short), or the lone byte that cannot start a character
    const unsigned char b = s[i];
    size_t claimed = b < 0xc0 || b >= 0xf8 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
    if (st.fault == Utf8Fault::Truncated) claimed = st.len + 1;
    const size_t shown = std::min(n - i, claimed);
    fail(what, " is not valid UTF-8: ", fault_text(st.fault), " at byte offset ", i, " (bytes ", hex_bytes(s + i, shown),
         i + shown == n ? ", then the end of the text" : "", ")");
  }
}

std::string utf8_replace_invalid(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  out.reserve(n);
  // out <- each whole character as it is, each maximal invalid subpart as U+FFFD
  for (size_t i = 0; i < n;) {
    const Utf8Step st = utf8_step(s, n, i);
    if (st.fault == Utf8Fault::None) {
      out.append(bytes.data() + i, st.len);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += st.len;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Construction and loading

std::vector<int32_t> encode_input(const Tokenizer& tok, std::string_view text, int64_t max_len) {
  std::vector<int32_t> ids = tok.encode(text);
  if (max_len > 0) {
    const auto specials = static_cast<int64_t>(tok.with_special_tokens({}).size());
    check(specials < max_len, "the tokenizer's ", specials, " special tokens leave no room for text in ", max_len,
          " positions");
    if (static_cast<int64_t>(ids.size()) > max_len - specials) ids.resize(static_cast<size_t>(max_len - specials));
  }
  return tok.with_special_tokens(ids);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  check(id >= 0 && id < vocab_size(), type(), " tokenizer: token id ", id, " is outside [0, ", vocab_size(), ")");
  // decode(a, id) past decode(a): the token's text where another precedes it
  const std::vector<int32_t> a = encode("a");
  if (!a.empty()) {
    const std::string base = decode(a);
    std::vector<int32_t> ids = a;
    ids.push_back(id);
    const std::string both = decode(ids);
    if (both.size() > base.size() && both.compare(0, base.size(), base) == 0) return both.substr(base.size());
  }
  return piece(id);  // a token that decodes to nothing
}

std::vector<std::vector<int32_t>> Tokenizer::encode_sampled(const std::vector<std::string>& texts, double alpha,
                                                             uint32_t seed) const {
  (void)texts, (void)alpha, (void)seed;
  fail("a ", type(), " tokenizer has no sampled segmentations (subword sampling needs a SentencePiece model)");
}

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& encoder_json, const std::string& vocab_bpe) {
  std::string encoder = read_file(encoder_json, "GPT-2 encoder.json");
  std::string merges = read_file(vocab_bpe, "GPT-2 vocab.bpe");
  return parse_gpt2_tokenizer(encoder, merges, encoder_json, vocab_bpe);
}

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_file, bool add_bos, bool add_eos) {
  return parse_sentencepiece(read_file(model_file, "SentencePiece model"), model_file, add_bos, add_eos);
}

namespace {
// Hugging Face's tokenizer.json (the tokenizers library's format) has "model", never qkv's "type".
// Only the top-level keys are looked at (a SAX pass builds nothing: a 200,000-token file is read
// once, by the reader that follows).
struct TopLevelKeys : nlohmann::json_sax<Json> {
  int depth = 0;
  bool object = false, type = false, model = false, version = false;
  bool open(bool is_object) {
    if (depth++ == 0) object = is_object;
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(true); }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth == 1) type |= k == "type", model |= k == "model", version |= k == "version";
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

bool is_hf_tokenizer_json(const std::string& file) {
  try {
    const std::string text = read_file(file, "tokenizer.json");
    TopLevelKeys keys;
    if (text.find('\0') != std::string::npos || !Json::sax_parse(text, &keys) || !keys.object) return false;
    return !keys.type && (keys.model || keys.version);
  } catch (const Error&) {
    return false;  // unreadable: qkv's reader names what is wrong
  }
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// A Hugging Face folder's tokenizer (see load_tokenizer), or nullptr when it has none.
std::unique_ptr<Tokenizer> load_hf_folder_tokenizer(const std::string& dir) {
  const auto at = [&](const char* name) { return join(dir, name); };
  if (exists(at("tokenizer.json")) && is_hf_tokenizer_json(at("tokenizer.json"))) return load_hf_tokenizer(dir);
  if (exists(at("source.spm")) && exists(at("target.spm")) && exists(at("vocab.json"))) {
    if (exists(at("tokenizer_config.json"))) {
      const Json c = detail::parse_json_object(read_file(at("tokenizer_config.json"), "tokenizer_config.json"),
                                               at("tokenizer_config.json"));
      check(!(c.contains("separate_vocabs") && c["separate_vocabs"] == true), at("tokenizer_config.json"),
            ": \"separate_vocabs\": true (a Marian model with a second, target vocabulary) is not supported");
    }
    return load_marian_tokenizer(dir);
  }
  if (exists(at("vocab.json")) && exists(at("merges.txt"))) return load_gpt2_tokenizer(at("vocab.json"), at("merges.txt"));
  if (exists(at("tokenizer.model"))) return load_sentencepiece(at("tokenizer.model"));
  if (exists(at("vocab.txt"))) return load_wordpiece_vocab(dir);
  return nullptr;
}
}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  // The directory, then qkv_tokenizer.json in it (or an older directory's tokenizer.json).
  std::error_code ec;
  const auto status = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(status))
    fail(dir, ": tokenizer directory does not exist (expected a directory holding ", kTokenizerFile, ")");
  if (std::filesystem::is_regular_file(status) && is_gguf_file(dir)) return load_gguf_tokenizer(GgufFile(dir));
  if (!std::filesystem::is_directory(status))
    fail(dir, ": not a directory (expected a tokenizer directory holding ", kTokenizerFile, ")");
  std::string file = join(dir, kTokenizerFile);
  const bool legacy = !exists(file);
  if (legacy) {
    file = join(dir, "tokenizer.json");
    if (!exists(file) || is_hf_tokenizer_json(file)) {
      if (auto tok = load_hf_folder_tokenizer(dir)) return tok;
      fail(join(dir, kTokenizerFile), ": no such file (expected ", kTokenizerFile,
           " in the tokenizer directory, or a Hugging Face folder's tokenizer.json, source.spm + target.spm + "
           "vocab.json, vocab.json + merges.txt, tokenizer.model or vocab.txt)");
    }
  }
  const Json j = detail::parse_json_object(read_file(file, legacy ? "tokenizer.json" : kTokenizerFile), file);

  // "type" chooses the kind; each kind's other keys name its files.
  constexpr char kTypes[] = "\"byte\", \"gpt2\", \"sentencepiece\", \"hf\" or \"marian\"";
  const auto t = j.find("type");
  if (t == j.end()) fail(file, ": missing \"type\" (expected ", kTypes, ")");
  if (!t->is_string()) fail(file, ": \"type\" is ", t->type_name(), " (expected ", kTypes, ")");
  const std::string type = t->get<std::string>();
  if (type == "byte") {
    only_keys(j, {"type"}, type, file);
    return make_byte_tokenizer();
  }
  if (type == "gpt2") {
    only_keys(j, {"type", "encoder", "vocab"}, type, file);
    return load_gpt2_tokenizer(join(dir, file_field(j, "encoder", file)), join(dir, file_field(j, "vocab", file)));
  }
  if (type == "sentencepiece") {
    only_keys(j, {"type", "model", "add_bos", "add_eos"}, type, file);
    for (const char* k : {"add_bos", "add_eos"})
      check(!j.contains(k) || j.at(k).is_boolean(), file, ": \"", k, "\" must be true or false, got ", j.contains(k) ? j.at(k).dump() : "");
    return load_sentencepiece(join(dir, file_field(j, "model", file)), j.value("add_bos", false), j.value("add_eos", false));
  }
  if (type == "hf") {
    only_keys(j, {"type", "file", "config"}, type, file);
    const std::string tj = join(dir, file_field(j, "file", file));
    std::string config_name = join(dir, "tokenizer_config.json"), config;
    if (j.contains("config")) {
      config_name = join(dir, file_field(j, "config", file));
      config = read_file(config_name, "tokenizer_config.json");
    }
    return parse_hf_tokenizer(read_file(tj, "tokenizer.json"), tj, config, config_name);
  }
  if (type == "marian") {
    only_keys(j, {"type", "source", "target", "vocab"}, type, file);
    return load_marian_tokenizer(dir, file_field(j, "source", file), file_field(j, "target", file),
                                 file_field(j, "vocab", file));
  }
  fail(file, ": unknown tokenizer type \"", type, "\" (expected ", kTypes, ")");
}

}  // namespace qkv
