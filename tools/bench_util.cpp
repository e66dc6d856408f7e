#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <string>

#include "qkv/gemm.h"
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

double gemm_ceiling(int64_t n, int reps) {
  std::mt19937 rng(1);
  Tensor a = random_matrix(n, rng), b = random_matrix(n, rng), c({n, n}, DType::F32);
  sgemm(false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f, c.data<float>(), n);  // warm-up
  double best = 1e30;
  const double start = now_s();
  for (int r = 0; r < reps || (now_s() - start < 1.0 && r < 100); ++r) {
    const double t0 = now_s();
    sgemm(false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f, c.data<float>(), n);
    best = std::min(best, now_s() - t0);
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best / 1e9;
}

int64_t proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size()));
  return -1;
}

}  // namespace qkv::cli
