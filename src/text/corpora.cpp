// Corpora that Debian packages ship: the Ding dictionary's whole-sentence German-English pairs
// (trans-de-en) and the King James Bible's verses (bible-kjv). The rules are in
// include/qkv/data.h.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "qkv/data.h"
#include "qkv/error.h"
#include "corpus_text.h"

namespace qkv {
namespace {

// Pieces of `s` between occurrences of `sep`.
std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t at = s.find(sep); at != std::string_view::npos; at = s.find(sep, start)) {
    out.push_back(s.substr(start, at - start));
    start = at + sep.size();
  }
  out.push_back(s.substr(start));
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ascii_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
// Part of a word: an ASCII letter or digit, or any byte of a multi-byte UTF-8 character.
bool is_word_byte(char c) { return is_ascii_letter(c) || is_digit(c) || static_cast<unsigned char>(c) >= 0x80; }

char closer_of(char c) { return c == '(' ? ')' : c == '[' ? ']' : c == '<' ? '>' : c == '{' ? '}' : 0; }
bool is_closer(char c) { return c == ')' || c == ']' || c == '>' || c == '}'; }

// A Ding placeholder ("etw.", "sth.", ...) stands as a word of its own in `s` (ASCII case ignored).
bool has_placeholder(std::string_view s) {
  static constexpr std::string_view kPlaceholders[] = {"etw.", "jd.", "jdm.", "jdn.", "jds.", "sth.", "sb."};
  std::string lower(s);
  for (char& c : lower)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  for (std::string_view p : kPlaceholders)
    for (size_t at = lower.find(p); at != std::string::npos; at = lower.find(p, at + 1))
      if (at == 0 || !is_word_byte(lower[at - 1])) return true;
  return false;
}

// A '/' other than between two digits ("24/7" stays; "sheer/pure" does not).
bool has_slash_alternative(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '/' && !(i > 0 && i + 1 < s.size() && is_digit(s[i - 1]) && is_digit(s[i + 1]))) return true;
  return false;
}

// Where the `bible` program is: the first executable regular file named `bible` on PATH, or "".
std::string find_on_path(const std::string& name) {
  const char* env = std::getenv("PATH");
  const std::string path = env ? env : "/usr/local/bin:/usr/bin:/bin";
  for (std::string_view dir : split(path, ":")) {
    const std::string file = (dir.empty() ? std::string(".") : std::string(dir)) + "/" + name;
    if (::access(file.c_str(), X_OK) == 0) return file;
  }
  return "";
}

// `s` in single quotes for /bin/sh, each ' written as '\''.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// "Ge1:1": optional 1-3, letters, digits, ':', digits.
bool is_verse_reference(std::string_view r) {
  size_t i = 0;
  if (i < r.size() && r[i] >= '1' && r[i] <= '3') ++i;
  const size_t letters = i;
  while (i < r.size() && is_ascii_letter(r[i])) ++i;
  if (i == letters) return false;
  const size_t chapter = i;
  while (i < r.size() && is_digit(r[i])) ++i;
  if (i == chapter || i == r.size() || r[i] != ':') return false;
  const size_t verse = ++i;
  while (i < r.size() && is_digit(r[i])) ++i;
  return i > verse && i == r.size();
}

// The first 80 bytes of `s`, for error messages.
std::string excerpt(std::string_view s) { return s.size() <= 80 ? std::string(s) : std::string(s.substr(0, 80)) + "..."; }

}  // namespace

namespace {

// The pieces of a Ding sub-entry between its `;` separators outside brackets.
std::vector<std::string_view> ding_alternatives(std::string_view sub) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < sub.size(); ++i) {
    if (closer_of(sub[i])) ++depth;
    else if (is_closer(sub[i]) && depth > 0) --depth;
    else if (sub[i] == ';' && depth == 0) {
      out.push_back(sub.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(sub.substr(start));
  return out;
}

// `alt` without its (...), [...], <...> and {...} groups (nested ones included), whitespace runs
// collapsed to one space, trimmed, no space before , . ! ? ; : -- or "" when its brackets are
// unbalanced or crossed.
std::string ding_bare(std::string_view alt) {
  std::string bare;
  std::string open;  // the closers the groups now open expect, innermost last
  for (char c : alt) {
    if (char close = closer_of(c)) {
      open += close;
    } else if (is_closer(c)) {
      if (open.empty() || open.back() != c) return "";
      open.pop_back();
    } else if (open.empty()) {
      bare += c;
    }
  }
  if (!open.empty()) return "";
  std::string s;
  for (char c : bare) {
    if (text::is_ascii_space(c)) {
      if (!s.empty() && s.back() != ' ') s += ' ';
      continue;
    }
    if (std::strchr(",.!?;:", c) && !s.empty() && s.back() == ' ') s.pop_back();
    s += c;
  }
  if (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// Neither an alternative ('/' other than between digits), an ellipsis (… or ...), nor a
// placeholder (etw., sb., ...): text that stands for itself.
bool plain_text(std::string_view s) {
  return !has_slash_alternative(s) && s.find("\xE2\x80\xA6") == std::string_view::npos &&
         s.find("...") == std::string_view::npos && !has_placeholder(s);
}

}  // namespace

std::string ding_whole_sentence(std::string_view sub) {
  // A grammar tag ({m}, {pl}, {vt}, ...) marks a dictionary headword, not a sentence.
  if (sub.find('{') != std::string_view::npos) return "";
  const std::string s = ding_bare(ding_alternatives(sub).front());
  // Keep s only if it reads as a whole sentence.
  if (!text::starts_upper(s)) return "";
  if (s.back() != '.' && s.back() != '!' && s.back() != '?') return "";
  if (s.find(' ') == std::string::npos) return "";  // at least 2 words
  if (!plain_text(s)) return "";
  return s;
}

std::vector<std::string> ding_phrases(std::string_view sub) {
  std::vector<std::string> out;
  for (std::string_view alt : ding_alternatives(sub)) {
    if (static_cast<int64_t>(out.size()) == kDingPhraseAlternatives) break;
    std::string s = ding_bare(alt);
    if (s.empty() || !plain_text(s) || text::word_count(s) > kDingPhraseWords) continue;
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  }
  return out;
}

namespace {

// Calls each(German, English) for every aligned pair of sub-entries of the Ding file at `path`,
// counting lines and malformed lines in *report (see ding_sentence_pairs); `what` names the
// records for the error when none is kept (report->used == 0).
template <typename Each>
void read_ding(const std::string& path, ReadReport& r, const char* what, Each each) {
  r.unit = "pairs";
  LineReader in(path);
  std::string line;
  while (in.next(line)) {
    ++r.lines;
    if (line.empty() || line[0] == '#' || line.find_first_not_of(" \t") == std::string::npos) continue;
    // (de, en) <- the two sides of " :: ", each split into its " | " sub-entries; or why not
    std::string why = utf8_problem(line);
    std::vector<std::string_view> de, en;
    if (why.empty()) {
      const std::vector<std::string_view> sides = split(line, " :: ");
      if (sides.size() == 1) {
        why = "no ' :: ' separator";
      } else if (sides.size() > 2) {
        why = detail::concat(sides.size() - 1, " ' :: ' separators, expected 1");
      } else {
        de = split(sides[0], " | ");
        en = split(sides[1], " | ");
        if (de.size() != en.size()) why = detail::concat(de.size(), " German sub-entries but ", en.size(), " English");
      }
    }
    if (!why.empty()) {  // a malformed line is skipped whole
      ++r.malformed;
      if (r.first_malformed_line == 0) {
        r.first_malformed_line = in.line_number();
        r.first_malformed_reason = why;
      }
      continue;
    }
    for (size_t k = 0; k < de.size(); ++k) each(de[k], en[k]);
  }
  if (r.used == 0) {
    std::string why = detail::concat(path, ": no ", what, " in ", r.lines, r.lines == 1 ? " line" : " lines");
    if (r.malformed > 0)
      why += detail::concat(" (", r.malformed, " malformed; first: line ", r.first_malformed_line, ": ",
                            r.first_malformed_reason, ")");
    throw Error(why + "; expected the Ding dictionary's `German :: English` lines (Debian package trans-de-en)");
  }
}

}  // namespace

std::vector<TextPair> ding_sentence_pairs(const std::string& path, ReadReport* report) {
  ReadReport r;
  std::vector<TextPair> out;
  std::unordered_set<std::string> seen;  // German + '\0' + English of every pair kept
  read_ding(path, r, "whole-sentence pairs", [&](std::string_view de, std::string_view en) {
    std::string src = ding_whole_sentence(de);
    if (src.empty()) return;
    std::string tgt = ding_whole_sentence(en);
    if (tgt.empty()) return;
    if (!seen.insert(src + '\0' + tgt).second) return;
    out.push_back({std::move(src), std::move(tgt)});
    ++r.used;
  });
  if (report) *report = r;
  return out;
}

std::vector<TextPair> ding_phrase_pairs(const std::string& path, ReadReport* report) {
  ReadReport r;
  std::vector<TextPair> out;
  std::unordered_set<std::string> seen;  // German + '\0' + English of every pair kept
  read_ding(path, r, "word or phrase pairs", [&](std::string_view de, std::string_view en) {
    if (!ding_whole_sentence(de).empty() && !ding_whole_sentence(en).empty()) return;  // a sentence pair
    const std::vector<std::string> src = ding_phrases(de);
    if (src.empty()) return;
    const std::vector<std::string> tgt = ding_phrases(en);
    for (const std::string& s : src)
      for (const std::string& t : tgt) {
        // a sentence on both sides (a later alternative, or "Ach so! | I see!") is left to the sentences
        if (!ding_whole_sentence(s).empty() && !ding_whole_sentence(t).empty()) continue;
        if (seen.insert(s + '\0' + t).second) {
          out.push_back({s, t});
          ++r.used;
        }
      }
  });
  if (report) *report = r;
  return out;
}

std::vector<std::string> kjv_verses() {
  constexpr int64_t kVerses = 31102;
  const std::string bible = find_on_path("bible");
  check(!bible.empty(), "kjv_verses: the `bible` program is not on PATH; install bible-kjv (apt-get install bible-kjv)");
  // -f turns pretty-printing off: one "Ge1:1 In the beginning ..." line per verse.
  const std::string cmd = shell_quote(bible) + " -f Gen1:1-Rev22:21 </dev/null 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  check(pipe != nullptr, "kjv_verses: cannot run ", cmd, ": ", std::strerror(errno));

  std::vector<std::string> verses;
  verses.reserve(kVerses);
  std::string first_ref, last_ref, bad;  // bad: the first output line that is not a verse
  int64_t line_no = 0;
  char* buf = nullptr;
  size_t cap = 0;
  ssize_t got;
  while ((got = ::getline(&buf, &cap, pipe)) >= 0) {
    std::string_view l(buf, static_cast<size_t>(got));
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.remove_suffix(1);
    ++line_no;
    if (!bad.empty()) continue;  // read to the end so that the program is not cut off mid-write
    const size_t sp = l.find(' ');
    const std::string_view ref = l.substr(0, sp);
    // text <- what follows the reference, spaces collapsed and trimmed
    std::string text;
    if (sp != std::string_view::npos)
      for (char c : l.substr(sp + 1)) {
        if (c == ' ' && (text.empty() || text.back() == ' ')) continue;
        text += c;
      }
    if (!text.empty() && text.back() == ' ') text.pop_back();
    if (!is_verse_reference(ref) || text.empty() || !utf8_problem(text).empty()) {
      bad = detail::concat("line ", line_no, ": \"", excerpt(l), "\"");
      continue;
    }
    if (first_ref.empty()) first_ref = ref;
    last_ref = ref;
    verses.push_back(std::move(text));
  }
  std::free(buf);
  const int status = ::pclose(pipe);
  check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "kjv_verses: `", cmd,
        "` failed (status ", status, ")", bad.empty() ? "" : "; first odd output ", bad);
  check(bad.empty(), "kjv_verses: `", cmd, "` printed a line that is not \"<Book><chapter>:<verse> <text>\": ", bad);
  check(static_cast<int64_t>(verses.size()) == kVerses && first_ref == "Ge1:1" && last_ref == "Rev22:21",
        "kjv_verses: `", cmd, "` printed ", verses.size(), " verses from ", first_ref.empty() ? "?" : first_ref,
        " to ", last_ref.empty() ? "?" : last_ref, ", expected ", kVerses,
        " from Ge1:1 to Rev22:21 (is the bible-kjv data complete?)");
  return verses;
}

}  // namespace qkv
