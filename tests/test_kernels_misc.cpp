// Rotary position embedding, counter-based dropout, the Rng, the sinusoidal position encoding
// and the learning-rate schedules.
//
// Tolerances (|got - want| <= atol + rtol * |want|; a failure prints the worst element, its
// values, the bound it broke and the largest absolute error):
//   rope vs float64 reference           rtol 1.2e-7 (1 float ulp), atol 1e-8 (the angle's double
//                                        error, ~1e-16 * pos, times |x|)
//   rope inverse(forward(x)) vs x       atol 1e-6 * max(1, |x|)  (two roundings)
//   rope norm per head, adjoint         rtol 1e-6 on sums of squares / dot products (in double)
//   rope relative position              |dot(m + d, m) - dot(d, 0)| <= 1e-5 * |q| |k|
//   sinusoidal vs float64 formula       rtol 1e-6, atol 1e-7
//   schedules                           rtol 1e-14 where the value is a closed form, exact where
//                                        the definition gives exactly lr or min_lr
//   dropout, Rng                        exact (bitwise); statistics within 4 (dropout) or 5 (Rng)
//                                        standard deviations of their expectation
// Thread-count independence is bitwise everywhere (tolerance 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "error_testing.h"
#include "kernels/dropout.h"
#include "kernels/positional.h"
#include "kernels/rope.h"
#include "qkv/error.h"
#include "qkv/rng.h"
#include "qkv/schedule.h"

namespace qkv {
namespace {

using qkv::testing::error_of;

// ---------------------------------------------------------------------------------------------
// Helpers

std::vector<float> randn(int64_t n, std::mt19937& rng, float mean = 0.0f, float stddev = 1.0f) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// |got[k] - want[k]| <= atol + rtol * |want[k]| for every k. On failure: the worst element
// (largest error / bound), its values and bound, and the largest absolute error anywhere.
::testing::AssertionResult all_close(const std::string& what, const std::vector<float>& got,
                                     const std::vector<double>& want, double atol, double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, expected " << want.size();
  double worst_ratio = 0, max_err = 0;
  size_t worst = 0, max_err_at = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const double err = std::fabs(got[k] - want[k]);
    const double ratio = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / (atol + rtol * std::fabs(want[k]));
    if (ratio > worst_ratio) worst_ratio = ratio, worst = k;
    if (err > max_err || std::isnan(err)) max_err = err, max_err_at = k;
  }
  if (worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg.precision(10);
  msg << what << ": worst at [" << worst << "] got " << got[worst] << " want " << want[worst] << " |err| "
      << std::fabs(got[worst] - want[worst]) << " > bound " << atol + rtol * std::fabs(want[worst]) << " (atol "
      << atol << ", rtol " << rtol << "); largest |err| " << max_err << " at [" << max_err_at << "] over "
      << got.size() << " elements";
  return ::testing::AssertionFailure() << msg.str();
}

// |count - n q| <= sigmas * sqrt(n q (1 - q)): a binomial count near its expectation.
::testing::AssertionResult binomial_near(const std::string& what, int64_t count, int64_t n, double q,
                                         double sigmas) {
  const double expect = static_cast<double>(n) * q, sd = std::sqrt(static_cast<double>(n) * q * (1 - q));
  const double z = (static_cast<double>(count) - expect) / sd;
  if (std::fabs(z) <= sigmas) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << count << " of " << n << ", expected " << expect << " +- "
                                       << sigmas << " x " << sd << " (z = " << z << ")";
}

// ---------------------------------------------------------------------------------------------
// RoPE

struct RopeCase {
  int64_t B, T, H, D;
  int64_t gap;  // row_stride = H * D + gap
  int64_t pos_offset;
  double theta;
};

std::string describe(const RopeCase& c) {
  std::ostringstream s;
  s << "B=" << c.B << " T=" << c.T << " H=" << c.H << " D=" << c.D << " gap=" << c.gap << " pos_offset=" << c.pos_offset
    << " theta=" << c.theta;
  return s.str();
}

// y = R(pos) x in double, with the frequency written as exp(-(2i/D) log theta) (not the kernel's pow).
std::vector<double> rope_ref(const std::vector<float>& x, const RopeCase& c, bool inverse) {
  std::vector<double> y(x.begin(), x.end());
  const int64_t stride = c.H * c.D + c.gap, half = c.D / 2;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t) {
      const double pos = static_cast<double>(c.pos_offset + t);
      for (int64_t h = 0; h < c.H; ++h) {
        const int64_t base = (b * c.T + t) * stride + h * c.D;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = (inverse ? -pos : pos) * std::exp(-(2.0 * i / c.D) * std::log(c.theta));
          const double a = x[base + i], e = x[base + i + half];
          y[base + i] = a * std::cos(angle) - e * std::sin(angle);
          y[base + i + half] = e * std::cos(angle) + a * std::sin(angle);
        }
      }
    }
  return y;
}

std::vector<float> rope_run(std::vector<float> x, const RopeCase& c, bool inverse, int threads) {
  kernels::rope_apply(x.data(), c.B, c.T, c.H, c.D, c.H * c.D + c.gap, c.pos_offset, c.theta, inverse, threads);
  return x;
}

const RopeCase kRopeCases[] = {
    {2, 5, 3, 8, 0, 0, 10000.0},
    {1, 17, 2, 64, 0, 100, 10000.0},
    {3, 33, 4, 128, 0, 4093, 500000.0},  // LLaMA-3's theta
    {2, 7, 1, 2, 0, 0, 10000.0},         // one pair per head
    {1, 3, 2, 6, 0, 123456, 10000.0},    // odd half
    {2, 40, 8, 256, 0, 0, 10000.0},      // above the parallel threshold; 128 pairs = two chunks
    {2, 9, 3, 200, 0, 7, 10000.0},       // 100 pairs: a partial second chunk
    {1, 4, 2, 16, 0, 1000000, 10000.0},  // a large position
    {2, 6, 3, 10, 5, 11, 10000.0},       // strided rows
};

TEST(Rope, MatchesDoubleReference) {
  uint32_t seed = 1;
  for (const RopeCase& c : kRopeCases) {
    SCOPED_TRACE(describe(c));
    std::mt19937 rng(seed++);
    const std::vector<float> x = randn(c.B * c.T * (c.H * c.D + c.gap), rng);
    for (bool inverse : {false, true}) {
      SCOPED_TRACE(inverse ? "inverse" : "forward");
      EXPECT_TRUE(all_close("rope y", rope_run(x, c, inverse, 2), rope_ref(x, c, inverse), 1e-8, 1.2e-7));
    }
  }
}

// The kernel against hand-computed values: D = 4, position 1, theta = 100: angles 1 and 0.1.
TEST(Rope, PinnedValues) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  kernels::rope_apply(x.data(), 1, 1, 1, 4, 4, /*pos_offset=*/1, 100.0, false, 1);
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.1), s2 = std::sin(0.1);
  const std::vector<double> want = {1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2};
  EXPECT_TRUE(all_close("rope pinned", x, want, 0, 1.2e-7));
}

TEST(Rope, InverseUndoesForwardAndIsTheAdjoint) {
  uint32_t seed = 50;
  for (const RopeCase& c : kRopeCases) {
    SCOPED_TRACE(describe(c));
    std::mt19937 rng(seed++);
    const int64_t n = c.B * c.T * (c.H * c.D + c.gap);
    const std::vector<float> x = randn(n, rng), dy = randn(n, rng);
    const std::vector<float> back = rope_run(rope_run(x, c, false, 2), c, true, 2);
    for (int64_t k = 0; k < n; ++k)
      ASSERT_NEAR(back[k], x[k], 1e-6 * std::max(1.0f, std::fabs(x[k]))) << "element " << k;
    // <R x, dy> == <x, R^T dy>: the inverse is the backward pass.
    const std::vector<float> rx = rope_run(x, c, false, 2), rtdy = rope_run(dy, c, true, 2);
    double lhs = 0, rhs = 0, scale = 0;
    for (int64_t k = 0; k < n; ++k) {
      lhs += static_cast<double>(rx[k]) * dy[k];
      rhs += static_cast<double>(x[k]) * rtdy[k];
      scale += std::fabs(static_cast<double>(x[k]) * dy[k]);
    }
    EXPECT_NEAR(lhs, rhs, 1e-6 * scale);
  }
}

TEST(Rope, PreservesNormPerHead) {
  const RopeCase c{2, 20, 4, 64, 3, 1000, 10000.0};
  std::mt19937 rng(60);
  const int64_t stride = c.H * c.D + c.gap;
  const std::vector<float> x = randn(c.B * c.T * stride, rng, 0.5f, 2.0f);
  for (bool inverse : {false, true}) {
    const std::vector<float> y = rope_run(x, c, inverse, 2);
    for (int64_t r = 0; r < c.B * c.T; ++r)
      for (int64_t h = 0; h < c.H; ++h) {
        double nx = 0, ny = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          const int64_t k = r * stride + h * c.D + d;
          nx += static_cast<double>(x[k]) * x[k];
          ny += static_cast<double>(y[k]) * y[k];
        }
        ASSERT_NEAR(ny, nx, 1e-6 * nx) << "row " << r << " head " << h << (inverse ? " inverse" : "");
      }
  }
}

// Position 0 rotates by angle 0: cos = 1 and sin = 0 exactly, so row 0 comes back bitwise; row 1
// (position 1) does not.
TEST(Rope, PositionZeroIsIdentity) {
  const RopeCase c{3, 2, 2, 32, 0, 0, 10000.0};
  std::mt19937 rng(70);
  const int64_t row = c.H * c.D;
  const std::vector<float> x = randn(c.B * c.T * row, rng);
  for (bool inverse : {false, true}) {
    const std::vector<float> y = rope_run(x, c, inverse, 2);
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t r0 = b * c.T * row, r1 = r0 + row;
      EXPECT_EQ(std::memcmp(&x[r0], &y[r0], row * sizeof(float)), 0) << "b=" << b << " position 0 changed";
      EXPECT_NE(std::memcmp(&x[r1], &y[r1], row * sizeof(float)), 0) << "b=" << b << " position 1 unchanged";
    }
  }
}

// dot(rope(q, m), rope(k, n)) depends only on m - n, and does depend on it.
TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const int64_t D = 64;
  std::mt19937 rng(80);
  const std::vector<float> q = randn(D, rng), k = randn(D, rng);
  double qn = 0, kn = 0;
  for (int64_t d = 0; d < D; ++d) qn += static_cast<double>(q[d]) * q[d], kn += static_cast<double>(k[d]) * k[d];
  const double scale = std::sqrt(qn * kn);
  auto rotated_dot = [&](int64_t m, int64_t n) {
    std::vector<float> qm = q, kn_ = k;
    kernels::rope_apply(qm.data(), 1, 1, 1, D, D, m, 10000.0, false, 1);
    kernels::rope_apply(kn_.data(), 1, 1, 1, D, D, n, 10000.0, false, 1);
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(qm[d]) * kn_[d];
    return s;
  };
  std::vector<double> by_delta;
  for (int64_t delta : {0, 1, 3, -7, 100}) {
    const double at_origin = delta >= 0 ? rotated_dot(delta, 0) : rotated_dot(0, -delta);
    by_delta.push_back(at_origin);
    for (int64_t base : {5, 1000, 50000}) {
      const double got = rotated_dot(base + delta, base);
      EXPECT_NEAR(got, at_origin, 1e-5 * scale) << "m - n = " << delta << ", n = " << base;
    }
  }
  for (size_t a = 1; a < by_delta.size(); ++a)
    EXPECT_GT(std::fabs(by_delta[a] - by_delta[0]), 1e-3 * scale) << "delta index " << a << " gives the delta-0 dot";
}

TEST(Rope, BitwiseIdenticalForAnyThreadCount) {
  const RopeCase cases[] = {
      {3, 50, 4, 96, 0, 17, 10000.0},   // many positions
      {64, 1, 8, 64, 0, 900, 10000.0},  // decode: one position, split over the batch
      {5, 3, 2, 130, 7, 2, 10000.0},    // strided, below the parallel threshold
  };
  uint32_t seed = 90;
  for (const RopeCase& c : cases) {
    SCOPED_TRACE(describe(c));
    std::mt19937 rng(seed++);
    const std::vector<float> x = randn(c.B * c.T * (c.H * c.D + c.gap), rng);
    for (bool inverse : {false, true}) {
      const std::vector<float> y1 = rope_run(x, c, inverse, 1);
      EXPECT_FALSE(bitwise_equal(y1, x));
      for (int threads : {2, 3, 7}) EXPECT_TRUE(bitwise_equal(rope_run(x, c, inverse, threads), y1)) << threads;
    }
  }
}

// Rows with row_stride > H * D: the heads rotate exactly as in a contiguous layout, and the
// gap columns are never written (sentinels survive bitwise, NaN payload included).
TEST(Rope, StridedRowsLeaveGapUntouched) {
  const int64_t B = 2, T = 9, H = 3, D = 16, gap = 5, row = H * D, stride = row + gap;
  std::mt19937 rng(100);
  const std::vector<float> dense = randn(B * T * row, rng);
  const float sentinel = std::bit_cast<float>(0x7fc01234u);
  std::vector<float> strided(B * T * stride, sentinel);
  for (int64_t r = 0; r < B * T; ++r) std::copy_n(&dense[r * row], row, &strided[r * stride]);
  for (bool inverse : {false, true})
    for (int threads : {1, 3}) {
      std::vector<float> d = dense, s = strided;
      kernels::rope_apply(d.data(), B, T, H, D, row, 3, 10000.0, inverse, threads);
      kernels::rope_apply(s.data(), B, T, H, D, stride, 3, 10000.0, inverse, threads);
      for (int64_t r = 0; r < B * T; ++r) {
        EXPECT_EQ(std::memcmp(&s[r * stride], &d[r * row], row * sizeof(float)), 0) << "row " << r;
        for (int64_t j = row; j < stride; ++j)
          EXPECT_EQ(std::bit_cast<uint32_t>(s[r * stride + j]), 0x7fc01234u) << "row " << r << " gap column " << j;
      }
    }
}

TEST(Rope, EmptyInputs) {
  kernels::rope_apply(nullptr, 0, 5, 2, 8, 16, 0, 10000.0, false, 3);
  kernels::rope_apply(nullptr, 2, 0, 2, 8, 16, 0, 10000.0, true, 3);
  kernels::rope_apply(nullptr, 2, 5, 0, 8, 16, 0, 10000.0, false, 3);
  float x[4] = {1, 2, 3, 4};
  kernels::rope_apply(x, 1, 1, 2, 0, 4, 5, 10000.0, false, 3);  // D == 0: the row's 4 floats are gap
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[3], 4.0f);
}

// ---------------------------------------------------------------------------------------------
// Dropout

std::vector<float> dropout_run(const std::vector<float>& x, float p, uint64_t seed, uint64_t stream, int threads,
                               bool backward = false) {
  std::vector<float> y(x.size());
  const int64_t n = static_cast<int64_t>(x.size());
  if (backward)
    kernels::dropout_backward(x.data(), y.data(), n, p, seed, stream, threads);
  else
    kernels::dropout_forward(x.data(), y.data(), n, p, seed, stream, threads);
  return y;
}

int64_t count_nonzero(const std::vector<float>& v) {
  return std::count_if(v.begin(), v.end(), [](float f) { return f != 0.0f; });
}

TEST(Dropout, KeptFractionNearOneMinusP) {
  const int64_t n = 1000000;
  const std::vector<float> ones(n, 1.0f);
  uint64_t stream = 0;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    const std::vector<float> y = dropout_run(ones, p, 1234, stream++, 2);
    const float scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(p)));
    EXPECT_EQ(kernels::dropout_scale(p), scale);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(y[i] == 0.0f || y[i] == scale) << "element " << i << " = " << y[i];
    EXPECT_TRUE(binomial_near("kept", count_nonzero(y), n, 1.0 - p, 4.0));
    // Neighbours are independent: both of (2j, 2j + 1) kept with probability (1 - p)^2.
    int64_t both = 0;
    for (int64_t j = 0; j < n / 2; ++j) both += y[2 * j] != 0.0f && y[2 * j + 1] != 0.0f;
    EXPECT_TRUE(binomial_near("adjacent pairs both kept", both, n / 2, (1.0 - p) * (1.0 - p), 4.0));
  }
}

// Each output is exactly x_i * float(1 / (1 - p)) or +0, as dropout_bits decides.
TEST(Dropout, KeptValuesAndMaskAreExactlyAsDocumented) {
  const int64_t n = 50000;
  std::mt19937 rng(200);
  const std::vector<float> x = randn(n, rng);
  for (float p : {0.1f, 0.3f, 0.5f}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    const float scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(p)));
    const uint64_t threshold = static_cast<uint64_t>(std::ceil(static_cast<double>(p) * 4294967296.0));
    const std::vector<float> y = dropout_run(x, p, 77, 5, 2);
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = kernels::dropout_bits(77, 5, static_cast<uint64_t>(i)) >= threshold;
      const float want = keep ? x[i] * scale : 0.0f;
      ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want)) << "element " << i;
    }
  }
  // A dropped inf or NaN gives +0; a kept one passes through.
  const std::vector<float> odd = {INFINITY, -INFINITY, NAN, NAN, INFINITY, NAN, -INFINITY, NAN};
  const std::vector<float> y = dropout_run(odd, 0.5f, 3, 0, 1);
  int dropped = 0;
  for (size_t i = 0; i < odd.size(); ++i) {
    if (y[i] == 0.0f) {
      EXPECT_FALSE(std::signbit(y[i]));
      ++dropped;
    } else {
      EXPECT_EQ(std::isnan(y[i]), std::isnan(odd[i]));
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, 8);
}

TEST(Dropout, BackwardRegeneratesTheForwardMask) {
  const int64_t n = 100000;
  std::mt19937 rng(210);
  const std::vector<float> x = randn(n, rng), dy = randn(n, rng);
  const float p = 0.3f, scale = kernels::dropout_scale(p);
  const std::vector<float> y = dropout_run(x, p, 9, 4, 2), dx = dropout_run(dy, p, 9, 4, 2, /*backward=*/true);
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = y[i] != 0.0f;
    ASSERT_EQ(dx[i] != 0.0f, kept) << "element " << i;
    if (kept) {
      ASSERT_EQ(dx[i], dy[i] * scale) << "element " << i;
    }
  }
  // In place (y == x, dx == dy) gives the same results.
  std::vector<float> xi = x, dyi = dy;
  kernels::dropout_forward(xi.data(), xi.data(), n, p, 9, 4, 2);
  kernels::dropout_backward(dyi.data(), dyi.data(), n, p, 9, 4, 2);
  EXPECT_TRUE(bitwise_equal(xi, y));
  EXPECT_TRUE(bitwise_equal(dyi, dx));
}

// Other streams and other seeds give other masks, disagreeing on about 2 p (1 - p) of the elements.
TEST(Dropout, StreamsAndSeedsGiveDifferentMasks) {
  const int64_t n = 200000;
  const float p = 0.5f;
  const std::vector<float> ones(n, 1.0f);
  const std::vector<float> base = dropout_run(ones, p, 42, 0, 2);
  const std::vector<std::pair<uint64_t, uint64_t>> others = {{42, 1}, {42, 2}, {43, 0}, {0, 0}, {1, 42}, {42, ~0ULL}};
  for (auto [seed, stream] : others) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " stream " + std::to_string(stream));
    const std::vector<float> y = dropout_run(ones, p, seed, stream, 2);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += (y[i] != 0.0f) != (base[i] != 0.0f);
    EXPECT_TRUE(binomial_near("masks disagree", differ, n, 2 * p * (1 - p), 4.0));
  }
}

TEST(Dropout, BitwiseIdenticalForAnyThreadCount) {
  const int64_t n = 100003;
  std::mt19937 rng(220);
  const std::vector<float> x = randn(n, rng);
  for (bool backward : {false, true}) {
    const std::vector<float> y1 = dropout_run(x, 0.25f, 5, 6, 1, backward);
    for (int threads : {2, 3, 8}) EXPECT_TRUE(bitwise_equal(dropout_run(x, 0.25f, 5, 6, threads, backward), y1));
  }
}

TEST(Dropout, PZeroCopies) {
  std::mt19937 rng(230);
  std::vector<float> x = randn(40000, rng);
  x[0] = -0.0f;
  x[1] = std::bit_cast<float>(0x7fc0beefu);  // a NaN with a payload
  x[2] = INFINITY;
  for (bool backward : {false, true}) {
    EXPECT_TRUE(bitwise_equal(dropout_run(x, 0.0f, 1, 2, 2, backward), x));
    std::vector<float> in_place = x;
    if (backward)
      kernels::dropout_backward(in_place.data(), in_place.data(), 40000, 0.0f, 1, 2, 2);
    else
      kernels::dropout_forward(in_place.data(), in_place.data(), 40000, 0.0f, 1, 2, 2);
    EXPECT_TRUE(bitwise_equal(in_place, x));
  }
  kernels::dropout_forward(nullptr, nullptr, 0, 0.5f, 1, 2, 2);
  kernels::dropout_backward(nullptr, nullptr, 0, 0.0f, 1, 2, 2);
}

// The mask generator, pinned: a change here changes every dropout mask (and a resumed run's
// masks no longer match the original's). Values from an independent Python transcription.
TEST(Dropout, GoldenBits) {
  const uint32_t s0[] = {0x737e3392u, 0xc3d892a4u, 0x4ae68a86u, 0x3c883809u, 0xe866e32du, 0x9c4b2e46u};
  const uint32_t s7[] = {0x0e387594u, 0xdce31467u, 0x9ab3f940u, 0x49f4446au, 0x4d1dbfa4u, 0x1fd1f446u};
  for (uint64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(kernels::dropout_bits(42, 0, i), s0[i]) << i;
    EXPECT_EQ(kernels::dropout_bits(42, 7, i), s7[i]) << i;
  }
  EXPECT_EQ(kernels::dropout_bits(42, 0, 1000000), 0x7bdd9235u);
}

// ---------------------------------------------------------------------------------------------
// Rng

// xoshiro256** from the state {1, 2, 3, 4}: the published reference outputs (the same vector is
// in rand_xoshiro's tests), so the generator itself is checked against its authors' code.
TEST(Rng, MatchesXoshiroReferenceVector) {
  Rng r;
  r.set_state({{1, 2, 3, 4}, false, 0.0});
  const uint64_t want[] = {11520ULL,
                           0ULL,
                           1509978240ULL,
                           1215971899390074240ULL,
                           1216172134540287360ULL,
                           607988272756665600ULL,
                           16172922978634559625ULL,
                           8476171486693032832ULL,
                           10595114339597558777ULL,
                           2904607092377533576ULL};
  for (uint64_t w : want) EXPECT_EQ(r.next_u64(), w);
}

// Seed 42 through SplitMix64, pinned (an independent Python transcription gives the same).
TEST(Rng, GoldenValuesForSeed42) {
  Rng r(42);
  EXPECT_EQ(r.next_u64(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(r.next_u64(), 0x6104d9866d113a7eULL);
  EXPECT_EQ(r.next_u64(), 0xae17533239e499a1ULL);
  EXPECT_EQ(r.next_u64(), 0xecb8ad4703b360a1ULL);
  Rng u(42);
  EXPECT_EQ(u.uniform(), 0.08386297105988216);
  EXPECT_EQ(u.uniform(), 0.3789802506626686);
  // Box-Muller on the same two uniforms; libm's log / cos / sin may differ in the last bit.
  Rng g(42);
  EXPECT_NEAR(g.normal(), -0.303263064678738, 1e-15);
  EXPECT_NEAR(g.normal(), 0.28846173882942383, 1e-15);
}

TEST(Rng, SameSeedSameSequenceDifferentSeedsDiffer) {
  Rng a(123), b(123);
  for (int k = 0; k < 1000; ++k) {
    ASSERT_EQ(a.next_u64(), b.next_u64()) << k;
    ASSERT_EQ(a.uniform(), b.uniform()) << k;
    ASSERT_EQ(a.normal(), b.normal()) << k;
    ASSERT_EQ(a.below(1000), b.below(1000)) << k;
  }
  std::set<uint64_t> firsts;
  const uint64_t seeds[] = {0, 1, 2, 42, 43, 1ULL << 63, ~0ULL};
  for (uint64_t seed : seeds) {
    Rng r(seed);
    for (int k = 0; k < 4; ++k) firsts.insert(r.next_u64());
  }
  EXPECT_EQ(firsts.size(), 4 * std::size(seeds));
  EXPECT_NE(Rng().next_u64(), Rng(1).next_u64());
}

TEST(Rng, StateSaveRestoreReproducesTheContinuation) {
  Rng r(7);
  for (int k = 0; k < 10; ++k) r.next_u64();
  r.normal();  // leaves the spare pending
  const Rng::State st = r.state();
  EXPECT_TRUE(st.has_spare);
  auto draw = [](Rng& g) {
    std::vector<double> v;
    for (int k = 0; k < 5; ++k) {
      v.push_back(g.normal());
      v.push_back(static_cast<double>(g.next_u64()));
      v.push_back(g.uniform());
      v.push_back(static_cast<double>(g.below(17)));
    }
    return v;
  };
  const std::vector<double> first = draw(r);
  r.set_state(st);
  EXPECT_EQ(draw(r), first);
  Rng other(999);
  other.set_state(st);
  EXPECT_EQ(draw(other), first);
  // The pending spare is part of the state: dropping it shifts the normals.
  Rng::State no_spare = st;
  no_spare.has_spare = false;
  Rng shifted(0);
  shifted.set_state(no_spare);
  EXPECT_NE(shifted.normal(), first[0]);

  // state() reports the same State at the same point of the stream, whatever got it there:
  // two normals (a pair and its spare) consume the same two words as two next_u64().
  Rng c(8), d(8);
  c.normal();
  c.normal();
  d.next_u64();
  d.next_u64();
  const Rng::State sc = c.state(), sd = d.state();
  EXPECT_EQ(std::memcmp(sc.s, sd.s, sizeof sc.s), 0);
  EXPECT_FALSE(sc.has_spare);
  EXPECT_EQ(sc.spare, sd.spare);

  EXPECT_NE(error_of([] { Rng().set_state({{0, 0, 0, 0}, false, 0.0}); }).find("all zero"), std::string::npos);
}

TEST(Rng, UniformAndNormalMoments) {
  const int64_t n = 1000000;
  Rng r(2024);
  double s1 = 0, s2 = 0, lo = 1, hi = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double u = r.uniform();
    s1 += u, s2 += u * u;
    lo = std::min(lo, u), hi = std::max(hi, u);
  }
  EXPECT_GE(lo, 0.0);
  EXPECT_LT(hi, 1.0);
  const double nd = static_cast<double>(n);
  double mean = s1 / nd, var = s2 / nd - mean * mean;
  // U(0, 1): mean 1/2, variance 1/12; var(sample variance) ~ (mu4 - sigma^4) / n = (1/80 - 1/144) / n
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / nd));
  EXPECT_NEAR(var, 1.0 / 12, 5 * std::sqrt((1.0 / 80 - 1.0 / 144) / nd));

  s1 = s2 = 0;
  int64_t within_one = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double z = r.normal();
    s1 += z, s2 += z * z;
    within_one += std::fabs(z) < 1.0;
  }
  mean = s1 / nd, var = s2 / nd - mean * mean;
  // N(0, 1): mean 0 +- 1/sqrt(n), variance 1 +- sqrt(2/n); P(|z| < 1) = erf(1/sqrt(2))
  EXPECT_NEAR(mean, 0.0, 5 / std::sqrt(nd));
  EXPECT_NEAR(var, 1.0, 5 * std::sqrt(2.0 / nd));
  EXPECT_TRUE(binomial_near("|z| < 1", within_one, n, std::erf(1.0 / std::sqrt(2.0)), 5.0));
}

TEST(Rng, BelowIsUniformAndInRange) {
  Rng r(31);
  for (uint64_t n : {1ULL, 2ULL, 3ULL, 7ULL, 10ULL}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const int64_t draws = 100000;
    std::vector<int64_t> counts(n, 0);
    for (int64_t k = 0; k < draws; ++k) {
      const uint64_t v = r.below(n);
      ASSERT_LT(v, n);
      ++counts[v];
    }
    // Pearson's chi-square with n - 1 degrees of freedom: mean n - 1, sd sqrt(2 (n - 1)).
    const double expect = static_cast<double>(draws) / static_cast<double>(n);
    double chi2 = 0;
    for (int64_t c : counts) chi2 += (c - expect) * (c - expect) / expect;
    const double dof = static_cast<double>(n - 1);
    EXPECT_LE(chi2, dof + 5 * std::sqrt(2 * dof)) << "chi-square";
  }
  // n = 3 * 2^62: x mod n without rejection would give [0, 2^62) half the time instead of a third.
  const uint64_t big = 3ULL << 62;
  int64_t low = 0;
  for (int k = 0; k < 100000; ++k) {
    const uint64_t v = r.below(big);
    ASSERT_LT(v, big);
    low += v < (1ULL << 62);
  }
  EXPECT_TRUE(binomial_near("below(3 * 2^62) < 2^62", low, 100000, 1.0 / 3.0, 5.0));
  for (uint64_t n : {(1ULL << 63) + 1, ~0ULL})
    for (int k = 0; k < 1000; ++k) ASSERT_LT(r.below(n), n);
  EXPECT_NE(error_of([&] { r.below(0); }).find("n = 0"), std::string::npos);
}

TEST(Rng, FillsConsumeTheStreamInIndexOrder) {
  const int64_t n = 1001;  // odd: the fill ends with a spare normal pending
  Rng a(5), b(5);
  std::vector<float> out(n);
  a.fill_normal(out.data(), n, 0.5, 0.02);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<float>(0.5 + 0.02 * b.normal())) << i;
  EXPECT_EQ(a.normal(), b.normal());
  a.fill_uniform(out.data(), n, -0.25, 0.75);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], static_cast<float>(-0.25 + 1.0 * b.uniform())) << i;
    ASSERT_GE(out[i], -0.25f);
    ASSERT_LE(out[i], 0.75f);
  }
  EXPECT_EQ(a.next_u64(), b.next_u64());

  std::vector<float> zeros(4, 1.0f);
  a.fill_normal(zeros.data(), 4, 0.0, 0.0);  // std 0: the mean, exactly
  for (float z : zeros) EXPECT_EQ(z, 0.0f);

  EXPECT_NE(error_of([&] { a.fill_normal(out.data(), 1, 0.0, -1.0); }).find("std = -1"), std::string::npos);
  EXPECT_NE(error_of([&] { a.fill_normal(out.data(), 1, NAN, 1.0); }).find("mean = nan"), std::string::npos);
  EXPECT_NE(error_of([&] { a.fill_uniform(out.data(), 1, 1.0, 0.0); }).find("lo <= hi"), std::string::npos);
  EXPECT_NE(error_of([&] { a.fill_uniform(out.data(), 1, -1e308, 1e308); }).find("hi - lo"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Sinusoidal positions

// PE[t][j] from an independent double formula: angle = pos * exp(-(2i / D) ln 10000), j = 2i or 2i + 1.
std::vector<double> sinusoidal_ref(int64_t T, int64_t D, int64_t pos_offset) {
  std::vector<double> pe(T * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < D; ++j) {
      const int64_t two_i = j - j % 2;
      const double angle = static_cast<double>(pos_offset + t) * std::exp(-(static_cast<double>(two_i) / D) * std::log(10000.0));
      pe[t * D + j] = j % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  return pe;
}

std::vector<float> sinusoidal_run(int64_t T, int64_t D, int64_t pos_offset) {
  std::vector<float> out(T * D, NAN);
  kernels::sinusoidal_positions(out.data(), T, D, pos_offset);
  return out;
}

TEST(Sinusoidal, RowZeroIsZeroOneAlternating) {
  for (int64_t D : {8, 7, 1, 512}) {
    const std::vector<float> pe = sinusoidal_run(3, D, 0);
    for (int64_t j = 0; j < D; ++j) EXPECT_EQ(pe[j], j % 2 == 0 ? 0.0f : 1.0f) << "D=" << D << " column " << j;
  }
}

TEST(Sinusoidal, MatchesDoubleFormula) {
  const int64_t T = 2048, D = 512;
  EXPECT_TRUE(all_close("sinusoidal", sinusoidal_run(T, D, 0), sinusoidal_ref(T, D, 0), 1e-7, 1e-6));
  // Pinned by hand: PE[1][0] = sin(1), PE[1][1] = cos(1), PE[3][2] = sin(3 / 10000^(2/512)).
  const std::vector<float> pe = sinusoidal_run(4, D, 0);
  EXPECT_EQ(pe[1 * D + 0], static_cast<float>(std::sin(1.0)));
  EXPECT_EQ(pe[1 * D + 1], static_cast<float>(std::cos(1.0)));
  EXPECT_NEAR(pe[3 * D + 2], std::sin(3.0 / std::pow(10000.0, 2.0 / 512)), 1e-7);
}

TEST(Sinusoidal, PosOffsetShiftsRows) {
  const int64_t D = 64;
  const std::vector<float> full = sinusoidal_run(12, D, 0), tail = sinusoidal_run(5, D, 7);
  EXPECT_EQ(std::memcmp(&full[7 * D], tail.data(), 5 * D * sizeof(float)), 0);
  for (int64_t offset : {-5, 1000000}) {
    SCOPED_TRACE("pos_offset " + std::to_string(offset));
    EXPECT_TRUE(all_close("shifted", sinusoidal_run(6, D, offset), sinusoidal_ref(6, D, offset), 1e-7, 1e-6));
  }
}

// Odd D: columns pair up as (0, 1), (2, 3), ..., and the last column is the sin of frequency (D - 1) / D.
TEST(Sinusoidal, OddDimension) {
  for (int64_t D : {1, 7, 33}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    const std::vector<float> pe = sinusoidal_run(50, D, 3);
    EXPECT_TRUE(all_close("odd D", pe, sinusoidal_ref(50, D, 3), 1e-7, 1e-6));
    const double last_angle = 10.0 / std::pow(10000.0, static_cast<double>(D - 1) / static_cast<double>(D));
    EXPECT_NEAR(pe[7 * D + D - 1], std::sin(last_angle), 1e-7);  // row 7 is position 10
  }
  kernels::sinusoidal_positions(nullptr, 0, 8, 0);
  kernels::sinusoidal_positions(nullptr, 8, 0, 0);
}

// Split-half (Hugging Face Marian): sines of every frequency first, then the cosines, written here
// as HF builds it: position_enc[pos][j] = pos / 10000^(2 (j // 2) / D) for j in [0, D); the sines
// of the even j fill columns [0, ceil(D/2)), the cosines of the odd j the rest.
TEST(Sinusoidal, SplitHalfLayoutIsHuggingFacesMarian) {
  for (int64_t D : {8, 7, 1, 512}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    const int64_t T = 40, offset = 3, h = (D + 1) / 2;
    std::vector<float> out(T * D, NAN);
    kernels::sinusoidal_positions(out.data(), T, D, offset, kernels::SinusoidalLayout::SplitHalf);
    std::vector<double> ref(T * D);
    for (int64_t t = 0; t < T; ++t) {
      int64_t sin_col = 0, cos_col = h;
      for (int64_t j = 0; j < D; ++j) {
        const double enc = static_cast<double>(offset + t) / std::pow(10000.0, 2.0 * static_cast<double>(j / 2) / D);
        if (j % 2 == 0) {
          ref[t * D + sin_col++] = std::sin(enc);
        } else {
          ref[t * D + cos_col++] = std::cos(enc);
        }
      }
    }
    EXPECT_TRUE(all_close("split half", out, ref, 1e-7, 1e-6));
    // the interleaved layout holds the same numbers, columns permuted
    const std::vector<float> inter = sinusoidal_run(T, D, offset);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < h; ++i) {
        ASSERT_EQ(out[t * D + i], inter[t * D + 2 * i]);
        if (h + i < D) {
          ASSERT_EQ(out[t * D + h + i], inter[t * D + 2 * i + 1]);
        }
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Learning-rate schedules

TEST(Schedule, InverseSqrt2017Formula) {
  Schedule s;
  s.kind = ScheduleKind::InverseSqrt;
  s.lr = 1.0;
  s.warmup = 4000;
  s.d_model = 512;
  const double peak = 1.0 / std::sqrt(512.0) / std::sqrt(4000.0);
  EXPECT_NEAR(learning_rate(s, 4000), peak, 1e-14 * peak);
  EXPECT_NEAR(learning_rate(s, 4000), 7.0e-4, 2e-5);
  EXPECT_NEAR(learning_rate(s, 1), 1.0 / std::sqrt(512.0) * std::pow(4000.0, -1.5), 1e-14 * peak);
  EXPECT_NEAR(learning_rate(s, 16000), peak / 2, 1e-14 * peak);
  for (int64_t step = 2; step <= 4000; ++step) ASSERT_GT(learning_rate(s, step), learning_rate(s, step - 1)) << step;
  for (int64_t step = 4001; step <= 20000; ++step) ASSERT_LT(learning_rate(s, step), learning_rate(s, step - 1)) << step;
  s.lr = 2.0;  // lr multiplies the formula
  EXPECT_NEAR(learning_rate(s, 4000), 2 * peak, 2e-14 * peak);
}

TEST(Schedule, InverseSqrtWithoutDModelPeaksAtLr) {
  Schedule s;
  s.kind = ScheduleKind::InverseSqrt;
  s.lr = 5e-4;
  s.warmup = 100;
  EXPECT_EQ(learning_rate(s, 100), 5e-4);
  EXPECT_NEAR(learning_rate(s, 1), 5e-6, 1e-20);
  EXPECT_NEAR(learning_rate(s, 50), 2.5e-4, 1e-18);
  EXPECT_NEAR(learning_rate(s, 400), 2.5e-4, 1e-18);
  EXPECT_NEAR(learning_rate(s, 10000), 5e-5, 1e-18);
}

TEST(Schedule, WarmupCosineEndpointsAndMidpoint) {
  Schedule s;
  s.kind = ScheduleKind::WarmupCosine;
  s.lr = 1e-3;
  s.min_lr = 1e-5;
  s.warmup = 100;
  s.total = 1100;
  EXPECT_EQ(learning_rate(s, 100), 1e-3);
  EXPECT_EQ(learning_rate(s, 1100), 1e-5);
  EXPECT_EQ(learning_rate(s, 5000), 1e-5);
  EXPECT_NEAR(learning_rate(s, 600), (1e-3 + 1e-5) / 2, 1e-14 * 1e-3);
  EXPECT_NEAR(learning_rate(s, 50), 5e-4, 1e-18);
  EXPECT_NEAR(learning_rate(s, 1), 1e-5, 1e-18);
  EXPECT_NEAR(learning_rate(s, 350), 1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + std::cos(std::numbers::pi / 4)), 1e-17);
  for (int64_t step = 101; step <= 1100; ++step) ASSERT_LT(learning_rate(s, step), learning_rate(s, step - 1)) << step;
  // No warmup: step 1 is already into the decay. total == warmup: the warmup, then the floor.
  s.warmup = 0;
  EXPECT_NEAR(learning_rate(s, 1), 1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + std::cos(std::numbers::pi / 1100)), 1e-17);
  s.warmup = s.total = 10;
  EXPECT_EQ(learning_rate(s, 10), 1e-3);
  EXPECT_EQ(learning_rate(s, 11), 1e-5);
}

TEST(Schedule, ConstantWithAndWithoutWarmup) {
  Schedule s;  // Constant, lr 1e-3, no warmup
  EXPECT_EQ(learning_rate(s, 1), 1e-3);
  EXPECT_EQ(learning_rate(s, 1000000), 1e-3);
  s.lr = 3e-4;
  s.warmup = 10;
  EXPECT_NEAR(learning_rate(s, 1), 3e-5, 1e-19);
  EXPECT_NEAR(learning_rate(s, 5), 1.5e-4, 1e-19);
  EXPECT_EQ(learning_rate(s, 10), 3e-4);
  EXPECT_EQ(learning_rate(s, 11), 3e-4);
  EXPECT_EQ(learning_rate(s, 1000000), 3e-4);
}

TEST(Schedule, ValidationNamesTheField) {
  auto message = [](Schedule s, int64_t step = 1) { return error_of([&] { learning_rate(s, step); }); };
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                                : ::testing::AssertionFailure() << "'" << msg << "' lacks '" << part << "'";
  };
  Schedule s;
  s.lr = -1;
  EXPECT_TRUE(has(message(s), "lr = -1"));
  s.lr = NAN;
  EXPECT_TRUE(has(message(s), "lr = nan"));
  s = Schedule{};
  s.warmup = -1;
  EXPECT_TRUE(has(message(s), "warmup = -1"));
  s = Schedule{};
  s.d_model = -512;
  EXPECT_TRUE(has(message(s), "d_model = -512"));
  s = Schedule{};
  s.kind = ScheduleKind::InverseSqrt;
  EXPECT_TRUE(has(message(s), "warmup = 0"));
  s = Schedule{};
  s.kind = ScheduleKind::WarmupCosine;
  s.warmup = 100;
  s.total = 50;
  EXPECT_TRUE(has(message(s), "total = 50"));
  s.total = 0;
  s.warmup = 0;
  EXPECT_TRUE(has(message(s), "total = 0"));
  s.total = 200;
  s.min_lr = 1.0;
  EXPECT_TRUE(has(message(s), "min_lr = 1"));
  s.min_lr = -1e-6;
  EXPECT_TRUE(has(message(s), "min_lr = -1e-06"));
  s = Schedule{};
  s.kind = static_cast<ScheduleKind>(17);
  EXPECT_TRUE(has(message(s), "kind = 17"));
  EXPECT_TRUE(has(message(Schedule{}, 0), "step = 0"));
  // A valid schedule passes, and validate() throws what learning_rate() throws.
  EXPECT_NO_THROW(validate(Schedule{}));
  s = Schedule{};
  s.lr = -2;
  EXPECT_EQ(error_of([&] { validate(s); }), message(s));
}

TEST(Schedule, NamesRoundTrip) {
  for (ScheduleKind k : {ScheduleKind::Constant, ScheduleKind::InverseSqrt, ScheduleKind::WarmupCosine})
    EXPECT_EQ(parse_schedule_kind(schedule_name(k)), k);
  EXPECT_STREQ(schedule_name(ScheduleKind::Constant), "constant");
  EXPECT_STREQ(schedule_name(ScheduleKind::InverseSqrt), "inverse-sqrt");
  EXPECT_STREQ(schedule_name(ScheduleKind::WarmupCosine), "cosine");
  const std::string msg = error_of([] { parse_schedule_kind("linear"); });
  EXPECT_NE(msg.find("'linear'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("constant, inverse-sqrt, cosine"), std::string::npos) << msg;
}

}  // namespace
}  // namespace qkv
