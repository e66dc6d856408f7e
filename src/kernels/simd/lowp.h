// The row products of low-precision weights (kernels/quant.h), for the ISA of the translation
// unit that includes this: AVX-512 (with or without AVX512_VNNI), AVX2 (+F16C), or portable C++.
// Intrinsics live here and in vec.h only. Every function reads its row once, front to back.
//
// int8 blocks: each block's 32 products are summed exactly in int32 and then scaled in float.
// The unsigned-by-signed byte products (vpmaddubsw, vpdpbusd) take |w| as the unsigned operand
// (-128 reads as 128) and x with w's sign as the signed one; the activations lie in [-127, 127],
// so no product and no pair of products leaves int16: exact for every int8 weight.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/quant.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// GCC 12's AVX-512 headers build results on _mm512_undefined_*(), which -Wuninitialized reports
// at every call site (a known false positive of the headers, not of this code).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#ifndef QKV_ISA
#error "QKV_ISA must be defined by the build"
#endif

namespace qkv::simd {
inline namespace QKV_ISA {

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return kernels::f16_to_f32(h);
#endif
}

// The generic bodies: plain loops, every product exact, one float step per block.
inline float dot_q8_0_generic(const kernels::BlockQ8_0* w, const float* xd, const int8_t* xq, int64_t nb) {
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += static_cast<int32_t>(w[i].q[j]) * xq[i * 32 + j];
    acc += half_to_float(w[i].d) * xd[i] * static_cast<float>(s);
  }
  return acc;
}
// Q4_0, one row as files hold it, in the order every path takes (kernels/quant.h): each block's
// exact int32 sum P (the block correction c adds back the nibbles' offset of 8), then
// acc = fma(d_w d_x, P, acc). The rows after a matrix's last whole group of 16 take this.
inline float row_q4_0_exact(const kernels::BlockQ4_0* w, const float* xd, const int8_t* xq, const int32_t* c,
                            int64_t nb) {
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = c[i];
    for (int j = 0; j < 16; ++j) s += (w[i].q[j] & 15) * xq[i * 32 + j] + (w[i].q[j] >> 4) * xq[i * 32 + j + 16];
    const float scale = half_to_float(w[i].d) * xd[i];
    acc = std::fma(scale, static_cast<float>(s), acc);
  }
  return acc;
}
// A group of 16 grouped rows (kernels/quant.h) in plain loops: the same sums in the same order.
inline void group_q4_0_generic(const uint8_t* g, const float* xd, const int8_t* xq, const int32_t* c, int64_t nb,
                               float* y) {
  float acc[16] = {};
  for (int64_t i = 0; i < nb; ++i, g += kernels::kQ4GroupBlock) {
    const int8_t* x = xq + i * 32;
    for (int r = 0; r < 16; ++r) {
      int32_t s = c[i];
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 4; ++j) {
          const uint8_t b = g[32 + 64 * k + 4 * r + j];
          s += (b & 15) * x[4 * k + j] + (b >> 4) * x[16 + 4 * k + j];
        }
      const float scale = half_to_float(static_cast<uint16_t>(g[2 * r] | (g[2 * r + 1] << 8))) * xd[i];
      acc[r] = std::fma(scale, static_cast<float>(s), acc[r]);
    }
  }
  std::memcpy(y, acc, sizeof acc);
}
inline float dot_f16_generic(const uint16_t* w, const float* x, int64_t K) {
  float a[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= K; k += 4)
    for (int l = 0; l < 4; ++l) a[l] += half_to_float(w[k + l]) * x[k + l];
  for (; k < K; ++k) a[0] += half_to_float(w[k]) * x[k];
  return (a[0] + a[1]) + (a[2] + a[3]);
}
inline float dot_bf16_generic(const uint16_t* w, const uint16_t* x, int64_t K) {
  float a[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= K; k += 4)
    for (int l = 0; l < 4; ++l) a[l] += kernels::bf16_to_f32(w[k + l]) * kernels::bf16_to_f32(x[k + l]);
  for (; k < K; ++k) a[0] += kernels::bf16_to_f32(w[k]) * kernels::bf16_to_f32(x[k]);
  return (a[0] + a[1]) + (a[2] + a[3]);
}

#if defined(__AVX2__)

inline float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 8 int32 partial sums of 32 products w_j x_j (see the note above).
inline __m256i dot32_madd(__m256i w, __m256i x) {
  const __m256i u = _mm256_sign_epi8(w, w), s = _mm256_sign_epi8(x, w);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Q4_0, a group of 16 grouped rows (kernels/quant.h) with vpmaddubsw: the nibbles 0..15 are the
// unsigned operand as they are, the activations' four bytes that meet them one broadcast; each
// 256-bit half holds 8 rows, every int32 lane one row's sum (pairs of products stay far inside
// int16: |2 * 15 * 127| + the same again). The lanes start from the block correction, so each
// lane is exactly the row's P_i; then acc = fma(d_w d_x, P_i, acc), as row_q4_0_exact.
inline void q4_group_scales(const uint8_t* g, float xd, __m256* s0, __m256* s1) {
#if defined(__F16C__)
  *s0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
  *s1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 16)));
#else
  alignas(32) float d[16];
  for (int r = 0; r < 16; ++r) d[r] = half_to_float(static_cast<uint16_t>(g[2 * r] | (g[2 * r + 1] << 8)));
  *s0 = _mm256_load_ps(d), *s1 = _mm256_load_ps(d + 8);
#endif
  *s0 = _mm256_mul_ps(*s0, _mm256_set1_ps(xd));
  *s1 = _mm256_mul_ps(*s1, _mm256_set1_ps(xd));
}
inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void group_madd_q4_0(const uint8_t* g, const float* xd, const int8_t* xq, const int32_t* c, int64_t nb,
                            float* y) {
  const __m256i m = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, g += kernels::kQ4GroupBlock) {
    const int8_t* x = xq + i * 32;
    __m256i p[2] = {_mm256_set1_epi32(c[i]), _mm256_set1_epi32(c[i])};
    for (int k = 0; k < 4; ++k) {
      const __m256i lo = _mm256_set1_epi32(load4(x + 4 * k)), hi = _mm256_set1_epi32(load4(x + 16 + 4 * k));
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32 + 64 * k + 32 * h));
        const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, m), lo),
                                           _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m), hi));
        p[h] = _mm256_add_epi32(p[h], _mm256_madd_epi16(t, ones));
      }
    }
    __m256 s0, s1;
    q4_group_scales(g, xd[i], &s0, &s1);
    a0 = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(p[0]), a0);
    a1 = _mm256_fmadd_ps(s1, _mm256_cvtepi32_ps(p[1]), a1);
  }
  _mm256_storeu_ps(y, a0);
  _mm256_storeu_ps(y + 8, a1);
}
// Q8_0, one row, two accumulators: STEP(block, x) is a block's 8 int32 lanes (the sign trick of
// dot32_madd / dot32_vnni). Each block: its float scale times its lanes, added lane-wise; the
// lanes are summed at the end.
// (A macro, not a template: the VNNI loop needs its target attribute on the function that holds
// the loop, for its intrinsics to inline.)
#define QKV_ROW(NAME, ATTR, BLOCK, STEP)                                                                     \
  ATTR inline float NAME(const kernels::BLOCK* w, const float* xd, const int8_t* xq, int64_t nb) {           \
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                                               \
    int64_t i = 0;                                                                                           \
    for (; i + 2 <= nb; i += 2) {                                                                            \
      const __m256i p0 = STEP(w[i], load32(xq + i * 32));                                                    \
      const __m256i p1 = STEP(w[i + 1], load32(xq + i * 32 + 32));                                           \
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(w[i].d) * xd[i]), _mm256_cvtepi32_ps(p0), a0);       \
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(w[i + 1].d) * xd[i + 1]), _mm256_cvtepi32_ps(p1), a1); \
    }                                                                                                        \
    if (i < nb)                                                                                              \
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(w[i].d) * xd[i]),                                    \
                           _mm256_cvtepi32_ps(STEP(w[i], load32(xq + i * 32))), a0);                          \
    return hsum256(_mm256_add_ps(a0, a1));                                                                   \
  }
#define QKV_Q8_STEP_MADD(b, x) dot32_madd(load32((b).q), x)
QKV_ROW(row_madd_q8_0, , BlockQ8_0, QKV_Q8_STEP_MADD)

#if defined(__AVX512F__)
__attribute__((target("avx512vnni,avx512vl"))) inline __m256i dot32_vnni(__m256i w, __m256i x) {
  const __m256i u = _mm256_sign_epi8(w, w), s = _mm256_sign_epi8(x, w);
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

// With VNNI, the row products two blocks a step in 512-bit vectors: block i in the low 256 bits
// and block i + 1 in the high 256, the accumulator's halves QKV_ROW's a0 and a1. Every lane holds
// the same int32 sum and takes the same float steps in the same order, so the result is QKV_ROW's
// bit for bit (the AVX2 path's), in about half the instructions.
#define QKV_VNNI512 __attribute__((target("avx512vnni,avx512vl,avx512bw,avx512dq")))
// Q4_0, a group of 16 grouped rows with vpdpbusd: one 64-byte load holds four bytes of each of
// the 16 rows, its low and high nibbles meet the activations' bytes 4k.. and 16 + 4k.. (each one
// broadcast), and every int32 lane is one row's sum; two chains (low, high) a block, which start
// from the block correction and zero. The same P_i and float steps as group_madd_q4_0.
QKV_VNNI512 inline void group_vnni512_q4_0(const uint8_t* g, const float* xd, const int8_t* xq, const int32_t* c,
                                           int64_t nb, float* y) {
  const __m512i m = _mm512_set1_epi8(15);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, g += kernels::kQ4GroupBlock) {
    const int8_t* x = xq + i * 32;
    __m512i lo = _mm512_set1_epi32(c[i]), hi = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(g + 32 + 64 * k);
      lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(v, m), _mm512_set1_epi32(load4(x + 4 * k)));
      hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(v, 4), m), _mm512_set1_epi32(load4(x + 16 + 4 * k)));
    }
    const __m512 s = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g))),
                                   _mm512_set1_ps(xd[i]));
    acc = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), acc);
  }
  _mm512_storeu_ps(y, acc);
}
// Q8_0's bytes of blocks i and i + 1, signed by the 256-bit loop's sign trick: |w| unsigned, x
// negated where w < 0 (where w = 0 the product is 0 whatever x)
QKV_VNNI512 inline __m512i dot64_vnni(__m512i w, __m512i x) {
  const __m512i s = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), s);
}
// The blocks' scales half_to_float(d_i) * xd_i, 16 blocks at a time in one vector (the 16 float16
// scales gathered by plain loads into a row, widened with vcvtph2ps, times 16 activation scales in
// one product: the same IEEE operations as one block at a time, so the same floats), and each
// pair's two scales spread over its 16 lanes by one permute.
#define QKV_ROW512(NAME, BLOCK, PAIR, TAIL)                                                                  \
  QKV_VNNI512 inline float NAME(const kernels::BLOCK* w, const float* xd, const int8_t* xq, int64_t nb) {    \
    __m512 a = _mm512_setzero_ps();                                                                          \
    int64_t i = 0;                                                                                           \
    const __m512i first = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);                  \
    while (i + 16 <= nb) {                                                                                   \
      alignas(32) uint16_t d16[16];                                                                          \
      for (int j = 0; j < 16; ++j) d16[j] = w[i + j].d;                                                      \
      const __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d16))), \
                                      _mm512_loadu_ps(xd + i));                                              \
      __m512i idx = first; /* lanes 0-7: block i's scale, 8-15: block i + 1's */                            \
      for (const int64_t end = i + 16; i < end; i += 2) {                                                    \
        const __m512i x = _mm512_loadu_si512(xq + i * 32);                                                   \
        const __m512i p = PAIR;                                                                              \
        a = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, sc), _mm512_cvtepi32_ps(p), a);                       \
        idx = _mm512_add_epi32(idx, _mm512_set1_epi32(2));                                                   \
      }                                                                                                      \
    }                                                                                                        \
    for (; i + 2 <= nb; i += 2) {                                                                            \
      const __m512i x = _mm512_loadu_si512(xq + i * 32);                                                     \
      const __m512i p = PAIR;                                                                                \
      const __m512 s = _mm512_insertf32x8(_mm512_set1_ps(half_to_float(w[i].d) * xd[i]),                    \
                                          _mm256_set1_ps(half_to_float(w[i + 1].d) * xd[i + 1]), 1);          \
      a = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), a);                                                      \
    }                                                                                                        \
    __m256 a0 = _mm512_castps512_ps256(a);                                                                   \
    const __m256 a1 = _mm512_extractf32x8_ps(a, 1);                                                          \
    if (i < nb)                                                                                              \
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(w[i].d) * xd[i]), _mm256_cvtepi32_ps(TAIL), a0);    \
    return hsum256(_mm256_add_ps(a0, a1));                                                                   \
  }
QKV_ROW512(row_vnni512_q8_0, BlockQ8_0,
           dot64_vnni(_mm512_inserti64x4(_mm512_castsi256_si512(load32(w[i].q)), load32(w[i + 1].q), 1), x),
           dot32_vnni(load32(w[i].q), load32(xq + i * 32)))
#undef QKV_ROW512
#undef QKV_VNNI512
#endif
#undef QKV_ROW
#undef QKV_Q8_STEP_MADD

#endif  // __AVX2__

// Q4_0: n = 16 rows of a whole group (grouped), or n < 16 rows as files hold them (a matrix's
// rows after its last group), into y; c: the block corrections. Measured on Zen 4 (qkv bench
// gemv, 5632 x 2048, one thread): the rows one at a time as files hold them (two blocks a 512-bit
// step) read 15.6 GB/s, bound by instructions (about 14 a pair of blocks a row); grouped, the 16
// rows' bytes share each load, broadcast and scale step (about 30 instructions a block for all 16).
inline void rows_q4_0(const uint8_t* W, size_t rb, int64_t n, const float* xd, const int8_t* xq, const int32_t* c,
                      int64_t nb, float* y, bool vnni) {
  if (n == kernels::kQ4Group) {
#if defined(__AVX512F__)
    if (vnni) return group_vnni512_q4_0(W, xd, xq, c, nb, y);
#endif
#if defined(__AVX2__)
    (void)vnni;
    return group_madd_q4_0(W, xd, xq, c, nb, y);
#else
    (void)vnni;
    return group_q4_0_generic(W, xd, xq, c, nb, y);
#endif
  }
  for (int64_t r = 0; r < n; ++r)
    y[r] = row_q4_0_exact(reinterpret_cast<const kernels::BlockQ4_0*>(W + r * rb), xd, xq, c, nb);
}
// Q8_0: n rows (row stride rb bytes) into y, one after another. Measured on Zen 4 (qkv bench
// gemv, one thread): computing 2 or 4 rows at once (x loaded once for them) gained nothing on
// 1536 x 576 and made 5632 x 2048 2-2.5x slower in single runs.
#if defined(__AVX2__)
#define QKV_ROWS_LOOP(ROW, BLOCK)                                                                          \
  for (int64_t r = 0; r < n; ++r) y[r] = ROW(reinterpret_cast<const kernels::BLOCK*>(W + r * rb), xd, xq, nb)
#endif
inline void rows_q8_0(const uint8_t* W, size_t rb, int64_t n, const float* xd, const int8_t* xq, const int32_t* corr,
                      int64_t nb, float* y, bool vnni) {
  (void)corr;
#if defined(__AVX512F__)
  if (vnni) {
    QKV_ROWS_LOOP(row_vnni512_q8_0, BlockQ8_0);
    return;
  }
#endif
#if defined(__AVX2__)
  (void)vnni;
  QKV_ROWS_LOOP(row_madd_q8_0, BlockQ8_0);
#else
  (void)vnni;
  for (int64_t r = 0; r < n; ++r)
    y[r] = dot_q8_0_generic(reinterpret_cast<const kernels::BlockQ8_0*>(W + r * rb), xd, xq, nb);
#endif
}
#undef QKV_ROWS_LOOP


// kernels::quantize_activations over nb blocks of 32, bit for bit: per block the largest
// magnitude, d = amax / 127, q = x (127 / amax) rounded to nearest even (vrndscaleps, as
// nearbyint in the default rounding mode) and clamped to [-127, 127]; a block holding NaN or
// infinity gets d = NaN and q = 0. Portable code elsewhere.
inline void quantize_blocks(const float* x, int64_t nb, float* d, int8_t* q) {
#if defined(__AVX512F__)
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t i = 0; i < nb; ++i, x += 32, q += 32) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    // not finite: every exponent bit set
    const auto bad = [&](__m512 v) {
      return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exponent), exponent);
    };
    if ((bad(a) | bad(b)) != 0) {
      d[i] = std::numeric_limits<float>::quiet_NaN();
      std::memset(q, 0, 32);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    d[i] = amax / 127.0f;
    const float inv = 127.0f / amax;
    const __m512 id = _mm512_set1_ps(std::isfinite(inv) ? inv : 0.0f);
    const auto bytes = [&](__m512 v) {
      const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi)));
    };
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), bytes(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), bytes(b));
  }
#else
  kernels::quantize_activations(x, nb * 32, d, q);
#endif
}

// float16 and bfloat16 rows: widened to float in registers, four accumulators.
inline float dot_f16(const uint16_t* w, const float* x, int64_t K) {
#if defined(__AVX512F__)
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64)
    for (int l = 0; l < 4; ++l)
      a[l] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k + 16 * l))),
                             _mm512_loadu_ps(x + k + 16 * l), a[l]);
  for (; k + 16 <= K; k += 16)
    a[0] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k))),
                           _mm512_loadu_ps(x + k), a[0]);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  for (; k < K; ++k) s += half_to_float(w[k]) * x[k];
  return s;
#elif defined(__AVX2__) && defined(__F16C__)
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32)
    for (int l = 0; l < 4; ++l)
      a[l] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k + 8 * l))),
                             _mm256_loadu_ps(x + k + 8 * l), a[l]);
  for (; k + 8 <= K; k += 8)
    a[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k))),
                           _mm256_loadu_ps(x + k), a[0]);
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
  for (; k < K; ++k) s += half_to_float(w[k]) * x[k];
  return s;
#else
  return dot_f16_generic(w, x, K);
#endif
}

// bf16 rows against the activations rounded to bf16 (kernels::gemv rounds them once): every
// product is exact in float32 (8-bit significands), so the paths differ only in how they sum.
// With AVX512_BF16, vdpbf16ps takes 32 pairs a step (Intel's rounding: each pair added to its
// lane in turn, nearest even, denormal inputs and results flushed to zero); elsewhere both are
// widened (a shift) and summed by fma in four float32 accumulators.
#if defined(__AVX512F__)
__attribute__((target("avx512bf16,avx512bw,avx512f"))) inline float dot_bf16_dp(const uint16_t* w, const uint16_t* x,
                                                                                int64_t K) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const auto bh = [](const uint16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); };
  int64_t k = 0;
  for (; k + 128 <= K; k += 128)
    for (int l = 0; l < 4; ++l) a[l] = _mm512_dpbf16_ps(a[l], bh(w + k + 32 * l), bh(x + k + 32 * l));
  for (; k + 32 <= K; k += 32) a[0] = _mm512_dpbf16_ps(a[0], bh(w + k), bh(x + k));
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  for (; k < K; ++k) s += kernels::bf16_to_f32(w[k]) * kernels::bf16_to_f32(x[k]);
  return s;
}
#endif
inline float dot_bf16(const uint16_t* w, const uint16_t* x, int64_t K, bool dp) {
#if defined(__AVX512F__)
  if (dp) return dot_bf16_dp(w, x, K);
  auto widen = [](const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  };
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64)
    for (int l = 0; l < 4; ++l) a[l] = _mm512_fmadd_ps(widen(w + k + 16 * l), widen(x + k + 16 * l), a[l]);
  for (; k + 16 <= K; k += 16) a[0] = _mm512_fmadd_ps(widen(w + k), widen(x + k), a[0]);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  for (; k < K; ++k) s += kernels::bf16_to_f32(w[k]) * kernels::bf16_to_f32(x[k]);
  return s;
#elif defined(__AVX2__)
  (void)dp;
  auto widen = [](const uint16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  };
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32)
    for (int l = 0; l < 4; ++l) a[l] = _mm256_fmadd_ps(widen(w + k + 8 * l), widen(x + k + 8 * l), a[l]);
  for (; k + 8 <= K; k += 8) a[0] = _mm256_fmadd_ps(widen(w + k), widen(x + k), a[0]);
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
  for (; k < K; ++k) s += kernels::bf16_to_f32(w[k]) * kernels::bf16_to_f32(x[k]);
  return s;
#else
  (void)dp;
  return dot_bf16_generic(w, x, K);
#endif
}

// kernels::f32_to_bf16 on each of n values, bit for bit: (bits + 0x7fff + lsb) >> 16 rounds to
// nearest even (and overflows to infinity); a NaN keeps its top half with the quiet bit set.
inline uint16_t round_bf16_one(uint32_t bits) {
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}
inline void round_bf16(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BW__)
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40),
                magnitude = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  for (; i + 16 <= n; i += 16) {
    const __m512i b = _mm512_loadu_si512(x + i), top = _mm512_srli_epi32(b, 16);
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, bias), _mm512_and_si512(top, one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, magnitude), inf);
    const __m512i v = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(top, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(v));
  }
#elif defined(__AVX2__)
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40),
                magnitude = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 16 <= n; i += 16) {
    __m256i v[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8 * h));
      const __m256i top = _mm256_srli_epi32(b, 16);
      const __m256i r =
          _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, bias), _mm256_and_si256(top, one)), 16);
      // magnitudes are below 2^31: the signed comparison is the unsigned one
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, magnitude), inf);
      v[h] = _mm256_blendv_epi8(r, _mm256_or_si256(top, quiet), nan);
    }
    // every value fits 16 bits, so the saturating pack is exact; it interleaves 128-bit lanes
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v[0], v[1]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
#endif
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    out[i] = round_bf16_one(bits);
  }
}

// A group of 16 grouped Q4_0 rows (nb blocks; kernels/quant.h) dequantised, d * (q - 8) in
// float32 as kernels::dequantize_row computes it, then rounded to bfloat16 as round_bf16 does:
// row r to out + r * ldo. (Prompts' products on bf16 tiles, ops/layers.cpp.)
inline void q4_0_group_bf16(const uint8_t* g, int64_t nb, uint16_t* out, int64_t ldo) {
  for (int64_t i = 0; i < nb; ++i, g += kernels::kQ4GroupBlock) {
    for (int64_t r = 0; r < kernels::kQ4Group; ++r) {
      const float d = half_to_float(static_cast<uint16_t>(g[2 * r] | (g[2 * r + 1] << 8)));
      uint16_t* o = out + r * ldo + i * kernels::kQBlock;
#if defined(__AVX512BW__)
      const __m128i q = _mm_set_epi32(load4(reinterpret_cast<const int8_t*>(g + 32 + 192 + 4 * r)),
                                      load4(reinterpret_cast<const int8_t*>(g + 32 + 128 + 4 * r)),
                                      load4(reinterpret_cast<const int8_t*>(g + 32 + 64 + 4 * r)),
                                      load4(reinterpret_cast<const int8_t*>(g + 32 + 4 * r)));
      const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(15)), hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(15));
      const __m512i eight = _mm512_set1_epi32(8);
      alignas(64) float t[32];
      const __m512 dv = _mm512_set1_ps(d);
      _mm512_store_ps(t, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(lo), eight))));
      _mm512_store_ps(t + 16, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(hi), eight))));
      round_bf16(t, o, 32);
#else
      float t[32];
      for (int64_t k = 0; k < 4; ++k)
        for (int64_t m = 0; m < 4; ++m) {
          const uint8_t b = g[32 + 64 * k + 4 * r + m];
          t[4 * k + m] = d * static_cast<float>((b & 15) - 8);
          t[4 * k + m + 16] = d * static_cast<float>((b >> 4) - 8);
        }
      round_bf16(t, o, 32);
#endif
    }
  }
}

}  // namespace QKV_ISA
}  // namespace qkv::simd

#pragma GCC diagnostic pop
