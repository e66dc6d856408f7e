// LayerNorm, RMSNorm, activations and SwiGLU kernels: forward against a float64 reference
// written here, backward against central finite differences of that reference (in double),
// plus large-magnitude inputs, thread-count determinism and empty inputs.
//
// Tolerances (|got - want| <= atol + rtol * |want|; a failure prints the worst element, its
// values, the bound it broke and the largest absolute error):
//   norm forward  (y)            rtol 1e-6,   atol 1e-6 * max|want|
//   norm forward  (mean, rstd)   rtol 1e-6,   atol 1e-6 * max|want|
//   norm backward (vs FD)        rtol 1e-5,   atol 1e-5 * max|want|
//   large-magnitude layernorm    rtol 1e-4,   atol 1e-4 * max|want|   (forward and backward)
//   activation forward           rtol 2.5e-7 (about 2 float ulp), atol 1e-30
//   activation backward (vs FD)  rtol 1e-6,   atol 1e-8
// The kernels accumulate in double and round once, so their observed errors are ~1e-7 relative;
// the bounds leave room for the finite differences' own error (h = 1e-6, ~1e-9 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/activations.h"
#include "kernels/norm.h"

namespace qkv {
namespace {

using kernels::Activation;

constexpr double kFdStep = 1e-6;
constexpr int kThreads = 2;

// ---------------------------------------------------------------------------------------------
// Helpers

std::vector<float> randn(int64_t n, std::mt19937& rng, float mean = 0.0f, float stddev = 1.0f) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// All of [0, n) when n <= max_count, else the first and last index and max_count - 2 random ones.
std::vector<int64_t> sample_indices(int64_t n, int64_t max_count, std::mt19937& rng) {
  std::vector<int64_t> idx;
  if (n <= max_count) {
    for (int64_t k = 0; k < n; ++k) idx.push_back(k);
    return idx;
  }
  idx = {0, n - 1};
  std::uniform_int_distribution<int64_t> d(0, n - 1);
  while (static_cast<int64_t>(idx.size()) < max_count) idx.push_back(d(rng));
  return idx;
}

double max_abs_at(const std::vector<double>& want, const std::vector<int64_t>& idx) {
  double m = 0;
  for (int64_t k : idx) m = std::max(m, std::fabs(want[static_cast<size_t>(k)]));
  return m;
}

// |got[k] - want[k]| <= atol + rtol * |want[k]| for each k in idx. On failure: the worst element
// (largest error / bound), its values and bound, and the largest absolute error anywhere.
::testing::AssertionResult close_at(const std::string& what, const std::vector<float>& got,
                                    const std::vector<double>& want, const std::vector<int64_t>& idx, double atol,
                                    double rtol) {
  double worst_ratio = 0, max_err = 0;
  int64_t worst = -1, max_err_at = -1;
  for (int64_t k : idx) {
    const double g = got[static_cast<size_t>(k)], w = want[static_cast<size_t>(k)];
    const double err = std::fabs(g - w);
    const double bound = atol + rtol * std::fabs(w);
    const double ratio = std::isnan(err) ? std::numeric_limits<double>::infinity() : err == 0 ? 0.0 : err / bound;
    if (worst < 0 || ratio > worst_ratio) worst_ratio = ratio, worst = k;
    if (max_err_at < 0 || err > max_err || std::isnan(err)) max_err = err, max_err_at = k;
  }
  if (worst < 0 || worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  const size_t w = static_cast<size_t>(worst);
  std::ostringstream msg;
  msg.precision(9);
  msg << what << ": worst at [" << worst << "] got " << got[w] << " want " << want[w] << " |err| "
      << std::fabs(got[w] - want[w]) << " > bound " << atol + rtol * std::fabs(want[w]) << " (atol " << atol
      << ", rtol " << rtol << "); largest |err| " << max_err << " at [" << max_err_at << "] over " << idx.size()
      << " checked elements";
  return ::testing::AssertionFailure() << msg.str();
}

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) idx[static_cast<size_t>(k)] = k;
  return idx;
}

// d loss / d p by central differences, loss evaluated with p set to p +- h (p restored after).
// h = kFdStep * max(1, |p|) when relative_step, else kFdStep. The step follows each function's
// length scale: relative for activations and RMSNorm (scale-invariant: at x ~ 1e4 an absolute
// 1e-6 step drowns in the rounding of sum(x^2)), absolute for LayerNorm (its length scale is the
// row's spread, however large |x| is).
double central_diff(double& p, const std::function<double()>& loss, bool relative_step = true) {
  const double p0 = p, h = relative_step ? kFdStep * std::max(1.0, std::fabs(p0)) : kFdStep;
  p = p0 + h;
  const double lp = loss();
  p = p0 - h;
  const double lm = loss();
  p = p0;
  return (lp - lm) / (2 * h);
}

// The scale a norm's dx error is judged against: the largest |dx| or, if larger, the largest
// |rstd_i * gamma_j * dy_ij|, the size of the terms that cancel in dx (rstd itself is saved in
// float, so ~1e-7 of that size is the floor for any kernel with this interface).
double dx_scale(const std::vector<double>& dx_want, const std::vector<int64_t>& idx, const std::vector<double>& rstd,
                const std::vector<double>& gamma, const std::vector<double>& dy, int64_t C) {
  double m = max_abs_at(dx_want, idx);
  for (int64_t k : idx) m = std::max(m, std::fabs(rstd[k / C] * gamma[k % C] * dy[k]));
  return m;
}

// ---------------------------------------------------------------------------------------------
// Double-precision references (one row at a time)

// y <- (x - mu) / sqrt(var + eps) * gamma + beta
void layernorm_row_ref(const double* x, const double* gamma, const double* beta, int64_t C, double eps, double* y,
                       double* mean_out = nullptr, double* rstd_out = nullptr) {
  double mu = 0;
  for (int64_t j = 0; j < C; ++j) mu += x[j];
  mu /= static_cast<double>(C);
  double var = 0;
  for (int64_t j = 0; j < C; ++j) var += (x[j] - mu) * (x[j] - mu);
  var /= static_cast<double>(C);
  const double r = 1.0 / std::sqrt(var + eps);
  for (int64_t j = 0; j < C; ++j) y[j] = (x[j] - mu) * r * gamma[j] + (beta ? beta[j] : 0.0);
  if (mean_out) *mean_out = mu;
  if (rstd_out) *rstd_out = r;
}

// y <- x / sqrt(mean(x^2) + eps) * gamma
void rmsnorm_row_ref(const double* x, const double* gamma, int64_t C, double eps, double* y,
                     double* rstd_out = nullptr) {
  double ms = 0;
  for (int64_t j = 0; j < C; ++j) ms += x[j] * x[j];
  ms /= static_cast<double>(C);
  const double r = 1.0 / std::sqrt(ms + eps);
  for (int64_t j = 0; j < C; ++j) y[j] = x[j] * r * gamma[j];
  if (rstd_out) *rstd_out = r;
}

double act_ref(Activation a, double x) {
  switch (a) {
    case Activation::ReLU:
      return x > 0 ? x : 0.0;
    case Activation::GeluErf:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::GeluTanh: {
      // 0.5 x (1 + tanh(u)) written as x / (1 + exp(-2u)): the same function, but without the
      // cancellation in 1 + tanh(u) that makes the first form inaccurate in double for u < -10.
      const long double pi = std::acos(-1.0L), v = x;
      const long double u = std::sqrt(2.0L / pi) * (v + 0.044715L * v * v * v);
      return static_cast<double>(v / (1.0L + std::exp(-2.0L * u)));
    }
    case Activation::SiLU:
      return static_cast<double>(static_cast<long double>(x) / (1.0L + std::exp(-static_cast<long double>(x))));
    case Activation::Tanh:
      return static_cast<double>(std::tanh(static_cast<long double>(x)));
  }
  return 0;
}

double swiglu_ref(double a, double b) { return a / (1.0 + std::exp(-a)) * b; }

constexpr Activation kAll[] = {Activation::ReLU, Activation::GeluErf, Activation::GeluTanh, Activation::SiLU,
                               Activation::Tanh};

const char* name(Activation a) {
  switch (a) {
    case Activation::ReLU:
      return "ReLU";
    case Activation::GeluErf:
      return "GeluErf";
    case Activation::GeluTanh:
      return "GeluTanh";
    case Activation::SiLU:
      return "SiLU";
    case Activation::Tanh:
      return "Tanh";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

struct NormCase {
  int64_t N, C;
  float eps;
  float x_mean = 0.0f, x_std = 1.0f;
  bool with_beta = true;
  double tol = 0;  // 0: the default norm tolerances above
};

std::string describe(const NormCase& c) {
  std::ostringstream s;
  s << "N=" << c.N << " C=" << c.C << " eps=" << c.eps << " x~N(" << c.x_mean << ", " << c.x_std << ")"
    << (c.with_beta ? "" : " no beta");
  return s.str();
}

// Forward against the double reference on every element; backward against finite differences
// on every element of small tensors and on samples of large ones.
void check_layernorm(const NormCase& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  const int64_t N = c.N, C = c.C;
  std::mt19937 rng(seed);
  const std::vector<float> x = randn(N * C, rng, c.x_mean, c.x_std);
  const std::vector<float> gamma = randn(C, rng, 1.0f, 0.5f);
  const std::vector<float> beta = randn(C, rng, 0.0f, 0.5f);
  const std::vector<float> dy = randn(N * C, rng);
  const float* beta_p = c.with_beta ? beta.data() : nullptr;

  std::vector<float> y(x.size()), mean(N), rstd(N);
  kernels::layernorm_forward(x.data(), gamma.data(), beta_p, y.data(), mean.data(), rstd.data(), N, C, c.eps,
                             kThreads);

  std::vector<double> xd = to_double(x), gd = to_double(gamma), bd = to_double(beta), dyd = to_double(dy);
  const double* bd_p = c.with_beta ? bd.data() : nullptr;
  std::vector<double> y_ref(x.size()), mean_ref(N), rstd_ref(N);
  for (int64_t i = 0; i < N; ++i)
    layernorm_row_ref(&xd[i * C], gd.data(), bd_p, C, c.eps, &y_ref[i * C], &mean_ref[i], &rstd_ref[i]);

  const double fwd_tol = c.tol > 0 ? c.tol : 1e-6;
  const std::vector<int64_t> every = all_indices(N * C), rows = all_indices(N);
  EXPECT_TRUE(close_at("layernorm y", y, y_ref, every, fwd_tol * max_abs_at(y_ref, every), fwd_tol));
  EXPECT_TRUE(close_at("layernorm mean", mean, mean_ref, rows, 1e-6 * max_abs_at(mean_ref, rows), 1e-6));
  EXPECT_TRUE(close_at("layernorm rstd", rstd, rstd_ref, rows, 1e-6 * max_abs_at(rstd_ref, rows), 1e-6));

  std::vector<float> dx(x.size(), NAN), dgamma(C, NAN), dbeta(C, NAN);
  kernels::layernorm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dgamma.data(),
                              c.with_beta ? dbeta.data() : nullptr, N, C, kThreads);

  // loss = sum_ij y_ij * dy_ij (restricted to row i where only row i changes)
  std::vector<double> row(static_cast<size_t>(C));
  auto row_loss = [&](int64_t i) {
    layernorm_row_ref(&xd[i * C], gd.data(), bd_p, C, c.eps, row.data());
    double l = 0;
    for (int64_t j = 0; j < C; ++j) l += row[j] * dyd[i * C + j];
    return l;
  };
  auto full_loss = [&] {
    double l = 0;
    for (int64_t i = 0; i < N; ++i) l += row_loss(i);
    return l;
  };

  const double bwd_tol = c.tol > 0 ? c.tol : 1e-5;
  std::vector<double> dx_fd(x.size()), dgamma_fd(C), dbeta_fd(C);
  const std::vector<int64_t> xs = sample_indices(N * C, 512, rng);
  for (int64_t k : xs) dx_fd[k] = central_diff(xd[k], [&] { return row_loss(k / C); }, false);
  EXPECT_TRUE(close_at("layernorm dx", dx, dx_fd, xs, bwd_tol * dx_scale(dx_fd, xs, rstd_ref, gd, dyd, C), bwd_tol));
  // Each parameter sample costs two full forward passes: keep the total near 2e7 row elements.
  const int64_t param_samples = std::max<int64_t>(4, std::min<int64_t>(C, 10000000 / std::max<int64_t>(1, N * C)));
  const std::vector<int64_t> ps = sample_indices(C, param_samples, rng);
  for (int64_t j : ps) dgamma_fd[j] = central_diff(gd[j], full_loss, false);
  EXPECT_TRUE(close_at("layernorm dgamma", dgamma, dgamma_fd, ps, bwd_tol * max_abs_at(dgamma_fd, ps), bwd_tol));
  if (c.with_beta) {
    for (int64_t j : ps) dbeta_fd[j] = central_diff(bd[j], full_loss, false);
    EXPECT_TRUE(close_at("layernorm dbeta", dbeta, dbeta_fd, ps, bwd_tol * max_abs_at(dbeta_fd, ps), bwd_tol));
  }
}

TEST(LayerNorm, MatchesDoubleReferenceAndFiniteDifferences) {
  uint32_t seed = 1;
  for (int64_t N : {1, 3, 17, 64, 1000})
    for (int64_t C : {1, 3, 17, 64, 1000}) check_layernorm({N, C, 1e-5f}, seed++);
}

TEST(LayerNorm, EpsVariationsAndNoBeta) {
  uint32_t seed = 100;
  for (float eps : {0.0f, 1e-6f, 1e-3f, 0.5f})
    for (int64_t C : {3, 64}) check_layernorm({17, C, eps}, seed++);
  // Small spread: eps dominates the variance.
  check_layernorm({17, 64, 1e-2f, 0.0f, 0.01f}, seed++);
  for (int64_t C : {1, 17, 1000}) check_layernorm({3, C, 1e-5f, 0.0f, 1.0f, /*with_beta=*/false}, seed++);
}

// C == 1: every row is its own mean, so y = beta, and no gradient reaches x or gamma.
TEST(LayerNorm, SingleColumnGivesBeta) {
  const std::vector<float> x = {3.0f, -2.0f, 1e4f}, gamma = {2.0f}, beta = {0.25f}, dy = {1.0f, -1.0f, 0.5f};
  std::vector<float> y(3), mean(3), rstd(3), dx(3), dgamma(1), dbeta(1);
  kernels::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), 3, 1, 1e-5f, 1);
  kernels::layernorm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dgamma.data(),
                              dbeta.data(), 3, 1, 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(y[i], 0.25f) << i;
    EXPECT_EQ(dx[i], 0.0f) << i;
  }
  EXPECT_EQ(dgamma[0], 0.0f);
  EXPECT_EQ(dbeta[0], 0.5f);
}

// x ~ 1e4 +- small spread: a one-pass float E[x^2] - E[x]^2 would lose the variance entirely;
// forward and backward must still match the double reference to 1e-4.
TEST(LayerNorm, LargeMagnitudeNoCancellation) {
  uint32_t seed = 200;
  for (float centre : {1e4f, -3e4f})
    for (float spread : {1.0f, 0.05f})
      for (int64_t C : {17, 1000}) {
        NormCase c{8, C, 1e-5f, centre, spread};
        c.tol = 1e-4;
        check_layernorm(c, seed++);
      }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

void check_rmsnorm(const NormCase& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  const int64_t N = c.N, C = c.C;
  std::mt19937 rng(seed);
  const std::vector<float> x = randn(N * C, rng, c.x_mean, c.x_std);
  const std::vector<float> gamma = randn(C, rng, 1.0f, 0.5f);
  const std::vector<float> dy = randn(N * C, rng);

  std::vector<float> y(x.size()), rstd(N);
  kernels::rmsnorm_forward(x.data(), gamma.data(), y.data(), rstd.data(), N, C, c.eps, kThreads);

  std::vector<double> xd = to_double(x), gd = to_double(gamma), dyd = to_double(dy);
  std::vector<double> y_ref(x.size()), rstd_ref(N);
  for (int64_t i = 0; i < N; ++i) rmsnorm_row_ref(&xd[i * C], gd.data(), C, c.eps, &y_ref[i * C], &rstd_ref[i]);

  const double fwd_tol = c.tol > 0 ? c.tol : 1e-6;
  const std::vector<int64_t> every = all_indices(N * C), rows = all_indices(N);
  EXPECT_TRUE(close_at("rmsnorm y", y, y_ref, every, fwd_tol * max_abs_at(y_ref, every), fwd_tol));
  EXPECT_TRUE(close_at("rmsnorm rstd", rstd, rstd_ref, rows, 1e-6 * max_abs_at(rstd_ref, rows), 1e-6));

  std::vector<float> dx(x.size(), NAN), dgamma(C, NAN);
  kernels::rmsnorm_backward(x.data(), gamma.data(), rstd.data(), dy.data(), dx.data(), dgamma.data(), N, C, kThreads);

  std::vector<double> row(static_cast<size_t>(C));
  auto row_loss = [&](int64_t i) {
    rmsnorm_row_ref(&xd[i * C], gd.data(), C, c.eps, row.data());
    double l = 0;
    for (int64_t j = 0; j < C; ++j) l += row[j] * dyd[i * C + j];
    return l;
  };
  auto full_loss = [&] {
    double l = 0;
    for (int64_t i = 0; i < N; ++i) l += row_loss(i);
    return l;
  };

  const double bwd_tol = c.tol > 0 ? c.tol : 1e-5;
  std::vector<double> dx_fd(x.size()), dgamma_fd(C);
  const std::vector<int64_t> xs = sample_indices(N * C, 512, rng);
  for (int64_t k : xs) dx_fd[k] = central_diff(xd[k], [&] { return row_loss(k / C); });
  EXPECT_TRUE(close_at("rmsnorm dx", dx, dx_fd, xs, bwd_tol * dx_scale(dx_fd, xs, rstd_ref, gd, dyd, C), bwd_tol));
  const int64_t param_samples = std::max<int64_t>(4, std::min<int64_t>(C, 10000000 / std::max<int64_t>(1, N * C)));
  const std::vector<int64_t> ps = sample_indices(C, param_samples, rng);
  for (int64_t j : ps) dgamma_fd[j] = central_diff(gd[j], full_loss);
  EXPECT_TRUE(close_at("rmsnorm dgamma", dgamma, dgamma_fd, ps, bwd_tol * max_abs_at(dgamma_fd, ps), bwd_tol));
}

TEST(RmsNorm, MatchesDoubleReferenceAndFiniteDifferences) {
  uint32_t seed = 300;
  for (int64_t N : {1, 3, 17, 64, 1000})
    for (int64_t C : {1, 3, 17, 64, 1000}) check_rmsnorm({N, C, 1e-6f}, seed++);
}

TEST(RmsNorm, EpsVariationsAndLargeMagnitude) {
  uint32_t seed = 400;
  for (float eps : {0.0f, 1e-5f, 1e-3f, 0.5f})
    for (int64_t C : {3, 64}) check_rmsnorm({17, C, eps}, seed++);
  for (float centre : {1e4f, -3e4f}) {
    NormCase c{8, 1000, 1e-6f, centre, 1.0f};
    c.tol = 1e-4;
    check_rmsnorm(c, seed++);
  }
  check_rmsnorm({17, 64, 1e-2f, 0.0f, 0.01f}, seed++);  // eps dominates mean(x^2)
}

// ---------------------------------------------------------------------------------------------
// Determinism and empty inputs

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

TEST(Norms, BitwiseIdenticalForAnyThreadCount) {
  std::mt19937 rng(500);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1000, 1000}, {999, 17}, {5, 33}, {40, 4500}}) {  // 4500: bands
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    const std::vector<float> x = randn(N * C, rng, 3.0f, 2.0f), gamma = randn(C, rng, 1.0f, 0.5f),
                             beta = randn(C, rng), dy = randn(N * C, rng);
    std::vector<float> y1, mean1, rstd1, dx1, dg1, db1, ry1, rr1, rdx1, rdg1;
    for (int threads : {1, 2, 3}) {
      std::vector<float> y(x.size()), mean(N), rstd(N), dx(x.size()), dg(C), db(C);
      kernels::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5f,
                                 threads);
      kernels::layernorm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dg.data(),
                                  db.data(), N, C, threads);
      std::vector<float> ry(x.size()), rr(N), rdx(x.size()), rdg(C);
      kernels::rmsnorm_forward(x.data(), gamma.data(), ry.data(), rr.data(), N, C, 1e-5f, threads);
      kernels::rmsnorm_backward(x.data(), gamma.data(), rr.data(), dy.data(), rdx.data(), rdg.data(), N, C, threads);
      if (threads == 1) {
        y1 = y, mean1 = mean, rstd1 = rstd, dx1 = dx, dg1 = dg, db1 = db, ry1 = ry, rr1 = rr, rdx1 = rdx, rdg1 = rdg;
        continue;
      }
      SCOPED_TRACE("threads=" + std::to_string(threads) + " vs 1");
      EXPECT_TRUE(bitwise_equal(y, y1));
      EXPECT_TRUE(bitwise_equal(mean, mean1));
      EXPECT_TRUE(bitwise_equal(rstd, rstd1));
      EXPECT_TRUE(bitwise_equal(dx, dx1));
      EXPECT_TRUE(bitwise_equal(dg, dg1)) << "layernorm dgamma";
      EXPECT_TRUE(bitwise_equal(db, db1)) << "layernorm dbeta";
      EXPECT_TRUE(bitwise_equal(ry, ry1));
      EXPECT_TRUE(bitwise_equal(rr, rr1));
      EXPECT_TRUE(bitwise_equal(rdx, rdx1));
      EXPECT_TRUE(bitwise_equal(rdg, rdg1)) << "rmsnorm dgamma";
    }
  }
}

// N == 0: nothing to read; dgamma and dbeta are still overwritten (with zeros). C == 0: rows of
// nothing; nothing is read or written but mean and rstd.
TEST(Norms, EmptyInputs) {
  const std::vector<float> gamma(7, 1.0f), beta(7, 0.0f);
  std::vector<float> dg(7, NAN), db(7, NAN);
  kernels::layernorm_forward(nullptr, gamma.data(), beta.data(), nullptr, nullptr, nullptr, 0, 7, 1e-5f, 3);
  kernels::layernorm_backward(nullptr, gamma.data(), nullptr, nullptr, nullptr, nullptr, dg.data(), db.data(), 0, 7, 3);
  for (int j = 0; j < 7; ++j) {
    EXPECT_EQ(dg[j], 0.0f) << j;
    EXPECT_EQ(db[j], 0.0f) << j;
  }
  std::fill(dg.begin(), dg.end(), NAN);
  kernels::rmsnorm_forward(nullptr, gamma.data(), nullptr, nullptr, 0, 7, 1e-5f, 3);
  kernels::rmsnorm_backward(nullptr, gamma.data(), nullptr, nullptr, nullptr, dg.data(), 0, 7, 3);
  for (int j = 0; j < 7; ++j) EXPECT_EQ(dg[j], 0.0f) << j;

  kernels::layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, 1e-5f, 2);
  kernels::layernorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, 2);
  kernels::rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, 0, 0, 1e-5f, 2);
  kernels::rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, 2);

  std::vector<float> mean(4, NAN), rstd(4, NAN), rrstd(4, NAN);
  kernels::layernorm_forward(nullptr, nullptr, nullptr, nullptr, mean.data(), rstd.data(), 4, 0, 0.25f, 2);
  kernels::layernorm_backward(nullptr, nullptr, mean.data(), rstd.data(), nullptr, nullptr, nullptr, nullptr, 4, 0, 2);
  kernels::rmsnorm_forward(nullptr, nullptr, nullptr, rrstd.data(), 4, 0, 0.25f, 2);
  kernels::rmsnorm_backward(nullptr, nullptr, rrstd.data(), nullptr, nullptr, nullptr, 4, 0, 2);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(mean[i], 0.0f);
    EXPECT_EQ(rstd[i], 2.0f);  // 1 / sqrt(0 + eps)
    EXPECT_EQ(rrstd[i], 2.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// Activations

// Random N(0, 3) values, led (where n allows) by points that matter: 0, around the kink, and
// values where erf / tanh / exp saturate.
std::vector<float> activation_inputs(int64_t n, std::mt19937& rng) {
  std::vector<float> x = randn(n, rng, 0.0f, 3.0f);
  const float special[] = {0.5f, -0.5f, 1.0f, -1.0f, 1e-3f, -1e-3f, 5.0f, -5.0f, 10.0f, -10.0f, 30.0f, -30.0f};
  for (size_t k = 0; k < std::size(special) && static_cast<int64_t>(k) < n; ++k) x[k] = special[k];
  return x;
}

TEST(Activations, MatchDoubleReferenceAndFiniteDifferences) {
  uint32_t seed = 600;
  for (Activation a : kAll)
    for (int64_t n : {1, 3, 17, 64, 1000, 40000}) {  // 40000: above the parallel threshold
      SCOPED_TRACE(std::string(name(a)) + " n=" + std::to_string(n));
      std::mt19937 rng(seed++);
      const std::vector<float> x = activation_inputs(n, rng), dy = randn(n, rng);
      std::vector<float> y(n), dx(n);
      kernels::activation_forward(a, x.data(), y.data(), n, kThreads);
      kernels::activation_backward(a, x.data(), dy.data(), dx.data(), n, kThreads);

      std::vector<double> xd = to_double(x), y_ref(n), dx_fd(n);
      std::vector<int64_t> fd_at;
      for (int64_t k = 0; k < n; ++k) {
        y_ref[k] = act_ref(a, xd[k]);
        // ReLU has a kink at 0: finite differences across it mean nothing.
        if (a == Activation::ReLU && std::fabs(xd[k]) < 1e-4) continue;
        dx_fd[k] = dy[k] * central_diff(xd[k], [&] { return act_ref(a, xd[k]); });
        fd_at.push_back(k);
      }
      EXPECT_TRUE(close_at("activation y", y, y_ref, all_indices(n), 1e-30, 2.5e-7));
      EXPECT_TRUE(close_at("activation dx", dx, dx_fd, fd_at, 1e-8, 1e-6));
    }
}

TEST(Activations, PinnedValuesAndEdges) {
  // GELU(1) from the defining formulas (PyTorch gives the same to float precision).
  const float one = 1.0f, minus_one = -1.0f;
  float y = 0;
  kernels::activation_forward(Activation::GeluErf, &one, &y, 1, 1);
  EXPECT_NEAR(y, 0.8413447460685429, 1e-7);
  kernels::activation_forward(Activation::GeluErf, &minus_one, &y, 1, 1);
  EXPECT_NEAR(y, -0.15865525393145707, 1e-7);
  kernels::activation_forward(Activation::GeluTanh, &one, &y, 1, 1);
  EXPECT_NEAR(y, 0.8411919906082768, 1e-7);

  // ReLU'(0) = 0 (as PyTorch); ReLU(-0) is +0.
  const float zero = 0.0f, neg_zero = -0.0f, g = 3.0f;
  float dx = NAN;
  kernels::activation_backward(Activation::ReLU, &zero, &g, &dx, 1, 1);
  EXPECT_EQ(dx, 0.0f);
  kernels::activation_forward(Activation::ReLU, &neg_zero, &y, 1, 1);
  EXPECT_EQ(y, 0.0f);

  // Saturation: finite everywhere, y -> x or 0 and f' -> 1 or 0 (tanh: y -> +-1, f' -> 0), up to
  // the largest float.
  const std::vector<float> big = {1000.0f, -1000.0f, FLT_MAX, -FLT_MAX, 1e20f, -1e20f};
  const std::vector<float> ones(big.size(), 1.0f);
  for (Activation a : kAll) {
    SCOPED_TRACE(name(a));
    std::vector<float> ys(big.size()), dxs(big.size());
    kernels::activation_forward(a, big.data(), ys.data(), static_cast<int64_t>(big.size()), 1);
    kernels::activation_backward(a, big.data(), ones.data(), dxs.data(), static_cast<int64_t>(big.size()), 1);
    for (size_t k = 0; k < big.size(); ++k) {
      if (a == Activation::Tanh) {
        EXPECT_EQ(ys[k], big[k] > 0 ? 1.0f : -1.0f) << "x = " << big[k];
        EXPECT_EQ(dxs[k], 0.0f) << "x = " << big[k];
        continue;
      }
      EXPECT_EQ(ys[k], big[k] > 0 ? big[k] : 0.0f) << "x = " << big[k];
      EXPECT_EQ(dxs[k], big[k] > 0 ? 1.0f : 0.0f) << "x = " << big[k];
    }
  }
}

// NaN in, NaN out, as in PyTorch: ReLU used to turn NaN into 0 (x > 0 ? x : 0), so a model with
// NaN weights had a finite loss. ReLU's gradient passes dy where x is NaN (torch's
// threshold_backward: x <= 0 ? 0 : dy); the others' gradients are NaN. Every other input keeps
// exactly the bits of the old formulas. Sizes cover the vector bodies, tails and the threaded path.
TEST(Activations, NaNPropagatesAsInPyTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  uint32_t seed = 680;
  for (int64_t n : {1, 7, 64, 4101, 40000}) {
    std::mt19937 rng(seed++);
    std::vector<float> x = activation_inputs(n, rng), dy = randn(n, rng);
    std::vector<int64_t> nan_at = {0, n / 2, n - 1};
    if (n > 8) x[1] = -0.0f, x[2] = 0.0f, x[3] = INFINITY, x[4] = -INFINITY;
    for (int64_t k : nan_at) x[k] = nan;
    for (Activation a : kAll) {
      SCOPED_TRACE(std::string(name(a)) + " n=" + std::to_string(n));
      std::vector<float> y(n), dx(n), y2(n), d(n);
      kernels::activation_forward(a, x.data(), y.data(), n, kThreads);
      kernels::activation_backward(a, x.data(), dy.data(), dx.data(), n, kThreads);
      kernels::activation_forward_grad(a, x.data(), y2.data(), d.data(), n, kThreads);
      for (int64_t k : nan_at) {
        EXPECT_TRUE(std::isnan(y[k])) << "forward at " << k;
        EXPECT_TRUE(std::isnan(y2[k])) << "forward_grad at " << k;
        if (a == Activation::ReLU) {
          EXPECT_EQ(dx[k], dy[k]) << "backward at " << k;
          EXPECT_EQ(d[k], 1.0f) << "forward_grad's derivative at " << k;
        } else {
          EXPECT_TRUE(std::isnan(dx[k])) << "backward at " << k;
          EXPECT_TRUE(std::isnan(d[k])) << "forward_grad's derivative at " << k;
        }
      }
      if (a != Activation::ReLU) continue;
      for (int64_t k = 0; k < n; ++k) {
        if (std::isnan(x[k])) continue;
        const float want_y = x[k] > 0.0f ? x[k] : 0.0f, want_dx = x[k] > 0.0f ? dy[k] : 0.0f;
        ASSERT_EQ(std::bit_cast<uint32_t>(y[k]), std::bit_cast<uint32_t>(want_y)) << "x = " << x[k];
        ASSERT_EQ(std::bit_cast<uint32_t>(y2[k]), std::bit_cast<uint32_t>(want_y)) << "x = " << x[k];
        ASSERT_EQ(std::bit_cast<uint32_t>(dx[k]), std::bit_cast<uint32_t>(want_dx)) << "x = " << x[k];
        ASSERT_EQ(d[k], x[k] > 0.0f ? 1.0f : 0.0f) << "x = " << x[k];
      }
    }
    // Gated: f(a) b with a NaN in a (every f; ReLU keeps the NaN, so its gradient da = dy b
    // stays finite while db = dy NaN is NaN)
    std::vector<float> b = randn(n, rng), y(n), da(n), db(n);
    for (Activation a : kAll) {
      kernels::gated_forward(a, x.data(), b.data(), y.data(), n, kThreads);
      kernels::gated_backward(a, x.data(), b.data(), dy.data(), da.data(), db.data(), n, kThreads);
      for (int64_t k : nan_at)
        EXPECT_TRUE(std::isnan(y[k]) && (a == Activation::ReLU || std::isnan(da[k])) && std::isnan(db[k]))
            << "gated " << name(a) << " " << k;
    }
  }
}

TEST(Gated, MatchesDoubleReferenceAndFiniteDifferences) {
  // f(a) * b for every activation: SwiGLU (SiLU), GeGLU (GELU, both forms), ReGLU
  uint32_t seed = 700;
  for (Activation f : kAll)
    for (int64_t n : {1, 3, 17, 64, 1000, 40000}) {
      SCOPED_TRACE(std::string(name(f)) + " n=" + std::to_string(n));
      std::mt19937 rng(seed++);
      const std::vector<float> a = activation_inputs(n, rng), b = randn(n, rng), dy = randn(n, rng);
      std::vector<float> y(n), da(n), db(n);
      kernels::gated_forward(f, a.data(), b.data(), y.data(), n, kThreads);
      kernels::gated_backward(f, a.data(), b.data(), dy.data(), da.data(), db.data(), n, kThreads);

      std::vector<double> ad = to_double(a), bd = to_double(b), y_ref(n), da_fd(n), db_fd(n);
      std::vector<int64_t> fd_at;
      for (int64_t k = 0; k < n; ++k) {
        y_ref[k] = act_ref(f, ad[k]) * bd[k];
        auto loss = [&] { return act_ref(f, ad[k]) * bd[k] * dy[k]; };
        db_fd[k] = central_diff(bd[k], loss);
        if (f == Activation::ReLU && std::fabs(ad[k]) < 1e-4) continue;  // the kink
        da_fd[k] = central_diff(ad[k], loss);
        fd_at.push_back(k);
      }
      const std::vector<int64_t> every = all_indices(n);
      EXPECT_TRUE(close_at("gated y", y, y_ref, every, 1e-30, 2.5e-7));
      EXPECT_TRUE(close_at("gated da", da, da_fd, fd_at, 1e-8, 1e-6));
      EXPECT_TRUE(close_at("gated db", db, db_fd, every, 1e-8, 1e-6));
    }
}

TEST(Gated, SiLUIsTheSwiGLUOfTheReference) {
  // gated SiLU against the plain SwiGLU formula a sigmoid(a) b, in double
  std::mt19937 rng(701);
  const int64_t n = 4096;
  const std::vector<float> a = activation_inputs(n, rng), b = randn(n, rng);
  std::vector<float> y(n);
  kernels::gated_forward(Activation::SiLU, a.data(), b.data(), y.data(), n, kThreads);
  std::vector<double> ref(n);
  for (int64_t k = 0; k < n; ++k) ref[k] = swiglu_ref(a[k], b[k]);
  EXPECT_TRUE(close_at("swiglu y", y, ref, all_indices(n), 1e-30, 2.5e-7));
}

TEST(Gated, SiLUStableForLargeInputs) {
  // Exact limits at +-1000 and +-FLT_MAX; at +-89 and +-100 (where a float exp(-a) would
  // overflow) values within 2.5e-7 of the double reference (tiny, subnormal ones within 1e-44).
  const std::vector<float> a = {1000.0f, -1000.0f, FLT_MAX, -FLT_MAX, 100.0f, -100.0f, 89.0f, -89.0f};
  const int64_t n = static_cast<int64_t>(a.size());
  const std::vector<float> b(n, 0.5f), dy(n, 1.0f);  // no result overflows float
  std::vector<float> y(n), da(n), db(n);
  kernels::gated_forward(Activation::SiLU, a.data(), b.data(), y.data(), n, 1);
  kernels::gated_backward(Activation::SiLU, a.data(), b.data(), dy.data(), da.data(), db.data(), n, 1);
  for (int64_t k = 0; k < n; ++k) {
    SCOPED_TRACE("a = " + std::to_string(a[k]));
    EXPECT_FALSE(std::isnan(y[k]) || std::isnan(da[k]) || std::isnan(db[k]));
    const bool pos = a[k] > 0;
    if (k < 4) {
      // silu(a) -> a or 0, silu'(a) -> 1 or 0
      EXPECT_EQ(y[k], pos ? a[k] * 0.5f : 0.0f);
      EXPECT_EQ(da[k], pos ? 0.5f : 0.0f);  // dy * b * silu'(a) = 1 * 0.5 * {1, 0}
      EXPECT_EQ(db[k], pos ? a[k] : 0.0f);
    } else {
      const double ad = a[k], s = 1.0 / (1.0 + std::exp(-ad));
      const double y_want = ad * s * 0.5, da_want = 0.5 * s * (1.0 + ad * (1.0 - s)), db_want = ad * s;
      EXPECT_NEAR(y[k], y_want, 1e-44 + 2.5e-7 * std::fabs(y_want));
      EXPECT_NEAR(da[k], da_want, 1e-44 + 2.5e-7 * std::fabs(da_want));
      EXPECT_NEAR(db[k], db_want, 1e-44 + 2.5e-7 * std::fabs(db_want));
    }
  }
}

TEST(Gated, SiLUVectorsAgreeWithTheScalarFormulaEverywhere) {
  // The vectorised SiLU (its own exp) against x sigmoid(x) with libm's exp in double, over a
  // sweep through 0, the ranges where exp(-|x|) is subnormal in double (-745 .. -708) or flushed
  // (below -700), and the special values: within one float rounding, NaN exactly where the
  // formula is NaN (NaN in, and silu(-inf) = -inf * 0), and the same infinities.
  std::vector<float> a;
  for (float v = -800.0f; v <= 800.0f; v += 0.37f) a.push_back(v);
  for (float v = -2.0f; v <= 2.0f; v += 1.0f / 1024) a.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-45f, -1e-45f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX,
                  -700.0f, -708.5f, -745.5f, 700.0f})
    a.push_back(v);
  const int64_t n = static_cast<int64_t>(a.size());
  std::mt19937 rng(702);
  const std::vector<float> b = randn(n, rng), dy = randn(n, rng);
  std::vector<float> y(n), g(n), y1(n), d1(n), yg(n), da(n), db(n);
  kernels::activation_forward(Activation::SiLU, a.data(), y.data(), n, 1);
  kernels::activation_backward(Activation::SiLU, a.data(), dy.data(), g.data(), n, 1);
  kernels::activation_forward_grad(Activation::SiLU, a.data(), y1.data(), d1.data(), n, 1);
  kernels::gated_forward(Activation::SiLU, a.data(), b.data(), yg.data(), n, 1);
  kernels::gated_backward(Activation::SiLU, a.data(), b.data(), dy.data(), da.data(), db.data(), n, 1);
  auto sig = [](double v) {
    const double e = std::exp(-std::fabs(v));
    return v >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
  };
  auto same = [](const char* what, float got, double want, float at) {
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << what << " at " << at << ": " << got << ", want NaN";
      return;
    }
    if (std::isinf(want)) {
      EXPECT_EQ(got, static_cast<float>(want)) << what << " at " << at;
      return;
    }
    EXPECT_NEAR(got, want, 1e-44 + 1.2e-7 * std::fabs(want)) << what << " at " << at;
  };
  for (int64_t k = 0; k < n; ++k) {
    const double v = a[k], s = sig(v), sm = sig(-v), f = v * s, fp = s * (1.0 + v * sm);
    same("silu", y[k], f, a[k]);
    same("silu'", g[k], dy[k] * fp, a[k]);
    same("forward_grad y", y1[k], f, a[k]);
    same("forward_grad f'", d1[k], fp, a[k]);
    same("gated y", yg[k], f * b[k], a[k]);
    same("gated da", da[k], dy[k] * static_cast<double>(b[k]) * fp, a[k]);
    same("gated db", db[k], dy[k] * f, a[k]);
  }
}

TEST(Activations, ForwardWithDerivativeMatchesSeparatePasses) {
  // activation_forward_grad: y bit for bit as activation_forward, and dy * f'(x) through
  // multiply() within one float rounding of activation_backward (which rounds dy f'(x) once).
  uint32_t seed = 650;
  for (Activation a : kAll)
    for (int64_t n : {1, 5, 1000, 40000}) {
      SCOPED_TRACE(std::string(name(a)) + " n=" + std::to_string(n));
      std::mt19937 rng(seed++);
      std::vector<float> x = activation_inputs(n, rng), dy = randn(n, rng);
      if (n >= 5) {  // saturation and the largest floats, as in PinnedValuesAndEdges
        x[0] = FLT_MAX;
        x[1] = -FLT_MAX;
        x[2] = -1000.0f;
        x[3] = 1000.0f;
        x[4] = 0.0f;
      }
      std::vector<float> y(n), y2(n), d(n), dx(n), dx2(n);
      kernels::activation_forward(a, x.data(), y.data(), n, kThreads);
      kernels::activation_backward(a, x.data(), dy.data(), dx.data(), n, kThreads);
      kernels::activation_forward_grad(a, x.data(), y2.data(), d.data(), n, kThreads);
      kernels::multiply(dy.data(), d.data(), dx2.data(), n, kThreads);
      for (int64_t k = 0; k < n; ++k) {
        ASSERT_EQ(std::bit_cast<uint32_t>(y[k]), std::bit_cast<uint32_t>(y2[k])) << "x = " << x[k];
        ASSERT_FALSE(std::isnan(dx2[k])) << "x = " << x[k];
        EXPECT_NEAR(dx2[k], dx[k], 1e-37 + 2.5e-7 * std::fabs(dx[k])) << "x = " << x[k];
      }
    }
  kernels::activation_forward_grad(Activation::GeluTanh, nullptr, nullptr, nullptr, 0, 3);
  kernels::multiply(nullptr, nullptr, nullptr, 0, 3);
}

TEST(Activations, EmptyAndThreadCountIndependent) {
  kernels::activation_forward(Activation::GeluTanh, nullptr, nullptr, 0, 3);
  kernels::activation_backward(Activation::GeluErf, nullptr, nullptr, nullptr, 0, 3);
  kernels::gated_forward(Activation::SiLU, nullptr, nullptr, nullptr, 0, 3);
  kernels::gated_backward(Activation::GeluErf, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 3);

  std::mt19937 rng(800);
  const int64_t n = 50000;
  const std::vector<float> x = randn(n, rng, 0.0f, 3.0f), b = randn(n, rng), dy = randn(n, rng);
  auto run = [&](int threads) {
    std::vector<float> out;
    for (Activation a : kAll) {
      std::vector<float> y(n), dx(n);
      kernels::activation_forward(a, x.data(), y.data(), n, threads);
      kernels::activation_backward(a, x.data(), dy.data(), dx.data(), n, threads);
      out.insert(out.end(), y.begin(), y.end());
      out.insert(out.end(), dx.begin(), dx.end());
    }
    for (Activation a : kAll) {
      std::vector<float> y(n), da(n), db(n);
      kernels::gated_forward(a, x.data(), b.data(), y.data(), n, threads);
      kernels::gated_backward(a, x.data(), b.data(), dy.data(), da.data(), db.data(), n, threads);
      for (const auto* v : {&y, &da, &db}) out.insert(out.end(), v->begin(), v->end());
    }
    return out;
  };
  const std::vector<float> one = run(1);
  EXPECT_TRUE(bitwise_equal(run(2), one));
  EXPECT_TRUE(bitwise_equal(run(3), one));
}

}  // namespace
}  // namespace qkv
