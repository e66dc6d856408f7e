// Unicode for the tokenizers: ICU for properties, case and normalisation; PCRE2 for patterns.
#include "text/unicode.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "qkv/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace qkv::text {

// ---------------------------------------------------------------------------------------------
// UTF-8

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    // len, cp <- the lead byte's length and payload, then 6 bits per continuation byte
    const size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

std::vector<size_t> char_starts(std::string_view s) {
  std::vector<size_t> at;
  at.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) at.push_back(i);
  at.push_back(s.size());
  return at;
}

ByteAlphabet::ByteAlphabet() {
  for (int& b : to_byte_) b = -1;
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool self = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    to_cp[b] = self ? static_cast<char32_t>(b) : next++;
    to_byte_[to_cp[b]] = b;
  }
}

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

// ---------------------------------------------------------------------------------------------
// Properties

namespace {
int category_mask(char32_t c) { return U_MASK(u_charType(static_cast<UChar32>(c))); }
}  // namespace

bool is_white_space(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; }
bool is_alphabetic(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC) != 0; }
bool is_numeric(char32_t c) { return (category_mask(c) & U_GC_N_MASK) != 0; }
bool is_punctuation(char32_t c) {
  const bool ascii = (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
                     (c >= 0x7b && c <= 0x7e);
  return ascii || (category_mask(c) & U_GC_P_MASK) != 0;
}
bool is_control_cat(char32_t c) { return (category_mask(c) & (U_GC_CC_MASK | U_GC_CF_MASK | U_GC_CO_MASK)) != 0; }
bool is_mark(char32_t c) { return (category_mask(c) & U_GC_M_MASK) != 0; }
bool is_mark_nonspacing(char32_t c) { return (category_mask(c) & U_GC_MN_MASK) != 0; }
bool is_regex_word(char32_t c) {
  return is_alphabetic(c) || (category_mask(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_JOIN_CONTROL) != 0;
}

void append_lowercase(std::u32string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  // The full mapping (U+0130 -> i + U+0307) of the character alone, so no final-sigma context.
  icu::UnicodeString s(static_cast<UChar32>(c));
  s.toLower(icu::Locale::getRoot());
  for (int32_t i = 0; i < s.length();) {
    const UChar32 u = s.char32At(i);
    out.push_back(static_cast<char32_t>(u));
    i += U16_LENGTH(u);
  }
}

std::u32string lowercase(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) append_lowercase(out, c);
  return out;
}

std::u32string normalize(std::u32string_view s, NormalForm form) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::NFC: n = icu::Normalizer2::getNFCInstance(st); break;
    case NormalForm::NFD: n = icu::Normalizer2::getNFDInstance(st); break;
    case NormalForm::NFKC: n = icu::Normalizer2::getNFKCInstance(st); break;
    case NormalForm::NFKD: n = icu::Normalizer2::getNFKDInstance(st); break;
  }
  check(U_SUCCESS(st) && n != nullptr, "Unicode normalisation: ICU's normaliser is unavailable (", u_errorName(st), ")");
  const icu::UnicodeString in =
      icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(s.data()), static_cast<int32_t>(s.size()));
  const icu::UnicodeString o = n->normalize(in, st);
  check(U_SUCCESS(st), "Unicode normalisation failed: ", u_errorName(st));
  std::u32string out;
  out.reserve(static_cast<size_t>(o.length()));
  for (int32_t i = 0; i < o.length();) {
    const UChar32 u = o.char32At(i);
    out.push_back(static_cast<char32_t>(u));
    i += U16_LENGTH(u);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Patterns

namespace {
constexpr char kOnigSpace[] = R"(\t-\r\x{85}\p{Z})";  // White_Space: \t..\r, U+0085 and every Z
constexpr char kOnigWord[] = R"(\p{L}\p{M}\p{Nd}\p{Pc})";
}  // namespace

std::string onig_to_pcre2(std::string_view p, const std::string& what) {
  std::string out;
  int depth = 0;  // inside how many [...] classes
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      const bool cls = depth > 0;
      switch (e) {
        case 's': out += cls ? std::string(kOnigSpace) : std::string("[") + kOnigSpace + "]"; break;
        case 'w': out += cls ? std::string(kOnigWord) : std::string("[") + kOnigWord + "]"; break;
        case 'S':
        case 'W':
          if (cls)
            fail(what, ": \\", e, " inside a character class is not supported (pattern \"", std::string(p), "\")");
          out += std::string("[^") + (e == 'S' ? kOnigSpace : kOnigWord) + "]";
          break;
        case 'h':
        case 'H':
          fail(what, ": \\", e, " (Oniguruma's hexadecimal digit class) is not supported (pattern \"", std::string(p),
               "\")");
        default: out += '\\', out += e;
      }
      continue;
    }
    if (c == '[') {
      // a class opens (a '[' inside a class opens a nested class in Oniguruma); a ']' right after
      // "[" or "[^" is a literal
      if (depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:alpha:] stays as it is
        const size_t end = p.find(":]", i + 2);
        if (end != std::string_view::npos) {
          out.append(p.substr(i, end + 2 - i));
          i = end + 1;
          continue;
        }
      }
      if (depth > 0) fail(what, ": nested character classes are not supported (pattern \"", std::string(p), "\")");
      ++depth;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += "\\]", ++i;
      continue;
    }
    if (c == ']' && depth > 0) --depth;
    if (c == '&' && depth > 0 && i + 1 < p.size() && p[i + 1] == '&')
      fail(what, ": class intersection && is not supported (pattern \"", std::string(p), "\")");
    out += c;
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, std::string what)
    : code_(std::make_unique<Code>()), what_(std::move(what)), pattern_(pattern) {
  const std::string p = onig_to_pcre2(pattern, what_);
  int err = 0;
  PCRE2_SIZE at = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
  if (code_->code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    fail(what_, ": the pattern \"", std::string(pattern), "\" does not compile: ", reinterpret_cast<const char*>(buf),
         " (at offset ", at, " of its PCRE2 form)");
  }
  // the interpreter runs where JIT is unavailable; find_all matches in both modes
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
}

Regex::~Regex() = default;

size_t Regex::default_budget(size_t text_bytes) { return (size_t{1} << 26) + 256 * text_bytes; }

namespace {

using MatchData = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;
using Spans = std::vector<std::pair<size_t, size_t>>;

[[noreturn]] void fail_match(const std::string& what, size_t at, int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof buf);
  fail(what, ": matching failed at byte offset ", at, ": ", reinterpret_cast<const char*>(buf));
}

// Oniguruma's find_iter over `search(at)`, the first match at or after byte `at` (false when
// there is none): matches left to right, each search starting where the last match ended; after
// an empty match right after the previous match, the search resumes one character later.
template <class Search>
Spans iterate(std::string_view text, Search search) {
  Spans out;
  size_t at = 0, last_end = SIZE_MAX, s = 0, e = 0;
  while (at <= text.size() && search(at, s, e)) {
    if (s == e && e == last_end) {
      if (at >= text.size()) break;
      ++at;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80) ++at;
      continue;
    }
    out.emplace_back(s, e);
    last_end = e;
    at = e;
  }
  return out;
}

}  // namespace

// Leftmost-first iteration is quadratic for some patterns whatever the engine (`a*b|.` rescans
// the rest of the text from every position; Oniguruma and Rust's regex do the same), so the
// work is metered. Each search sees a window of the text, [0, at + w): PCRE2_PARTIAL_HARD
// reports when any path of the search reached the window's end, and then the window grows
// fourfold up to the whole text. A complete match found in a window is what the whole text gives
// (an earlier start that reached the end would have been reported as partial), so the result is
// the unbounded search's (find_all_reference). The bytes of the windows searched are charged to
// `budget`, a deterministic bound on the work.
Spans Regex::find_all(std::string_view text, size_t budget) const {
  MatchData md(pcre2_match_data_create_from_pattern(code_->code, nullptr), pcre2_match_data_free);
  check(md != nullptr, what_, ": out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  constexpr size_t kFirstWindow = 64;
  size_t spent = 0;
  return iterate(text, [&](size_t at, size_t& s, size_t& e) {
    for (size_t w = kFirstWindow;; w *= 4) {
      size_t len = w >= text.size() - at ? text.size() : at + w;
      while (len < text.size() && (static_cast<unsigned char>(text[len]) & 0xc0) == 0x80) ++len;
      const bool whole = len == text.size();
      spent += len - at + 1;
      if (spent > budget)
        fail(what_, ": the pattern \"", pattern_, "\" needs more than ", budget, " byte steps to split this text of ",
             text.size(),
             " bytes (it rescans the text from each position: its work grows with the square of the text's length)");
      const int rc = pcre2_match(code_->code, subject, len, at,
                                 PCRE2_NO_UTF_CHECK | (whole ? 0 : PCRE2_PARTIAL_HARD), md.get(), nullptr);
      if (rc >= 0) {
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        s = ov[0], e = ov[1];
        return true;
      }
      if (whole && rc == PCRE2_ERROR_NOMATCH) return false;
      if (whole || (rc != PCRE2_ERROR_PARTIAL && rc != PCRE2_ERROR_NOMATCH)) fail_match(what_, at, rc);
    }
  });
}

Spans Regex::find_all(std::string_view text) const { return find_all(text, default_budget(text.size())); }

Spans Regex::find_all_reference(std::string_view text) const {
  MatchData md(pcre2_match_data_create_from_pattern(code_->code, nullptr), pcre2_match_data_free);
  check(md != nullptr, what_, ": out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  return iterate(text, [&](size_t at, size_t& s, size_t& e) {
    const int rc = pcre2_match(code_->code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) fail_match(what_, at, rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    s = ov[0], e = ov[1];
    return true;
  });
}

}  // namespace qkv::text
