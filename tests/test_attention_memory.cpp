// Flash attention at Tq = Tk = 65536 (B = H = 1, D = 64), forward and backward, in well under
// 1 GiB beyond its inputs; the score matrix alone would be 16 GiB. Peak resident memory is read
// from /proc (VmHWM, reset through clear_refs) with glibc told to return large blocks at once.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "attention_testing.h"

namespace qkv::testing {
namespace {

int64_t status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size()));
  return -1;
}

TEST(FlashMemory, SixtyFourKTokensForwardBackwardUnderOneGiB) {
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  const int64_t T = 65536, D = 64;
  std::mt19937 rng(11);
  Tensor q = randn({1, 1, T, D}, rng), k = randn({1, 1, T, D}, rng), v = randn({1, 1, T, D}, rng);
  Tensor dout = randn({1, 1, T, D}, rng);
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    ASSERT_TRUE(static_cast<bool>(clear)) << "cannot reset the peak RSS counter";
  }
  const int64_t base_kb = status_kb("VmRSS");
  AttentionOutput r = attention(q, k, v);
  AttentionGrads g = attention_backward(q, k, v, r.out, r.lse, dout);
  const int64_t peak_kb = status_kb("VmHWM");
  const double extra_mib = (peak_kb - base_kb) / 1024.0;
  std::printf("T=%lld D=%lld forward+backward: peak extra resident memory %.1f MiB\n", static_cast<long long>(T),
              static_cast<long long>(D), extra_mib);
  EXPECT_LT(extra_mib, 1024.0);
  // Spot-check rows against a direct float64 computation of those rows.
  for (int64_t i : {int64_t{0}, int64_t{31337}, T - 1}) {
    const float* qi = q.data<float>() + i * D;
    std::vector<double> s(T);
    double mx = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * k.data<float>()[j * D + d];
      s[j] = dot / std::sqrt(static_cast<double>(D));
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    std::vector<double> o(D, 0.0);
    for (int64_t j = 0; j < T; ++j) {
      const double p = std::exp(s[j] - mx);
      sum += p;
      for (int64_t d = 0; d < D; ++d) o[d] += p * v.data<float>()[j * D + d];
    }
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(r.out.data<float>()[i * D + d], o[d] / sum, 2e-5) << "row " << i;
    EXPECT_NEAR(r.lse.data<float>()[i], mx + std::log(sum), 1e-4) << "row " << i;
  }
  for (const Tensor* t : {&g.dq, &g.dk, &g.dv})
    for (float x : values(*t)) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace qkv::testing
