// The GEMM wrapper (oneDNN for matrices, OpenBLAS for single rows): results, and the check for OpenBLAS's generic-kernel fallback.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm_internal.h"
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
}  // namespace qkv
