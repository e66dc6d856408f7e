// Hugging Face model folders: config.json to ModelConfig, and the checkpoint's tensors to qkv's
// parameters by a plan of rules (which file tensors, in which layout, make each parameter).
#include "qkv/hf.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "io/json_strict.h"
#include "kernels/positional.h"
#include "models/families.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/safetensors.h"

namespace qkv {
namespace {

using json = nlohmann::json;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

json read_json(const std::string& path, const char* what) {
  const std::string text = read_file(path, what);
  check(text.size() < (64u << 20), path, ": larger than 64 MiB; not a ", what);
  return detail::parse_json_object(text, path);
}

// Typed access to an HF config, with Hugging Face's defaults for absent keys; errors name the
// file and the key.
struct Keys {
  const json& j;
  std::string source;

  bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  int64_t integer(const char* k, int64_t def) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    check(v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= (uint64_t{1} << 40)), source,
          ": \"", k, "\" must be an integer, got ", v.dump());
    const int64_t x = v.get<int64_t>();
    check(x >= -(int64_t{1} << 40) && x <= (int64_t{1} << 40), source, ": \"", k, "\" = ", x, " is out of range");
    return x;
  }
  double number(const char* k, double def) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    check(v.is_number(), source, ": \"", k, "\" must be a number, got ", v.dump());
    const double x = v.get<double>();
    check(std::isfinite(x), source, ": \"", k, "\" must be finite, got ", v.dump());
    return x;
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    check(v.is_boolean(), source, ": \"", k, "\" must be true or false, got ", v.dump());
    return v.get<bool>();
  }
  std::string string(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    const json& v = j.at(k);
    check(v.is_string(), source, ": \"", k, "\" must be a string, got ", v.dump());
    return v.get<std::string>();
  }
  // A token id: an integer, null (none: -1), or a list of them (the first is used, as the one
  // that qkv's generation stops at).
  int64_t token(const char* k, int64_t def, int64_t vocab) const {
    if (!j.contains(k)) return def;
    const json& v = j.at(k);
    if (v.is_null()) return -1;
    const json& first = v.is_array() && !v.empty() ? v.at(0) : v;
    check(first.is_number_integer(), source, ": \"", k, "\" must be a token id (an integer, a list of them, or null), got ",
          v.dump());
    const int64_t id = first.get<int64_t>();
    check(id >= 0 && id < vocab, source, ": \"", k, "\" = ", id, " is outside the vocabulary [0, ", vocab, ")");
    return id;
  }
  // A key whose value changes the computation in a way qkv does not implement, unless it holds
  // the value that means "off".
  void refuse_unless(const char* k, const json& off, const char* why) const {
    if (!j.contains(k) || j.at(k) == off || (off.is_null() && j.at(k).is_null())) return;
    throw Error(detail::concat(source, ": \"", k, "\" is ", j.at(k).dump(), ": ", why, " (qkv supports only ",
                               off.dump(), ")"));
  }
};

Activation hf_activation(const Keys& c, const char* key, const std::string& def) {
  const std::string a = c.string(key, def);
  if (a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast") return Activation::GeluTanh;
  if (a == "gelu") return Activation::GeluErf;
  if (a == "relu") return Activation::ReLU;
  if (a == "silu" || a == "swish") return Activation::SiLU;
  throw Error(detail::concat(c.source, ": \"", key, "\" is \"", a,
                             "\": not an activation qkv implements (gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish)"));
}

ModelConfig gpt2_config(const Keys& c) {
  ModelConfig m;
  m.arch = Arch::Decoder;
  m.vocab_size = c.integer("vocab_size", 50257);
  m.d_model = c.integer("n_embd", 768);
  m.n_heads = c.integer("n_head", 12);
  m.n_layers = c.integer("n_layer", 12);
  m.d_ff = c.integer("n_inner", 4 * m.d_model);
  m.max_len = c.integer("n_positions", 1024);
  m.activation = hf_activation(c, "activation_function", "gelu_new");
  m.norm = NormKind::LayerNorm;
  m.norm_eps = c.number("layer_norm_epsilon", 1e-5);
  m.norm_first = true;
  m.final_norm = true;
  m.positional = Positional::Learned;
  m.tie_embeddings = c.boolean("tie_word_embeddings", true);
  m.bias = true;
  m.fused_qkv = true;
  m.init_std = c.number("initializer_range", 0.02);
  m.dropout = c.number("resid_pdrop", 0.1);  // qkv has one rate (training only)
  c.refuse_unless("scale_attn_weights", true, "unscaled attention scores");
  c.refuse_unless("scale_attn_by_inverse_layer_idx", false, "scores scaled by 1 / (layer + 1)");
  c.refuse_unless("reorder_and_upcast_attn", false, "GPT-2's reordered, upcast attention");
  c.refuse_unless("add_cross_attention", false, "GPT-2 with cross-attention");
  m.bos_id = c.token("bos_token_id", 50256 < m.vocab_size ? 50256 : -1, m.vocab_size);
  m.eos_id = c.token("eos_token_id", 50256 < m.vocab_size ? 50256 : -1, m.vocab_size);
  m.pad_id = -1;  // GPT-2 has no padding token; padded rows take --lengths
  return m;
}

// RoPE's base, from "rope_theta" or transformers' newer "rope_parameters" {"rope_type": "default",
// "rope_theta": X}; what qkv cannot compute (scaled RoPE, a partial rotation) is refused by key.
double rope_theta(const Keys& c) {
  auto partial = [&](const Keys& k, const std::string& key) {
    if (k.number("partial_rotary_factor", 1.0) != 1.0)
      throw Error(detail::concat(c.source, ": ", key, " is ", k.j.at("partial_rotary_factor").dump(),
                                 ": RoPE over part of each head, which qkv does not implement (qkv rotates whole heads: 1.0)"));
  };
  partial(c, "\"partial_rotary_factor\"");
  double theta = c.number("rope_theta", 10000.0);
  if (!c.has("rope_parameters")) return theta;
  const json& rp = c.j.at("rope_parameters");
  check(rp.is_object(), c.source, ": \"rope_parameters\" must be an object such as {\"rope_type\": \"default\", "
        "\"rope_theta\": 10000}, got ", rp.dump());
  const Keys r{rp, c.source + ": \"rope_parameters\""};
  check(!(rp.contains("rope_type") && rp.contains("type")), c.source,
        ": \"rope_parameters\" has both \"rope_type\" and \"type\"");
  const char* type_key = rp.contains("type") ? "type" : "rope_type";
  const std::string type = r.string(type_key, "default");
  check(type == "default", c.source, ": \"rope_parameters\".\"", type_key, "\" is \"", type,
        "\": scaled RoPE, which qkv does not implement (qkv supports only \"default\")");
  for (const auto& [k, v] : rp.items())
    check(k == "rope_type" || k == "type" || k == "rope_theta" || k == "partial_rotary_factor", c.source,
          ": \"rope_parameters\" has \"", k, "\" (", v.dump(),
          "), which qkv does not read (it reads rope_type \"default\", rope_theta and partial_rotary_factor 1.0)");
  partial(r, "\"rope_parameters\".\"partial_rotary_factor\"");
  if (r.has("rope_theta")) {
    const double inner = r.number("rope_theta", theta);
    if (c.has("rope_theta") && inner != theta)
      throw Error(detail::concat(c.source, ": \"rope_theta\" is ", c.j.at("rope_theta").dump(),
                                 " but \"rope_parameters\".\"rope_theta\" is ", rp.at("rope_theta").dump(),
                                 ": which one is meant?"));
    theta = inner;
  }
  return theta;
}

ModelConfig llama_config(const Keys& c) {
  ModelConfig m;
  m.arch = Arch::Decoder;
  m.vocab_size = c.integer("vocab_size", 32000);
  m.d_model = c.integer("hidden_size", 4096);
  m.d_ff = c.integer("intermediate_size", 11008);
  m.n_layers = c.integer("num_hidden_layers", 32);
  m.n_heads = c.integer("num_attention_heads", 32);
  m.n_kv_heads = c.integer("num_key_value_heads", m.n_heads);
  if (c.has("head_dim")) m.d_k = m.d_v = c.integer("head_dim", 0);
  m.activation = hf_activation(c, "hidden_act", "silu");
  m.gated = true;
  m.norm = NormKind::RMSNorm;
  m.norm_eps = c.number("rms_norm_eps", 1e-6);
  m.norm_first = true;
  m.final_norm = true;
  m.positional = Positional::Rope;
  m.rope_theta = rope_theta(c);
  m.max_len = c.integer("max_position_embeddings", 2048);
  m.tie_embeddings = c.boolean("tie_word_embeddings", false);
  const bool attn_bias = c.boolean("attention_bias", false), mlp_bias = c.boolean("mlp_bias", false);
  check(attn_bias == mlp_bias, c.source, ": \"attention_bias\" is ", attn_bias ? "true" : "false", " but \"mlp_bias\" is ",
        mlp_bias ? "true" : "false", ": qkv has biases in both the attention and the feed-forward, or in neither");
  m.bias = attn_bias;
  m.fused_qkv = false;
  m.init_std = c.number("initializer_range", 0.02);
  m.dropout = c.number("attention_dropout", 0.0);
  c.refuse_unless("rope_scaling", nullptr, "scaled RoPE (linear, dynamic, yarn, llama3)");
  m.bos_id = c.token("bos_token_id", 1 < m.vocab_size ? 1 : -1, m.vocab_size);
  m.eos_id = c.token("eos_token_id", 2 < m.vocab_size ? 2 : -1, m.vocab_size);
  m.pad_id = c.token("pad_token_id", -1, m.vocab_size);
  return m;
}

// A classifier's "id2label": an object whose keys are exactly "0".."n-1" and whose values are
// distinct strings (the names qkv classify prints). Returns n.
int64_t check_id2label(const Keys& c) {
  const json& m = c.j.at("id2label");
  check(m.is_object() && !m.empty(), c.source, ": \"id2label\" must be an object {\"0\": \"name\", \"1\": ...}, got ",
        m.dump());
  std::set<std::string> seen;
  for (size_t k = 0; k < m.size(); ++k) {
    const std::string key = std::to_string(k);
    if (!m.contains(key)) {
      std::string other;
      for (const auto& [name, v] : m.items())
        if (other.empty() && (name.empty() || name.find_first_not_of("0123456789") != std::string::npos ||
                              name.size() > 9 || std::stoul(name) >= m.size() || (name.size() > 1 && name[0] == '0')))
          other = name;
      throw Error(detail::concat(c.source, ": \"id2label\" has no key \"", key, "\"", other.empty() ? "" : " but has \"",
                                 other, other.empty() ? "" : "\"", ": its keys must be \"0\" .. \"", m.size() - 1,
                                 "\", one per label"));
    }
    const json& v = m.at(key);
    check(v.is_string(), c.source, ": \"id2label\"[\"", key, "\"] must be a label name (a string), got ", v.dump());
    check(seen.insert(v.get<std::string>()).second, c.source, ": \"id2label\"[\"", key, "\"] is ", v.dump(),
          ", a name another label has: each label needs its own name");
  }
  return static_cast<int64_t>(m.size());
}

ModelConfig bert_config(const Keys& c) {
  const json& j = c.j;
  ModelConfig m;
  // the head: from "architectures" (BertForMaskedLM, BertForSequenceClassification; BertModel or
  // none: the bare encoder)
  std::string head;
  if (j.contains("architectures") && j.at("architectures").is_array() && !j.at("architectures").empty() &&
      j.at("architectures").at(0).is_string())
    head = j.at("architectures").at(0).get<std::string>();
  if (head == "BertForMaskedLM" || head == "BertForPreTraining") {
    m.arch = Arch::EncoderMLM;
  } else if (head == "BertForSequenceClassification") {
    m.arch = Arch::EncoderClassifier;
  } else if (head.empty() || head == "BertModel") {
    m.arch = Arch::Encoder;
  } else {
    throw Error(detail::concat(c.source, ": \"architectures\" is [\"", head,
                               "\"]: qkv reads BertModel, BertForMaskedLM and BertForSequenceClassification"));
  }
  m.vocab_size = c.integer("vocab_size", 30522);
  m.d_model = c.integer("hidden_size", 768);
  m.n_layers = c.integer("num_hidden_layers", 12);
  m.n_heads = c.integer("num_attention_heads", 12);
  m.d_ff = c.integer("intermediate_size", 3072);
  m.activation = hf_activation(c, "hidden_act", "gelu");
  m.norm = NormKind::LayerNorm;
  m.norm_eps = c.number("layer_norm_eps", 1e-12);
  m.norm_first = false;
  m.final_norm = false;
  m.positional = Positional::Learned;
  m.max_len = c.integer("max_position_embeddings", 512);
  m.type_vocab_size = c.integer("type_vocab_size", 2);
  m.embed_norm = true;
  m.bias = true;
  m.fused_qkv = false;
  m.init_std = c.number("initializer_range", 0.02);
  m.dropout = c.number("hidden_dropout_prob", 0.1);
  m.tie_embeddings = m.arch == Arch::EncoderMLM && c.boolean("tie_word_embeddings", true);
  c.refuse_unless("position_embedding_type", "absolute", "relative position embeddings");
  c.refuse_unless("is_decoder", false, "BERT as a causal decoder");
  c.refuse_unless("add_cross_attention", false, "BERT with cross-attention");
  m.pad_id = c.token("pad_token_id", 0 < m.vocab_size ? 0 : -1, m.vocab_size);
  if (m.arch == Arch::EncoderClassifier) {
    m.pooling = Pooling::First;
    m.pooler = true;
    int64_t labels = c.integer("num_labels", 0);
    if (c.has("id2label")) {
      const int64_t named = check_id2label(c);
      check(labels == 0 || labels == named, c.source, ": \"num_labels\" is ", labels, " but \"id2label\" names ",
            named, " labels");
      labels = named;
    }
    if (labels == 0) labels = 2;  // Hugging Face's default
    check(labels >= 2, c.source, ": ", labels, " label: a single-output BertForSequenceClassification is a regression, "
          "which qkv does not implement");
    c.refuse_unless("problem_type", "single_label_classification", "regression or multi-label classification");
    m.num_classes = labels;
  }
  return m;
}

// Marian and Pegasus: BART's layout (q/k/v/out projections, fc1/fc2, split-half sinusoids from
// position 0, final_logits_bias); Marian's layers are post-norm, Pegasus's pre-norm with a final
// norm on each stack. The defaults are each config class's own.
ModelConfig bart_like_config(const Keys& c, bool pegasus) {
  ModelConfig m;
  m.arch = Arch::EncoderDecoder;
  m.vocab_size = c.integer("vocab_size", pegasus ? 50265 : 58101);
  const int64_t dec_vocab = c.integer("decoder_vocab_size", m.vocab_size);
  check(dec_vocab == m.vocab_size, c.source, ": \"decoder_vocab_size\" is ", dec_vocab, " but \"vocab_size\" is ",
        m.vocab_size, ": qkv reads Marian and Pegasus models with one vocabulary");
  m.d_model = c.integer("d_model", 1024);
  m.n_encoder_layers = c.integer("encoder_layers", 12);
  m.n_decoder_layers = c.integer("decoder_layers", 12);
  m.n_heads = c.integer("encoder_attention_heads", 16);
  const int64_t dec_heads = c.integer("decoder_attention_heads", 16);
  check(dec_heads == m.n_heads, c.source, ": \"encoder_attention_heads\" is ", m.n_heads,
        " but \"decoder_attention_heads\" is ", dec_heads, ": qkv's encoder and decoder have the same heads");
  m.d_ff = c.integer("encoder_ffn_dim", 4096);
  const int64_t dec_ff = c.integer("decoder_ffn_dim", 4096);
  check(dec_ff == m.d_ff, c.source, ": \"encoder_ffn_dim\" is ", m.d_ff, " but \"decoder_ffn_dim\" is ", dec_ff,
        ": qkv's encoder and decoder have the same feed-forward size");
  m.activation = hf_activation(c, "activation_function", "gelu");
  m.norm = NormKind::LayerNorm;
  m.norm_eps = 1e-5;  // nn.LayerNorm's default, which both use
  m.norm_first = pegasus;
  m.final_norm = pegasus;
  m.positional = Positional::SinusoidalSplitHalf;
  m.max_len = c.integer("max_position_embeddings", 1024);
  m.scale_embeddings = c.boolean("scale_embedding", false);
  m.share_embeddings = pegasus || c.boolean("share_encoder_decoder_embeddings", true);
  m.tie_embeddings = c.boolean("tie_word_embeddings", true);
  m.logits_bias = true;
  m.bias = true;
  m.fused_qkv = false;
  m.init_std = c.number("init_std", 0.02);
  m.dropout = c.number("dropout", 0.1);
  if (!pegasus) {
    c.refuse_unless("normalize_before", false, "pre-norm layers");
    c.refuse_unless("normalize_embedding", false, "a norm over the embeddings");
    c.refuse_unless("add_final_layer_norm", false, "a final norm");
  }
  if (pegasus) {
    m.pad_id = c.token("pad_token_id", 0, m.vocab_size);
    m.eos_id = c.token("eos_token_id", 1, m.vocab_size);
  } else {
    m.pad_id = c.token("pad_token_id", 58100 < m.vocab_size ? 58100 : -1, m.vocab_size);
    m.eos_id = c.token("eos_token_id", 0, m.vocab_size);
  }
  // the decoder starts from decoder_start_token_id (the pad token in OPUS-MT), attended to
  m.bos_id = c.token("decoder_start_token_id", m.pad_id, m.vocab_size);
  check(m.bos_id >= 0, c.source, ": \"decoder_start_token_id\" is needed (the decoder's first input)");
  return m;
}

ModelConfig marian_config(const Keys& c) { return bart_like_config(c, false); }
ModelConfig pegasus_config(const Keys& c) { return bart_like_config(c, true); }

// ---- weights -----------------------------------------------------------------------------------

using family::Part;
using family::Rule;

// The checkpoint: one file, or shards by a weight map.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir) {
    const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
    if (exists(single)) {
      readers_.emplace_back(single);
      for (const auto& t : readers_[0].tensors()) where_[t.name] = 0;
      return;
    }
    check(exists(index), dir, ": no model.safetensors or model.safetensors.index.json (a PyTorch pytorch_model.bin is "
                              "not read: save the model with safe_serialization=True)");
    const json j = read_json(index, "safetensors index");
    check(j.contains("weight_map") && j.at("weight_map").is_object(), index,
          ": expected an object \"weight_map\" (tensor name -> shard file)");
    std::map<std::string, size_t> shard;
    for (const auto& [name, file] : j.at("weight_map").items()) {
      check(file.is_string(), index, ": weight_map[\"", name, "\"] must be a file name, got ", file.dump());
      const std::string f = file.get<std::string>();
      check(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", index, ": weight_map[\"", name,
            "\"] = \"", f, "\" is not a file name in the folder");
      auto it = shard.find(f);
      if (it == shard.end()) {
        const std::string path = dir + "/" + f;
        check(exists(path), index, ": shard \"", f, "\" (holding \"", name, "\") is missing from ", dir);
        it = shard.emplace(f, readers_.size()).first;
        readers_.emplace_back(path);
      }
      check(readers_[it->second].find(name) != nullptr, index, ": names tensor \"", name, "\" in shard \"", f,
            "\", which does not hold it");
      where_[name] = it->second;
    }
  }

  const SafetensorsReader::Info* find(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? nullptr : readers_[it->second].find(name);
  }
  const std::string& file_of(const std::string& name) const { return readers_[where_.at(name)].path(); }
  void read(const std::string& name, float* dst) const { readers_[where_.at(name)].read_f32(name, dst); }
  void read_range(const std::string& name, int64_t first, int64_t count, float* dst) const {
    readers_[where_.at(name)].read_f32_range(name, first, count, dst);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, i] : where_) out.push_back(n);
    return out;
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& r : readers_) out.push_back(r.path());
    return out;
  }
  // "model.safetensors" or "the shards of model.safetensors.index.json", for messages.
  std::string describe() const { return readers_.size() == 1 ? readers_[0].path() : "the shards"; }

 private:
  std::vector<SafetensorsReader> readers_;
  std::map<std::string, size_t> where_;
};


std::vector<Rule> gpt2_rules(const ModelConfig& c, const std::string& p, std::set<std::string>& ignore) {
  const int64_t D = c.d_model, F = c.d_ff, V = c.vocab_size;
  std::vector<Rule> r;
  auto one = [&](const std::string& param, const std::string& name, std::vector<int64_t> shape, bool t = false) {
    r.push_back({param, {{name, std::move(shape), t}}});
  };
  one("embed.weight", p + "wte.weight", {V, D});
  one("pos_embed.weight", p + "wpe.weight", {c.max_len, D});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string h = p + "h." + std::to_string(i) + ".", l = "layers." + std::to_string(i) + ".";
    one(l + "norm1.weight", h + "ln_1.weight", {D});
    one(l + "norm1.bias", h + "ln_1.bias", {D});
    one(l + "self_attn.in_proj_weight", h + "attn.c_attn.weight", {D, 3 * D}, true);
    one(l + "self_attn.in_proj_bias", h + "attn.c_attn.bias", {3 * D});
    one(l + "self_attn.out_proj.weight", h + "attn.c_proj.weight", {D, D}, true);
    one(l + "self_attn.out_proj.bias", h + "attn.c_proj.bias", {D});
    one(l + "norm2.weight", h + "ln_2.weight", {D});
    one(l + "norm2.bias", h + "ln_2.bias", {D});
    one(l + "linear1.weight", h + "mlp.c_fc.weight", {D, F}, true);
    one(l + "linear1.bias", h + "mlp.c_fc.bias", {F});
    one(l + "linear2.weight", h + "mlp.c_proj.weight", {F, D}, true);
    one(l + "linear2.bias", h + "mlp.c_proj.bias", {D});
    ignore.insert(h + "attn.bias");         // the causal mask, as a buffer
    ignore.insert(h + "attn.masked_bias");  // its fill value
  }
  one("norm.weight", p + "ln_f.weight", {D});
  one("norm.bias", p + "ln_f.bias", {D});
  if (c.tie_embeddings) {
    ignore.insert("lm_head.weight");  // tied: the embedding itself
  } else {
    one("lm_head.weight", "lm_head.weight", {V, D});
  }
  return r;
}

std::vector<Rule> llama_rules(const ModelConfig& c, const std::string& p, std::set<std::string>& ignore) {
  const int64_t D = c.d_model, F = c.d_ff, V = c.vocab_size, H = c.n_heads, G = c.kv_heads(), Dk = c.head_dim_k(),
                Dv = c.head_dim_v();
  std::vector<Rule> r;
  auto one = [&](const std::string& param, const std::string& name, std::vector<int64_t> shape) {
    r.push_back({param, {{name, std::move(shape), false}}});
  };
  one("embed.weight", p + "embed_tokens.weight", {V, D});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string h = p + "layers." + std::to_string(i) + ".", l = "layers." + std::to_string(i) + ".";
    one(l + "norm1.weight", h + "input_layernorm.weight", {D});
    one(l + "self_attn.q_proj_weight", h + "self_attn.q_proj.weight", {H * Dk, D});
    one(l + "self_attn.k_proj_weight", h + "self_attn.k_proj.weight", {G * Dk, D});
    one(l + "self_attn.v_proj_weight", h + "self_attn.v_proj.weight", {G * Dv, D});
    one(l + "self_attn.out_proj.weight", h + "self_attn.o_proj.weight", {D, H * Dv});
    one(l + "norm2.weight", h + "post_attention_layernorm.weight", {D});
    // linear1 = [gate | up]: the gated feed-forward's f(x W_gate) * (x W_up)
    r.push_back({l + "linear1.weight", {{h + "mlp.gate_proj.weight", {F, D}}, {h + "mlp.up_proj.weight", {F, D}}}});
    one(l + "linear2.weight", h + "mlp.down_proj.weight", {D, F});
    if (c.bias) {
      r.push_back({l + "self_attn.in_proj_bias",
                   {{h + "self_attn.q_proj.bias", {H * Dk}}, {h + "self_attn.k_proj.bias", {G * Dk}},
                    {h + "self_attn.v_proj.bias", {G * Dv}}}});
      one(l + "self_attn.out_proj.bias", h + "self_attn.o_proj.bias", {D});
      r.push_back({l + "linear1.bias", {{h + "mlp.gate_proj.bias", {F}}, {h + "mlp.up_proj.bias", {F}}}});
      one(l + "linear2.bias", h + "mlp.down_proj.bias", {D});
    }
    ignore.insert(h + "self_attn.rotary_emb.inv_freq");  // older checkpoints keep RoPE's frequencies
  }
  one("norm.weight", p + "norm.weight", {D});
  if (c.tie_embeddings) {
    ignore.insert("lm_head.weight");
  } else {
    one("lm_head.weight", "lm_head.weight", {V, D});
  }
  return r;
}

// Attention with separate q/k/v projections and biases (BERT's query/key/value, Marian's q/k/v_proj):
// qkv's q/k/v_proj_weight and the stacked in_proj_bias.
void separate_attention(std::vector<Rule>& r, const ModelConfig& c, const std::string& qkv_prefix,
                        const std::string& q, const std::string& k, const std::string& v, const std::string& out) {
  const int64_t D = c.d_model, H = c.n_heads, G = c.kv_heads(), Dk = c.head_dim_k(), Dv = c.head_dim_v();
  r.push_back({qkv_prefix + "q_proj_weight", {{q + ".weight", {H * Dk, D}}}});
  r.push_back({qkv_prefix + "k_proj_weight", {{k + ".weight", {G * Dk, D}}}});
  r.push_back({qkv_prefix + "v_proj_weight", {{v + ".weight", {G * Dv, D}}}});
  r.push_back({qkv_prefix + "in_proj_bias", {{q + ".bias", {H * Dk}}, {k + ".bias", {G * Dk}}, {v + ".bias", {G * Dv}}}});
  r.push_back({qkv_prefix + "out_proj.weight", {{out + ".weight", {D, H * Dv}}}});
  r.push_back({qkv_prefix + "out_proj.bias", {{out + ".bias", {D}}}});
}

void linear_rule(std::vector<Rule>& r, const std::string& param, const std::string& name, int64_t out, int64_t in) {
  r.push_back({param + ".weight", {{name + ".weight", {out, in}}}});
  r.push_back({param + ".bias", {{name + ".bias", {out}}}});
}

void norm_rule(std::vector<Rule>& r, const std::string& param, const std::string& name, int64_t D) {
  r.push_back({param + ".weight", {{name + ".weight", {D}}}});
  r.push_back({param + ".bias", {{name + ".bias", {D}}}});
}

std::vector<Rule> bert_rules(const ModelConfig& c, const std::string& p, std::set<std::string>& ignore) {
  const int64_t D = c.d_model, F = c.d_ff, V = c.vocab_size;
  std::vector<Rule> r;
  r.push_back({"embed.weight", {{p + "embeddings.word_embeddings.weight", {V, D}}}});
  r.push_back({"pos_embed.weight", {{p + "embeddings.position_embeddings.weight", {c.max_len, D}}}});
  if (c.type_vocab_size > 0)
    r.push_back({"type_embed.weight", {{p + "embeddings.token_type_embeddings.weight", {c.type_vocab_size, D}}}});
  norm_rule(r, "embed_norm", p + "embeddings.LayerNorm", D);
  ignore.insert(p + "embeddings.position_ids");
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string h = p + "encoder.layer." + std::to_string(i) + ".", l = "encoder.layers." + std::to_string(i) + ".";
    separate_attention(r, c, l + "self_attn.", h + "attention.self.query", h + "attention.self.key",
                       h + "attention.self.value", h + "attention.output.dense");
    norm_rule(r, l + "norm1", h + "attention.output.LayerNorm", D);
    linear_rule(r, l + "linear1", h + "intermediate.dense", F, D);
    linear_rule(r, l + "linear2", h + "output.dense", D, F);
    norm_rule(r, l + "norm2", h + "output.LayerNorm", D);
  }
  if (c.arch == Arch::EncoderClassifier) {
    linear_rule(r, "pooler", p + "pooler.dense", D, D);
    linear_rule(r, "classifier", "classifier", c.num_classes, D);
  }
  if (c.arch == Arch::EncoderMLM) {
    linear_rule(r, "mlm.transform", "cls.predictions.transform.dense", D, D);
    norm_rule(r, "mlm.norm", "cls.predictions.transform.LayerNorm", D);
    r.push_back({"mlm.bias", {{"cls.predictions.bias", {V}}}});
    ignore.insert("cls.predictions.decoder.bias");  // the same values as cls.predictions.bias
    if (c.tie_embeddings) {
      ignore.insert("cls.predictions.decoder.weight");
    } else {
      r.push_back({"mlm.decoder.weight", {{"cls.predictions.decoder.weight", {V, D}}}});
    }
  }
  return r;
}

// q_proj, k_proj and v_proj from a fused in_proj_weight (qkv's own layout, exported) or from
// separate matrices (as every Hugging Face folder holds them)
void bart_attention(std::vector<Rule>& r, const ModelConfig& c, const std::string& qkv_prefix, const std::string& h) {
  if (!c.fused_qkv) {
    separate_attention(r, c, qkv_prefix, h + "q_proj", h + "k_proj", h + "v_proj", h + "out_proj");
    return;
  }
  const int64_t D = c.d_model, H = c.n_heads, G = c.kv_heads(), Dk = c.head_dim_k(), Dv = c.head_dim_v();
  r.push_back({qkv_prefix + "in_proj_weight",
               {{h + "q_proj.weight", {H * Dk, D}}, {h + "k_proj.weight", {G * Dk, D}}, {h + "v_proj.weight", {G * Dv, D}}}});
  r.push_back({qkv_prefix + "in_proj_bias",
               {{h + "q_proj.bias", {H * Dk}}, {h + "k_proj.bias", {G * Dk}}, {h + "v_proj.bias", {G * Dv}}}});
  r.push_back({qkv_prefix + "out_proj.weight", {{h + "out_proj.weight", {D, H * Dv}}}});
  r.push_back({qkv_prefix + "out_proj.bias", {{h + "out_proj.bias", {D}}}});
}

// Marian's names, and Pegasus's (the same, and each stack's final norm)
std::vector<Rule> marian_rules(const ModelConfig& c, const std::string& p, std::set<std::string>& ignore) {
  const int64_t D = c.d_model, F = c.d_ff, V = c.vocab_size;
  std::vector<Rule> r;
  if (c.share_embeddings) {
    r.push_back({"shared_embed.weight", {{p + "shared.weight", {V, D}}}});
    ignore.insert(p + "encoder.embed_tokens.weight");  // the shared matrix again
    ignore.insert(p + "decoder.embed_tokens.weight");
  } else {
    r.push_back({"src_embed.weight", {{p + "encoder.embed_tokens.weight", {V, D}}}});
    r.push_back({"tgt_embed.weight", {{p + "decoder.embed_tokens.weight", {V, D}}}});
    ignore.insert(p + "shared.weight");
  }
  ignore.insert(p + "encoder.embed_positions.weight");  // sinusoidal: computed, not read
  ignore.insert(p + "decoder.embed_positions.weight");
  for (int64_t i = 0; i < c.n_encoder_layers; ++i) {
    const std::string h = p + "encoder.layers." + std::to_string(i) + ".", l = "encoder.layers." + std::to_string(i) + ".";
    bart_attention(r, c, l + "self_attn.", h + "self_attn.");
    norm_rule(r, l + "norm1", h + "self_attn_layer_norm", D);
    linear_rule(r, l + "linear1", h + "fc1", F, D);
    linear_rule(r, l + "linear2", h + "fc2", D, F);
    norm_rule(r, l + "norm2", h + "final_layer_norm", D);
  }
  for (int64_t i = 0; i < c.n_decoder_layers; ++i) {
    const std::string h = p + "decoder.layers." + std::to_string(i) + ".", l = "decoder.layers." + std::to_string(i) + ".";
    bart_attention(r, c, l + "self_attn.", h + "self_attn.");
    norm_rule(r, l + "norm1", h + "self_attn_layer_norm", D);
    bart_attention(r, c, l + "multihead_attn.", h + "encoder_attn.");
    norm_rule(r, l + "norm2", h + "encoder_attn_layer_norm", D);
    linear_rule(r, l + "linear1", h + "fc1", F, D);
    linear_rule(r, l + "linear2", h + "fc2", D, F);
    norm_rule(r, l + "norm3", h + "final_layer_norm", D);
  }
  if (c.final_norm) {  // Pegasus
    norm_rule(r, "encoder.norm", p + "encoder.layer_norm", D);
    norm_rule(r, "decoder.norm", p + "decoder.layer_norm", D);
  }
  if (c.tie_embeddings) {
    ignore.insert("lm_head.weight");
  } else {
    r.push_back({"lm_head.weight", {{"lm_head.weight", {V, D}}}});
  }
  if (c.logits_bias) {
    r.push_back({"lm_head.bias", {{"final_logits_bias", {1, V}, false, true}}});
  } else {
    ignore.insert("final_logits_bias");
  }
  return r;
}

// BERT checkpoints from before PyTorch's naming keep LayerNorm.gamma / LayerNorm.beta.
std::string resolve(const Checkpoint& ck, const std::string& name) {
  if (ck.find(name)) return name;
  const std::string ln = "LayerNorm.";
  const size_t at = name.rfind(ln);
  if (at != std::string::npos) {
    const std::string tail = name.substr(at + ln.size());
    const std::string old = name.substr(0, at + ln.size()) + (tail == "weight" ? "gamma" : tail == "bias" ? "beta" : tail);
    if (ck.find(old)) return old;
  }
  return name;
}


// ---- export ------------------------------------------------------------------------------------

const char* hf_activation_name(Activation a, bool gpt2) {
  switch (a) {
    case Activation::GeluTanh: return gpt2 ? "gelu_new" : "gelu_pytorch_tanh";
    case Activation::GeluErf: return "gelu";
    case Activation::ReLU: return "relu";
    case Activation::SiLU: return "silu";
    case Activation::Tanh: break;
  }
  return nullptr;
}

// What an exported config must satisfy, checked in order: the first unmet requirement is named.
// What a family needs of a config: each requirement not met is noted (the setting and why), and
// map_config refuses the config once, listing them all.
struct Needs {
  const ModelConfig& c;
  std::string type;
  std::shared_ptr<std::vector<std::string>> unmet = std::make_shared<std::vector<std::string>>();
  void operator()(bool ok, const std::string& setting, const std::string& why) const {
    if (!ok) unmet->push_back(detail::concat(setting, " (", why, ")"));
  }
  // Throws the one error naming every requirement noted as not met.
  void refuse_unmet() const {
    if (unmet->empty()) return;
    std::string list;
    for (size_t i = 0; i < unmet->size(); ++i) list += (i ? "; " : "") + (*unmet)[i];
    throw Error(unmet->size() == 1
                    ? detail::concat("config: ", list.substr(0, list.find(" (")), " does not map onto Hugging Face's ",
                                     type, list.substr(list.find(" (")))
                    : detail::concat("config: ", unmet->size(), " settings do not map onto Hugging Face's ", type,
                                     ": ", list));
  }
  // n_heads heads of d_model / n_heads dimensions for queries, keys and values
  void plain_heads(const char* why) const {
    (*this)(c.kv_heads() == c.n_heads && c.head_dim_k() * c.n_heads == c.d_model && c.head_dim_v() == c.head_dim_k(),
            heads(), why);
  }
  std::string heads() const {
    return detail::concat("n_kv_heads = ", c.kv_heads(), ", d_k = ", c.head_dim_k(), ", d_v = ", c.head_dim_v());
  }
  // the activation's Hugging Face name (GPT-2 calls the tanh GELU gelu_new)
  const char* activation() const {
    const char* a = hf_activation_name(c.activation, type == "gpt2");
    (*this)(a != nullptr, detail::concat("activation = ", activation_name(c.activation)), "not an activation it has");
    return a ? a : "";  // (refused by refuse_unmet before the config is used)
  }
  // GPT-2 and Llama: a pre-norm decoder with a final norm and an unscaled, unnormalised embedding
  void pre_norm_decoder(NormKind norm, const char* why_norm) const {
    (*this)(c.norm == norm, c.norm == NormKind::LayerNorm ? "norm = layernorm" : "norm = rmsnorm", why_norm);
    (*this)(c.norm_first, "norm_first = false", "its layers are pre-norm");
    (*this)(c.final_norm, "final_norm = false", "it has a final norm");
    (*this)(!c.scale_embeddings, "scale_embeddings = true", "its embeddings are not scaled");
    (*this)(c.type_vocab_size == 0, detail::concat("type_vocab_size = ", c.type_vocab_size), "it has no token types");
    (*this)(!c.embed_norm, "embed_norm = true", "it has no embedding norm");
    (*this)(!c.logits_bias, "logits_bias = true", "its head has no bias");
  }
  // BERT: post-norm layers without final norms, separate q/k/v with biases, n_heads plain heads,
  // an ungated feed-forward
  void post_norm_layers(const char* name, const char* qkv) const {
    (*this)(!c.norm_first, "norm_first = true", detail::concat(name, "'s layers are post-norm").c_str());
    (*this)(!c.final_norm, "final_norm = true", detail::concat(name, " has no final norm").c_str());
    (*this)(!c.fused_qkv, "fused_qkv = true", detail::concat(name, " has separate ", qkv).c_str());
    (*this)(c.bias, "bias = false", detail::concat(name, " has biases").c_str());
    plain_heads(detail::concat(name, " has n_heads heads of d_model / n_heads").c_str());
    (*this)(!c.gated, "gated = true", detail::concat(name, "'s feed-forward is not gated").c_str());
  }
};

json gpt2_export(const Needs& need, const std::vector<std::string>&) {
  const ModelConfig& c = need.c;
  need.pre_norm_decoder(NormKind::LayerNorm, "GPT-2 uses LayerNorm");
  const char* act = need.activation();
  need(c.fused_qkv, "fused_qkv = false", "GPT-2's c_attn is one fused projection");
  need(c.bias, "bias = false", "GPT-2 has biases");
  need.plain_heads("GPT-2 has n_heads heads of d_model / n_heads for queries, keys and values");
  need(!c.gated, "gated = true", "GPT-2's MLP is not gated");
  return {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", c.vocab_size},
          {"n_embd", c.d_model}, {"n_head", c.n_heads}, {"n_layer", c.n_layers}, {"n_inner", c.d_ff},
          {"n_positions", c.max_len}, {"n_ctx", c.max_len}, {"activation_function", act},
          {"layer_norm_epsilon", c.norm_eps}, {"resid_pdrop", c.dropout}, {"embd_pdrop", c.dropout},
          {"attn_pdrop", 0.0}, {"tie_word_embeddings", c.tie_embeddings}, {"initializer_range", c.init_std}};
}

json llama_export(const Needs& need, const std::vector<std::string>&) {
  const ModelConfig& c = need.c;
  need.pre_norm_decoder(NormKind::RMSNorm, "Llama uses RMSNorm");
  const char* act = need.activation();
  need(!c.fused_qkv, "fused_qkv = true", "Llama has separate q_proj, k_proj and v_proj");
  need(c.gated, "gated = false", "Llama's MLP is gated (gate_proj, up_proj)");
  need(c.head_dim_v() == c.head_dim_k(), need.heads(), "Llama's keys and values have one head_dim");
  return {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", c.vocab_size},
          {"hidden_size", c.d_model}, {"intermediate_size", c.d_ff}, {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads}, {"num_key_value_heads", c.kv_heads()}, {"head_dim", c.head_dim_k()},
          {"hidden_act", act}, {"rms_norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta},
          {"max_position_embeddings", c.max_len}, {"tie_word_embeddings", c.tie_embeddings},
          {"attention_bias", c.bias}, {"mlp_bias", c.bias}, {"rope_scaling", nullptr},
          {"initializer_range", c.init_std}};
}

// What Marian and Pegasus both need (split-half positions, LayerNorm with eps 1e-5, biases, plain
// ungated heads, one vocabulary, the special ids), and the config keys they share.
json bart_like_export(const Needs& need, const char* name) {
  const ModelConfig& c = need.c;
  const std::string n = name;
  need(c.positional == Positional::SinusoidalSplitHalf, detail::concat("positional = ", positional_name(c.positional)),
       n + "'s positions are sinusoidal_split_half");
  need(c.norm == NormKind::LayerNorm && c.norm_eps == 1e-5,
       detail::concat("norm = ", c.norm == NormKind::LayerNorm ? "layernorm" : "rmsnorm", ", norm_eps = ", c.norm_eps),
       n + " uses LayerNorm with eps 1e-5");
  need(c.bias, "bias = false", n + " has biases");
  need.plain_heads((n + " has n_heads heads of d_model / n_heads").c_str());
  need(!c.gated, "gated = true", n + "'s feed-forward is not gated");
  const char* act = need.activation();
  need(c.source_vocab() == c.vocab_size, detail::concat("src_vocab_size = ", c.source_vocab()),
       n + " has one vocabulary");
  need(c.pad_id >= 0 && c.eos_id >= 0 && c.bos_id >= 0,
       detail::concat("pad_id = ", c.pad_id, ", bos_id = ", c.bos_id, ", eos_id = ", c.eos_id),
       n + " needs pad, eos and decoder-start tokens");
  return {{"vocab_size", c.vocab_size}, {"d_model", c.d_model}, {"encoder_layers", c.n_encoder_layers},
          {"decoder_layers", c.n_decoder_layers}, {"encoder_attention_heads", c.n_heads},
          {"decoder_attention_heads", c.n_heads}, {"encoder_ffn_dim", c.d_ff}, {"decoder_ffn_dim", c.d_ff},
          {"activation_function", c.activation == Activation::SiLU ? "swish" : act},
          {"max_position_embeddings", c.max_len}, {"scale_embedding", c.scale_embeddings},
          {"tie_word_embeddings", c.tie_embeddings}, {"pad_token_id", c.pad_id}, {"eos_token_id", c.eos_id},
          {"decoder_start_token_id", c.bos_id}, {"dropout", c.dropout}, {"attention_dropout", 0.0},
          {"activation_dropout", 0.0}, {"init_std", c.init_std}, {"is_encoder_decoder", true}};
}

// Marian: post-norm layers, no final norms (a fused in_proj_weight is written as q_proj, k_proj,
// v_proj, as for Pegasus: only a layout)
json marian_export(const Needs& need, const std::vector<std::string>&) {
  const ModelConfig& c = need.c;
  json j = bart_like_export(need, "Marian");
  need(!c.norm_first, "norm_first = true", "Marian's layers are post-norm");
  need(!c.final_norm, "final_norm = true", "Marian has no final norm");
  j["model_type"] = "marian";
  j["architectures"] = {"MarianMTModel"};
  j["decoder_vocab_size"] = c.vocab_size;
  j["share_encoder_decoder_embeddings"] = c.share_embeddings;
  return j;
}

// Pegasus: Marian's layout with pre-norm layers and a final norm on each stack, the layout of
// qkv's own translation models (a fused in_proj_weight is written as q_proj, k_proj, v_proj)
json pegasus_export(const Needs& need, const std::vector<std::string>&) {
  const ModelConfig& c = need.c;
  json j = bart_like_export(need, "Pegasus");
  need(c.norm_first, "norm_first = false", "Pegasus's layers are pre-norm");
  need(c.final_norm, "final_norm = false", "Pegasus has a final norm on each stack");
  need(c.share_embeddings, "share_embeddings = false", "Pegasus has one embedding table for both sides");
  j["model_type"] = "pegasus";
  j["architectures"] = {"PegasusForConditionalGeneration"};
  j["forced_eos_token_id"] = c.eos_id;
  return j;
}

json bert_export(const Needs& need, const std::vector<std::string>& labels) {
  const ModelConfig& c = need.c;
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  need(c.positional == Positional::Learned, detail::concat("positional = ", positional_name(c.positional)),
       "BERT has learned positions");
  need(c.norm == NormKind::LayerNorm, "norm = rmsnorm", "BERT uses LayerNorm");
  need.post_norm_layers("BERT", "query, key and value");
  need(c.embed_norm, "embed_norm = false", "BERT normalises its embeddings");
  need(c.type_vocab_size > 0, "type_vocab_size = 0", "BERT has token-type embeddings");
  need(!c.scale_embeddings, "scale_embeddings = true", "BERT's embeddings are not scaled");
  const char* act = need.activation();
  if (c.arch == Arch::EncoderClassifier) {
    need(c.pooling == Pooling::First && c.pooler,
         detail::concat("pooling = ", c.pooling == Pooling::Mean ? "mean" : "first", ", pooler = ", b(c.pooler)),
         "BERT classifies its first token through the tanh pooler");
  }
  need(c.arch != Arch::EncoderMLM || c.tie_embeddings, "tie_embeddings = false",
       "qkv writes BERT's masked-LM decoder tied to the word embeddings");
  const char* arch = c.arch == Arch::EncoderClassifier ? "BertForSequenceClassification"
                     : c.arch == Arch::EncoderMLM      ? "BertForMaskedLM"
                                                       : "BertModel";
  json j = {{"model_type", "bert"}, {"architectures", {arch}}, {"vocab_size", c.vocab_size},
            {"hidden_size", c.d_model}, {"num_hidden_layers", c.n_layers}, {"num_attention_heads", c.n_heads},
            {"intermediate_size", c.d_ff}, {"hidden_act", act}, {"max_position_embeddings", c.max_len},
            {"type_vocab_size", c.type_vocab_size}, {"layer_norm_eps", c.norm_eps},
            {"pad_token_id", c.pad_id >= 0 ? c.pad_id : 0}, {"position_embedding_type", "absolute"},
            {"hidden_dropout_prob", c.dropout}, {"attention_probs_dropout_prob", 0.0},
            {"initializer_range", c.init_std}};
  if (c.arch == Arch::EncoderClassifier) {
    j["num_labels"] = c.num_classes;
    json id2label = json::object(), label2id = json::object();
    check(labels.empty() || static_cast<int64_t>(labels.size()) == c.num_classes, "export: ", labels.size(),
          " label names for a classifier of num_classes = ", c.num_classes);
    for (int64_t k = 0; k < c.num_classes; ++k) {
      const std::string name = labels.empty() ? "LABEL_" + std::to_string(k) : labels[static_cast<size_t>(k)];
      check(!label2id.contains(name), "export: the label name \"", name, "\" is given twice");
      id2label[std::to_string(k)] = name;
      label2id[name] = k;
    }
    j["id2label"] = id2label;
    j["label2id"] = label2id;
  }
  return j;
}

// A stack of layers as config.json counts it: the key, its value, and one tensor each layer i has.
struct LayerStack {
  const char* key;
  int64_t layers;
  std::string head, tail;  // layer i's probe tensor: head + i + tail
  std::string probe(int64_t i) const { return head + std::to_string(i) + tail; }
};

// One Hugging Face family, everything qkv knows of it in one place.
struct Family {
  const char* type;                  // config.json's "model_type"
  ModelConfig (*config)(const Keys&);  // config.json -> ModelConfig, each key checked
  std::vector<Rule> (*rules)(const ModelConfig&, const std::string& prefix, std::set<std::string>& ignore);
  std::vector<LayerStack> (*stacks)(const ModelConfig&, const std::string& prefix);
  // the prefix a checkpoint's names may carry, and the names (under it) of which a checkpoint
  // holding that prefix has at least one (one without any has bare names); the prefix its
  // classes save a model of config c under
  const char* prefix;
  std::vector<const char*> probes;
  std::string (*saved_prefix)(const ModelConfig&);
  json (*export_config)(const Needs&, const std::vector<std::string>& labels);
};

// Marian's and Pegasus's layer stacks
std::vector<LayerStack> bart_stacks(const ModelConfig& c, const std::string& p) {
  return {{"encoder_layers", c.n_encoder_layers, p + "encoder.layers.", ".fc1.weight"},
          {"decoder_layers", c.n_decoder_layers, p + "decoder.layers.", ".fc1.weight"}};
}

const std::vector<Family>& families() {
  static const std::vector<Family> all = {
      {"gpt2", gpt2_config, gpt2_rules,
       [](const ModelConfig& c, const std::string& p) -> std::vector<LayerStack> {
         return {{"n_layer", c.n_layers, p + "h.", ".ln_1.weight"}};
       },
       "transformer.", {"wte.weight"}, [](const ModelConfig&) -> std::string { return "transformer."; }, gpt2_export},
      {"llama", llama_config, llama_rules,
       [](const ModelConfig& c, const std::string& p) -> std::vector<LayerStack> {
         return {{"num_hidden_layers", c.n_layers, p + "layers.", ".input_layernorm.weight"}};
       },
       "model.", {"embed_tokens.weight"}, [](const ModelConfig&) -> std::string { return "model."; }, llama_export},
      {"bert", bert_config, bert_rules,
       [](const ModelConfig& c, const std::string& p) -> std::vector<LayerStack> {
         return {{"num_hidden_layers", c.n_layers, p + "encoder.layer.", ".attention.output.dense.weight"}};
       },
       "bert.", {"embeddings.word_embeddings.weight"},
       // BertModel saves bare names, the heads' classes under "bert."
       [](const ModelConfig& c) -> std::string { return c.arch == Arch::Encoder ? "" : "bert."; }, bert_export},
      {"marian", marian_config, marian_rules,
       bart_stacks,
       "model.", {"shared.weight", "encoder.embed_tokens.weight"},
       [](const ModelConfig&) -> std::string { return "model."; }, marian_export},
      {"pegasus", pegasus_config, marian_rules,
       bart_stacks,
       "model.", {"shared.weight", "encoder.embed_tokens.weight"},
       [](const ModelConfig&) -> std::string { return "model."; }, pegasus_export},
  };
  return all;
}

const Family* find_family(const std::string& type) {
  for (const Family& f : families())
    if (type == f.type) return &f;
  return nullptr;
}

const Family& family_of(const std::string& type, const std::string& source) {
  if (const Family* f = find_family(type)) return *f;
  std::string names;
  const size_t n = families().size();
  for (size_t i = 0; i < n; ++i)
    names += std::string(i == 0 ? "" : i + 1 == n ? " and " : ", ") + families()[i].type;
  throw Error(detail::concat(source, ": \"model_type\" is \"", type, "\": qkv reads the Hugging Face model types ",
                             names));
}

// The family a config maps onto (decoders by their positions: learned is GPT-2, RoPE Llama), and
// its config.json, every requirement checked.
struct Mapping {
  std::string type;
  json config;
};

Mapping map_config(const ModelConfig& c, const std::vector<std::string>& labels = {}) {
  // encoder-decoders by their layers: post-norm is Marian, pre-norm (qkv's translation preset) Pegasus
  std::string type = c.arch == Arch::EncoderDecoder ? (c.norm_first ? "pegasus" : "marian")
                     : c.arch == Arch::Decoder     ? ""
                                                   : "bert";
  if (type.empty()) {
    Needs need{c, "gpt2 or llama"};
    need(c.positional == Positional::Learned || c.positional == Positional::Rope,
         detail::concat("positional = ", positional_name(c.positional)), "gpt2 has learned positions, llama RoPE");
    need.refuse_unmet();  // (the positions choose the family the rest is checked against)
    type = c.positional == Positional::Learned ? "gpt2" : "llama";
  }
  const Needs need{c, type};
  Mapping m{type, family_of(type, "export").export_config(need, labels)};
  need.refuse_unmet();
  json& j = m.config;
  if (c.arch != Arch::EncoderDecoder) {
    if (c.bos_id >= 0) j["bos_token_id"] = c.bos_id;
    if (c.eos_id >= 0) j["eos_token_id"] = c.eos_id;
    if (c.pad_id >= 0 && m.type != "bert") j["pad_token_id"] = c.pad_id;
  }
  j["torch_dtype"] = "float32";
  return m;
}

}  // namespace

std::vector<family::Rule> family::rules(const std::string& type, const ModelConfig& c, const std::string& prefix,
                                        std::set<std::string>* ignore) {
  std::set<std::string> unused;
  return family_of(type, "model family").rules(c, prefix, ignore ? *ignore : unused);
}

std::string hf_model_type_for(const ModelConfig& config) { return map_config(config).type; }

std::string save_hf_model(const Model& model, const std::string& dir, const std::vector<std::string>& labels) {
  model.check_not_packed("export");
  const ModelConfig& c = model.config();
  check(labels.empty() || c.arch == Arch::EncoderClassifier, "export: label names given for ", arch_name(c.arch),
        ", which is not a classifier");
  const Mapping m = map_config(c, labels);
  // the names Hugging Face's own classes save under
  const Family& fam = family_of(m.type, "export");
  const std::string prefix = fam.saved_prefix(c);
  std::set<std::string> ignore;
  const std::vector<Rule> rules = fam.rules(c, prefix, ignore);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Rule& r : rules) {
    const Parameter* param = model.find(r.param);
    check(param != nullptr, "internal: export rule for unknown parameter ", r.param);
    const Tensor& src = param->var->value;
    const float* in = src.data<float>();
    const int64_t cols = src.dim() == 2 ? src.size(1) : 1;
    int64_t row = 0;
    for (const Part& p : r.parts) {
      Tensor t(p.shape, DType::F32);
      float* o = t.data<float>();
      const int64_t rows = p.flat ? src.size(0) : p.transpose ? p.shape[1] : p.shape[0];
      if (p.transpose) {
        for (int64_t a = 0; a < cols; ++a)
          for (int64_t b2 = 0; b2 < rows; ++b2) o[a * rows + b2] = in[(row + b2) * cols + a];
      } else {
        std::copy(in + row * cols, in + (row + rows) * cols, o);
      }
      row += rows;
      out.emplace_back(p.name, std::move(t));
    }
    check(row == src.size(0), "internal: export rule for ", r.param, " covers ", row, " of ", src.size(0), " rows");
  }
  if (m.type == "marian" || m.type == "pegasus") {
    // the position tables, as transformers computes them (qkv computes its own on load)
    for (const char* side : {"encoder", "decoder"}) {
      Tensor pe({c.max_len, c.d_model}, DType::F32);
      kernels::sinusoidal_positions(pe.data<float>(), c.max_len, c.d_model, 0, kernels::SinusoidalLayout::SplitHalf);
      out.emplace_back(prefix + side + ".embed_positions.weight", std::move(pe));
    }
    if (!c.logits_bias) out.emplace_back("final_logits_bias", Tensor({1, c.vocab_size}, DType::F32));  // zeros
  }
  struct stat st {};
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw Error(detail::concat(dir, ": cannot create the directory: ", std::strerror(errno)));
  check(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir, ": exists and is not a directory");
  write_safetensors(dir + "/model.safetensors", out, {{"format", "pt"}});
  write_file_atomic(dir + "/config.json", m.config.dump(2) + "\n");
  return m.type;
}

bool is_hf_model_dir(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!exists(path)) return false;
  try {
    return read_json(path, "config.json").contains("model_type");
  } catch (const Error&) {
    return false;  // not readable as an HF config: qkv's own loader reports what is wrong
  }
}

ModelConfig hf_config(const std::string& text, const std::string& source, std::string* model_type) {
  const json j = detail::parse_json_object(text, source);
  const Keys c{j, source};
  check(j.contains("model_type") && j.at("model_type").is_string(), source,
        ": \"model_type\" must be a string (a Hugging Face config)");
  const std::string type = j.at("model_type").get<std::string>();
  if (model_type) *model_type = type;
  const ModelConfig m = family_of(type, source).config(c);
  try {
    m.validate();
  } catch (const Error& e) {
    throw Error(detail::concat(source, " (", type, "): ", e.what()));
  }
  return m;
}

Model load_hf_model(const std::string& dir, HfLoadReport* report, const LoadOptions& opt) {
  struct stat st {};
  check(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir, ": not a model directory");
  const std::string cfg_path = dir + "/config.json";
  const std::string text = read_file(cfg_path, "config.json");
  check(text.size() < (64u << 20), cfg_path, ": larger than 64 MiB; not a config file");
  std::string type;
  const ModelConfig cfg = hf_config(text, cfg_path, &type);
  const Checkpoint ck(dir);
  const Family& fam = family_of(type, cfg_path);
  std::set<std::string> ignore;
  // the prefix the checkpoint's names carry (GPT2LMHeadModel's "transformer.", ...), if any
  std::string prefix;
  for (const char* probe : fam.probes)
    if (ck.find(std::string(fam.prefix) + probe)) prefix = fam.prefix;
  // Each stack's layer count against the layers the checkpoint holds, before a rule per layer is
  // planned (n_layer = 10^9 otherwise built rules until memory ran out).
  for (const LayerStack& s : fam.stacks(cfg, prefix)) {
    int64_t present = 0;
    while (present < s.layers && ck.find(resolve(ck, s.probe(present)))) ++present;
    check(present == s.layers, cfg_path, ": \"", s.key, "\" is ", s.layers, ", but ", ck.describe(), " holds ",
          present == 0 ? std::string("no layer") : detail::concat("layers 0..", present - 1, " only"), " (tensor \"",
          s.probe(present), "\" is missing)");
  }
  std::vector<Rule> rules = fam.rules(cfg, prefix, ignore);
  for (Rule& r : rules)
    for (Part& p : r.parts) p.name = resolve(ck, p.name);

  // Every tensor present with its shape before anything is allocated or read.
  for (const Rule& r : rules)
    for (const Part& p : r.parts) {
      const SafetensorsReader::Info* t = ck.find(p.name);
      check(t != nullptr, dir, ": tensor \"", p.name, "\" ", shape_str(p.shape), " is missing from ", ck.describe(),
            " (qkv's ", r.param, ", for this ", type, " config)");
      check(t->shape == p.shape, ck.file_of(p.name), ": tensor \"", p.name, "\" has shape ", shape_str(t->shape),
            "; config.json implies ", shape_str(p.shape));
      check(t->dtype == "F32" || t->dtype == "F16" || t->dtype == "BF16" || t->dtype == "F64", ck.file_of(p.name),
            ": tensor \"", p.name, "\" is ", t->dtype, "; expected F32, F16 or BF16");
    }

  Model m(cfg, Model::Uninitialised{});  // every parameter is filled below (checked)
  std::set<std::string> planned;
  for (const Rule& r : rules) planned.insert(r.param);
  for (const Parameter& p : m.parameters())
    check(planned.count(p.name), "internal: the ", type, " plan has no rule for ", p.name);
  std::set<std::string> used;
  for (const Rule& r : rules) {
    const Parameter* param = m.find(r.param);
    check(param != nullptr, "internal: ", type, " rule for unknown parameter ", r.param);
    const Tensor& dst = param->var->value;
    const int64_t cols = dst.dim() == 2 ? dst.size(1) : 1;
    int64_t row = 0;
    bool whole_rows = dst.dim() == 2;  // every part a block of the parameter's rows, as stored
    for (const Part& p : r.parts) {
      used.insert(p.name);
      const int64_t rows = p.flat ? dst.size(0) : p.transpose ? p.shape[1] : p.shape[0];
      check(row + rows <= dst.size(0) && (p.flat || p.transpose || (p.shape.size() == 1 ? 1 : p.shape[1]) == cols),
            "internal: ", type, " rule for ", r.param, " does not fit ", shape_str(dst.shape()));
      whole_rows = whole_rows && !p.flat && !p.transpose;
      row += rows;
    }
    check(row == dst.size(0), "internal: ", type, " rule for ", r.param, " fills ", row, " of ", dst.size(0), " rows");
    bool packed_now = false;
    if (opt.dtype && whole_rows) {
      // packed from the file a few MiB of rows at a time: its float32 values are never held
      try {
        packed_now = m.pack_parameter_from(r.param, *opt.dtype, [&](int64_t r0, int64_t n, float* out) {
          int64_t base = 0;  // the parts' rows, stacked: [base, base + rows) is part p's
          for (const Part& p : r.parts) {
            const int64_t lo = std::max(r0, base), hi = std::min(r0 + n, base + p.shape[0]);
            if (lo < hi) ck.read_range(p.name, (lo - base) * cols, (hi - lo) * cols, out + (lo - r0) * cols);
            base += p.shape[0];
          }
        }, opt.fallback);
      } catch (const Error& e) {
        throw Error(detail::concat(dir, ": ", e.what()));
      }
    }
    if (packed_now) {
      release_cached_memory();  // the unwritten float32 allocation, now
      continue;
    }
    float* out = dst.data<float>();
    row = 0;
    for (const Part& p : r.parts) {
      const int64_t rows = p.flat ? dst.size(0) : p.transpose ? p.shape[1] : p.shape[0];
      if (!p.transpose) {
        ck.read(p.name, out + row * cols);  // straight into the parameter
      } else {
        // stored (in, out) = (cols, rows): parameter row i is the file's column i
        std::vector<float> tmp(static_cast<size_t>(rows * cols));
        ck.read(p.name, tmp.data());
        for (int64_t a = 0; a < cols; ++a)
          for (int64_t b = 0; b < rows; ++b) out[(row + b) * cols + a] = tmp[static_cast<size_t>(a * rows + b)];
      }
      row += rows;
    }
    if (opt.dtype) {
      // a transposed matrix (GPT-2's Conv1D): packed now, its float32 values freed before the next
      try {
        m.pack_parameter(r.param, *opt.dtype, opt.fallback);
      } catch (const Error& e) {
        throw Error(detail::concat(dir, ": ", e.what()));
      }
      release_cached_memory();
    }
  }
  if (report) {
    report->model_type = type;
    report->files = ck.files();
    for (const std::string& n : ck.names())
      if (!used.count(n) && !ignore.count(n)) report->unused.push_back(n);
  }
  return m;
}

}  // namespace qkv
