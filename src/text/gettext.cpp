// Compiled GNU gettext catalogs (.mo) and the sentence pairs their translations hold. The rules
// are in include/qkv/data.h; the file format is the GNU gettext manual's "The Format of GNU MO
// Files".
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "qkv/data.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "corpus_text.h"

namespace qkv {
namespace {

constexpr uint32_t kMoMagic = 0x950412de;
constexpr size_t kMoHeaderBytes = 28;  // magic, revision, N, O, T, hash table size and offset
constexpr size_t kMaxPieceBytes = 300;

// The 32-bit word at byte `at` of `b` (at + 4 <= b.size()), in the file's byte order.
uint32_t word_at(std::string_view b, size_t at, bool swap) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return swap ? __builtin_bswap32(v) : v;
}

// String `i` of the (length, offset) table at byte `table` of `b`: its bytes without the NUL
// that must follow them. `which` names the table in errors.
std::string_view table_string(const std::string& path, std::string_view b, uint64_t table, uint32_t i, bool swap,
                              const char* which) {
  const uint64_t at = table + 8ull * i;
  const uint64_t length = word_at(b, at, swap), offset = word_at(b, at + 4, swap);
  check(offset + length < b.size(), path, ": ", which, " string ", i, " (", length, " bytes at offset ", offset,
        ") runs past the end of the file (", b.size(), " bytes); expected a compiled gettext catalog (.mo)");
  check(b[offset + length] == '\0', path, ": ", which, " string ", i, " at offset ", offset,
        " is not followed by a NUL byte; expected a compiled gettext catalog (.mo)");
  return b.substr(offset, length);
}

// `s` without its markup tags: each '<' followed by a letter, '/' or '!' up to the next '>' is
// dropped. Sets *ok = false when such a tag is not closed.
std::string strip_tags(std::string_view s, bool* ok) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char next = i + 1 < s.size() ? s[i + 1] : '\0';
    if (s[i] == '<' && ((next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') || next == '/' || next == '!')) {
      const size_t close = s.find('>', i);
      if (close == std::string_view::npos) {
        *ok = false;
        return out;
      }
      i = close;
      continue;
    }
    out += s[i];
  }
  return out;
}

// The non-empty lines of `s` (split at '\n'), each collapsed.
std::vector<std::string> text_lines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string_view::npos) end = s.size();
    std::string line = text::collapse_spaces(s.substr(start, end - start));
    if (!line.empty()) out.push_back(std::move(line));
    start = end + 1;
  }
  return out;
}

// A sentence may start at s[at]: an upper-case letter (A-Z, Latin-1 À-Þ but ×) or an opening
// quote (" ' „ “ ‚ ‘ « »).
bool sentence_start(std::string_view s, size_t at) {
  const std::string_view r = s.substr(at);
  if (r.empty()) return false;
  if (text::starts_upper(r) || r[0] == '"' || r[0] == '\'') return true;
  if (r.size() >= 2 && static_cast<unsigned char>(r[0]) == 0xC2)  // « »
    return static_cast<unsigned char>(r[1]) == 0xAB || static_cast<unsigned char>(r[1]) == 0xBB;
  if (r.size() >= 3 && static_cast<unsigned char>(r[0]) == 0xE2 && static_cast<unsigned char>(r[1]) == 0x80) {
    const unsigned c2 = static_cast<unsigned char>(r[2]);
    return c2 == 0x9E || c2 == 0x9C || c2 == 0x9A || c2 == 0x98;  // „ “ ‚ ‘
  }
  return false;
}

// The sentences of one collapsed line: it is cut after . ! ? or … where a space and a
// sentence_start() follow.
std::vector<std::string> sentences(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i + 1 < line.size(); ++i) {
    if (line[i] != ' ') continue;
    const bool after_end = (i >= 1 && (line[i - 1] == '.' || line[i - 1] == '!' || line[i - 1] == '?')) ||
                           (i >= 3 && line.compare(i - 3, 3, "\xE2\x80\xA6") == 0);
    if (!after_end || !sentence_start(line, i + 1)) continue;
    out.push_back(line.substr(start, i - start));
    start = i + 1;
  }
  out.push_back(line.substr(start));
  return out;
}

// A piece fit for training: no format or markup syntax ($ % { } [ ] = @ # | _ \ & and control
// characters: placeholders, mnemonics, entities), at most kMaxPieceBytes, well-formed UTF-8.
bool clean_piece(const std::string& s) {
  if (s.empty() || s.size() > kMaxPieceBytes) return false;
  for (char c : s)
    if (std::strchr("$%{}[]=@#|_\\&", c) != nullptr || static_cast<unsigned char>(c) < 0x20 || c == 0x7F) return false;
  return utf8_problem(s).empty();
}

}  // namespace

std::vector<CatalogMessage> read_mo(const std::string& path) {
  const std::string b = read_file(path, "gettext catalog");
  check(b.size() >= kMoHeaderBytes, path, ": ", b.size(), " bytes, shorter than a gettext catalog's ",
        kMoHeaderBytes, "-byte header; expected a compiled gettext catalog (.mo)");
  bool swap = false;
  uint32_t magic;
  std::memcpy(&magic, b.data(), 4);
  if (magic != kMoMagic) {
    check(__builtin_bswap32(magic) == kMoMagic, path, ": not a compiled gettext catalog (.mo): its first 4 bytes are "
          "not the magic number 0x950412de in either byte order");
    swap = true;
  }
  const uint32_t revision = word_at(b, 4, swap);
  check(revision >> 16 <= 1, path, ": gettext catalog format revision ", revision >> 16, ".", (revision & 0xffff),
        "; expected major revision 0 or 1");
  const uint64_t n = word_at(b, 8, swap), originals = word_at(b, 12, swap), translations = word_at(b, 16, swap);
  check(originals + 8 * n <= b.size() && translations + 8 * n <= b.size(), path, ": its tables of ", n,
        " strings (at offsets ", originals, " and ", translations, ") run past the end of the file (", b.size(),
        " bytes); expected a compiled gettext catalog (.mo)");
  std::vector<CatalogMessage> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view id = table_string(path, b, originals, i, swap, "original");
    const std::string_view str = table_string(path, b, translations, i, swap, "translated");
    CatalogMessage m;
    const size_t eot = id.find('\x04');  // msgctxt EOT msgid
    if (eot != std::string_view::npos) {
      m.context = id.substr(0, eot);
      id.remove_prefix(eot + 1);
    }
    const size_t nul = id.find('\0');  // msgid NUL msgid_plural
    if (nul != std::string_view::npos) {
      m.plural_id = id.substr(nul + 1);
      id = id.substr(0, nul);
    }
    m.id = id;
    // msgstr[0] NUL msgstr[1] ... for a plural message; one string otherwise
    size_t start = 0;
    while (true) {
      const size_t end = m.plural_id.empty() ? std::string_view::npos : str.find('\0', start);
      m.translations.emplace_back(str.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
      if (end == std::string_view::npos) break;
      start = end + 1;
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<TextPair> gettext_sentence_pairs(const std::vector<std::string>& paths, ReadReport* report) {
  check(!paths.empty(), "gettext_sentence_pairs: no catalog given");
  ReadReport r;
  r.unit = "pairs";
  std::vector<TextPair> out;
  std::unordered_set<std::string> seen;  // German + '\0' + English of every pair kept
  for (const std::string& path : paths) {
    for (const CatalogMessage& m : read_mo(path)) {
      ++r.lines;
      if (m.id.empty() || !m.plural_id.empty() || m.translations.empty() || m.translations[0].empty()) continue;
      bool ok = true;
      const std::vector<std::string> en_lines = text_lines(strip_tags(m.id, &ok));
      const std::vector<std::string> de_lines = text_lines(strip_tags(m.translations[0], &ok));
      if (!ok || en_lines.size() != de_lines.size()) continue;
      for (size_t l = 0; l < en_lines.size(); ++l) {
        std::vector<std::string> en = sentences(en_lines[l]), de = sentences(de_lines[l]);
        if (en.size() != de.size()) {
          en = {en_lines[l]};
          de = {de_lines[l]};
        }
        for (size_t k = 0; k < en.size(); ++k) {
          if (en[k] == de[k] || text::word_count(en[k]) < 2 || !clean_piece(en[k]) || !clean_piece(de[k])) continue;
          if (!seen.insert(de[k] + '\0' + en[k]).second) continue;
          out.push_back({de[k], en[k]});
          ++r.used;
        }
      }
    }
  }
  if (report) *report = r;
  return out;
}

}  // namespace qkv
