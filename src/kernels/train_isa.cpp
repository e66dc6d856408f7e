// Vector bodies of the memory-bound training kernels: the cross-entropy row reductions, the
// AdamW update and the sum of squares behind the gradient norm. Compiled once per ISA like
// flash_attention_isa.cpp; cross_entropy.cpp and adamw.cpp pick one at run time and keep the
// threading, chunking and scalar bookkeeping. Every loop order here depends on the length only,
// so results are bitwise reproducible on a given ISA.
#include <cmath>
#include <cstring>

#include "kernels/simd/vec.h"
#include "kernels/train_isa.h"

namespace qkv::kernels::QKV_ISA {

using simd::vf;
using simd::W;

namespace {
// Partial float sums are moved into double every kBlock elements, so a row of 50257 classes
// keeps the accuracy of a double reduction (each lane adds at most kBlock / W terms in float).
constexpr int64_t kBlock = 32 * W;
}  // namespace

float row_max(const float* z, int64_t n) {
  // m <- max_j z_j, W lanes then the tail; NaN when any z_j is NaN (as torch.max), where a plain
  // "a > b ? a : b" would keep or drop a NaN depending on where it sits
  const auto max_nan = [](auto a, auto b) { return a > b || a != a ? a : b; };
  int64_t j = 0;
  float m = n > 0 ? z[0] : 0.0f;
  if (n >= W) {
    vf mv = simd::load(z);
    for (j = W; j + W <= n; j += W) mv = max_nan(mv, simd::load(z + j));
    m = mv[0];
    for (int l = 1; l < W; ++l) m = max_nan(m, mv[l]);
  }
  for (; j < n; ++j) m = max_nan(z[j], m);  // argument orders as before: the same bits for -0 vs +0
  return m;
}

double sum_exp(const float* z, int64_t n, float shift, double* zsum) {
  // s <- sum_j exp(z_j - shift) ;  zs <- sum_j z_j   (float within a block, double across blocks)
  double s = 0, zs = 0;
  const vf sh = simd::set1(shift);
  int64_t j = 0;
  for (; j + W <= n;) {
    const int64_t end = j + kBlock <= n ? j + kBlock : n - (n - j) % W;
    vf acc{}, zacc{};
    for (; j < end; j += W) {
      const vf x = simd::load(z + j);
      acc += simd::exp(x - sh);
      zacc += x;
    }
    s += simd::hsum(acc);
    zs += simd::hsum(zacc);
  }
  for (; j < n; ++j) {
    s += std::exp(z[j] - shift);
    zs += z[j];
  }
  if (zsum) *zsum = zs;
  return s;
}

double softmax_grad_row(const float* z, int64_t n, float lse, float a, float u, float* d) {
  // p_j <- exp(z_j - lse) ;  d_j <- a (p_j - u) ;  q <- sum_j p_j
  double q = 0;
  const vf l = simd::set1(lse), av = simd::set1(a), uv = simd::set1(u);
  int64_t j = 0;
  for (; j + W <= n;) {
    const int64_t end = j + kBlock <= n ? j + kBlock : n - (n - j) % W;
    vf acc{};
    for (; j < end; j += W) {
      const vf p = simd::exp(simd::load(z + j) - l);
      simd::store(d + j, av * (p - uv));
      acc += p;
    }
    q += simd::hsum(acc);
  }
  for (; j < n; ++j) {
    const float p = std::exp(z[j] - lse);
    d[j] = a * (p - u);
    q += p;
  }
  return q;
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWScalars& c) {
  // g <- grad grad_scale (clipping: one rounding, as torch's in-place grad.mul_(coef))
  // param <- param decay ;  m <- beta1 m + (1 - beta1) g ;  v <- beta2 v + (1 - beta2) g g
  // param <- param + neg_step m / (sqrt(v) / bc2_sqrt + eps)
  // A plain loop: the compiler vectorises it (this file has -fno-math-errno, so sqrt does too).
  if (c.grad_scale != 1.0f) {
    AdamWScalars unscaled = c;
    unscaled.grad_scale = 1.0f;
    float buf[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
      const int64_t len = n - i0 < 256 ? n - i0 : 256;
      for (int64_t i = 0; i < len; ++i) buf[i] = grad[i0 + i] * c.grad_scale;
      adamw_update(param + i0, buf, m + i0, v + i0, len, unscaled);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float w = param[i] * c.decay;
    const float mi = m[i] * c.beta1 + c.one_minus_b1 * g;
    const float vi = v[i] * c.beta2 + c.one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    param[i] = w + c.neg_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

double sum_squares(const float* g, int64_t n) {
  // s <- sum_i g_i^2, squared and summed in double: W/2 lanes of doubles, two accumulators
  typedef float vh __attribute__((vector_size(W / 2 * sizeof(float))));
  typedef double vd __attribute__((vector_size(W / 2 * sizeof(double))));
  vd acc0{}, acc1{};
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    vh lo, hi;
    std::memcpy(&lo, g + i, sizeof lo);
    std::memcpy(&hi, g + i + W / 2, sizeof hi);
    const vd dl = __builtin_convertvector(lo, vd), dh = __builtin_convertvector(hi, vd);
    acc0 += dl * dl;
    acc1 += dh * dh;
  }
  acc0 += acc1;
  double s = 0;
  for (int l = 0; l < W / 2; ++l) s += acc0[l];
  for (; i < n; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  return s;
}

}  // namespace qkv::kernels::QKV_ISA
