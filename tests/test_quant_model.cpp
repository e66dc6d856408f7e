// Packed weights in a model (Model::pack_weights, ops::linear's packed path): logits against the
// float32 model whose projections hold the packed values dequantised (float rounding only for
// bf16 and f16; plus the activations' per-block int8 rounding for Q8_0 and Q4_0), greedy
// generation the same alone and batched and at any thread count, training refused, and the
// matrices that are and are not packed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <cstring>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "kernels/quant.h"
#include "qkv/qkv.h"

namespace {

using namespace qkv;
using qkv::testing::error_of;
using qkv::testing::TempDir;

ModelConfig lm_config() {
  ModelConfig c;
  c.arch = Arch::Decoder;
  c.vocab_size = 64;
  c.d_model = 64;
  c.n_heads = 4;
  c.d_ff = 128;
  c.n_layers = 2;
  c.positional = Positional::Rope;
  c.max_len = 64;
  c.norm_first = true;
  c.eos_id = -1;
  c.init_std = 0.1;
  return c;
}

Tensor logits_of(const Model& m, const std::vector<int64_t>& ids) {
  Tape tape;
  tape.recording = false;
  Batch b;
  b.input = Tensor::from<int64_t>({1, static_cast<int64_t>(ids.size())}, ids);
  return m.logits(tape, b)->value;
}

// The float32 model whose packed matrices hold their packed values, dequantised.
Model dequantised_twin(const Model& packed, uint64_t seed) {
  Model twin(packed.config());
  twin.init(seed);
  for (size_t i = 0; i < packed.parameters().size(); ++i) {
    const Var& v = packed.parameters()[i].var;
    if (!v->packed) continue;
    float* dst = twin.parameters()[i].var->value.data<float>();
    for (int64_t r = 0; r < v->packed->rows; ++r)
      v->packed->dequantize_row(r, dst + r * v->packed->cols);
  }
  return twin;
}

TEST(QuantModel, LogitsMatchTheDequantisedFloatModel) {
  const std::vector<int64_t> ids = {5, 9, 33, 2, 17, 60, 41, 8};
  Model f32(lm_config());
  f32.init(3);
  const Tensor base = logits_of(f32, ids);
  for (WType t : {WType::BF16, WType::F16, WType::Q8_0, WType::Q4_0}) {
    Model m(lm_config());
    m.init(3);
    // 2 layers x (fused qkv, out, 2 feed-forward) + the embedding + the output layer
    EXPECT_EQ(m.pack_weights(t), 10) << wtype_name(t);
    const Tensor got = logits_of(m, ids), want = logits_of(dequantised_twin(m, 3), ids);
    double err = 0, moved = 0, range = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      err = std::max(err, std::fabs(static_cast<double>(got.data<float>()[i]) - want.data<float>()[i]));
      moved = std::max(moved, std::fabs(static_cast<double>(got.data<float>()[i]) - base.data<float>()[i]));
      range = std::max(range, std::fabs(static_cast<double>(want.data<float>()[i])));
    }
    const bool int8 = t == WType::Q8_0 || t == WType::Q4_0;
    // f16: float rounding only (measured 5e-7 of the range); bf16: the activations rounded to
    // bf16 too (2^-9 relative); int8 products: the activations' quantisation (|x - d q| <= d/2,
    // d = max|x| / 127 per block of 32; measured 1.2% and 1.4%)
    EXPECT_LE(err, (int8 ? 2e-2 : t == WType::BF16 ? 5e-3 : 1e-5) * range)
        << wtype_name(t) << ": against the dequantised model (" << err / range << " of the range)";
    if (t == WType::BF16) {
      EXPECT_GT(err, 1e-6 * range) << "bf16: the activations should be rounded";
    }
    EXPECT_GT(moved, 1e-4 * range) << wtype_name(t) << ": packing changed nothing";
  }
}

// 32 rows or more (a prompt, a scored batch): tiles of the weights dequantised and multiplied in
// float32, the activations unquantised, so every type is the dequantised model to float rounding;
// under BatchInvariantGemm each row takes the matrix-vector path as in decoding. Except on a CPU
// with bf16 dot products: there the activations (and dequantised Q8_0 / Q4_0 tiles) are rounded
// to bfloat16 (gemm_bf16_nt).
TEST(QuantModel, ManyRowsMultiplyTheDequantisedWeights) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 7 + 3) % 64);
  for (WType t : {WType::BF16, WType::Q8_0, WType::Q4_0}) {
    Model m(lm_config());
    m.init(4);
    m.pack_weights(t);
    const Tensor got = logits_of(m, ids), want = logits_of(dequantised_twin(m, 4), ids);
    Tensor rowwise;
    {
      BatchInvariantGemm invariant;
      rowwise = logits_of(m, ids);
    }
    double err = 0, range = 0, rowwise_err = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      err = std::max(err, std::fabs(static_cast<double>(got.data<float>()[i]) - want.data<float>()[i]));
      rowwise_err = std::max(rowwise_err, std::fabs(static_cast<double>(rowwise.data<float>()[i]) - want.data<float>()[i]));
      range = std::max(range, std::fabs(static_cast<double>(want.data<float>()[i])));
    }
    const bool bf16_products = t != WType::F16 && bf16_gemm_enabled();
    // the activations' (and dequantised weights') rounding to bfloat16, 2^-9 relative
    EXPECT_LE(err, (bf16_products ? 2e-2 : 1e-5) * range) << wtype_name(t) << ": " << err / range << " of the range";
    if (bf16_products) {
      EXPECT_GT(err, 1e-5 * range) << "bf16: the activations should be rounded";
    }
    // row by row, int8 quantises the activations and bf16 rounds them to bf16
    const bool rounded = t != WType::F16;
    EXPECT_LE(rowwise_err, (rounded ? 2e-2 : 1e-5) * range) << wtype_name(t) << " row by row";
    if (rounded) {
      EXPECT_GT(rowwise_err, 1e-5 * range) << wtype_name(t) << ": row by row rounds the activations";
    }
  }
}

TEST(QuantModel, GreedyTokensAreTheSameAloneBatchedAndAtAnyThreadCount) {
  for (WType t : {WType::Q8_0, WType::Q4_0, WType::BF16}) {
    Model m(lm_config());
    m.init(11);
    m.pack_weights(t);
    GenerateConfig g;
    g.max_new_tokens = 12;
    g.eos_id = -1;
    const std::vector<int32_t> p = {4, 9, 7, 12, 5};
    set_num_threads(1);
    const auto alone = generate(m, {p}, g);
    set_num_threads(2);
    const auto batched = generate(m, {{6, 1, 2}, p, {3}}, g);
    set_num_threads(0);
    EXPECT_EQ(alone[0].tokens, batched[1].tokens) << wtype_name(t);
    EXPECT_EQ(alone[0].tokens.size(), 12u);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()) == 0;
}

TEST(QuantModel, LinearPartsIsLinearOnEachPartBitForBit) {
  // decoding's q, k and v through ops::linear_parts (one quantisation of each row, one parallel
  // region) against ops::linear on each with its segment of the shared bias, for every packed
  // type, a few rows and the many-row path; mixed types and float32 weights take ops::linear
  std::mt19937 rng(4);
  auto randn = [&](std::vector<int64_t> shape) {
    Tensor t = Tensor::empty(shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = std::normal_distribution<float>(0, 1)(rng);
    return t;
  };
  Tape tape;
  tape.recording = false;
  const Var b = make_var(randn({64 + 32 + 32}));
  const std::vector<int64_t> at = {0, 64, 96};
  for (const int64_t rows : {1, 3, 40}) {
    const Var x = make_var(randn({rows, 64}));
    for (const WType t : {WType::Q8_0, WType::Q4_0, WType::BF16, WType::F16, WType::F32}) {
      std::vector<Var> w = {make_var(randn({64, 64})), make_var(randn({32, 64})), make_var(randn({32, 64}))};
      if (t != WType::F32)
        for (Var& wi : w) wi->packed = pack_weight(wi->value, t, "w");
      // a mixed set: the last part at another type
      std::vector<Var> mixed = w;
      if (t == WType::Q4_0) {
        mixed[2] = make_var(randn({32, 64}));
        mixed[2]->packed = pack_weight(mixed[2]->value, WType::Q8_0, "v");
      }
      for (const std::vector<Var>* set : {&w, &mixed}) {
        const std::vector<Var> got = ops::linear_parts(tape, x, *set, b, at);
        ASSERT_EQ(got.size(), 3u);
        for (size_t i = 0; i < 3; ++i) {
          const Tensor want = ops::linear(tape, x, (*set)[i], b, 0, -1, at[i])->value;
          ASSERT_EQ(got[i]->value.shape(), want.shape());
          EXPECT_EQ(std::memcmp(got[i]->value.data<float>(), want.data<float>(), want.numel() * 4), 0)
              << wtype_name(t) << " rows " << rows << " part " << i << (set == &mixed ? " (mixed types)" : "");
        }
      }
    }
  }
}

TEST(QuantModel, PackedWeightsAreForInference) {
  Model m(lm_config());
  m.init(1);
  m.pack_weights(WType::Q8_0);
  EXPECT_EQ(m.weight_type(), WType::Q8_0);
  Tape tape;  // recording: a training step
  Batch b;
  b.input = Tensor::from<int64_t>({1, 3}, {1, 2, 3});
  EXPECT_NE(error_of([&] { m.logits(tape, b); }).find("packed to q8_0 is for inference"), std::string::npos);
  // the float32 values are gone: nothing that needs them runs
  for (auto f : {std::function<void()>([&] { m.state_dict(); }), std::function<void()>([&] { m.init(2); }),
                 std::function<void()>([&] { m.load_state_dict({}, true); })})
    EXPECT_NE(error_of(f).find("packed to q8_0 for inference"), std::string::npos);
  EXPECT_NE(error_of([&] { Trainer t(m, TrainConfig{}); }).find("train: the model's weights are packed to q8_0"),
            std::string::npos);
  for (const Parameter& p : m.parameters())
    if (p.var->packed) {
      EXPECT_FALSE(p.var->value.defined()) << p.name << ": the float32 values are kept";
    }
  EXPECT_EQ(m.num_parameters(), Model(lm_config()).num_parameters());
  EXPECT_EQ(m.pack_weights(WType::Q4_0), 0);  // packed once
  // rows that are not whole blocks of 32 take bf16, named
  ModelConfig odd = lm_config();
  odd.d_ff = 72;
  Model o(odd);
  o.init(1);
  std::vector<std::string> fallback;
  EXPECT_EQ(o.pack_weights(WType::Q4_0, &fallback), 10);
  EXPECT_EQ(fallback, (std::vector<std::string>{"layers.0.linear2.weight", "layers.1.linear2.weight"}));
  for (const Parameter& p : o.parameters())
    if (p.var->packed && p.var->packed->cols == 72) {
      EXPECT_EQ(p.var->packed->type, WType::BF16) << p.name;
    }
  Model o2(odd);
  o2.init(1);
  EXPECT_EQ(o2.pack_weights(WType::BF16), 10);  // 16-bit types take any length
  // a weight that float16 cannot hold is refused, named, not turned into infinity
  Model big(lm_config());
  big.init(1);
  big.parameters()[3].var->value.data<float>()[5] = 70000.0f;
  const std::string e = error_of([&] { big.pack_weights(WType::F16); });
  EXPECT_NE(e.find(big.parameters()[3].name + " row 0: weight 5 is not finite as f16"), std::string::npos) << e;
}

// Which matrices pack, and to what: projections to the type; the output layer and the token
// embeddings (tied or not) at 8 bits or more; norms, biases and position tables stay float32.
TEST(QuantModel, OutputLayerAndEmbeddingsPackAtEightBitsOrMore) {
  ModelConfig c = lm_config();
  c.tie_embeddings = false;
  c.positional = Positional::Learned;
  Model m(c);
  m.init(5);
  const std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  m.pack_weights(WType::Q4_0);
  for (const Parameter& p : m.parameters()) {
    const bool table = p.name == "embed.weight" || p.name == "lm_head.weight";
    if (table) {
      ASSERT_TRUE(p.var->packed) << p.name;
      EXPECT_EQ(p.var->packed->type, WType::Q8_0) << p.name;
    } else if (p.name == "pos_embed.weight" || !p.decay) {
      EXPECT_FALSE(p.var->packed) << p.name;
    } else {
      ASSERT_TRUE(p.var->packed) << p.name;
      EXPECT_EQ(p.var->packed->type, WType::Q4_0) << p.name;
    }
  }
  // the lookup reads the packed table's rows: the dequantised twin, whose table holds them, agrees
  const Tensor got = logits_of(m, ids), want = logits_of(dequantised_twin(m, 5), ids);
  double err = 0, range = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got.data<float>()[i]) - want.data<float>()[i]));
    range = std::max(range, std::fabs(static_cast<double>(want.data<float>()[i])));
  }
  EXPECT_LE(err, 2e-2 * range);
  // a table looked up reads one row per token; the output layer all of its rows
  double bytes = 0;
  for (const Parameter& p : m.parameters()) {
    const auto& w = p.var->packed;
    if (p.name == "embed.weight" || p.name == "pos_embed.weight")
      bytes += w ? static_cast<double>(w->row_bytes) : 4.0 * static_cast<double>(p.var->value.size(1));
    else
      bytes += w ? static_cast<double>(w->row_bytes * static_cast<size_t>(w->rows)) : 4.0 * static_cast<double>(p.var->value.numel());
  }
  EXPECT_EQ(m.weight_bytes_per_token(), bytes);
}

// qkv quantize's directory: the packed bytes saved as they are and loaded without re-quantising
// (the same logits, bitwise); packing as the weights load equals packing after loading.
TEST(QuantModel, PackedDirectoriesRoundTripAndLoadingPacksAsItReads) {
  TempDir dir("quant_dir");
  Model f(lm_config());
  f.init(7);
  f.save(dir / "f32");
  const std::vector<int64_t> ids = {7, 3, 60, 12, 9};
  for (WType t : {WType::BF16, WType::F16, WType::Q8_0, WType::Q4_0}) {
    Model m = Model::load(dir / "f32");
    m.pack_weights(t);
    LoadOptions opt;
    opt.dtype = t;
    const Model at_load = Model::load(dir / "f32", opt);
    EXPECT_TRUE(same_bits(logits_of(m, ids), logits_of(at_load, ids))) << wtype_name(t);
    const std::string out = dir / wtype_name(t);
    m.save(out);
    const Model back = Model::load(out);
    EXPECT_EQ(back.weight_type(), t);
    EXPECT_TRUE(same_bits(logits_of(m, ids), logits_of(back, ids))) << wtype_name(t);
    for (size_t i = 0; i < m.parameters().size(); ++i) {
      const auto& a = m.parameters()[i].var->packed;
      const auto& b = back.parameters()[i].var->packed;
      ASSERT_EQ(!a, !b) << m.parameters()[i].name;
      if (a) {
        EXPECT_EQ(a->type, b->type);
        EXPECT_EQ(std::memcmp(a->bytes->data(), b->bytes->data(), a->row_bytes * static_cast<size_t>(a->rows)), 0);
      }
    }
    // the same type again is allowed; another would re-quantise packed values, and is refused
    EXPECT_NO_THROW(Model::load(out, opt));
    LoadOptions other;
    other.dtype = t == WType::Q8_0 ? WType::Q4_0 : WType::Q8_0;
    const std::string e = error_of([&] { Model::load(out, other); });
    EXPECT_NE(e.find(std::string("its weights are packed to ") + wtype_name(t)), std::string::npos) << e;
  }
}

// A packed file is as hostile as any other: its metadata and its bytes are checked.
TEST(QuantModel, HostilePackedFilesAreRefusedByName) {
  TempDir dir("quant_bad");
  Model m(lm_config());
  m.init(2);
  m.pack_weights(WType::Q8_0);
  m.save(dir / "ok");
  const SafetensorsReader good(dir / "ok/model.safetensors");
  // the file's entries and metadata, changed by `edit`, written to a new directory
  auto variant = [&](const std::string& name, auto&& edit) {
    std::vector<std::string> keep;
    std::vector<SafetensorsEntry> entries;
    for (const auto& info : good.tensors()) {
      keep.emplace_back(info.bytes, '\0');
      good.read_bytes(info.name, keep.back().data(), info.bytes);
    }
    for (size_t i = 0; i < good.tensors().size(); ++i)
      entries.push_back({good.tensors()[i].name, good.tensors()[i].dtype, good.tensors()[i].shape, keep[i]});
    std::map<std::string, std::string> meta = good.metadata();
    edit(entries, meta, keep);
    std::filesystem::create_directories(dir / name);
    std::filesystem::copy_file(dir / "ok/config.json", dir / (name + "/config.json"));
    // entries view `keep`, which edit may have changed in place
    for (size_t i = 0; i < entries.size() && i < keep.size(); ++i)
      if (entries[i].bytes.size() == keep[i].size()) entries[i].bytes = keep[i];
    write_safetensors(dir / (name + "/model.safetensors"), entries, meta);
    return error_of([&] { Model::load(dir / name); });
  };
  using E = std::vector<SafetensorsEntry>;
  using M = std::map<std::string, std::string>;
  using K = std::vector<std::string>;
  EXPECT_NE(variant("type", [](E&, M& meta, K&) { meta["qkv_packed"] = R"({"layers.0.linear1.weight": "q3_k"})"; })
                .find("__metadata__[\"qkv_packed\"][\"layers.0.linear1.weight\"] is \"q3_k\""),
            std::string::npos);
  EXPECT_NE(variant("json", [](E&, M& meta, K&) { meta["qkv_packed"] = "{"; }).find("qkv_packed"), std::string::npos);
  EXPECT_NE(variant("absent", [](E&, M& meta, K&) { meta["qkv_packed"] = R"({"nope": "q8_0"})"; })
                .find("names \"nope\", which the file does not hold"),
            std::string::npos);
  const std::string norm = variant("norm", [](E&, M& meta, K&) {
    meta["qkv_packed"].insert(1, R"("layers.0.norm1.weight": "q8_0", )");
  });
  EXPECT_NE(norm.find("\"layers.0.norm1.weight\" is packed to q8_0, but the parameter is (64,), not a matrix"),
            std::string::npos) << norm;
  EXPECT_NE(variant("dtype", [](E&, M& meta, K&) { meta.erase("qkv_dtype"); }).find("no \"qkv_dtype\""),
            std::string::npos);
  // a block scale of infinity (f16 0x7c00) in the first block of row 1 of the first packed matrix
  const std::string inf = variant("scale", [](E& e, M&, K& keep) {
    for (size_t i = 0; i < e.size(); ++i)
      if (e[i].dtype == "U8") {
        const size_t rb = static_cast<size_t>(e[i].shape[1]);
        keep[i][rb] = 0x00;
        keep[i][rb + 1] = 0x7c;
        break;
      }
  });
  EXPECT_NE(inf.find(" row 1: weight 0 is not finite as q8_0"), std::string::npos) << inf;
  // packed bytes of the wrong shape for the config
  EXPECT_NE(variant("shape", [](E& e, M&, K& keep) {
              for (size_t i = 0; i < e.size(); ++i)
                if (e[i].dtype == "U8") {
                  e[i].shape = {e[i].shape[0] * 2, e[i].shape[1] / 2};
                  break;
                }
            }).find("q8_0 packing of"),
            std::string::npos);
}

}  // namespace
