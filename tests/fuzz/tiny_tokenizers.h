// Small valid tokenizer files for seeds (make_corpus.cpp) and for fuzz_tokenizer_json's
// directory: a GPT-2 encoder.json + vocab.bpe with the 256 byte tokens and a few merges, and
// SentencePiece models trained on a few sentences.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "qkv/files.h"
#include "qkv/npy.h"
#include "qkv/tokenizer.h"

namespace qkv::fuzz {

// GPT-2's bytes_to_unicode: byte b as the UTF-8 of the code point the files spell it with.
inline std::string gpt2_char(int b) {
  int cp = b, next = 0x100;
  const auto self = [](int x) {
    return (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
  };
  if (!self(b)) {
    for (int x = 0; x < b; ++x) next += self(x) ? 0 : 1;
    cp = next;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// encoder.json and vocab.bpe: ids 0..255 the bytes (in GPT-2's order: the self-spelled bytes
// first), then one token per merge, then <|endoftext|>.
inline std::pair<std::string, std::string> tiny_gpt2(const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::ordered_json enc = nlohmann::ordered_json::object();
  int id = 0;
  std::vector<int> order;
  for (int b = 0; b < 256; ++b)
    if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) order.push_back(b);
  for (int b = 0; b < 256; ++b)
    if (!((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) order.push_back(b);
  for (int b : order) enc[gpt2_char(b)] = id++;
  std::string bpe = "#version: 0.2\n";
  for (const auto& [a, b] : merges) {
    if (!enc.contains(a + b)) enc[a + b] = id++;
    bpe += a + " " + b + "\n";
  }
  enc["<|endoftext|>"] = id;
  return {enc.dump(), bpe};
}

inline std::pair<std::string, std::string> tiny_gpt2() {
  const std::string sp = gpt2_char(' ');
  return tiny_gpt2({{sp, "t"},
                    {"h", "e"},
                    {sp + "t", "he"},
                    {"i", "n"},
                    {sp, "a"},
                    {"e", "r"},
                    {sp + "a", "n"},
                    {"o", "u"},
                    {sp, "s"},
                    {"an", "d"},
                    {sp + "an", "d"},
                    {"\xc3\xa9", "t"}});
}

inline std::vector<std::string> tiny_sentences() {
  std::vector<std::string> s;
  const char* base[] = {"The cat sat on the mat.",
                        "A dog ran in the park!",
                        "Der Hund lief im Park.",
                        "Wie geht es dir heute?",
                        "Caf\xc3\xa9 au lait, s'il vous pla\xc3\xaet.",
                        "1, 2, 3 and 42",
                        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87",
                        "In the beginning was the word"};
  for (int i = 0; i < 12; ++i)
    for (const char* b : base) s.push_back(std::string(b) + (i % 2 ? " again" : "") + (i % 3 ? " now" : ""));
  return s;
}

// A SentencePiece model (unigram or bpe) trained in memory and saved into the existing
// directory `dir` (qkv_tokenizer.json + tokenizer.model); returns tokenizer.model's bytes.
inline std::string tiny_sentencepiece(const std::string& type, int64_t vocab, const std::string& dir) {
  SentencePieceTrainOptions o;
  o.vocab_size = vocab;
  o.model_type = type;
  o.threads = 1;
  train_sentencepiece(tiny_sentences(), o)->save(dir);
  return read_file(dir + "/tokenizer.model", "SentencePiece model");
}

}  // namespace qkv::fuzz
