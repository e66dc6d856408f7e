#include "kernels/activations.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace qkv::kernels {
namespace {

// Below this many elements the loop runs on the calling thread (starting threads costs more).
constexpr int64_t kParallelMin = 1 << 14;

constexpr double kInvSqrt2 = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

int clamp_threads(int threads) { return std::max(1, threads); }

// sigmoid(v) = 1 / (1 + exp(-v)), written so exp never sees a large positive argument:
// exp(-|v|) lies in (0, 1], so sigmoid(+-1000) is exactly 1 / 0 and never inf / inf.
double sigmoid(double v) {
  const double e = std::exp(-std::fabs(v));
  return v >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// Applies op(i) for i in [0, n), in parallel when n is large enough.
template <class Op>
void for_each_index(int64_t n, int threads, Op op) {
#pragma omp parallel for num_threads(clamp_threads(threads)) schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) op(i);
}

}  // namespace

void activation_forward(Activation a, const float* x, float* y, int64_t n, int threads) {
  // x, y: (n)
  switch (a) {
    case Activation::ReLU:
      // y <- max(x, 0)
      for_each_index(n, threads, [=](int64_t i) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; });
      break;
    case Activation::GeluErf:
      // y <- 0.5 x (1 + erf(x / sqrt(2)))
      for_each_index(n, threads, [=](int64_t i) {
        const double v = x[i];
        y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * kInvSqrt2)));
      });
      break;
    case Activation::GeluTanh:
      // y <- 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      for_each_index(n, threads, [=](int64_t i) {
        const double v = x[i];
        const double t = std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
        y[i] = static_cast<float>(0.5 * v * (1.0 + t));
      });
      break;
  }
}

void activation_backward(Activation a, const float* x, const float* dy, float* dx, int64_t n, int threads) {
  // x, dy, dx: (n)
  switch (a) {
    case Activation::ReLU:
      // dx <- dy * [x > 0]
      for_each_index(n, threads, [=](int64_t i) { dx[i] = x[i] > 0.0f ? dy[i] : 0.0f; });
      break;
    case Activation::GeluErf:
      // dx <- dy * (Phi(x) + x phi(x)),  Phi(x) = 0.5 (1 + erf(x / sqrt(2))),  phi(x) = exp(-x^2/2) / sqrt(2 pi)
      for_each_index(n, threads, [=](int64_t i) {
        const double v = x[i];
        const double cdf = 0.5 * (1.0 + std::erf(v * kInvSqrt2));
        const double pdf = kInvSqrt2Pi * std::exp(-0.5 * v * v);
        dx[i] = static_cast<float>(dy[i] * (cdf + v * pdf));
      });
      break;
    case Activation::GeluTanh:
      // u <- sqrt(2/pi) (x + 0.044715 x^3);  t <- tanh(u)
      // dx <- dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
      for_each_index(n, threads, [=](int64_t i) {
        const double v = x[i];
        const double t = std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
        const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * v * v);
        dx[i] = static_cast<float>(dy[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du));
      });
      break;
  }
}

void swiglu_forward(const float* a, const float* b, float* y, int64_t n, int threads) {
  // a, b, y: (n)
  // y <- a * sigmoid(a) * b
  for_each_index(n, threads, [=](int64_t i) {
    const double v = a[i];
    y[i] = static_cast<float>(v * sigmoid(v) * b[i]);
  });
}

void swiglu_backward(const float* a, const float* b, const float* dy, float* da, float* db, int64_t n,
                     int threads) {
  // a, b, dy, da, db: (n)
  // s <- sigmoid(a);  silu'(a) = s (1 + a (1 - s)), with 1 - s taken as sigmoid(-a) (no cancellation)
  // da <- dy * b * silu'(a);  db <- dy * a * s
  for_each_index(n, threads, [=](int64_t i) {
    const double v = a[i];
    const double s = sigmoid(v);
    const double one_minus_s = sigmoid(-v);
    const double g = dy[i];
    da[i] = static_cast<float>(g * b[i] * (s * (1.0 + v * one_minus_s)));
    db[i] = static_cast<float>(g * (v * s));
  });
}

}  // namespace qkv::kernels
