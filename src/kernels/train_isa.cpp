// Vector bodies of the memory-bound training kernels: the cross-entropy row reductions, the
// AdamW update and the sum of squares behind the gradient norm. Compiled once per ISA like
// flash_attention_isa.cpp; cross_entropy.cpp and adamw.cpp pick one at run time and keep the
// threading, chunking and scalar bookkeeping. Every loop order here depends on the length only,
// so results are bitwise reproducible on a given ISA.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/dropout.h"
#include "kernels/simd/lowp.h"
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

void dropout_mask(const float* in, float* out, int64_t n, uint64_t i0, uint64_t key, uint64_t threshold,
                  float scale) {
  // out_j <- mix(key + (i0 + j + 1) gamma) >> 32 >= threshold ? in_j * scale : 0, W elements at a
  // time in W lanes of 64-bit integers (AVX-512DQ multiplies them in one instruction, AVX2 and
  // SSE2 from 32-bit halves), the counter advanced by W gamma per vector; then the tail. Each
  // element depends on its own index only, so out == in is fine.
  typedef uint64_t vu __attribute__((vector_size(W * sizeof(uint64_t))));
  typedef int32_t vi __attribute__((vector_size(W * sizeof(int32_t))));
  using dropout_detail::kGamma;
  constexpr uint64_t kM1 = 0xbf58476d1ce4e5b9ULL, kM2 = 0x94d049bb133111ebULL;  // mix64's
  vu ctr;
  for (int l = 0; l < W; ++l) ctr[l] = key + (i0 + static_cast<uint64_t>(l) + 1) * kGamma;
  const vu step = (vu{} + kGamma) * static_cast<uint64_t>(W);
  const vf sc = simd::set1(scale), zero{};
  const vi flip = vi{} + INT32_MIN, thr = (vi{} + static_cast<int32_t>(static_cast<uint32_t>(threshold))) ^ flip;
  int64_t j = 0;
  for (; j + W <= n; j += W, ctr += step) {
    vu z = ctr;
    z = (z ^ (z >> 30)) * kM1;
    z = (z ^ (z >> 27)) * kM2;
    z ^= z >> 31;
    // the high halves narrowed to W 32-bit lanes and compared signed with both sides' top bit
    // flipped (an unsigned compare every ISA has); a compare of 64-bit lanes GCC did lane by lane
    const vi hi = __builtin_convertvector(z >> 32, vi) ^ flip;
    const vi keep = hi >= thr;  // -1 kept, 0 dropped
    const vf x = simd::load(in + j);
    simd::store(out + j, keep ? x * sc : zero);
  }
  for (; j < n; ++j)
    out[j] = dropout_detail::bits_at(key, i0 + static_cast<uint64_t>(j)) >= threshold ? in[j] * scale : 0.0f;
}

namespace {
// Two rows against four columns: each B load serves both rows, each A load four columns. Every
// (row, column) has its own accumulator with the same sequence of operations as dot1: a . b over
// K as W lanes of fused multiply-adds, then the lanes summed in a fixed tree, then the tail in
// order.
inline void dot2x4(const float* a0, const float* a1, const float* b0, const float* b1, const float* b2,
                   const float* b3, int64_t K, float out0[4], float out1[4]) {
  vf s00{}, s01{}, s02{}, s03{}, s10{}, s11{}, s12{}, s13{};
  int64_t k = 0;
  for (; k + W <= K; k += W) {
    const vf x0 = simd::load(a0 + k), x1 = simd::load(a1 + k);
    const vf y0 = simd::load(b0 + k), y1 = simd::load(b1 + k), y2 = simd::load(b2 + k), y3 = simd::load(b3 + k);
    s00 = simd::fma(x0, y0, s00), s01 = simd::fma(x0, y1, s01), s02 = simd::fma(x0, y2, s02), s03 = simd::fma(x0, y3, s03);
    s10 = simd::fma(x1, y0, s10), s11 = simd::fma(x1, y1, s11), s12 = simd::fma(x1, y2, s12), s13 = simd::fma(x1, y3, s13);
  }
  float r00 = simd::hsum(s00), r01 = simd::hsum(s01), r02 = simd::hsum(s02), r03 = simd::hsum(s03);
  float r10 = simd::hsum(s10), r11 = simd::hsum(s11), r12 = simd::hsum(s12), r13 = simd::hsum(s13);
  for (; k < K; ++k) {
    r00 += a0[k] * b0[k], r01 += a0[k] * b1[k], r02 += a0[k] * b2[k], r03 += a0[k] * b3[k];
    r10 += a1[k] * b0[k], r11 += a1[k] * b1[k], r12 += a1[k] * b2[k], r13 += a1[k] * b3[k];
  }
  out0[0] = r00, out0[1] = r01, out0[2] = r02, out0[3] = r03;
  out1[0] = r10, out1[1] = r11, out1[2] = r12, out1[3] = r13;
}

inline float dot1(const float* a, const float* b, int64_t K) {
  vf s{};
  int64_t k = 0;
  for (; k + W <= K; k += W) s = simd::fma(simd::load(a + k), simd::load(b + k), s);
  float r = simd::hsum(s);
  for (; k < K; ++k) r += a[k] * b[k];
  return r;
}
}  // namespace

void dot_rows(const float* A, int64_t lda, int64_t M, const float* B, int64_t ldb, int64_t j0, int64_t j1, int64_t K,
              float alpha, float beta, float* C, int64_t ldc) {
  // rows two at a time and columns four at a time, the rest of either one by one: every element
  // gets the same sums whichever way it is reached (its own accumulator, the same order)
  const auto put = [&](float* c, int64_t j, float r) { c[j] = alpha * r + (beta == 0.0f ? 0.0f : beta * c[j]); };
  int64_t i = 0;
  for (; i + 2 <= M; i += 2) {
    const float *a0 = A + i * lda, *a1 = a0 + lda;
    float *c0 = C + i * ldc, *c1 = c0 + ldc;
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4) {
      float r0[4], r1[4];
      dot2x4(a0, a1, B + j * ldb, B + (j + 1) * ldb, B + (j + 2) * ldb, B + (j + 3) * ldb, K, r0, r1);
      for (int t = 0; t < 4; ++t) put(c0, j + t, r0[t]), put(c1, j + t, r1[t]);
    }
    for (; j < j1; ++j) put(c0, j, dot1(a0, B + j * ldb, K)), put(c1, j, dot1(a1, B + j * ldb, K));
  }
  // A row alone (decoding's one token, or the last of an odd count): one column after another,
  // so that B streams from memory front to back (four columns at once read four streams at a
  // stride of ldb, which the prefetchers follow less well: on Zen 4, 1536 x 576 at 2 threads ran
  // at 30 GB/s this way against 24.5 GB/s four at a time and 22 GB/s in OpenBLAS's sgemv).
  for (; i < M; ++i) {
    const float* a = A + i * lda;
    float* c = C + i * ldc;
    for (int64_t j = j0; j < j1; ++j) put(c, j, dot1(a, B + j * ldb, K));
  }
}

void pack_bf16_blocks(const float* B, int64_t ldb, bool trans, int64_t K, int64_t N, int64_t padK, uint16_t* dst,
                      int64_t b0, int64_t b1) {
  constexpr int64_t kN = 64, kK = 32, kPairs = kK / 2;  // a block: 32 rows (16 pairs) x 64 columns
  static_assert(kN % W == 0 && kPairs % W == 0, "the transposes take W x W words");
  const int64_t kblocks = padK / kK, nblocks = (N + kN - 1) / kN;
  if (trans) {
    // column blocks b0 <= nb < b1: B's rows n0 .. n0 + 64, read from front to back
    for (int64_t nb = b0; nb < b1; ++nb) {
      const int64_t n0 = nb * kN, nn = std::max<int64_t>(0, std::min(kN, N - n0));  // columns inside op(B)
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t k0 = kb * kK, kk = std::max<int64_t>(0, std::min(kK, K - k0));  // rows inside op(B)
        uint16_t* d = dst + nb * padK * kN + kb * kK * kN;
        // t[b][0 .. 32) <- op(B)(k0 .. k0 + 32, n0 + b) = B[n0 + b][k0 .. k0 + 32), rounded: as 32-bit
        // words (a row pair each), t is 64 x 16; the block is its transpose, 16 x 64 words
        alignas(64) uint16_t t[kN * kK];
        for (int64_t b = 0; b < kN; ++b) {
          uint16_t* row = t + b * kK;
          const int64_t have = b < nn ? kk : 0;
          if (have > 0) simd::round_bf16(B + (n0 + b) * ldb + k0, row, have);
          std::fill(row + have, row + kK, uint16_t{0});
        }
        for (int64_t bq = 0; bq < kN; bq += W)
          for (int64_t aq = 0; aq < kPairs; aq += W) {
            simd::vf r[W];
            for (int i = 0; i < W; ++i) std::memcpy(&r[i], t + (bq + i) * kK + 2 * aq, sizeof r[i]);
            simd::transpose(r);  // moves bits only
            for (int j = 0; j < W; ++j) std::memcpy(d + ((aq + j) * kN + bq) * 2, &r[j], sizeof r[j]);
          }
      }
    }
    return;
  }
  // row blocks b0 <= kb < b1: B's rows k0 .. k0 + 32, read from front to back; rows k0 + 2a and
  // k0 + 2a + 1, rounded, interleaved element by element
  alignas(64) uint16_t r0[kN], r1[kN];
  for (int64_t kb = b0; kb < b1; ++kb)
    for (int64_t a = 0; a < kPairs; ++a) {
      const int64_t k = kb * kK + 2 * a;
      for (int64_t nb = 0; nb < nblocks; ++nb) {
        const int64_t n0 = nb * kN, nn = std::min(kN, N - n0);
        const int64_t h0 = k < K ? nn : 0, h1 = k + 1 < K ? nn : 0;
        if (h0 > 0) simd::round_bf16(B + k * ldb + n0, r0, h0);
        if (h1 > 0) simd::round_bf16(B + (k + 1) * ldb + n0, r1, h1);
        std::fill(r0 + h0, r0 + kN, uint16_t{0});
        std::fill(r1 + h1, r1 + kN, uint16_t{0});
        uint16_t* o = dst + nb * padK * kN + kb * kK * kN + a * 2 * kN;
        for (int64_t b = 0; b < kN; ++b) {
          o[2 * b] = r0[b];
          o[2 * b + 1] = r1[b];
        }
      }
    }
}

}  // namespace qkv::kernels::QKV_ISA
