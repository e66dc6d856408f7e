// Training kernels: cross-entropy (forward and backward), AdamW, the global gradient norm and
// the embedding lookup, each against a float64 reference written here, finite differences for
// gradients, torch.optim.AdamW when /usr/bin/python3 has torch, and bitwise determinism
// across thread counts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/embedding.h"
#include "kernels/quant.h"
#include "kernels/train_isa.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kIgnore = -100;

// Largest violation of |got_i - want_i| <= abs_tol + rel_tol mag_i, reported with where it
// happened, both values and the bound it broke. mag_i is |want_i| unless given: a value formed
// with cancellation is judged against the size of its terms.
template <class A, class B>
::testing::AssertionResult all_close(const std::vector<A>& got, const std::vector<B>& want, double abs_tol,
                                     double rel_tol, const std::string& what,
                                     const std::vector<double>* mag = nullptr) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  double worst = 0;  // largest err / bound
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double bound = abs_tol + rel_tol * (mag ? (*mag)[i] : std::abs(w));
    const double ratio = std::isfinite(g) ? std::abs(g - w) / bound : std::numeric_limits<double>::infinity();
    if (!(ratio <= worst)) {
      worst = ratio;
      at = i;
    }
  }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  const double g = static_cast<double>(got[at]), w = static_cast<double>(want[at]);
  return ::testing::AssertionFailure() << what << ": largest error " << std::abs(g - w) << " at " << at << " (got "
                                       << g << ", want " << w << "), bound "
                                       << abs_tol + rel_tol * (mag ? (*mag)[at] : std::abs(w));
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

bool bitwise_equal(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// ---------------------------------------------------------------------------------------------
// Cross-entropy

struct CeRef {
  double loss = 0;
  int64_t n = 0;
  std::vector<double> lse;
};

// PyTorch's cross_entropy(reduction='mean', ignore_index, label_smoothing) in float64.
CeRef ce_ref(const std::vector<double>& z, const std::vector<int64_t>& t, int64_t N, int64_t V, int64_t ignore,
             double eps) {
  CeRef r;
  r.lse.resize(N);
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) {
    const double* zi = z.data() + i * V;
    const double m = *std::max_element(zi, zi + V);
    double s = 0, zs = 0;
    for (int64_t j = 0; j < V; ++j) {
      s += std::exp(zi[j] - m);
      zs += zi[j];
    }
    r.lse[i] = m + std::log(s);
    if (t[i] == ignore) continue;
    sum += (1 - eps) * (r.lse[i] - zi[t[i]]) + eps * (r.lse[i] - zs / V);
    ++r.n;
  }
  r.loss = r.n ? sum / r.n : 0.0;
  return r;
}

// scale * d(mean loss)/dz in float64, from the closed form softmax - smoothed one-hot.
std::vector<double> ce_grad_ref(const std::vector<double>& z, const std::vector<int64_t>& t, int64_t N, int64_t V,
                                int64_t ignore, double eps, double scale) {
  const CeRef r = ce_ref(z, t, N, V, ignore, eps);
  std::vector<double> g(N * V, 0.0);
  if (r.n == 0) return g;
  for (int64_t i = 0; i < N; ++i) {
    if (t[i] == ignore) continue;
    for (int64_t j = 0; j < V; ++j)
      g[i * V + j] = scale / r.n * (std::exp(z[i * V + j] - r.lse[i]) - (j == t[i] ? 1 - eps : 0.0) - eps / V);
  }
  return g;
}

struct CeProblem {
  int64_t N, V;
  std::vector<float> z;
  std::vector<int64_t> t;
};

// Logits ~ N(0, sd); every third row ignored when with_ignore.
CeProblem ce_problem(int64_t N, int64_t V, bool with_ignore, uint32_t seed, float sd = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::uniform_int_distribution<int64_t> cls(0, V - 1);
  CeProblem p{N, V, std::vector<float>(N * V), std::vector<int64_t>(N)};
  for (float& x : p.z) x = nd(rng);
  for (int64_t i = 0; i < N; ++i) p.t[i] = (with_ignore && i % 3 == 1) ? kIgnore : cls(rng);
  return p;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

struct CeRun {
  double loss;
  int64_t n;
  std::vector<float> lse, grad;
};

CeRun ce_run(const CeProblem& p, int64_t ignore, float eps, float scale, int threads) {
  CeRun r{0, -1, std::vector<float>(p.N), std::vector<float>(p.N * p.V, std::nanf(""))};
  r.loss = cross_entropy_forward(p.z.data(), p.t.data(), r.lse.data(), p.N, p.V, ignore, eps, &r.n, threads);
  cross_entropy_backward(p.z.data(), p.t.data(), r.lse.data(), r.grad.data(), p.N, p.V, ignore, eps, r.n, scale,
                         threads);
  return r;
}

// Central differences of the float64 reference loss at the given flat indices, times scale.
std::vector<double> ce_fd(const CeProblem& p, int64_t ignore, double eps, double scale,
                          const std::vector<int64_t>& at) {
  std::vector<double> z = to_double(p.z), out;
  const double h = 1e-5;
  for (int64_t k : at) {
    const double z0 = z[k];
    z[k] = z0 + h;
    const double lp = ce_ref(z, p.t, p.N, p.V, ignore, eps).loss;
    z[k] = z0 - h;
    const double lm = ce_ref(z, p.t, p.N, p.V, ignore, eps).loss;
    z[k] = z0;
    out.push_back(scale * (lp - lm) / (2 * h));
  }
  return out;
}

TEST(CrossEntropy, MatchesFloat64ReferenceAndFiniteDifferences) {
  for (int64_t V : {1, 2, 7, 50257})
    for (bool with_ignore : {false, true})
      for (float eps : {0.0f, 0.1f}) {
        const int64_t N = V == 50257 ? 3 : 37;
        SCOPED_TRACE(::testing::Message() << "V=" << V << " ignore=" << with_ignore << " eps=" << eps);
        const CeProblem p = ce_problem(N, V, with_ignore, static_cast<uint32_t>(V * 10 + with_ignore));
        const float scale = 0.75f;
        const CeRun got = ce_run(p, kIgnore, eps, scale, 2);
        const std::vector<double> z = to_double(p.z);
        const CeRef want = ce_ref(z, p.t, N, V, kIgnore, eps);
        EXPECT_EQ(got.n, want.n);
        EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::max(1.0, std::abs(want.loss)));
        EXPECT_TRUE(all_close(got.lse, want.lse, 1e-6, 1e-6, "lse"));
        // The whole gradient against the closed form; then entries against finite differences
        // (all of them for small V; for V = 50257 each row's target and a few others).
        EXPECT_TRUE(all_close(got.grad, ce_grad_ref(z, p.t, N, V, kIgnore, eps, scale), 1e-6, 1e-5, "dlogits"));
        std::vector<int64_t> at;
        if (V < 100) {
          for (int64_t k = 0; k < N * V; ++k) at.push_back(k);
        } else {
          for (int64_t i = 0; i < N; ++i) {
            if (p.t[i] >= 0) at.push_back(i * V + p.t[i]);
            for (int64_t j : {int64_t{0}, int64_t{1}, V / 2, V - 1}) at.push_back(i * V + j);
          }
        }
        std::vector<float> g_at;
        for (int64_t k : at) g_at.push_back(got.grad[k]);
        EXPECT_TRUE(all_close(g_at, ce_fd(p, kIgnore, eps, scale, at), 1e-6, 1e-5, "dlogits vs finite differences"));
      }
}

TEST(CrossEntropy, IgnoreIndexMayBeAValidClass) {
  // Like PyTorch: ignore_index = 0 drops rows whose target is class 0, and class 0 still
  // receives gradient from the other rows.
  const CeProblem p = ce_problem(40, 5, false, 7);
  const CeRun got = ce_run(p, 0, 0.1f, 1.0f, 2);
  const std::vector<double> z = to_double(p.z);
  const CeRef want = ce_ref(z, p.t, p.N, p.V, 0, 0.1);
  ASSERT_GT(std::count(p.t.begin(), p.t.end(), 0), 0);
  EXPECT_EQ(got.n, want.n);
  EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::max(1.0, want.loss));
  EXPECT_TRUE(all_close(got.grad, ce_grad_ref(z, p.t, p.N, p.V, 0, 0.1, 1.0), 1e-6, 1e-5, "dlogits"));
}

TEST(CrossEntropy, HugeLogitsStayFinite) {
  const int64_t N = 4, V = 5;
  CeProblem p{N, V,
              {1e4f, -1e4f, 0.0f, 1e4f, -1e4f,      // two tied maxima
               -1e4f, -1e4f, -1e4f, -1e4f, -1e4f,  // all equal and very negative
               1e4f - 1, 1e4f, -1e4f, 5.0f, 1e4f,  // target far below the maximum
               -1e4f, 1e4f, 1e4f, 1e4f, 1e4f},
              {0, 3, 2, 0}};
  for (float eps : {0.0f, 0.1f}) {
    SCOPED_TRACE(::testing::Message() << "eps=" << eps);
    const CeRun got = ce_run(p, kIgnore, eps, 1.0f, 2);
    const std::vector<double> z = to_double(p.z);
    const CeRef want = ce_ref(z, p.t, N, V, kIgnore, eps);
    ASSERT_TRUE(std::isfinite(got.loss));
    EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::abs(want.loss));
    EXPECT_GT(got.loss, 1e3);  // rows 2 and 3 cost about 2e4 each
    for (float x : got.lse) EXPECT_TRUE(std::isfinite(x));
    EXPECT_TRUE(all_close(got.lse, want.lse, 0, 1e-7, "lse"));
    // lse is a float near 1e4 (ulp 2^-10), so exp(z - lse) is good to ~5e-4 relative.
    EXPECT_TRUE(all_close(got.grad, ce_grad_ref(z, p.t, N, V, kIgnore, eps, 1.0), 2e-4, 1e-3, "dlogits"));
    for (int64_t i = 0; i < N; ++i) {
      double row = 0;
      for (int64_t j = 0; j < V; ++j) row += got.grad[i * V + j];
      EXPECT_NEAR(row, 0.0, 1e-6) << "gradient row " << i << " should sum to zero";
    }
  }
}

// pack_bf16_blocks on every ISA variant against the layout written out element by element (the
// format's definition in train_isa.h, with f32_to_bf16 for the rounding): op(B) = B and B^T, sizes
// inside one block, at its edges and across several, a row stride wider than the rows, and NaN,
// infinities, denormals and -0 among the values; the zeros past K and N included.
TEST(PackBf16Blocks, EveryIsaMatchesTheLayoutsDefinition) {
  struct Variant {
    const char* name;
    void (*f)(const float*, int64_t, bool, int64_t, int64_t, int64_t, uint16_t*, int64_t, int64_t);
    bool runs;
  };
  const Variant variants[] = {{"generic", generic::pack_bf16_blocks, true},
                              {"avx2", avx2::pack_bf16_blocks, cpu_supports(Isa::AVX2)},
                              {"w16avx2", w16avx2::pack_bf16_blocks, cpu_supports(Isa::AVX2)},
                              {"avx512", avx512::pack_bf16_blocks, cpu_supports(Isa::AVX512)}};
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 1e-39f, -3e-40f, -0.0f, 1.00390625f};
  for (const auto& [K, N] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {5, 7}, {32, 64}, {33, 65}, {31, 63}, {64, 128}, {100, 130}, {512, 192}})
    for (const bool trans : {false, true}) {
      const int64_t rows = trans ? N : K, cols = trans ? K : N, ld = cols + 3;
      std::vector<float> B(static_cast<size_t>(rows * ld));
      for (float& x : B) x = nd(rng);
      for (size_t i = 0; i < std::size(specials); ++i) B[(i * 97) % B.size()] = specials[i];
      const int64_t padK = (K + 31) / 32 * 32, padN = (N + 63) / 64 * 64;
      std::vector<uint16_t> want(static_cast<size_t>(padK * padN), 0);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) {
          const float v = trans ? B[static_cast<size_t>(n * ld + k)] : B[static_cast<size_t>(k * ld + n)];
          const int64_t at = (n / 64) * padK * 64 + (k / 32) * 2048 + (k % 32 / 2) * 128 + (n % 64) * 2 + k % 2;
          want[static_cast<size_t>(at)] = kernels::f32_to_bf16(v);
        }
      for (const Variant& v : variants) {
        if (!v.runs) continue;
        SCOPED_TRACE(::testing::Message() << v.name << " K " << K << " N " << N << " trans " << trans);
        std::vector<uint16_t> got(want.size(), 0xabcd);
        const int64_t blocks = trans ? padN / 64 : padK / 32;
        v.f(B.data(), ld, trans, K, N, padK, got.data(), 0, blocks / 2);  // in two calls, as threads split it
        v.f(B.data(), ld, trans, K, N, padK, got.data(), blocks / 2, blocks);
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
      }
    }
}

// max_j z_j on every ISA variant: the largest value for finite rows, +inf when one is +inf, and
// NaN whenever the row holds a NaN, wherever it sits ("a > b ? a : b" kept or dropped a NaN
// depending on its lane and on whether it came first).
TEST(RowMax, EveryIsaPropagatesNaN) {
  struct Variant {
    const char* name;
    float (*f)(const float*, int64_t);
    bool runs;
  };
  const Variant variants[] = {{"generic", generic::row_max, true},
                              {"avx2", avx2::row_max, cpu_supports(Isa::AVX2)},
                              {"w16avx2", w16avx2::row_max, cpu_supports(Isa::AVX2)},
                              {"avx512", avx512::row_max, cpu_supports(Isa::AVX512)}};
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (const Variant& v : variants) {
    if (!v.runs) continue;
    for (int64_t n : {1, 3, 4, 8, 16, 17, 33, 100}) {
      SCOPED_TRACE(::testing::Message() << v.name << " n=" << n);
      std::vector<float> z(static_cast<size_t>(n));
      for (float& x : z) x = nd(rng);
      EXPECT_EQ(v.f(z.data(), n), *std::max_element(z.begin(), z.end()));
      for (int64_t at = 0; at < n; ++at) {
        std::vector<float> bad = z;
        bad[at] = std::numeric_limits<float>::quiet_NaN();
        EXPECT_TRUE(std::isnan(v.f(bad.data(), n))) << "NaN at " << at << " was dropped";
        bad[at] = std::numeric_limits<float>::infinity();
        EXPECT_EQ(v.f(bad.data(), n), std::numeric_limits<float>::infinity());
      }
    }
  }
}

// The dropout mask's vector bodies give the slow twin's bits on every ISA variant: any start
// index (mid-vector, and where the counter's 64-bit products wrap), any length (tails), keep
// thresholds from "keep all" to "keep almost none" (the top bit of the 32-bit compare set and
// clear), in place and not; dropped inf and NaN give +0, kept ones pass.
TEST(DropoutMask, EveryIsaGivesTheReferenceBits) {
  struct Variant {
    const char* name;
    void (*f)(const float*, float*, int64_t, uint64_t, uint64_t, uint64_t, float);
    bool runs;
  };
  const Variant variants[] = {{"generic", generic::dropout_mask, true},
                              {"avx2", avx2::dropout_mask, cpu_supports(Isa::AVX2)},
                              {"w16avx2", w16avx2::dropout_mask, cpu_supports(Isa::AVX2)},
                              {"avx512", avx512::dropout_mask, cpu_supports(Isa::AVX512)}};
  std::mt19937_64 rng(17);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(700);
  for (float& v : x) v = nd(rng);
  x[3] = std::numeric_limits<float>::infinity();
  x[40] = std::numeric_limits<float>::quiet_NaN();
  x[41] = -std::numeric_limits<float>::infinity();
  // 1 and 429496730 stand for element n / 2's own bits and those + 1 (below)
  const uint64_t thresholds[] = {0, 1, 429496730, 0x7fffffffULL, 0x80000000ULL, 0x80000001ULL, 3865470567ULL,
                                 0xffffff00ULL};
  const uint64_t starts[] = {0, 5, 17, 1000003, (1ULL << 32) - 3, 0xfffffffffffffff0ULL};
  for (const Variant& v : variants) {
    if (!v.runs) continue;
    for (const uint64_t listed : thresholds)
      for (uint64_t i0 : starts)
        for (int64_t n : {1, 7, 16, 33, 700}) {
          const uint64_t key = rng();
          // once per length, the threshold is element n / 2's own bits (kept: ">=" not ">"), or one above
          // them (dropped)
          const uint64_t on = dropout_detail::bits_at(key, i0 + static_cast<uint64_t>(n / 2));
          const uint64_t threshold = listed == 1 ? on : listed == 429496730 ? on + 1 : listed;
          SCOPED_TRACE(::testing::Message() << v.name << " threshold=" << threshold << " i0=" << i0 << " n=" << n);
          const float scale = 1.25f;
          std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), -7.0f);
          dropout_mask_ref(x.data(), want.data(), n, i0, key, threshold, scale);
          v.f(x.data(), got.data(), n, i0, key, threshold, scale);
          int64_t kept = 0;
          for (int64_t j = 0; j < n; ++j) {
            ASSERT_EQ(std::bit_cast<uint32_t>(got[j]), std::bit_cast<uint32_t>(want[j])) << "element " << j;
            kept += want[j] != 0.0f;
          }
          if (threshold == 0) {
            EXPECT_EQ(kept, n);
          }
          if (threshold == on) {
            EXPECT_NE(want[n / 2], 0.0f);
          }
          if (threshold == on + 1) {
            EXPECT_EQ(want[n / 2], 0.0f);
          }
          std::vector<float> in_place(x.begin(), x.begin() + n);
          v.f(in_place.data(), in_place.data(), n, i0, key, threshold, scale);
          for (int64_t j = 0; j < n; ++j)
            ASSERT_EQ(std::bit_cast<uint32_t>(in_place[j]), std::bit_cast<uint32_t>(want[j])) << "in place, element " << j;
        }
  }
  // the reference itself: element j is element i0 + j of dropout_bits' sequence for the key
  // of (seed, stream) -- checked through dropout_forward, which runs the active ISA's body
  const int64_t n = 50000;
  std::vector<float> ones(static_cast<size_t>(n), 1.0f), y(static_cast<size_t>(n));
  dropout_forward(ones.data(), y.data(), n, 0.3f, 11, 12, 2);
  const uint64_t threshold = static_cast<uint64_t>(std::ceil(0.3 * 4294967296.0));
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(y[i] != 0.0f, dropout_bits(11, 12, static_cast<uint64_t>(i)) >= threshold) << "element " << i;
}

// NaN logits give a NaN loss and NaN gradients in their row, never a finite number; the other
// rows' gradients stay finite.
TEST(CrossEntropy, NaNLogitsPropagate) {
  for (int64_t V : {5, 64, 1000}) {
    SCOPED_TRACE(::testing::Message() << "V=" << V);
    CeProblem p = ce_problem(3, V, false, 8);
    p.z[1 * V + V / 2] = std::numeric_limits<float>::quiet_NaN();
    for (float eps : {0.0f, 0.1f}) {
      const CeRun got = ce_run(p, kIgnore, eps, 1.0f, 1);
      EXPECT_TRUE(std::isnan(got.loss));
      EXPECT_TRUE(std::isnan(got.lse[1]));
      for (int64_t j = 0; j < V; ++j) {
        EXPECT_TRUE(std::isnan(got.grad[1 * V + j])) << "row 1, class " << j;
        EXPECT_TRUE(std::isfinite(got.grad[0 * V + j]) && std::isfinite(got.grad[2 * V + j]));
      }
    }
  }
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndZeroGradient) {
  CeProblem p = ce_problem(4, 6, false, 3);
  std::fill(p.t.begin(), p.t.end(), kIgnore);
  for (float eps : {0.0f, 0.1f}) {
    const CeRun got = ce_run(p, kIgnore, eps, 1.0f, 3);  // grad was prefilled with NaN
    EXPECT_EQ(got.loss, 0.0);
    EXPECT_EQ(got.n, 0);
    for (float x : got.grad) ASSERT_EQ(x, 0.0f);
    for (float x : got.lse) EXPECT_TRUE(std::isfinite(x));
  }
  // An empty batch touches nothing.
  int64_t n = -1;
  EXPECT_EQ(cross_entropy_forward(nullptr, nullptr, nullptr, 0, 10, kIgnore, 0.0f, &n, 2), 0.0);
  EXPECT_EQ(n, 0);
  cross_entropy_backward(nullptr, nullptr, nullptr, nullptr, 0, 10, kIgnore, 0.0f, 0, 1.0f, 2);
}

TEST(CrossEntropy, CheckTargets) {
  const std::vector<int64_t> good{0, 4, kIgnore, 2};
  EXPECT_EQ(cross_entropy_check_targets(good.data(), 4, 5, kIgnore), -1);
  const std::vector<int64_t> high{0, 4, 5, -1};
  EXPECT_EQ(cross_entropy_check_targets(high.data(), 4, 5, kIgnore), 2);
  const std::vector<int64_t> neg{0, -1, kIgnore};
  EXPECT_EQ(cross_entropy_check_targets(neg.data(), 3, 5, kIgnore), 1);
  EXPECT_EQ(cross_entropy_check_targets(neg.data(), 3, 5, -1), 2);  // -100 is a bad target when not ignored
  EXPECT_EQ(cross_entropy_check_targets(nullptr, 0, 5, kIgnore), -1);
}

TEST(CrossEntropy, BitwiseIdenticalAcrossThreadCounts) {
  for (int64_t N : {1, 1000, 5000}) {
    const CeProblem p = ce_problem(N, 33, true, static_cast<uint32_t>(N));
    const CeRun one = ce_run(p, kIgnore, 0.1f, 1.0f, 1);
    for (int threads : {2, 3}) {
      const CeRun r = ce_run(p, kIgnore, 0.1f, 1.0f, threads);
      EXPECT_TRUE(bitwise_equal(r.loss, one.loss)) << "N=" << N << " threads=" << threads;
      EXPECT_EQ(r.n, one.n);
      EXPECT_TRUE(bitwise_equal(r.lse, one.lse)) << "N=" << N << " threads=" << threads;
      EXPECT_TRUE(bitwise_equal(r.grad, one.grad)) << "N=" << N << " threads=" << threads;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// AdamW

// PyTorch 1.13's _single_tensor_adamw for one element, in float64, with the hyperparameters
// taken at their float values. m_mag is m's running sum of |terms|: m adds gradients of either
// sign, so its float rounding error is relative to m_mag, not to |m|.
struct AdamWRef {
  double param, m = 0, v = 0, m_mag = 0;
  void step(double g, const AdamWParams& p) {
    const double lr = p.lr, b1 = p.beta1, b2 = p.beta2, eps = p.eps, wd = p.weight_decay;
    param *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    m_mag = b1 * m_mag + (1 - b1) * std::abs(g);
    v = b2 * v + (1 - b2) * g * g;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(p.step));
    const double bc2 = 1 - std::pow(b2, static_cast<double>(p.step));
    param -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
  }
};

struct AdamWProblem {
  std::vector<float> param0;
  std::vector<std::vector<float>> grads;  // one per step
};

AdamWProblem adamw_problem(int64_t n, int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  AdamWProblem pr;
  pr.param0.resize(n);
  for (float& x : pr.param0) x = nd(rng);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i) {
      // a spread of magnitudes, and one element that never gets a gradient (v stays 0)
      const float scale = std::pow(10.0f, static_cast<float>(i % 5) - 3.0f);
      g[i] = i == 0 ? 0.0f : nd(rng) * scale;
    }
    pr.grads.push_back(std::move(g));
  }
  return pr;
}

struct AdamWState {
  std::vector<float> param, m, v;
};

AdamWState adamw_run(const AdamWProblem& pr, AdamWParams hp, int threads) {
  const int64_t n = static_cast<int64_t>(pr.param0.size());
  AdamWState s{pr.param0, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  for (size_t k = 0; k < pr.grads.size(); ++k) {
    hp.step = static_cast<int64_t>(k) + 1;
    adamw_step(s.param.data(), pr.grads[k].data(), s.m.data(), s.v.data(), n, hp, threads);
  }
  return s;
}

const AdamWParams kConfigs[] = {
    {1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 0},
    {3e-2f, 0.8f, 0.95f, 1e-6f, 0.1f, 0},
    {1e-2f, 0.9f, 0.99f, 1e-8f, 0.0f, 0},
};

TEST(AdamW, MatchesFloat64FormulaOverTenSteps) {
  for (const AdamWParams& hp : kConfigs) {
    SCOPED_TRACE(::testing::Message() << "lr=" << hp.lr << " wd=" << hp.weight_decay);
    const AdamWProblem pr = adamw_problem(203, 10, 11);
    const AdamWState got = adamw_run(pr, hp, 2);
    std::vector<double> wp, wm, wv, m_mag;
    for (size_t i = 0; i < pr.param0.size(); ++i) {
      AdamWRef r{pr.param0[i]};
      AdamWParams h = hp;
      for (int k = 0; k < 10; ++k) {
        h.step = k + 1;
        r.step(pr.grads[k][i], h);
      }
      wp.push_back(r.param);
      wm.push_back(r.m);
      wv.push_back(r.v);
      m_mag.push_back(r.m_mag);
    }
    EXPECT_TRUE(all_close(got.param, wp, 1e-7, 1e-6, "param"));
    EXPECT_TRUE(all_close(got.m, wm, 1e-12, 1e-6, "m", &m_mag));
    EXPECT_TRUE(all_close(got.v, wv, 1e-18, 1e-6, "v"));
    EXPECT_EQ(got.m[0], 0.0f);  // no gradient ever: only the weight decay moved param 0
    EXPECT_EQ(got.v[0], 0.0f);
  }
}

// A training step's parameters in one call: the bits of one adamw_step per tensor, for 1, 2 and 3
// threads, with tensors smaller than a slice, spanning several, empty, and different settings.
TEST(AdamW, ManyTensorsInOneCallGiveEachTensorsBits) {
  const std::vector<int64_t> sizes = {5, 70001, 0, 16384, 300, 40000};
  std::vector<AdamWProblem> prs;
  for (size_t k = 0; k < sizes.size(); ++k) prs.push_back(adamw_problem(sizes[k], 3, 20 + static_cast<uint32_t>(k)));
  std::vector<AdamWState> want;
  for (size_t k = 0; k < sizes.size(); ++k) want.push_back(adamw_run(prs[k], kConfigs[k % 3], 1));
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    std::vector<AdamWState> got;
    for (size_t k = 0; k < sizes.size(); ++k)
      got.push_back({prs[k].param0, std::vector<float>(sizes[k], 0.0f), std::vector<float>(sizes[k], 0.0f)});
    for (int step = 0; step < 3; ++step) {
      std::vector<AdamWTensor> t;
      for (size_t k = 0; k < sizes.size(); ++k) {
        AdamWParams hp = kConfigs[k % 3];
        hp.step = step + 1;
        t.push_back({got[k].param.data(), prs[k].grads[step].data(), got[k].m.data(), got[k].v.data(), sizes[k], hp});
      }
      adamw_steps(t.data(), static_cast<int64_t>(t.size()), threads);
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_EQ(got[k].param, want[k].param) << "tensor " << k;
      EXPECT_EQ(got[k].m, want[k].m) << "tensor " << k;
      EXPECT_EQ(got[k].v, want[k].v) << "tensor " << k;
    }
  }
}

// Clipping folded into the step (grad_scale) is exactly the step on pre-scaled gradients, for
// any thread count, across slice boundaries (n spans several 16384-element slices).
TEST(AdamW, GradScaleEqualsPrescaledGradientsBitwise) {
  const AdamWProblem pr = adamw_problem(70001, 3, 5);
  AdamWProblem scaled = pr;
  const float c = 0.3173f;
  for (auto& g : scaled.grads)
    for (float& x : g) x *= c;
  AdamWParams hp = kConfigs[0];
  const AdamWState want = adamw_run(scaled, hp, 1);
  hp.grad_scale = c;
  for (int threads : {1, 2, 3}) {
    const AdamWState got = adamw_run(pr, hp, threads);
    EXPECT_EQ(std::memcmp(got.param.data(), want.param.data(), want.param.size() * sizeof(float)), 0) << threads;
    EXPECT_EQ(std::memcmp(got.m.data(), want.m.data(), want.m.size() * sizeof(float)), 0) << threads;
    EXPECT_EQ(std::memcmp(got.v.data(), want.v.data(), want.v.size() * sizeof(float)), 0) << threads;
  }
}

TEST(AdamW, MatchesTorchOptimAdamW) {
  const char* py = "/usr/bin/python3";
  // scripts/install-deps.sh installs Debian's python3-torch: its absence is a failure.
  ASSERT_TRUE(std::filesystem::exists(py)) << py << " not found (run scripts/install-deps.sh)";
  ASSERT_EQ(std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1"), 0)
      << py << " cannot import torch (run scripts/install-deps.sh)";
  std::string tmpl = (std::filesystem::temp_directory_path() / "qkv_adamw_XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::filesystem::path dir = tmpl;
  {
    std::ofstream f(dir / "ref.py");
    f << "import sys, torch\n"
         "torch.set_num_threads(1)\n"
         "d = sys.argv[1]\n"
         "rows = [[float(x) for x in l.split()] for l in open(d + '/in.txt').read().splitlines()]\n"
         "lr, b1, b2, eps, wd = rows[0]\n"
         "p = torch.nn.Parameter(torch.tensor(rows[1], dtype=torch.float32))\n"
         "opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)\n"
         "for g in rows[2:]:\n"
         "    p.grad = torch.tensor(g, dtype=torch.float32)\n"
         "    opt.step()\n"
         "st = opt.state[p]\n"
         "with open(d + '/out.txt', 'w') as f:\n"
         "    for t in (p.detach(), st['exp_avg'], st['exp_avg_sq']):\n"
         "        f.write(' '.join(repr(x) for x in t.tolist()) + '\\n')\n";
  }
  int config = 0;
  for (const AdamWParams& hp : kConfigs) {
    SCOPED_TRACE(::testing::Message() << "config " << config++);
    const AdamWProblem pr = adamw_problem(97, 10, 23);
    {
      // %.9g round-trips a float exactly; Python reads the hyperparameters at their float values.
      std::ofstream f(dir / "in.txt");
      f.precision(9);
      f << double{hp.lr} << ' ' << double{hp.beta1} << ' ' << double{hp.beta2} << ' ' << double{hp.eps} << ' '
        << double{hp.weight_decay} << '\n';
      auto line = [&f](const std::vector<float>& v) {
        for (float x : v) f << double{x} << ' ';
        f << '\n';
      };
      line(pr.param0);
      for (const auto& g : pr.grads) line(g);
    }
    std::filesystem::remove(dir / "out.txt");
    const std::string cmd = std::string(py) + " " + (dir / "ref.py").string() + " " + dir.string() + " > " +
                            (dir / "log.txt").string() + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "torch reference failed; see " << (dir / "log.txt");
    std::ifstream f(dir / "out.txt");
    std::vector<std::vector<double>> want(3);
    std::string l;
    for (auto& w : want) {
      ASSERT_TRUE(std::getline(f, l));
      std::istringstream ss(l);
      double x;
      while (ss >> x) w.push_back(x);
    }
    const AdamWState got = adamw_run(pr, hp, 2);
    // Torch's vectorised add may fuse m * beta1 + (1 - beta1) g into one FMA, so exp_avg can
    // differ by an ulp of its terms; it is judged against their size (see AdamWRef::m_mag).
    std::vector<double> m_mag;
    for (size_t i = 0; i < pr.param0.size(); ++i) {
      AdamWRef r{pr.param0[i]};
      for (const auto& g : pr.grads) r.step(g[i], hp);
      m_mag.push_back(r.m_mag);
    }
    EXPECT_TRUE(all_close(got.param, want[0], 1e-12, 1e-6, "param vs torch"));
    EXPECT_TRUE(all_close(got.m, want[1], 1e-12, 1e-6, "exp_avg vs torch", &m_mag));
    EXPECT_TRUE(all_close(got.v, want[2], 1e-18, 1e-6, "exp_avg_sq vs torch"));
  }
  std::filesystem::remove_all(dir);
}

TEST(AdamW, BitwiseIdenticalAcrossThreadCounts) {
  const AdamWProblem pr = adamw_problem(100003, 3, 5);
  const AdamWState one = adamw_run(pr, kConfigs[1], 1);
  for (int threads : {2, 3}) {
    const AdamWState r = adamw_run(pr, kConfigs[1], threads);
    EXPECT_TRUE(bitwise_equal(r.param, one.param) && bitwise_equal(r.m, one.m) && bitwise_equal(r.v, one.v))
        << "threads=" << threads;
  }
}

TEST(GlobalGradNorm, MatchesFloat64SumAndIsBitwiseDeterministic) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::vector<int64_t> sizes{100003, 7, 0, 4096, 4097, 50000, (int64_t{1} << 20) + 5};
  std::vector<std::vector<float>> g;
  std::vector<const float*> ptrs;
  double want = 0;
  for (int64_t n : sizes) {
    g.emplace_back(n);
    for (float& x : g.back()) {
      x = nd(rng) * 1e-3f;
      want += static_cast<double>(x) * x;
    }
  }
  for (const auto& v : g) ptrs.push_back(v.data());
  const int64_t count = static_cast<int64_t>(sizes.size());
  const double one = global_grad_norm_sq(ptrs.data(), sizes.data(), count, 1);
  EXPECT_NEAR(one, want, 1e-12 * want);
  for (int threads : {2, 3})
    EXPECT_TRUE(bitwise_equal(global_grad_norm_sq(ptrs.data(), sizes.data(), count, threads), one))
        << "threads=" << threads;
  EXPECT_EQ(global_grad_norm_sq(nullptr, nullptr, 0, 2), 0.0);
  const std::vector<float> three_four{3.0f, 4.0f};
  const float* p34 = three_four.data();
  const int64_t n2 = 2;
  EXPECT_EQ(global_grad_norm_sq(&p34, &n2, 1, 2), 25.0);
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(Embedding, ForwardCopiesRows) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  for (int64_t C : {1, 5, 300}) {
    const int64_t V = 50, N = 2000;
    std::vector<float> table(V * C), out(N * C, std::nanf(""));
    for (float& x : table) x = nd(rng);
    std::vector<int64_t> ids(N);
    for (int64_t i = 0; i < N; ++i) ids[i] = (i * 7 + i / 3) % V;
    embedding_forward(table.data(), ids.data(), out.data(), N, V, C, 3);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[i * C + c], table[ids[i] * C + c]) << i << "," << c;
  }
}

TEST(Embedding, BackwardAccumulatesRepeatedIdsDeterministically) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  for (int64_t C : {1, 17, 300}) {
    SCOPED_TRACE(::testing::Message() << "C=" << C);
    const int64_t V = 50, N = 2000;
    std::uniform_int_distribution<int64_t> id(0, V - 3);  // the last two rows are never used
    std::vector<int64_t> ids(N);
    for (int64_t& x : ids) x = id(rng);
    ids[0] = ids[1] = ids[2] = 4;  // repeats next to each other
    std::vector<float> dout(N * C), dtable0(V * C);
    for (float& x : dout) x = nd(rng);
    for (float& x : dtable0) x = nd(rng);  // an earlier gradient (a tied weight) to add to
    // want: the same additions in the same order (rows in increasing i), so exactly equal
    std::vector<float> want = dtable0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < C; ++c) want[ids[i] * C + c] += dout[i * C + c];
    std::vector<double> want64(dtable0.begin(), dtable0.end());
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < C; ++c) want64[ids[i] * C + c] += dout[i * C + c];
    for (int threads : {1, 2, 3}) {
      std::vector<float> got = dtable0;
      embedding_backward(ids.data(), dout.data(), got.data(), N, V, C, threads);
      EXPECT_TRUE(bitwise_equal(got, want)) << "threads=" << threads;
      EXPECT_TRUE(all_close(got, want64, 1e-4, 1e-5, "dtable vs float64"));
      for (int64_t c = 0; c < 2 * C; ++c) EXPECT_EQ(got[(V - 2) * C + c], dtable0[(V - 2) * C + c]);
    }
    // Two calls add both gradients (embedding and tied output projection).
    std::vector<float> twice = dtable0;
    embedding_backward(ids.data(), dout.data(), twice.data(), N, V, C, 2);
    embedding_backward(ids.data(), dout.data(), twice.data(), N, V, C, 2);
    std::vector<double> want_twice(V * C);
    for (int64_t k = 0; k < V * C; ++k) want_twice[k] = 2 * want64[k] - dtable0[k];
    EXPECT_TRUE(all_close(twice, want_twice, 1e-4, 1e-5, "dtable after two calls"));
  }
}

TEST(Embedding, CheckIds) {
  const std::vector<int64_t> ids{0, 3, -1, 5};
  EXPECT_EQ(embedding_check_ids(ids.data(), 4, 5), 2);
  EXPECT_EQ(embedding_check_ids(ids.data(), 2, 5), -1);
  EXPECT_EQ(embedding_check_ids(ids.data() + 3, 1, 5), 0);
  EXPECT_EQ(embedding_check_ids(ids.data() + 3, 1, 6), -1);
  EXPECT_EQ(embedding_check_ids(nullptr, 0, 5), -1);
}

}  // namespace
}  // namespace qkv::kernels
