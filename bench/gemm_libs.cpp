// Which GEMM library: OpenBLAS (Debian's, OpenMP build) against oneDNN's dnnl_sgemm and
// libxsmm's OpenMP sgemm, on square and model shapes; then OpenBLAS against oneDNN on every
// product of one GPT-2-small training step. Prints GFLOP/s and seconds; the choice and the
// figures are in BENCHMARKS.md. Built only when libxsmm-dev is installed (it is not a
// dependency of qkv itself).
#include <cblas.h>
#include <dnnl.h>
#include <libxsmm.h>

#include <algorithm>
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

// Median seconds of 7 calls.
template <class F>
double median_s(F&& f) {
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    const double t0 = now_s();
    f();
    t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[3];
}

void openblas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), 1.0f, A, static_cast<blasint>(ta ? M : K), B,
              static_cast<blasint>(tb ? K : N), 0.0f, C, static_cast<blasint>(N));
}
void onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C, N);
}

// The products of one training step of the GPT-2-small shape (batch 4 x 256 = 1024 tokens):
// for each of the 12 layers, the forward (x W^T), input-gradient (dy W) and weight-gradient
// (dy^T x) products of the QKV, output, FFN-up and FFN-down projections; once, those of the
// 50257-wide tied output layer. Attention's own products run in qkv's flash kernel.
void training_step_shapes() {
  struct Proj {
    int64_t in, out, count;
  };
  const int64_t T = 1024;
  const Proj projs[] = {{768, 2304, 12}, {768, 768, 12}, {768, 3072, 12}, {3072, 768, 12}, {768, 50257, 1}};
  std::vector<float> A(T * 50257), B(T * 50257), C(T * 50257);
  std::mt19937 rng(2);
  std::normal_distribution<float> n;
  for (float& x : A) x = n(rng);
  for (float& x : B) x = n(rng);
  std::printf("\nOne GPT-2-small training step's products (1024 tokens), median of 7 calls:\n");
  std::printf("%2s %6s %6s %6s %6s %14s %14s\n", "op", "M", "N", "K", "count", "OpenBLAS GF/s", "oneDNN GF/s");
  double total[2] = {0, 0};
  for (const Proj& p : projs) {
    // (trans_a, trans_b, M, N, K): forward, input gradient, weight gradient
    const int64_t s[3][5] = {{0, 1, T, p.out, p.in}, {0, 0, T, p.in, p.out}, {1, 0, p.out, p.in, T}};
    for (const auto& q : s) {
      const bool ta = q[0] != 0, tb = q[1] != 0;
      const int64_t M = q[2], N = q[3], K = q[4];
      const double t_ob = median_s([&] { openblas(ta, tb, M, N, K, A.data(), B.data(), C.data()); });
      const double t_dn = median_s([&] { onednn(ta, tb, M, N, K, A.data(), B.data(), C.data()); });
      total[0] += p.count * t_ob;
      total[1] += p.count * t_dn;
      const double gf = 2e-9 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
      std::printf("%c%c %6lld %6lld %6lld %6lld %14.1f %14.1f\n", ta ? 'T' : 'N', tb ? 'T' : 'N',
                  static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                  static_cast<long long>(p.count), gf / t_ob, gf / t_dn);
    }
  }
  std::printf("the step's products: OpenBLAS %.3f s, oneDNN %.3f s (%+.1f%%)\n", total[0], total[1],
              100.0 * (total[1] - total[0]) / total[0]);
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
    const double ob = best_gflops(M, N, K, [&] { openblas(false, false, M, N, K, A.data(), B.data(), C.data()); });
    const double dn = best_gflops(M, N, K, [&] { onednn(false, false, M, N, K, A.data(), B.data(), C.data()); });
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
  training_step_shapes();
  return 0;
}
