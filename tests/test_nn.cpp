// The differentiable ops (qkv/ops.h) and the models built from them (qkv/model.h): every op's
// backward, and whole models' parameter gradients, against central finite differences.
//
// The kernels underneath are checked against finite differences in double (test_kernels_*);
// here the ops run in float32, so the finite differences are of a float32 function. With
// L = sum(y * r) accumulated in double, step h = 1e-2 and O(1) values, the difference quotient
// carries about 1e-4 absolute error (float rounding of y over h, plus h^2 truncation); the bound
// is |fd - analytic| <= 3e-3 * (1 + max|analytic|) + 2e-2 * |analytic|. A wrong backward (a
// missing term, a transposed index) is off by O(1) and fails it by orders of magnitude.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/autograd.h"
#include "qkv/files.h"
#include "qkv/model.h"
#include "qkv/npy.h"
#include "qkv/ops.h"

namespace qkv {
namespace {

using testing::error_of;

Tensor randn(std::vector<int64_t> shape, uint64_t seed, float scale = 1.0f) {
  Tensor t(std::move(shape), DType::F32);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return t;
}

Tensor ids_tensor(std::vector<int64_t> shape, std::vector<int64_t> v) { return Tensor::from<int64_t>(shape, v); }

double dot(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.data<float>()[i]) * r.data<float>()[i];
  return s;
}

// Checks d(sum(build() * r))/d(leaf) for every leaf against central differences at up to
// `per_leaf` elements of each. `kink` skips elements with |x| < kink (ReLU's corner).
void gradcheck(const std::string& what, const std::vector<Var>& leaves, const std::function<Var(Tape&)>& build,
               int per_leaf = 16, float kink = 0.0f) {
  Tape tape;
  Var y = build(tape);
  const Tensor r = randn(y->value.shape(), 99);
  for (const Var& l : leaves) l->zero_grad();
  tape.backward(y, r);
  std::mt19937_64 g(7);
  for (size_t li = 0; li < leaves.size(); ++li) {
    const Var& leaf = leaves[li];
    ASSERT_TRUE(leaf->has_grad) << what << ": leaf " << li << " received no gradient";
    const int64_t n = leaf->value.numel();
    double gmax = 0;
    for (int64_t i = 0; i < n; ++i) gmax = std::max(gmax, std::fabs(static_cast<double>(leaf->grad.data<float>()[i])));
    for (int c = 0; c < per_leaf && c < n; ++c) {
      const int64_t i = n <= per_leaf ? c : static_cast<int64_t>(g() % static_cast<uint64_t>(n));
      float* x = leaf->value.data<float>() + i;
      const float x0 = *x;
      if (std::fabs(x0) < kink) continue;
      const float h = 1e-2f;
      auto eval = [&](float v) {
        *x = v;
        Tape t;
        t.recording = false;
        return dot(build(t)->value, r);
      };
      const double fd = (eval(x0 + h) - eval(x0 - h)) / (static_cast<double>(x0 + h) - static_cast<double>(x0 - h));
      *x = x0;
      const double an = leaf->grad.data<float>()[i];
      EXPECT_LE(std::fabs(fd - an), 3e-3 * (1 + gmax) + 2e-2 * std::fabs(an))
          << what << ": leaf " << li << " element " << i << ": finite difference " << fd << ", backward " << an;
    }
  }
}

Var param(std::vector<int64_t> shape, uint64_t seed, float scale = 1.0f) {
  return make_var(randn(std::move(shape), seed, scale), true);
}

TEST(Ops, LinearWithRowsAndBiasOffset) {
  Var x = param({2, 3, 5}, 1), w = param({7, 5}, 2), b = param({9}, 3);
  gradcheck("linear all rows", {x, w, b}, [&](Tape& t) { return ops::linear(t, x, w, b, 0, -1, 2); });
  gradcheck("linear rows 2..6", {x, w, b}, [&](Tape& t) { return ops::linear(t, x, w, b, 2, 6); });
  gradcheck("linear no bias", {x, w}, [&](Tape& t) { return ops::linear(t, x, w, nullptr); });
}

TEST(Ops, LinearMatchesDirectSum) {
  Var x = param({4, 3}, 1), w = param({2, 3}, 2), b = param({2}, 3);
  Tape t;
  Var y = ops::linear(t, x, w, b);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) {
      double s = b->value.data<float>()[j];
      for (int k = 0; k < 3; ++k) s += x->value.data<float>()[i * 3 + k] * w->value.data<float>()[j * 3 + k];
      EXPECT_NEAR(y->value.data<float>()[i * 2 + j], s, 1e-5);
    }
  EXPECT_NE(error_of([&] { ops::linear(t, x, param({2, 4}, 1), nullptr); }).find("does not end in the weight's In = 4"),
            std::string::npos);
}

TEST(Ops, AddScaleEmbeddingPositions) {
  Var a = param({2, 3, 4}, 1), b = param({2, 3, 4}, 2), table = param({6, 4}, 3), pos = param({5, 4}, 4);
  const Tensor ids = ids_tensor({2, 3}, {1, 5, 1, 0, 2, 1});  // id 1 three times: scatter-add
  gradcheck("add", {a, b}, [&](Tape& t) { return ops::add(t, a, b); });
  gradcheck("scale", {a}, [&](Tape& t) { return ops::scale(t, a, -1.5f); });
  gradcheck("embedding", {table}, [&](Tape& t) { return ops::embedding(t, ids, table); }, 24);
  gradcheck("positions", {a, pos}, [&](Tape& t) { return ops::add_positions(t, a, pos, 1); }, 20);
  Tape t;
  EXPECT_NE(error_of([&] { ops::embedding(t, ids_tensor({1}, {6}), table); }).find("id 6 at flat index 0 is outside"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::add_positions(t, a, pos, 3); }).find("exceed the table's 5 positions"),
            std::string::npos);
}

TEST(Ops, Norms) {
  Var x = param({3, 2, 6}, 1, 2.0f), g = param({6}, 2), b = param({6}, 3);
  gradcheck("layer_norm", {x, g, b}, [&](Tape& t) { return ops::layer_norm(t, x, g, b, 1e-5f); });
  gradcheck("layer_norm no shift", {x, g}, [&](Tape& t) { return ops::layer_norm(t, x, g, nullptr, 1e-5f); });
  gradcheck("rms_norm", {x, g}, [&](Tape& t) { return ops::rms_norm(t, x, g, 1e-6f); });
}

TEST(Ops, ActivationsSwigluDropout) {
  Var x = param({4, 6}, 1);
  gradcheck("relu", {x}, [&](Tape& t) { return ops::activation(t, x, Activation::ReLU); }, 16, 0.05f);
  gradcheck("gelu", {x}, [&](Tape& t) { return ops::activation(t, x, Activation::GeluErf); });
  gradcheck("gelu tanh", {x}, [&](Tape& t) { return ops::activation(t, x, Activation::GeluTanh); });
  gradcheck("silu", {x}, [&](Tape& t) { return ops::activation(t, x, Activation::SiLU); });
  gradcheck("swiglu", {x}, [&](Tape& t) { return ops::gated(t, x, Activation::SiLU); });
  gradcheck("geglu", {x}, [&](Tape& t) { return ops::gated(t, x, Activation::GeluErf); });
  gradcheck("geglu tanh", {x}, [&](Tape& t) { return ops::gated(t, x, Activation::GeluTanh); });
  gradcheck("dropout", {x}, [&](Tape& t) { return ops::dropout(t, x, 0.4f, 11, 3); });
  Tape t;
  Var y = ops::dropout(t, x, 0.4f, 11, 3);
  int zeros = 0;
  for (int64_t i = 0; i < 24; ++i) {
    const float v = y->value.data<float>()[i];
    if (v == 0.0f) ++zeros;
    else EXPECT_FLOAT_EQ(v, x->value.data<float>()[i] / 0.6f);
  }
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, 24);
  EXPECT_EQ(ops::dropout(t, x, 0.0f, 1, 1), x);  // p = 0: the input itself
}

TEST(Ops, AttentionSelfFusedCausalWithPadding) {
  // H = 2 heads of Dk = 3 over a fused (B, T, 2*3 + 2*3 + 2*3) projection.
  Var qkv = param({2, 5, 18}, 1);
  ops::HeadLayout hl{2, 2, 3, 3, 0, 6, 12, 0.0, 0, 0};
  AttentionSpec spec;
  spec.causal = true;
  spec.key_lengths = Tensor::from<int64_t>({2}, {5, 3});
  gradcheck("self causal padded", {qkv}, [&](Tape& t) { return ops::attention(t, qkv, qkv, qkv, hl, spec); }, 40);
}

// The heads' gradients reach a fused projection's gradient whether it holds nothing yet and the
// heads cover its columns (written in), holds an earlier contribution (added: the same node read by
// two attentions), or has columns no head reads (zeroed, then added: those columns' gradient is 0).
TEST(Ops, AttentionGradientsIntoFusedProjections) {
  ops::HeadLayout hl{2, 2, 3, 3, 0, 6, 12, 0.0, 0, 0};
  AttentionSpec causal;
  causal.causal = true;
  Var qkv = param({2, 5, 18}, 4);
  gradcheck("two attentions", {qkv}, [&](Tape& t) {
    return ops::add(t, ops::attention(t, qkv, qkv, qkv, hl, causal), ops::attention(t, qkv, qkv, qkv, hl, {}));
  }, 40);
  Var wide = param({2, 5, 20}, 5);  // columns 18 and 19 are read by no head
  gradcheck("unread columns", {wide}, [&](Tape& t) { return ops::attention(t, wide, wide, wide, hl, causal); }, 40);
  // the gradient buffer kept from before holds NaN: nothing may be left of it
  Tape t;
  Var y = ops::attention(t, wide, wide, wide, hl, causal);
  wide->zero_grad();
  ASSERT_TRUE(wide->grad.defined());
  std::fill(wide->grad.data<float>(), wide->grad.data<float>() + wide->grad.numel(), std::nanf(""));
  t.backward(y, randn(y->value.shape(), 6));
  ASSERT_TRUE(wide->has_grad);
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t c = 18; c < 20; ++c) EXPECT_EQ(wide->grad.data<float>()[r * 20 + c], 0.0f) << r << " " << c;
}

TEST(Ops, AttentionGqaDkNeDvRopeAlibi) {
  // H = 4 query heads sharing Hkv = 2 key/value heads, Dk = 4, Dv = 3.
  Var q = param({1, 6, 16}, 1), kv = param({1, 6, 14}, 2);
  ops::HeadLayout hl{4, 2, 4, 3, 0, 0, 8, 10000.0, 0, 0};
  AttentionSpec spec;
  spec.causal = true;
  gradcheck("gqa rope", {q, kv}, [&](Tape& t) { return ops::attention(t, q, kv, kv, hl, spec); }, 30);
  hl.rope_theta = 0;
  spec.alibi = true;
  gradcheck("gqa alibi", {q, kv}, [&](Tape& t) { return ops::attention(t, q, kv, kv, hl, spec); }, 30);
}

TEST(Ops, AttentionCrossSeparateSources) {
  Var q = param({2, 3, 4}, 1), k = param({2, 5, 4}, 2), v = param({2, 5, 6}, 3);
  ops::HeadLayout hl{2, 2, 2, 3, 0, 0, 0, 0.0, 0, 0};
  AttentionSpec spec;
  spec.key_lengths = Tensor::from<int64_t>({2}, {2, 5});
  gradcheck("cross", {q, k, v}, [&](Tape& t) { return ops::attention(t, q, k, v, hl, spec); }, 30);
}

TEST(Ops, RopeRelativePositionInScores) {
  // With RoPE, the score of a query at position m against a key at n depends on m - n only:
  // shifting both positions by 3 leaves the output unchanged.
  Var q = param({1, 4, 4}, 1), kv = param({1, 4, 8}, 2);
  ops::HeadLayout hl{1, 1, 4, 4, 0, 0, 4, 100.0, 0, 0};
  Tape t;
  Var a = ops::attention(t, q, kv, kv, hl, {});
  hl.q_pos = hl.k_pos = 3;
  Var b = ops::attention(t, q, kv, kv, hl, {});
  for (int64_t i = 0; i < a->value.numel(); ++i) EXPECT_NEAR(a->value.data<float>()[i], b->value.data<float>()[i], 1e-5);
  hl.k_pos = 0;  // shifting only the queries changes it
  Var c = ops::attention(t, q, kv, kv, hl, {});
  double diff = 0;
  for (int64_t i = 0; i < a->value.numel(); ++i) diff += std::fabs(a->value.data<float>()[i] - c->value.data<float>()[i]);
  EXPECT_GT(diff, 1e-3);
}

TEST(Ops, CrossEntropyAndPooling) {
  Var logits = param({2, 3, 5}, 1);
  const Tensor targets = ids_tensor({2, 3}, {1, 4, -100, 0, 2, 2});
  gradcheck("ce", {logits}, [&](Tape& t) { return ops::cross_entropy(t, logits, targets); }, 30);
  gradcheck("ce smoothing", {logits}, [&](Tape& t) { return ops::cross_entropy(t, logits, targets, -100, 0.1f); }, 30);
  int64_t counted = 0;
  Tape t;
  ops::cross_entropy(t, logits, targets, -100, 0.0f, &counted);
  EXPECT_EQ(counted, 5);
  EXPECT_NE(error_of([&] { ops::cross_entropy(t, logits, ids_tensor({2, 3}, {1, 5, 0, 0, 0, 0})); })
                .find("target 5 at flat index 1"),
            std::string::npos);
  Var x = param({2, 4, 3}, 2);
  const Tensor len = ids_tensor({2}, {2, 4});
  gradcheck("mean_pool", {x}, [&](Tape& tt) { return ops::mean_pool(tt, x, len); }, 24);
  gradcheck("first_token", {x}, [&](Tape& tt) { return ops::first_token(tt, x); }, 24);
  Var p = ops::mean_pool(t, x, len);
  EXPECT_NEAR(p->value.data<float>()[0], (x->value.data<float>()[0] + x->value.data<float>()[3]) / 2, 1e-6);
}

TEST(Ops, SharedParameterAccumulatesBothUses) {
  // A tied embedding: used as the input table and as the output projection.
  Var table = param({5, 3}, 1);
  const Tensor ids = ids_tensor({1, 4}, {0, 3, 3, 1});
  gradcheck("tied", {table}, [&](Tape& t) { return ops::linear(t, ops::embedding(t, ids, table), table, nullptr); }, 15);
}

TEST(Ops, InputUsedTwiceAccumulates) {
  // A pre-norm residual block: x feeds both the norm and the residual add.
  Var x = param({2, 3, 4}, 1), g = param({4}, 2), b = param({4}, 3), w = param({4, 4}, 4);
  gradcheck("x + ln(x)", {x, g, b}, [&](Tape& t) { return ops::add(t, x, ops::layer_norm(t, x, g, b, 1e-5f)); });
  gradcheck("two blocks", {x, w, g}, [&](Tape& t) {
    Var h = ops::add(t, x, ops::linear(t, ops::rms_norm(t, x, g, 1e-5f), w, nullptr));
    return ops::add(t, h, ops::linear(t, ops::layer_norm(t, h, g, b, 1e-5f), w, nullptr));
  });
}

TEST(Ops, BackwardFreesSavedActivationsAndNeedsScalarLoss) {
  Var x = param({2, 3}, 1), w = param({4, 3}, 2);
  Tape t;
  Var y = ops::linear(t, x, w, nullptr);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_NE(error_of([&] { t.backward(y); }).find("exactly one element"), std::string::npos);
  Var l = ops::cross_entropy(t, y, ids_tensor({2}, {0, 3}));
  t.backward(l);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_TRUE(w->has_grad);
}

// ---- scores are not symmetric -------------------------------------------------------------------

TEST(Attention, LearnedProjectionsMakeScoresAsymmetric) {
  // The chapter: with W_Q != W_K, how much token A attends to B differs from how much B attends
  // to A. Two tokens a, b; score(x, y) = (x W_Q^T) . (y W_K^T).
  Var wq = param({4, 4}, 1), wk = param({4, 4}, 2);
  Var xa = param({1, 4}, 3), xb = param({1, 4}, 4);
  Tape t;
  auto score = [&](const Var& x, const Var& y) {
    const Tensor q = ops::linear(t, x, wq, nullptr)->value, k = ops::linear(t, y, wk, nullptr)->value;
    double s = 0;
    for (int i = 0; i < 4; ++i) s += static_cast<double>(q.data<float>()[i]) * k.data<float>()[i];
    return s;
  };
  const double ab = score(xa, xb), ba = score(xb, xa);
  EXPECT_GT(std::fabs(ab - ba), 0.1) << "score(a, b) = " << ab << ", score(b, a) = " << ba;
  // With W_Q = W_K the bilinear form is symmetric.
  wk->value = wq->value.clone();
  EXPECT_NEAR(score(xa, xb), score(xb, xa), 1e-5);
}

// ---- whole models -----------------------------------------------------------------------------------

ModelConfig tiny(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 11;
  c.src_vocab_size = 9;
  c.d_model = 8;
  c.n_heads = 2;
  c.d_ff = 12;
  c.n_layers = 2;
  c.n_encoder_layers = 1;
  c.n_decoder_layers = 2;
  c.max_len = 8;
  c.num_classes = 3;
  c.init_std = 0.3;
  c.pad_id = 0;
  return c;
}

Batch tiny_batch(const ModelConfig& c) {
  Batch b;
  b.input = ids_tensor({2, 5}, {3, 4, 5, 6, 7, 8, 2, 1, 0, 0});
  if (c.arch == Arch::EncoderDecoder) {
    b.decoder_input = ids_tensor({2, 4}, {1, 9, 10, 4, 1, 3, 0, 0});
    b.target = ids_tensor({2, 4}, {9, 10, 4, 2, 3, 2, 0, 0});
  } else if (c.arch == Arch::Decoder) {
    b.target = ids_tensor({2, 5}, {4, 5, 6, 7, 2, 2, 1, 3, 0, 0});
  } else {
    b.target = ids_tensor({2}, {2, 0});
  }
  return b;
}

// Finite differences of the model's loss at a few elements of every parameter.
void model_gradcheck(const ModelConfig& c, const std::string& what) {
  Model m(c);
  m.init(5);
  const Batch batch = tiny_batch(c);
  for (Parameter& p : m.parameters()) p.var->zero_grad();
  Tape tape;
  Var loss = m.loss(tape, m.logits(tape, batch), batch);
  tape.backward(loss);
  auto eval = [&] {
    Tape t;
    t.recording = false;
    return static_cast<double>(m.loss(t, m.logits(t, batch), batch)->value.data<float>()[0]);
  };
  std::mt19937_64 g(3);
  for (Parameter& p : m.parameters()) {
    ASSERT_TRUE(p.var->has_grad) << what << ": " << p.name << " got no gradient";
    const int64_t n = p.var->value.numel();
    for (int c2 = 0; c2 < 4; ++c2) {
      const int64_t i = static_cast<int64_t>(g() % static_cast<uint64_t>(n));
      float* x = p.var->value.data<float>() + i;
      const float x0 = *x, h = 1e-2f;
      *x = x0 + h;
      const double lp = eval();
      *x = x0 - h;
      const double lm = eval();
      *x = x0;
      const double fd = (lp - lm) / (2.0 * h), an = p.var->grad.data<float>()[i];
      EXPECT_LE(std::fabs(fd - an), 2e-3 + 3e-2 * std::fabs(an)) << what << ": " << p.name << "[" << i << "]: fd " << fd
                                                                 << ", backward " << an;
    }
  }
}

TEST(Models, DecoderGradientsEveryVariant) {
  ModelConfig c = tiny(Arch::Decoder);
  c.activation = Activation::GeluErf;
  for (Positional pos : {Positional::Sinusoidal, Positional::Learned, Positional::Rope, Positional::Alibi,
                         Positional::None}) {
    c.positional = pos;
    c.norm_first = pos == Positional::Rope || pos == Positional::Learned;
    model_gradcheck(c, std::string("decoder ") + positional_name(pos));
  }
  c.positional = Positional::Rope;
  c.norm = NormKind::RMSNorm;
  c.activation = Activation::SiLU;
  c.gated = true;
  c.n_kv_heads = 1;
  c.bias = false;
  c.tie_embeddings = true;
  c.fused_qkv = false;
  model_gradcheck(c, "llama-like decoder");
}

TEST(Models, EncoderDecoderAndClassifierGradients) {
  // Smooth activations: finite differences across ReLU's corner are meaningless (ReLU's own
  // backward is checked in Ops.ActivationsSwigluDropout, away from the corner).
  ModelConfig c = tiny(Arch::EncoderDecoder);
  c.activation = Activation::GeluErf;
  c.scale_embeddings = true;
  model_gradcheck(c, "encoder-decoder post-norm");
  c.norm_first = true;
  c.fused_qkv = false;
  c.d_k = 3;
  c.d_v = 5;
  model_gradcheck(c, "encoder-decoder pre-norm, separate projections, Dk != Dv");
  ModelConfig k = tiny(Arch::EncoderClassifier);
  k.activation = Activation::GeluTanh;
  model_gradcheck(k, "classifier mean pooling");
  k.pooling = Pooling::First;
  k.positional = Positional::Learned;
  model_gradcheck(k, "classifier first token");
}

TEST(Models, PaddingDoesNotLeakIntoRealPositions) {
  // Changing the padding tokens of a row changes none of its real positions' logits.
  ModelConfig c = tiny(Arch::EncoderClassifier);
  Model m(c);
  m.init(1);
  Batch b = tiny_batch(c);
  Tape t;
  t.recording = false;
  const Tensor l1 = m.logits(t, b)->value.clone();
  b.input = ids_tensor({2, 5}, {3, 4, 5, 6, 7, 8, 2, 1, 0, 0});
  b.input_lengths = Tensor::from<int64_t>({2}, {5, 3});
  const Tensor l2 = m.logits(t, b)->value.clone();
  b.input = ids_tensor({2, 5}, {3, 4, 5, 6, 7, 8, 2, 1, 9, 4});  // garbage beyond length 3
  const Tensor l3 = m.logits(t, b)->value.clone();
  for (int64_t i = 0; i < l1.numel(); ++i) {
    EXPECT_EQ(l1.data<float>()[i], l2.data<float>()[i]);  // pad_id gives the same lengths
    EXPECT_EQ(l2.data<float>()[i], l3.data<float>()[i]);
  }
}

TEST(Models, CausalDecoderIgnoresTheFuture) {
  ModelConfig c = tiny(Arch::Decoder);
  c.pad_id = -1;
  Model m(c);
  m.init(1);
  Batch b;
  b.input = ids_tensor({1, 5}, {3, 4, 5, 6, 7});
  Tape t;
  t.recording = false;
  const Tensor l1 = m.logits(t, b)->value.clone();
  b.input = ids_tensor({1, 5}, {3, 4, 5, 1, 2});
  const Tensor l2 = m.logits(t, b)->value.clone();
  for (int64_t i = 0; i < 3 * 11; ++i) EXPECT_EQ(l1.data<float>()[i], l2.data<float>()[i]);
  double later = 0;
  for (int64_t i = 3 * 11; i < 5 * 11; ++i) later += std::fabs(l1.data<float>()[i] - l2.data<float>()[i]);
  EXPECT_GT(later, 0.0);
}

TEST(Models, ShiftRightIsTeacherForcing) {
  const Tensor d = shift_right(ids_tensor({2, 3}, {5, 6, 7, 8, 9, 0}), 1);
  const std::vector<int64_t> want = {1, 5, 6, 1, 8, 9};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(d.data<int64_t>()[i], want[static_cast<size_t>(i)]);
  EXPECT_NE(error_of([] { shift_right(ids_tensor({3}, {1, 2, 3}), 1); }).find("must be (B, T)"), std::string::npos);
}

TEST(Models, ConfigJsonRoundTripAndStrictness) {
  ModelConfig c = tiny(Arch::EncoderDecoder);
  c.positional = Positional::Rope;
  c.activation = Activation::SiLU;
  c.gated = true;
  const ModelConfig d = ModelConfig::from_json(c.to_json(), "c.json");
  EXPECT_EQ(d.to_json(), c.to_json());
  EXPECT_NE(error_of([] { ModelConfig::from_json(R"({"vocab_size": 5, "d_modle": 4})", "x.json"); })
                .find("x.json: unknown key \"d_modle\""),
            std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::from_json(R"({"vocab_size": 5, "positional": "absolute"})", "x.json"); })
                .find("expected one of sinusoidal, learned, rope, alibi, none"),
            std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::from_json(R"({"vocab_size": 5, "d_model": 6, "n_heads": 4})", "x.json"); })
                .find("not divisible by n_heads"),
            std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::from_json(R"({"vocab_size": "5"})", "x.json"); }).find("must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::from_json("{", "x.json"); }).find("x.json: not valid JSON"), std::string::npos);
  // Found by fuzzing (tests/fuzz/fuzz_config.cpp): parts of the file silently dropped or misread.
  EXPECT_NE(error_of([] { ModelConfig::from_json(std::string(R"({"vocab_size": 5})") + '\0' + "{\"junk", "x.json"); })
                .find("x.json: not valid JSON: NUL byte at offset 17"),
            std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::from_json(R"({"vocab_size": 5, "d_model": 8, "d_model": 16})", "x.json"); })
                .find("x.json: duplicate key \"d_model\""),
            std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::from_json(R"({"vocab_size": 5, "pad_id": 18446744073709551615})", "x.json"); })
                .find("\"pad_id\" is 18446744073709551615, beyond any size a model can have"),
            std::string::npos);
}

// config.json integers are read checking type and range, naming the key; a key given twice is
// an error (as in tokenizer.json and safetensors headers), not "the last one wins".
TEST(Models, ConfigRejectsDuplicatesAndOutOfRangeIntegers) {
  auto err = [](const std::string& json) { return error_of([&] { ModelConfig::from_json(json, "x.json"); }); };
  auto has = [](const std::string& e, const std::string& part) {
    return e.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                             : ::testing::AssertionFailure() << "'" << part << "' not in: " << e;
  };
  EXPECT_TRUE(has(err(R"({"vocab_size": 5, "d_model": 8, "d_model": 16})"), "x.json: duplicate key \"d_model\""));
  // in a nested object, and the same key in two objects is no duplicate
  EXPECT_TRUE(has(err(R"({"a": {"b": 1}, "c": [{"b": 2, "d": {}, "b": 3}]})"), "x.json: duplicate key \"b\""));
  EXPECT_FALSE(has(err(R"({"a": {"b": 1}, "c": [{"b": 2}, {"b": 2}], "vocab_size": 0})"), "duplicate"));
  EXPECT_TRUE(has(err(std::string("{\"vocab_size\": 5}\0{\"d_model\": 3}", 32)), "x.json: not valid JSON: NUL byte"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 18446744073709551615})"),
                  "x.json: \"vocab_size\" is 18446744073709551615, beyond any size"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 9223372036854775808})"), "\"vocab_size\" is 9223372036854775808"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 3000000000})"), "vocab_size must be in [1, 2147483647], got 3000000000"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 5, "d_model": 8, "n_heads": 4, "n_kv_heads": -1})"),
                  "n_kv_heads must be in [0, 1099511627776] (0: n_heads), got -1"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 5, "d_model": 8, "n_heads": 4, "d_k": 4611686018427387904})"),
                  "d_k must be in [0, 1099511627776]"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 5, "d_model": 8, "n_heads": 4, "d_k": 1099511627776})"),
                  "n_heads * d_k = 4 * 1099511627776 is more than 1099511627776"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 5, "d_model": 8, "n_heads": 4, "d_v": 1099511627776})"),
                  "n_heads * d_v = 4 * 1099511627776"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 5, "n_layers": -3})"), "n_layers must be in [1, "));
  EXPECT_TRUE(has(err(R"({"vocab_size": 5, "d_model": 5.0})"), "\"d_model\" must be an integer, got 5.0"));
  EXPECT_TRUE(has(err(R"({"vocab_size": 5, "norm_eps": 1e999})"), "x.json: not valid JSON"));
  // what code builds is held to the same ranges, finite doubles included
  ModelConfig c = tiny(Arch::Decoder);
  c.init_std = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "init_std must be finite"));
  c = tiny(Arch::Decoder);
  c.rope_theta = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(has(error_of([&] { c.validate(); }), "rope_theta must be finite"));
}

// parameter_count plans the real construction: it equals the built model's count for every
// architecture and option that changes the parameters.
TEST(Models, ParameterCountEqualsTheBuiltModel) {
  std::vector<ModelConfig> cases;
  for (Arch a : {Arch::Decoder, Arch::EncoderDecoder, Arch::EncoderClassifier}) {
    ModelConfig c = tiny(a);
    cases.push_back(c);
    c.positional = Positional::Learned;
    c.fused_qkv = false;
    c.n_kv_heads = 1;
    c.d_k = 3;
    c.d_v = 5;
    c.activation = Activation::SiLU;
    c.gated = true;
    c.norm = NormKind::RMSNorm;
    c.bias = false;
    c.final_norm = false;
    c.tie_embeddings = a != Arch::EncoderClassifier;
    c.n_layers = 3;
    c.n_encoder_layers = 2;
    c.n_decoder_layers = 4;
    cases.push_back(c);
  }
  for (const ModelConfig& c : cases) {
    SCOPED_TRACE(c.to_json());
    EXPECT_EQ(Model::parameter_count(c), static_cast<double>(Model(c).num_parameters()));
  }
}

// A config whose weights cannot fit in memory is refused before anything is allocated, naming
// the key behind it, what it implies and the memory available (n_layers = 10^4 used to allocate
// layer by layer; d_ff = 10^12 ended in "Storage: cannot allocate ... bytes").
TEST(Models, HugeConfigsAreRefusedNamingTheKey) {
  ModelConfig ff = tiny(Arch::Decoder);
  ff.d_ff = 1000000000000;
  std::string e = error_of([&] { Model m(ff); });
  EXPECT_NE(e.find("config: the model would have"), std::string::npos) << e;
  EXPECT_NE(e.find("of memory available"), std::string::npos) << e;
  EXPECT_NE(e.find("mostly the feed-forward (d_ff = 1000000000000 x d_model = 8)"), std::string::npos) << e;
  ModelConfig deep = tiny(Arch::EncoderDecoder);
  deep.d_model = 512;
  deep.d_ff = 2048;
  deep.n_decoder_layers = 10000000;
  e = error_of([&] { Model m(deep); });
  EXPECT_NE(e.find("n_decoder_layers = 10000000 layers of 4204032 parameters each, mostly attention"), std::string::npos) << e;
  ModelConfig wide = tiny(Arch::Decoder);
  wide.vocab_size = 2000000000;
  wide.d_model = 1 << 20;
  wide.n_heads = 1;
  e = error_of([&] { Model m(wide); });
  EXPECT_NE(e.find("the embeddings and output layer (vocab_size = 2000000000"), std::string::npos) << e;
}

// A model directory whose config implies more parameters than its weights file can hold is
// refused before the model is allocated.
TEST(Models, LoadRefusesAConfigTheWeightsCannotHold) {
  testing::TempDir dir("nn");
  Model m(tiny(Arch::Decoder));
  m.save(dir.path().string());
  std::string cfg = testing::read_bytes(dir / "config.json");
  const std::string from = "\"n_layers\": 2";
  ASSERT_NE(cfg.find(from), std::string::npos);
  cfg.replace(cfg.find(from), from.size(), "\"n_layers\": 100000000");
  testing::write_bytes(dir / "config.json", cfg);
  const std::string e = error_of([&] { Model::load(dir.path().string()); });
  EXPECT_NE(e.find("config.json: the config implies"), std::string::npos) << e;
  EXPECT_NE(e.find("n_layers = 100000000 layers"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors holds only"), std::string::npos) << e;
}

// A float exactly representable in IEEE half precision (normal or zero), as its 16 bits.
uint16_t exact_half(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) == 0) return static_cast<uint16_t>(u >> 16);
  const uint32_t sign = (u >> 16) & 0x8000u, exp = ((u >> 23) & 0xffu) - 127 + 15, mant = (u >> 13) & 0x3ffu;
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

// The model's weights as an F16 safetensors file (documented as read and converted to float32).
std::string f16_safetensors(const Model& m) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : m.state_dict()) {
    const size_t begin = data.size();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const uint16_t h = exact_half(t.data<float>()[i]);
      data.push_back(static_cast<char>(h & 0xff));
      data.push_back(static_cast<char>(h >> 8));
    }
    header[name] = {{"dtype", "F16"}, {"shape", t.shape()}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string h = header.dump();
  std::string out(8, '\0');
  for (int k = 0; k < 8; ++k) out[static_cast<size_t>(k)] = static_cast<char>((h.size() >> (8 * k)) & 0xff);
  return out + h + data;
}

// Model::load's check of the config against the weights file comes after the reader's own checks
// and counts values, not bytes: an F16 file loads (it was refused as "the two files do not belong
// together"), and a truncated file, a directory or a FIFO gets the reader's precise message.
TEST(Models, LoadChecksTheWeightsFileBeforeItsSizeAndAcceptsF16) {
  testing::TempDir dir("nn_f16");
  ModelConfig c = tiny(Arch::Decoder);
  c.vocab_size = 2000;  // most of the parameters in one table
  Model m(c);
  m.init(3);
  int64_t k = 0;
  for (const auto& [name, t] : m.state_dict())
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>((k++ % 17) - 8) / 16.0f;
  const std::string d = dir.path().string(), w = dir / "model.safetensors";
  m.save(d);
  const std::string f16 = f16_safetensors(m);
  ASSERT_LT(f16.size(), static_cast<size_t>(4 * m.num_parameters()));  // what the old check refused
  testing::write_bytes(w, f16);
  const Model back = Model::load(d);
  for (const auto& [name, t] : m.state_dict()) {
    const Tensor& b = back.find(name)->var->value;
    ASSERT_EQ(b.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(b.data<float>(), t.data<float>(), t.nbytes()), 0) << name << " differs after F16";
  }
  // a file cut short: the reader's message, naming the file
  testing::write_bytes(w, f16.substr(0, f16.size() / 2));
  std::string e = error_of([&] { Model::load(d); });
  EXPECT_NE(e.find(w), std::string::npos) << e;
  EXPECT_EQ(e.find("do not belong together"), std::string::npos) << e;
  EXPECT_NE(e.find("run past the end of the data section"), std::string::npos) << e;
  std::filesystem::remove(w);
  std::filesystem::create_directory(w);
  e = error_of([&] { Model::load(d); });
  EXPECT_NE(e.find(w + ": "), std::string::npos) << e;
  EXPECT_NE(e.find("a directory"), std::string::npos) << e;
  std::filesystem::remove(w);
  ASSERT_EQ(::mkfifo(w.c_str(), 0600), 0);
  e = error_of([&] { Model::load(d); });
  EXPECT_NE(e.find("is a FIFO"), std::string::npos) << e;
  EXPECT_EQ(e.find("do not belong together"), std::string::npos) << e;
}

// check_batch names each tensor as the caller calls it and says what was expected.
TEST(Models, CheckBatchNamesTheTensor) {
  BatchNames n;
  n.input = "--input x.npy";
  n.input_lengths = "--lengths l.npy";
  n.decoder_input = "--decoder-input d.npy";
  n.target = "--target t.npy";
  auto err = [&](const Model& m, const Batch& b) { return error_of([&] { m.check_batch(b, n); }); };
  ModelConfig lc = tiny(Arch::Decoder);
  lc.positional = Positional::Learned;
  const Model lm(lc), ed(tiny(Arch::EncoderDecoder)), cls(tiny(Arch::EncoderClassifier));
  for (const Model* m : {&lm, &ed, &cls}) EXPECT_EQ(err(*m, tiny_batch(m->config())), "no exception");
  Batch b = tiny_batch(lc);
  b.input = Tensor({2, 0}, DType::I64);
  EXPECT_NE(err(lm, b).find("--input x.npy: (2, 0) is empty"), std::string::npos);
  b.input = Tensor({0, 5}, DType::I64);
  EXPECT_NE(err(lm, b).find("--input x.npy: (0, 5) is empty"), std::string::npos);
  b.input = Tensor({2, 9}, DType::I64);
  EXPECT_NE(err(lm, b).find("--input x.npy: rows of 9 tokens exceed the model's max_len 8"), std::string::npos);
  b.input = ids_tensor({1, 2}, {3, 11});
  EXPECT_NE(err(lm, b).find("--input x.npy: token id 11 at (0, 1) is outside the vocabulary [0, 11)"),
            std::string::npos);
  b = tiny_batch(lc);
  b.input_lengths = ids_tensor({2}, {5, 6});
  EXPECT_NE(err(lm, b).find("--lengths l.npy: length 6 of row 1 is outside [0, 5]"), std::string::npos);
  b = tiny_batch(lc);
  b.target = ids_tensor({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_NE(err(lm, b).find("--target t.npy: expected one next token per position, (2, 5), got (2, 4)"),
            std::string::npos);
  b.decoder_input = b.input;
  EXPECT_NE(err(lm, b).find("--decoder-input d.npy: only an encoder-decoder"), std::string::npos);
  Batch eb = tiny_batch(ed.config());
  eb.input = ids_tensor({1, 1}, {9});  // the source vocabulary is 9
  eb.decoder_input = ids_tensor({1, 1}, {10});
  eb.target = ids_tensor({1, 1}, {4});
  EXPECT_NE(err(ed, eb).find("--input x.npy: token id 9 at (0, 0) is outside the vocabulary [0, 9)"),
            std::string::npos);
  Batch cb = tiny_batch(cls.config());
  cb.target = ids_tensor({2}, {3, 0});
  EXPECT_NE(err(cls, cb).find("--target t.npy: 3 at flat index 0 is neither a class in [0, 3)"), std::string::npos);
  // the forward pass itself refuses an empty batch with its own words, not a view error
  Batch empty = tiny_batch(lc);
  empty.input = Tensor({2, 0}, DType::I64);
  Tape tape;
  EXPECT_NE(error_of([&] { lm.logits(tape, empty); }).find("batch: input (2, 0) is empty"), std::string::npos);
}

TEST(Models, StateDictMismatchNamesTensorAndShapes) {
  Model m(tiny(Arch::Decoder));
  auto sd = m.state_dict();
  sd[3].second = Tensor({7, 7}, DType::F32);
  const std::string name = sd[3].first;
  const std::string e = error_of([&] { m.load_state_dict(sd); });
  EXPECT_NE(e.find("\"" + name + "\" has shape (7, 7) but the config needs"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { m.load_state_dict(m.state_dict()); }), "no exception");
  auto sd2 = m.state_dict();
  sd2.pop_back();
  EXPECT_NE(error_of([&] { m.load_state_dict(sd2); }).find("is missing"), std::string::npos);
  auto sd3 = m.state_dict();
  sd3.emplace_back("layers.9.norm1.weight", Tensor({8}, DType::F32));
  EXPECT_NE(error_of([&] { m.load_state_dict(sd3); }).find("unexpected tensor \"layers.9.norm1.weight\""),
            std::string::npos);
}

TEST(Models, InitIsSeeded) {
  Model a(tiny(Arch::Decoder)), b(tiny(Arch::Decoder)), c(tiny(Arch::Decoder));
  a.init(1);
  b.init(1);
  c.init(2);
  bool differs = false;
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    const Tensor &x = a.parameters()[i].var->value, &y = b.parameters()[i].var->value, &z = c.parameters()[i].var->value;
    for (int64_t j = 0; j < x.numel(); ++j) {
      ASSERT_EQ(x.data<float>()[j], y.data<float>()[j]);
      differs |= x.data<float>()[j] != z.data<float>()[j];
    }
  }
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {

// Model directories written by qkv before the model became a composition of parts (commit
// 8b95a9c: config.json with "activation": "swiglu" and no "gated"), with the logits that qkv
// computed for their inputs (`qkv --threads 1 forward`). The parts must give the same numbers.
TEST(Models, DirectoriesSavedBeforeTheRedesignGiveTheirLogits) {
  const char* data = std::getenv("QKV_TEST_DATA");
  ASSERT_NE(data, nullptr) << "QKV_TEST_DATA is not set (ctest sets it)";
  const std::string root = std::string(data) + "/legacy_models/";
  int seen = 0;
  for (const char* name : {"decoder_swiglu_rope_gqa", "decoder_learned_gelu_tanh_tied", "decoder_alibi_relu_postnorm",
                           "encdec_sinusoidal_scaled", "encdec_learned_gelu_prenorm", "classifier_mean_gelu",
                           "classifier_first_rope"}) {
    SCOPED_TRACE(name);
    const std::string dir = root + name;
    const Model m = Model::load(dir);
    Batch b;
    b.input = read_npy(dir + "/input.npy");
    if (m.config().arch == Arch::EncoderDecoder) b.decoder_input = read_npy(dir + "/decoder_input.npy");
    Tape tape;
    tape.recording = false;
    const Tensor got = m.logits(tape, b)->value, want = read_npy(dir + "/logits.npy");
    ASSERT_EQ(got.shape(), want.shape());
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(got.data<float>()[i]) - want.data<float>()[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want.data<float>()[i])));
    }
    EXPECT_GT(scale, 0.1) << "the stored logits are too small to test anything";
    EXPECT_LE(worst, 1e-6 * scale) << "largest difference " << worst << " against logits up to " << scale;
    ++seen;
  }
  EXPECT_EQ(seen, 7);
}

TEST(Models, LegacySwigluConfigReadsAsGatedSilu) {
  const char* data = std::getenv("QKV_TEST_DATA");
  ASSERT_NE(data, nullptr);
  const std::string path = std::string(data) + "/legacy_models/decoder_swiglu_rope_gqa/config.json";
  const ModelConfig c = ModelConfig::load(path);
  EXPECT_EQ(c.activation, Activation::SiLU);
  EXPECT_TRUE(c.gated);
  // written back in the new form, read back the same
  const std::string j = c.to_json();
  EXPECT_NE(j.find("\"activation\": \"silu\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"gated\": true"), std::string::npos) << j;
  const ModelConfig again = ModelConfig::from_json(j, "again");
  EXPECT_EQ(again.activation, Activation::SiLU);
  EXPECT_TRUE(again.gated);
  // "swiglu" with "gated": false contradicts itself
  std::string bad = read_file(path, "config.json");
  bad.insert(bad.find('{') + 1, "\"gated\": false,");
  const std::string e = testing::error_of([&] { ModelConfig::from_json(bad, "bad.json"); });
  for (const char* part : {"bad.json", "swiglu", "gated"}) EXPECT_NE(e.find(part), std::string::npos) << e;
  // GeGLU: any activation may be gated
  std::string geglu = j;
  geglu.replace(geglu.find("\"silu\""), 6, "\"gelu\"");
  const ModelConfig g = ModelConfig::from_json(geglu, "geglu.json");
  EXPECT_EQ(g.activation, Activation::GeluErf);
  EXPECT_TRUE(g.gated);
}

}  // namespace
}  // namespace qkv
