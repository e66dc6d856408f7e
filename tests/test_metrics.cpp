// BLEU, chrF, 13a tokenisation and perplexity: hand-computed cases, and sacreBLEU's own published
// expected values. Where a case comes from sacreBLEU, the comment names the file of the
// mjpost/sacrebleu repository it is taken from; the tolerance is the one used there.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "error_testing.h"
#include "qkv/metrics.h"

namespace {

using qkv::BleuOptions;
using qkv::BleuSmooth;
using qkv::BleuStats;
using qkv::BleuTokenize;
using qkv::ChrfOptions;
using qkv::testing::error_of;
using Strings = std::vector<std::string>;
using Streams = std::vector<Strings>;

// ---------------------------------------------------------------------------------------------
// 13a tokenisation. Expected strings were produced by applying the four regular expressions
// and the replacements of sacreBLEU's tokenizers/tokenizer_13a.py and tokenizer_re.py with
// Python's own `re` module and str.split() (and the C++ tokenizer was fuzzed against that on
// 25,000 random strings mixing digits, punctuation, entities, newlines and Unicode spaces).

struct TokCase {
  const char* in;
  const char* want;
};

TEST(Tokenize13a, MatchesSacreBleuRules) {
  const TokCase cases[] = {
      {"Hello, world!", "Hello , world !"},
      // '.' and ',' stay inside numbers; '$' is split off
      {"It costs $3.50, or 3,000 yen.", "It costs $ 3.50 , or 3,000 yen ."},
      // a dash after a digit is split; a dash between letters is not
      {"The 1990-2000 period; a well-known fact.", "The 1990 - 2000 period ; a well-known fact ."},
      {"x-5 and 5-x and 5 - x", "x-5 and 5 - x and 5 - x"},
      {"3.14-2.71", "3.14 - 2.71"},
      // entities: &quot; &amp; &lt; &gt; unescaped, then split as punctuation
      {"&quot;Quoted&quot; &amp; &lt;tag&gt;", "\" Quoted \" & < tag >"},
      // each replacement runs once over the line, in order: &quot; before &amp;, &amp; before &lt;
      {"&amp;quot;", "& quot ;"},
      {"&amp;lt;", "<"},
      // apostrophes are not split
      {"don't can't 'quoted'", "don't can't 'quoted'"},
      {"end.", "end ."},
      {".5 and 5. and a.b and 1.5.", ". 5 and 5 . and a . b and 1.5 ."},
      {"...", ". . ."},
      {"a.,b", "a . , b"},
      {"a<skipped>b", "ab"},
      {"line-\nbreak\nnext", "linebreak next"},
      // Unicode spaces separate words as Python's str.split() does (U+00A0, U+3000, U+2009) ...
      {"tab\there\u00a0nbsp\u3000ideo\u2009thin", "tab here nbsp ideo thin"},
      // ... but U+200B (zero width space) is not whitespace
      {"a\u200bb", "a\u200bb"},
      {"(parens) [brackets] {braces}", "( parens ) [ brackets ] { braces }"},
      {"e-mail: me@x.org/path?q=1#f", "e-mail : me @ x . org / path ? q = 1 # f"},
      {"\u00dcn\u00efc\u00f6d\u00e9, \u65e5\u672c\u8a9e\u3002", "\u00dcn\u00efc\u00f6d\u00e9 , \u65e5\u672c\u8a9e\u3002"},
      {"", ""},
      {"   ", ""},
  };
  for (const auto& c : cases) EXPECT_EQ(qkv::tokenize_13a(c.in), c.want) << "input: " << c.in;
}

// ---------------------------------------------------------------------------------------------
// BLEU, hand-computed.

TEST(Bleu, IdenticalCorpusIs100) {
  const Strings text = {"The cat sat on the mat.", "Another sentence, with punctuation!"};
  const auto r = qkv::corpus_bleu(text, text);
  EXPECT_DOUBLE_EQ(r.score, 100.0);
  EXPECT_EQ(r.str(), "BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.000 hyp_len = 13 ref_len = 13)");
  EXPECT_EQ(r.signature(), "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:qkv-1");
}

TEST(Bleu, EmptyHypothesesScoreZero) {
  const auto r = qkv::corpus_bleu({"", ""}, {"a reference sentence", "another one"});
  EXPECT_EQ(r.score, 0.0);
  EXPECT_EQ(r.bp, 0.0);
  EXPECT_EQ(r.hyp_len, 0);
  EXPECT_EQ(r.ref_len, 5);
  EXPECT_EQ(r.str(), "BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 5)");
}

TEST(Bleu, HandComputedNoSmoothingNeeded) {
  // hyp "the cat sat on the mat" vs ref "the cat sat on a mat":
  // p1 = 5/6 ("the" clipped to 1), p2 = 3/5, p3 = 2/4, p4 = 1/3, BP = 1
  // BLEU = 100 * (5/6 * 3/5 * 1/2 * 1/3)^(1/4) = 100 * (1/12)^(1/4)
  const auto r = qkv::corpus_bleu({"the cat sat on the mat"}, {"the cat sat on a mat"});
  EXPECT_NEAR(r.score, 100 * std::pow(1.0 / 12, 0.25), 1e-10);
  EXPECT_EQ(r.stats.matches, (std::array<int64_t, 4>{5, 3, 2, 1}));
  EXPECT_EQ(r.stats.totals, (std::array<int64_t, 4>{6, 5, 4, 3}));
  EXPECT_NEAR(r.precisions[0], 100.0 * 5 / 6, 1e-12);
  EXPECT_EQ(r.bp, 1.0);
}

TEST(Bleu, HandComputedExpSmoothing) {
  // hyp "a b c d e" vs ref "a b x d e": p1 = 4/5, p2 = 2/4, p3 = 0/3, p4 = 0/2.
  // 'exp' smoothing: the k-th zero precision becomes 1 / (2^k * total): p3 = 1/6, p4 = 1/8.
  const auto r = qkv::corpus_bleu({"a b c d e"}, {"a b x d e"});
  EXPECT_NEAR(r.precisions[2], 100.0 / 6, 1e-12);
  EXPECT_NEAR(r.precisions[3], 100.0 / 8, 1e-12);
  EXPECT_NEAR(r.score, 100 * std::pow(0.8 * 0.5 / 6 / 8, 0.25), 1e-10);
  // no smoothing: a zero precision makes BLEU 0
  EXPECT_EQ(qkv::corpus_bleu({"a b c d e"}, {"a b x d e"}, {.smooth = BleuSmooth::none}).score, 0.0);
}

TEST(Bleu, HandComputedBrevityPenaltyAndShortHypotheses) {
  // hyp "the cat" (c = 2) vs ref "the cat sat on the mat" (r = 6): BP = exp(1 - 6/2) = e^-2.
  // There are no 3-grams, so corpus BLEU is 0; with effective order it is BP * (1 * 1)^(1/2).
  const auto r = qkv::corpus_bleu({"the cat"}, {"the cat sat on the mat"});
  EXPECT_NEAR(r.bp, std::exp(-2.0), 1e-15);
  EXPECT_EQ(r.score, 0.0);
  EXPECT_NEAR(r.ratio, 2.0 / 6, 1e-15);
  const auto e = qkv::corpus_bleu({"the cat"}, {"the cat sat on the mat"}, {.effective_order = true});
  EXPECT_NEAR(e.score, 100 * std::exp(-2.0), 1e-12);
  EXPECT_EQ(e.signature(), "nrefs:1|case:mixed|eff:yes|tok:13a|smooth:exp|version:qkv-1");
}

TEST(Bleu, CorpusSumsStatisticsAcrossSegments) {
  // Corpus BLEU is not the mean of sentence BLEUs: matches and lengths are summed first.
  const Strings hyps = {"the cat sat on the mat", "a b c d e"};
  const Strings refs = {"the cat sat on a mat", "a b x d e"};
  const auto r = qkv::corpus_bleu(hyps, refs);
  // p1 = 9/11, p2 = 5/9, p3 = 2/7, p4 = 1/5
  EXPECT_NEAR(r.score, 100 * std::pow(9.0 / 11 * 5.0 / 9 * 2.0 / 7 * 1.0 / 5, 0.25), 1e-10);
}

TEST(Bleu, UnicodeSpacesSeparateWords) {
  // U+00A0 and U+3000 split words exactly like ASCII spaces
  const auto r = qkv::corpus_bleu({"un\u00a0deux\u3000trois quatre"}, {"un deux trois quatre"});
  EXPECT_DOUBLE_EQ(r.score, 100.0);
  EXPECT_EQ(r.hyp_len, 4);
}

TEST(Bleu, TrailingWhitespaceIsStrippedBeforeTokenising) {
  // sacreBLEU rstrip()s each segment, so a trailing "-\n" keeps its dash (13a joins "-\n" only
  // inside the line).
  const auto r = qkv::corpus_bleu({"well -\n"}, {"well -"});
  EXPECT_DOUBLE_EQ(r.score, 0.0);  // 2 words, no 3-grams
  EXPECT_EQ(r.hyp_len, 2);
  EXPECT_EQ(r.stats.matches[0], 2);
}

TEST(Bleu, Errors) {
  const std::string m = error_of([] { qkv::corpus_bleu({"a", "b", "c"}, {"a", "b"}); });
  EXPECT_NE(m.find("3 hypotheses"), std::string::npos) << m;
  EXPECT_NE(m.find("2 references"), std::string::npos) << m;
  const std::string e = error_of([] { qkv::corpus_bleu({"a", "b"}, {"a", ""}); });
  EXPECT_NE(e.find("segment 1"), std::string::npos) << e;
  EXPECT_NE(error_of([] { qkv::corpus_bleu({}, {}); }).find("empty"), std::string::npos);
  const std::string s = error_of([] { qkv::corpus_bleu_multiref({"a", "b"}, Streams{{"a", "b"}, {"a"}}); });
  EXPECT_NE(s.find("reference stream 1"), std::string::npos) << s;
  EXPECT_NE(error_of([] { qkv::corpus_bleu_multiref({"a"}, Streams{}); }).find("no reference"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// BLEU: sacreBLEU's published values.

// README.md ("Using SacreBLEU from Python") and test/test_bleu.py (test_corpus_bleu_cases).
const Strings kHyps = {"The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."};
const Streams kRefs = {
    {"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
    {"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."},
};

TEST(BleuSacrebleu, ReadmeExample) {
  const auto r = qkv::corpus_bleu_multiref(kHyps, kRefs);
  EXPECT_NEAR(r.score, 48.530827, 1e-8);  // test_bleu.py: 48.530827, EPSILON 1e-8
  EXPECT_EQ(r.str(), "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)");
  // README: nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.0.0 (version is qkv's here)
  EXPECT_EQ(r.signature(), "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:qkv-1");
}

TEST(BleuSacrebleu, TestBleuCorpusCases) {
  // test/test_bleu.py test_corpus_bleu_cases, EPSILON 1e-8
  EXPECT_EQ(qkv::corpus_bleu_multiref({"", "", ""}, kRefs).score, 0.0);
  EXPECT_NEAR(qkv::corpus_bleu_multiref(kHyps, kRefs, {.tokenize = BleuTokenize::none}).score, 49.1919566, 1e-8);
  EXPECT_NEAR(qkv::corpus_bleu_multiref(kHyps, kRefs, {.tokenize = BleuTokenize::t13a}).score, 48.530827, 1e-8);
  EXPECT_NEAR(qkv::corpus_bleu_multiref(kHyps, kRefs, {.smooth = BleuSmooth::none}).score, 48.530827, 1e-8);
}

TEST(BleuSacrebleu, ReadmeVariableNumberOfReferences) {
  // README.md "Variable Number of References": the first segment has only its second reference.
  Streams refs = kRefs;
  refs[0][0] = "";
  const auto r = qkv::corpus_bleu_multiref(kHyps, refs);
  EXPECT_EQ(r.str(), "BLEU = 29.44 82.4/42.9/27.3/12.5 (BP = 0.889 ratio = 0.895 hyp_len = 17 ref_len = 19)");
  EXPECT_EQ(r.signature(), "nrefs:var|case:mixed|eff:no|tok:13a|smooth:exp|version:qkv-1");
}

// sacreBLEU's compat raw_corpus_bleu(): tokenize 'none', smoothing 'floor', effective order.
BleuOptions raw(double floor_value) {
  return {.smooth = BleuSmooth::floor, .smooth_value = floor_value, .effective_order = true,
          .tokenize = BleuTokenize::none};
}

TEST(BleuSacrebleu, TestBleuRawCases) {
  constexpr double kEps = 1e-8;  // test/test_bleu.py EPSILON
  // test_raw_bleu_cases (scores / 100)
  EXPECT_NEAR(qkv::corpus_bleu({"this is a test", "another test"}, {"ref1", "ref2"}, raw(.01)).score / 100, 0.0, kEps);
  EXPECT_NEAR(qkv::corpus_bleu({"this is a test"}, {"this is a test"}, raw(.01)).score / 100, 1.0, kEps);
  EXPECT_NEAR(qkv::corpus_bleu({"this is a fest"}, {"this is a test"}, raw(.01)).score / 100, 0.223606797749979, kEps);
  // test_case_effective_order
  EXPECT_NEAR(qkv::corpus_bleu({"test"}, {"a test"}, raw(.01)).score / 100, 0.3678794411714425, kEps);
  EXPECT_NEAR(qkv::corpus_bleu({"a test"}, {"a test"}, raw(.01)).score / 100, 1.0, kEps);
  EXPECT_NEAR(qkv::corpus_bleu({"a little test"}, {"a test"}, raw(.01)).score / 100, 0.03218297948685433, kEps);
  // test_case_statistics: counts [4, 2, 1, 0], totals [6, 5, 4, 3]
  const auto s = qkv::corpus_bleu({"am I am a character sequence"}, {"I am a symbol string sequence a a"}, raw(.01));
  EXPECT_EQ(s.stats.matches, (std::array<int64_t, 4>{4, 2, 1, 0}));
  EXPECT_EQ(s.stats.totals, (std::array<int64_t, 4>{6, 5, 4, 3}));
  // test_case_offset: floor 0.0 -> 0, the default floor 0.1 -> 0.1555722182
  EXPECT_NEAR(qkv::corpus_bleu({"am I am a character sequence"}, {"I am a symbol string sequence a a"}, raw(0.0)).score / 100,
              0.0, kEps);
  BleuOptions dflt = raw(0.1);
  dflt.smooth_value.reset();
  EXPECT_NEAR(qkv::corpus_bleu({"am I am a character sequence"}, {"I am a symbol string sequence a a"}, dflt).score / 100,
              0.1555722182, kEps);
  EXPECT_EQ(dflt.smooth_value.value_or(-1), -1);
  EXPECT_EQ(qkv::corpus_bleu({"a"}, {"a"}, dflt).signature(),
            "nrefs:1|case:mixed|eff:yes|tok:none|smooth:floor[0.10]|version:qkv-1");
}

TEST(BleuSacrebleu, TestBleuFromStatistics) {
  // test/test_bleu.py test_case_scoring: compute_bleu([9,7,5,3], [10,8,6,4], 11, 11) with its
  // default smoothing 'none' = 0.8375922397
  BleuStats st{.matches = {9, 7, 5, 3}, .totals = {10, 8, 6, 4}, .hyp_len = 11, .ref_len = 11};
  EXPECT_NEAR(qkv::bleu_from_stats(st, {.smooth = BleuSmooth::none}).score / 100, 0.8375922397, 1e-8);
  // test_case_degenerate_stats: smoothing 'floor' with the given value, expected exactly 0.0
  struct Degenerate {
    BleuStats st;
    double floor;
  };
  const Degenerate cases[] = {
      {{{0, 0, 0, 0}, {4, 4, 2, 1}, 0, 1}, 0.0},     {{{0, 0, 0, 0}, {10, 11, 12, 0}, 14, 10}, 0.0},
      {{{0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0}, 0.0},     {{{6, 5, 4, 0}, {6, 5, 4, 3}, 6, 6}, 0.0},
      {{{0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0}, 0.1},     {{{0, 0, 0, 0}, {0, 0, 0, 0}, 1, 5}, 0.01},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(qkv::bleu_from_stats(c.st, {.smooth = BleuSmooth::floor, .smooth_value = c.floor}).score, 0.0);
  }
}

TEST(BleuSacrebleu, TestSentenceBleuCases) {
  // test/test_sentence_bleu.py (example from sacreBLEU issue #98), effective order, EPSILON 1e-3
  const Strings ref = {"producţia de zahăr brut se exprimă în zahăr alb;"};
  const Strings sys = {"Producția de zahăr primă va fi exprimată în ceea ce privește zahărul alb;"};
  struct Case {
    BleuSmooth smooth;
    std::optional<double> value;
    BleuTokenize tok;
    double expected;
  };
  const Case cases[] = {
      {BleuSmooth::exp, {}, BleuTokenize::t13a, 8.493},     {BleuSmooth::none, {}, BleuTokenize::t13a, 0.0},
      {BleuSmooth::floor, {}, BleuTokenize::t13a, 4.51688}, {BleuSmooth::floor, 0.1, BleuTokenize::t13a, 4.51688},
      {BleuSmooth::floor, 0.5, BleuTokenize::t13a, 10.10},  {BleuSmooth::add_k, {}, BleuTokenize::t13a, 14.882},
      {BleuSmooth::add_k, 1, BleuTokenize::t13a, 14.882},   {BleuSmooth::add_k, 2, BleuTokenize::t13a, 21.389},
      {BleuSmooth::exp, {}, BleuTokenize::none, 7.347},
  };
  for (const auto& c : cases) {
    const BleuOptions o{.smooth = c.smooth, .smooth_value = c.value, .effective_order = true, .tokenize = c.tok};
    const auto r = qkv::corpus_bleu(sys, ref, o);
    EXPECT_NEAR(r.score, c.expected, 1e-3) << r.signature();
  }
  // test_cases_zero_bleu (issue #141): no match at all is 0 whatever the smoothing
  for (BleuSmooth s : {BleuSmooth::exp, BleuSmooth::none, BleuSmooth::floor, BleuSmooth::add_k}) {
    EXPECT_EQ(qkv::corpus_bleu({"this is a cat"}, {"okay thanks"}, {.smooth = s, .effective_order = true}).score, 0.0);
  }
}

// ---------------------------------------------------------------------------------------------
// chrF

TEST(Chrf, IdenticalIs100EmptyIs0) {
  const Strings text = {"Ein kleiner Test.", "Noch einer!"};
  const auto r = qkv::corpus_chrf(text, text);
  EXPECT_DOUBLE_EQ(r.score, 100.0);
  EXPECT_EQ(r.str(), "chrF2 = 100.00");
  EXPECT_EQ(r.signature(), "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:qkv-1");
  EXPECT_EQ(qkv::corpus_chrf({"", ""}, text).score, 0.0);
}

TEST(Chrf, CountsCodePointsNotBytes) {
  // "éa" vs "éb" in code points: 1-grams 1/2 both ways, 2-grams 0/1; effective order 2;
  // P = R = (1/2 + 0) / 2 = 1/4, so chrF = 25. (Counted in bytes it would be 38.9.)
  EXPECT_NEAR(qkv::corpus_chrf({"\u00e9a"}, {"\u00e9b"}).score, 25.0, 1e-12);
  // "日本語" vs "日本人": 2/3, 1/2, 0/1 -> P = R = 7/18
  EXPECT_NEAR(qkv::corpus_chrf({"\u65e5\u672c\u8a9e"}, {"\u65e5\u672c\u4eba"}).score, 100.0 * 7 / 18, 1e-12);
  // Unicode whitespace is removed like ASCII whitespace
  EXPECT_DOUBLE_EQ(qkv::corpus_chrf({"a\u00a0b\u3000c"}, {"abc"}).score, 100.0);
}

TEST(Chrf, HandComputedChrfPlusPlus) {
  // hyp "hi!" vs ref "hi", chrF++ (word order 2), beta 2:
  //   chars 1: P 2/3, R 1;  chars 2: P 1/2, R 1;  chars 3+: no reference n-grams (skipped)
  //   words ("hi" "!" vs "hi") 1: P 1/2, R 1;  words 2: no reference bigram (skipped)
  //   P = (2/3 + 1/2 + 1/2) / 3 = 5/9, R = 1, F2 = 5 P R / (4 P + R) = 25/29
  const auto r = qkv::corpus_chrf({"hi!"}, {"hi"}, {.word_order = 2});
  EXPECT_NEAR(r.score, 100.0 * 25 / 29, 1e-12);
  EXPECT_EQ(r.str(), "chrF2++ = 86.21");
  EXPECT_EQ(r.signature(), "nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:qkv-1");
}

TEST(Chrf, CorpusSumsStatisticsBeforeAveraging) {
  // {"ab","c"} vs {"ab","d"}: summed 1-grams 2/3, summed 2-grams 1/1 -> P = R = 5/6, chrF 83.3
  // (the mean of the sentence scores, 100 and 0, would be 50).
  EXPECT_NEAR(qkv::corpus_chrf({"ab", "c"}, {"ab", "d"}).score, 100.0 * 5 / 6, 1e-12);
}

TEST(Chrf, Errors) {
  const std::string m = error_of([] { qkv::corpus_chrf({"a"}, {"a", "b"}); });
  EXPECT_NE(m.find("1 hypotheses"), std::string::npos) << m;
  EXPECT_NE(m.find("2 references"), std::string::npos) << m;
  EXPECT_NE(error_of([] { qkv::corpus_chrf({"a"}, {""}); }).find("segment 0"), std::string::npos);
  EXPECT_NE(error_of([] { qkv::corpus_chrf({"a"}, {"a"}, {.char_order = 0}); }).find("char_order"),
            std::string::npos);
}

TEST(ChrfSacrebleu, ReadmeExample) {
  // README.md: chrf.corpus_score(sys, refs) -> chrF2 = 59.73
  EXPECT_EQ(qkv::corpus_chrf_multiref(kHyps, kRefs).str(), "chrF2 = 59.73");
}

struct ChrfCase {
  Strings hyps, refs;
  double expected;
};

TEST(ChrfSacrebleu, TestChrfEpsSmoothing) {
  // test/test_chrf.py test_cases: char_order 6, word_order 0, beta 3, eps_smoothing, EPSILON 1e-4
  const ChrfCase cases[] = {
      {{"abcdefg"}, {"hijklmnop"}, 0.0},
      {{"a"}, {"b"}, 0.0},
      {{""}, {"b"}, 0.0},
      {{""}, {"ref"}, 0.0},
      {{""}, {"reference"}, 0.0},
      {{"aa"}, {"ab"}, 8.3333},
      {{"a", "b"}, {"a", "c"}, 8.3333},
      {{"a"}, {"a"}, 16.6667},
      {{"a b c"}, {"a b c"}, 50.0},
      {{"a b c"}, {"abc"}, 50.0},
      {{" risk assessment must be made of those who are qualified and expertise in the sector - these are the scientists ."},
       {"risk assessment has to be undertaken by those who are qualified and expert in that area - that is the scientists ."},
       63.361730},
      {{" Die    Beziehung zwischen  Obama und Netanjahu ist nicht gerade  freundlich. "},
       {"Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich."},
       64.1302698},
      {{"Niemand hat die Absicht, eine Mauer zu errichten"}, {"Niemand hat die Absicht, eine Mauer zu errichten"}, 100.0},
  };
  for (const auto& c : cases) {
    const double s = qkv::corpus_chrf(c.hyps, c.refs, {.char_order = 6, .word_order = 0, .beta = 3, .eps_smoothing = true}).score;
    EXPECT_NEAR(s, c.expected, 1e-4) << c.hyps[0];
  }
}

TEST(ChrfSacrebleu, TestChrfEffectiveOrder) {
  // test/test_chrf.py test_cases_effective_order: beta 3, eps_smoothing off (sacreBLEU's default
  // averaging), EPSILON 1e-4
  const ChrfCase cases[] = {
      {{"a"}, {"a"}, 100.0},      {{""}, {"reference"}, 0.0},       {{"a b c"}, {"a b c"}, 100.0},
      {{"a b c"}, {"abc"}, 100.0}, {{""}, {"c"}, 0.0},                {{"a", "b"}, {"a", "c"}, 50.0},
      {{"aa"}, {"ab"}, 25.0},
  };
  for (const auto& c : cases) {
    EXPECT_NEAR(qkv::corpus_chrf(c.hyps, c.refs, {.beta = 3}).score, c.expected, 1e-4) << c.hyps[0];
  }
}

TEST(ChrfSacrebleu, TestChrfKeepWhitespace) {
  // test/test_chrf.py test_cases_keep_whitespace: beta 3, remove_whitespace=False, EPSILON 1e-4
  const ChrfCase cases[] = {
      {{"Die Beziehung zwischen Obama und Netanjahu ist nicht gerade freundlich."},
       {"Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich."},
       67.3481606},
      {{"risk assessment must be made of those who are qualified and expertise in the sector - these are the scientists ."},
       {"risk assessment has to be undertaken by those who are qualified and expert in that area - that is the scientists ."},
       65.2414427},
  };
  for (const auto& c : cases) {
    EXPECT_NEAR(qkv::corpus_chrf(c.hyps, c.refs, {.beta = 3, .whitespace = true}).score, c.expected, 1e-4);
  }
}

TEST(ChrfSacrebleu, TestChrfSentenceLevel) {
  // test/test_chrf.py test_sentence_level_chrf: sentence_chrf(..., eps_smoothing=True), beta 2,
  // EPSILON 1e-4; Czech, so these also exercise multi-byte characters.
  const ChrfCase cases[] = {
      {{"Co nás nejvíc trápí, protože lékaři si vybírají, kdo bude žít a kdo zemře."},
       {"Nejvíce smutní jsme z toho, že musíme rozhodovat o tom, kdo bude žít a kdo zemře."},
       39.14078509},
      {{"Nebo prostě nemají vybavení, které by jim pomohlo, uvedli lékaři."},
       {"A někdy nemáme ani potřebný materiál, abychom jim pomohli, popsali lékaři."},
       31.22557079},
      {{"Lapali po dechu, jejich životy skončily dřív, než skutečně začaly."},
       {"Lapali po dechu a pak jejich život skončil - dřív, než skutečně mohl začít, připomněli."},
       57.15704367},
  };
  for (const auto& c : cases) {
    EXPECT_NEAR(qkv::corpus_chrf(c.hyps, c.refs, {.eps_smoothing = true}).score, c.expected, 1e-4) << c.hyps[0];
  }
}

// ---------------------------------------------------------------------------------------------
// perplexity

TEST(Perplexity, ExpOfMeanNll) {
  EXPECT_EQ(qkv::perplexity(0.0), 1.0);
  EXPECT_NEAR(qkv::perplexity(std::log(50.0)), 50.0, 1e-12);
  EXPECT_EQ(qkv::perplexity(std::numeric_limits<double>::infinity()), std::numeric_limits<double>::infinity());
  const std::string m = error_of([] { qkv::perplexity(-0.5); });
  EXPECT_NE(m.find("-0.5"), std::string::npos) << m;
  EXPECT_NE(error_of([] { qkv::perplexity(std::nan("")); }).find("nan"), std::string::npos);
}

}  // namespace
