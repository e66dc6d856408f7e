// Compiled gettext catalogs (.mo): read_mo, then gettext_sentence_pairs (the file is the input).
// Its seeds (corpus/mo/) were compiled by GNU msgfmt, little- and big-endian, from a catalog with
// a context, a plural message, markup and several sentences per message; qkv writes no .mo.
#include "fuzz_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string path = fuzz::put_file("messages.mo", fuzz::bytes(data, size));
  std::vector<CatalogMessage> messages;
  if (!fuzz::accepts([&] { messages = read_mo(path); })) return 0;
  for (const CatalogMessage& m : messages) {
    if (m.translations.empty()) fuzz::finding("a message without a translation string");
    if (m.plural_id.empty() && m.translations.size() != 1) fuzz::finding("a singular message with plural forms");
    if (m.context.find('\x04') != std::string::npos) fuzz::finding("a context holding EOT");
  }
  std::vector<TextPair> pairs;
  ReadReport r;
  if (!fuzz::accepts([&] { pairs = gettext_sentence_pairs({path}, &r); })) return 0;
  if (r.lines != static_cast<int64_t>(messages.size())) fuzz::finding("report.lines differs from the messages read");
  if (r.used != static_cast<int64_t>(pairs.size())) fuzz::finding("report.used differs from the pairs returned");
  for (const TextPair& p : pairs) {
    fuzz::check_field(p.source, "translation");
    fuzz::check_field(p.target, "English");
    if (p.source.size() > 300 || p.target.size() > 300) fuzz::finding("a piece over 300 bytes");
    if (p.target.find(' ') == std::string::npos) fuzz::finding("an English piece of one word");
  }
  return 0;
}
