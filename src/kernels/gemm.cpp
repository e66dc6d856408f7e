// A thin wrapper over the BLAS (Debian's OpenBLAS, OpenMP build), plus a check that OpenBLAS
// did not fall back to a generic kernel on a CPU it failed to recognise.
#include "qkv/gemm.h"

#include "kernels/gemm_internal.h"

#include <cblas.h>

#include <string>

#include "qkv/cpu.h"
#include "qkv/error.h"

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
int openblas_get_parallel(void);
}

namespace qkv {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check(M >= 0 && N >= 0 && K >= 0, "sgemm: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  if (M == 1 && K > 0) {
    // One row (a decoding step): y = op(B)^T a as a matrix-vector product, which streams B once
    // instead of packing it first as sgemm does. a's elements are A[k * lda] when A is
    // transposed (stored K x 1), else A[k].
    //   C (1, N) = alpha a (1, K) op(B) (K, N) + beta C
    //   trans_b: B is (N, K), so C^T = B a ;  else B is (K, N), so C^T = B^T a
    cblas_sgemv(CblasRowMajor, trans_b ? CblasNoTrans : CblasTrans, static_cast<blasint>(trans_b ? N : K),
                static_cast<blasint>(trans_b ? K : N), alpha, B, static_cast<blasint>(ldb), A,
                static_cast<blasint>(trans_a ? lda : 1), beta, C, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

std::string blas_fallback_advice(const std::string& c, bool cpu_avx2, bool cpu_avx512) {
  // OpenBLAS kernels that use neither AVX2 nor AVX-512.
  static const char* const kOld[] = {"Prescott", "Core2",   "Penryn",     "Nehalem", "Dunnington",
                                     "Atom",     "Barcelona", "Opteron",  "Bulldozer", "Sandybridge",
                                     "Katmai",   "Coppermine", "Northwood", "Banias"};
  bool old = false;
  for (const char* k : kOld) old |= c == k;
  if (!old) return "";
  if (cpu_avx512) return "OPENBLAS_CORETYPE=SkylakeX";
  if (cpu_avx2) return "OPENBLAS_CORETYPE=Haswell";
  return "";
}

BlasInfo blas_info() {
  BlasInfo info;
  info.library = openblas_get_config();
  info.corename = openblas_get_corename();
  switch (openblas_get_parallel()) {
    case 0: info.threading = "sequential"; break;
    case 1: info.threading = "pthreads"; break;
    default: info.threading = "openmp"; break;
  }
  info.advice = blas_fallback_advice(info.corename, cpu_supports(Isa::AVX2), cpu_supports(Isa::AVX512));
  info.generic_fallback = !info.advice.empty();
  return info;
}

}  // namespace qkv
