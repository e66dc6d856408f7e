// The GEMM wrapper (oneDNN for matrices, qkv's row products or OpenBLAS for single rows): results, and the check for OpenBLAS's generic-kernel fallback.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <optional>
#include <vector>

#include "kernels/column_sums.h"
#include "kernels/gemm_internal.h"
#include "kernels/quant.h"
#include "qkv/qkv.h"

namespace qkv {
namespace {

TEST(Gemm, MatchesNaiveProductWithTransposes) {
  // M = 1 takes the matrix-vector path (decoding steps); lda > 1 with a transposed A then
  // strides through a column.
  for (const int64_t M : {int64_t{37}, int64_t{1}}) {
  SCOPED_TRACE(M);
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  const int64_t N = 29, K = 41;
  std::vector<float> A(M * K), B(K * N), C(M * N, 1.0f);
  for (float& x : A) x = n(rng);
  for (float& x : B) x = n(rng);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      // A stored (M, K) or, transposed, (K, M); likewise B.
      sgemm(ta, tb, M, N, K, 2.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.5f, C.data(), N);
      std::vector<float> want(M * N, 1.0f);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k)
            acc += static_cast<double>(ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
          want[i * N + j] = static_cast<float>(2.0 * acc + 0.5 * want[i * N + j]);
        }
      for (int64_t i = 0; i < M * N; ++i) ASSERT_NEAR(C[i], want[i], 1e-4) << ta << tb << " at " << i;
      std::fill(C.begin(), C.end(), 1.0f);
    }
  }
}

// bfloat16 products (prompts against bf16 weights): against the float64 product of the same
// bfloat16 values, within twice the error of a plain float32 loop over them; strides respected,
// NaN and infinity carried, the same bits for the same thread count. On a CPU without bf16 dot
// products the call refuses, and that is checked instead.
TEST(Gemm, Bf16ProductsAgainstTheirFloat64Twin) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n;
  const int64_t M = 45, N = 70, K = 300, lda = K + 3, ldb = K + 5, ldc = N + 2;
  std::vector<uint16_t> A(M * lda), B(N * ldb);
  for (auto& x : A) x = kernels::f32_to_bf16(n(rng));
  for (auto& x : B) x = kernels::f32_to_bf16(n(rng) * (rng() % 9 == 0 ? 30.0f : 1.0f));
  std::vector<float> C(M * ldc, -7.0f);
  if (!bf16_gemm_native()) {
    EXPECT_THROW(gemm_bf16_nt(M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc), Error);
    GTEST_SKIP() << "this CPU has no bf16 dot-product instructions (AVX512_BF16 or AMX)";
  }
  gemm_bf16_nt(M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc);
  double worst = 0, plain_worst = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      float plain = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p =
            static_cast<double>(kernels::bf16_to_f32(A[i * lda + k])) * kernels::bf16_to_f32(B[j * ldb + k]);
        ref += p, mag += std::fabs(p);
        plain += kernels::bf16_to_f32(A[i * lda + k]) * kernels::bf16_to_f32(B[j * ldb + k]);
      }
      worst = std::max(worst, std::fabs(C[i * ldc + j] - ref) / mag);
      plain_worst = std::max(plain_worst, std::fabs(plain - ref) / mag);
    }
  EXPECT_LE(worst, 2 * plain_worst + 1e-7) << "the plain float32 loop's error: " << plain_worst;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j) EXPECT_EQ(C[i * ldc + j], -7.0f) << "past N in row " << i;
  // the same bits again
  std::vector<float> C2(M * ldc, -7.0f);
  gemm_bf16_nt(M, N, K, A.data(), lda, B.data(), ldb, C2.data(), ldc);
  EXPECT_EQ(C, C2);
  // NaN and infinity in an input reach exactly their row and column
  A[3 * lda + 10] = kernels::f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  B[5 * ldb + 20] = kernels::f32_to_bf16(std::numeric_limits<float>::infinity());
  gemm_bf16_nt(M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc);
  for (int64_t j = 0; j < N; ++j) EXPECT_TRUE(std::isnan(C[3 * ldc + j])) << j;
  for (int64_t i = 0; i < M; ++i)
    if (i != 3) {
      EXPECT_TRUE(std::isinf(C[i * ldc + 5]) || std::isnan(C[i * ldc + 5])) << i;
    }
  EXPECT_TRUE(std::isfinite(C[4 * ldc + 6]));
}

// sgemm under Bf16Matmul (training's --precision bf16): against the float64 product of the inputs
// rounded to bfloat16, within twice the error of a plain float32 loop over the rounded values, for
// every transpose, alpha and beta, strided operands, one row and many; on oneDNN's bf16 matmul
// where the CPU has it and on the float32 fallback every CPU runs. The rounding must happen (the
// result stays far from the unrounded product's), beta = 0 ignores what C held, the columns past
// N stay untouched, and the same call gives the same bits.
TEST(Gemm, Bf16MatmulAgainstItsFloat64TwinOnEveryPath) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n;
  std::vector<bool> paths = {false};
  if (bf16_gemm_native()) paths.push_back(true);
  for (const bool native : paths)
    for (const int64_t M : {int64_t{53}, int64_t{1}})
      for (const bool ta : {false, true})
        for (const bool tb : {false, true})
          for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{2.0f, 0.5f}, std::pair{1.0f, 1.0f}}) {
            SCOPED_TRACE(::testing::Message() << "native " << native << " M " << M << " ta " << ta << " tb " << tb
                                              << " alpha " << alpha << " beta " << beta);
            const int64_t N = 67, K = 259;
            const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
            std::vector<float> A((ta ? K : M) * lda), B((tb ? N : K) * ldb), C(M * ldc);
            for (float& x : A) x = n(rng);
            for (float& x : B) x = n(rng) * (rng() % 9 == 0 ? 30.0f : 1.0f);
            const float c0 = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : 0.25f;
            std::fill(C.begin(), C.end(), c0);
            auto a = [&](int64_t i, int64_t k) { return ta ? A[k * lda + i] : A[i * lda + k]; };
            auto b = [&](int64_t k, int64_t j) { return tb ? B[j * ldb + k] : B[k * ldb + j]; };
            auto r = [](float x) { return kernels::bf16_to_f32(kernels::f32_to_bf16(x)); };
            sgemm_bf16(native, ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
            double worst = 0, plain_worst = 0, unrounded_worst = 0;
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) {
                double ref = 0, mag = 0, exact = 0;
                float plain = 0;
                for (int64_t k = 0; k < K; ++k) {
                  const double p = static_cast<double>(r(a(i, k))) * r(b(k, j));
                  ref += p, mag += std::fabs(p);
                  plain += r(a(i, k)) * r(b(k, j));
                  exact += static_cast<double>(a(i, k)) * b(k, j);
                }
                const double c_in = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c0;
                const double want = alpha * ref + c_in, got = C[i * ldc + j];
                ASSERT_TRUE(std::isfinite(got)) << "at " << i << "," << j;
                worst = std::max(worst, std::fabs(got - want) / (alpha * mag + std::fabs(c_in)));
                plain_worst = std::max(plain_worst, std::fabs(alpha * static_cast<double>(plain) - alpha * ref) /
                                                        (alpha * mag + std::fabs(c_in)));
                unrounded_worst = std::max(unrounded_worst, std::fabs(got - (alpha * exact + c_in)) / (alpha * mag));
              }
            EXPECT_LE(worst, 2 * plain_worst + 1e-7) << "the plain float32 loop's error: " << plain_worst;
            EXPECT_GT(unrounded_worst, 1e-4) << "the inputs were not rounded to bfloat16";
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = N; j < ldc; ++j) {
                if (beta == 0.0f) {
                  ASSERT_TRUE(std::isnan(C[i * ldc + j])) << "wrote past N in row " << i;
                } else {
                  ASSERT_EQ(C[i * ldc + j], c0) << "wrote past N in row " << i;
                }
              }
            std::vector<float> C2(C.size(), c0);
            sgemm_bf16(native, ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C2.data(), ldc);
            for (size_t i = 0; i < C.size(); ++i) {
              if (!std::isnan(C[i])) {
                ASSERT_EQ(C[i], C2[i]) << "not the same bits at " << i;
              }
            }
          }
}

// NaN and infinity in an operand survive the rounding and reach exactly their row / column.
TEST(Gemm, Bf16MatmulCarriesNaNAndInfinity) {
  std::vector<bool> paths = {false};
  if (bf16_gemm_native()) paths.push_back(true);
  const int64_t M = 20, N = 17, K = 40;
  for (const bool native : paths) {
    std::vector<float> A(M * K, 0.5f), B(N * K, 0.25f), C(M * N);
    A[3 * K + 7] = std::numeric_limits<float>::quiet_NaN();
    B[5 * K + 9] = std::numeric_limits<float>::infinity();
    sgemm_bf16(native, false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const float c = C[i * N + j];
        if (i == 3) {
          EXPECT_TRUE(std::isnan(c)) << native << " " << i << "," << j;
        } else if (j == 5) {
          EXPECT_TRUE(std::isinf(c) && c > 0) << native << " " << i << "," << j << ": " << c;
        } else {
          EXPECT_EQ(c, 0.5f * 0.25f * K) << native << " " << i << "," << j;
        }
      }
  }
}

// The scope: sgemm inside a Bf16Matmul is sgemm_bf16 on this CPU's path; outside it, float32 again;
// BatchInvariantGemm takes precedence where both live.
// Bf16Unchanged(A): products taking A as their first operand, as a linear layer's backward pass
// takes dY (dX = dY W, then dW = dY^T X), round it once; the results are those of rounding it for
// each product, and once the promise ends a changed A is rounded again (no stale copy).
TEST(Gemm, Bf16UnchangedOperandIsRoundedOnceAndNeverStale) {
  std::mt19937 rng(13);
  std::normal_distribution<float> n;
  const int64_t Rows = 37, Out = 45, In = 29;  // dY (Rows, Out), W (Out, In), X (Rows, In)
  std::vector<float> dY(Rows * Out), W(Out * In), X(Rows * In);
  for (auto* v : {&dY, &W, &X})
    for (float& x : *v) x = n(rng);
  auto products = [&](bool promise, std::vector<float>& dX, std::vector<float>& dW) {
    dX.assign(Rows * In, 0.0f);
    dW.assign(Out * In, 0.0f);
    Bf16Matmul scope;
    std::optional<Bf16Unchanged> kept;
    if (promise) kept.emplace(dY.data());
    sgemm(false, false, Rows, In, Out, 1.0f, dY.data(), Out, W.data(), In, 0.0f, dX.data(), In);
    sgemm(true, false, Out, In, Rows, 1.0f, dY.data(), Out, X.data(), In, 0.0f, dW.data(), In);
  };
  std::vector<float> dX0, dW0, dX1, dW1;
  products(false, dX0, dW0);
  products(true, dX1, dW1);
  EXPECT_EQ(dX1, dX0);
  EXPECT_EQ(dW1, dW0);
  // the same pointer, new values: rounded again, under a new promise or none
  for (float& x : dY) x = n(rng);
  std::vector<float> dX2, dW2, dX3, dW3;
  products(true, dX2, dW2);
  products(false, dX3, dW3);
  EXPECT_NE(dX2, dX0);
  EXPECT_EQ(dX2, dX3);
  EXPECT_EQ(dW2, dW3);
}

// kernels::column_sums: each column's sum is the double sum of its rows in row order, rounded
// once to float, whatever the number of threads and the split into bands (widths below, at and
// above a band and several bands per thread); the rounded copy holds f32_to_bf16 of each value
// (NaN, infinities and denormals included) and nothing past the C columns of a row is written.
TEST(ColumnSums, RowOrderDoubleSumsAndBf16RoundingForAnyThreads) {
  std::mt19937 rng(21);
  std::normal_distribution<float> n;
  for (const int64_t C : {1, 15, 16, 17, 150, 2049, 5000})
    for (const int64_t N : {0, 1, 37}) {
      const int64_t ld = C + 3, out_ld = C + 5;
      std::vector<float> x(static_cast<size_t>(std::max<int64_t>(N, 1) * ld));
      for (float& v : x) v = n(rng) * 1e3f;
      if (N > 0) {
        x[0] = std::numeric_limits<float>::infinity();
        x[static_cast<size_t>(C / 2)] = 1e-40f;  // denormal
        if (C > 2) x[static_cast<size_t>((N - 1) * ld + 2)] = std::numeric_limits<float>::quiet_NaN();
      }
      std::vector<float> want(static_cast<size_t>(C));
      for (int64_t j = 0; j < C; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < N; ++i) acc += x[static_cast<size_t>(i * ld + j)];
        want[static_cast<size_t>(j)] = static_cast<float>(acc);
      }
      for (const int threads : {1, 2, 3})
        for (const bool add : {false, true}) {
          SCOPED_TRACE(testing::Message() << "C " << C << " N " << N << " threads " << threads << " add " << add);
          std::vector<float> sums(static_cast<size_t>(C), 0.25f);
          std::vector<uint16_t> out(static_cast<size_t>(std::max<int64_t>(N, 1) * out_ld), 0xabcd);
          kernels::column_sums(x.data(), N, C, ld, sums.data(), add, out.data(), out_ld, threads);
          std::vector<float> plain(static_cast<size_t>(C), 0.25f);
          kernels::column_sums(x.data(), N, C, ld, plain.data(), add, nullptr, 0, threads);
          for (int64_t j = 0; j < C; ++j) {
            const float w = add ? 0.25f + want[static_cast<size_t>(j)] : want[static_cast<size_t>(j)];
            const float got = sums[static_cast<size_t>(j)];
            ASSERT_TRUE(std::isnan(w) ? std::isnan(got) : got == w) << "column " << j << ": " << got << " vs " << w;
            ASSERT_TRUE(std::memcmp(&got, &plain[static_cast<size_t>(j)], sizeof got) == 0) << "column " << j;
          }
          for (int64_t i = 0; i < N; ++i)
            for (int64_t j = 0; j < out_ld; ++j) {
              const uint16_t o = out[static_cast<size_t>(i * out_ld + j)];
              ASSERT_EQ(o, j < C ? kernels::f32_to_bf16(x[static_cast<size_t>(i * ld + j)]) : uint16_t{0xabcd})
                  << "row " << i << " column " << j;
            }
        }
    }
}

// A linear layer's bias gradient under Bf16Matmul: the column sums taken while dY is rounded are
// the bits of a separate double row-order sum, added to what col_sum held, and the products that
// follow use that rounding (the same bits as rounding in the product); nothing happens outside a
// Bf16Matmul or for another matrix than the promised one.
TEST(Gemm, Bf16RoundingWithColumnSumsKeepsTheirBits) {
  std::mt19937 rng(14);
  std::normal_distribution<float> n;
  const int64_t Rows = 300, Out = 150, In = 29, ld = 157;  // dY (Rows, Out) with row stride ld: 3 column blocks
  std::vector<float> dY(Rows * ld), W(Out * In), X(Rows * In);
  for (auto* v : {&dY, &W, &X})
    for (float& x : *v) x = n(rng);
  std::vector<float> want(Out);
  for (int64_t j = 0; j < Out; ++j) {
    double acc = 0;
    for (int64_t i = 0; i < Rows; ++i) acc += dY[i * ld + j];
    want[j] = 0.5f + static_cast<float>(acc);
  }
  auto products = [&](bool fused, std::vector<float>& dX, std::vector<float>& dW, std::vector<float>& sums) {
    dX.assign(Rows * In, 0.0f);
    dW.assign(Out * In, 0.0f);
    sums.assign(Out, 0.5f);
    Bf16Matmul scope;
    Bf16Unchanged kept(dY.data());
    std::vector<float> saved;
    if (fused) {
      EXPECT_TRUE(kept.round_with_column_sums(Rows, Out, ld, sums.data()));
      // the products use that copy: dY's values are not read again (breaking the promise here,
      // for the test only, shows it)
      saved = dY;
      std::fill(dY.begin(), dY.end(), 0.0f);
    }
    sgemm(false, false, Rows, In, Out, 1.0f, dY.data(), ld, W.data(), In, 0.0f, dX.data(), In);
    sgemm(true, false, Out, In, Rows, 1.0f, dY.data(), ld, X.data(), In, 0.0f, dW.data(), In);
    if (fused) dY = saved;
  };
  std::vector<float> dX0, dW0, s0, dX1, dW1, s1;
  products(false, dX0, dW0, s0);
  products(true, dX1, dW1, s1);
  EXPECT_EQ(s1, want);
  EXPECT_EQ(dX1, dX0);
  EXPECT_EQ(dW1, dW0);
  std::vector<float> untouched(Out, 0.5f);
  {
    Bf16Unchanged kept(dY.data());  // no Bf16Matmul
    EXPECT_FALSE(kept.round_with_column_sums(Rows, Out, ld, untouched.data()));
    Bf16Matmul scope;
    Bf16Unchanged other(W.data());  // the innermost promise is W's, not dY's
    EXPECT_FALSE(kept.round_with_column_sums(Rows, Out, ld, untouched.data()));
  }
  EXPECT_EQ(untouched, std::vector<float>(Out, 0.5f));
}

// A training step's weights under Bf16Weights: the products whose B lies in a covered array give
// the bits of rounding it per product (whether the copy is plain or, on bf16 hardware, in the
// matmul's blocked layout), and a later product reading the weight the same way uses the first
// one's copy (writing the weight in between, which the promise forbids and the test does on
// purpose, does not reach it); a slice of the array gets its own copy; a matrix outside the
// arrays is rounded per product; after the scope, products round afresh.
TEST(Gemm, Bf16WeightsAreRoundedOncePerScope) {
  std::mt19937 rng(15);
  std::normal_distribution<float> n;
  const int64_t Rows = 33, Out = 70, In = 45;
  std::vector<float> X(Rows * In), W(Out * In), dY(Rows * Out), other(Out * In);
  for (auto* v : {&X, &W, &dY, &other})
    for (float& x : *v) x = n(rng);
  auto forward = [&](const float* w, int64_t out, std::vector<float>& y) {  // y = x w^T
    y.assign(Rows * out, 0.0f);
    sgemm(false, true, Rows, out, In, 1.0f, X.data(), In, w, In, 0.0f, y.data(), out);
  };
  auto input_grad = [&](const float* w, int64_t out, std::vector<float>& dx) {  // dx = dy w
    dx.assign(Rows * In, 0.0f);
    sgemm(false, false, Rows, In, out, 1.0f, dY.data(), Out, w, In, 0.0f, dx.data(), In);
  };
  std::vector<float> y0, dx0, ys0, dxs0, yo0;
  {
    Bf16Matmul scope;
    forward(W.data(), Out, y0);
    input_grad(W.data(), Out, dx0);
    forward(W.data() + 10 * In, Out - 10, ys0);  // rows 10.. of W
    input_grad(W.data() + 10 * In, Out - 10, dxs0);
    forward(other.data(), Out, yo0);
  }
  const std::vector<float> W_saved = W, other_saved = other;
  std::vector<float> y1, dx1, ys1, dxs1, yo1, yo2, y3;
  {
    Bf16Matmul scope;
    Bf16Weights weights({{W.data(), static_cast<int64_t>(W.size())}});
    forward(W.data(), Out, y1);
    forward(W.data() + 10 * In, Out - 10, ys1);
    forward(other.data(), Out, yo1);
    input_grad(W.data(), Out, dx1);
    input_grad(W.data() + 10 * In, Out - 10, dxs1);
    for (float& x : W) x = n(rng);  // not seen by the kept copies
    for (float& x : other) x = n(rng);  // seen: not covered
    std::vector<float> y2, dx2, dxs2;
    forward(W.data(), Out, y2);
    input_grad(W.data(), Out, dx2);
    input_grad(W.data() + 10 * In, Out - 10, dxs2);
    EXPECT_EQ(y2, y0);
    EXPECT_EQ(dx2, dx0);
    EXPECT_EQ(dxs2, dxs0);
    forward(other.data(), Out, yo2);
  }
  EXPECT_EQ(y1, y0);
  EXPECT_EQ(dx1, dx0);
  EXPECT_EQ(ys1, ys0);
  EXPECT_EQ(dxs1, dxs0);
  EXPECT_EQ(yo1, yo0);
  EXPECT_NE(yo2, yo0);
  {
    Bf16Matmul scope;
    forward(W.data(), Out, y3);  // the scope is gone: W's new values
  }
  EXPECT_NE(y3, y0);
  W = W_saved;
  other = other_saved;
}

// Bf16WeightBuffers: the next scope writes its copies into the buffers the last one left (no
// fresh pages each training step); what is carried is memory, never values: a weight changed
// between two scopes is rounded afresh, and a scope that uses fewer copies leaves fewer behind.
TEST(Gemm, Bf16WeightBuffersCarryMemoryNotValues) {
  std::mt19937 rng(16);
  std::normal_distribution<float> n;
  const int64_t Rows = 33, Out = 70, In = 45;
  std::vector<float> X(Rows * In), W(Out * In);
  for (auto* v : {&X, &W})
    for (float& x : *v) x = n(rng);
  auto forward = [&](const float* w, int64_t out) {  // x w^T
    std::vector<float> y(Rows * out, 0.0f);
    sgemm(false, true, Rows, out, In, 1.0f, X.data(), In, w, In, 0.0f, y.data(), out);
    return y;
  };
  auto plain = [&](const float* w, int64_t out) {  // the same product with no weights' scope
    Bf16Matmul scope;
    return forward(w, out);
  };
  Bf16WeightBuffers buffers;
  EXPECT_EQ(buffers.bytes(), 0u);
  const std::vector<float> want1 = plain(W.data(), Out), want1s = plain(W.data() + 10 * In, Out - 10);
  {
    Bf16Matmul scope;
    Bf16Weights weights({{W.data(), static_cast<int64_t>(W.size())}}, &buffers);
    EXPECT_EQ(forward(W.data(), Out), want1);
    EXPECT_EQ(forward(W.data() + 10 * In, Out - 10), want1s);
  }
  const size_t two = buffers.bytes();
  EXPECT_GE(two, static_cast<size_t>((Out + Out - 10) * In * 2));  // both copies kept
  for (float& x : W) x = n(rng);  // the next step's weights
  const std::vector<float> want2 = plain(W.data(), Out), want2s = plain(W.data() + 10 * In, Out - 10);
  ASSERT_NE(want2, want1);
  {
    Bf16Matmul scope;
    Bf16Weights weights({{W.data(), static_cast<int64_t>(W.size())}}, &buffers);
    EXPECT_EQ(buffers.bytes(), two);  // taken out only when used
    EXPECT_EQ(forward(W.data(), Out), want2);  // the new values, in the old buffer
    EXPECT_LT(buffers.bytes(), two);
    EXPECT_EQ(forward(W.data() + 10 * In, Out - 10), want2s);
    EXPECT_EQ(buffers.bytes(), 0u);
  }
  EXPECT_EQ(buffers.bytes(), two);  // the same two buffers back, nothing more
  {
    Bf16Matmul scope;
    Bf16Weights weights({{W.data(), static_cast<int64_t>(W.size())}}, &buffers);
    EXPECT_EQ(forward(W.data() + 10 * In, Out - 10), want2s);
  }
  EXPECT_GT(buffers.bytes(), 0u);
  EXPECT_LT(buffers.bytes(), two);  // the unused one was freed
  {  // and a scope without buffers leaves them alone
    Bf16Matmul scope;
    Bf16Weights weights({{W.data(), static_cast<int64_t>(W.size())}});
    EXPECT_EQ(forward(W.data(), Out), want2);
  }
  EXPECT_LT(buffers.bytes(), two);
  EXPECT_GT(buffers.bytes(), 0u);
}

TEST(Gemm, Bf16MatmulScopeRoutesSgemm) {
  std::mt19937 rng(12);
  std::normal_distribution<float> n;
  const int64_t M = 40, N = 33, K = 70;
  std::vector<float> A(M * K), B(N * K);
  for (float& x : A) x = n(rng);
  for (float& x : B) x = n(rng);
  std::vector<float> f32(M * N), in_scope(M * N), twin(M * N), invariant(M * N), both(M * N);
  sgemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, f32.data(), N);
  sgemm_bf16(bf16_gemm_native(), false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, twin.data(), N);
  EXPECT_FALSE(Bf16Matmul::active());
  {
    Bf16Matmul scope;
    EXPECT_TRUE(Bf16Matmul::active());
    sgemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, in_scope.data(), N);
    BatchInvariantGemm inv;
    sgemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, both.data(), N);
  }
  EXPECT_FALSE(Bf16Matmul::active());
  {
    BatchInvariantGemm inv;
    sgemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, invariant.data(), N);
  }
  EXPECT_EQ(in_scope, twin);
  EXPECT_NE(in_scope, f32);
  EXPECT_EQ(both, invariant);
  std::vector<float> again(M * N);
  sgemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, again.data(), N);
  EXPECT_EQ(again, f32);
}

TEST(Gemm, BetaZeroIgnoresWhatCHeldAndLdcIsRespected) {
  // Outputs are allocated uninitialised and written with beta = 0: whatever C held (NaN here)
  // must not reach the result, as in the BLAS. C is a window of a wider array (ldc > N): the
  // columns outside it stay untouched. Both paths: a matrix (oneDNN) and one row (OpenBLAS).
  for (const int64_t M : {int64_t{37}, int64_t{1}}) {
    SCOPED_TRACE(M);
    const int64_t N = 29, K = 41, ldc = N + 3;
    std::vector<float> A(M * K), B(K * N);
    for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(i % 7) - 3.0f;
    for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(i % 5) - 2.0f;
    std::vector<float> C(M * ldc, std::numeric_limits<float>::quiet_NaN());
    sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), ldc);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < ldc; ++j) {
        if (j >= N) {
          EXPECT_TRUE(std::isnan(C[i * ldc + j])) << "wrote outside C at " << i << "," << j;
          continue;
        }
        double want = 0;  // small integers: exact in float
        for (int64_t k = 0; k < K; ++k) want += static_cast<double>(A[i * K + k]) * B[k * N + j];
        ASSERT_EQ(C[i * ldc + j], static_cast<float>(want)) << i << "," << j;
      }
  }
}

TEST(Gemm, FallbackDetection) {
  EXPECT_EQ(blas_fallback_advice("Prescott", true, true), "OPENBLAS_CORETYPE=SkylakeX");
  EXPECT_EQ(blas_fallback_advice("Prescott", true, false), "OPENBLAS_CORETYPE=Haswell");
  EXPECT_EQ(blas_fallback_advice("Prescott", false, false), "");  // an old CPU: Prescott is right
  EXPECT_EQ(blas_fallback_advice("Haswell", true, true), "");
  EXPECT_EQ(blas_fallback_advice("SkylakeX", true, true), "");
  EXPECT_EQ(blas_fallback_advice("Zen", true, false), "");
  const BlasInfo info = blas_info();
  EXPECT_FALSE(info.corename.empty());
  EXPECT_EQ(info.threading, "openmp") << "qkv must link OpenBLAS's OpenMP build (one thread pool)";
}

}  // namespace
// With BatchInvariantGemm, a row's result is bitwise the same at every M (1 .. 64) and thread
// count, including the rows' bias (beta = 1) and alpha; and as accurate as a plain float dot
// product: its error against a double product is at most twice that of a sequential float sum.
TEST(Gemm, BatchInvariantRowsDoNotDependOnTheBatch) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (const auto& [K, N] : std::vector<std::pair<int64_t, int64_t>>{{768, 197}, {37, 64}, {1000, 5}}) {
    const int64_t M = 64;
    std::vector<float> A(static_cast<size_t>(M * K)), B(static_cast<size_t>(N * K)), bias(static_cast<size_t>(N));
    for (auto& x : A) x = nd(rng);
    for (auto& x : B) x = nd(rng) * 0.05f;
    for (auto& x : bias) x = nd(rng);
    const auto product = [&](int64_t m, int threads, float beta) {
      std::vector<float> C(static_cast<size_t>(m * N));
      for (int64_t i = 0; i < m; ++i) std::copy(bias.begin(), bias.end(), C.begin() + i * N);
      const int before = num_threads();
      set_num_threads(threads);
      {
        BatchInvariantGemm invariant;
        sgemm(false, true, m, N, K, 0.5f, A.data(), K, B.data(), K, beta, C.data(), N);
      }
      set_num_threads(before);
      return C;
    };
    for (const float beta : {0.0f, 1.0f}) {
      const std::vector<float> full = product(M, 2, beta);
      for (int64_t m : {1, 2, 3, 7, 16, 33, 64})
        for (int threads : {1, 2}) {
          const std::vector<float> part = product(m, threads, beta);
          EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin())) << "K=" << K << " N=" << N << " M=" << m
                                                                           << " threads=" << threads;
        }
      // accuracy: against double, at most twice the error of a sequential float dot product
      double worst = 0, plain = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double ref = 0;
          float seq = 0;
          for (int64_t k = 0; k < K; ++k) {
            ref += static_cast<double>(A[i * K + k]) * B[j * K + k];
            seq += A[i * K + k] * B[j * K + k];
          }
          const double add = beta == 0 ? 0.0 : bias[j];
          worst = std::max(worst, std::abs(full[i * N + j] - (0.5 * ref + add)));
          plain = std::max(plain, std::abs((0.5f * seq + static_cast<float>(add)) - (0.5 * ref + add)));
        }
      EXPECT_LE(worst, 2 * plain + 1e-6) << "K=" << K << " N=" << N;
    }
  }
}

// One row against the rows of B without BatchInvariantGemm (a decoding step's linear layers):
// qkv's own row products, bitwise those of the batch-invariant path (a row alone and inside a
// batch), at every thread count, with alpha and beta; and at most twice the error of a plain
// sequential float dot product against double.
TEST(Gemm, SingleRowMatchesTheBatchInvariantRowsAtEveryThreadCount) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (const auto& [K, N] : std::vector<std::pair<int64_t, int64_t>>{{576, 1536}, {37, 5}, {1000, 129}, {16, 3000}}) {
    std::vector<float> A(static_cast<size_t>(4 * K)), B(static_cast<size_t>(N * K)), bias(static_cast<size_t>(N));
    for (auto& x : A) x = nd(rng);
    for (auto& x : B) x = nd(rng) * 0.05f;
    for (auto& x : bias) x = nd(rng);
    for (const float beta : {0.0f, 1.0f}) {
      const auto product = [&](int64_t m, int threads, bool invariant) {
        std::vector<float> C(static_cast<size_t>(m * N));
        for (int64_t i = 0; i < m; ++i) std::copy(bias.begin(), bias.end(), C.begin() + i * N);
        const int before = num_threads();
        set_num_threads(threads);
        if (invariant) {
          BatchInvariantGemm scope;
          sgemm(false, true, m, N, K, 0.5f, A.data(), K, B.data(), K, beta, C.data(), N);
        } else {
          sgemm(false, true, m, N, K, 0.5f, A.data(), K, B.data(), K, beta, C.data(), N);
        }
        set_num_threads(before);
        return std::vector<float>(C.begin(), C.begin() + N);  // the first row
      };
      const std::vector<float> batched = product(4, 2, true), alone = product(1, 2, true);
      for (int threads : {1, 2, 3}) {
        const std::vector<float> row = product(1, threads, false);
        EXPECT_TRUE(row == batched && row == alone) << "K=" << K << " N=" << N << " threads=" << threads;
      }
      double worst = 0, plain = 0;
      const std::vector<float> row = product(1, 2, false);
      for (int64_t j = 0; j < N; ++j) {
        double ref = 0;
        float seq = 0;
        for (int64_t k = 0; k < K; ++k) ref += static_cast<double>(A[k]) * B[j * K + k], seq += A[k] * B[j * K + k];
        const double add = beta == 0 ? 0.0 : bias[j];
        worst = std::max(worst, std::abs(row[j] - (0.5 * ref + add)));
        plain = std::max(plain, std::abs((0.5f * seq + static_cast<float>(add)) - (0.5 * ref + add)));
      }
      EXPECT_LE(worst, 2 * plain + 1e-6) << "K=" << K << " N=" << N;
    }
  }
}

}  // namespace qkv
