// Structured output (qkv/json_constraint.h): a request's JSON Schema is untrusted bytes. A schema
// is compiled or refused with qkv::Error. An accepted one drives a walk that takes, from 64
// candidate bytes, one the automaton allows (chosen by the input's bytes), for up to 512 steps:
// the automaton never crashes, and a text it calls complete parses as JSON.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "qkv/json_constraint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  std::shared_ptr<const JsonMachine> m;
  if (!fuzz::accepts([&] { m = json_machine(in); })) return 0;
  static const std::string alphabet = "{}[]\":, \n0123456789-+.eEtrufalsn\\abcxyz\xC3\xA9\xE2\x82\xAC\x01\"u";
  std::string text;
  uint32_t h = 2166136261u;
  for (unsigned char c : in) h = (h ^ c) * 16777619u;
  for (int step = 0; step < 512; ++step) {
    bool moved = false;
    for (size_t k = 0; k < alphabet.size(); ++k) {
      h = h * 1103515245u + 12345u;
      const char c = alphabet[(h >> 8) % alphabet.size()];
      bool ok = false;
      json_machine_accepts(*m, text + c, &ok);
      if (ok) {
        text += c;
        moved = true;
        break;
      }
    }
    if (!moved) break;
    if (json_machine_accepts(*m, text) && (h & 3) == 0) break;
  }
  if (json_machine_accepts(*m, text)) {
    try {
      (void)nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      fuzz::finding("the automaton called a text complete that is not JSON: " + text);
    }
  }
  return 0;
}
