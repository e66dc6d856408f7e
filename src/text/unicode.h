// Unicode for the tokenizers: code points, properties and normalisation (ICU, Unicode 15), and
// regular expressions over UTF-8 (PCRE2) with the Oniguruma meanings of \s, \S, \w and \W that
// Hugging Face's tokenizer.json patterns are written for.
//
// Everything here takes valid UTF-8 (the callers check it with qkv::check_utf8 first).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::text {

// UTF-8 <-> code points.
std::u32string to_u32(std::string_view utf8);
void append_utf8(std::string& out, char32_t cp);
std::string to_utf8(std::u32string_view s);
// The code points of `utf8` with the byte offset each starts at (and a last entry at size()).
std::vector<size_t> char_starts(std::string_view utf8);

// Properties, as Rust's char methods and the unicode_categories crate define them (which Hugging
// Face's tokenizers use), answered from ICU's current tables.
bool is_white_space(char32_t c);   // White_Space (char::is_whitespace)
bool is_alphabetic(char32_t c);    // Alphabetic
bool is_numeric(char32_t c);       // general category N (char::is_numeric)
bool is_punctuation(char32_t c);   // general category P, or ASCII punctuation
bool is_control_cat(char32_t c);   // general category Cc, Cf or Co (unicode_categories' is_other)
bool is_mark(char32_t c);          // general category M (Mn, Mc, Me)
bool is_mark_nonspacing(char32_t c);  // Mn
bool is_regex_word(char32_t c);    // Rust regex's \w: Alphabetic, M, Nd, Pc, Join_Control

// char::to_lowercase: the full lower-case mapping of one code point, without context (no final
// sigma), appended to `out`.
void append_lowercase(std::u32string& out, char32_t c);
std::u32string lowercase(std::u32string_view s);

// GPT-2's byte alphabet (bytes_to_unicode): bytes ! .. ~, ¡ .. ¬ and ® .. ÿ stand for themselves;
// the other 68 bytes, in order, for U+0100, U+0101, ... (so space is Ġ U+0120, newline Ċ U+010A).
struct ByteAlphabet {
  static constexpr char32_t kCodePoints = 0x100 + 68;
  char32_t to_cp[256];       // byte -> its character
  int to_byte_[kCodePoints];  // character -> byte, or -1
  ByteAlphabet();
  // The byte a character stands for, or -1 for a character outside the alphabet.
  int to_byte(char32_t cp) const { return cp < kCodePoints ? to_byte_[cp] : -1; }
};
const ByteAlphabet& byte_alphabet();

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::u32string normalize(std::u32string_view s, NormalForm form);

// A compiled PCRE2 pattern. `pattern` is Oniguruma syntax as Hugging Face writes it; \s \S \w \W
// are rewritten to Oniguruma's Unicode meanings (\s: White_Space; \w: L, M, Nd, Pc) and the rest
// is given to PCRE2 (UTF + UCP). `what` names the pattern in errors.
class Regex {
 public:
  Regex(std::string_view pattern, std::string what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // The non-overlapping matches in `text`, left to right, as (begin, end) byte offsets. After an
  // empty match the search resumes one character later (Oniguruma's find_iter). The work is
  // metered in bytes searched; past `budget` (default_budget(text.size()) when not given) it
  // throws an Error naming the pattern, so a pattern whose iteration is quadratic (`a*b|.`)
  // cannot hold a thread for minutes.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text, size_t budget) const;
  // 2^26 + 256 bytes per byte of text: linear patterns use a small part of it.
  static size_t default_budget(size_t text_bytes);
  // The slow twin: every search over the whole text, unmetered (tests compare the two).
  std::vector<std::pair<size_t, size_t>> find_all_reference(std::string_view text) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  std::string what_;
  std::string pattern_;
};

// Oniguruma's \s \S \w \W spelled for PCRE2 (exposed for tests).
std::string onig_to_pcre2(std::string_view pattern, const std::string& what);

}  // namespace qkv::text
