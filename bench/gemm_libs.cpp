// Which GEMM library: OpenBLAS (Debian's, OpenMP build) against oneDNN's dnnl_sgemm and
// libxsmm's OpenMP sgemm, on the shapes qkv multiplies. Prints GFLOP/s; the choice and the
// figures are in BENCHMARKS.md. Built only when libdnnl-dev and libxsmm-dev are installed (they
// are not dependencies of qkv itself).
#include <dnnl.h>
#include <libxsmm.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "qkv/qkv.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class F>
double best_gflops(int64_t M, int64_t N, int64_t K, F&& f) {
  f();  // warm-up
  double best = 1e30;
  int reps = 0;
  const double start = now_s();
  while (reps < 3 || (now_s() - start < 0.5 && reps < 50)) {
    const double t0 = now_s();
    f();
    best = std::min(best, now_s() - t0);
    ++reps;
  }
  return 2.0 * M * N * K / best / 1e9;
}

}  // namespace

int main() {
  const qkv::BlasInfo info = qkv::blas_info();
  std::printf("threads %d, CPU %s\nOpenBLAS: %s (kernel %s)\n", qkv::num_threads(), qkv::cpu_description().c_str(),
              info.library.c_str(), info.corename.c_str());
  const dnnl_version_t* v = dnnl_version();
  std::printf("oneDNN: %d.%d.%d (cpu runtime %s)\n", v->major, v->minor, v->patch,
              v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other");
  std::printf("libxsmm: %s (libxsmm_sgemm_omp)\n\n", LIBXSMM_VERSION);
  libxsmm_init();
  std::printf("%6s %6s %6s %14s %14s %14s\n", "M", "N", "K", "OpenBLAS GF/s", "oneDNN GF/s", "libxsmm GF/s");
  const int64_t shapes[][3] = {{2048, 2048, 2048}, {1024, 1024, 1024}, {1024, 3072, 768},
                               {1024, 768, 3072},  {256, 50257, 768},  {48, 64, 64}};
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  for (auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    std::vector<float> A(M * K), B(K * N), C(M * N);
    for (float& x : A) x = n(rng);
    for (float& x : B) x = n(rng);
    const double ob = best_gflops(M, N, K, [&] {
      qkv::sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    });
    const double dn = best_gflops(M, N, K, [&] {
      dnnl_sgemm('N', 'N', M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    });
    // libxsmm is column-major: C^T (N, M) = B^T A^T
    const double xs = best_gflops(M, N, K, [&] {
      const char t = 'N';
      const float alpha = 1.0f, beta = 0.0f;
      const libxsmm_blasint m = N, n = M, k = K, lda = N, ldb = K, ldc = N;
      libxsmm_sgemm_omp(&t, &t, &m, &n, &k, &alpha, B.data(), &lda, A.data(), &ldb, &beta, C.data(), &ldc);
    });
    std::printf("%6lld %6lld %6lld %14.1f %14.1f %14.1f\n", static_cast<long long>(M), static_cast<long long>(N),
                static_cast<long long>(K), ob, dn, xs);
  }
  libxsmm_finalize();
  return 0;
}
