// Hugging Face folders from qkv's side: export -> load gives identical logits for every family,
// configs that do not map are refused naming the setting (writing nothing), and hostile
// config.json files give one clear error. (Parity with reference models written from Hugging
// Face's semantics is tests/hf_parity.py.)
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/files.h"
#include "qkv/hf.h"
#include "qkv/model.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

ModelConfig base(Arch a) {
  ModelConfig c;
  c.arch = a;
  c.vocab_size = 61;
  c.d_model = 24;
  c.n_heads = 4;
  c.d_ff = 40;
  c.n_layers = 2;
  c.n_encoder_layers = 2;
  c.n_decoder_layers = 1;
  c.max_len = 32;
  c.init_std = 0.3;
  return c;
}

ModelConfig gpt2_like(bool tied) {
  ModelConfig c = base(Arch::Decoder);
  c.positional = Positional::Learned;
  c.norm_first = true;
  c.activation = Activation::GeluTanh;
  c.tie_embeddings = tied;
  c.bos_id = c.eos_id = 60;
  return c;
}

ModelConfig llama_like(bool bias) {
  ModelConfig c = base(Arch::Decoder);
  c.positional = Positional::Rope;
  c.norm = NormKind::RMSNorm;
  c.norm_first = true;
  c.activation = Activation::SiLU;
  c.gated = true;
  c.fused_qkv = false;
  c.bias = bias;
  c.n_kv_heads = 2;
  c.d_k = c.d_v = 8;  // head_dim 8, not d_model / n_heads = 6
  c.rope_theta = 5e5;
  return c;
}

ModelConfig bert_like(Arch a) {
  ModelConfig c = base(a);
  c.positional = Positional::Learned;
  c.final_norm = false;
  c.embed_norm = true;
  c.type_vocab_size = 2;
  c.fused_qkv = false;
  c.activation = Activation::GeluErf;
  c.norm_eps = 1e-12;
  c.pad_id = 0;
  if (a == Arch::EncoderClassifier) {
    c.num_classes = 3;
    c.pooling = Pooling::First;
    c.pooler = true;
  }
  if (a == Arch::EncoderMLM) c.tie_embeddings = true;
  return c;
}

ModelConfig marian_like(bool logits_bias) {
  ModelConfig c = base(Arch::EncoderDecoder);
  c.positional = Positional::SinusoidalSplitHalf;
  c.final_norm = false;
  c.fused_qkv = false;
  c.activation = Activation::SiLU;
  c.scale_embeddings = true;
  c.share_embeddings = true;
  c.tie_embeddings = true;
  c.logits_bias = logits_bias;
  c.pad_id = 60;
  c.bos_id = 60;
  c.eos_id = 0;
  return c;
}

// a post-norm translator in qkv's own layout (a fused q/k/v), exported as Marian
ModelConfig marian_fused() {
  ModelConfig c = marian_like(false);
  c.fused_qkv = true;
  c.activation = Activation::ReLU;
  return c;
}

// qkv train --task translate's layout: pre-norm with final norms, a fused q/k/v, no logits bias
ModelConfig pegasus_like(bool fused) {
  ModelConfig c = marian_like(false);
  c.norm_first = true;
  c.final_norm = true;
  c.fused_qkv = fused;
  c.activation = Activation::ReLU;
  return c;
}

Tensor logits_of(const Model& m, const Batch& b) {
  Tape t;
  t.recording = false;
  return m.logits(t, b)->value;
}

Batch batch_for(const ModelConfig& c) {
  Batch b;
  b.input = Tensor({2, 6}, DType::I64);
  for (int64_t i = 0; i < 12; ++i) b.input.data<int64_t>()[i] = 1 + (i * 7) % 50;
  if (c.arch == Arch::EncoderDecoder) {
    b.decoder_input = Tensor({2, 4}, DType::I64);
    for (int64_t i = 0; i < 8; ++i) b.decoder_input.data<int64_t>()[i] = i == 0 || i == 4 ? 60 : 2 + (i * 5) % 40;
  }
  return b;
}

TEST(HfExport, EveryFamilyRoundTripsWithIdenticalLogits) {
  TempDir dir("hf_export");
  struct Case {
    const char* name;
    ModelConfig cfg;
    const char* type;
  };
  std::vector<Case> cases = {
      {"gpt2 tied", gpt2_like(true), "gpt2"},          {"gpt2 untied", gpt2_like(false), "gpt2"},
      {"llama", llama_like(false), "llama"},           {"llama with biases", llama_like(true), "llama"},
      {"bert mlm", bert_like(Arch::EncoderMLM), "bert"}, {"bert classifier", bert_like(Arch::EncoderClassifier), "bert"},
      {"bert encoder", bert_like(Arch::Encoder), "bert"}, {"marian", marian_like(true), "marian"},
      {"marian without logits bias", marian_like(false), "marian"},
      {"marian from fused q/k/v", marian_fused(), "marian"},
      {"pegasus from fused q/k/v (the main job's translator)", pegasus_like(true), "pegasus"},
      {"pegasus from separate q/k/v", pegasus_like(false), "pegasus"},
  };
  int i = 0;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Model m(k.cfg);
    m.init(100 + i);
    const std::string out = dir / (std::string("m").append(std::to_string(i++)));
    EXPECT_EQ(hf_model_type_for(k.cfg), k.type);
    EXPECT_EQ(save_hf_model(m, out), k.type);
    ASSERT_TRUE(is_hf_model_dir(out));
    HfLoadReport report;
    const Model back = load_hf_model(out, &report);
    EXPECT_EQ(report.model_type, k.type);
    EXPECT_TRUE(report.unused.empty()) << report.unused.size() << " unused, the first " << report.unused[0];
    // Marian always has final_logits_bias: a model without one gets zeros
    const bool zero_bias = k.cfg.arch == Arch::EncoderDecoder && !k.cfg.logits_bias;
    EXPECT_EQ(back.num_parameters(), m.num_parameters() + (zero_bias ? k.cfg.vocab_size : 0));
    const Batch b = batch_for(k.cfg);
    const Tensor a = logits_of(m, b), z = logits_of(back, b);
    ASSERT_EQ(a.shape(), z.shape());
    EXPECT_EQ(std::memcmp(a.data<float>(), z.data<float>(), a.nbytes()), 0) << "logits differ after the round trip";
    // Model::load takes the folder too
    const Tensor y = logits_of(Model::load(out), b);
    EXPECT_EQ(std::memcmp(a.data<float>(), y.data<float>(), a.nbytes()), 0);
  }
}

TEST(HfExport, ConfigsThatDoNotMapAreRefusedNamingTheSetting) {
  TempDir dir("hf_export_bad");
  struct Case {
    ModelConfig cfg;
    std::vector<std::string> said;
  };
  ModelConfig alibi = gpt2_like(true);
  alibi.positional = Positional::Alibi;
  ModelConfig post = gpt2_like(true);
  post.norm_first = false;
  ModelConfig gqa = gpt2_like(true);
  gqa.n_kv_heads = 2;
  ModelConfig old_main_job = pegasus_like(true);  // qkv train --task translate before 2026-12-06
  old_main_job.positional = Positional::Sinusoidal;
  ModelConfig post_final = marian_like(true);
  post_final.final_norm = true;
  ModelConfig two_tables = pegasus_like(true);
  two_tables.share_embeddings = false;
  ModelConfig ungated = llama_like(false);
  ungated.gated = false;
  ModelConfig mean_pool = bert_like(Arch::EncoderClassifier);
  mean_pool.pooling = Pooling::Mean;
  ModelConfig tanh = gpt2_like(true);
  tanh.activation = Activation::Tanh;
  const std::vector<Case> cases = {
      {alibi, {"positional = alibi", "gpt2 or llama"}},
      {post, {"norm_first = false", "gpt2", "pre-norm"}},
      {gqa, {"n_kv_heads = 2", "gpt2"}},
      {old_main_job, {"positional = sinusoidal", "pegasus", "sinusoidal_split_half"}},
      {post_final, {"final_norm = true", "marian", "no final norm"}},
      {two_tables, {"share_embeddings = false", "pegasus", "one embedding table"}},
      {ungated, {"gated = false", "llama"}},
      {mean_pool, {"pooling = mean", "bert"}},
      {tanh, {"activation = tanh", "gpt2"}},
  };
  for (const Case& k : cases) {
    Model m(k.cfg);
    const std::string out = dir / "out";
    const std::string e = error_of([&] { save_hf_model(m, out); });
    for (const std::string& s : k.said) EXPECT_TRUE(has(e, s)) << "expected \"" << s << "\" in: " << e;
    EXPECT_FALSE(fs::exists(out)) << "a refused export wrote " << out;
  }
}

// A classifier's class names become id2label / label2id (they were always LABEL_0, LABEL_1, ...);
// names that do not fit the classifier are refused before anything is written.
TEST(HfExport, ClassifierLabelsNameTheClasses) {
  TempDir dir("hf_labels");
  Model m(bert_like(Arch::EncoderClassifier));  // 3 classes
  m.init(5);
  save_hf_model(m, dir / "named", {"old", "new", "other"});
  const nlohmann::json j = nlohmann::json::parse(testing::read_bytes(dir / "named/config.json"));
  EXPECT_EQ(j.at("id2label"), nlohmann::json({{"0", "old"}, {"1", "new"}, {"2", "other"}}));
  EXPECT_EQ(j.at("label2id"), nlohmann::json({{"old", 0}, {"new", 1}, {"other", 2}}));
  EXPECT_EQ(hf_config(testing::read_bytes(dir / "named/config.json"), "cfg.json").num_classes, 3);
  save_hf_model(m, dir / "unnamed");
  EXPECT_TRUE(has(testing::read_bytes(dir / "unnamed/config.json"), "\"LABEL_2\""));
  EXPECT_TRUE(has(error_of([&] { save_hf_model(m, dir / "twice", {"a", "b", "a"}); }), "\"a\" is given twice"));
  EXPECT_TRUE(has(error_of([&] { save_hf_model(m, dir / "two", {"a", "b"}); }), "2 label names for a classifier of num_classes = 3"));
  Model lm(gpt2_like(true));
  EXPECT_TRUE(has(error_of([&] { save_hf_model(lm, dir / "lm", {"a", "b"}); }), "not a classifier"));
  for (const char* d : {"twice", "two", "lm"}) EXPECT_FALSE(fs::exists(dir / d)) << d;
}

// Rewrites keys of DIR/config.json (null removes a key).
void patch_config(const std::string& dir, const nlohmann::json& changes) {
  const std::string path = dir + "/config.json";
  nlohmann::json j = nlohmann::json::parse(testing::read_bytes(path));
  for (const auto& [k, v] : changes.items()) {
    if (v.is_null()) {
      j.erase(k);
    } else {
      j[k] = v;
    }
  }
  testing::write_bytes(path, j.dump(2));
}

TEST(HfLoad, LayerCountsBeyondTheCheckpointAreRefusedBeforePlanning) {
  // n_layer = 10^9 once planned a rule per layer before comparing tensors: gigabytes, growing
  TempDir dir("hf_layers");
  struct Case {
    ModelConfig cfg;
    const char* key;
    const char* held;
  };
  const std::vector<Case> cases = {
      {gpt2_like(true), "n_layer", "layers 0..1 only"},
      {llama_like(false), "num_hidden_layers", "layers 0..1 only"},
      {bert_like(Arch::EncoderClassifier), "num_hidden_layers", "layers 0..1 only"},
      {marian_like(true), "encoder_layers", "layers 0..1 only"},
      {marian_like(true), "decoder_layers", "layers 0..0 only"},
  };
  int i = 0;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.key);
    Model m(k.cfg);
    m.init(7);
    const std::string out = dir / std::string("m").append(std::to_string(i++));
    save_hf_model(m, out);
    patch_config(out, {{k.key, 1000000000}});
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { load_hf_model(out); });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "refused only after planning";
    for (const std::string& s : {out + "/config.json", std::string("\"") + k.key + "\" is 1000000000",
                                std::string(k.held), std::string("is missing")})
      EXPECT_TRUE(has(e, s)) << "expected \"" << s << "\" in: " << e;
    // fewer layers than the file holds still load (the rest reported unused)
    patch_config(out, {{k.key, 1}});
    HfLoadReport report;
    EXPECT_NO_THROW(load_hf_model(out, &report));
    EXPECT_EQ(report.unused.empty(), std::string(k.key) == "decoder_layers");  // marian_like has 1 decoder layer
  }
}

TEST(HfConfig, HostileConfigsGiveOneClearError) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"model_type": "gpt2", "n_embd": "wide"})", {"\"n_embd\" must be an integer"}},
      {R"({"model_type": "gpt2", "n_embd": 768, "n_embd": 512})", {"duplicate key \"n_embd\""}},
      {R"({"model_type": "gpt2", "n_layer": 99999999999999999999})", {"\"n_layer\""}},
      {R"({"model_type": "gpt2", "n_head": 0})", {"n_heads"}},
      {R"({"model_type": "gpt2", "n_embd": 770, "n_head": 12})", {"not divisible"}},
      {R"({"model_type": "gpt2", "layer_norm_epsilon": -1})", {"norm_eps"}},
      {R"({"model_type": "gpt2", "activation_function": "mish"})", {"activation_function", "mish"}},
      {R"({"model_type": "gpt2", "vocab_size": 100, "bos_token_id": 50256})", {"bos_token_id", "50256", "vocabulary"}},
      {R"({"model_type": "gpt2", "reorder_and_upcast_attn": true})", {"reorder_and_upcast_attn", "true"}},
      {R"({"model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 4}})", {"rope_scaling", "dynamic"}},
      {R"({"model_type": "llama", "attention_bias": true})", {"attention_bias", "mlp_bias"}},
      {R"({"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 3, "hidden_size": 64})",
       {"n_kv_heads = 3", "divide"}},
      {R"({"model_type": "bert", "position_embedding_type": "relative_key"})",
       {"position_embedding_type", "relative_key"}},
      {R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "num_labels": 1})",
       {"regression"}},
      {R"({"model_type": "bert", "architectures": ["BertForQuestionAnswering"]})", {"BertForQuestionAnswering"}},
      {R"({"model_type": "marian", "decoder_attention_heads": 8, "encoder_attention_heads": 16})",
       {"decoder_attention_heads"}},
      {R"({"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "factor": 8, "rope_theta": 500000}})",
       {"rope_parameters", "llama3"}},
      {R"({"model_type": "llama", "rope_parameters": {"rope_type": "default", "factor": 8}})",
       {"\"rope_parameters\" has \"factor\""}},
      {R"({"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000}})",
       {"\"rope_parameters\".\"rope_type\" is \"llama3\""}},
      {R"({"model_type": "llama", "rope_parameters": {"type": "linear"}})", {"\"rope_parameters\".\"type\" is \"linear\""}},
      {R"({"model_type": "llama", "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})",
       {"\"rope_parameters\".\"partial_rotary_factor\" is 0.5"}},
      {R"({"model_type": "llama", "partial_rotary_factor": 0.25})", {"\"partial_rotary_factor\" is 0.25"}},
      {R"({"model_type": "llama", "rope_parameters": 500000})", {"\"rope_parameters\" must be an object"}},
      {R"({"model_type": "llama", "rope_parameters": {"rope_theta": "big"}})", {"rope_parameters", "\"rope_theta\" must be a number"}},
      {R"({"model_type": "llama", "rope_theta": 10000, "rope_parameters": {"rope_theta": 500000}})",
       {"\"rope_theta\" is 10000", "\"rope_parameters\".\"rope_theta\" is 500000"}},
      {R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"],
           "id2label": {"0": "old", "1": "old"}})", {"\"id2label\"[\"1\"] is \"old\"", "another label"}},
      {R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "1": 7}})",
       {"\"id2label\"[\"1\"] must be a label name", "7"}},
      {R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "2": "b"}})",
       {"\"id2label\" has no key \"1\" but has \"2\"", "\"0\" .. \"1\""}},
      {R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"1": "a", "x": "b"}})",
       {"\"id2label\" has no key \"0\" but has \"x\""}},
      {R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "01": "b"}})",
       {"\"id2label\" has no key \"1\" but has \"01\""}},
      {R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": ["a", "b"]})",
       {"\"id2label\" must be an object"}},
      {R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"], "num_labels": 3,
           "id2label": {"0": "a", "1": "b"}})", {"\"num_labels\" is 3 but \"id2label\" names 2 labels"}},
      {R"({"model_type": "t5"})", {"model_type", "t5"}},
      {R"({"model_type": 7})", {"model_type"}},
      {R"(["model_type"])", {"object"}},
  };
  for (const auto& [text, said] : cases) {
    const std::string e = error_of([&] { hf_config(text, "cfg.json"); });
    EXPECT_TRUE(has(e, "cfg.json")) << text << " -> " << e;
    for (const std::string& s : said) EXPECT_TRUE(has(e, s)) << text << " -> expected \"" << s << "\" in: " << e;
  }
  // the defaults are Hugging Face's: an empty gpt2 config is GPT-2 small
  const ModelConfig g = hf_config(R"({"model_type": "gpt2"})", "cfg.json");
  EXPECT_EQ(g.vocab_size, 50257);
  EXPECT_EQ(g.d_model, 768);
  EXPECT_EQ(g.n_layers, 12);
  EXPECT_EQ(g.d_ff, 3072);
  EXPECT_EQ(g.max_len, 1024);
  EXPECT_EQ(g.eos_id, 50256);
  EXPECT_EQ(hf_config(R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"],
                         "id2label": {"1": "new", "0": "old", "2": "other"}})", "cfg.json").num_classes, 3);
  // transformers' newer layout: RoPE's base inside "rope_parameters" (once read as 10000)
  EXPECT_EQ(hf_config(R"({"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 500000}})",
                      "cfg.json").rope_theta, 500000.0);
  EXPECT_EQ(hf_config(R"({"model_type": "llama", "rope_theta": 250000, "partial_rotary_factor": 1.0,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 250000, "partial_rotary_factor": 1}})",
                      "cfg.json").rope_theta, 250000.0);
  EXPECT_EQ(hf_config(R"({"model_type": "llama", "rope_theta": 250000})", "cfg.json").rope_theta, 250000.0);
}

}  // namespace
}  // namespace qkv
