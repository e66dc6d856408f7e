// Small byte-level helpers the corpus readers share (corpora.cpp: Ding and the KJV; gettext.cpp:
// gettext catalogs). They look at ASCII and at Latin-1's letters in UTF-8 only; the tokenizers'
// Unicode is in unicode.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace qkv::text {

inline bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// An upper-case letter starts `s`: A-Z, or U+00C0..U+00DE except U+00D7 (x sign), in UTF-8
// C3 80..C3 9E except C3 97.
inline bool starts_upper(std::string_view s) {
  if (s.empty()) return false;
  if (s[0] >= 'A' && s[0] <= 'Z') return true;
  if (s.size() < 2 || static_cast<unsigned char>(s[0]) != 0xC3) return false;
  const unsigned c1 = static_cast<unsigned char>(s[1]);
  return c1 >= 0x80 && c1 <= 0x9E && c1 != 0x97;
}

// `s` with ASCII whitespace runs collapsed to one space, trimmed.
inline std::string collapse_spaces(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (is_ascii_space(c)) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Words of a collapsed text: its spaces plus one ("" has none).
inline int64_t word_count(std::string_view s) {
  int64_t n = s.empty() ? 0 : 1;
  for (char c : s) n += c == ' ';
  return n;
}

}  // namespace qkv::text
