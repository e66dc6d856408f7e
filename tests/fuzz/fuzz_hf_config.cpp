// A Hugging Face config.json: hf_config translates it into qkv's ModelConfig (gpt2, llama, bert,
// marian, ...). An accepted file names its model_type, gives a config that validate() accepts,
// and that config survives qkv's own to_json + from_json unchanged. Sizes come from the file:
// -malloc_limit_mb catches a translation that allocates by them (n_layer 10^9) before checking.
#include "fuzz_util.h"
#include "qkv/hf.h"
#include "qkv/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  ModelConfig c;
  std::string type;
  if (!fuzz::accepts([&] { c = hf_config(in, "config.json", &type); })) return 0;
  if (type.empty()) fuzz::finding("a config.json accepted without a model_type");
  if (!fuzz::accepts([&] { c.validate(); })) fuzz::finding("hf_config returned a config that validate() refuses");
  const std::string text = c.to_json();
  const ModelConfig back = ModelConfig::from_json(text, "round trip");
  if (back.to_json() != text) fuzz::finding("a translated config does not survive to_json + from_json:\n" + text);
  return 0;
}
