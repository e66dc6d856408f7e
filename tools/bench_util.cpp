#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <fstream>
#include <random>
#include <string>

#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "qkv/tensor.h"

namespace qkv::cli {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Tensor random_matrix(int64_t n, std::mt19937& rng) {
  Tensor t({n, n}, DType::F32);
  std::normal_distribution<float> d(0.0f, 1.0f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n * n; ++i) p[i] = d(rng);
  return t;
}

}  // namespace

Ceiling measure_gemm_ceiling(int64_t n, int reps) {
  std::mt19937 rng(1);
  Tensor a = random_matrix(n, rng), b = random_matrix(n, rng), c({n, n}, DType::F32);
  sgemm(false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f, c.data<float>(), n);  // warm-up
  double best = 1e30, worst = 0;
  const double start = now_s();
  for (int r = 0; r < reps || (now_s() - start < 1.0 && r < 100); ++r) {
    const double t0 = now_s();
    sgemm(false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f, c.data<float>(), n);
    best = std::min(best, now_s() - t0);
    worst = std::max(worst, now_s() - t0);
  }
  const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return {flop / best / 1e9, flop / worst / 1e9};
}

std::string Ceiling::warning() const {
  if (slowest_gflops >= 0.75 * gflops) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "warning: the SGEMM ceiling's runs disagree (best %.1f, slowest %.1f GFLOP/s): something else was "
                "using the machine, so ratios against the ceiling are unreliable; rerun on an idle machine",
                gflops, slowest_gflops);
  return buf;
}

double gemm_ceiling(int64_t n, int reps) { return measure_gemm_ceiling(n, reps).gflops; }

int64_t proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size()));
  return -1;
}

}  // namespace qkv::cli

namespace qkv::cli {

double read_bandwidth_gbs(int64_t mib, int reps) {
  const int64_t n = mib * (int64_t{1} << 20) / static_cast<int64_t>(sizeof(float));
  std::vector<float> a(static_cast<size_t>(n), 1.0f);
  double best = 0, sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    // four independent 4-float accumulators per thread, so the adds keep up with memory
    typedef float v4 __attribute__((vector_size(16)));
#pragma omp parallel for reduction(+ : s) schedule(static) num_threads(num_threads())
    for (int64_t i = 0; i < n; i += 4096) {
      v4 acc[4] = {};
      const int64_t end = std::min(n, i + 4096);
      int64_t j = i;
      for (; j + 16 <= end; j += 16)
        for (int k = 0; k < 4; ++k) {
          v4 x;
          std::memcpy(&x, a.data() + j + 4 * k, sizeof x);
          acc[k] += x;
        }
      float part = 0;
      for (; j < end; ++j) part += a[static_cast<size_t>(j)];
      for (int k = 0; k < 4; ++k) part += acc[k][0] + acc[k][1] + acc[k][2] + acc[k][3];
      s += part;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink += s;
    best = std::max(best, static_cast<double>(n) * sizeof(float) / dt / 1e9);
  }
  if (sink < 0) std::printf(" ");  // keep the sums alive
  return best;
}

}  // namespace qkv::cli
