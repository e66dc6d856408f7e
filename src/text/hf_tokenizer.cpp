// Hugging Face's tokenizer.json (the `tokenizers` library's format), id for id what its Rust code
// computes (huggingface/tokenizers, tokenizers/src):
//
//   text --split at added tokens that are not normalized--> sections
//        --normalizer--> --split at added tokens that are normalized--> sections
//        --pre-tokenizer--> words --model (BPE, WordPiece, Unigram, WordLevel)--> ids
//   ids  --post-processor (with special tokens: [CLS] A [SEP], <s> A, ...)--> model input
//   ids  --skip special tokens, id -> token, decoder chain, join--> text
//
// Each stage is a small class built from its JSON object; every key is checked and an unknown
// component type is an error naming its place in the file ("normalizer.normalizers[1].type").
// Text flows as code points, each carrying one flag: whether it is aligned with the input's first
// character, which is all of Rust's offset tracking that changes ids (Metaspace's
// prepend_scheme "first" prepends only to the split that starts at the original offset 0).
//
// Deliberate differences from the Rust library, all documented in docs/formats.md:
//   - Unicode properties come from ICU 72 (Unicode 15); the Rust crates behind BertNormalizer and
//     BertPreTokenizer use older tables, so characters added to Unicode since differ.
//   - the "Precompiled" normalizer (SentencePiece's compiled character map), the UnicodeScripts
//     pre-tokenizer, the CTC decoder and BPE dropout are refused with an error naming them.
//   - truncation and padding settings in the file are ignored: commands cut to the model's length.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "io/json_strict.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/tokenizer.h"
#include "text/bpe_merge.h"
#include "text/hf_export.h"
#include "text/unicode.h"

namespace qkv {

namespace {

using Json = nlohmann::json;
using text::to_u32;
using text::to_utf8;

// ---------------------------------------------------------------------------------------------
// Reading the JSON: every access names its place in the file

struct Where {
  const std::string& file;
  std::string path;  // "model.vocab", "normalizer.normalizers[2]"
  int depth = 0;     // Sequences this place is nested in
  Where at(const std::string& key) const { return {file, path.empty() ? key : path + "." + key, depth}; }
  Where index(size_t i) const { return {file, path + "[" + std::to_string(i) + "]", depth}; }
  template <class... A>
  [[noreturn]] void fail(const A&... a) const {
    qkv::fail(file, ": ", path.empty() ? "" : path + ": ", a...);
  }
};

const Json* find_key(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

bool get_bool(const Json& j, const char* key, bool fallback, const Where& w) {
  const Json* v = find_key(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) w.at(key).fail("is ", v->type_name(), " (expected true or false)");
  return v->get<bool>();
}

std::string get_string(const Json& j, const char* key, const Where& w, const char* fallback = nullptr) {
  const Json* v = find_key(j, key);
  if (v == nullptr) {
    if (fallback != nullptr) return fallback;
    w.fail("missing \"", key, "\"");
  }
  if (!v->is_string()) w.at(key).fail("is ", v->type_name(), " (expected a string)");
  return v->get<std::string>();
}

int64_t get_int(const Json& j, const char* key, const Where& w, int64_t lo, int64_t hi, int64_t fallback) {
  const Json* v = find_key(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) w.at(key).fail("is ", v->type_name(), " (expected an integer)");
  if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(hi) : v->get<int64_t>() < lo ||
                                                                                     v->get<int64_t>() > hi)
    w.at(key).fail("is ", v->dump(), " (expected ", lo, " .. ", hi, ")");
  return v->get<int64_t>();
}

// One character given as a string ("▁").
char32_t get_char(const Json& j, const char* key, const Where& w, char32_t fallback) {
  const Json* v = find_key(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) w.at(key).fail("is ", v->type_name(), " (expected a one-character string)");
  const std::u32string s = to_u32(v->get<std::string>());
  if (s.size() != 1) w.at(key).fail("is \"", v->get<std::string>(), "\" (expected exactly one character)");
  return s[0];
}

const Json& get_object(const Json& j, const char* key, const Where& w) {
  const Json* v = find_key(j, key);
  if (v == nullptr) w.fail("missing \"", key, "\"");
  if (!v->is_object()) w.at(key).fail("is ", v->type_name(), " (expected an object)");
  return *v;
}

const Json& get_array(const Json& j, const char* key, const Where& w) {
  const Json* v = find_key(j, key);
  if (v == nullptr) w.fail("missing \"", key, "\"");
  if (!v->is_array()) w.at(key).fail("is ", v->type_name(), " (expected an array)");
  return *v;
}

std::string type_of(const Json& j, const Where& w) {
  if (!j.is_object()) w.fail("is ", j.type_name(), " (expected an object with a \"type\")");
  return get_string(j, "type", w);
}

// ---------------------------------------------------------------------------------------------
// Text with alignment flags

struct Str {
  std::u32string c;
  std::string at0;  // per character: 1 if aligned with the input's first character

  size_t size() const { return c.size(); }
  bool empty() const { return c.empty(); }
  Str slice(size_t b, size_t e) const { return {c.substr(b, e - b), at0.substr(b, e - b)}; }
  void push(char32_t ch, char flag) { c.push_back(ch), at0.push_back(flag); }
  std::string utf8() const { return to_utf8(c); }
  bool starts_at0() const { return !at0.empty() && at0[0] != 0; }
};

Str input_str(std::string_view utf8) {
  Str s{to_u32(utf8), {}};
  s.at0.assign(s.c.size(), 0);
  if (!s.at0.empty()) s.at0[0] = 1;
  return s;
}

// (begin, end, is_match) in characters, covering the string left to right.
using Matches = std::vector<std::tuple<size_t, size_t, bool>>;

template <class Pred>
Matches match_chars(const Str& s, Pred pred) {
  Matches m;
  if (s.empty()) return {{0, 0, false}};
  size_t last = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!pred(s.c[i])) continue;
    if (last < i) m.emplace_back(last, i, false);
    m.emplace_back(i, i + 1, true);
    last = i + 1;
  }
  if (last < s.size()) m.emplace_back(last, s.size(), false);
  return m;
}

Matches match_regex(const Str& s, const text::Regex& re) {
  if (s.empty()) return {{0, 0, false}};
  const std::string u = s.utf8();
  // char index of each byte offset that starts a character (and of the end)
  std::vector<size_t> char_at(u.size() + 1, 0);
  size_t k = 0;
  for (size_t b = 0; b < u.size(); ++b) {
    if ((static_cast<unsigned char>(u[b]) & 0xc0) != 0x80) char_at[b] = k++;
  }
  char_at[u.size()] = k;
  Matches m;
  size_t prev = 0;
  for (const auto& [b, e] : re.find_all(u)) {
    const size_t cb = char_at[b], ce = char_at[e];
    if (prev != cb) m.emplace_back(prev, cb, false);
    m.emplace_back(cb, ce, true);
    prev = ce;
  }
  if (prev != s.size()) m.emplace_back(prev, s.size(), false);
  return m;
}

Matches invert(Matches m) {
  for (auto& t : m) std::get<2>(t) = !std::get<2>(t);
  return m;
}

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const Json& j, const char* key, const Where& w, Behavior fallback) {
  const Json* v = find_key(j, key);
  if (v == nullptr) return fallback;
  const std::string b = v->is_string() ? v->get<std::string>() : "";
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  w.at(key).fail("is ", v->dump(),
                 " (expected \"Removed\", \"Isolated\", \"MergedWithPrevious\", \"MergedWithNext\" or \"Contiguous\")");
}

// NormalizedString::split: the pieces the behaviour keeps, empty ones dropped.
void split_into(const Str& s, const Matches& matches, Behavior b, std::vector<Str>& out) {
  // spans <- (begin, end, remove)
  std::vector<std::tuple<size_t, size_t, bool>> spans;
  switch (b) {
    case Behavior::Isolated:
      for (const auto& [x, y, m] : matches) spans.emplace_back(x, y, false);
      break;
    case Behavior::Removed:
      spans.assign(matches.begin(), matches.end());
      break;
    case Behavior::Contiguous: {
      bool prev = false;
      for (const auto& [x, y, m] : matches) {
        if (m == prev && !spans.empty()) std::get<1>(spans.back()) = y;
        else spans.emplace_back(x, y, false);
        prev = m;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev = false;
      for (const auto& [x, y, m] : matches) {
        if (m && !prev && !spans.empty()) std::get<1>(spans.back()) = y;
        else spans.emplace_back(x, y, false);
        prev = m;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        const auto& [x, y, m] = *it;
        if (m && !prev && !spans.empty()) std::get<0>(spans.back()) = x;
        else spans.emplace_back(x, y, false);
        prev = m;
      }
      std::reverse(spans.begin(), spans.end());
      break;
    }
  }
  for (const auto& [x, y, remove] : spans)
    if (!remove && y > x) out.push_back(s.slice(x, y));
}

// Literal (non-regex) matches of `lit`, leftmost and non-overlapping.
Matches match_literal(const Str& s, const std::u32string& lit) {
  if (s.empty()) return {{0, 0, false}};
  Matches m;
  size_t prev = 0;
  for (size_t at = s.c.find(lit); !lit.empty() && at != std::u32string::npos; at = s.c.find(lit, at + lit.size())) {
    if (prev != at) m.emplace_back(prev, at, false);
    m.emplace_back(at, at + lit.size(), true);
    prev = at + lit.size();
  }
  if (prev != s.size()) m.emplace_back(prev, s.size(), false);
  return m;
}

// A "pattern": {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  std::u32string literal;
  std::unique_ptr<text::Regex> regex;
  Matches find(const Str& s) const { return regex ? match_regex(s, *regex) : match_literal(s, literal); }
};

Pattern parse_pattern(const Json& j, const char* key, const Where& w) {
  const Json& p = get_object(j, key, w);
  const Where pw = w.at(key);
  if (p.size() != 1 || !(p.contains("String") || p.contains("Regex")))
    pw.fail(p.dump(), " (expected {\"String\": \"...\"} or {\"Regex\": \"...\"})");
  Pattern out;
  if (p.contains("String")) {
    out.literal = to_u32(get_string(p, "String", pw));
    if (out.literal.empty()) pw.fail("the String pattern is empty");
  } else {
    out.regex = std::make_unique<text::Regex>(get_string(p, "Regex", pw), pw.file + ": " + pw.path);
  }
  return out;
}

// A "Replace" component (normalizer or decoder): its pattern and content.
template <class T>
std::unique_ptr<T> parse_replace(const Json& j, const Where& w) {
  auto r = std::make_unique<T>();
  r->pattern = parse_pattern(j, "pattern", w);
  r->content = to_u32(get_string(j, "content", w));
  return r;
}

// Sequences nest at most kMaxSequenceDepth deep (the Hub's files nest two or three): a file that
// nests 10,000 deep would otherwise cost memory quadratic in its depth before any other check.
constexpr int kMaxSequenceDepth = 32;

// A "Sequence" component: each element of j[key] parsed by `parse`, in order.
template <class T, class Parse>
std::unique_ptr<T> parse_sequence(const Json& j, const char* key, const Where& w, Parse parse) {
  if (w.depth >= kMaxSequenceDepth)
    w.fail("a Sequence nested more than ", kMaxSequenceDepth, " deep (expected a flat list of steps)");
  auto seq = std::make_unique<T>();
  const Json& a = get_array(j, key, w);
  Where inner = w.at(key);
  inner.depth = w.depth + 1;
  for (size_t i = 0; i < a.size(); ++i) seq->parts.push_back(parse(a[i], inner.index(i)));
  return seq;
}

// NormalizedString::replace: each match replaced by `content`, aligned with the match's start.
void replace_all(Str& s, const Pattern& p, const std::u32string& content) {
  Str out;
  for (const auto& [b, e, m] : p.find(s)) {
    if (!m) {
      out.c.append(s.c, b, e - b), out.at0.append(s.at0, b, e - b);
      continue;
    }
    const char flag = b < s.size() ? s.at0[b] : 0;
    for (char32_t ch : content) out.push(ch, flag);
  }
  s = std::move(out);
}

// ---------------------------------------------------------------------------------------------
// Normalizers

struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(Str& s) const = 0;
};

template <class F>  // F(char32_t, std::u32string& out): the characters one character becomes
void map_chars(Str& s, F f) {
  Str out;
  out.c.reserve(s.size()), out.at0.reserve(s.size());
  std::u32string tmp;
  for (size_t i = 0; i < s.size(); ++i) {
    tmp.clear();
    f(s.c[i], tmp);
    for (char32_t ch : tmp) out.push(ch, s.at0[i]);
  }
  s = std::move(out);
}

void normalize_form(Str& s, text::NormalForm form) {
  size_t lead = 0;  // the leading characters aligned with the input's first (a prepended "▁")
  while (lead < s.size() && s.at0[lead]) ++lead;
  Str out{text::normalize(s.c, form), {}};
  out.at0.assign(out.c.size(), 0);
  for (size_t i = 0; i < lead && i < out.size(); ++i) out.at0[i] = 1;
  s = std::move(out);
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

struct BertNormalizer final : Normalizer {
  bool clean_text = true, chinese = true, strip_accents = true, lowercase = true;
  void apply(Str& s) const override {
    if (clean_text) {
      // drop NUL, U+FFFD and controls (Cc, Cf, Co but \t \n \r); whitespace -> ' '
      map_chars(s, [](char32_t c, std::u32string& o) {
        const bool tnr = c == '\t' || c == '\n' || c == '\r';
        if (c == 0 || c == 0xFFFD || (!tnr && text::is_control_cat(c))) return;  // U+0085 too: it is Cc
        o.push_back(tnr || text::is_white_space(c) ? U' ' : c);
      });
    }
    if (chinese) {
      map_chars(s, [](char32_t c, std::u32string& o) {
        if (is_cjk(c)) o.push_back(' '), o.push_back(c), o.push_back(' ');
        else o.push_back(c);
      });
    }
    if (strip_accents) {
      normalize_form(s, text::NormalForm::NFD);
      map_chars(s, [](char32_t c, std::u32string& o) {
        if (!text::is_mark_nonspacing(c)) o.push_back(c);
      });
    }
    if (lowercase) map_chars(s, [](char32_t c, std::u32string& o) { text::append_lowercase(o, c); });
  }
};

struct Lowercase final : Normalizer {
  void apply(Str& s) const override {
    map_chars(s, [](char32_t c, std::u32string& o) { text::append_lowercase(o, c); });
  }
};

struct StripAccents final : Normalizer {
  void apply(Str& s) const override {
    map_chars(s, [](char32_t c, std::u32string& o) {
      if (!text::is_mark(c)) o.push_back(c);
    });
  }
};

struct UnicodeForm final : Normalizer {
  text::NormalForm form;
  explicit UnicodeForm(text::NormalForm f) : form(f) {}
  void apply(Str& s) const override { normalize_form(s, form); }
};

struct StripNormalizer final : Normalizer {
  bool left = true, right = true;
  void apply(Str& s) const override {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && text::is_white_space(s.c[b])) ++b;
    if (right)
      while (e > b && text::is_white_space(s.c[e - 1])) --e;
    s = s.slice(b, e);
  }
};

struct PrependNormalizer final : Normalizer {
  std::u32string prepend;
  void apply(Str& s) const override {
    if (s.empty()) return;
    Str out;
    for (char32_t c : prepend) out.push(c, s.at0[0]);
    out.c += s.c, out.at0 += s.at0;
    s = std::move(out);
  }
};

struct ReplaceNormalizer final : Normalizer {
  Pattern pattern;
  std::u32string content;
  void apply(Str& s) const override { replace_all(s, pattern, content); }
};

// A "Sequence" of normalizers, pre-tokenizers or decoders: each applied in turn to the same value.
template <class Base, class Value>
struct SequenceOf final : Base {
  std::vector<std::unique_ptr<Base>> parts;
  void apply(Value& v) const override {
    for (const auto& p : parts) p->apply(v);
  }
};
using SequenceNormalizer = SequenceOf<Normalizer, Str>;

std::unique_ptr<Normalizer> parse_normalizer(const Json& j, const Where& w) {
  const std::string type = type_of(j, w);
  if (type == "BertNormalizer") {
    auto n = std::make_unique<BertNormalizer>();
    n->clean_text = get_bool(j, "clean_text", true, w);
    n->chinese = get_bool(j, "handle_chinese_chars", true, w);
    n->lowercase = get_bool(j, "lowercase", true, w);
    n->strip_accents = get_bool(j, "strip_accents", n->lowercase, w);  // null: as lowercase
    return n;
  }
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "NFC") return std::make_unique<UnicodeForm>(text::NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeForm>(text::NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(text::NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(text::NormalForm::NFKD);
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = get_bool(j, "strip_left", true, w);
    n->right = get_bool(j, "strip_right", true, w);
    return n;
  }
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prepend = to_u32(get_string(j, "prepend", w));
    return n;
  }
  if (type == "Replace") return parse_replace<ReplaceNormalizer>(j, w);
  if (type == "Sequence") return parse_sequence<SequenceNormalizer>(j, "normalizers", w, parse_normalizer);
  if (type == "Precompiled")
    w.fail("the \"Precompiled\" normalizer (SentencePiece's compiled character map, as in T5, ALBERT or XLM-R "
           "files) is not supported; qkv reads BertNormalizer, Lowercase, StripAccents, NFC, NFD, NFKC, NFKD, Strip, "
           "Prepend, Replace and Sequence");
  w.fail("unknown normalizer type \"", type,
         "\" (qkv reads BertNormalizer, Lowercase, StripAccents, NFC, NFD, NFKC, NFKD, Strip, Prepend, Replace and "
         "Sequence)");
}

using text::byte_alphabet;

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Str>& pieces) const = 0;
};

template <class F>  // F(const Str&, std::vector<Str>& out)
void each_piece(std::vector<Str>& pieces, F f) {
  std::vector<Str> out;
  for (const Str& p : pieces) f(p, out);
  pieces = std::move(out);
}

// The GPT-2 pattern, as Oniguruma reads it (\s: White_Space).
constexpr char kByteLevelPattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteLevelPre final : PreTokenizer {
  bool add_prefix_space = true, use_regex = true;
  text::Regex re{kByteLevelPattern, "ByteLevel pre-tokenizer"};
  void apply(std::vector<Str>& pieces) const override {
    each_piece(pieces, [&](const Str& p0, std::vector<Str>& out) {
      Str p = p0;
      if (add_prefix_space && (p.empty() || p.c[0] != ' ')) {
        Str q;
        q.push(' ', p.empty() ? 0 : p.at0[0]);
        q.c += p.c, q.at0 += p.at0;
        p = std::move(q);
      }
      std::vector<Str> parts;
      if (use_regex) split_into(p, match_regex(p, re), Behavior::Isolated, parts);
      else if (!p.empty()) parts.push_back(p);
      // each character -> its UTF-8 bytes in the byte alphabet
      for (Str& s : parts) {
        Str b;
        for (size_t i = 0; i < s.size(); ++i) {
          std::string u;
          text::append_utf8(u, s.c[i]);
          for (unsigned char x : u) b.push(byte_alphabet().to_cp[x], s.at0[i]);
        }
        out.push_back(std::move(b));
      }
    });
  }
};

struct MetaspacePre final : PreTokenizer {
  char32_t replacement = U'\u2581';
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool split = true;
  void apply(std::vector<Str>& pieces) const override {
    each_piece(pieces, [&](const Str& p0, std::vector<Str>& out) {
      Str p = p0;
      for (char32_t& c : p.c)
        if (c == ' ') c = replacement;
      const bool add = !(p.size() > 0 && p.c[0] == replacement) &&
                       (prepend == Prepend::Always || (prepend == Prepend::First && p.starts_at0()));
      if (add && !p.empty()) {
        Str q;
        q.push(replacement, p.at0[0]);
        q.c += p.c, q.at0 += p.at0;
        p = std::move(q);
      }
      if (split) {
        const char32_t r = replacement;
        split_into(p, match_chars(p, [r](char32_t c) { return c == r; }), Behavior::MergedWithNext, out);
      } else if (!p.empty()) {
        out.push_back(std::move(p));
      }
    });
  }
};

struct PredicatePre final : PreTokenizer {
  bool (*pred)(char32_t);
  Behavior behavior;
  PredicatePre(bool (*p)(char32_t), Behavior b) : pred(p), behavior(b) {}
  void apply(std::vector<Str>& pieces) const override {
    each_piece(pieces, [&](const Str& p, std::vector<Str>& out) { split_into(p, match_chars(p, pred), behavior, out); });
  }
};

bool bert_ws(char32_t c) { return text::is_white_space(c); }
bool bert_punct(char32_t c) { return text::is_punctuation(c); }
bool numeric(char32_t c) { return text::is_numeric(c); }

struct BertPre final : PreTokenizer {
  void apply(std::vector<Str>& pieces) const override {
    PredicatePre(bert_ws, Behavior::Removed).apply(pieces);
    PredicatePre(bert_punct, Behavior::Isolated).apply(pieces);
  }
};

// Whitespace: the words of \w+|[^\w\s]+ (Rust's regex crate: \w is Alphabetic, M, Nd, Pc,
// Join_Control), everything else removed.
struct WhitespacePre final : PreTokenizer {
  void apply(std::vector<Str>& pieces) const override {
    each_piece(pieces, [&](const Str& p, std::vector<Str>& out) {
      Matches m;
      size_t i = 0;
      // kind: 0 whitespace, 1 word, 2 other
      auto kind = [&](size_t k) { return text::is_regex_word(p.c[k]) ? 1 : text::is_white_space(p.c[k]) ? 0 : 2; };
      if (p.empty()) return;
      while (i < p.size()) {
        const int k = kind(i);
        size_t j = i + 1;
        while (j < p.size() && kind(j) == k) ++j;
        m.emplace_back(i, j, k == 0);  // the pattern's words are kept (Invert), the whitespace between removed
        i = j;
      }
      split_into(p, m, Behavior::Removed, out);
    });
  }
};

struct CharDelimiterPre final : PreTokenizer {
  char32_t delimiter;
  void apply(std::vector<Str>& pieces) const override {
    const char32_t d = delimiter;
    each_piece(pieces, [&](const Str& p, std::vector<Str>& out) {
      split_into(p, match_chars(p, [d](char32_t c) { return c == d; }), Behavior::Removed, out);
    });
  }
};

struct SplitPre final : PreTokenizer {
  Pattern pattern;
  Behavior behavior = Behavior::Isolated;
  bool inverted = false;
  void apply(std::vector<Str>& pieces) const override {
    each_piece(pieces, [&](const Str& p, std::vector<Str>& out) {
      Matches m = pattern.find(p);
      split_into(p, inverted ? invert(std::move(m)) : m, behavior, out);
    });
  }
};

using SequencePre = SequenceOf<PreTokenizer, std::vector<Str>>;

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Json& j, const Where& w) {
  const std::string type = type_of(j, w);
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPre>();
    p->add_prefix_space = get_bool(j, "add_prefix_space", true, w);
    p->use_regex = get_bool(j, "use_regex", true, w);
    get_bool(j, "trim_offsets", true, w);  // offsets only
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePre>();
    p->replacement = get_char(j, "replacement", w, U'\u2581');
    const std::string scheme = get_string(j, "prepend_scheme", w, "always");
    if (scheme == "always") p->prepend = MetaspacePre::Prepend::Always;
    else if (scheme == "first") p->prepend = MetaspacePre::Prepend::First;
    else if (scheme == "never") p->prepend = MetaspacePre::Prepend::Never;
    else w.at("prepend_scheme").fail("is \"", scheme, "\" (expected \"always\", \"first\" or \"never\")");
    if (find_key(j, "add_prefix_space") != nullptr && !get_bool(j, "add_prefix_space", true, w)) {
      if (find_key(j, "prepend_scheme") != nullptr && scheme != "never")
        w.fail("add_prefix_space false does not match prepend_scheme \"", scheme, "\"");
      p->prepend = MetaspacePre::Prepend::Never;
    }
    p->split = get_bool(j, "split", true, w);
    return p;
  }
  if (type == "BertPreTokenizer") return std::make_unique<BertPre>();
  if (type == "Whitespace") return std::make_unique<WhitespacePre>();
  if (type == "WhitespaceSplit") return std::make_unique<PredicatePre>(bert_ws, Behavior::Removed);
  if (type == "Punctuation")
    return std::make_unique<PredicatePre>(bert_punct, parse_behavior(j, "behavior", w, Behavior::Isolated));
  if (type == "Digits")
    return std::make_unique<PredicatePre>(
        numeric, get_bool(j, "individual_digits", false, w) ? Behavior::Isolated : Behavior::Contiguous);
  if (type == "CharDelimiterSplit") {
    auto p = std::make_unique<CharDelimiterPre>();
    p->delimiter = get_char(j, "delimiter", w, 0);
    if (p->delimiter == 0) w.fail("missing \"delimiter\"");
    return p;
  }
  if (type == "Split") {
    auto p = std::make_unique<SplitPre>();
    p->pattern = parse_pattern(j, "pattern", w);
    if (find_key(j, "behavior") == nullptr) w.fail("missing \"behavior\"");
    p->behavior = parse_behavior(j, "behavior", w, Behavior::Isolated);
    p->inverted = get_bool(j, "invert", false, w);
    return p;
  }
  if (type == "Sequence") return parse_sequence<SequencePre>(j, "pretokenizers", w, parse_pre_tokenizer);
  w.fail("unknown pre-tokenizer type \"", type,
         "\" (qkv reads ByteLevel, Metaspace, BertPreTokenizer, Whitespace, WhitespaceSplit, Punctuation, Digits, "
         "CharDelimiterSplit, Split and Sequence)");
}

// ---------------------------------------------------------------------------------------------
// Models

std::string byte_token(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

// Lookups by string_view without building a std::string (C++20 heterogeneous lookup).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Vocab {
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids;
  std::unordered_map<int32_t, std::string> tokens;
  int32_t find(std::string_view t) const {
    const auto it = ids.find(t);
    return it == ids.end() ? -1 : it->second;
  }
  // Byte fallback: appends the ids of the tokens <0xNN> of each byte of `s` and returns true, or
  // appends nothing and returns false when one of them is not in the vocabulary.
  bool append_bytes(const std::string& s, std::vector<int32_t>& out) const {
    const size_t at = out.size();
    for (unsigned char b : s) {
      const int32_t id = find(byte_token(b));
      if (id < 0) {
        out.resize(at);
        return false;
      }
      out.push_back(id);
    }
    return !s.empty();
  }
  int32_t max_id() const {
    int32_t m = -1;
    for (const auto& [id, t] : tokens) m = std::max(m, id);
    return m;
  }
  void add(const std::string& token, int64_t id, const Where& w) {
    if (id < 0 || id >= INT32_MAX) w.fail("token \"", token, "\" has id ", id, " (expected 0 <= id < 2^31 - 1)");
    if (!ids.emplace(token, static_cast<int32_t>(id)).second) w.fail("token \"", token, "\" appears twice");
    if (!tokens.emplace(static_cast<int32_t>(id), token).second)
      w.fail("id ", id, " is used by both \"", tokens[static_cast<int32_t>(id)], "\" and \"", token,
             "\" (expected one token per id)");
  }
};

Vocab parse_vocab_object(const Json& j, const Where& w) {
  const Json& v = get_object(j, "vocab", w);
  Vocab out;
  out.ids.reserve(v.size());
  out.tokens.reserve(v.size());
  const Where vw = w.at("vocab");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_number_integer()) vw.fail("token \"", it.key(), "\" maps to ", it->type_name(), " (expected an integer id)");
    out.add(it.key(), it->get<int64_t>(), vw);
  }
  return out;
}

struct Model {
  Vocab vocab;
  std::string where;  // "FILE: model", for errors while encoding
  virtual ~Model() = default;
  // Appends the ids of one pre-tokenized word (non-empty).
  virtual void tokenize(const std::string& word, std::vector<int32_t>& ids) const = 0;
};

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

struct BpeModel final : Model {
  std::unordered_map<uint64_t, text::BpeMerge> merges;
  std::string unk, prefix, suffix;
  bool has_unk = false, fuse_unk = false, byte_fallback = false, ignore_merges = false;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void tokenize(const std::string& word, std::vector<int32_t>& ids) const override {
    if (ignore_merges) {
      if (const int32_t id = vocab.find(word); id >= 0) {
        ids.push_back(id);
        return;
      }
    }
    const bool cacheable = word.size() < 256;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex);
      if (const auto it = cache.find(word); it != cache.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> out = merge_word(word);
    ids.insert(ids.end(), out.begin(), out.end());
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex);
      if (cache.size() >= (1u << 16)) cache.clear();
      cache.emplace(word, std::move(out));
    }
  }

  std::vector<int32_t> merge_word(const std::string& w) const {
    // symbols <- each character's token (with the continuing prefix after the first, the
    // end-of-word suffix on the last), its bytes' <0xNN> tokens, or the unknown token (runs of
    // unknown characters fused into one when fuse_unk)
    std::vector<int32_t> sym;
    int32_t pending_unk = -1;
    const std::vector<size_t> at = text::char_starts(w);
    const size_t n = at.size() - 1;
    const int32_t unk_id = has_unk ? vocab.find(unk) : -1;
    for (size_t i = 0; i < n; ++i) {
      std::string s = w.substr(at[i], at[i + 1] - at[i]);
      if (i > 0 && !prefix.empty()) s = prefix + s;
      if (i + 1 == n && !suffix.empty()) s += suffix;
      if (const int32_t id = vocab.find(s); id >= 0) {
        if (pending_unk >= 0) sym.push_back(pending_unk), pending_unk = -1;
        sym.push_back(id);
        continue;
      }
      if (byte_fallback && vocab.append_bytes(s, sym)) continue;
      if (has_unk) {
        check(unk_id >= 0, where, ": the unknown token \"", unk, "\" is not in the vocabulary (a character needs it)");
        if (pending_unk >= 0 && !fuse_unk) sym.push_back(pending_unk);
        pending_unk = unk_id;
      }
      // without an unknown token the character is dropped, as the Rust library does
    }
    if (pending_unk >= 0) sym.push_back(pending_unk);

    return text::bpe_merge(sym, text::BpeOrder::OneByOne, [&](int32_t a, int32_t b) -> const text::BpeMerge* {
      const auto it = merges.find(pair_key(a, b));
      return it == merges.end() ? nullptr : &it->second;
    });
  }
};

std::unique_ptr<Model> parse_bpe(const Json& j, const Where& w) {
  auto m = std::make_unique<BpeModel>();
  m->vocab = parse_vocab_object(j, w);
  if (const Json* d = find_key(j, "dropout"); d != nullptr && !(d->is_number() && d->get<double>() == 0.0))
    w.at("dropout").fail("is ", d->dump(), " (BPE dropout makes encoding random; expected null or 0)");
  if (find_key(j, "unk_token") != nullptr) m->unk = get_string(j, "unk_token", w), m->has_unk = true;
  m->prefix = get_string(j, "continuing_subword_prefix", w, "");
  m->suffix = get_string(j, "end_of_word_suffix", w, "");
  m->fuse_unk = get_bool(j, "fuse_unk", false, w);
  m->byte_fallback = get_bool(j, "byte_fallback", false, w);
  m->ignore_merges = get_bool(j, "ignore_merges", false, w);
  const Json& merges = get_array(j, "merges", w);
  const Where mw = w.at("merges");
  m->merges.reserve(merges.size());
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    // a merge is "a b" (split at its spaces: exactly two parts) or ["a", "b"]
    std::string_view a, b;
    const Json& e = merges[r];
    if (e.is_string()) {
      const std::string_view line = e.get_ref<const std::string&>();
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        mw.index(r).fail("\"", line, "\" (expected two tokens separated by one space)");
      a = line.substr(0, sp), b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get_ref<const std::string&>(), b = e[1].get_ref<const std::string&>();
    } else {
      mw.index(r).fail(e.dump(), " (expected \"a b\" or [\"a\", \"b\"])");
    }
    const int32_t ia = m->vocab.find(a), ib = m->vocab.find(b);
    if (ia < 0) mw.index(r).fail("\"", a, "\" is not in the vocabulary");
    if (ib < 0) mw.index(r).fail("\"", b, "\" is not in the vocabulary");
    // the merged token: a + b without b's continuing prefix
    const size_t cut = std::min(m->prefix.size(), b.size());
    joined.assign(a).append(b.substr(cut));
    const int32_t ij = m->vocab.find(joined);
    if (ij < 0) mw.index(r).fail("the merged token \"", joined, "\" is not in the vocabulary");
    m->merges[pair_key(ia, ib)] = {static_cast<int32_t>(r), ij};  // a later duplicate wins
  }
  return m;
}

struct WordPieceModel final : Model {
  std::string unk = "[UNK]", prefix = "##";
  size_t max_chars = 100;
  void tokenize(const std::string& word, std::vector<int32_t>& ids) const override {
    const std::vector<size_t> at = text::char_starts(word);
    const size_t n = at.size() - 1;
    const int32_t unk_id = vocab.find(unk);
    auto unknown = [&] {
      check(unk_id >= 0, where, ": the unknown token \"", unk, "\" is not in the vocabulary (a word needs it)");
      ids.push_back(unk_id);
    };
    if (n > max_chars) return unknown();
    // greedy longest match first, "##" before every piece but the first
    std::vector<int32_t> sub;
    for (size_t start = 0; start < n;) {
      size_t end = n;
      int32_t found = -1;
      for (; end > start; --end) {
        std::string s = word.substr(at[start], at[end] - at[start]);
        if (start > 0) s = prefix + s;
        if ((found = vocab.find(s)) >= 0) break;
      }
      if (found < 0) return unknown();
      sub.push_back(found);
      start = end;
    }
    ids.insert(ids.end(), sub.begin(), sub.end());
  }
};

std::unique_ptr<Model> parse_wordpiece(const Json& j, const Where& w) {
  auto m = std::make_unique<WordPieceModel>();
  m->vocab = parse_vocab_object(j, w);
  m->unk = get_string(j, "unk_token", w, "[UNK]");
  m->prefix = get_string(j, "continuing_subword_prefix", w, "##");
  m->max_chars = static_cast<size_t>(get_int(j, "max_input_chars_per_word", w, 0, INT32_MAX, 100));
  return m;
}

struct WordLevelModel final : Model {
  std::string unk = "<unk>";
  void tokenize(const std::string& word, std::vector<int32_t>& ids) const override {
    int32_t id = vocab.find(word);
    if (id < 0) id = vocab.find(unk);
    check(id >= 0, where, ": the unknown token \"", unk, "\" is not in the vocabulary (a word needs it)");
    ids.push_back(id);
  }
};

std::unique_ptr<Model> parse_wordlevel(const Json& j, const Where& w) {
  auto m = std::make_unique<WordLevelModel>();
  m->vocab = parse_vocab_object(j, w);
  m->unk = get_string(j, "unk_token", w, "<unk>");
  return m;
}

struct UnigramModel final : Model {
  std::vector<double> score;  // by id
  int32_t unk_id = -1;
  bool byte_fallback = false;
  double min_score = 0;
  // a byte trie over the pieces: child (node, byte) -> node; the id of the piece ending at a node
  std::unordered_map<uint64_t, int32_t> child;
  std::vector<int32_t> terminal{-1};

  void insert(const std::string& piece, int32_t id) {
    int32_t node = 0;
    for (unsigned char b : piece) {
      const uint64_t k = (static_cast<uint64_t>(node) << 8) | b;
      auto it = child.find(k);
      if (it == child.end()) {
        it = child.emplace(k, static_cast<int32_t>(terminal.size())).first;
        terminal.push_back(-1);
      }
      node = it->second;
    }
    terminal[static_cast<size_t>(node)] = id;
  }

  void tokenize(const std::string& s, std::vector<int32_t>& ids) const override {
    // Viterbi over byte positions; a character no piece starts with gets the unknown token at
    // min_score - 10
    struct Best {
      int32_t id = -1;
      double score = 0;
      int64_t from = -1;
    };
    const size_t n = s.size();
    std::vector<Best> best(n + 1);
    const double unk_score = min_score - 10.0;
    for (size_t at = 0; at < n;) {
      const double here = best[at].score;
      const auto c = static_cast<unsigned char>(s[at]);
      const size_t mblen = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
      bool single = false;
      int32_t node = 0;
      for (size_t k = at; k < n; ++k) {
        const auto it = child.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[k]));
        if (it == child.end()) break;
        node = it->second;
        const int32_t id = terminal[static_cast<size_t>(node)];
        if (id < 0) continue;
        Best& t = best[k + 1];
        const double cand = here + score[static_cast<size_t>(id)];
        if (t.from < 0 || cand > t.score) t = {id, cand, static_cast<int64_t>(at)};
        if (k + 1 - at == mblen) single = true;
      }
      if (!single) {
        check(unk_id >= 0, where, ": a character has no piece and the model has no unk_id");
        Best& t = best[at + mblen];
        const double cand = here + unk_score;
        if (t.from < 0 || cand > t.score) t = {unk_id, cand, static_cast<int64_t>(at)};
      }
      at += mblen;
    }
    // back from the end; runs of unknown pieces fused into one string
    std::vector<std::pair<std::string, int32_t>> pieces;  // reversed
    std::string unk_run;
    for (size_t end = n; end > 0;) {
      const Best& b = best[end];
      const auto from = static_cast<size_t>(b.from);
      if (b.id == unk_id) {
        unk_run.insert(0, s.substr(from, end - from));
      } else {
        if (!unk_run.empty()) pieces.emplace_back(std::move(unk_run), -1), unk_run.clear();
        pieces.emplace_back(std::string(), b.id);
      }
      end = from;
    }
    if (!unk_run.empty()) pieces.emplace_back(std::move(unk_run), -1);
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
      if (it->second >= 0) {
        ids.push_back(it->second);
        continue;
      }
      // an unknown run: the piece if the fused string is one, its bytes with byte_fallback, else unk
      if (const int32_t id = vocab.find(it->first); id >= 0) {
        ids.push_back(id);
        continue;
      }
      if (byte_fallback && vocab.append_bytes(it->first, ids)) continue;
      ids.push_back(unk_id);
    }
  }
};

std::unique_ptr<Model> parse_unigram(const Json& j, const Where& w) {
  auto m = std::make_unique<UnigramModel>();
  const Json& v = get_array(j, "vocab", w);
  const Where vw = w.at("vocab");
  if (v.empty()) vw.fail("is empty");
  m->min_score = 1e300;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& e = v[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      vw.index(i).fail(e.dump().substr(0, 80), " (expected [\"piece\", score])");
    const std::string piece = e[0].get<std::string>();
    const double sc = e[1].get<double>();
    if (!std::isfinite(sc)) vw.index(i).fail("score is not finite");
    m->vocab.add(piece, static_cast<int64_t>(i), vw.index(i));
    m->score.push_back(sc);
    m->min_score = std::min(m->min_score, sc);
    if (!piece.empty()) m->insert(piece, static_cast<int32_t>(i));
  }
  const int64_t unk = get_int(j, "unk_id", w, 0, static_cast<int64_t>(v.size()) - 1, -1);
  m->unk_id = static_cast<int32_t>(unk);
  m->byte_fallback = get_bool(j, "byte_fallback", false, w);
  return m;
}

std::unique_ptr<Model> parse_model(const Json& j, const Where& w) {
  const std::string type = type_of(j, w);
  std::unique_ptr<Model> m;
  if (type == "BPE") m = parse_bpe(j, w);
  if (type == "WordPiece") m = parse_wordpiece(j, w);
  if (type == "Unigram") m = parse_unigram(j, w);
  if (type == "WordLevel") m = parse_wordlevel(j, w);
  if (m) {
    m->where = w.file + ": " + w.path;
    return m;
  }
  w.fail("unknown model type \"", type, "\" (qkv reads BPE, WordPiece, Unigram and WordLevel)");
}

// ---------------------------------------------------------------------------------------------
// Post-processors: what encode(..., add_special_tokens=True) puts around one sequence

struct PostProcessor {
  // The template for a single sequence: -1 stands for the sequence itself.
  std::vector<int32_t> single;
  std::vector<int32_t> apply(const std::vector<int32_t>& ids) const {
    std::vector<int32_t> out;
    for (int32_t t : single) {
      if (t == -1) out.insert(out.end(), ids.begin(), ids.end());
      else out.push_back(t);
    }
    return out;
  }
  void chain(const PostProcessor& next) {
    std::vector<int32_t> s;
    for (int32_t t : next.single) {
      if (t == -1) s.insert(s.end(), single.begin(), single.end());
      else s.push_back(t);
    }
    single = std::move(s);
  }
};

// ["[SEP]", 102] as in BertProcessing's "sep" and "cls".
int32_t token_pair_id(const Json& j, const char* key, const Where& w) {
  const Json* v = find_key(j, key);
  if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[0].is_string() || !(*v)[1].is_number_integer() ||
      (*v)[1].get<int64_t>() < 0 || (*v)[1].get<int64_t>() >= INT32_MAX)
    w.at(key).fail(v ? v->dump() : std::string("missing"), " (expected [\"token\", id])");
  return static_cast<int32_t>((*v)[1].get<int64_t>());
}

PostProcessor parse_post(const Json& j, const Where& w) {
  const std::string type = type_of(j, w);
  PostProcessor p;
  if (type == "ByteLevel") {
    p.single = {-1};
  } else if (type == "BertProcessing") {
    p.single = {token_pair_id(j, "cls", w), -1, token_pair_id(j, "sep", w)};
  } else if (type == "RobertaProcessing") {
    p.single = {token_pair_id(j, "cls", w), -1, token_pair_id(j, "sep", w)};
  } else if (type == "TemplateProcessing") {
    // special_tokens: name -> {"id": name, "ids": [...], "tokens": [...]}
    const Json& specials = get_object(j, "special_tokens", w);
    std::map<std::string, std::vector<int32_t>> ids_of;
    for (auto it = specials.begin(); it != specials.end(); ++it) {
      const Where sw = w.at("special_tokens").at(it.key());
      const Json& ids = get_array(*it, "ids", sw);
      std::vector<int32_t> v;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 || ids[i].get<int64_t>() >= INT32_MAX)
          sw.at("ids").index(i).fail(ids[i].dump(), " (expected a token id)");
        v.push_back(static_cast<int32_t>(ids[i].get<int64_t>()));
      }
      ids_of[it.key()] = std::move(v);
    }
    auto parse_template = [&](const char* key, bool pair) {
      const Json& t = get_array(j, key, w);
      std::vector<int32_t> out;
      for (size_t i = 0; i < t.size(); ++i) {
        const Where iw = w.at(key).index(i);
        const Json& item = t[i];
        if (item.is_object() && item.contains("Sequence")) {
          const std::string id = get_string(get_object(item, "Sequence", iw), "id", iw.at("Sequence"));
          if (id != "A" && id != "B") iw.fail("sequence id \"", id, "\" (expected \"A\" or \"B\")");
          if (id == "B" && !pair) iw.fail("the single-sequence template names sequence B");
          if (id == "A") out.push_back(-1);
        } else if (item.is_object() && item.contains("SpecialToken")) {
          const std::string id = get_string(get_object(item, "SpecialToken", iw), "id", iw.at("SpecialToken"));
          const auto f = ids_of.find(id);
          if (f == ids_of.end()) iw.fail("special token \"", id, "\" is not in special_tokens");
          out.insert(out.end(), f->second.begin(), f->second.end());
        } else {
          iw.fail(item.dump(), " (expected {\"Sequence\": ...} or {\"SpecialToken\": ...})");
        }
      }
      return out;
    };
    p.single = parse_template("single", false);
    if (find_key(j, "pair") != nullptr) parse_template("pair", true);  // checked, not used
  } else if (type == "Sequence") {
    const Json& a = get_array(j, "processors", w);
    p.single = {-1};
    for (size_t i = 0; i < a.size(); ++i) p.chain(parse_post(a[i], w.at("processors").index(i)));
  } else {
    w.fail("unknown post-processor type \"", type,
           "\" (qkv reads TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel and Sequence)");
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Decoders: tokens -> strings, chained; the final strings are joined

struct Decoder {
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& t) const = 0;
};

struct ByteLevelDecoder final : Decoder {
  void apply(std::vector<std::string>& t) const override {
    // each token's characters back to bytes (a token with a character outside the alphabet
    // stays as its UTF-8), then invalid UTF-8 -> U+FFFD
    std::string bytes;
    for (const std::string& tok : t) {
      const std::u32string c = to_u32(tok);
      std::string b;
      bool all = true;
      for (char32_t ch : c) {
        const int byte = byte_alphabet().to_byte(ch);
        if (byte < 0) {
          all = false;
          break;
        }
        b += static_cast<char>(byte);
      }
      bytes += all ? b : tok;
    }
    t = {utf8_replace_invalid(bytes)};
  }
};

struct MetaspaceDecoder final : Decoder {
  char32_t replacement = U'\u2581';
  bool prepend = true;  // prepend_scheme is not "never"
  void apply(std::vector<std::string>& t) const override {
    for (size_t i = 0; i < t.size(); ++i) {
      std::u32string out;
      for (char32_t c : to_u32(t[i])) {
        if (c != replacement) out.push_back(c);
        else if (!(i == 0 && prepend)) out.push_back(' ');
      }
      t[i] = to_utf8(out);
    }
  }
};

// transformers' clean_up_tokenization, also the WordPiece decoder's "cleanup".
std::string cleanup(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},         {" !", "!"},   {" ,", ","},   {" ' ", "'"},   {" n't", "n't"},
      {" 'm", "'m"},   {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    const std::string f = from, r = to;
    std::string out;
    size_t at = 0;
    for (size_t k = s.find(f); k != std::string::npos; k = s.find(f, at)) {
      out.append(s, at, k - at).append(r);
      at = k + f.size();
    }
    out.append(s, at, std::string::npos);
    s = std::move(out);
  }
  return s;
}

struct WordPieceDecoder final : Decoder {
  std::string prefix = "##";
  bool clean = true;
  void apply(std::vector<std::string>& t) const override {
    for (size_t i = 0; i < t.size(); ++i) {
      if (i != 0) {
        if (t[i].rfind(prefix, 0) == 0) t[i] = t[i].substr(prefix.size());
        else t[i] = " " + t[i];
      }
      if (clean) t[i] = cleanup(t[i]);
    }
  }
};

struct BpeDecoder final : Decoder {
  std::string suffix = "</w>";
  void apply(std::vector<std::string>& t) const override {
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string rep = i + 1 == t.size() ? "" : " ";
      std::string out;
      size_t at = 0;
      for (size_t k = suffix.empty() ? std::string::npos : t[i].find(suffix); k != std::string::npos;
           k = t[i].find(suffix, at)) {
        out.append(t[i], at, k - at).append(rep);
        at = k + suffix.size();
      }
      out.append(t[i], at, std::string::npos);
      t[i] = std::move(out);
    }
  }
};

// "<0xNN>" -> the byte, as Rust's u8::from_str_radix(&token[3..5], 16) reads it.
int byte_of(const std::string& tok) {
  if (tok.size() != 6 || tok.compare(0, 3, "<0x") != 0 || tok[5] != '>') return -1;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  if (tok[3] == '+') return hex(tok[4]);
  const int hi = hex(tok[3]), lo = hex(tok[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

struct ByteFallbackDecoder final : Decoder {
  void apply(std::vector<std::string>& t) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (invalid_utf8_offset(pending) < 0) out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (std::string& tok : t) {
      const int b = byte_of(tok);
      if (b >= 0) {
        pending += static_cast<char>(b);
        continue;
      }
      flush();
      out.push_back(std::move(tok));
    }
    flush();
    t = std::move(out);
  }
};

struct FuseDecoder final : Decoder {
  void apply(std::vector<std::string>& t) const override {
    std::string all;
    for (const std::string& s : t) all += s;
    t = {all};
  }
};

struct StripDecoder final : Decoder {
  char32_t content = ' ';
  size_t start = 0, stop = 0;
  void apply(std::vector<std::string>& t) const override {
    for (std::string& tok : t) {
      const std::u32string c = to_u32(tok);
      size_t b = 0, e = c.size();
      for (size_t i = 0; i < start && i < c.size() && c[i] == content; ++i) b = i + 1;
      for (size_t i = 0; i < stop && i < c.size() && c[c.size() - 1 - i] == content; ++i) e = c.size() - 1 - i;
      tok = b < e ? to_utf8(c.substr(b, e - b)) : std::string();
    }
  }
};

struct ReplaceDecoder final : Decoder {
  Pattern pattern;
  std::u32string content;
  void apply(std::vector<std::string>& t) const override {
    for (std::string& tok : t) {
      Str s = input_str(tok);
      replace_all(s, pattern, content);
      tok = s.utf8();
    }
  }
};

using SequenceDecoder = SequenceOf<Decoder, std::vector<std::string>>;

std::unique_ptr<Decoder> parse_decoder(const Json& j, const Where& w) {
  const std::string type = type_of(j, w);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = get_char(j, "replacement", w, U'\u2581');
    const std::string scheme = get_string(j, "prepend_scheme", w, "always");
    if (scheme != "always" && scheme != "first" && scheme != "never")
      w.at("prepend_scheme").fail("is \"", scheme, "\" (expected \"always\", \"first\" or \"never\")");
    d->prepend = scheme != "never" && get_bool(j, "add_prefix_space", true, w);
    return d;
  }
  if (type == "WordPiece") {
    auto d = std::make_unique<WordPieceDecoder>();
    d->prefix = get_string(j, "prefix", w, "##");
    d->clean = get_bool(j, "cleanup", true, w);
    return d;
  }
  if (type == "BPEDecoder") {
    auto d = std::make_unique<BpeDecoder>();
    d->suffix = get_string(j, "suffix", w, "</w>");
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    d->content = get_char(j, "content", w, ' ');
    d->start = static_cast<size_t>(get_int(j, "start", w, 0, 1 << 20, 0));
    d->stop = static_cast<size_t>(get_int(j, "stop", w, 0, 1 << 20, 0));
    return d;
  }
  if (type == "Replace") return parse_replace<ReplaceDecoder>(j, w);
  if (type == "Sequence") return parse_sequence<SequenceDecoder>(j, "decoders", w, parse_decoder);
  w.fail("unknown decoder type \"", type,
         "\" (qkv reads ByteLevel, Metaspace, WordPiece, BPEDecoder, ByteFallback, Fuse, Strip, Replace and Sequence)");
}

// ---------------------------------------------------------------------------------------------
// Added tokens

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Leftmost-longest matching of a set of strings, over characters.
class AddedMatcher {
 public:
  void add(const std::u32string& s, int32_t token) {
    int32_t node = 0;
    for (char32_t c : s) {
      const uint64_t k = (static_cast<uint64_t>(node) << 32) | c;
      auto it = child_.find(k);
      if (it == child_.end()) {
        it = child_.emplace(k, static_cast<int32_t>(end_.size())).first;
        end_.push_back(-1);
      }
      node = it->second;
    }
    end_[static_cast<size_t>(node)] = token;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // (begin, end, token) for each match, leftmost-longest, non-overlapping
  std::vector<std::tuple<size_t, size_t, int32_t>> find(const std::u32string& s) const {
    std::vector<std::tuple<size_t, size_t, int32_t>> out;
    for (size_t i = 0; i < s.size();) {
      int32_t node = 0, tok = -1;
      size_t best = 0;
      for (size_t k = i; k < s.size(); ++k) {
        const auto it = child_.find((static_cast<uint64_t>(node) << 32) | s[k]);
        if (it == child_.end()) break;
        node = it->second;
        if (end_[static_cast<size_t>(node)] >= 0) tok = end_[static_cast<size_t>(node)], best = k + 1;
      }
      if (tok >= 0) {
        out.emplace_back(i, best, tok);
        i = best;
      } else {
        ++i;
      }
    }
    return out;
  }

 private:
  std::unordered_map<uint64_t, int32_t> child_;
  std::vector<int32_t> end_{-1};
  bool empty_ = true;
};

// ---------------------------------------------------------------------------------------------
// The tokenizer

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const std::string& json_bytes, const std::string& name, const std::string& config_bytes,
              const std::string& config_name)
      : json_(json_bytes), config_(config_bytes), name_(name) {
    const Json j = detail::parse_json_object(json_bytes, name);
    const Where w{name_, ""};
    if (const Json* v = find_key(j, "version"); v != nullptr && !(v->is_string() && v->get<std::string>() == "1.0"))
      w.at("version").fail("is ", v->dump(), " (expected \"1.0\")");
    if (find_key(j, "model") == nullptr) w.fail("missing \"model\" (expected a Hugging Face tokenizer.json)");
    model_ = parse_model(j["model"], w.at("model"));
    if (const Json* n = find_key(j, "normalizer")) normalizer_ = parse_normalizer(*n, w.at("normalizer"));
    if (const Json* p = find_key(j, "pre_tokenizer")) pre_ = parse_pre_tokenizer(*p, w.at("pre_tokenizer"));
    if (const Json* p = find_key(j, "post_processor")) post_ = parse_post(*p, w.at("post_processor"));
    else post_.single = {-1};
    if (const Json* d = find_key(j, "decoder")) decoder_ = parse_decoder(*d, w.at("decoder"));
    read_added(j, w);
    vocab_size_ = static_cast<int64_t>(std::max(model_->vocab.max_id(), max_added_)) + 1;
    for (int32_t t : post_.single)
      if (t >= vocab_size_) w.at("post_processor").fail("special token id ", t, " is outside the vocabulary (", vocab_size_, ")");
    read_config(config_name);
  }

  std::string type() const override { return "hf"; }
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t pad_id() const override { return pad_; }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t mask_id() const override { return mask_; }

  std::vector<int32_t> encode(std::string_view input) const override {
    check_utf8(input, name_ + ": text to encode");
    std::vector<int32_t> ids;
    std::vector<Str> sections;
    split_added(input_str(input), raw_, raw_matcher_, ids, [&](Str s) {
      if (normalizer_) normalizer_->apply(s);
      split_added(std::move(s), normed_, normed_matcher_, ids, [&](Str t) {
        std::vector<Str> words{std::move(t)};
        if (pre_) pre_->apply(words);
        for (const Str& word : words)
          if (!word.empty()) model_->tokenize(word.utf8(), ids);
      });
    });
    return ids;
  }

  std::vector<int32_t> with_special_tokens(const std::vector<int32_t>& ids) const override { return post_.apply(ids); }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<std::string> tokens;
    for (size_t i = 0; i < ids.size(); ++i) {
      check(ids[i] >= 0 && ids[i] < vocab_size_, name_, ": decode: id ", ids[i], " at position ", i,
            " is outside [0, ", vocab_size_, ")");
      const std::string* t = token(ids[i]);
      if (t == nullptr || special_.count(*t)) continue;  // a hole in the ids, or a special token
      tokens.push_back(*t);
    }
    std::string out;
    if (decoder_) {
      decoder_->apply(tokens);
      for (const std::string& s : tokens) out += s;
    } else {
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    }
    return clean_up_spaces_ ? cleanup(out) : out;
  }

  std::string piece(int32_t id) const override {
    check(id >= 0 && id < vocab_size_, name_, ": piece id ", id, " is outside [0, ", vocab_size_, ")");
    const std::string* t = token(id);
    return t != nullptr ? *t : "<unused " + std::to_string(id) + ">";
  }

  std::vector<std::string> save_hf(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    write_file_atomic((d / "tokenizer.json").string(), json_);
    write_file_atomic((d / "tokenizer_config.json").string(),
                      config_.empty() ? text::hf_tokenizer_config(*this) : config_);
    return {"tokenizer.json", "tokenizer_config.json"};
  }

  void save(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    write_file_atomic((d / "tokenizer.json").string(), json_);
    Json q = {{"type", "hf"}, {"file", "tokenizer.json"}};
    if (!config_.empty()) {
      write_file_atomic((d / "tokenizer_config.json").string(), config_);
      q["config"] = "tokenizer_config.json";
    }
    write_file_atomic((d / kTokenizerFile).string(), q.dump(2) + "\n");
  }

 private:
  const std::string* token(int32_t id) const {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return &it->second->content;
    if (const auto it = model_->vocab.tokens.find(id); it != model_->vocab.tokens.end()) return &it->second;
    return nullptr;
  }

  void read_added(const Json& j, const Where& w) {
    const Json* a = find_key(j, "added_tokens");
    if (a == nullptr) return;
    const Where aw = w.at("added_tokens");
    if (!a->is_array()) aw.fail("is ", a->type_name(), " (expected an array)");
    // ids as the Rust library gives them: the model's id when the model has the token, else the
    // next id after the model's vocabulary (and after the added tokens so far)
    int32_t next = static_cast<int32_t>(model_->vocab.ids.size());
    for (size_t i = 0; i < a->size(); ++i) {
      const Json& e = (*a)[i];
      const Where ew = aw.index(i);
      if (!e.is_object()) ew.fail("is ", e.type_name(), " (expected an object)");
      AddedToken t;
      t.content = get_string(e, "content", ew);
      const int64_t given = get_int(e, "id", ew, 0, INT32_MAX - 1, -1);
      if (given < 0) ew.fail("missing \"id\"");
      t.single_word = get_bool(e, "single_word", false, ew);
      t.lstrip = get_bool(e, "lstrip", false, ew);
      t.rstrip = get_bool(e, "rstrip", false, ew);
      t.special = get_bool(e, "special", false, ew);
      t.normalized = get_bool(e, "normalized", !t.special, ew);
      if (t.content.empty()) continue;  // ignored, as the Rust library does
      int32_t id = -1;
      if (const auto it = added_by_content_.find(t.content); it != added_by_content_.end()) id = it->second;
      else if ((id = model_->vocab.find(t.content)) < 0) id = next++;
      if (id != given)
        ew.fail("\"", t.content, "\" has id ", given, ", but the Rust library gives it id ", id,
                " (the model's id for a token it has, else the next id after the vocabulary)");
      t.id = id;
      added_.push_back(t);
      added_by_content_[t.content] = id;
      max_added_ = std::max(max_added_, id);
      if (id >= next) next = id + 1;
      if (t.special) special_.insert(t.content);
    }
    for (const AddedToken& t : added_) added_by_id_[t.id] = &t;
    for (size_t i = 0; i < added_.size(); ++i) {
      const AddedToken& t = added_[i];
      if (!t.normalized) {
        raw_matcher_.add(to_u32(t.content), static_cast<int32_t>(i));
        continue;
      }
      // a normalized token is matched in the normalized text, spelled as the normalizer spells it
      Str s = input_str(t.content);
      if (normalizer_) normalizer_->apply(s);
      if (!s.empty()) normed_matcher_.add(s.c, static_cast<int32_t>(i));
    }
    raw_ = &added_;
    normed_ = &added_;
  }

  // Splits `s` at the added tokens `m` finds (AddedVocabulary::find_matches: single_word,
  // lstrip, rstrip); the ids of matched tokens go to `ids`, the text between to `rest`, in order.
  template <class F>
  void split_added(Str s, const std::vector<AddedToken>* tokens, const AddedMatcher& m, std::vector<int32_t>& ids,
                   F&& rest) const {
    if (s.empty()) return;
    if (m.empty()) return rest(std::move(s));
    size_t from = 0;
    for (auto [b, e, k] : m.find(s.c)) {
      const AddedToken& t = (*tokens)[static_cast<size_t>(k)];
      if (t.single_word) {
        const bool left_ok = b == 0 || !text::is_regex_word(s.c[b - 1]);
        const bool right_ok = e == s.size() || !text::is_regex_word(s.c[e]);
        if (!left_ok || !right_ok) continue;
      }
      if (t.lstrip) {
        size_t nb = b;
        while (nb > 0 && text::is_white_space(s.c[nb - 1])) --nb;
        b = std::max(nb, from);
      }
      if (t.rstrip)
        while (e < s.size() && text::is_white_space(s.c[e])) ++e;
      if (from < b) rest(s.slice(from, b));
      ids.push_back(t.id);
      from = e;
    }
    if (from < s.size()) rest(s.slice(from, s.size()));
  }

  void read_config(const std::string& config_name) {
    // the special tokens the commands need, from tokenizer_config.json (a string, or an object
    // with "content"), else the usual spellings among the special added tokens
    Json c = Json::object();
    if (!config_.empty()) c = detail::parse_json_object(config_, config_name);
    const Where w{config_name, ""};
    auto named = [&](const char* key, std::initializer_list<const char*> usual) -> int32_t {
      if (const Json* v = find_key(c, key)) {
        std::string s;
        if (v->is_string()) s = v->get<std::string>();
        else if (v->is_object() && v->contains("content") && (*v)["content"].is_string()) s = (*v)["content"].get<std::string>();
        else w.at(key).fail("is ", v->dump(), " (expected a token string or {\"content\": ...})");
        const int32_t id = token_id(s);
        if (id < 0) w.at(key).fail("\"", s, "\" is not a token of ", name_);
        return id;
      }
      for (const char* u : usual)
        if (const int32_t id = token_id(u); id >= 0) return id;
      return -1;
    };
    pad_ = named("pad_token", {"<pad>", "[PAD]", "<|padding|>"});
    bos_ = named("bos_token", {"<s>", "<|begin_of_text|>", "<|startoftext|>"});
    eos_ = named("eos_token", {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>"});
    mask_ = named("mask_token", {"[MASK]", "<mask>"});
    const int32_t cls = named("cls_token", {"[CLS]"}), sep = named("sep_token", {"[SEP]"});
    if (bos_ < 0) bos_ = cls;  // BERT: [CLS] starts, [SEP] ends
    if (eos_ < 0) eos_ = sep;
    clean_up_spaces_ = get_bool(c, "clean_up_tokenization_spaces", false, w);
  }

 public:
  int32_t token_id(const std::string& t) const {
    if (const auto it = added_by_content_.find(t); it != added_by_content_.end()) return it->second;
    return model_->vocab.find(t);
  }

 private:
  std::string json_, config_, name_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_;
  PostProcessor post_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  const std::vector<AddedToken>* raw_ = nullptr;
  const std::vector<AddedToken>* normed_ = nullptr;
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  std::unordered_set<std::string> special_;
  AddedMatcher raw_matcher_, normed_matcher_;
  int32_t max_added_ = -1;
  int64_t vocab_size_ = 0;
  int32_t pad_ = -1, bos_ = -1, eos_ = -1, mask_ = -1;
  bool clean_up_spaces_ = false;
};

}  // namespace

namespace text {

Json hf_added_token(int32_t id, const std::string& content, bool special) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", !special}, {"special", special}};
}

std::string hf_tokenizer_config(const Tokenizer& tok) {
  Json c = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"clean_up_tokenization_spaces", false}};
  const auto name = [&](const char* key, int32_t id) {
    if (id >= 0) c[key] = tok.piece(id);
  };
  name("bos_token", tok.bos_id());
  name("eos_token", tok.eos_id());
  name("pad_token", tok.pad_id());
  name("mask_token", tok.mask_id());
  return c.dump(2) + "\n";
}

std::string hf_tokenizer_file(Json model, Json added, Json normalizer, Json pre, Json decoder, Json post) {
  const Json j = {{"version", "1.0"},       {"truncation", nullptr}, {"padding", nullptr},
                  {"added_tokens", added},  {"normalizer", normalizer}, {"pre_tokenizer", pre},
                  {"post_processor", post}, {"decoder", decoder},     {"model", model}};
  return j.dump(-1, ' ', false) + "\n";
}

bool hf_sources_end_with_eos(const std::string& dir, const Tokenizer& tok) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  if (!tok.with_special_tokens({}).empty() || !std::filesystem::is_regular_file(path)) return false;
  check(tok.eos_id() >= 0, path, ": the tokenizer has no end-of-sequence token for a translator's sources to end with");
  Json j = detail::parse_json_object(read_file(path, "tokenizer.json"), path);
  const std::string eos = tok.piece(tok.eos_id());
  const Json seq = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, seq_b = {{"Sequence", {{"id", "B"}, {"type_id", 0}}}};
  const Json end = {{"SpecialToken", {{"id", eos}, {"type_id", 0}}}};
  const Json templ = {{"type", "TemplateProcessing"},
                      {"single", {seq, end}},
                      {"pair", {seq, seq_b, end}},
                      {"special_tokens", {{eos, {{"id", eos}, {"ids", {tok.eos_id()}}, {"tokens", {eos}}}}}}};
  j["post_processor"] = templ;  // (in place of a language model's, e.g. GPT-2's <|endoftext|> first)
  write_file_atomic(path, j.dump(-1, ' ', false) + "\n");
  return true;
}

}  // namespace text

std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& json_bytes, const std::string& name,
                                              const std::string& config_bytes, const std::string& config_name) {
  return std::make_unique<HfTokenizer>(json_bytes, name, config_bytes, config_name);
}

std::unique_ptr<Tokenizer> load_wordpiece_vocab(const std::string& dir) {
  const std::filesystem::path d(dir);
  const std::string file = (d / "vocab.txt").string(), config_name = (d / "tokenizer_config.json").string();
  std::error_code ec;
  const std::string cfg = std::filesystem::exists(config_name, ec) ? read_file(config_name, "tokenizer_config.json") : "";
  const Json c = cfg.empty() ? Json::object() : detail::parse_json_object(cfg, config_name);
  const Where cw{config_name, ""};
  const bool lower = get_bool(c, "do_lower_case", true, cw);
  const Json strip = c.contains("strip_accents") && c["strip_accents"].is_boolean() ? c["strip_accents"] : Json(nullptr);
  const bool chinese = get_bool(c, "tokenize_chinese_chars", true, cw);
  // vocab.txt: token per line, id = line number (a trailing newline ends the last line)
  const std::string text = read_file(file, "vocab.txt");
  check_utf8(text, file);
  Json vocab = Json::object();
  int64_t id = 0;
  for (size_t at = 0; at < text.size(); ++id) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string tok = text.substr(at, end - at);
    if (!tok.empty() && tok.back() == '\r') tok.pop_back();
    check(!vocab.contains(tok), file, " line ", id + 1, ": token \"", tok, "\" appears twice");
    vocab[tok] = id;
    at = end + 1;
  }
  const Where w{file, ""};
  auto id_of = [&](const char* key, const char* fallback) {
    std::string t = fallback;
    if (c.contains(key) && c[key].is_string()) t = c[key].get<std::string>();
    if (!vocab.contains(t)) w.fail("the ", key, " \"", t, "\" is not in the vocabulary");
    return std::make_pair(t, vocab[t].get<int64_t>());
  };
  const auto unk = id_of("unk_token", "[UNK]"), cls = id_of("cls_token", "[CLS]"), sep = id_of("sep_token", "[SEP]");
  Json added = Json::array();
  for (const char* key : {"pad_token", "unk_token", "cls_token", "sep_token", "mask_token"}) {
    const char* fallback = std::string(key) == "pad_token" ? "[PAD]" : std::string(key) == "unk_token" ? "[UNK]"
                           : std::string(key) == "cls_token" ? "[CLS]" : std::string(key) == "sep_token" ? "[SEP]"
                                                                                                         : "[MASK]";
    std::string t = c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : fallback;
    if (!vocab.contains(t)) continue;
    added.push_back({{"id", vocab[t]}, {"content", t}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  std::sort(added.begin(), added.end(), [](const Json& a, const Json& b) { return a["id"] < b["id"]; });
  const Json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", chinese}, {"strip_accents", strip},
        {"lowercase", lower}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", {{"type", "BertProcessing"}, {"sep", {sep.first, sep.second}}, {"cls", {cls.first, cls.second}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model",
       {{"type", "WordPiece"}, {"unk_token", unk.first}, {"continuing_subword_prefix", "##"},
        {"max_input_chars_per_word", 100}, {"vocab", vocab}}}};
  return parse_hf_tokenizer(j.dump(), file + " (as a WordPiece tokenizer.json)", cfg, config_name);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir) {
  const std::filesystem::path d(dir);
  const std::string file = (d / "tokenizer.json").string(), config = (d / "tokenizer_config.json").string();
  std::error_code ec;
  const std::string cfg = std::filesystem::exists(config, ec) ? read_file(config, "tokenizer_config.json") : "";
  return parse_hf_tokenizer(read_file(file, "tokenizer.json"), file, cfg, config);
}

}  // namespace qkv
