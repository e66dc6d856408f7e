// config.json: ModelConfig::from_json. An accepted config is valid and survives to_json +
// from_json unchanged.
#include <cstring>

#include "fuzz_util.h"
#include "qkv/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  ModelConfig c;
  if (!fuzz::accepts([&] { c = ModelConfig::from_json(in, "config.json"); })) return 0;
  if (in.find('\0') != std::string::npos) fuzz::finding("config.json with a NUL byte accepted (the rest is ignored)");
  if (fuzz::json_repeats_a_key(in)) fuzz::finding("config.json with a repeated key accepted");
  if (!fuzz::accepts([&] { c.validate(); })) fuzz::finding("from_json returned a config that validate() refuses");
  const std::string text = c.to_json();
  const ModelConfig back = ModelConfig::from_json(text, "round trip");
  if (back.to_json() != text) fuzz::finding("an accepted config.json does not survive to_json + from_json:\n" + text);
  return 0;
}
