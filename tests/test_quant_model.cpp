// Packed weights in a model (Model::pack_weights, ops::linear's packed path): logits against the
// float32 model whose projections hold the packed values dequantised (float rounding only for
// bf16 and f16; plus the activations' per-block int8 rounding for Q8_0 and Q4_0), greedy
// generation the same alone and batched and at any thread count, training refused, and the
// matrices that are and are not packed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "error_testing.h"
#include "kernels/quant.h"
#include "qkv/qkv.h"

namespace {

using namespace qkv;
using qkv::testing::error_of;

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
      kernels::dequantize_row(v->packed->type, v->packed->row(r), v->packed->cols, dst + r * v->packed->cols);
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
    // 2 layers x (fused qkv, out, 2 feed-forward) + the tied output layer
    EXPECT_EQ(m.pack_weights(t), 9) << wtype_name(t);
    const Tensor got = logits_of(m, ids), want = logits_of(dequantised_twin(m, 3), ids);
    double err = 0, moved = 0, range = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      err = std::max(err, std::fabs(static_cast<double>(got.data<float>()[i]) - want.data<float>()[i]));
      moved = std::max(moved, std::fabs(static_cast<double>(got.data<float>()[i]) - base.data<float>()[i]));
      range = std::max(range, std::fabs(static_cast<double>(want.data<float>()[i])));
    }
    const bool int8 = t == WType::Q8_0 || t == WType::Q4_0;
    // bf16, f16: float rounding only (measured 5e-7 of the range); int8 products: the activations'
    // rounding too (|x - d q| <= d/2, d = max|x| / 127 per block of 32; measured 1.2% and 1.4%)
    EXPECT_LE(err, (int8 ? 2e-2 : 1e-5) * range) << wtype_name(t) << ": against the dequantised model";
    EXPECT_GT(moved, 1e-4 * range) << wtype_name(t) << ": packing changed nothing";
  }
}

// 32 rows or more (a prompt, a scored batch): tiles of the weights dequantised and multiplied in
// float32, the activations unquantised, so every type is the dequantised model to float rounding;
// under BatchInvariantGemm each row takes the matrix-vector path as in decoding.
TEST(QuantModel, ManyRowsMultiplyTheDequantisedWeightsInFloat) {
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
    EXPECT_LE(err, 1e-5 * range) << wtype_name(t);
    const bool int8 = t != WType::BF16;
    EXPECT_LE(rowwise_err, (int8 ? 2e-2 : 1e-5) * range) << wtype_name(t) << " row by row";
    if (int8) {
      EXPECT_GT(rowwise_err, 1e-5 * range) << wtype_name(t) << ": row by row quantises the activations";
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

TEST(QuantModel, PackedWeightsAreForInference) {
  Model m(lm_config());
  m.init(1);
  m.pack_weights(WType::Q8_0);
  Tape tape;  // recording: a training step
  Batch b;
  b.input = Tensor::from<int64_t>({1, 3}, {1, 2, 3});
  EXPECT_NE(error_of([&] { m.logits(tape, b); }).find("packed to q8_0 is for inference"), std::string::npos);
  // unpacking restores the float32 products, bitwise
  Model f(lm_config());
  f.init(1);
  m.pack_weights(WType::F32);
  const Tensor a = logits_of(m, {1, 2, 3}), c = logits_of(f, {1, 2, 3});
  EXPECT_EQ(std::memcmp(a.data<float>(), c.data<float>(), a.nbytes()), 0);
  // rows that are not whole blocks of 32 take bf16, named
  ModelConfig odd = lm_config();
  odd.d_ff = 72;
  Model o(odd);
  o.init(1);
  std::vector<std::string> fallback;
  EXPECT_EQ(o.pack_weights(WType::Q4_0, &fallback), 9);
  EXPECT_EQ(fallback, (std::vector<std::string>{"layers.0.linear2.weight", "layers.1.linear2.weight"}));
  for (const Parameter& p : o.parameters())
    if (p.var->packed && p.var->packed->cols == 72) {
      EXPECT_EQ(p.var->packed->type, WType::BF16) << p.name;
    }
  EXPECT_EQ(o.pack_weights(WType::BF16), 9);  // 16-bit types take any length
}

}  // namespace
