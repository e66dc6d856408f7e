// The chapter's claims as properties, determinism, empty inputs, weights from lse, and the
// errors bad input gets.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_testing.h"
#include "error_testing.h"

namespace qkv::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float& at4(Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d) {
  return t.data<float>()[((b * t.size(1) + h) * t.size(2) + i) * t.size(3) + d];
}

Tensor permute_rows(const Tensor& x, const std::vector<int64_t>& perm) {
  Tensor y = x.clone();
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t h = 0; h < x.size(1); ++h)
      for (int64_t i = 0; i < x.size(2); ++i)
        for (int64_t d = 0; d < x.size(3); ++d) at4(y, b, h, i, d) = x.data<float>()[((b * x.size(1) + h) * x.size(2) + perm[i]) * x.size(3) + d];
  return y;
}

void expect_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  std::vector<float> x = values(a), y = values(b);
  ASSERT_EQ(x.size(), y.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_FALSE(std::isnan(x[i]) || std::isnan(y[i])) << what << ": NaN at " << i;
    if (std::fabs(x[i] - y[i]) > worst) worst = std::fabs(x[i] - y[i]), at = i;
  }
  EXPECT_LE(worst, tol) << what << ": largest difference " << worst << " at element " << at;
}

std::vector<AttentionImpl> impls() { return {AttentionImpl::Flash, AttentionImpl::Reference}; }

TEST(Properties, PermutingRowsPermutesOutputs) {
  std::mt19937 rng(1);
  const int64_t T = 70;
  Tensor q = randn({1, 2, T, 16}, rng), k = randn({1, 2, T, 16}, rng), v = randn({1, 2, T, 24}, rng);
  std::vector<int64_t> perm(T);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (AttentionImpl impl : impls()) {
    AttentionSpec spec;
    spec.impl = impl;
    Tensor z = attention(q, k, v, spec).out;
    Tensor zp = attention(permute_rows(q, perm), permute_rows(k, perm), permute_rows(v, perm), spec).out;
    expect_close(zp, permute_rows(z, perm), 2e-6, "permuted output");
  }
}

TEST(Properties, AddingAConstantToARowChangesNothing) {
  std::mt19937 rng(2);
  const int64_t Tq = 33, Tk = 45;
  Tensor q = randn({1, 1, Tq, 8}, rng), k = randn({1, 1, Tk, 8}, rng), v = randn({1, 1, Tk, 8}, rng);
  Tensor shift({Tq, 1}, DType::F32);
  for (int64_t i = 0; i < Tq; ++i) shift.data<float>()[i] = static_cast<float>(i * 3.5 - 40);
  for (AttentionImpl impl : impls()) {
    AttentionSpec spec;
    spec.impl = impl;
    Tensor z = attention(q, k, v, spec).out;
    spec.mask = shift;  // (Tq, 1) broadcasts over keys: a constant per row
    Tensor zs = attention(q, k, v, spec).out;
    expect_close(zs, z, 2e-5, "row-shifted scores");
  }
}

TEST(Properties, BlockedKeysContentsDoNotMatter) {
  std::mt19937 rng(3);
  const int64_t B = 2, Tq = 50, Tk = 90, D = 16;
  Tensor q = randn({B, 1, Tq, D}, rng), k = randn({B, 1, Tk, D}, rng), v = randn({B, 1, Tk, D}, rng);
  // Key 10 blocked for every query by the bool mask; keys >= len blocked by padding lengths.
  Tensor allow({Tk}, DType::Bool);
  for (int64_t j = 0; j < Tk; ++j) allow.data<bool>()[j] = j != 10;
  Tensor lens = Tensor::from<int64_t>({B}, {60, 75});
  for (AttentionImpl impl : impls()) {
    AttentionSpec spec;
    spec.impl = impl;
    spec.bool_mask = allow;
    spec.key_lengths = lens;
    spec.causal = true;
    AttentionOutput clean = attention(q, k, v, spec);
    Tensor dout = randn({B, 1, Tq, D}, rng);
    AttentionGrads gclean = attention_backward(q, k, v, clean.out, clean.lse, dout, spec);
    for (float poison : {kNaN, 3e38f, -kInf}) {
      Tensor k2 = k.clone(), v2 = v.clone();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t d = 0; d < D; ++d) {
          at4(k2, b, 0, 10, d) = poison;  // blocked by the mask: its key is poisoned
          for (int64_t j = lens.data<int64_t>()[b]; j < Tk; ++j) at4(k2, b, 0, j, d) = at4(v2, b, 0, j, d) = poison;
        }
      AttentionOutput r = attention(q, k2, v2, spec);
      EXPECT_TRUE(bitwise_equal(r.out, clean.out)) << "poison " << poison;
      EXPECT_TRUE(bitwise_equal(r.lse, clean.lse)) << "poison " << poison;
      AttentionGrads g = attention_backward(q, k2, v2, r.out, r.lse, dout, spec);
      EXPECT_TRUE(bitwise_equal(g.dq, gclean.dq)) << "poison " << poison;
      std::vector<float> dkv = values(g.dk), dvv = values(g.dv);
      for (float x : dkv) ASSERT_FALSE(std::isnan(x));
      for (float x : dvv) ASSERT_FALSE(std::isnan(x));
    }
  }
}

TEST(Properties, BlockedValuesContentsDoNotMatter) {
  // Same for a V row: flash re-does blocks that include a non-finite V row the plain way, so
  // 0 * NaN from a blocked key reaches no output (the reference never reads it either).
  std::mt19937 rng(13);
  const int64_t Tq = 70, Tk = 90, D = 16;
  Tensor q = randn({1, 2, Tq, D}, rng), k = randn({1, 2, Tk, D}, rng), v = randn({1, 2, Tk, D}, rng);
  Tensor dout = randn({1, 2, Tq, D}, rng);
  Tensor allow({Tk}, DType::Bool);
  for (int64_t j = 0; j < Tk; ++j) allow.data<bool>()[j] = j != 10;
  for (AttentionImpl impl : impls()) {
    AttentionSpec spec;
    spec.impl = impl;
    spec.bool_mask = allow;
    AttentionOutput clean = attention(q, k, v, spec);
    AttentionGrads gclean = attention_backward(q, k, v, clean.out, clean.lse, dout, spec);
    for (float poison : {kNaN, kInf}) {
      Tensor k2 = k.clone(), v2 = v.clone();
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < D; ++d) at4(k2, 0, h, 10, d) = at4(v2, 0, h, 10, d) = poison;
      AttentionOutput r = attention(q, k2, v2, spec);
      expect_close(r.out, clean.out, 1e-6, "out with a poisoned blocked key");
      expect_close(r.lse, clean.lse, 1e-6, "lse with a poisoned blocked key");
      AttentionGrads g = attention_backward(q, k2, v2, r.out, r.lse, dout, spec);
      expect_close(g.dq, gclean.dq, 1e-5, "dq with a poisoned blocked key");
      expect_close(g.dv, gclean.dv, 1e-5, "dv with a poisoned blocked key");
    }
  }
}

TEST(Properties, NaNInAnAllowedInputPropagates) {
  // A NaN that takes part must show, never be mistaken for a fully masked row.
  std::mt19937 rng(14);
  Tensor q = randn({1, 1, 4, 8}, rng), k = randn({1, 1, 5, 8}, rng), v = randn({1, 1, 5, 8}, rng);
  for (AttentionImpl impl : impls()) {
    AttentionSpec spec;
    spec.impl = impl;
    Tensor q2 = q.clone();
    at4(q2, 0, 0, 0, 0) = kNaN;
    AttentionOutput a = attention(q2, k, v, spec);
    EXPECT_TRUE(std::isnan(a.out.data<float>()[0])) << "row 0 reads a NaN query";
    EXPECT_TRUE(std::isnan(a.lse.data<float>()[0]));
    EXPECT_TRUE(std::isfinite(a.out.data<float>()[8]) && std::isfinite(a.lse.data<float>()[1])) << "row 1 is clean";
    Tensor k2 = k.clone();
    at4(k2, 0, 0, 2, 0) = kNaN;
    AttentionOutput b = attention(q, k2, v, spec);
    for (float x : values(b.lse)) EXPECT_TRUE(std::isnan(x)) << "every row sees key 2";
    Tensor v2 = v.clone();
    at4(v2, 0, 0, 3, 5) = kNaN;
    AttentionOutput c = attention(q, k, v2, spec);
    for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(c.out.data<float>()[i * 8 + 5])) << "row " << i;
    AttentionGrads g = attention_backward(q, k, v2, c.out, c.lse, randn({1, 1, 4, 8}, rng), spec);
    EXPECT_TRUE(std::isnan(g.dq.data<float>()[0]));
  }
}

TEST(Properties, ChangingAValueChangesOutputNotWeights) {
  std::mt19937 rng(4);
  Tensor q = randn({1, 1, 5, 4}, rng), k = randn({1, 1, 7, 4}, rng), v = randn({1, 1, 7, 3}, rng);
  for (AttentionImpl impl : impls()) {
    AttentionSpec spec;
    spec.impl = impl;
    AttentionOutput a = attention(q, k, v, spec);
    Tensor v2 = v.clone();
    at4(v2, 0, 0, 2, 1) += 5.0f;
    AttentionOutput b = attention(q, k, v2, spec);
    EXPECT_FALSE(bitwise_equal(a.out, b.out));
    EXPECT_TRUE(bitwise_equal(attention_weights(q, k, a.lse, spec, 0, 5), attention_weights(q, k, b.lse, spec, 0, 5)));
  }
}

TEST(Properties, ScoresAreNotSymmetric) {
  // With W_Q != W_K, query A against key B differs from query B against key A.
  std::mt19937 rng(5);
  Tensor x = randn({2, 4}, rng), wq = randn({4, 4}, rng), wk = randn({4, 4}, rng);
  auto proj = [](const Tensor& a, const Tensor& w) {
    Tensor r({a.size(0), w.size(1)}, DType::F32);
    for (int64_t i = 0; i < a.size(0); ++i)
      for (int64_t j = 0; j < w.size(1); ++j)
        for (int64_t d = 0; d < a.size(1); ++d)
          r.data<float>()[i * w.size(1) + j] += a.data<float>()[i * a.size(1) + d] * w.data<float>()[d * w.size(1) + j];
    return r;
  };
  Tensor q = proj(x, wq), k = proj(x, wk), v = x.clone();
  AttentionSpec spec;
  AttentionOutput r = attention(q, k, v, spec);
  std::vector<float> w = values(attention_weights(q, k, r.lse, spec, 0, 2));
  // log-weights differ from scores by a per-row constant: compare score differences instead.
  const float s01 = std::log(w[1]) + r.lse.data<float>()[0], s10 = std::log(w[2]) + r.lse.data<float>()[1];
  EXPECT_GT(std::fabs(s01 - s10), 1e-3);
}

TEST(Properties, WeightsFromLseSumToOne) {
  std::mt19937 rng(6);
  const int64_t Tq = 130, Tk = 200;
  Tensor q = randn({2, 3, Tq, 32}, rng), k = randn({2, 3, Tk, 32}, rng), v = randn({2, 3, Tk, 32}, rng);
  AttentionSpec spec;
  spec.causal = true;
  spec.window = 40;
  AttentionOutput r = attention(q, k, v, spec);
  Tensor w = attention_weights(q, k, r.lse, spec, 100, 130);
  ASSERT_EQ(w.shape(), (std::vector<int64_t>{2, 3, 30, Tk}));
  // matches the reference's weights, and rows sum to one
  AttentionSpec rs = spec;
  rs.impl = AttentionImpl::Reference;
  AttentionOutput rr = attention(q, k, v, rs);
  expect_close(w, attention_weights(q, k, rr.lse, rs, 100, 130), 1e-5, "weights");
  std::vector<float> wv = values(w);
  for (int64_t row = 0; row < 2 * 3 * 30; ++row) {
    double sum = 0;
    for (int64_t j = 0; j < Tk; ++j) sum += wv[row * Tk + j];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

// A window reaching past every key is no window, up to INT64_MAX: p + window used to overflow
// and zero most rows.
TEST(Properties, WindowWiderThanTheKeysIsNoWindow) {
  std::mt19937 rng(61);
  const int64_t Tq = 70, Tk = 100;
  Tensor q = randn({1, 2, Tq, 16}, rng), k = randn({1, 2, Tk, 16}, rng), v = randn({1, 2, Tk, 16}, rng);
  Tensor dout = randn({1, 2, Tq, 16}, rng);
  const int64_t huge = std::numeric_limits<int64_t>::max();
  for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Reference})
    for (bool causal : {false, true})
      for (Align align : {Align::BottomRight, Align::TopLeft}) {
        AttentionSpec plain;
        plain.impl = impl;
        plain.causal = causal;
        plain.align = align;
        const AttentionOutput want = attention(q, k, v, plain);
        const AttentionGrads want_g = attention_backward(q, k, v, want.out, want.lse, dout, plain);
        for (int64_t w : {Tk + Tq, huge / 2, huge - 1, huge}) {
          SCOPED_TRACE("window " + std::to_string(w) + (causal ? " causal" : "") +
                       (align == Align::TopLeft ? " top-left" : "") +
                       (impl == AttentionImpl::Flash ? " flash" : " reference"));
          AttentionSpec spec = plain;
          spec.window = w;
          const AttentionOutput got = attention(q, k, v, spec);
          EXPECT_TRUE(bitwise_equal(got.out, want.out));
          EXPECT_TRUE(bitwise_equal(got.lse, want.lse));
          const AttentionGrads g = attention_backward(q, k, v, got.out, got.lse, dout, spec);
          EXPECT_TRUE(bitwise_equal(g.dq, want_g.dq));
          EXPECT_TRUE(bitwise_equal(g.dk, want_g.dk));
          EXPECT_TRUE(bitwise_equal(g.dv, want_g.dv));
        }
      }
  // Keys at every position 0..Tk-1 and queries among them (Tq <= Tk, bottom-right): a window of
  // Tk keys already reaches them all.
  AttentionSpec plain, wide;
  wide.window = Tk;
  EXPECT_TRUE(bitwise_equal(attention(q, k, v, wide).out, attention(q, k, v, plain).out));
}

TEST(Determinism, SameInputsSameBitsForAnyThreadCount) {
  std::mt19937 rng(7);
  Tensor q = randn({2, 4, 300, 64}, rng), k = randn({2, 2, 333, 64}, rng), v = randn({2, 2, 333, 48}, rng);
  Tensor dout = randn({2, 4, 300, 48}, rng);
  AttentionSpec spec;
  spec.causal = true;
  spec.threads = 2;
  AttentionOutput a = attention(q, k, v, spec), b = attention(q, k, v, spec);
  EXPECT_TRUE(bitwise_equal(a.out, b.out));
  AttentionGrads ga = attention_backward(q, k, v, a.out, a.lse, dout, spec);
  AttentionGrads gb = attention_backward(q, k, v, b.out, b.lse, dout, spec);
  EXPECT_TRUE(bitwise_equal(ga.dq, gb.dq) && bitwise_equal(ga.dk, gb.dk) && bitwise_equal(ga.dv, gb.dv));
  // Across thread counts the tolerance is zero: every element is computed by one task in a
  // fixed order, whatever the number of threads.
  for (int threads : {1, 3}) {
    AttentionSpec s1 = spec;
    s1.threads = threads;
    AttentionOutput c = attention(q, k, v, s1);
    EXPECT_TRUE(bitwise_equal(a.out, c.out) && bitwise_equal(a.lse, c.lse)) << threads << " threads";
    AttentionGrads gc = attention_backward(q, k, v, c.out, c.lse, dout, s1);
    EXPECT_TRUE(bitwise_equal(ga.dq, gc.dq) && bitwise_equal(ga.dk, gc.dk) && bitwise_equal(ga.dv, gc.dv))
        << threads << " threads";
  }
}

TEST(Shapes, EmptyInputs) {
  std::mt19937 rng(8);
  for (AttentionImpl impl : impls()) {
    AttentionSpec spec;
    spec.impl = impl;
    // Tq = 0: empty output
    AttentionOutput a = attention(randn({1, 2, 0, 8}, rng), randn({1, 2, 5, 8}, rng), randn({1, 2, 5, 4}, rng), spec);
    EXPECT_EQ(a.out.shape(), (std::vector<int64_t>{1, 2, 0, 4}));
    // Tk = 0: zeros, lse -inf, zero gradients
    Tensor q = randn({1, 2, 3, 8}, rng), k = randn({1, 2, 0, 8}, rng), v = randn({1, 2, 0, 4}, rng);
    AttentionOutput b = attention(q, k, v, spec);
    ASSERT_EQ(b.out.shape(), (std::vector<int64_t>{1, 2, 3, 4}));
    for (float x : values(b.out)) EXPECT_EQ(x, 0.0f);
    for (float x : values(b.lse)) EXPECT_EQ(x, -kInf);
    AttentionGrads g = attention_backward(q, k, v, b.out, b.lse, randn({1, 2, 3, 4}, rng), spec);
    for (float x : values(g.dq)) EXPECT_EQ(x, 0.0f);
    EXPECT_EQ(g.dk.numel(), 0);
  }
}

TEST(Shapes, RanksTwoAndThree) {
  std::mt19937 rng(9);
  Tensor q = randn({3, 5, 8}, rng), k = randn({3, 7, 8}, rng), v = randn({3, 7, 6}, rng);
  AttentionOutput r = attention(q, k, v);
  EXPECT_EQ(r.out.shape(), (std::vector<int64_t>{3, 5, 6}));
  EXPECT_EQ(r.lse.shape(), (std::vector<int64_t>{3, 5}));
  Tensor r4 = attention(q.view({1, 3, 5, 8}), k.view({1, 3, 7, 8}), v.view({1, 3, 7, 6})).out;
  EXPECT_TRUE(bitwise_equal(r.out.view({1, 3, 5, 6}), r4));
  AttentionOutput r2 = attention(q.slice(0, 0, 1).view({5, 8}), k.slice(0, 0, 1).view({7, 8}), v.slice(0, 0, 1).view({7, 6}));
  EXPECT_EQ(r2.out.shape(), (std::vector<int64_t>{5, 6}));
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  const std::string msg = error_of(f);
  EXPECT_NE(msg.find(needle), std::string::npos) << "expected an error containing '" << needle << "', got: " << msg;
}

TEST(Errors, ShapesAndMasksAreChecked) {
  std::mt19937 rng(10);
  Tensor q = randn({1, 4, 5, 8}, rng), k = randn({1, 4, 7, 8}, rng), v = randn({1, 4, 7, 6}, rng);
  expect_error([&] { attention(q, randn({1, 4, 7, 9}, rng), v); }, "same last dimension Dk");
  expect_error([&] { attention(q, k, randn({1, 4, 6, 6}, rng)); }, "k and v must agree");
  expect_error([&] { attention(q, randn({1, 3, 7, 8}, rng), randn({1, 3, 7, 6}, rng)); }, "must divide");
  expect_error([&] { attention(q, randn({2, 4, 7, 8}, rng), randn({2, 4, 7, 6}, rng)); }, "batch sizes differ");
  expect_error([&] { attention(randn({8}, rng), k, v); }, "expected (B, H, T, D)");
  expect_error([&] { attention(q.to(DType::F64), k, v); }, "expected float32");
  AttentionSpec spec;
  spec.mask = randn({3, 7}, rng);
  expect_error([&] { attention(q, k, v, spec); }, "does not broadcast");
  spec.mask = Tensor::from<float>({1}, {kNaN});
  expect_error([&] { attention(q, k, v, spec); }, "mask: entry 0");
  spec = {};
  spec.key_lengths = Tensor::from<int32_t>({1}, {8});
  expect_error([&] { attention(q, k, v, spec); }, "key_lengths[0] = 8");
  spec = {};
  spec.alibi_slopes = {1.0f, 2.0f};
  expect_error([&] { attention(q, k, v, spec); }, "expected 4 values");
  spec = {};
  spec.window = -1;
  expect_error([&] { attention(q, k, v, spec); }, "window");
  AttentionOutput r = attention(q, k, v);
  expect_error([&] { attention_backward(q, k, v, r.out, r.lse, randn({1, 4, 5, 7}, rng)); }, "dout: expected");
  expect_error([&] { attention_weights(q, k, r.lse, {}, 3, 9); }, "outside");
}

TEST(Alibi, StandardSlopes) {
  std::vector<float> s8 = alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(s8[i], std::pow(2.0f, -(i + 1.0f)));
  std::vector<float> s6 = alibi_slopes(6);  // 4 from 2^(-2(i+1)), then 2 from the 8-head list at odd positions
  ASSERT_EQ(s6.size(), 6u);
  EXPECT_FLOAT_EQ(s6[0], 0.25f);
  EXPECT_FLOAT_EQ(s6[4], std::pow(2.0f, -1.0f));
  EXPECT_FLOAT_EQ(s6[5], std::pow(2.0f, -3.0f));
}

}  // namespace
}  // namespace qkv::testing
