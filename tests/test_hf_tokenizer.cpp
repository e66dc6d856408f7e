// Hugging Face tokenizer.json, piece by piece: each stage checked on hand-built files, with the
// expected splits taken from the Rust library's own unit tests (huggingface/tokenizers,
// tokenizers/src: pre_tokenizers/punctuation.rs, digits.rs, whitespace.rs, metaspace.rs,
// normalizer.rs's split behaviours) where it has them; added tokens (single_word, lstrip, rstrip,
// normalized), the models' unknown and byte-fallback paths, post-processors, decoders, special
// tokens from tokenizer_config.json, Marian's files, the folder search order, save and load, and
// every load error. Parity on real vocabularies and several hundred lines of text is
// hf_tokenizer_parity.py (against @huggingface/tokenizers and SentencePiece).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/tokenizer.h"

namespace {

using Json = nlohmann::json;
using qkv::Tokenizer;
using qkv::testing::error_of;
using qkv::testing::TempDir;
using qkv::testing::write_bytes;
using Ids = std::vector<int32_t>;

void expect_mentions(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "lacks \"" << p << "\": " << msg;
}

// A WordLevel model over `words` (ids in order, "<unk>" last): what a pre-tokenizer splits into
// shows as ids, and an unexpected split as the unknown id.
Json word_level(const std::vector<std::string>& words) {
  Json vocab = Json::object();
  for (size_t i = 0; i < words.size(); ++i) vocab[words[i]] = i;
  vocab["<unk>"] = words.size();
  return {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "<unk>"}};
}

Json file_with(Json model, Json normalizer = nullptr, Json pre = nullptr, Json post = nullptr, Json decoder = nullptr,
               Json added = Json::array()) {
  return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
          {"normalizer", normalizer}, {"pre_tokenizer", pre}, {"post_processor", post}, {"decoder", decoder},
          {"model", model}};
}

std::unique_ptr<Tokenizer> make(const Json& j, const Json& config = nullptr) {
  return qkv::parse_hf_tokenizer(j.dump(), "tokenizer.json", config.is_null() ? "" : config.dump());
}

// The ids of `text` through `pre` over a WordLevel vocabulary of `words`.
Ids split_ids(const Json& pre, const std::vector<std::string>& words, const std::string& text,
              const Json& normalizer = nullptr) {
  return make(file_with(word_level(words), normalizer, pre))->encode(text);
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers (expected splits from the Rust library's tests)

TEST(HfPreTokenizer, PunctuationIsolatesEachCharacter) {
  // punctuation.rs: "Hey friend!     How are you?!?"
  const std::vector<std::string> w = {"Hey friend", "!", "     How are you", "?"};
  EXPECT_EQ(split_ids({{"type", "Punctuation"}}, w, "Hey friend!     How are you?!?"), (Ids{0, 1, 2, 3, 1, 3}));
  // MergedWithPrevious keeps "!" on "Hey friend"
  const std::vector<std::string> w2 = {"Hey friend!", "     How are you?", "!", "?"};
  EXPECT_EQ(split_ids({{"type", "Punctuation"}, {"behavior", "MergedWithPrevious"}}, w2, "Hey friend!     How are you?!?"),
            (Ids{0, 1, 2, 3}));
}

TEST(HfPreTokenizer, DigitsContiguousOrIndividual) {
  // digits.rs: "Hey 123 friend!"
  EXPECT_EQ(split_ids({{"type", "Digits"}, {"individual_digits", false}}, {"Hey ", "123", " friend!"}, "Hey 123 friend!"),
            (Ids{0, 1, 2}));
  EXPECT_EQ(split_ids({{"type", "Digits"}, {"individual_digits", true}}, {"Hey ", "1", "2", "3", " friend!"},
                      "Hey 123 friend!"),
            (Ids{0, 1, 2, 3, 4}));
  // any numeric character (char::is_numeric), not only ASCII digits
  EXPECT_EQ(split_ids({{"type", "Digits"}}, {"x", "\u0663\u0664\u00b2"}, "x\u0663\u0664\u00b2"), (Ids{0, 1}));
}

TEST(HfPreTokenizer, WhitespaceAndWhitespaceSplit) {
  // whitespace.rs: "Hey man!" -> Hey, man, !; "How are you doing?" -> ..., doing, ?
  EXPECT_EQ(split_ids({{"type", "Whitespace"}}, {"Hey", "man", "!"}, "Hey man!"), (Ids{0, 1, 2}));
  EXPECT_EQ(split_ids({{"type", "Whitespace"}}, {"How", "are", "you", "doing", "?"}, "How are you doing?"),
            (Ids{0, 1, 2, 3, 4}));
  // \w is Unicode's (letters, marks, digits): "naïve" and "日本" stay words
  EXPECT_EQ(split_ids({{"type", "Whitespace"}}, {"na\u00efve", "\u65e5\u672c", "?!"}, "na\u00efve \u65e5\u672c?!"),
            (Ids{0, 1, 2}));
  // whitespace.rs: "Hey man!" -> Hey, man!; U+0085 is whitespace (White_Space), U+FEFF is not
  EXPECT_EQ(split_ids({{"type", "WhitespaceSplit"}}, {"Hey", "man!"}, "Hey man!"), (Ids{0, 1}));
  EXPECT_EQ(split_ids({{"type", "WhitespaceSplit"}}, {"a", "b\ufeffc"}, "a\u0085b\ufeffc"), (Ids{0, 1}));
}

TEST(HfPreTokenizer, BertSplitsWhitespaceAndIsolatesPunctuation) {
  EXPECT_EQ(split_ids({{"type", "BertPreTokenizer"}}, {"Hey", "friend", "!", "How", "are", "you", "?"},
                      "Hey friend!     How are you?!?"),
            (Ids{0, 1, 2, 3, 4, 5, 6, 2, 6}));
}

TEST(HfPreTokenizer, MetaspaceReplacesPrependsAndSplits) {
  // metaspace.rs: "Hey friend!" -> ▁Hey, ▁friend!; "  Hey   friend!" -> ▁▁Hey? no: each ▁ starts a split
  const Json always = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(split_ids(always, {"\u2581Hey", "\u2581friend!"}, "Hey friend!"), (Ids{0, 1}));
  EXPECT_EQ(split_ids(always, {"\u2581", "\u2581Hey", "\u2581friend!"}, "  Hey   friend!"),
            (Ids{0, 1, 0, 0, 2}));
  // split false: one word; prepend_scheme never: no leading ▁
  Json nosplit = always;
  nosplit["split"] = false;
  EXPECT_EQ(split_ids(nosplit, {"\u2581Hey\u2581friend!"}, "Hey friend!"), (Ids{0}));
  Json never = nosplit;
  never["prepend_scheme"] = "never";
  EXPECT_EQ(split_ids(never, {"Hey\u2581friend!"}, "Hey friend!"), (Ids{0}));
  // "first": only the split that starts the input gets one (metaspace.rs: first_pretokenizer)
  Json first = nosplit;
  first["prepend_scheme"] = "first";
  const Json added = Json::array({{{"id", 3}, {"content", "<s>"}, {"special", true}, {"normalized", false}}});
  const auto tok = make(file_with(word_level({"\u2581Hey", "Hey"}), nullptr, first, nullptr, nullptr, added));
  EXPECT_EQ(tok->encode("Hey<s>Hey"), (Ids{0, 3, 1}));
  EXPECT_EQ(tok->encode("<s>Hey"), (Ids{3, 1}));
}

TEST(HfPreTokenizer, SplitBehaviours) {
  // normalizer.rs's split tests, pattern "-" in "The-final--countdown"
  const std::string text = "The-final--countdown";
  auto split = [&](const char* behavior, const std::vector<std::string>& words) {
    const Json pre = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
    return split_ids(pre, words, text);
  };
  EXPECT_EQ(split("Removed", {"The", "final", "countdown"}), (Ids{0, 1, 2}));
  EXPECT_EQ(split("Isolated", {"The", "-", "final", "countdown"}), (Ids{0, 1, 2, 1, 1, 3}));
  EXPECT_EQ(split("MergedWithPrevious", {"The-", "final-", "-", "countdown"}), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(split("MergedWithNext", {"The", "-final", "-", "-countdown"}), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(split("Contiguous", {"The", "-", "final", "--", "countdown"}), (Ids{0, 1, 2, 3, 4}));
  // invert: the matches of \w+ are the pieces kept apart from what lies between
  const Json inv = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Removed"}, {"invert", true}};
  EXPECT_EQ(split_ids(inv, {"The", "final", "countdown"}, text), (Ids{0, 1, 2}));
}

// Oniguruma's \s (what the Rust library's regexes mean) is Unicode White_Space: with U+0085, without
// U+FEFF. JavaScript's \s is the other way round, so tokenizers.js splits these two otherwise.
TEST(HfPreTokenizer, OnigurumaWhitespaceInPatterns) {
  const Json gpt2 = {{"type", "Split"},
                     {"pattern",
                      {{"Regex", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}};
  EXPECT_EQ(split_ids(gpt2, {"x", "\u0085", "y"}, "x\u0085y"), (Ids{0, 1, 2}));
  EXPECT_EQ(split_ids(gpt2, {"+\ufeff'", "d"}, "+\ufeff'd"), (Ids{0, 1}));
  EXPECT_EQ(split_ids(gpt2, {"Hello", " world", "'s", " ", " x"}, "Hello world's  x"), (Ids{0, 1, 2, 3, 4}));
}

// ---------------------------------------------------------------------------------------------
// Normalizers

TEST(HfNormalizer, BertCleansSplitsChineseStripsAccentsAndLowercases) {
  const Json n = {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
                  {"strip_accents", nullptr}, {"lowercase", true}};
  const Json pre = {{"type", "WhitespaceSplit"}};
  // NUL, U+FFFD and controls go (U+0085 too: it is Cc); tabs become spaces; 中 is padded
  EXPECT_EQ(split_ids(pre, {"a", "b", "\u4e2d", "cafe", "i"}, "A\tb\x01\u0085\ufffd\u4e2d  Caf\u00e9 \u0130", n),
            (Ids{0, 1, 2, 3, 4}));
  // cased: accents kept (strip_accents null follows lowercase)
  Json cased = n;
  cased["lowercase"] = false;
  EXPECT_EQ(split_ids(pre, {"Caf\u00e9"}, "Caf\u00e9", cased), (Ids{0}));
}

TEST(HfNormalizer, SequenceFormsStripPrependReplace) {
  const Json pre = {{"type", "WhitespaceSplit"}};
  const Json seq = {{"type", "Sequence"},
                    {"normalizers", {{{"type", "NFKC"}}, {{"type", "Lowercase"}}, {{"type", "NFD"}}, {{"type", "StripAccents"}}}}};
  EXPECT_EQ(split_ids(pre, {"fi", "abc", "naive"}, "\ufb01 \uff21\uff22\uff23 Na\u00efve", seq), (Ids{0, 1, 2}));
  // lowercase is per character: final sigma is not applied, İ becomes i + U+0307
  EXPECT_EQ(split_ids(pre, {"\u03c3\u03c3", "i\u0307"}, "\u03a3\u03a3 \u0130", {{"type", "Lowercase"}}), (Ids{0, 1}));
  // Strip, Prepend (not on empty text), Replace with a regex
  EXPECT_EQ(split_ids(nullptr, {"x y"}, "  x y \t", {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}),
            (Ids{0}));
  EXPECT_EQ(split_ids(nullptr, {"_x"}, "x", {{"type", "Prepend"}, {"prepend", "_"}}), (Ids{0}));
  EXPECT_EQ(make(file_with(word_level({"_"}), {{"type", "Prepend"}, {"prepend", "_"}}))->encode(""), Ids{});
  EXPECT_EQ(split_ids(nullptr, {"a b c"}, "a  b     c", {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}),
            (Ids{0}));
}

// ---------------------------------------------------------------------------------------------
// Models

Json bpe(const Json& vocab, const Json& merges) {
  return {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
          {"merges", merges}};
}

TEST(HfBpe, MergesByRankThenPosition) {
  const Json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"aa", 6}};
  // "bc" outranks "ab": a|bc, and no merge makes abc from a + bc
  EXPECT_EQ(make(file_with(bpe(vocab, {"b c", "a b", "ab c"})))->encode("abc"), (Ids{0, 4}));
  EXPECT_EQ(make(file_with(bpe(vocab, {"a b", "b c", "ab c"})))->encode("abc"), (Ids{5}));
  // equal pairs merge from the left: aaa -> aa a
  EXPECT_EQ(make(file_with(bpe(vocab, {"a a"})))->encode("aaa"), (Ids{6, 0}));
  // one merge at a time, as the Rust library does: after a|b -> ab, the lower-ranked (ab, a) is
  // merged before the second a|b (OpenAI's rounds would give ab ab; test_tokenizer.cpp)
  const Json v2 = {{"a", 0}, {"b", 1}, {"ab", 2}, {"aba", 3}};
  EXPECT_EQ(make(file_with(bpe(v2, {"ab a", "a b"})))->encode("abab"), (Ids{3, 1}));
  // merges as pairs read the same
  EXPECT_EQ(make(file_with(bpe(vocab, Json::array({{"a", "b"}, {"b", "c"}, {"ab", "c"}}))))->encode("abc"), (Ids{5}));
}

TEST(HfBpe, UnknownCharactersByteFallbackAndPrefixes) {
  const Json vocab = {{"a", 0}, {"b", 1}, {"<unk>", 2}, {"ab", 3}};
  Json m = bpe(vocab, {"a b"});
  // no unk_token: an unknown character is dropped, as the Rust library does (and a, b then merge)
  EXPECT_EQ(make(file_with(m))->encode("axyb"), (Ids{3}));
  m["unk_token"] = "<unk>";
  EXPECT_EQ(make(file_with(m))->encode("axyb"), (Ids{0, 2, 2, 1}));
  m["fuse_unk"] = true;
  EXPECT_EQ(make(file_with(m))->encode("axyb"), (Ids{0, 2, 1}));
  // byte fallback: "é" -> <0xC3> <0xA9>
  Json vb = vocab;
  vb["<0xC3>"] = 4;
  vb["<0xA9>"] = 5;
  Json fb = bpe(vb, {"a b"});
  fb["byte_fallback"] = true;
  const auto t = make(file_with(fb, nullptr, nullptr, nullptr,
                                {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}));
  EXPECT_EQ(t->encode("\u00e9ab"), (Ids{4, 5, 3}));
  EXPECT_EQ(t->decode({4, 5, 3}), "\u00e9ab");
  // a byte run that is not UTF-8 is one U+FFFD per byte (String::from_utf8 failed)
  EXPECT_EQ(t->decode({4, 4, 3}), "\xEF\xBF\xBD\xEF\xBF\xBD" "ab");
  // continuing_subword_prefix: "##b" after the first character; merged "a" + "##b" = "ab"
  const Json vp = {{"a", 0}, {"##b", 1}, {"ab", 2}};
  Json mp = bpe(vp, {"a ##b"});
  mp["continuing_subword_prefix"] = "##";
  EXPECT_EQ(make(file_with(mp))->encode("ab"), (Ids{2}));
  // ignore_merges: a word in the vocabulary is taken whole
  const Json vi = {{"a", 0}, {"b", 1}, {"c", 2}, {"bc", 3}, {"abc", 4}};
  Json mi = bpe(vi, {"b c"});
  EXPECT_EQ(make(file_with(mi))->encode("abc"), (Ids{0, 3}));
  mi["ignore_merges"] = true;
  EXPECT_EQ(make(file_with(mi))->encode("abc"), (Ids{4}));
}

TEST(HfWordPiece, GreedyLongestMatchAndUnknownWords) {
  const Json vocab = {{"[UNK]", 0}, {"un", 1}, {"##aff", 2}, {"##able", 3}, {"una", 4}, {"##ffable", 5}, {"x", 6}};
  const Json m = {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
                  {"max_input_chars_per_word", 8}, {"vocab", vocab}};
  const auto t = make(file_with(m, nullptr, {{"type", "WhitespaceSplit"}}, nullptr,
                                {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}));
  EXPECT_EQ(t->encode("unaffable"), (Ids{0}));  // 9 characters > 8
  EXPECT_EQ(t->encode("unaffabl x"), (Ids{0, 6}));  // no piece for the end: the whole word is unknown
  const Json m2 = {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", vocab}};
  const auto t2 = make(file_with(m2, nullptr, {{"type", "WhitespaceSplit"}}, nullptr,
                                 {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}));
  EXPECT_EQ(t2->encode("unaffable"), (Ids{4, 5}));  // "una" is longer than "un"
  EXPECT_EQ(t2->decode({4, 5, 6}), "unaffable x");
}

TEST(HfUnigram, ViterbiUnknownFusingAndByteFallback) {
  const Json vocab = Json::array({{"<unk>", 0.0}, {"a", -1.0}, {"b", -1.0}, {"ab", -1.5}, {"<0xC3>", 0.0}, {"<0xA9>", 0.0}});
  Json m = {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", vocab}, {"byte_fallback", false}};
  EXPECT_EQ(make(file_with(m))->encode("ab"), (Ids{3}));      // -1.5 beats -2
  EXPECT_EQ(make(file_with(m))->encode("abxya"), (Ids{3, 0, 1}));  // x y fused into one <unk>
  m["byte_fallback"] = true;
  EXPECT_EQ(make(file_with(m))->encode("\u00e9a"), (Ids{4, 5, 1}));
}

// ---------------------------------------------------------------------------------------------
// Added tokens, post-processors, decoders, special tokens

TEST(HfAddedTokens, SingleWordLstripRstripAndNormalized) {
  const Json pre = {{"type", "WhitespaceSplit"}};
  auto tok = [&](Json token) {
    token["id"] = 4;  // after a, b, [x] and <unk>
    const Json added = Json::array({token});
    return make(file_with(word_level({"a", "b", "[x]"}), {{"type", "Lowercase"}}, pre, nullptr, nullptr, added));
  };
  // not normalized: matched in the raw text, case-sensitively
  const auto raw = tok({{"content", "[X]"}, {"special", true}, {"normalized", false}});
  EXPECT_EQ(raw->encode("a[X]b [x]"), (Ids{0, 4, 1, 2}));
  // normalized: matched after lowercasing
  const auto norm = tok({{"content", "[X]"}, {"special", false}, {"normalized", true}});
  EXPECT_EQ(norm->encode("a[X]b [x]"), (Ids{0, 4, 1, 4}));
  // single_word: only between non-word characters
  const auto single = tok({{"content", "ab"}, {"special", true}, {"normalized", false}, {"single_word", true}});
  EXPECT_EQ(single->encode("ab ab. xab"), (Ids{4, 4, 3, 3}));
  // lstrip / rstrip take the spaces beside the token with it
  const auto strip = tok({{"content", "[X]"}, {"special", true}, {"normalized", false}, {"lstrip", true}, {"rstrip", true}});
  EXPECT_EQ(strip->encode("a  [X]  b"), (Ids{0, 4, 1}));
  // decode drops special tokens only
  EXPECT_EQ(raw->decode({0, 4, 1}), "a b");
  EXPECT_EQ(norm->decode({0, 4, 1}), "a [X] b");
}

TEST(HfPostProcessor, TemplatesBertRobertaAndSequences) {
  const Json model = word_level({"[CLS]", "[SEP]", "a"});
  const Json tmpl = {{"type", "TemplateProcessing"},
                     {"single", {{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                 {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}}},
                     {"pair", Json::array()},
                     {"special_tokens", {{"[CLS]", {{"id", "[CLS]"}, {"ids", {0}}, {"tokens", {"[CLS]"}}}},
                                         {"[SEP]", {{"id", "[SEP]"}, {"ids", {1}}, {"tokens", {"[SEP]"}}}}}}};
  EXPECT_EQ(make(file_with(model, nullptr, nullptr, tmpl))->with_special_tokens({2, 2}), (Ids{0, 2, 2, 1}));
  const Json bert = {{"type", "BertProcessing"}, {"sep", {"[SEP]", 1}}, {"cls", {"[CLS]", 0}}};
  EXPECT_EQ(make(file_with(model, nullptr, nullptr, bert))->with_special_tokens({2}), (Ids{0, 2, 1}));
  const Json seq = {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, bert}}};
  EXPECT_EQ(make(file_with(model, nullptr, nullptr, seq))->with_special_tokens({}), (Ids{0, 1}));
  EXPECT_EQ(make(file_with(model))->with_special_tokens({2}), (Ids{2}));  // no post-processor
}

TEST(HfDecoder, MetaspaceByteLevelStripAndBpe) {
  // Metaspace: every "▁" of the first token goes (the Rust decoder's rule), later ones are spaces
  const Json m = word_level({"\u2581\u2581a", "\u2581b", "c"});
  const auto meta = make(file_with(m, nullptr, nullptr, nullptr, {{"type", "Metaspace"}, {"replacement", "\u2581"}}));
  EXPECT_EQ(meta->decode({0, 1, 2}), "a bc");
  // ByteLevel: characters back to bytes, broken UTF-8 replaced
  const auto bl = make(file_with(word_level({"\u0120h\u00c3\u00a9", "\u00c3"}), nullptr, nullptr, nullptr,
                                 {{"type", "ByteLevel"}}));
  EXPECT_EQ(bl->decode({0}), " h\u00e9");
  EXPECT_EQ(bl->decode({1}), "\xEF\xBF\xBD");
  // Strip, BPEDecoder, no decoder (tokens joined with spaces)
  const auto strip = make(file_with(word_level({"__ab_"}), nullptr, nullptr, nullptr,
                                    {{"type", "Strip"}, {"content", "_"}, {"start", 1}, {"stop", 2}}));
  EXPECT_EQ(strip->decode({0}), "_ab");
  const auto bpe_dec = make(file_with(word_level({"ab</w>", "c</w>"}), nullptr, nullptr, nullptr,
                                      {{"type", "BPEDecoder"}, {"suffix", "</w>"}}));
  EXPECT_EQ(bpe_dec->decode({0, 1}), "ab c");
  EXPECT_EQ(make(file_with(word_level({"x", "y"})))->decode({0, 1}), "x y");
}

// token_bytes through the decoder (Tokenizer's default): a token's text after an ordinary token,
// so a Metaspace word start keeps its space; a byte-level token holding part of a character reads
// U+FFFD there (the documented limit); a token decoding to nothing gives its piece.
TEST(HfDecoder, TokenBytesAreTheTextATokenAddsAfterAnother) {
  const auto meta = make(file_with(word_level({"a", "\u2581b", "c"}), nullptr, nullptr, nullptr,
                                   {{"type", "Metaspace"}, {"replacement", "\u2581"}}));
  EXPECT_EQ(meta->token_bytes(1), " b");
  EXPECT_EQ(meta->token_bytes(2), "c");
  const auto bl = make(file_with(word_level({"a", "\u0120h\u00c3\u00a9", "\u00c3"}), nullptr, nullptr, nullptr,
                                 {{"type", "ByteLevel"}}));
  EXPECT_EQ(bl->token_bytes(1), " h\u00e9");
  EXPECT_EQ(bl->token_bytes(2), "\xEF\xBF\xBD");
  expect_mentions(error_of([&] { bl->token_bytes(99); }), {"token id 99"});
}

TEST(HfSpecialTokens, FromConfigOrUsualSpellings) {
  const Json added = Json::array({{{"id", 0}, {"content", "<s>"}, {"special", true}},
                                  {{"id", 1}, {"content", "</s>"}, {"special", true}},
                                  {{"id", 2}, {"content", "<pad>"}, {"special", true}},
                                  {{"id", 3}, {"content", "<mask>"}, {"special", true}}});
  const Json f = file_with(word_level({"<s>", "</s>", "<pad>", "<mask>", "a"}), nullptr, nullptr, nullptr, nullptr, added);
  const auto plain = make(f);
  EXPECT_EQ(plain->bos_id(), 0);
  EXPECT_EQ(plain->eos_id(), 1);
  EXPECT_EQ(plain->pad_id(), 2);
  EXPECT_EQ(plain->mask_id(), 3);
  const auto configured = make(f, {{"eos_token", {{"content", "<pad>"}, {"__type", "AddedToken"}}}, {"pad_token", "a"}});
  EXPECT_EQ(configured->eos_id(), 2);
  EXPECT_EQ(configured->pad_id(), 4);
  expect_mentions(error_of([&] { make(f, {{"eos_token", "<nope>"}}); }),
                  {"tokenizer_config.json", "eos_token", "\"<nope>\" is not a token"});
  // BERT: [CLS] and [SEP] stand for bos and eos
  const auto bert = make(file_with(word_level({"[PAD]", "[CLS]", "[SEP]", "[MASK]"})));
  EXPECT_EQ(bert->bos_id(), 1);
  EXPECT_EQ(bert->eos_id(), 2);
  EXPECT_EQ(bert->mask_id(), 3);
}

// ---------------------------------------------------------------------------------------------
// Errors: each names the file and the place in it

TEST(HfTokenizerJson, ClearErrors) {
  const auto err = [](const Json& j) { return error_of([&] { make(j); }); };
  const Json ok = file_with(word_level({"a"}));
  expect_mentions(error_of([] { qkv::parse_hf_tokenizer("{\"model\": ", "t.json"); }), {"t.json", "not valid JSON"});
  Json j = ok;
  j.erase("model");
  expect_mentions(err(j), {"tokenizer.json", "missing \"model\""});
  j = ok;
  j["version"] = "2.0";
  expect_mentions(err(j), {"version", "\"2.0\"", "expected \"1.0\""});
  j = ok;
  j["model"]["type"] = "Bigram";
  expect_mentions(err(j), {"model", "unknown model type \"Bigram\"", "BPE, WordPiece, Unigram and WordLevel"});
  j = ok;
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Precompiled"}, {"precompiled_charsmap", "AA=="}}}}};
  expect_mentions(err(j), {"normalizer.normalizers[1]", "\"Precompiled\" normalizer", "not supported"});
  j = ok;
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  expect_mentions(err(j), {"pre_tokenizer", "unknown pre-tokenizer type \"UnicodeScripts\""});
  j = ok;
  j["decoder"] = {{"type", "CTC"}};
  expect_mentions(err(j), {"decoder", "unknown decoder type \"CTC\""});
  j = ok;
  j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", {{{"SpecialToken", {{"id", "[CLS]"}}}}}},
                         {"special_tokens", Json::object()}};
  expect_mentions(err(j), {"post_processor.single[0]", "special token \"[CLS]\" is not in special_tokens"});
  j = ok;
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}, {"invert", false}};
  expect_mentions(err(j), {"pre_tokenizer.pattern", "(unclosed", "does not compile"});
  j = ok;
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "x"}}}, {"behavior", "Sideways"}, {"invert", false}};
  expect_mentions(err(j), {"pre_tokenizer.behavior", "\"Sideways\""});
  j = ok;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  expect_mentions(err(j), {"pre_tokenizer.replacement", "exactly one character"});
  // BPE: merges must name tokens of the vocabulary; no dropout
  expect_mentions(err(file_with(bpe({{"a", 0}, {"b", 1}}, {"a b"}))), {"model.merges[0]", "\"ab\"", "not in the vocabulary"});
  expect_mentions(err(file_with(bpe({{"a", 0}, {"b", 1}}, {"a  b"}))), {"model.merges[0]", "two tokens"});
  expect_mentions(err(file_with(bpe({{"a", 0}}, {"a c"}))), {"model.merges[0]", "\"c\" is not in the vocabulary"});
  Json drop = bpe({{"a", 0}}, Json::array());
  drop["dropout"] = 0.1;
  expect_mentions(err(file_with(drop)), {"model.dropout", "random"});
  expect_mentions(err(file_with(bpe({{"a", 0}, {"b", 0}}, Json::array()))), {"model.vocab", "id 0 is used by both"});
  expect_mentions(err(file_with(bpe({{"a", -1}}, Json::array()))), {"model.vocab", "id -1"});
  expect_mentions(err(file_with(bpe({{"a", "zero"}}, Json::array()))), {"model.vocab", "\"a\" maps to string"});
  // Unigram: [piece, score] pairs, finite scores, unk_id inside
  expect_mentions(err(file_with({{"type", "Unigram"}, {"unk_id", 5}, {"vocab", Json::array({Json::array({"a", -1.0})})}})),
                  {"model.unk_id", "5"});
  expect_mentions(err(file_with({{"type", "Unigram"}, {"vocab", Json::array({Json::array({"a"})})}})),
                  {"model.vocab[0]", "[\"piece\", score]"});
  expect_mentions(err(file_with({{"type", "Unigram"}, {"vocab", Json::array()}})), {"model.vocab", "is empty"});
  // added tokens: the id the Rust library would give, and a well-formed object
  j = ok;
  j["added_tokens"] = Json::array({{{"id", 7}, {"content", "a"}, {"special", true}}});
  expect_mentions(err(j), {"added_tokens[0]", "\"a\" has id 7", "gives it id 0"});
  j["added_tokens"] = Json::array({{{"content", "x"}}});
  expect_mentions(err(j), {"added_tokens[0]", "missing \"id\""});
  j["added_tokens"] = Json::array({{{"id", 2}, {"content", "x"}, {"special", "yes"}}});
  expect_mentions(err(j), {"added_tokens[0].special", "expected true or false"});
}

// A Sequence nested 10,000 deep used to cost memory quadratic in the depth (the place of each
// element, copied at every level) before any other check: now refused past 32, naming the limit.
TEST(HfTokenizerJson, DeeplyNestedSequencesAreRefused) {
  // tokenizer.json text with `field` = a Sequence nested `depth` deep around `inner`
  const auto nested = [](const char* field, const char* key, const char* inner, int depth) {
    std::string v = inner;
    std::string open, close;
    for (int i = 0; i < depth; ++i) open += std::string("{\"type\": \"Sequence\", \"") + key + "\": [", close += "]}";
    Json j = file_with(word_level({"a"}));
    j.erase(field);
    std::string text = j.dump();
    text.insert(1, std::string("\"") + field + "\": " + open + v + close + ", ");
    return text;
  };
  const auto parse = [](const std::string& text) { qkv::parse_hf_tokenizer(text, "tokenizer.json"); };
  // as the Hub nests: fine
  EXPECT_NO_THROW(parse(nested("normalizer", "normalizers", "{\"type\": \"Lowercase\"}", 3)));
  for (const int depth : {33, 10000}) {
    expect_mentions(error_of([&] { parse(nested("normalizer", "normalizers", "{\"type\": \"Lowercase\"}", depth)); }),
                    {"tokenizer.json", "normalizer", "nested more than 32 deep"});
    expect_mentions(error_of([&] { parse(nested("pre_tokenizer", "pretokenizers", "{\"type\": \"Whitespace\"}", depth)); }),
                    {"pre_tokenizer", "nested more than 32 deep"});
    expect_mentions(error_of([&] { parse(nested("decoder", "decoders", "{\"type\": \"Fuse\"}", depth)); }),
                    {"decoder", "nested more than 32 deep"});
  }
}

// ---------------------------------------------------------------------------------------------
// Folders: the search order, save and load, vocab.txt, Marian

TEST(HfTokenizerFolder, TokenizerJsonFirstThenSlowFilesSaveAndLoad) {
  TempDir dir("hf_tok_folder");
  const Json f = file_with(word_level({"a", "b"}), nullptr, {{"type", "WhitespaceSplit"}});
  write_bytes(dir / "tokenizer.json", f.dump());
  write_bytes(dir / "tokenizer_config.json", Json{{"eos_token", "b"}}.dump());
  const auto tok = qkv::load_tokenizer(dir.path().string());
  EXPECT_EQ(tok->type(), "hf");
  EXPECT_EQ(tok->encode("a b c"), (Ids{0, 1, 2}));
  EXPECT_EQ(tok->eos_id(), 1);
  TempDir out("hf_tok_saved");
  tok->save(out.path().string());
  EXPECT_EQ(out.entries(), (std::vector<std::string>{"qkv_tokenizer.json", "tokenizer.json", "tokenizer_config.json"}));
  const auto again = qkv::load_tokenizer(out.path().string());
  EXPECT_EQ(again->type(), "hf");
  EXPECT_EQ(again->encode("b a"), (Ids{1, 0}));
  EXPECT_EQ(again->eos_id(), 1);
}

TEST(HfTokenizerFolder, BertVocabTxtAsTransformersConvertsIt) {
  TempDir dir("hf_vocab_txt");
  write_bytes(dir / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##s\n,\nworld\ncafe\n");
  const auto tok = qkv::load_tokenizer(dir.path().string());
  EXPECT_EQ(tok->type(), "hf");
  EXPECT_EQ(tok->with_special_tokens(tok->encode("Hellos, WORLD Caf\u00e9 x")), (Ids{2, 5, 6, 7, 8, 9, 1, 3}));
  EXPECT_EQ(tok->decode({2, 5, 6, 7, 8, 3}), "hellos, world");
  EXPECT_EQ(tok->mask_id(), 4);
  write_bytes(dir / "tokenizer_config.json", Json{{"do_lower_case", false}}.dump());
  EXPECT_EQ(qkv::load_tokenizer(dir.path().string())->encode("Hello hello"), (Ids{1, 5}));
  write_bytes(dir / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nx\nx\n");
  expect_mentions(error_of([&] { qkv::load_tokenizer(dir.path().string()); }), {"vocab.txt line 6", "\"x\" appears twice"});
}

TEST(HfTokenizerFolder, MarianFilesAndRefusals) {
  // a tiny SentencePiece model for both sides (qkv trains one), vocab.json over its pieces
  std::vector<std::string> s;
  for (int i = 0; i < 200; ++i) s.push_back("hello world number " + std::to_string(i % 17) + " again");
  qkv::SentencePieceTrainOptions o;
  o.vocab_size = 300;
  const auto sp = qkv::train_sentencepiece(s, o);
  TempDir tmp("marian_spm");
  sp->save(tmp.path().string());
  const std::string model = qkv::testing::read_bytes(tmp / "tokenizer.model");
  TempDir dir("marian");
  write_bytes(dir / "source.spm", model);
  write_bytes(dir / "target.spm", model);
  Json vocab = {{"</s>", 0}, {"<unk>", 1}, {">>de<<", 2}};
  for (int64_t i = 4; i < sp->vocab_size(); ++i) vocab[sp->piece(static_cast<int32_t>(i))] = vocab.size();
  vocab["<pad>"] = vocab.size();
  write_bytes(dir / "vocab.json", vocab.dump());
  const auto tok = qkv::load_tokenizer(dir.path().string());
  EXPECT_EQ(tok->type(), "marian");
  const Ids ids = tok->with_special_tokens(tok->encode(">>de<< hello world"));
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 2);
  EXPECT_EQ(ids.back(), 0);
  const std::string back = tok->decode(ids);  // the code is an ordinary token of vocab.json
  EXPECT_EQ(back.rfind(">>de<<", 0), 0u) << back;
  EXPECT_NE(back.find("hello world"), std::string::npos) << back;
  EXPECT_EQ(tok->decode(tok->encode("hello world")), "hello world");
  EXPECT_EQ(tok->pad_id(), static_cast<int32_t>(vocab["<pad>"]));
  EXPECT_EQ(tok->bos_id(), tok->pad_id());  // Marian's decoder starts from the pad token
  TempDir out("marian_saved");
  tok->save(out.path().string());
  EXPECT_EQ(qkv::load_tokenizer(out.path().string())->encode("hello world"), tok->encode("hello world"));
  // refusals: a second target vocabulary; a vocab.json without <unk>
  write_bytes(dir / "tokenizer_config.json", Json{{"separate_vocabs", true}}.dump());
  expect_mentions(error_of([&] { qkv::load_tokenizer(dir.path().string()); }), {"separate_vocabs", "not supported"});
  std::filesystem::remove(dir / "tokenizer_config.json");
  vocab.erase("<unk>");
  write_bytes(dir / "vocab.json", vocab.dump());
  expect_mentions(error_of([&] { qkv::load_tokenizer(dir.path().string()); }), {"vocab.json", "no \"<unk>\""});
}

}  // namespace
