// model.safetensors.index.json, the map of a sharded Hugging Face checkpoint (tensor name -> shard
// file), beside a fixed config.json and one valid shard (a tiny GPT-2 written by save_hf_model):
// load_hf_model(dir). Shard names are file names in the folder, never paths out of it. An
// accepted folder gives the model the shard holds.
#include <filesystem>

#include "fuzz_util.h"
#include "qkv/files.h"
#include "qkv/hf.h"
#include "qkv/model.h"

namespace {

const char* kConfig = R"({"model_type": "gpt2", "vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_layer": 1,
 "n_head": 2, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": true})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/sharded";
    Model m(hf_config(kConfig, "config.json"));
    m.init(1);
    save_hf_model(m, d);
    std::filesystem::rename(d + "/model.safetensors", d + "/model-00001-of-00001.safetensors");
    return d;
  }();
  fuzz::put_file("sharded/model.safetensors.index.json", fuzz::bytes(data, size));
  if (!fuzz::accepts([&] { load_hf_model(dir); })) return 0;
  return 0;
}
