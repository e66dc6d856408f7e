// qkv/data.h: the data layer. Text corpora read line by line into records (parallel pairs,
// labeled texts, plain lines), train/valid/test splits, language-model windows, and batches
// by length under a token budget; plus two corpora that Debian packages ship (the Ding
// German-English dictionary's example sentences, the King James Bible).
//
// Reading rules, the same in every reader:
//   - A file is read as a stream of lines (std::getline), never slurped whole.
//   - A line loses its '\n', one trailing '\r' (CRLF files read like LF files) and, on line 1,
//     a UTF-8 byte-order mark.
//   - A line that is not well-formed UTF-8, or holds a NUL byte, is malformed.
//   - A malformed line is counted in the ReadReport and skipped; it is never used, not even in
//     part. The report keeps the first one's line number and reason.
//   - Fields of TSV records lose leading and trailing ASCII whitespace; a field that is then
//     empty makes the line malformed.
//   - A blank line (empty or only whitespace) is not a record and not malformed: it is counted
//     in `lines` and skipped (read_lines keeps it as a paragraph break, see there).
//   - A missing file, a directory, an unreadable file, a read error, or a file with zero usable
//     records is a qkv::Error naming the path.
// Library code never prints: callers print ReadReport::summary() if they wish.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

// ---- reading -------------------------------------------------------------------------------

struct ReadReport {
  int64_t lines = 0;                 // lines read (read_parallel_files: line pairs)
  int64_t used = 0;                  // records returned
  int64_t malformed = 0;             // lines counted and skipped as malformed
  int64_t first_malformed_line = 0;  // 1-based; 0 when there is none
  std::string first_malformed_reason;
  std::string unit = "records";  // what a record is called in summary(): "pairs", "texts", ...
  // "FILE: 17999 pairs from 18003 lines; 4 malformed lines skipped (first: line 12: no TAB)"
  // "FILE: 18003 pairs from 18003 lines; no malformed lines"
  std::string summary(const std::string& path) const;
};

struct TextPair {
  std::string source, target;
};

struct LabeledText {
  std::string label, text;
};

// Streams a text file line by line, applying the line rules above ('\n', one trailing '\r',
// the byte-order mark on line 1). Throws qkv::Error naming the path when it does not exist, is
// a directory, or cannot be opened; next() throws on a read error.
class LineReader {
 public:
  explicit LineReader(const std::string& path);
  // line <- the next line. Returns false at the end of the file.
  bool next(std::string& line);
  // The 1-based number of the line next() returned last (0 before the first call).
  int64_t line_number() const { return line_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  int64_t line_ = 0;
};

// "" when `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF) without NUL bytes; else the reason, with a 1-based byte position:
// "invalid UTF-8 at byte 7", "NUL byte at byte 3".
std::string utf8_problem(std::string_view s);

// source<TAB>target per line. Malformed: no TAB ("no TAB"), more than one ("2 TABs, expected
// 1"), an empty side ("empty source" / "empty target"), invalid UTF-8 or a NUL byte.
std::vector<TextPair> read_parallel_tsv(const std::string& path, ReadReport* report = nullptr);

// Line i of `src` pairs with line i of `tgt`. Different line counts are a qkv::Error naming
// both files and both counts. A line pair where both lines are blank is skipped; one blank
// side ("empty source" / "empty target") or a bad line on either side is malformed. Tabs
// inside a line are kept (the files are not TSV). report->lines counts line pairs.
std::vector<TextPair> read_parallel_files(const std::string& src, const std::string& tgt,
                                          ReadReport* report = nullptr);

// label<TAB>text per line; malformed as for read_parallel_tsv ("empty label" / "empty text").
std::vector<LabeledText> read_labeled_tsv(const std::string& path, ReadReport* report = nullptr);

// Plain text for language models, one element per line, lines kept verbatim (no trimming).
// Blank lines are paragraph breaks: each run of blank lines becomes one "" element, and blank
// lines before the first and after the last text line are dropped, so "" always sits between
// two text lines. report->used counts text lines, not the "" breaks. Malformed: invalid UTF-8
// or a NUL byte. A file with no text line is a qkv::Error.
std::vector<std::string> read_lines(const std::string& path, ReadReport* report = nullptr);

// ---- splits and batches --------------------------------------------------------------------

// How many of n records a held-out fraction takes: round(n f), at least 1 when f > 0, at most n.
int64_t held_out_count(int64_t n, double fraction);

// A Fisher-Yates permutation of [0, n) driven by qkv::Rng(seed): the shuffle every split and
// plan below uses. Throws qkv::Error for n < 0.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

struct SplitIndices {
  std::vector<int64_t> train, valid, test;  // each sorted ascending; together a partition of [0, n)
};

// perm <- a permutation of [0, n) by Fisher-Yates driven by qkv::Rng(seed);
// n_valid <- round(n * valid_fraction), at least 1 when valid_fraction > 0 (same for test);
// valid <- perm[0, n_valid), test <- the next n_test, train <- the rest; each then sorted.
// The same (n, fractions, seed) always gives the same split. Throws qkv::Error unless n >= 1,
// both fractions are finite, >= 0 and sum to < 1, and at least one example is left to train
// (so with any fraction > 0, n >= 2; with both > 0, n >= 3).
SplitIndices split_indices(int64_t n, double valid_fraction, double test_fraction, uint64_t seed);

// split_indices with groups kept whole: group[i] in [0, n) names example i's group (a group
// may be empty of examples). perm <- a Fisher-Yates permutation of [0, G) by qkv::Rng(seed),
// G = max group + 1; walking perm, each group goes whole to the validation split if it fits
// there (the split then holds at most n_valid examples), else to the test split if it fits there
// (at most n_test), else to training. So a held-out split never holds more than its count, and
// holds fewer only when the groups left are too big for the room left (a group bigger than a
// split's count always trains). With every group a single example (group[i] = i) this is exactly
// split_indices. Throws qkv::Error as split_indices does, or for a group id outside [0, n).
SplitIndices split_groups(const std::vector<int64_t>& group, double valid_fraction, double test_fraction,
                          uint64_t seed);

// What two texts share when one is a near-copy of the other: the text with its letters
// lower-cased (A-Z, and Latin-1 À-Þ but ×), every run of other characters (punctuation,
// quotes, dashes, spaces: ASCII that is not a letter or digit, U+0000-U+00BF, × ÷, U+2000-U+2BFF,
// U+3000-U+303F) one space, trimmed. "„Wo ist der Bahnhof?“" and "wo ist der Bahnhof" share
// "wo ist der bahnhof". Bytes that are not valid UTF-8 count as punctuation.
std::string near_copy_key(std::string_view s);

// Groups of near-copies among translation pairs: pairs whose sources, or whose targets, have the
// same near_copy_key are in one group (transitively). group[i] numbers pair i's group in order of
// first member (0, 1, 2, ...): the input of split_groups, so that no held-out sentence has a
// near-copy in training. A side whose key is empty (no letter or digit: "?!") joins nothing.
std::vector<int64_t> near_copy_groups(const std::vector<TextPair>& pairs);

// Language-model windows: w_k <- ids[k*window, k*window + window + 1) for k = 0, 1, ... while
// the window fits, i.e. (ids.size() - 1) / window windows of window + 1 tokens, consecutive
// windows sharing one token. A window's input is w[:-1] and its target w[1:], so every token
// after the first is predicted exactly once. The last partial window is dropped. Throws
// qkv::Error unless window >= 1 and ids.size() >= window + 1.
std::vector<std::vector<int32_t>> pack_windows(const std::vector<int32_t>& ids, int64_t window);

struct BatchPlan {
  std::vector<std::vector<int64_t>> batches;  // example indices per batch; every index exactly once
};

// Batches of examples of similar length under a token budget (padding counted), seeded and
// deterministic.
//   shuffle = true (training):
//     order <- a permutation of [0, n) (Fisher-Yates, qkv::Rng(seed));
//     pools <- consecutive runs of `order` each holding >= 100 * max_tokens tokens (about 100
//              batches' worth; the last pool holds the rest);
//     in each pool: sort by (length, index), then cut batches greedily so that
//              count * max_len <= max_tokens (an example longer than max_tokens is a batch alone);
//     batches <- all pools' batches, their order then shuffled with the same Rng.
//   shuffle = false (evaluation): one pool of all examples sorted by (length, index), batches
//     in that order (least padding; the seed is unused).
// Examples inside a batch are in ascending (length, index) order. Empty `lengths` give an
// empty plan. Throws qkv::Error unless max_tokens >= 1 and every length >= 1 (naming the
// first bad index).
BatchPlan batch_by_length(const std::vector<int64_t>& lengths, int64_t max_tokens, uint64_t seed, bool shuffle);

// The training plan of epoch `epoch`: batch_by_length(lengths, max_tokens, seed + 7919 epoch,
// shuffle = true) when core < 0 or core >= n. Otherwise examples [0, core) are trained on every
// epoch and [core, n) are a pool: pool <- seeded_permutation(n - core, seed + 104729) + core,
// take <- min(pool_per_epoch, n - core), and the epoch plans examples [0, core) with
// pool[(epoch take + i) mod (n - core)] for i < take (so consecutive epochs take consecutive
// slices, cycling), by batch_by_length with the same seed as above, indices mapped back to
// `lengths`. Throws qkv::Error as batch_by_length does, or for epoch < 0 or pool_per_epoch < 0.
BatchPlan plan_epoch(const std::vector<int64_t>& lengths, int64_t max_tokens, uint64_t seed, int64_t epoch,
                     int64_t core = -1, int64_t pool_per_epoch = 0);

// ---- corpora from Debian packages (src/text/corpora.cpp) ------------------------------------

// Whole-sentence German->English pairs (source = German, target = English) from the Ding
// dictionary (Debian package trans-de-en). Its lines are `German :: English`; ` | ` separates
// aligned sub-entries, the same count on both sides; `;` separates alternatives; annotations
// are {m} {pl} {vt} (grammar), [coll.] [Br.] (usage), <...> (variant spellings), (...) (notes).
// The rule, per aligned pair of sub-entries:
//   both sides must pass ding_whole_sentence() below; the pair is kept unless the same
//   (German, English) pair was kept before (first occurrence wins).
// Lines starting with '#' (the header) and blank lines are skipped. Malformed lines (counted,
// skipped): not exactly one " :: " ("no ' :: ' separator", "2 ' :: ' separators, expected
// 1"), different sub-entry counts ("3 German sub-entries but 2 English"), invalid UTF-8.
// report->used counts pairs kept. Debian 12's file (devel 2023-01-30, 206,238 lines) gives
// 17,722 pairs. Throws qkv::Error if the file cannot be read or no pair is found.
std::vector<TextPair> ding_sentence_pairs(const std::string& path = "/usr/share/trans/de-en",
                                          ReadReport* report = nullptr);

// The cleaned sentence if one Ding sub-entry (one side of one `|` column) is a whole sentence,
// else "". Steps:
//   reject if it holds '{' (a grammar tag marks a dictionary headword, not a sentence);
//   s <- the first `;` alternative (outside brackets);
//   s <- s without every (...), [...] and <...> group (nested ones too; unbalanced: reject);
//   s <- whitespace runs collapsed to one space, trimmed, no space before , . ! ? ; :
//   keep s only if: it starts with an upper-case letter (A-Z or Latin-1 À-Þ); it ends with
//   . ! or ?; it has at least 2 words; it has no '/' except between digits (slashes mark
//   alternatives: "sheer/pure"); no ellipsis (… or ...); no placeholder (etw. jd. jdm. jdn.
//   jds. sth. sb.).
std::string ding_whole_sentence(std::string_view sub_entry);

// Word and phrase pairs (source = German, target = English) from the same file: every aligned
// pair of sub-entries that is not a whole-sentence pair (both sides passing
// ding_whole_sentence()) gives the pairs of ding_phrases(German) x ding_phrases(English), each
// (German, English) pair once (first occurrence wins). "Schlange {f} [zool.] | Schlangen {pl}
// :: snake | snakes" gives (Schlange, snake) and (Schlangen, snakes). Lines and malformed lines
// are read and counted as by ding_sentence_pairs. Debian 12's file gives 686,808 pairs.
// Throws qkv::Error if the file cannot be read or no pair is found.
std::vector<TextPair> ding_phrase_pairs(const std::string& path = "/usr/share/trans/de-en",
                                        ReadReport* report = nullptr);

// The word or phrase translations one Ding sub-entry lists, cleaned: for each of its `;`
// alternatives (outside brackets), at most the first kDingPhraseAlternatives kept ones:
//   s <- the alternative without every (...), [...], <...> and {...} group (nested ones too;
//        unbalanced or crossed: skip), whitespace collapsed and trimmed as in
//        ding_whole_sentence;
//   skip s if it is empty, has more than kDingPhraseWords words, a '/' other than between
//   digits, an ellipsis or a placeholder, or repeats a kept alternative.
// "Abfall {m}; Müll {m} [ugs.]" gives {"Abfall", "Müll"}.
constexpr int64_t kDingPhraseAlternatives = 3;
constexpr int64_t kDingPhraseWords = 8;
std::vector<std::string> ding_phrases(std::string_view sub_entry);

// One message of a compiled GNU gettext catalog (.mo): `msgctxt EOT msgid [NUL msgid_plural]`
// in the original-strings table, `msgstr[0] [NUL msgstr[1] ...]` in the translations table.
struct CatalogMessage {
  std::string context;                    // msgctxt, "" when none
  std::string id;                         // msgid ("" for the catalog's header entry)
  std::string plural_id;                  // msgid_plural, "" for a message without plural forms
  std::vector<std::string> translations;  // msgstr (one), or msgstr[0..] of a plural message
};

// Every message of the compiled gettext catalog at `path`, in the file's order. The format (the
// GNU gettext manual, "The Format of GNU MO Files"): the magic number 0x950412de in the writer's
// byte order (either is read), the format revision (major 0 or 1; revision 1's system-dependent
// strings are not read), N, and the offsets of two tables of N (length, offset) pairs: the
// original strings and their translations, each string followed by a NUL byte. Throws
// qkv::Error naming the file and what is wrong when it cannot be read, is shorter than the
// 28-byte header, has another magic number or major revision, or a table or string runs past its
// end or lacks its NUL. The bytes are not checked as UTF-8 here.
std::vector<CatalogMessage> read_mo(const std::string& path);

// Sentence pairs (source = translation, target = msgid: German -> English for a German catalog)
// from compiled gettext catalogs, e.g. the German translations of Wesnoth's campaigns (Debian's
// wesnoth-1.16-* packages, scripts/get-wesnoth-text.sh): the demo's --train-only data. Per
// message, in the files' order (report->lines counts messages, report->used pairs kept):
//   skip the header (empty msgid), plural messages and untranslated ones (empty msgstr);
//   both sides lose their markup tags (a '<' followed by a letter, '/' or '!', up to the next
//   '>'; a tag left open skips the message), are split into lines at '\n', each with whitespace
//   runs collapsed to one space and trimmed, empty lines dropped; different line counts skip the
//   message;
//   each line is cut into sentences after . ! ? or … where a space and an upper-case letter (A-Z,
//   Latin-1 À-Þ) or an opening quote (" ' „ “ ‚ ‘ « ») follow; when both sides give the same
//   count the pieces are the sentences, else the whole lines;
//   a pair of pieces is kept unless the sides are equal, the English has fewer than 2 words,
//   either side holds $ % { } [ ] = @ # | _ \ & or a control character (format placeholders,
//   mnemonics, entities), is longer than 300 bytes or is not well-formed UTF-8, or the same
//   (German, English) pair was kept before.
// Throws qkv::Error for an empty `paths` or as read_mo does.
std::vector<TextPair> gettext_sentence_pairs(const std::vector<std::string>& paths, ReadReport* report = nullptr);

// Every verse of the King James Bible in canonical order (Genesis 1:1 to Revelation 22:21,
// 31,102 verses), text only, without references; runs of spaces collapsed to one. Runs the
// `bible` program of Debian's bible-kjv (`bible -f Gen1:1-Rev22:21`: one "Ge1:1 text" line per
// verse) through popen, in about 0.1 s. Throws qkv::Error if `bible` is not on PATH ("install
// bible-kjv"), exits with an error, or prints anything but 31,102 well-formed verse lines from
// Ge1:1 to Rev22:21.
std::vector<std::string> kjv_verses();

}  // namespace qkv
