// The data layer: readers (malformed lines counted and skipped, CRLF, UTF-8, errors naming the
// file), splits, LM windows, batching by length, and the Debian corpora (a Ding fixture, the
// real Ding file and the KJV when they are installed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/data.h"
#include "qkv/rng.h"

namespace {

using qkv::ReadReport;
using qkv::TextPair;
using qkv::testing::error_of;
using qkv::testing::TempDir;
using qkv::testing::write_bytes;
using namespace std::string_literals;


// ---------------------------------------------------------------------------------------------
// Readers

TEST(ReadParallelTsv, CountsAndSkipsMalformedLines) {
  TempDir dir("data");
  const std::string path = dir / "pairs.tsv";
  write_bytes(path,
              "Hello\tHallo\n"                    // 1 ok
              "no tab here\n"                     // 2 no TAB
              "a\tb\tc\n"                         // 3 two tabs
              "\tleer\n"                          // 4 empty source
              "empty target\t   \n"               // 5 empty target
              "\n"                                // 6 blank: skipped, not malformed
              "Good night\tGute Nacht\r\n"        // 7 ok, CRLF
              "bad \xC3\x28 byte\tx\n"            // 8 invalid UTF-8 at byte 5
              "  spaced  \t  out  \n");           // 9 ok, fields trimmed
  ReadReport r;
  const std::vector<TextPair> pairs = qkv::read_parallel_tsv(path, &r);
  ASSERT_EQ(pairs.size(), 3u);
  EXPECT_EQ(pairs[0].source, "Hello");
  EXPECT_EQ(pairs[0].target, "Hallo");
  EXPECT_EQ(pairs[1].source, "Good night");
  EXPECT_EQ(pairs[1].target, "Gute Nacht");  // no '\r'
  EXPECT_EQ(pairs[2].source, "spaced");
  EXPECT_EQ(pairs[2].target, "out");
  EXPECT_EQ(r.lines, 9);
  EXPECT_EQ(r.used, 3);
  EXPECT_EQ(r.malformed, 5);
  EXPECT_EQ(r.first_malformed_line, 2);
  EXPECT_EQ(r.first_malformed_reason, "no TAB");
  EXPECT_EQ(r.summary("pairs.tsv"), "pairs.tsv: 3 pairs from 9 lines; 5 malformed lines skipped (first: line 2: no TAB)");
}

TEST(ReadParallelTsv, ReasonForEachKindOfMalformedLine) {
  TempDir dir("data");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"no tab", "no TAB"},
      {"a\tb\tc\td", "3 TABs, expected 1"},
      {" \tx", "empty source"},
      {"x\t", "empty target"},
      {"x\xFF\ty", "invalid UTF-8 at byte 2"},
      {"x\ty\xE2\x82", "invalid UTF-8 at byte 4"},  // truncated sequence at the end
      {"x\0y\tz"s, "NUL byte at byte 2"},
  };
  for (const auto& [line, reason] : cases) {
    const std::string path = dir / "one.tsv";
    write_bytes(path, "ok\tgut\n" + line + "\n");
    ReadReport r;
    qkv::read_parallel_tsv(path, &r);
    EXPECT_EQ(r.malformed, 1) << line;
    EXPECT_EQ(r.first_malformed_line, 2) << line;
    EXPECT_EQ(r.first_malformed_reason, reason) << line;
  }
}

TEST(ReadParallelTsv, CrlfAndByteOrderMark) {
  TempDir dir("data");
  const std::string path = dir / "crlf.tsv";
  write_bytes(path, "\xEF\xBB\xBF" "Eins\tOne\r\nZwei\tTwo\r\nDrei\tThree");  // no final newline
  ReadReport r;
  const auto pairs = qkv::read_parallel_tsv(path, &r);
  ASSERT_EQ(pairs.size(), 3u);
  EXPECT_EQ(pairs[0].source, "Eins");  // the BOM is gone
  EXPECT_EQ(pairs[1].target, "Two");   // the CR is gone
  EXPECT_EQ(pairs[2].target, "Three");
  EXPECT_EQ(r.malformed, 0);
  EXPECT_EQ(r.summary("crlf.tsv"), "crlf.tsv: 3 pairs from 3 lines; no malformed lines");
}

TEST(ReadParallelTsv, KeepsValidMultibyteUtf8) {
  TempDir dir("data");
  const std::string path = dir / "utf8.tsv";
  write_bytes(path, "Grüße, 東京 \xF0\x9F\x98\x80\tGreetings\n");
  const auto pairs = qkv::read_parallel_tsv(path, nullptr);
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].source, "Grüße, 東京 \xF0\x9F\x98\x80");
}

TEST(Utf8Problem, RejectsEveryIllFormedSequence) {
  EXPECT_EQ(qkv::utf8_problem("plain ASCII"), "");
  EXPECT_EQ(qkv::utf8_problem("\xC3\xA4\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"), "");  // ä € 😀 U+10FFFF
  EXPECT_EQ(qkv::utf8_problem("a\x80"), "invalid UTF-8 at byte 2");              // lone continuation byte
  EXPECT_EQ(qkv::utf8_problem("\xC0\x80"), "invalid UTF-8 at byte 1");           // overlong NUL
  EXPECT_EQ(qkv::utf8_problem("\xC1\xBF"), "invalid UTF-8 at byte 1");           // overlong
  EXPECT_EQ(qkv::utf8_problem("\xE0\x80\x80"), "invalid UTF-8 at byte 1");       // overlong 3-byte
  EXPECT_EQ(qkv::utf8_problem("\xED\xA0\x80"), "invalid UTF-8 at byte 1");       // surrogate U+D800
  EXPECT_EQ(qkv::utf8_problem("\xF0\x80\x80\x80"), "invalid UTF-8 at byte 1");   // overlong 4-byte
  EXPECT_EQ(qkv::utf8_problem("\xF4\x90\x80\x80"), "invalid UTF-8 at byte 1");   // above U+10FFFF
  EXPECT_EQ(qkv::utf8_problem("\xF5\x80\x80\x80"), "invalid UTF-8 at byte 1");
  EXPECT_EQ(qkv::utf8_problem("ab\xE2\x82"), "invalid UTF-8 at byte 3");         // truncated
  EXPECT_EQ(qkv::utf8_problem("\xE2\x28\xA1"), "invalid UTF-8 at byte 1");       // bad second byte
  EXPECT_EQ(qkv::utf8_problem("\xE2\x82\x28"), "invalid UTF-8 at byte 1");       // bad third byte
  EXPECT_EQ(qkv::utf8_problem("ab\0"s), "NUL byte at byte 3");
}

TEST(ReadParallelTsv, EmptyOrUselessFileIsAnErrorNamingThePath) {
  TempDir dir("data");
  const std::string empty = dir / "empty.tsv";
  write_bytes(empty, "");
  std::string msg = error_of([&] { qkv::read_parallel_tsv(empty, nullptr); });
  EXPECT_CONTAINS(msg, empty);
  EXPECT_CONTAINS(msg, "no usable pairs in 0 lines");

  const std::string useless = dir / "useless.tsv";
  write_bytes(useless, "\nno tab\n\n");
  msg = error_of([&] { qkv::read_parallel_tsv(useless, nullptr); });
  EXPECT_CONTAINS(msg, useless);
  EXPECT_CONTAINS(msg, "no usable pairs in 3 lines (1 malformed; first: line 2: no TAB)");
}

TEST(Readers, MissingFileAndDirectoryAreErrorsNamingThePath) {
  TempDir dir("data");
  const std::string missing = dir / "missing.tsv";
  EXPECT_EQ(error_of([&] { qkv::read_parallel_tsv(missing, nullptr); }), missing + ": no such file");
  EXPECT_EQ(error_of([&] { qkv::read_labeled_tsv(missing, nullptr); }), missing + ": no such file");
  EXPECT_EQ(error_of([&] { qkv::read_lines(missing, nullptr); }), missing + ": no such file");
  EXPECT_EQ(error_of([&] { qkv::ding_sentence_pairs(missing, nullptr); }), missing + ": no such file");
  const std::string d = dir.path().string();
  EXPECT_EQ(error_of([&] { qkv::read_parallel_tsv(d, nullptr); }), d + ": is a directory, expected a text file");
  if (::geteuid() != 0) {  // root reads everything
    const std::string locked = dir / "locked.tsv";
    write_bytes(locked, "a\tb\n");
    std::filesystem::permissions(locked, std::filesystem::perms::none);
    EXPECT_CONTAINS(error_of([&] { qkv::read_parallel_tsv(locked, nullptr); }), locked + ": cannot open for reading");
  }
}

TEST(ReadParallelFiles, PairsLinesAndCountsMalformed) {
  TempDir dir("data");
  const std::string src = dir / "train.en", tgt = dir / "train.de";
  write_bytes(src, "Hello\r\n\nGood day\n\nx\xFFy\nOnly source\n");
  write_bytes(tgt, "Hallo\r\n\nGuten Tag\nOnly target\nok\n  \n");
  ReadReport r;
  const auto pairs = qkv::read_parallel_files(src, tgt, &r);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].source, "Hello");
  EXPECT_EQ(pairs[0].target, "Hallo");
  EXPECT_EQ(pairs[1].source, "Good day");
  EXPECT_EQ(pairs[1].target, "Guten Tag");
  EXPECT_EQ(r.lines, 6);
  EXPECT_EQ(r.malformed, 3);  // lines 4 (empty source), 5 (bad UTF-8), 6 (empty target)
  EXPECT_EQ(r.first_malformed_line, 4);
  EXPECT_EQ(r.first_malformed_reason, "empty source");
}

TEST(ReadParallelFiles, DifferentLineCountsNameBothFilesAndCounts) {
  TempDir dir("data");
  const std::string src = dir / "a.en", tgt = dir / "a.de";
  write_bytes(src, "one\ntwo\nthree\n");
  write_bytes(tgt, "eins\nzwei\n");
  const std::string msg = error_of([&] { qkv::read_parallel_files(src, tgt, nullptr); });
  EXPECT_CONTAINS(msg, src + " has 3 lines");
  EXPECT_CONTAINS(msg, tgt + " has 2 lines");
  // and the other way round
  const std::string msg2 = error_of([&] { qkv::read_parallel_files(tgt, src, nullptr); });
  EXPECT_CONTAINS(msg2, tgt + " has 2 lines");
  EXPECT_CONTAINS(msg2, src + " has 3 lines");
}

TEST(ReadLabeledTsv, LabelsAndTexts) {
  TempDir dir("data");
  const std::string path = dir / "labels.tsv";
  write_bytes(path, "pos\tA fine film.\r\n\tno label\nneg\tDull.\n");
  ReadReport r;
  const auto rows = qkv::read_labeled_tsv(path, &r);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].label, "pos");
  EXPECT_EQ(rows[0].text, "A fine film.");
  EXPECT_EQ(rows[1].label, "neg");
  EXPECT_EQ(r.first_malformed_line, 2);
  EXPECT_EQ(r.first_malformed_reason, "empty label");
  EXPECT_EQ(r.summary("labels.tsv"),
            "labels.tsv: 2 labeled texts from 3 lines; 1 malformed line skipped (first: line 2: empty label)");
}

TEST(ReadLines, BlankLineRunsBecomeOneParagraphBreak) {
  TempDir dir("data");
  const std::string path = dir / "text.txt";
  write_bytes(path, "\n \nFirst line\r\n  indented stays\n\n\n\t\nSecond \xC3 paragraph\nThird paragraph\n\n");
  ReadReport r;
  const auto lines = qkv::read_lines(path, &r);
  // The malformed line is skipped; the blank run before it still separates paragraphs.
  const std::vector<std::string> want = {"First line", "  indented stays", "", "Third paragraph"};
  EXPECT_EQ(lines, want);
  EXPECT_EQ(r.used, 3);
  EXPECT_EQ(r.lines, 10);
  EXPECT_EQ(r.malformed, 1);
  EXPECT_EQ(r.first_malformed_line, 8);
  EXPECT_EQ(r.first_malformed_reason, "invalid UTF-8 at byte 8");

  const std::string blank = dir / "blank.txt";
  write_bytes(blank, "\n\n   \n");
  EXPECT_CONTAINS(error_of([&] { qkv::read_lines(blank, nullptr); }), blank + ": no usable text lines in 3 lines");
}

// ---------------------------------------------------------------------------------------------
// Splits

TEST(SplitIndices, SizesDisjointCoveringAndSorted) {
  const int64_t n = 1000;
  const qkv::SplitIndices s = qkv::split_indices(n, 0.1, 0.05, 42);
  EXPECT_EQ(s.valid.size(), 100u);
  EXPECT_EQ(s.test.size(), 50u);
  EXPECT_EQ(s.train.size(), 850u);
  std::vector<int64_t> all;
  for (const auto* v : {&s.train, &s.valid, &s.test}) {
    EXPECT_TRUE(std::is_sorted(v->begin(), v->end()));
    all.insert(all.end(), v->begin(), v->end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = i;
  EXPECT_EQ(all, want);  // each index exactly once: disjoint and covering
}

TEST(SplitIndices, ReproducibleBySeed) {
  const auto a = qkv::split_indices(500, 0.2, 0.2, 7), b = qkv::split_indices(500, 0.2, 0.2, 7);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.valid, b.valid);
  EXPECT_EQ(a.test, b.test);
  const auto c = qkv::split_indices(500, 0.2, 0.2, 8);
  EXPECT_NE(a.valid, c.valid);
}

TEST(SplitIndices, SmallCorporaAndImpossibleSplits) {
  // At least one in valid and test when their fraction > 0.
  const auto s = qkv::split_indices(3, 0.01, 0.01, 1);
  EXPECT_EQ(s.train.size(), 1u);
  EXPECT_EQ(s.valid.size(), 1u);
  EXPECT_EQ(s.test.size(), 1u);
  const auto only_train = qkv::split_indices(5, 0.0, 0.0, 1);
  EXPECT_EQ(only_train.train.size(), 5u);
  EXPECT_TRUE(only_train.valid.empty() && only_train.test.empty());
  EXPECT_EQ(qkv::split_indices(2, 0.5, 0.0, 1).train.size(), 1u);

  EXPECT_CONTAINS(error_of([] { qkv::split_indices(2, 0.1, 0.1, 1); }), "n = 2 examples cannot give 1 valid and 1 test");
  EXPECT_CONTAINS(error_of([] { qkv::split_indices(10, 0.5, 0.46, 1); }), "cannot give 5 valid and 5 test");
  EXPECT_CONTAINS(error_of([] { qkv::split_indices(0, 0.1, 0.1, 1); }), "n = 0");
  EXPECT_CONTAINS(error_of([] { qkv::split_indices(10, -0.1, 0.1, 1); }), "valid_fraction = -0.1");
  EXPECT_CONTAINS(error_of([] { qkv::split_indices(10, 0.1, 1.0, 1); }), "test_fraction = 1");
  EXPECT_CONTAINS(error_of([] { qkv::split_indices(10, 0.6, 0.4, 1); }), "valid_fraction + test_fraction = 1");
}

TEST(SplitGroups, SingletonGroupsAreSplitIndices) {
  for (uint64_t seed : {1u, 7u, 42u})
    for (auto [n, vf, tf] : {std::tuple{1000, 0.1, 0.05}, std::tuple{3, 0.01, 0.01}, std::tuple{17, 0.0, 0.3}}) {
      std::vector<int64_t> group(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) group[static_cast<size_t>(i)] = i;
      const auto a = qkv::split_indices(n, vf, tf, seed), b = qkv::split_groups(group, vf, tf, seed);
      EXPECT_EQ(a.train, b.train);
      EXPECT_EQ(a.valid, b.valid);
      EXPECT_EQ(a.test, b.test);
    }
}

TEST(SplitGroups, GroupsStayWholeAndTheSplitCovers) {
  // 300 examples in groups of 1..4 (group ids shuffled by a simple rule)
  std::vector<int64_t> group;
  for (int64_t g = 0; static_cast<int64_t>(group.size()) < 300; ++g)
    for (int64_t k = 0; k <= g % 4 && group.size() < 300; ++k) group.push_back((g * 37) % 300);
  const auto s = qkv::split_groups(group, 0.1, 0.1, 3);
  std::vector<int> where(group.size(), -1);
  int part = 0;
  for (const auto* v : {&s.train, &s.valid, &s.test}) {
    EXPECT_TRUE(std::is_sorted(v->begin(), v->end()));
    for (int64_t i : *v) {
      EXPECT_EQ(where[static_cast<size_t>(i)], -1) << i;
      where[static_cast<size_t>(i)] = part;
    }
    ++part;
  }
  for (size_t i = 0; i < group.size(); ++i) {
    ASSERT_NE(where[i], -1) << i;  // covering
    for (size_t j = 0; j < group.size(); ++j) {
      if (group[i] == group[j]) {
        EXPECT_EQ(where[i], where[j]) << i << " " << j;  // whole groups
      }
    }
  }
  // with singletons among the groups, each held-out split fills exactly to its count
  EXPECT_EQ(s.valid.size(), 30u);
  EXPECT_EQ(s.test.size(), 30u);

  // a group bigger than the room left trains: never more than the count, fewer if nothing fits
  const auto big = qkv::split_groups({0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}, 0.2, 0.0, 1);  // room for 2
  EXPECT_TRUE(big.valid.empty());
  EXPECT_EQ(big.train.size(), 12u);
  const auto mixed = qkv::split_groups({0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}, 0.2, 0.0, 5);  // only {0, 1} fits
  EXPECT_EQ(mixed.valid, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(mixed.train.size(), 9u);
  EXPECT_EQ(qkv::split_groups({0, 0, 0, 0, 0, 1}, 0.2, 0.0, 1).valid, std::vector<int64_t>{5});
  EXPECT_CONTAINS(error_of([] { qkv::split_groups({0, 5, 1}, 0.3, 0.0, 1); }), "group[1] = 5, expected 0 <= g < 3");
  EXPECT_CONTAINS(error_of([] { qkv::split_groups({0, -1, 1}, 0.3, 0.0, 1); }), "group[1] = -1");
}

TEST(NearCopy, KeyIgnoresCaseAndPunctuation) {
  using qkv::near_copy_key;
  EXPECT_EQ(near_copy_key("\xE2\x80\x9EWo ist der Bahnhof?\xE2\x80\x9C"), "wo ist der bahnhof");  // „...“
  EXPECT_EQ(near_copy_key("wo  ist der Bahnhof"), "wo ist der bahnhof");
  EXPECT_EQ(near_copy_key("\xC3\x9C" "ber den Wolken \xE2\x80\x93 sch\xC3\xB6n!"), "\xC3\xBC" "ber den wolken sch\xC3\xB6n");
  EXPECT_EQ(near_copy_key("It's 24/7, isn't it?"), "it s 24 7 isn t it");
  EXPECT_EQ(near_copy_key("I\xE2\x80\x99m here."), "i m here");  // ’ as '
  EXPECT_EQ(near_copy_key("3 \xC3\x97 4"), "3 4");                   // × is not a letter
  EXPECT_EQ(near_copy_key("Stra\xC3\x9F" "e"), "stra\xC3\x9F" "e");   // ß stays (no upper case in Latin-1)
  EXPECT_EQ(near_copy_key("?!"), "");
  EXPECT_EQ(near_copy_key("a\xFF" "b\xC3"), "a b");  // invalid bytes are punctuation
  EXPECT_EQ(near_copy_key(""), "");
}

TEST(NearCopy, GroupsJoinPairsSharingEitherSideTransitively) {
  const std::vector<TextPair> pairs = {
      {"Gefällt es dir?", "Do you like it?"},      // 0
      {"Gefällt es Ihnen?", "Do you like it?"},    // 1: same English as 0
      {"Es regnet.", "It is raining."},            // 2
      {"gefällt es Ihnen", "Do you enjoy it?"},    // 3: German as 1's but for case and '?'
      {"Es regnet!", "It rains."},                 // 4: German as 2's but for punctuation
      {"Wer bist du?", "Who are you?"},            // 5
  };
  EXPECT_EQ(qkv::near_copy_groups(pairs), (std::vector<int64_t>{0, 0, 1, 0, 1, 2}));
  EXPECT_TRUE(qkv::near_copy_groups({}).empty());
}

// ---------------------------------------------------------------------------------------------
// LM windows

TEST(PackWindows, OverlapByOneAndDropThePartialWindow) {
  std::vector<int32_t> ids(11);
  for (int32_t i = 0; i < 11; ++i) ids[static_cast<size_t>(i)] = 100 + i;
  const auto w = qkv::pack_windows(ids, 4);
  ASSERT_EQ(w.size(), 2u);  // (11 - 1) / 4
  EXPECT_EQ(w[0], (std::vector<int32_t>{100, 101, 102, 103, 104}));
  EXPECT_EQ(w[1], (std::vector<int32_t>{104, 105, 106, 107, 108}));  // 109, 110 dropped

  // An exact fit uses every token; each token after the first is a target exactly once.
  ids.resize(9);
  const auto exact = qkv::pack_windows(ids, 4);
  ASSERT_EQ(exact.size(), 2u);
  std::vector<int32_t> targets;
  for (const auto& x : exact) targets.insert(targets.end(), x.begin() + 1, x.end());
  EXPECT_EQ(targets, std::vector<int32_t>(ids.begin() + 1, ids.end()));

  EXPECT_EQ(qkv::pack_windows({7, 8}, 1), (std::vector<std::vector<int32_t>>{{7, 8}}));
  EXPECT_CONTAINS(error_of([] { qkv::pack_windows({1, 2, 3, 4}, 4); }), "4 tokens, expected at least window + 1 = 5");
  EXPECT_CONTAINS(error_of([] { qkv::pack_windows({1, 2, 3}, 0); }), "window = 0");
}

// ---------------------------------------------------------------------------------------------
// Batching by length

std::vector<int64_t> random_lengths(int64_t n, uint64_t seed) {
  qkv::Rng rng(seed);
  std::vector<int64_t> len(static_cast<size_t>(n));
  for (auto& l : len) l = 1 + static_cast<int64_t>(rng.below(120));
  return len;
}

// Every index exactly once; every batch within budget or a lone over-long example; each batch
// sorted by (length, index).
void expect_valid_plan(const qkv::BatchPlan& plan, const std::vector<int64_t>& len, int64_t max_tokens) {
  std::vector<int64_t> seen;
  for (const auto& b : plan.batches) {
    ASSERT_FALSE(b.empty());
    int64_t longest = 0;
    for (int64_t i : b) longest = std::max(longest, len[static_cast<size_t>(i)]);
    if (b.size() > 1) {
      EXPECT_LE(static_cast<int64_t>(b.size()) * longest, max_tokens);
    }
    EXPECT_TRUE(std::is_sorted(b.begin(), b.end(), [&](int64_t x, int64_t y) {
      return std::pair(len[static_cast<size_t>(x)], x) < std::pair(len[static_cast<size_t>(y)], y);
    }));
    seen.insert(seen.end(), b.begin(), b.end());
  }
  std::sort(seen.begin(), seen.end());
  ASSERT_EQ(seen.size(), len.size());
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], static_cast<int64_t>(i));
}

TEST(BatchByLength, BudgetRespectedEveryIndexOnce) {
  std::vector<int64_t> len = random_lengths(20000, 3);
  len[17] = 5000;  // over-long examples: batches of their own
  len[4242] = 1025;
  const int64_t max_tokens = 1024;
  const qkv::BatchPlan plan = qkv::batch_by_length(len, max_tokens, 11, true);
  expect_valid_plan(plan, len, max_tokens);
  int lone = 0;
  for (const auto& b : plan.batches)
    if (b.size() == 1 && (b[0] == 17 || b[0] == 4242)) ++lone;
  EXPECT_EQ(lone, 2);
  // Sorting inside pools of ~100 batches keeps padding low: padded tokens / real tokens.
  double real = 0, padded = 0;
  for (const auto& b : plan.batches) {
    int64_t longest = 0;
    for (int64_t i : b) {
      real += static_cast<double>(len[static_cast<size_t>(i)]);
      longest = std::max(longest, len[static_cast<size_t>(i)]);
    }
    padded += static_cast<double>(longest) * static_cast<double>(b.size());
  }
  EXPECT_LT(padded / real, 1.1);
}

TEST(BatchByLength, DeterministicBySeedAndShuffled) {
  const std::vector<int64_t> len = random_lengths(5000, 4);
  const auto a = qkv::batch_by_length(len, 512, 1, true), b = qkv::batch_by_length(len, 512, 1, true);
  EXPECT_EQ(a.batches, b.batches);
  const auto c = qkv::batch_by_length(len, 512, 2, true);
  expect_valid_plan(c, len, 512);
  EXPECT_NE(a.batches, c.batches);
  // The batch order is shuffled: batch lengths are not monotone.
  auto longest = [&](const std::vector<int64_t>& bt) { return len[static_cast<size_t>(bt.back())]; };
  bool rises = false, falls = false;
  for (size_t i = 1; i < a.batches.size(); ++i) {
    rises |= longest(a.batches[i]) > longest(a.batches[i - 1]);
    falls |= longest(a.batches[i]) < longest(a.batches[i - 1]);
  }
  EXPECT_TRUE(rises && falls);
}

TEST(BatchByLength, WithoutShuffleOneSortedPool) {
  const std::vector<int64_t> len = {5, 3, 3, 9, 1, 4, 4, 2};
  const auto plan = qkv::batch_by_length(len, 8, 123, false);
  expect_valid_plan(plan, len, 8);
  // (length, index) order: 4(1) 7(2) 1(3) 2(3) 5(4) 6(4) 0(5) 3(9)
  const std::vector<std::vector<int64_t>> want = {{4, 7}, {1, 2}, {5, 6}, {0}, {3}};
  EXPECT_EQ(plan.batches, want);
  EXPECT_EQ(qkv::batch_by_length(len, 8, 999, false).batches, want);  // seed unused
}

TEST(BatchByLength, EdgeCasesAndErrors) {
  EXPECT_TRUE(qkv::batch_by_length({}, 10, 0, true).batches.empty());
  EXPECT_EQ(qkv::batch_by_length({3}, 1, 0, true).batches, (std::vector<std::vector<int64_t>>{{0}}));
  EXPECT_CONTAINS(error_of([] { qkv::batch_by_length({1, 2}, 0, 0, true); }), "max_tokens = 0, expected >= 1");
  EXPECT_CONTAINS(error_of([] { qkv::batch_by_length({1, 0, 2}, 8, 0, true); }), "lengths[1] = 0, expected >= 1");
}

// ---------------------------------------------------------------------------------------------
// Ding

TEST(DingWholeSentence, TheRule) {
  using qkv::ding_whole_sentence;
  EXPECT_EQ(ding_whole_sentence("Es war purer Zufall."), "Es war purer Zufall.");
  EXPECT_EQ(ding_whole_sentence("Über den Wolken ist es schön."), "Über den Wolken ist es schön.");
  EXPECT_EQ(ding_whole_sentence("Guten Appetit!; Mahlzeit!"), "Guten Appetit!");  // first alternative
  EXPECT_EQ(ding_whole_sentence("Das ist blanker Unsinn. [ugs.]"), "Das ist blanker Unsinn.");
  EXPECT_EQ(ding_whole_sentence("Unser Leben währet siebzig Jahre. (Bibelzitat)"), "Unser Leben währet siebzig Jahre.");
  EXPECT_EQ(ding_whole_sentence("Mir war nicht danach (zumute), mich zu setzen."), "Mir war nicht danach, mich zu setzen.");
  EXPECT_EQ(ding_whole_sentence("He said <hallo> hello (to (them)) twice!"), "He said hello twice!");
  EXPECT_EQ(ding_whole_sentence("Is it open (on Sundays; holidays)?; Is it open?"), "Is it open?");  // ';' in brackets
  EXPECT_EQ(ding_whole_sentence("We are open 24/7."), "We are open 24/7.");
  EXPECT_EQ(ding_whole_sentence("Baum fällt!"), "Baum fällt!");
  // Rejected:
  EXPECT_EQ(ding_whole_sentence("Aal {m}"), "");                            // grammar tag
  EXPECT_EQ(ding_whole_sentence("Er kommt {vi}."), "");                     // grammar tag
  EXPECT_EQ(ding_whole_sentence("Timber!"), "");                            // one word
  EXPECT_EQ(ding_whole_sentence("Gefahr im Verzug"), "");                   // no end mark
  EXPECT_EQ(ding_whole_sentence("to descry sth."), "");                     // lower case
  EXPECT_EQ(ding_whole_sentence("Er gab jdm. den Rest."), "");              // placeholder
  EXPECT_EQ(ding_whole_sentence("She gave sb. a hand."), "");               // placeholder
  EXPECT_EQ(ding_whole_sentence("It was sheer/pure coincidence."), "");     // slash alternative
  EXPECT_EQ(ding_whole_sentence("Leider muss ich sagen …"), "");            // ellipsis
  EXPECT_EQ(ding_whole_sentence("Wait for it... now!"), "");                // ellipsis
  EXPECT_EQ(ding_whole_sentence("Ein (kaputter Satz."), "");                // unbalanced
  EXPECT_EQ(ding_whole_sentence("Ein kaputter) Satz."), "");                // unbalanced
  EXPECT_EQ(ding_whole_sentence("„Doch“, sagte er."), "");                  // starts with a quote mark
  EXPECT_EQ(ding_whole_sentence("(Hinweis)"), "");                          // nothing left
}

TEST(DingSentencePairs, FixtureFile) {
  TempDir dir("data");
  const std::string path = dir / "de-en";
  write_bytes(path,
              "# Version :: devel 2023-01-30\n"                                                       // 1
              "# Copyright :: nobody\n"                                                               // 2
              "Zufall {m} | Es war purer Zufall. | Das war kein Zufall. :: coincidence | It was sheer "
              "coincidence. | That was no coincidence.\n"                                              // 3
              "Guten Appetit!; Mahlzeit! :: Enjoy your meal!; Bon appétit!\n"                          // 4
              "A | B :: only one\n"                                                                    // 5 malformed
              "Guten Appetit! :: Enjoy your meal! [coll.]\n"                                           // 6 duplicate
              "no separator here\n"                                                                    // 7 malformed
              "Er ist da. :: He is here. :: extra\n"                                                   // 8 malformed
              "\n"                                                                                     // 9
              "Ich bin müde. (Ausdruck) [ugs.] :: I am tired. [coll.]\r\n"                             // 10
              "Aal {m} | Aale {pl} :: eel | eels\n"                                                    // 11
              "Das ist alles. :: That's all/everything.\n"                                             // 12 slash
              "Bad \xC3 :: byte.\n");                                                                  // 13 malformed
  ReadReport r;
  const std::vector<TextPair> pairs = qkv::ding_sentence_pairs(path, &r);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"Es war purer Zufall.", "It was sheer coincidence."},
      {"Das war kein Zufall.", "That was no coincidence."},
      {"Guten Appetit!", "Enjoy your meal!"},
      {"Ich bin müde.", "I am tired."},
  };
  ASSERT_EQ(pairs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(pairs[i].source, want[i].first) << i;  // German
    EXPECT_EQ(pairs[i].target, want[i].second) << i;  // English
  }
  EXPECT_EQ(r.lines, 13);
  EXPECT_EQ(r.used, 4);
  EXPECT_EQ(r.malformed, 4);
  EXPECT_EQ(r.first_malformed_line, 5);
  EXPECT_EQ(r.first_malformed_reason, "2 German sub-entries but 1 English");

  const std::string none = dir / "none";
  write_bytes(none, "# header\nAal {m} :: eel\nkaputt\n");
  const std::string msg = error_of([&] { qkv::ding_sentence_pairs(none, nullptr); });
  EXPECT_CONTAINS(msg, none + ": no whole-sentence pairs in 3 lines (1 malformed; first: line 3: no ' :: ' separator)");
}

TEST(DingPhrases, TheRule) {
  using qkv::ding_phrases;
  using V = std::vector<std::string>;
  EXPECT_EQ(ding_phrases("Abfall {m}; M\xC3\xBCll {m} [ugs.]"), (V{"Abfall", "M\xC3\xBCll"}));
  EXPECT_EQ(ding_phrases("Schlange {f} [zool.]"), (V{"Schlange"}));
  EXPECT_EQ(ding_phrases("to topple over <> sb./sth."), V{});                      // slash and placeholder
  EXPECT_EQ(ding_phrases("jdn. umwerfen {vt}; kippen"), (V{"kippen"}));           // placeholder skipped
  EXPECT_EQ(ding_phrases("(farbiges) Emblem {n} einer Einheit (an der Uniform)"), (V{"Emblem einer Einheit"}));
  EXPECT_EQ(ding_phrases("a; b; c; d; e"), (V{"a", "b", "c"}));                    // kDingPhraseAlternatives
  EXPECT_EQ(ding_phrases("a; a [Br.]; b"), (V{"a", "b"}));                         // repeats skipped
  EXPECT_EQ(ding_phrases("one two three four five six seven eight nine; ok"), (V{"ok"}));  // > 8 words
  EXPECT_EQ(ding_phrases("Dieses Gesch\xC3\xA4" "ft ist gut in \xE2\x80\xA6 sortiert."), V{});  // ellipsis
  EXPECT_EQ(ding_phrases("kaputt) {adj}; heil"), (V{"heil"}));                     // unbalanced skipped
  EXPECT_EQ(ding_phrases("x (a; b) y; z"), (V{"x y", "z"}));                       // ';' in brackets
  EXPECT_EQ(ding_phrases("{m} [ugs.]"), V{});
}

TEST(DingPhrasePairs, FixtureFile) {
  TempDir dir("data");
  const std::string path = dir / "de-en";
  write_bytes(path,
              "# Version :: devel 2023-01-30\n"
              "Zufall {m} | Es war purer Zufall. | Das war kein Zufall. :: coincidence | It was sheer "
              "coincidence. | That was no coincidence.\n"                            // sentences left out
              "Abfall {m}; M\xC3\xBCll {m} :: waste; rubbish\n"                    // 2 x 2
              "A | B :: only one\n"                                                  // malformed
              "Abfall {m} :: waste [Am.]\n"                                          // repeated pair
              "Aal {m} | Aale {pl} :: eel | eels\n"
              "jdn. umwerfen {vt} :: to topple sb.\n");                              // nothing left
  ReadReport r;
  const std::vector<TextPair> pairs = qkv::ding_phrase_pairs(path, &r);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"Zufall", "coincidence"}, {"Abfall", "waste"}, {"Abfall", "rubbish"}, {"M\xC3\xBCll", "waste"},
      {"M\xC3\xBCll", "rubbish"}, {"Aal", "eel"}, {"Aale", "eels"},
  };
  ASSERT_EQ(pairs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(pairs[i].source, want[i].first) << i;
    EXPECT_EQ(pairs[i].target, want[i].second) << i;
  }
  EXPECT_EQ(r.lines, 7);
  EXPECT_EQ(r.used, 7);
  EXPECT_EQ(r.malformed, 1);
  EXPECT_EQ(r.first_malformed_line, 4);

  const std::string none = dir / "none";
  write_bytes(none, "# header\nEs regnet. :: It is raining.\n");
  EXPECT_CONTAINS(error_of([&] { qkv::ding_phrase_pairs(none, nullptr); }),
                  none + ": no word or phrase pairs in 2 lines");
}

TEST(DingSentencePairs, RealDictionary) {
  const std::string path = "/usr/share/trans/de-en";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not installed (Debian package trans-de-en)";
  ReadReport r;
  const std::vector<TextPair> pairs = qkv::ding_sentence_pairs(path, &r);
  EXPECT_GE(pairs.size(), 15000u);
  EXPECT_LE(pairs.size(), 25000u);
  EXPECT_EQ(r.used, static_cast<int64_t>(pairs.size()));
  std::set<std::pair<std::string, std::string>> unique;
  for (const TextPair& p : pairs) {
    // Each side is already clean: the rule leaves it as it is.
    EXPECT_EQ(qkv::ding_whole_sentence(p.source), p.source);
    EXPECT_EQ(qkv::ding_whole_sentence(p.target), p.target);
    EXPECT_EQ(p.source.find('\t'), std::string::npos);
    EXPECT_EQ(p.target.find('\t'), std::string::npos);
    unique.emplace(p.source, p.target);
  }
  EXPECT_EQ(unique.size(), pairs.size());

  // Word and phrase pairs: many more, none a whole-sentence pair, each side already clean.
  ReadReport pr;
  const std::vector<TextPair> phrases = qkv::ding_phrase_pairs(path, &pr);
  EXPECT_GE(phrases.size(), 500000u);
  EXPECT_LE(phrases.size(), 900000u);
  EXPECT_EQ(pr.lines, r.lines);
  for (const TextPair& p : phrases) {
    ASSERT_EQ(qkv::ding_phrases(p.source), std::vector<std::string>{p.source});
    ASSERT_EQ(qkv::ding_phrases(p.target), std::vector<std::string>{p.target});
    ASSERT_EQ(unique.count({p.source, p.target}), 0u) << p.source << " / " << p.target;
  }
}

// ---------------------------------------------------------------------------------------------
// KJV

bool on_path(const std::string& name) {
  const char* env = std::getenv("PATH");
  std::string path = env ? env : "";
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, end - start);
    if (::access(((dir.empty() ? "." : dir) + "/" + name).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// ---- gettext catalogs (.mo) ----------------------------------------------------------------

// A compiled catalog built by hand from the GNU gettext manual's layout: header (magic,
// revision, N, O, T, hash size 0, hash offset), the two (length, offset) tables, then the
// strings, each followed by NUL. Used for the byte-level cases msgfmt cannot write.
std::string mo_bytes(const std::vector<std::pair<std::string, std::string>>& msgs, bool big_endian = false,
                     uint32_t revision = 0) {
  std::string out;
  const auto word = [&](uint32_t v) {
    for (int k = 0; k < 4; ++k) out += static_cast<char>(big_endian ? v >> (24 - 8 * k) : v >> (8 * k));
  };
  const uint32_t n = static_cast<uint32_t>(msgs.size());
  const uint32_t originals = 28, translations = originals + 8 * n;
  uint32_t at = translations + 8 * n;
  word(0x950412de);
  word(revision);
  word(n);
  word(originals);
  word(translations);
  word(0);
  word(at);
  std::string strings;
  std::vector<uint32_t> lengths, offsets;
  for (int side = 0; side < 2; ++side)
    for (const auto& m : msgs) {
      const std::string& s = side == 0 ? m.first : m.second;
      lengths.push_back(static_cast<uint32_t>(s.size()));
      offsets.push_back(at);
      strings += s;
      strings += '\0';
      at += static_cast<uint32_t>(s.size()) + 1;
    }
  for (size_t i = 0; i < lengths.size(); ++i) {
    word(lengths[i]);
    word(offsets[i]);
  }
  return out + strings;
}

// GNU msgfmt compiles `po` into DIR/NAME.mo (with `flags`); "" when msgfmt is missing.
std::string msgfmt(const TempDir& dir, const std::string& name, const std::string& po, const std::string& flags = "") {
  if (!on_path("msgfmt")) return "";
  const std::string src = dir / (name + ".po"), mo = dir / (name + ".mo");
  write_bytes(src, po);
  const std::string cmd = "msgfmt " + flags + " -o '" + mo + "' '" + src + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return mo;
}

const char* const kPo =
    "msgid \"\"\n"
    "msgstr \"\"\n"
    "\"Content-Type: text/plain; charset=UTF-8\\n\"\n"
    "\"Plural-Forms: nplurals=2; plural=(n != 1);\\n\"\n"
    "\n"
    "msgid \"Good morning.\"\n"
    "msgstr \"Guten Morgen.\"\n"
    "\n"
    "msgctxt \"greeting\"\n"
    "msgid \"Hello there!\"\n"
    "msgstr \"Hallo, Fremder!\"\n"
    "\n"
    "msgid \"one dwarf\"\n"
    "msgid_plural \"%d dwarves\"\n"
    "msgstr[0] \"ein Zwerg\"\n"
    "msgstr[1] \"%d Zwerge\"\n"
    "\n"
    "msgid \"Untranslated text.\"\n"
    "msgstr \"\"\n"
    "\n"
    "msgid \"<i>We must hurry.</i> The orcs are near!\\nRun!\"\n"
    "msgstr \"<i>Wir müssen uns beeilen.</i> Die Orks sind nah!\\nLauft!\"\n";

TEST(ReadMo, WhatGnuMsgfmtWrites) {
  TempDir dir("data");
  for (const std::string flags : {"", "--endianness=big"}) {
    const std::string mo = msgfmt(dir, flags.empty() ? "little" : "big", kPo, flags);
    if (mo.empty()) GTEST_SKIP() << "msgfmt is not installed (Debian package gettext)";
    const std::vector<qkv::CatalogMessage> m = qkv::read_mo(mo);
    // msgfmt writes the untranslated message not at all, the rest sorted by msgid bytes (with
    // msgctxt EOT in front): "", "<i>...", "Good morning.", "greeting\x04Hello there!", "one dwarf"
    ASSERT_EQ(m.size(), 5u) << flags;
    EXPECT_EQ(m[0].id, "");
    ASSERT_EQ(m[0].translations.size(), 1u);
    EXPECT_CONTAINS(m[0].translations[0], "charset=UTF-8");
    EXPECT_EQ(m[1].id, "<i>We must hurry.</i> The orcs are near!\nRun!");
    EXPECT_EQ(m[1].translations, std::vector<std::string>{"<i>Wir müssen uns beeilen.</i> Die Orks sind nah!\nLauft!"});
    EXPECT_EQ(m[2].id, "Good morning.");
    EXPECT_EQ(m[2].context, "");
    EXPECT_EQ(m[2].translations, std::vector<std::string>{"Guten Morgen."});
    EXPECT_EQ(m[3].context, "greeting");
    EXPECT_EQ(m[3].id, "Hello there!");
    EXPECT_EQ(m[3].translations, std::vector<std::string>{"Hallo, Fremder!"});
    EXPECT_EQ(m[4].id, "one dwarf");
    EXPECT_EQ(m[4].plural_id, "%d dwarves");
    EXPECT_EQ(m[4].translations, (std::vector<std::string>{"ein Zwerg", "%d Zwerge"}));
  }
}

TEST(ReadMo, EveryDamageIsOneErrorNamingTheFile) {
  TempDir dir("data");
  const std::string good = mo_bytes({{"", "header"}, {"Yes.", "Ja."}});
  const std::string path = dir / "x.mo";
  write_bytes(path, good);
  ASSERT_EQ(qkv::read_mo(path).size(), 2u);
  write_bytes(path, mo_bytes({{"", "header"}, {"Yes.", "Ja."}}, /*big_endian=*/true, /*revision=*/1));
  const std::vector<qkv::CatalogMessage> big = qkv::read_mo(path);
  ASSERT_EQ(big.size(), 2u);
  EXPECT_EQ(big[1].id, "Yes.");
  EXPECT_EQ(big[1].translations, std::vector<std::string>{"Ja."});

  const auto error_for = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    return error_of([&] { qkv::read_mo(path); });
  };
  const auto with_word = [&](size_t at, uint32_t v) {
    std::string b = good;
    for (int k = 0; k < 4; ++k) b[at + k] = static_cast<char>(v >> (8 * k));
    return b;
  };
  EXPECT_CONTAINS(error_for(""), path + ": 0 bytes, shorter than a gettext catalog's 28-byte header");
  EXPECT_CONTAINS(error_for(good.substr(0, 27)), path + ": 27 bytes, shorter");
  EXPECT_CONTAINS(error_for("msgid \"\"\nmsgstr \"\"\n" + std::string(20, ' ')),
                  path + ": not a compiled gettext catalog (.mo)");
  EXPECT_CONTAINS(error_for(with_word(4, 2u << 16)), path + ": gettext catalog format revision 2.0; expected major revision 0 or 1");
  EXPECT_CONTAINS(error_for(with_word(8, 0x7fffffff)), path + ": its tables of 2147483647 strings");
  EXPECT_CONTAINS(error_for(with_word(16, static_cast<uint32_t>(good.size()) - 8)), "run past the end of the file");
  // the second original string's length, then its offset
  EXPECT_CONTAINS(error_for(with_word(28 + 8, 1000)), path + ": original string 1 (1000 bytes at offset");
  EXPECT_CONTAINS(error_for(with_word(28 + 12, 0xffffffff)), "runs past the end of the file");
  // a string not followed by its NUL: the first translation's length one too short
  const uint32_t header_length = 6;  // "header"
  EXPECT_CONTAINS(error_for(with_word(28 + 16, header_length - 1)), path + ": translated string 0 at offset");
  EXPECT_CONTAINS(error_for(with_word(28 + 16, header_length - 1)), "is not followed by a NUL byte");
  EXPECT_CONTAINS(error_of([&] { qkv::read_mo(dir / "missing.mo"); }), dir / "missing.mo");
  EXPECT_CONTAINS(error_of([&] { qkv::read_mo(dir.path()); }), dir.path());
}

TEST(GettextSentencePairs, TheRule) {
  TempDir dir("data");
  const std::vector<std::pair<std::string, std::string>> msgs = {
      {"", "Content-Type: text/plain; charset=UTF-8\n"},                                   // header: skipped
      {"Good morning.", "Guten Morgen."},                                                  // kept
      {"ctx\x04" "Hello there!", "Hallo, Fremder!"},                                       // context dropped
      {"one dwarf\0%d dwarves"s, "ein Zwerg\0%d Zwerge"s},                                 // plural: skipped
      {"Untranslated text.", ""},                                                          // skipped
      {"<i>We must hurry.</i> The orcs are near!\nRun now!",                               // tags, lines,
       "<i>Wir müssen uns beeilen.</i> Die Orks sind nah!\n\n  Lauft jetzt!"},             // sentences
      {"He came. She left. They met.", "Er kam, sie ging. Sie trafen sich."},              // 3 vs 2: whole line
      {"Two lines\nhere.", "Eine Zeile."},                                                 // 2 lines vs 1: skipped
      {"Gold: $gold pieces. Good luck!", "Gold: $gold Stück. Viel Glück!"},                // $: that piece only
      {"Press _Open now.", "Jetzt _Öffnen drücken."},                                      // mnemonic
      {"Tom &amp; Jerry ran.", "Tom &amp; Jerry rannten."},                                // entity
      {"<b Open tag never closed", "<b Offen"},                                            // tag left open
      {"Aye.", "Jawohl."},                                                                 // one English word
      {"Darken Volk!", "Darken Volk!"},                                                    // equal sides
      {"Good morning.", "Guten Morgen."},                                                  // duplicate
      {"Stop. “Who goes there?”", "Halt. „Wer da?“"},                                   // a quote starts one
      {"Where… are we? We are lost.", "Wo… sind wir? Wir sind verloren."},             // … then lower case
      {std::string(301, 'a') + " b.", "c d."},                                             // over 300 bytes
      {"Bad byte here.", "Schlechtes \xC3 Byte."},                                         // invalid UTF-8
  };
  const std::string a = dir / "a.mo", b = dir / "b.mo";
  write_bytes(a, mo_bytes(msgs));
  write_bytes(b, mo_bytes({{"Good morning.", "Guten Morgen."}, {"Wait here, please.", "Wartet hier, bitte."}}, true));
  ReadReport r;
  const std::vector<TextPair> pairs = qkv::gettext_sentence_pairs({a, b}, &r);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"Guten Morgen.", "Good morning."},
      {"Hallo, Fremder!", "Hello there!"},
      {"Wir müssen uns beeilen.", "We must hurry."},
      {"Die Orks sind nah!", "The orcs are near!"},
      {"Lauft jetzt!", "Run now!"},
      {"Er kam, sie ging. Sie trafen sich.", "He came. She left. They met."},
      {"Viel Glück!", "Good luck!"},
      {"„Wer da?“", "“Who goes there?”"},
      {"Wo… sind wir?", "Where… are we?"},
      {"Wir sind verloren.", "We are lost."},
      {"Wartet hier, bitte.", "Wait here, please."},
  };
  ASSERT_EQ(pairs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(pairs[i].source, want[i].first) << i;   // the translation
    EXPECT_EQ(pairs[i].target, want[i].second) << i;  // English
  }
  EXPECT_EQ(r.lines, static_cast<int64_t>(msgs.size()) + 2);  // messages read
  EXPECT_EQ(r.used, static_cast<int64_t>(want.size()));
  EXPECT_EQ(r.malformed, 0);
  EXPECT_CONTAINS(error_of([] { qkv::gettext_sentence_pairs({}, nullptr); }), "no catalog given");
}

TEST(KjvVerses, EveryVerseInOrder) {
  if (!on_path("bible")) GTEST_SKIP() << "the `bible` program is not installed (Debian package bible-kjv)";
  const std::vector<std::string> v = qkv::kjv_verses();
  ASSERT_EQ(v.size(), 31102u);
  EXPECT_EQ(v.front(), "In the beginning God created the heaven and the earth.");
  EXPECT_EQ(v[1], "And the earth was without form, and void; and darkness was upon the face of the deep. And the "
                  "Spirit of God moved upon the face of the waters.");
  EXPECT_EQ(v.back(), "The grace of our Lord Jesus Christ be with you all. Amen.");
  for (const std::string& s : v) {
    ASSERT_FALSE(s.empty());
    EXPECT_EQ(s.find("  "), std::string::npos);
    EXPECT_EQ(s.find('\t'), std::string::npos);
  }
}

TEST(KjvVerses, MissingProgramSaysWhatToInstall) {
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  TempDir dir("data");
  ::setenv("PATH", dir.path().c_str(), 1);  // an empty directory: no `bible` there
  const std::string msg = error_of([] { qkv::kjv_verses(); });
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_CONTAINS(msg, "install bible-kjv");
}

}  // namespace
