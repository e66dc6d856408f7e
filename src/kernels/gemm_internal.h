#pragma once
#include <cstdint>
#include <string>

namespace qkv {

// "OPENBLAS_CORETYPE=..." when OpenBLAS picked kernel `corename` although the CPU supports
// AVX2 / AVX-512 (Debian's 0.3.21 does this on CPUs it does not recognise); "" otherwise.
std::string blas_fallback_advice(const std::string& corename, bool cpu_avx2, bool cpu_avx512);

// sgemm's arithmetic under Bf16Matmul (qkv/gemm.h): A and B rounded to bfloat16, then oneDNN's bf16
// matmul (native: needs bf16_gemm_native()) or the float32 product of the rounded values (what a
// CPU without bf16 dot products runs; the tests run both).
void sgemm_bf16(bool native, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace qkv
