// text::Regex, the patterns of tokenizer.json's Split and Replace: the metered, windowed
// find_all against its unmetered twin (every search over the whole text) on random patterns and
// texts whose matches and lookarounds cross the windows' ends; a quadratic pattern refused with
// an error naming it, and through a tokenizer.json; linear patterns on long texts within budget.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "error_testing.h"
#include "qkv/tokenizer.h"
#include "text/unicode.h"

namespace {

using qkv::testing::error_of;
using qkv::text::Regex;

const char* const kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Patterns whose result depends on text past a 64-byte window: long greedy runs, lookahead at
// the end, \b, $ and \z, lazy quantifiers, empty matches, backreferences, lookbehind, Unicode.
const std::vector<std::string> kPatterns = {
    kGpt2,
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
    "a*b|.",
    "a+(?=b)|a",
    "a+(?!c)",
    "\\w+\\b",
    "\\s*",
    "a*?b",
    "(a|b)\\1+",
    "(?<=a)b+",
    "[ab]+$",
    "[ab]+\\z",
    "x|a{70,}",
    "\\p{L}+",
    "",
    "(?:ab)+c?",
};

std::string random_text(std::mt19937& rng, size_t n) {
  // runs of one piece, so that matches and lookaheads reach far
  const std::vector<std::string> pieces = {"a", "b", "c", " ", "\n", "1", "x", "é", "中", "'s", "!"};
  std::string t;
  while (t.size() < n) {
    const std::string& p = pieces[rng() % pieces.size()];
    const size_t run = rng() % 4 == 0 ? 1 + rng() % 300 : 1 + rng() % 3;
    for (size_t k = 0; k < run && t.size() < n; ++k) t += p;
  }
  return t;
}

TEST(Regex, WindowedSearchEqualsTheWholeTextSearch) {
  std::mt19937 rng(20);
  for (const std::string& p : kPatterns) {
    const Regex re(p, "test");
    for (int trial = 0; trial < 40; ++trial) {
      const std::string t = random_text(rng, rng() % 1500);
      ASSERT_EQ(re.find_all(t), re.find_all_reference(t)) << "pattern \"" << p << "\" on " << t.size() << " bytes";
    }
  }
}

TEST(Regex, QuadraticIterationIsRefusedNamingThePattern) {
  const Regex re("a*b|.", "tokenizer.json: pre_tokenizer.pattern");
  // small texts are split as the whole-text search splits them
  const std::string small(2000, 'a');
  EXPECT_EQ(re.find_all(small), re.find_all_reference(small));
  EXPECT_EQ(re.find_all(small).size(), 2000u);
  // 300 KB would rescan about 45 G bytes
  const std::string big(300000, 'a');
  const std::string msg = error_of([&] { re.find_all(big); });
  EXPECT_NE(msg.find("tokenizer.json: pre_tokenizer.pattern"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"a*b|.\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("300000 bytes"), std::string::npos) << msg;
  // an explicit budget is held to exactly: the searches from bytes 0..4 of "aaaa" each charge
  // the bytes they may look at, plus one: 5 + 4 + 3 + 2 + 1
  EXPECT_NE(error_of([&] { re.find_all("aaaa", 14); }).find("more than 14 byte steps"), std::string::npos);
  EXPECT_EQ(re.find_all("aaaa", 15).size(), 4u);
}

TEST(Regex, LinearPatternsOnLongTextsStayWithinTheBudget) {
  std::mt19937 rng(7);
  const Regex gpt2(kGpt2, "test");
  // one megabyte of mixed text, a megabyte of one letter, of spaces, of punctuation
  const std::vector<std::string> texts = {random_text(rng, 1 << 20), std::string(1 << 20, 'a'),
                                          std::string(1 << 20, ' ') + "x", std::string(1 << 20, '!')};
  for (const std::string& t : texts) {
    std::vector<std::pair<size_t, size_t>> got;
    ASSERT_NO_THROW(got = gpt2.find_all(t));
    EXPECT_EQ(got, gpt2.find_all_reference(t));
  }
}

TEST(Regex, TokenizerWithAQuadraticSplitRefusesTheTextByName) {
  using Json = nlohmann::json;
  Json j = {{"version", "1.0"},
            {"added_tokens", Json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "Split"}, {"pattern", {{"Regex", "a*b|."}}}, {"behavior", "Isolated"}, {"invert", false}}},
            {"post_processor", nullptr},
            {"decoder", nullptr},
            {"model", {{"type", "WordLevel"}, {"vocab", {{"ab", 0}, {"a", 1}, {"b", 2}, {"[UNK]", 3}}}, {"unk_token", "[UNK]"}}}};
  const auto tok = qkv::parse_hf_tokenizer(j.dump(), "tokenizer.json", "");
  EXPECT_EQ(tok->encode("abba"), (std::vector<int32_t>{0, 2, 1}));
  const std::string msg = error_of([&] { tok->encode(std::string(300000, 'a')); });
  EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a*b|."), std::string::npos) << msg;
}

}  // namespace
