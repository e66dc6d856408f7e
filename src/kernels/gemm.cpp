// A thin wrapper over the BLAS (Debian's OpenBLAS, OpenMP build), plus a check that OpenBLAS
// did not fall back to a generic kernel on a CPU it failed to recognise.
#include "qkv/gemm.h"

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
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
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
  // Kernels that use neither AVX2 nor AVX-512.
  const std::string c = info.corename;
  bool old = c == "Prescott" || c == "Core2" || c == "Penryn" || c == "Nehalem" || c == "Dunnington" ||
             c == "Atom" || c == "Barcelona" || c == "Opteron" || c == "Bulldozer" || c == "Sandybridge" ||
             c == "Katmai" || c == "Coppermine" || c == "Northwood" || c == "Banias";
  if (old && cpu_supports(Isa::AVX512)) {
    info.generic_fallback = true;
    info.advice = "OPENBLAS_CORETYPE=SkylakeX";
  } else if (old && cpu_supports(Isa::AVX2)) {
    info.generic_fallback = true;
    info.advice = "OPENBLAS_CORETYPE=Haswell";
  } else {
    info.generic_fallback = false;
  }
  return info;
}

}  // namespace qkv
