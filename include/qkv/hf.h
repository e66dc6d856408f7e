// qkv/hf.h: Hugging Face model folders, as they come from the Hub: config.json with a
// "model_type", and model.safetensors or a sharded model.safetensors.index.json with its shards
// (F32, F16 or BF16 tensors, loaded as float32).
//
// Supported model types (docs/formats.md maps every name):
//   gpt2   GPT2LMHeadModel / GPT2Model: learned positions, pre-norm, fused c_attn (Conv1D weights
//          stored (in, out)), gelu_new, ln_f, the head tied to wte
//   llama  LlamaForCausalLM: RMSNorm, RoPE (rotate-half), grouped-query attention, SwiGLU,
//          the head tied or not
//   bert   BertModel (hidden states), BertForMaskedLM, BertForSequenceClassification: word +
//          position + token-type embeddings and their LayerNorm, post-norm, erf GELU, the tanh
//          pooler, the masked-LM transform and bias, the classifier
//   marian MarianMTModel (OPUS-MT): shared embeddings scaled by sqrt(d_model), split-half
//          sinusoidal positions, post-norm, swish, final_logits_bias; the decoder starts from
//          decoder_start_token_id (the pad token) and source pad tokens are padding
// A config key that changes the computation and that qkv does not implement (rope_scaling,
// scale_attn_by_inverse_layer_idx, ...) is an error naming the key and its value; keys that do
// not change it (dropout rates, torch_dtype, architectures, ...) are ignored. A missing or
// misshapen tensor is an error naming the tensor, the file and both shapes.
//
// Model::load(dir) calls load_hf_model when dir/config.json has a "model_type", so every command
// that takes --model DIR runs these folders.
#pragma once
#include <string>
#include <vector>

#include "qkv/config.h"
#include "qkv/model.h"

namespace qkv {

// True when dir/config.json exists and has a top-level "model_type" key (qkv's own directories
// have "qkv_format" instead).
bool is_hf_model_dir(const std::string& dir);

// The qkv configuration a Hugging Face config.json describes. `source` names the file in errors;
// *model_type (if given) receives its model_type.
ModelConfig hf_config(const std::string& config_json, const std::string& source, std::string* model_type = nullptr);

struct HfLoadReport {
  std::string model_type;
  std::vector<std::string> files;    // the weight files read
  std::vector<std::string> unused;   // tensors in the folder that the model does not use (besides
                                     // known buffers such as attn.bias and rotary_emb.inv_freq)
};

// The folder's model, its weights read straight into the parameters (each tensor read once,
// converted to float32 and laid out as qkv's parameters are: Conv1D transposed, gate and up
// stacked, ...), each packed to opt.dtype as soon as it is read when that is set.
Model load_hf_model(const std::string& dir, HfLoadReport* report = nullptr, const LoadOptions& opt = {});

// Export. The Hugging Face model_type that `config` maps onto exactly ("gpt2", "llama", "bert",
// "marian"), or a qkv::Error naming the first setting that does not map and what the family
// needs instead ("positional = alibi: ...").
std::string hf_model_type_for(const ModelConfig& config);

// Writes `model` as a Hugging Face folder: config.json and model.safetensors (float32, each
// atomically), named as Hugging Face names them, so that transformers and qkv both load it with
// the same logits. A classifier's id2label / label2id name its classes by `labels` (as many as
// num_classes, each distinct), or LABEL_0, LABEL_1, ... when `labels` is empty. A model that does
// not map, or labels that do not fit it, are refused before anything is written. Returns the
// model_type written.
std::string save_hf_model(const Model& model, const std::string& dir, const std::vector<std::string>& labels = {});

}  // namespace qkv
