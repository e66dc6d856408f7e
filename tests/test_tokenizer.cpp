// Tokenizers: UTF-8 checking and repair, the byte tokenizer, GPT-2 BPE on a hand-built vocabulary
// (against a plain transcription of OpenAI's merge loop), SentencePiece training, save/load of
// every kind, and every load error. Parity with OpenAI's real GPT-2 vocabulary is
// test_gpt2_parity (gpt2_parity.cmake), which needs npm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/tokenizer.h"

namespace {

using Json = nlohmann::json;
using qkv::Tokenizer;
using qkv::testing::error_of;
using qkv::testing::read_bytes;
using qkv::testing::TempDir;
using qkv::testing::write_bytes;
using Ids = std::vector<int32_t>;

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Expects `msg` to contain every one of `parts`.
void expect_mentions(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "lacks \"" << p << "\": " << msg;
}

// Text in several scripts, emoji with ZWJ and skin tones, combining marks, odd spaces.
const std::vector<std::string> kTexts = {
    "",
    "hello world",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\n\n\n",
    "caf\u00e9 na\u0131\u0308ve Stra\u00dfe",
    "\u4f60\u597d\uff0c\u4e16\u754c",
    "\u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947",
    "\U0001F44D\U0001F3FD \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 \U0001F3F3\uFE0F\u200D\U0001F308",
    "e\u0301 a\u00a0b \u3000 \u2028",
    "don't I'LL 12345 678",
};

// ---------------------------------------------------------------------------------------------
// UTF-8

struct BadUtf8 {
  std::string text;
  size_t offset;
  const char* kind;
};

const BadUtf8 kBadUtf8[] = {
    {"ab\xE2\x82", 2, "truncated"},              // euro sign cut short by the end
    {"ab\xE2\x82z", 2, "truncated"},             // ... and by an ASCII byte
    {"x\xF0\x9F\x98", 1, "truncated"},           // emoji missing its last byte
    {"abc\xC0\xAF", 3, "overlong"},              // '/' in two bytes
    {"\xE0\x80\xAF", 0, "overlong"},             // '/' in three bytes
    {"\xF0\x80\x80\xAF", 0, "overlong"},         // '/' in four bytes
    {"ok \xED\xA0\x80", 3, "surrogate"},         // U+D800
    {"\xED\xBF\xBF", 0, "surrogate"},            // U+DFFF
    {"hello\x80", 5, "continuation"},            // stray continuation byte
    {"\xBF", 0, "continuation"},
    {"a\xF4\x90\x80\x80", 1, "above U+10FFFF"},  // U+110000
    {"a\xF5\x80\x80\x80", 1, "above U+10FFFF"},
    {"ab\xFF", 2, "never occurs"},
};

TEST(Utf8, CheckNamesTheOffsetAndTheFault) {
  for (const BadUtf8& c : kBadUtf8) {
    const std::string msg = error_of([&] { qkv::check_utf8(c.text, "the text"); });
    EXPECT_EQ(msg.rfind("the text is not valid UTF-8", 0), 0u) << msg;
    expect_mentions(msg, {"byte offset " + std::to_string(c.offset) + " ", c.kind});
  }
  for (const std::string& t : kTexts) EXPECT_NO_THROW(qkv::check_utf8(t, "text"));
  EXPECT_NO_THROW(qkv::check_utf8("\xF4\x8F\xBF\xBF \xEE\x80\x80 \xEF\xBB\xBF", "max, private use, BOM"));
}

// One U+FFFD per maximal invalid subpart, as Python's bytes.decode('utf-8', 'replace').
TEST(Utf8, ReplaceInvalidLikePython) {
  const std::string r = kReplacement;
  EXPECT_EQ(qkv::utf8_replace_invalid("ab\xE2\x82"), "ab" + r);
  EXPECT_EQ(qkv::utf8_replace_invalid("\xE2\x82z"), r + "z");
  EXPECT_EQ(qkv::utf8_replace_invalid("\xF0\x9F\x98"), r);
  EXPECT_EQ(qkv::utf8_replace_invalid("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(qkv::utf8_replace_invalid("\xC0\xAF"), r + r);
  EXPECT_EQ(qkv::utf8_replace_invalid("\xE0\x80\xAF"), r + r + r);
  EXPECT_EQ(qkv::utf8_replace_invalid("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(qkv::utf8_replace_invalid("a\x80\x80" "b"), "a" + r + r + "b");
  EXPECT_EQ(qkv::utf8_replace_invalid("\xF1\x80\x80\xE1\x80\xC2"), r + r + r);
  for (const std::string& t : kTexts) EXPECT_EQ(qkv::utf8_replace_invalid(t), t);
}

// ---------------------------------------------------------------------------------------------
// Byte tokenizer

TEST(Utf8, DecodeGivesCodePointsAndRejectsWhatCheckRejects) {
  const std::string text = "a\xC3\xA4\xE2\x82\xAC\xF0\x9F\x98\x80";  // a ä € 😀
  const char32_t want[] = {U'a', 0xE4, 0x20AC, 0x1F600};
  size_t i = 0;
  for (char32_t w : want) {
    char32_t cp = 0;
    const size_t len = qkv::decode_utf8(text, i, cp);
    ASSERT_GT(len, 0u) << "at " << i;
    EXPECT_EQ(cp, w) << "at " << i;
    i += len;
  }
  EXPECT_EQ(i, text.size());
  char32_t cp = 0;
  for (const char* bad : {"\x80", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82"}) {
    EXPECT_EQ(qkv::decode_utf8(bad, 0, cp), 0u) << bad;
    EXPECT_EQ(qkv::invalid_utf8_offset(bad), 0) << bad;
  }
  EXPECT_EQ(qkv::invalid_utf8_offset(text), -1);
  EXPECT_EQ(qkv::invalid_utf8_offset("ok\xFF"), 2);
}

TEST(ByteTokenizer, IdsAreBytesPlusThree) {
  const auto tok = qkv::make_byte_tokenizer();
  EXPECT_EQ(tok->type(), "byte");
  EXPECT_EQ(tok->vocab_size(), 259);
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->encode("A\xC3\xA9"), (Ids{3 + 'A', 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok->encode("\U0001F600"), (Ids{3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}));
}

TEST(ByteTokenizer, RoundTripsEveryText) {
  const auto tok = qkv::make_byte_tokenizer();
  for (const std::string& t : kTexts) {
    EXPECT_EQ(tok->encode(t).size(), t.size());
    EXPECT_EQ(tok->decode(tok->encode(t)), t);
  }
}

TEST(ByteTokenizer, DecodeDropsSpecialsAndReplacesBrokenUtf8) {
  const auto tok = qkv::make_byte_tokenizer();
  EXPECT_EQ(tok->decode({1, 3 + 'h', 0, 3 + 'i', 2, 0}), "hi");
  EXPECT_EQ(tok->decode({3 + 'a', 3 + 0xF0, 3 + 0x9F, 3 + 'b'}), std::string("a") + kReplacement + "b");
  EXPECT_EQ(tok->decode({3 + 0xED, 3 + 0xA0, 3 + 0x80}), std::string(kReplacement) + kReplacement + kReplacement);
}

TEST(ByteTokenizer, RejectsInvalidUtf8AndOutOfRangeIds) {
  const auto tok = qkv::make_byte_tokenizer();
  for (const BadUtf8& c : kBadUtf8)
    expect_mentions(error_of([&] { tok->encode(c.text); }),
                    {"not valid UTF-8", "byte offset " + std::to_string(c.offset) + " "});
  expect_mentions(error_of([&] { tok->decode({5, 259}); }), {"id 259 at position 1", "[0, 259)"});
  expect_mentions(error_of([&] { tok->decode({-1}); }), {"id -1 at position 0"});
  expect_mentions(error_of([&] { tok->piece(300); }), {"300", "[0, 259)"});
}

TEST(ByteTokenizer, Pieces) {
  const auto tok = qkv::make_byte_tokenizer();
  EXPECT_EQ(tok->piece(0), "<pad>");
  EXPECT_EQ(tok->piece(1), "<s>");
  EXPECT_EQ(tok->piece(2), "</s>");
  EXPECT_EQ(tok->piece(3 + 'a'), "a");
  EXPECT_EQ(tok->piece(3 + ' '), "\u2581");
  EXPECT_EQ(tok->piece(3 + '\n'), "<0x0A>");
  EXPECT_EQ(tok->piece(3 + 0xC3), "<0xC3>");
}

TEST(ByteTokenizer, SaveAndLoad) {
  TempDir dir("tok_byte");
  qkv::make_byte_tokenizer()->save(dir.path().string());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"qkv_tokenizer.json"});
  EXPECT_EQ(Json::parse(read_bytes(dir / "qkv_tokenizer.json")), Json({{"type", "byte"}}));
  const auto tok = qkv::load_tokenizer(dir.path().string());
  EXPECT_EQ(tok->type(), "byte");
  EXPECT_EQ(tok->decode(tok->encode(kTexts[7])), kTexts[7]);
}

// ---------------------------------------------------------------------------------------------
// GPT-2 on a hand-built vocabulary

// GPT-2's byte alphabet, written out independently of the library.
std::string spell(const std::string& bytes) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      const int cp = self ? b : next++;
      t[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                       : std::string{static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
    }
    return t;
  }();
  std::string out;
  for (unsigned char c : bytes) out += table[c];
  return out;
}

// A vocabulary: the 256 bytes (ids 0..255), merge results in order, then <|endoftext|>.
struct Fixture {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes, rank order
  std::map<std::string, int32_t> ids;

  explicit Fixture(std::vector<std::pair<std::string, std::string>> m) : merges(std::move(m)) {
    for (int b = 0; b < 256; ++b) ids[std::string(1, static_cast<char>(b))] = b;
    for (const auto& [a, b] : merges) ids.emplace(a + b, static_cast<int32_t>(ids.size()));
    ids.emplace("<|endoftext|>", static_cast<int32_t>(ids.size()));
  }
  std::string encoder_json() const {
    Json j = Json::object();
    for (const auto& [t, id] : ids) j[spell(t)] = id;
    return j.dump();
  }
  std::string vocab_bpe() const {
    std::string s = "#version: 0.2\n";
    for (const auto& [a, b] : merges) s += spell(a) + " " + spell(b) + "\n";
    return s;
  }
  std::unique_ptr<Tokenizer> tokenizer() const { return qkv::parse_gpt2_tokenizer(encoder_json(), vocab_bpe()); }

  // OpenAI's merge loop as written in encoder.py: lowest-rank pair, every occurrence, repeat.
  Ids reference_word(const std::string& word) const {
    std::map<std::pair<std::string, std::string>, size_t> rank;
    for (size_t r = 0; r < merges.size(); ++r) rank[merges[r]] = r;
    std::vector<std::string> w;
    for (char c : word) w.emplace_back(1, c);
    while (w.size() > 1) {
      size_t best = SIZE_MAX;
      std::pair<std::string, std::string> pair;
      for (size_t i = 0; i + 1 < w.size(); ++i) {
        const auto it = rank.find({w[i], w[i + 1]});
        if (it != rank.end() && it->second < best) best = it->second, pair = it->first;
      }
      if (best == SIZE_MAX) break;
      std::vector<std::string> merged;
      for (size_t i = 0; i < w.size();) {
        if (i + 1 < w.size() && w[i] == pair.first && w[i + 1] == pair.second) {
          merged.push_back(w[i] + w[i + 1]);
          i += 2;
        } else {
          merged.push_back(w[i++]);
        }
      }
      w = merged;
    }
    Ids out;
    for (const std::string& t : w) out.push_back(ids.at(t));
    return out;
  }
};

const Fixture& hello_fixture() {
  static const Fixture f({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "hello"}, {"a", "a"},
                          {"\xC3", "\xA9"}, {" ", " "}, {"\n", "\n"}});
  return f;
}

TEST(Gpt2Tokenizer, HandBuiltVocabulary) {
  const Fixture& f = hello_fixture();
  const auto tok = f.tokenizer();
  EXPECT_EQ(tok->type(), "gpt2");
  EXPECT_EQ(tok->vocab_size(), static_cast<int64_t>(f.ids.size()));
  const int32_t eot = f.ids.at("<|endoftext|>");
  EXPECT_EQ(tok->eos_id(), eot);
  EXPECT_EQ(tok->bos_id(), eot);
  EXPECT_EQ(tok->pad_id(), eot);
  // "hello hello" -> hello, Ġhello; "aaa" -> aa, a (the overlapping pair is skipped).
  EXPECT_EQ(tok->encode("hello hello"), (Ids{f.ids.at("hello"), f.ids.at(" hello")}));
  EXPECT_EQ(tok->encode("aaa"), (Ids{f.ids.at("aa"), 'a'}));
  EXPECT_EQ(tok->encode("aaaa"), (Ids{f.ids.at("aa"), f.ids.at("aa")}));
  // Pre-tokenisation: "  hello" is " " then " hello" (\s+(?!\S) leaves the last space to the word).
  EXPECT_EQ(tok->encode("  hello"), (Ids{' ', f.ids.at(" hello")}));
  EXPECT_EQ(tok->encode("x   "), (Ids{'x', f.ids.at("  "), ' '}));
  EXPECT_EQ(tok->encode("'s'S"), (Ids{'\'', 's', '\'', 'S'}));
  // <|endoftext|> in text is ordinary text; its id decodes to nothing.
  EXPECT_EQ(tok->encode("<|endoftext|>").size(), 13u);
  EXPECT_EQ(tok->decode({eot, f.ids.at("hello"), eot}), "hello");
}

TEST(Gpt2Tokenizer, RoundTripsEveryText) {
  const auto tok = hello_fixture().tokenizer();
  for (const std::string& t : kTexts) EXPECT_EQ(tok->decode(tok->encode(t)), t);
}

// token_bytes (llama.cpp's /tokenize pieces): each token's own bytes, so that a text's tokens
// concatenate to the text itself, a split character included; specials give their piece.
std::string joined_bytes(const Tokenizer& tok, const std::string& text) {
  std::string out;
  for (int32_t id : tok.encode(text)) out += tok.token_bytes(id);
  return out;
}

TEST(TokenBytes, ByteAndGpt2TokensConcatenateToTheText) {
  const auto byte = qkv::make_byte_tokenizer();
  const auto gpt2 = hello_fixture().tokenizer();
  for (const std::string& t : kTexts) {
    EXPECT_EQ(joined_bytes(*byte, t), t);
    EXPECT_EQ(joined_bytes(*gpt2, t), t);
  }
  EXPECT_EQ(byte->token_bytes(3 + 0xF0), "\xF0");  // the first byte of a 4-byte character alone
  EXPECT_EQ(byte->token_bytes(byte->bos_id()), byte->piece(byte->bos_id()));
  EXPECT_EQ(gpt2->token_bytes(gpt2->eos_id()), "<|endoftext|>");
  EXPECT_EQ(gpt2->token_bytes(hello_fixture().ids.at(" hello")), " hello");
  expect_mentions(error_of([&] { byte->token_bytes(259); }), {"token id 259", "[0, 259)"});
  expect_mentions(error_of([&] { gpt2->token_bytes(-1); }), {"token id -1"});
}


TEST(Gpt2Tokenizer, DecodeReplacesBrokenUtf8AndRejectsBadIds) {
  const Fixture& f = hello_fixture();
  const auto tok = f.tokenizer();
  EXPECT_EQ(tok->decode({'a', 0xF0, 0x9F, 'b'}), std::string("a") + kReplacement + "b");
  expect_mentions(error_of([&] { tok->decode({'a', static_cast<int32_t>(f.ids.size())}); }),
                  {"id " + std::to_string(f.ids.size()) + " at position 1"});
  expect_mentions(error_of([&] { tok->decode({-3}); }), {"id -3 at position 0"});
  for (const BadUtf8& c : kBadUtf8)
    expect_mentions(error_of([&] { tok->encode(c.text); }), {"byte offset " + std::to_string(c.offset) + " "});
}

TEST(Gpt2Tokenizer, Pieces) {
  const Fixture& f = hello_fixture();
  const auto tok = f.tokenizer();
  EXPECT_EQ(tok->piece(f.ids.at(" hello")), "\u0120hello");
  EXPECT_EQ(tok->piece('\n'), "\u010A");
  EXPECT_EQ(tok->piece(f.ids.at("\n\n")), "\u010A\u010A");
  EXPECT_EQ(tok->piece(f.ids.at("\xC3\xA9")), "\u00e9");
  EXPECT_EQ(tok->piece(0xC3), "<0xC3>");
  EXPECT_EQ(tok->piece(f.ids.at("<|endoftext|>")), "<|endoftext|>");
}

// The heap-based merge against the plain loop, on a vocabulary whose ranks ignore build order
// (a merge of merged tokens can outrank the merges that make its halves).
TEST(Gpt2Tokenizer, MergesExactlyLikeOpenAIsLoop) {
  std::mt19937 rng(7);
  std::vector<std::string> tokens = {"a", "b", "c"};
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < 60) {
    const std::string x = tokens[rng() % tokens.size()];
    const std::string y = tokens[rng() % tokens.size()];
    if ((x + y).size() > 6 || std::find(merges.begin(), merges.end(), std::make_pair(x, y)) != merges.end()) continue;
    merges.emplace_back(x, y);
    if (std::find(tokens.begin(), tokens.end(), x + y) == tokens.end()) tokens.push_back(x + y);
  }
  std::shuffle(merges.begin(), merges.end(), rng);
  const Fixture f(merges);
  const auto tok = f.tokenizer();
  for (int trial = 0; trial < 2000; ++trial) {
    std::string word(1 + rng() % 40, 'a');
    for (char& c : word) c = static_cast<char>('a' + rng() % 3);
    ASSERT_EQ(tok->encode(word), f.reference_word(word)) << word;
  }
}

// The per-word cache is shared: encoding from several threads gives the serial answer.
TEST(Gpt2Tokenizer, ConcurrentEncodes) {
  const auto tok = hello_fixture().tokenizer();
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(kTexts[static_cast<size_t>(i) % kTexts.size()] + " hello" + std::to_string(i));
  std::vector<Ids> serial;
  for (const std::string& t : texts) serial.push_back(tok->encode(t));
  std::vector<std::vector<Ids>> got(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < got.size(); ++k)
    threads.emplace_back([&, k] {
      for (const std::string& t : texts) got[k].push_back(tok->encode(t));
    });
  for (std::thread& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, serial);
}

TEST(Gpt2Tokenizer, SaveAndLoad) {
  const Fixture& f = hello_fixture();
  TempDir src("tok_gpt2_src"), dir("tok_gpt2");
  write_bytes(src / "enc.json", f.encoder_json());
  write_bytes(src / "merges.txt", f.vocab_bpe());
  const auto tok = qkv::load_gpt2_tokenizer(src / "enc.json", src / "merges.txt");
  tok->save(dir.path().string());
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"encoder.json", "qkv_tokenizer.json", "vocab.bpe"}));
  EXPECT_EQ(read_bytes(dir / "encoder.json"), f.encoder_json());
  EXPECT_EQ(read_bytes(dir / "vocab.bpe"), f.vocab_bpe());
  EXPECT_EQ(Json::parse(read_bytes(dir / "qkv_tokenizer.json")),
            Json({{"type", "gpt2"}, {"encoder", "encoder.json"}, {"vocab", "vocab.bpe"}}));
  const auto back = qkv::load_tokenizer(dir.path().string());
  EXPECT_EQ(back->type(), "gpt2");
  for (const std::string& t : kTexts) EXPECT_EQ(back->encode(t), tok->encode(t));
}

TEST(Gpt2Tokenizer, RejectsBadFiles) {
  const Fixture& f = hello_fixture();
  const std::string enc = f.encoder_json(), bpe = f.vocab_bpe();
  const auto err = [](const std::string& e, const std::string& v) {
    return error_of([&] { qkv::parse_gpt2_tokenizer(e, v, "enc.json", "merges.txt"); });
  };
  Json j = Json::parse(enc);
  const auto with = [&](const std::function<void(Json&)>& edit) {
    Json k = j;
    edit(k);
    return k.dump();
  };
  expect_mentions(err("{\"a\": 1", bpe), {"enc.json: not valid JSON"});
  expect_mentions(err("[1, 2]", bpe), {"enc.json: expected a JSON object"});
  expect_mentions(err(with([](Json& k) { k["hello"] = "x"; }), bpe), {"enc.json", "\"hello\"", "a string", "integer id"});
  expect_mentions(err(with([](Json& k) { k["hello"] = 1.5; }), bpe), {"enc.json", "\"hello\"", "1.5"});
  expect_mentions(err(with([](Json& k) { k["hello"] = -1; }), bpe), {"enc.json", "\"hello\"", "id -1"});
  expect_mentions(err(with([](Json& k) { k["hello"] = 4294967296u; }), bpe), {"enc.json", "\"hello\"", "id 4294967296"});
  expect_mentions(err(with([](Json& k) { k["hello"] = 0; }), bpe), {"enc.json", "id 0 is used by both"});
  expect_mentions(err(with([](Json& k) { k["hello"] = 5000; }), bpe), {"enc.json", "id 5000", "one per token"});
  expect_mentions(err(with([](Json& k) { k["x\u4e00"] = static_cast<int>(k.size()); }), bpe),
                  {"enc.json", "outside GPT-2's byte alphabet"});
  expect_mentions(err(with([](Json& k) { k["<|end|>"] = k["<|endoftext|>"]; k.erase("<|endoftext|>"); }), bpe),
                  {"enc.json: no \"<|endoftext|>\" token"});
  expect_mentions(err(with([](Json& k) { k["a"] = k["<|endoftext|>"]; }), bpe), {"enc.json", "id", "used by both"});
  expect_mentions(err("{\"a\": 0, \"a\": 1}", bpe), {"enc.json", "\"a\""});
  expect_mentions(err(enc, bpe + "a b c\n"), {"merges.txt line 11", "found 3 fields"});
  expect_mentions(err(enc, bpe + "x y\n"), {"merges.txt line 11", "\"xy\" is not a token of encoder.json"});
  expect_mentions(err(enc, bpe + "\xE4\xB8\x80 a\n"), {"merges.txt line 11", "outside GPT-2's byte alphabet"});
  expect_mentions(err(enc, bpe + "\xC3 a\n"), {"merges.txt line 11", "not valid UTF-8", "byte offset 0"});
  expect_mentions(err(enc, "#version: 0.2\n"), {"merges.txt: no merges"});
  expect_mentions(error_of([] { qkv::load_gpt2_tokenizer("/nonexistent/enc.json", "/nonexistent/v.bpe"); }),
                  {"/nonexistent/enc.json: cannot open", "No such file"});
}

// ---------------------------------------------------------------------------------------------
// SentencePiece

// A few hundred sentences from a small grammar: the same words in many combinations.
std::vector<std::string> corpus() {
  const std::vector<std::string> subj = {"the cat", "a dog", "my neighbour", "the old teacher", "our team", "Anna",
                                          "the engineers", "a small bird", "the committee", "\u00c9milie", "nobody",
                                          "the children", "a stranger", "the gardener", "Professor Lind"};
  const std::vector<std::string> verb = {"reads", "writes", "likes", "watches", "builds", "finds", "remembers",
                                          "carries", "paints", "describes", "forgets", "borrows", "measures",
                                          "photographs", "explains", "repairs"};
  const std::vector<std::string> adj = {"", "", "long ", "red ", "green ", "new ", "quiet ", "broken ", "wooden ",
                                         "beautiful ", "expensive ", "mysterious ", "yellow ", "heavy "};
  const std::vector<std::string> noun = {"letter", "house", "apples", "bridge", "song", "window", "caf\u00e9",
                                          "books", "river", "bicycle", "telescope", "umbrella", "kitchen", "garden",
                                          "mountain", "newspaper", "violin", "lantern", "harbour", "engine"};
  const std::vector<std::string> end = {".", "!", "?", " today.", " again.", ", slowly.", " (twice).",
                                         " every morning.", " in 1999.", " at 7:30.", " without a word."};
  std::mt19937 rng(11);
  const auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  std::vector<std::string> out;
  for (int i = 0; i < 500; ++i)
    out.push_back(pick(subj) + " " + pick(verb) + " the " + pick(adj) + pick(noun) + pick(end));
  return out;
}

const std::vector<std::string> kNormalText = {
    "the cat reads a long letter.",
    "Anna builds the new bridge again!",
    "Unseen words: zebra, quantum, 42 and 3.14.",
    "  two leading spaces, two trailing  ",
    "tab\tand  double  spaces",
    "emoji \U0001F600 and \u4f60\u597d are not in the corpus",
    "\u00c9milie paints their caf\u00e9",
};

class SentencePieceTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(SentencePieceTraining, TrainsAndRoundTripsLosslessly) {
  qkv::SentencePieceTrainOptions opt;
  opt.model_type = GetParam();
  opt.vocab_size = 400;
  opt.threads = 1;
  // Nothing on stderr while training (the capture ends even when training throws).
  std::unique_ptr<Tokenizer> tok;
  ::testing::internal::CaptureStderr();
  try {
    tok = qkv::train_sentencepiece(corpus(), opt);
  } catch (...) {
    std::cerr << ::testing::internal::GetCapturedStderr();
    throw;
  }
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(logged, "") << "SentencePiece training printed to stderr";

  EXPECT_EQ(tok->type(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_id(), 3);
  EXPECT_EQ(tok->piece(0), "<pad>");
  EXPECT_EQ(tok->piece(1), "<unk>");
  EXPECT_EQ(tok->piece(2), "<s>");
  EXPECT_EQ(tok->piece(3), "</s>");
  for (const std::string& t : kNormalText) {
    const Ids ids = tok->encode(t);
    EXPECT_EQ(tok->decode(ids), t) << GetParam();
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 0) << "unknown token for: " << t;
  }
  for (const std::string& t : kTexts) EXPECT_EQ(tok->decode(tok->encode(t)), t) << GetParam();
  // Common words merge into pieces, the first with SentencePiece's visible space.
  const Ids cat = tok->encode("the cat");
  ASSERT_FALSE(cat.empty());
  EXPECT_LT(cat.size(), 7u);
  EXPECT_EQ(tok->piece(cat[0]).rfind("\u2581", 0), 0u) << tok->piece(cat[0]);
  // Specials decode to nothing; bad ids and bad text are errors.
  Ids framed = tok->encode("the cat");
  framed.insert(framed.begin(), tok->bos_id());
  framed.push_back(tok->eos_id());
  framed.push_back(tok->pad_id());
  EXPECT_EQ(tok->decode(framed), "the cat");
  expect_mentions(error_of([&] { tok->decode({4, 400}); }), {"id 400 at position 1", "[0, 400)"});
  expect_mentions(error_of([&] { tok->encode("ok \xED\xA0\x80"); }), {"not valid UTF-8", "byte offset 3 "});

  // Save and load: the same model, the same ids.
  TempDir dir("tok_spm");
  tok->save(dir.path().string());
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"qkv_tokenizer.json", "tokenizer.model"}));
  EXPECT_EQ(Json::parse(read_bytes(dir / "qkv_tokenizer.json")),
            Json({{"type", "sentencepiece"}, {"model", "tokenizer.model"}}));
  const auto back = qkv::load_tokenizer(dir.path().string());
  EXPECT_EQ(back->vocab_size(), 400);
  for (const std::string& t : kNormalText) EXPECT_EQ(back->encode(t), tok->encode(t));
  const auto direct = qkv::load_sentencepiece(dir / "tokenizer.model");
  EXPECT_EQ(direct->encode(kNormalText[0]), tok->encode(kNormalText[0]));
}

INSTANTIATE_TEST_SUITE_P(ModelTypes, SentencePieceTraining, ::testing::Values("unigram", "bpe"));

TEST(SentencePiece, TrainingIsDeterministic) {
  qkv::SentencePieceTrainOptions opt;
  opt.vocab_size = 400;
  opt.threads = 1;
  opt.seed = 5;
  const auto a = qkv::train_sentencepiece(corpus(), opt);
  const auto b = qkv::train_sentencepiece(corpus(), opt);
  TempDir da("tok_spm_a"), db("tok_spm_b");
  a->save(da.path().string());
  b->save(db.path().string());
  EXPECT_EQ(read_bytes(da / "tokenizer.model"), read_bytes(db / "tokenizer.model"));
}

// Subword sampling: a drawn segmentation decodes to the text; the same seed draws the same ids
// (also on another thread, and after other draws), other seeds other ids; alpha outside (0, 1]
// and tokenizers without sampling are refused by name.
TEST(SentencePiece, SampledSegmentationsAreReproducibleAndDecodeToTheText) {
  qkv::SentencePieceTrainOptions opt;
  opt.vocab_size = 400;
  opt.threads = 1;
  const auto tok = qkv::train_sentencepiece(corpus(), opt);
  ASSERT_TRUE(tok->can_sample());
  const std::vector<std::string> texts(kNormalText.begin(), kNormalText.end());
  const auto a = tok->encode_sampled(texts, 0.1, 7);
  ASSERT_EQ(a.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(tok->decode(a[i]), texts[i]) << i;
  (void)tok->encode_sampled(texts, 0.1, 8);
  std::vector<std::vector<int32_t>> on_thread;
  std::thread([&] { on_thread = tok->encode_sampled(texts, 0.1, 7); }).join();
  EXPECT_EQ(tok->encode_sampled(texts, 0.1, 7), a);
  EXPECT_EQ(on_thread, a);
  // a draw differs from the best segmentation and from other seeds' somewhere
  int differs_from_best = 0, differs_by_seed = 0;
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    const auto b = tok->encode_sampled(texts, 0.1, seed);
    for (size_t i = 0; i < texts.size(); ++i) {
      differs_from_best += b[i] != tok->encode(texts[i]);
      differs_by_seed += seed != 7 && b[i] != a[i];
    }
  }
  EXPECT_GT(differs_from_best, 0);
  EXPECT_GT(differs_by_seed, 0);
  expect_mentions(error_of([&] { tok->encode_sampled(texts, 0.0, 1); }), {"sampling alpha 0", "(0, 1]"});
  expect_mentions(error_of([&] { tok->encode_sampled(texts, std::nan(""), 1); }), {"sampling alpha nan"});
  expect_mentions(error_of([&] { tok->encode_sampled({"ok \xED\xA0\x80"}, 0.1, 1); }), {"not valid UTF-8"});
  expect_mentions(error_of([] { qkv::make_byte_tokenizer()->encode_sampled({"x"}, 0.1, 1); }),
                  {"byte tokenizer has no sampled segmentations"});
}

TEST(TokenBytes, SentencePieceWordStartsKeepTheirSpaceAndBytePiecesAreBytes) {
  qkv::SentencePieceTrainOptions opt;
  opt.vocab_size = 400;
  opt.threads = 1;
  const auto tok = qkv::train_sentencepiece(corpus(), opt);
  for (const std::string& t : kNormalText) {
    // the text's tokens spell it with the space SentencePiece marks its first word with
    std::string got = joined_bytes(*tok, t);
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got, " " + t) << t;
  }
  const Ids cat = tok->encode("the cat");
  EXPECT_EQ(tok->token_bytes(cat[0]).rfind(" ", 0), 0u) << tok->piece(cat[0]);
  // an emoji outside the vocabulary: byte pieces, one byte each
  const Ids emoji = tok->encode("\U0001F600");
  int bytes = 0;
  for (int32_t id : emoji) bytes += tok->piece(id).rfind("<0x", 0) == 0 && tok->token_bytes(id).size() == 1;
  EXPECT_EQ(bytes, 4);
  EXPECT_EQ(tok->token_bytes(tok->eos_id()), "</s>");
}

TEST(SentencePiece, RejectsBadOptionsSentencesAndModels) {
  const auto sentences = corpus();
  const auto train = [&](auto edit, const std::vector<std::string>& s) {
    qkv::SentencePieceTrainOptions opt;
    opt.vocab_size = 400;
    opt.threads = 1;
    edit(opt);
    return error_of([&] { qkv::train_sentencepiece(s, opt); });
  };
  const auto none = [](qkv::SentencePieceTrainOptions&) {};
  expect_mentions(train([](auto& o) { o.model_type = "wordpiece"; }, sentences), {"model_type \"wordpiece\""});
  expect_mentions(train([](auto& o) { o.vocab_size = 0; }, sentences), {"vocab_size 0"});
  expect_mentions(train([](auto& o) { o.character_coverage = 1.5; }, sentences), {"character_coverage 1.5"});
  expect_mentions(train([](auto& o) { o.threads = 0; }, sentences), {"threads 0"});
  expect_mentions(train([](auto& o) { o.max_sentences = 0; }, sentences), {"max_sentences 0"});
  expect_mentions(train(none, {}), {"no sentences"});
  expect_mentions(train(none, {"fine", "bad \xC0\xAF"}), {"sentence 1", "not valid UTF-8", "byte offset 4 "});
  // Only sentences longer than SentencePiece's limit (a corpus that is one 10 MB line): named, not
  // "SentencePiece training failed: no reason given".
  expect_mentions(train(none, {std::string(5000, 'a'), std::string(4193, 'b')}),
                  {"every sentence is longer than the 4192 bytes", "sentence 0, 5000 bytes", "shorter lines"});
  // Too small for the 256 byte pieces: SentencePiece's own message comes through.
  expect_mentions(train([](auto& o) { o.vocab_size = 100; }, sentences), {"SentencePiece training failed"});
  expect_mentions(error_of([] { qkv::parse_sentencepiece("not a model proto", "m.model"); }),
                  {"m.model: not a SentencePiece model"});
  expect_mentions(error_of([] { qkv::parse_sentencepiece("", "m.model"); }), {"m.model: empty file"});
  // What SentencePiece 0.1.97 would trust (found by fuzzing: tests/fuzz/regressions/sentencepiece/):
  // a piece its trie cannot hold (darts-clone threw), a normalisation map it would walk out of bounds.
  const auto parse_error = [](const std::string& proto) {
    return error_of([&] { qkv::parse_sentencepiece(proto, "m.model"); });
  };
  using namespace std::string_literals;
  expect_mentions(parse_error("\x0a\x05\x0a"s), {"m.model: not a SentencePiece model: malformed protocol buffer"});
  expect_mentions(parse_error("\x0a\x02\x0a\x00"s), {"m.model: SentencePiece model: piece 0 (at byte 0) is empty"});
  expect_mentions(parse_error("\x0a\x03\x0a\x01\x61\x0a\x03\x0a\x01\x00"s), {"piece 1 (at byte 5) holds a NUL byte"});
  const auto varint = [](size_t v) {
    std::string out;
    for (; v >= 0x80; v >>= 7) out += static_cast<char>(0x80 | (v & 0x7f));
    return out + static_cast<char>(v);
  };
  const auto with_map = [&](const std::string& map) {  // normalizer_spec { precompiled_charsmap: map }
    const std::string spec = "\x12"s + varint(map.size()) + map;
    return "\x1a"s + varint(spec.size()) + spec;
  };
  expect_mentions(parse_error(with_map("\x01\x00"s)), {"normalisation map (precompiled_charsmap) is malformed", "2 bytes"});
  expect_mentions(parse_error(with_map("\x08\x00\x00\x00wxyz"s)), {"a trie of 8 bytes in 4 bytes"});
  expect_mentions(parse_error(with_map("\x00\x04\x00\x00"s + std::string(1024, '\0'))), {"the trie has a cycle"});
  expect_mentions(parse_error(with_map("\x04\x00\x00\x00\x00\x04\x00\x00"s)), {"run past the 1-unit trie"});
}

// ---------------------------------------------------------------------------------------------
// load_tokenizer errors

// Directories written before qkv_tokenizer.json hold qkv's form as tokenizer.json: still read. A
// Hugging Face tokenizer.json (the tokenizers library's format) is named as such, not misread.
TEST(LoadTokenizer, OlderDirectoriesAndHuggingFacesFile) {
  TempDir dir("tok_legacy");
  write_bytes(dir / "tokenizer.json", "{\"type\": \"byte\"}\n");
  const auto tok = qkv::load_tokenizer(dir.path().string());
  EXPECT_EQ(tok->decode(tok->encode("legacy")), "legacy");
  // saving writes the new name; the new file wins over the old one
  tok->save(dir.path().string());
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"qkv_tokenizer.json", "tokenizer.json"}));
  write_bytes(dir / "tokenizer.json", "{\"type\": \"nonsense\"}\n");
  EXPECT_EQ(qkv::load_tokenizer(dir.path().string())->vocab_size(), tok->vocab_size());

  // Hugging Face's tokenizer.json is read as what it is (test_hf_tokenizer.cpp): its errors name it
  TempDir hf("tok_hf");
  write_bytes(hf / "tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n");
  expect_mentions(error_of([&] { qkv::load_tokenizer(hf.path().string()); }),
                  {hf / "tokenizer.json", "model", "missing \"vocab\""});
}

TEST(LoadTokenizer, ClearErrors) {
  TempDir dir("tok_load");
  const std::string d = dir.path().string();
  const auto load_err = [&] { return error_of([&] { qkv::load_tokenizer(d); }); };
  const auto with_json = [&](const std::string& text) {
    write_bytes(dir / "qkv_tokenizer.json", text);
    return load_err();
  };

  expect_mentions(error_of([&] { qkv::load_tokenizer(dir / "missing"); }), {dir / "missing", "does not exist"});
  write_bytes(dir / "plain_file", "x");
  expect_mentions(error_of([&] { qkv::load_tokenizer(dir / "plain_file"); }), {"plain_file", "not a directory"});
  expect_mentions(load_err(), {dir / "qkv_tokenizer.json", "no such file"});
  expect_mentions(with_json("{\"type\": "), {dir / "qkv_tokenizer.json", "not valid JSON"});
  expect_mentions(with_json("[\"byte\"]"), {"qkv_tokenizer.json", "expected a JSON object", "array"});
  expect_mentions(with_json("{}"), {"qkv_tokenizer.json", "missing \"type\""});
  expect_mentions(with_json("{\"type\": 3}"), {"\"type\" is number"});
  expect_mentions(with_json("{\"type\": \"wordpiece\"}"),
                  {"unknown tokenizer type \"wordpiece\"", "\"byte\", \"gpt2\", \"sentencepiece\", \"hf\" or \"marian\""});
  expect_mentions(with_json("{\"type\": \"byte\", \"type\": \"gpt2\"}"), {"duplicate key \"type\""});
  expect_mentions(with_json("{\"type\": \"byte\", \"extra\": 1}"), {"unexpected key \"extra\"", "\"type\""});
  expect_mentions(with_json("{\"type\": \"gpt2\", \"vocab\": \"vocab.bpe\"}"), {"missing \"encoder\""});
  expect_mentions(with_json("{\"type\": \"gpt2\", \"encoder\": \"../encoder.json\", \"vocab\": \"vocab.bpe\"}"),
                  {"\"encoder\" is \"../encoder.json\"", "plain file name"});
  expect_mentions(with_json("{\"type\": \"gpt2\", \"encoder\": 7, \"vocab\": \"vocab.bpe\"}"), {"\"encoder\" is number"});
  expect_mentions(with_json("{\"type\": \"gpt2\", \"encoder\": \"encoder.json\", \"vocab\": \"vocab.bpe\"}"),
                  {dir / "encoder.json", "cannot open", "No such file"});
  expect_mentions(with_json("{\"type\": \"sentencepiece\", \"model\": \"tokenizer.model\"}"),
                  {dir / "tokenizer.model", "cannot open"});
  write_bytes(dir / "tokenizer.model", "garbage");
  expect_mentions(with_json("{\"type\": \"sentencepiece\", \"model\": \"tokenizer.model\"}"),
                  {dir / "tokenizer.model", "not a SentencePiece model"});
  std::filesystem::create_directory(dir / "sub.model");
  expect_mentions(with_json("{\"type\": \"sentencepiece\", \"model\": \"sub.model\"}"),
                  {dir / "sub.model", "not a regular file"});
}

}  // namespace
