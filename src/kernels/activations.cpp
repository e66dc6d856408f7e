#include "kernels/activations.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

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

// Phi(x) = 0.5 (1 + erf(x / sqrt(2))) and phi(x) = exp(-x^2/2) / sqrt(2 pi), in double: GELU-erf is
// x Phi(x) (0.5 x (1 + erf(..)) rounds the same, since the 0.5 is exact) and its derivative
// Phi(x) + x phi(x).
struct NormalParts {
  double cdf, pdf;
};
inline NormalParts normal_parts(double v) {
  return {0.5 * (1.0 + std::erf(v * kInvSqrt2)), kInvSqrt2Pi * std::exp(-0.5 * v * v)};
}

// GELU-tanh and SiLU run on explicit vectors of kLanes doubles (GCC vector extensions: one
// AVX-512 register in the x86-64-v4 clone, two AVX2 ones with FMA in the x86-64-v3 clone, SSE2
// pairs in the default one, picked by CPU features at load time): libm's scalar tanh and expm1
// took a tenth of a GPT-2 training step, and GCC 12 does not auto-vectorise these loops. Every
// operation is lane by lane, so the lane count never changes a bit; GCC fuses the same
// multiply-adds in the two clones that have FMA, which give the same bits as each other (checked
// with the clone attributes removed and the file built for each -march), while the default
// clone, without FMA, rounds those products separately (within an ulp of the double result
// before the final rounding to float).
// The vectors pass between inline helpers of this file only, so the ABI note GCC gives for them
// in the clones without wide registers does not apply (CMakeLists.txt: -Wno-psabi for this file).
// The helpers below are always inlined: a clone that called one out of line would pass it the
// vectors under another convention than the helper reads them with (the x86-64-v4 clone did,
// and the Activations tests failed).
// Clang refuses such vectors as arguments of functions compiled without the matching ISA; its
// only use here is the fuzz build, which compiles this file with -mavx and never runs these
// kernels, so there the vectors stay at 4 lanes.
#if defined(__clang__)
constexpr int kLanes = 4;
#else
constexpr int kLanes = 8;
#endif
typedef double vd __attribute__((vector_size(kLanes * sizeof(double))));
typedef int64_t vl __attribute__((vector_size(kLanes * sizeof(int64_t))));

[[gnu::always_inline]] inline vd splat(double x) {
  vd v;
  for (int j = 0; j < kLanes; ++j) v[j] = x;
  return v;
}

// exp(x), lanewise: x = n ln2 + r with |r| <= ln2/2 (n rounded through the 1.5 * 2^52 trick),
// exp(r) by its Taylor series to r^11 (truncation error below 1e-13 relative), then 2^n through
// the exponent bits. Arguments are clamped to [-700, 700] first (NaN stays NaN: the compare is
// false); the callers only need exp to be huge or tiny beyond that.
[[gnu::always_inline]] inline vd exp_clamped(vd x) {
  constexpr double kLog2e = 1.4426950408889634074, kLn2Hi = 0.693147180369123816490,
                   kLn2Lo = 1.90821492927058770002e-10, kShift = 6755399441055744.0;  // 1.5 * 2^52
  x = x < splat(-700.0) ? splat(-700.0) : x;
  x = x > splat(700.0) ? splat(700.0) : x;
  const vd t = x * kLog2e + kShift;
  const vd n = t - kShift;
  const vd r = (x - n * kLn2Hi) - n * kLn2Lo;
  vd p = splat(1.0 / 39916800.0);
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^n: n sits in the low 32 bits of t's mantissa, offset by 2^31.
  const vl ni = (std::bit_cast<vl>(t) & 0xFFFFFFFFll) - 0x80000000ll;
  return p * std::bit_cast<vd>((ni + 1023) << 52);
}

// Loads up to kLanes floats as doubles (missing lanes 0) and stores lanes back; whole vectors in one
// conversion.
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));
[[gnu::always_inline]] inline vd loadv(const float* p, int64_t k) {
  vf f = {};
  if (k == kLanes) {
    std::memcpy(&f, p, sizeof f);
  } else {
    for (int64_t j = 0; j < k; ++j) f[j] = p[j];
  }
  return __builtin_convertvector(f, vd);
}
[[gnu::always_inline]] inline void storev(float* p, vd v, int64_t k) {
  const vf f = __builtin_convertvector(v, vf);
  if (k == kLanes) {
    std::memcpy(p, &f, sizeof f);
  } else {
    for (int64_t j = 0; j < k; ++j) p[j] = f[j];
  }
}

// GELU-tanh as y = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), since
// 0.5 (1 + tanh(u)) = sigmoid(2u): no cancellation near tanh = -1. Computed in double and rounded
// once. u comes from x clamped to [-1e4, 1e4], where sigmoid(2u) is already exactly 0 or 1 in
// double, so every intermediate stays finite; a NaN x gives NaN.
[[gnu::always_inline]] inline vd clamp_x(vd v) {
  v = v < splat(-1e4) ? splat(-1e4) : v;
  return v > splat(1e4) ? splat(1e4) : v;
}

// s = sigmoid(2u) and e = exp(-2u) for x clamped as above (vc).
struct GeluTanhParts {
  vd s, e;
};
[[gnu::always_inline]] inline GeluTanhParts gelu_tanh_parts(vd vc) {
  const vd u = kSqrt2OverPi * (vc + kGeluCubic * vc * vc * vc);
  const vd e = exp_clamped(-2.0 * u);
  return {1.0 / (1.0 + e), e};
}

// d/dx [x sigmoid(2u)] = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2), with
// 1 - s = s e, e = exp(-2u) (no cancellation). Where s saturates, s (1 - s) is ~1e-304 and the
// second term vanishes in the rounding to float.
[[gnu::always_inline]] inline vd gelu_tanh_grad(vd vc, GeluTanhParts p) {
  const vd du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * vc * vc);
  return p.s + 2.0 * vc * (p.s * p.s * p.e) * du;
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void gelu_tanh_forward_block(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    const vd v = loadv(x + i, k);
    storev(y + i, v * gelu_tanh_parts(clamp_x(v)).s, k);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void gelu_tanh_backward_block(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    const vd vc = clamp_x(loadv(x + i, k));
    storev(dx + i, loadv(dy + i, k) * gelu_tanh_grad(vc, gelu_tanh_parts(vc)), k);
  }
}

// y and f'(x) in one pass, sharing the exponential: for training, so that the backward pass is
// a plain product dx = dy f'(x) (the exponential was most of the backward's time).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void gelu_tanh_forward_grad_block(const float* x, float* y, float* dydx, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    const vd v = loadv(x + i, k);
    const vd vc = clamp_x(v);
    const GeluTanhParts p = gelu_tanh_parts(vc);
    storev(y + i, v * p.s, k);
    storev(dydx + i, gelu_tanh_grad(vc, p), k);
  }
}

// SiLU on vectors of kLanes doubles, the same arithmetic as act_value / act_grad below (which libm's
// exp made 14% of a gated decoder's prompt and the largest serial part of its decoding step):
// e = exp(-|v|), exactly 0 below -700 as libm's exp rounds there, sigmoid(v) = 1 / (1 + e) for
// v >= 0 and e / (1 + e) otherwise; sigmoid(-v) the other of the two. A NaN stays NaN; silu(-inf)
// is -inf * 0 = NaN, as x * sigmoid(x) gives in PyTorch.
struct SiluParts {
  vd s, sm;  // sigmoid(v), sigmoid(-v)
};
[[gnu::always_inline]] inline SiluParts silu_parts(vd v) {
  const vd a = v < splat(0.0) ? -v : v;  // |v| (a NaN stays NaN)
  const vd na = -a;
  const vd e = na < splat(-700.0) ? splat(0.0) : exp_clamped(na);
  const vd pos = 1.0 / (1.0 + e), neg = e / (1.0 + e);
  return {v >= splat(0.0) ? pos : neg, v <= splat(0.0) ? pos : neg};
}
// silu'(v) = s (1 + v sigmoid(-v))
[[gnu::always_inline]] inline vd silu_grad(vd v, SiluParts p) { return p.s * (1.0 + v * p.sm); }

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void silu_forward_block(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    const vd v = loadv(x + i, k);
    storev(y + i, v * silu_parts(v).s, k);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void silu_backward_block(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    const vd v = loadv(x + i, k);
    storev(dx + i, loadv(dy + i, k) * silu_grad(v, silu_parts(v)), k);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void silu_forward_grad_block(const float* x, float* y, float* dydx, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    const vd v = loadv(x + i, k);
    const SiluParts p = silu_parts(v);
    storev(y + i, v * p.s, k);
    storev(dydx + i, silu_grad(v, p), k);
  }
}

// y = silu(a) b
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void silu_gated_forward_block(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    const vd v = loadv(a + i, k);
    storev(y + i, v * silu_parts(v).s * loadv(b + i, k), k);
  }
}

// da = dy b silu'(a), db = dy silu(a)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void silu_gated_backward_block(const float* a, const float* b, const float* dy, float* da, float* db, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const int64_t k = std::min<int64_t>(kLanes, n - i);
    const vd v = loadv(a + i, k), g = loadv(dy + i, k);
    const SiluParts p = silu_parts(v);
    storev(da + i, g * loadv(b + i, k) * silu_grad(v, p), k);
    storev(db + i, g * (v * p.s), k);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void multiply_block(const float* __restrict a, const float* __restrict b, float* __restrict c, int64_t n) {
  for (int64_t i = 0; i < n; ++i) c[i] = a[i] * b[i];
}

// f(v) and f'(v) of one element in double, for SiLU and the gated forms. GELU-tanh as
// v sigmoid(2u) with u from v clamped (as the vector blocks above); SiLU as v sigmoid(v), its
// derivative s (1 + v (1 - s)) with 1 - s taken as sigmoid(-v) (no cancellation). ReLU keeps a
// NaN (v <= 0 fails), and its derivative there is 1, so dy passes (as PyTorch).
double act_value(Activation f, double v) {
  switch (f) {
    case Activation::ReLU: return v <= 0.0 ? 0.0 : v;
    case Activation::GeluErf: return v * normal_parts(v).cdf;
    case Activation::GeluTanh: {
      const double vc = std::clamp(v, -1e4, 1e4), u = kSqrt2OverPi * (vc + kGeluCubic * vc * vc * vc);
      return v * sigmoid(2.0 * u);
    }
    case Activation::SiLU: return v * sigmoid(v);
    case Activation::Tanh: return std::tanh(v);
  }
  return v;
}
double act_grad(Activation f, double v) {
  switch (f) {
    case Activation::ReLU: return v <= 0.0 ? 0.0 : 1.0;
    case Activation::GeluErf: {
      const NormalParts p = normal_parts(v);
      return p.cdf + v * p.pdf;
    }
    case Activation::GeluTanh: {
      const double vc = std::isnan(v) ? v : std::clamp(v, -1e4, 1e4);
      const double u = kSqrt2OverPi * (vc + kGeluCubic * vc * vc * vc);
      const double s = sigmoid(2.0 * u), du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * vc * vc);
      return s + 2.0 * vc * (s * sigmoid(-2.0 * u)) * du;
    }
    case Activation::SiLU: return sigmoid(v) * (1.0 + v * sigmoid(-v));
    case Activation::Tanh: {
      // 1 - tanh^2 = 4 s (1 - s) with s = sigmoid(2v): no cancellation where tanh is near +-1
      const double s = sigmoid(2.0 * v);
      return 4.0 * s * sigmoid(-2.0 * v);
    }
  }
  return 1.0;
}

// ReLU and its gradient as plain loops over restrict pointers, which GCC vectorises (through the
// generic for_each_index lambda it did not: the ReLU backward was 2% of a 2017-base training step).
// Written as "x <= 0 ? 0 : x", not "x > 0 ? x : 0": the same for every number (-0 gives +0), but
// a NaN fails both comparisons and so stays NaN, as in PyTorch (torch.relu(nan) = nan), instead of
// becoming 0 and hiding NaN weights behind a finite loss. The gradient likewise passes dy where
// x is NaN (PyTorch's threshold_backward: x <= 0 ? 0 : dy).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void relu_forward_block(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] <= 0.0f ? 0.0f : x[i];
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void relu_backward_block(const float* __restrict x, const float* __restrict dy, float* __restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] <= 0.0f ? 0.0f : dy[i];
}

// Runs block(begin, count) over [0, n) in blocks of 4096, in parallel when n is large enough.
template <class Block>
void for_each_block(int64_t n, int threads, Block block) {
  constexpr int64_t kB = 4096;
  const int64_t blocks = (n + kB - 1) / kB;
#pragma omp parallel for num_threads(clamp_threads(threads)) schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) block(b * kB, std::min(kB, n - b * kB));
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
      for_each_block(n, threads, [=](int64_t b, int64_t c) { relu_forward_block(x + b, y + b, c); });
      break;
    case Activation::GeluErf:
      // y <- 0.5 x (1 + erf(x / sqrt(2)))
      for_each_index(n, threads, [=](int64_t i) {
        const double v = x[i];
        y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * kInvSqrt2)));
      });
      break;
    case Activation::GeluTanh:
      // y <- 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) = x sigmoid(2u)
      for_each_block(n, threads, [=](int64_t b, int64_t c) { gelu_tanh_forward_block(x + b, y + b, c); });
      break;
    case Activation::SiLU:
      // y <- x sigmoid(x)
      for_each_block(n, threads, [=](int64_t b, int64_t c) { silu_forward_block(x + b, y + b, c); });
      break;
    case Activation::Tanh:
      // y <- tanh(x)
      for_each_index(n, threads, [=](int64_t i) { y[i] = static_cast<float>(act_value(a, x[i])); });
      break;
  }
}

void activation_backward(Activation a, const float* x, const float* dy, float* dx, int64_t n, int threads) {
  // x, dy, dx: (n)
  switch (a) {
    case Activation::ReLU:
      // dx <- dy * [x > 0]
      for_each_block(n, threads, [=](int64_t b, int64_t c) { relu_backward_block(x + b, dy + b, dx + b, c); });
      break;
    case Activation::GeluErf:
      // dx <- dy * (Phi(x) + x phi(x)),  Phi(x) = 0.5 (1 + erf(x / sqrt(2))),  phi(x) = exp(-x^2/2) / sqrt(2 pi)
      for_each_index(n, threads, [=](int64_t i) {
        const double v = x[i];
        const NormalParts p = normal_parts(v);
        dx[i] = static_cast<float>(dy[i] * (p.cdf + v * p.pdf));
      });
      break;
    case Activation::GeluTanh:
      // dx <- dy * d/dx [x sigmoid(2u)]
      for_each_block(n, threads, [=](int64_t b, int64_t c) { gelu_tanh_backward_block(x + b, dy + b, dx + b, c); });
      break;
    case Activation::SiLU:
      // dx <- dy * s (1 + x (1 - s)), s = sigmoid(x)
      for_each_block(n, threads, [=](int64_t b, int64_t c) { silu_backward_block(x + b, dy + b, dx + b, c); });
      break;
    case Activation::Tanh:
      // dx <- dy * (1 - tanh^2 x)
      for_each_index(n, threads, [=](int64_t i) { dx[i] = static_cast<float>(dy[i] * act_grad(a, x[i])); });
      break;
  }
}

void activation_forward_grad(Activation a, const float* x, float* y, float* dydx, int64_t n, int threads) {
  // x, y, dydx: (n)
  switch (a) {
    case Activation::ReLU:
      // y <- max(x, 0);  f' <- [x > 0]   (NaN: y = NaN, f' = 1, as relu_forward/backward_block)
      for_each_index(n, threads, [=](int64_t i) {
        const bool on = !(x[i] <= 0.0f);
        y[i] = on ? x[i] : 0.0f;
        dydx[i] = on ? 1.0f : 0.0f;
      });
      break;
    case Activation::GeluErf:
      // y <- x Phi(x);  f' <- Phi(x) + x phi(x)
      for_each_index(n, threads, [=](int64_t i) {
        const double v = x[i];
        const NormalParts p = normal_parts(v);
        y[i] = static_cast<float>(v * p.cdf);
        dydx[i] = static_cast<float>(p.cdf + v * p.pdf);
      });
      break;
    case Activation::GeluTanh:
      for_each_block(n, threads, [=](int64_t b, int64_t c) { gelu_tanh_forward_grad_block(x + b, y + b, dydx + b, c); });
      break;
    case Activation::SiLU:
      for_each_block(n, threads, [=](int64_t b, int64_t c) { silu_forward_grad_block(x + b, y + b, dydx + b, c); });
      break;
    case Activation::Tanh:
      for_each_index(n, threads, [=](int64_t i) {
        y[i] = static_cast<float>(act_value(a, x[i]));
        dydx[i] = static_cast<float>(act_grad(a, x[i]));
      });
      break;
  }
}

void multiply(const float* a, const float* b, float* c, int64_t n, int threads) {
  // c <- a * b
  for_each_block(n, threads, [=](int64_t i, int64_t k) { multiply_block(a + i, b + i, c + i, k); });
}

void gated_forward(Activation f, const float* a, const float* b, float* y, int64_t n, int threads) {
  // a, b, y: (n)
  // y <- f(a) * b
  if (f == Activation::SiLU) {
    for_each_block(n, threads, [=](int64_t i, int64_t c) { silu_gated_forward_block(a + i, b + i, y + i, c); });
    return;
  }
  for_each_index(n, threads, [=](int64_t i) { y[i] = static_cast<float>(act_value(f, a[i]) * b[i]); });
}

void gated_backward(Activation f, const float* a, const float* b, const float* dy, float* da, float* db, int64_t n,
                    int threads) {
  // a, b, dy, da, db: (n)
  // da <- dy * b * f'(a);  db <- dy * f(a)
  if (f == Activation::SiLU) {
    for_each_block(n, threads,
                   [=](int64_t i, int64_t c) { silu_gated_backward_block(a + i, b + i, dy + i, da + i, db + i, c); });
    return;
  }
  for_each_index(n, threads, [=](int64_t i) {
    const double v = a[i], g = dy[i];
    da[i] = static_cast<float>(g * b[i] * act_grad(f, v));
    db[i] = static_cast<float>(g * act_value(f, v));
  });
}

}  // namespace qkv::kernels
