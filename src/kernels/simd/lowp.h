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
inline float dot_q4_0_generic(const kernels::BlockQ4_0* w, const float* xd, const int8_t* xq, int64_t nb) {
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
      s += ((w[i].q[j] & 15) - 8) * xq[i * 32 + j];
      s += ((w[i].q[j] >> 4) - 8) * xq[i * 32 + j + 16];
    }
    acc += half_to_float(w[i].d) * xd[i] * static_cast<float>(s);
  }
  return acc;
}
inline float dot_f16_generic(const uint16_t* w, const float* x, int64_t K) {
  float a[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= K; k += 4)
    for (int l = 0; l < 4; ++l) a[l] += half_to_float(w[k + l]) * x[k + l];
  for (; k < K; ++k) a[0] += half_to_float(w[k]) * x[k];
  return (a[0] + a[1]) + (a[2] + a[3]);
}
inline float dot_bf16_generic(const uint16_t* w, const float* x, int64_t K) {
  float a[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= K; k += 4)
    for (int l = 0; l < 4; ++l) a[l] += kernels::bf16_to_f32(w[k + l]) * x[k + l];
  for (; k < K; ++k) a[0] += kernels::bf16_to_f32(w[k]) * x[k];
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

// Q4_0 without the sign trick: the nibbles 0..15 are the unsigned operand as they are, and the
// offset of 8 comes back through per-lane corrections c_k = -8 (x_4k + ... + x_4k+3)
// (q4_lane_corrections), the products' starting value. So every int32 lane is exactly the sum
// over (q - 8) x that the sign trick gave, in three fewer instructions per block.
inline __m256i q4_nibbles(const uint8_t* q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}
inline __m256i dot32u_madd(__m256i c, __m256i u, __m256i s) {
  return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
// One row, two accumulators: STEP(c, block, x) is a block's 8 int32 lanes, c its lane
// corrections (Q4_0; none for Q8_0, whose bytes take the sign trick of dot32_madd / dot32_vnni).
// Each block: its float scale times its lanes, added lane-wise; the lanes are summed at the end.
// (A macro, not a template: the VNNI loop needs its target attribute on the function that holds
// the loop, for its intrinsics to inline.)
#define QKV_ROW(NAME, ATTR, BLOCK, STEP, CORR)                                                               \
  ATTR inline float NAME(const kernels::BLOCK* w, const float* xd, const int8_t* xq, const int32_t* corr,     \
                         int64_t nb) {                                                                       \
    const auto lanes_c = [corr](int64_t i) {                                                                 \
      return CORR ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + i * 8)) : _mm256_setzero_si256(); \
    };                                                                                                       \
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                                               \
    int64_t i = 0;                                                                                           \
    for (; i + 2 <= nb; i += 2) {                                                                            \
      const __m256i p0 = STEP(lanes_c(i), w[i], load32(xq + i * 32));                                        \
      const __m256i p1 = STEP(lanes_c(i + 1), w[i + 1], load32(xq + i * 32 + 32));                           \
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(w[i].d) * xd[i]), _mm256_cvtepi32_ps(p0), a0);       \
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(w[i + 1].d) * xd[i + 1]), _mm256_cvtepi32_ps(p1), a1); \
    }                                                                                                        \
    if (i < nb)                                                                                              \
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(w[i].d) * xd[i]),                                    \
                           _mm256_cvtepi32_ps(STEP(lanes_c(i), w[i], load32(xq + i * 32))), a0);              \
    return hsum256(_mm256_add_ps(a0, a1));                                                                   \
  }
#define QKV_Q4_STEP_MADD(c, b, x) dot32u_madd(c, q4_nibbles((b).q), x)
#define QKV_Q8_STEP_MADD(c, b, x) ((void)(c), dot32_madd(load32((b).q), x))
QKV_ROW(row_madd_q4_0, , BlockQ4_0, QKV_Q4_STEP_MADD, true)
QKV_ROW(row_madd_q8_0, , BlockQ8_0, QKV_Q8_STEP_MADD, false)

#if defined(__AVX512F__)
__attribute__((target("avx512vnni,avx512vl"))) inline __m256i dot32u_vnni(__m256i c, __m256i u, __m256i s) {
  return _mm256_dpbusd_epi32(c, u, s);
}
__attribute__((target("avx512vnni,avx512vl"))) inline __m256i dot32_vnni(__m256i w, __m256i x) {
  const __m256i u = _mm256_sign_epi8(w, w), s = _mm256_sign_epi8(x, w);
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

// With VNNI, the row products two blocks a step in 512-bit vectors: block i in the low 256 bits
// and block i + 1 in the high 256, the accumulator's halves QKV_ROW's a0 and a1. Every lane holds
// the same int32 sum and takes the same float steps in the same order, so the result is QKV_ROW's
// bit for bit (the AVX2 path's), in about half the instructions.
#define QKV_VNNI512 __attribute__((target("avx512vnni,avx512vl,avx512bw,avx512dq")))
// Q4_0's nibbles of blocks i and i + 1: [low nibbles of i | high of i | low of i+1 | high of i+1]
QKV_VNNI512 inline __m512i q4_nibbles2(const uint8_t* qa, const uint8_t* qb) {
  const __m256i both = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(qb), reinterpret_cast<const __m128i*>(qa));
  const __m512i b = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0), _mm512_castsi256_si512(both));
  // 128-bit lanes 1 and 3 shifted right by 4 (their high nibbles), then every byte masked to 4 bits
  const __m512i shifted = _mm512_mask_blend_epi64(0xCC, b, _mm512_srli_epi16(b, 4));
  return _mm512_and_si512(shifted, _mm512_set1_epi8(15));
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
// pair's two scales spread over its 16 lanes by one permute. 16 blocks of Q4_0 took 9 scalar
// instructions a pair for their scales before; now about 3.
#define QKV_ROW512(NAME, BLOCK, PAIR, TAIL)                                                                  \
  QKV_VNNI512 inline float NAME(const kernels::BLOCK* w, const float* xd, const int8_t* xq, const int32_t* corr, \
                                int64_t nb) {                                                                 \
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
    (void)corr;                                                                                              \
    return hsum256(_mm256_add_ps(a0, a1));                                                                   \
  }
QKV_ROW512(row_vnni512_q4_0, BlockQ4_0,
           _mm512_dpbusd_epi32(_mm512_loadu_si512(corr + i * 8), q4_nibbles2(w[i].q, w[i + 1].q), x),
           dot32u_vnni(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + i * 8)), q4_nibbles(w[i].q),
                       load32(xq + i * 32)))
QKV_ROW512(row_vnni512_q8_0, BlockQ8_0,
           dot64_vnni(_mm512_inserti64x4(_mm512_castsi256_si512(load32(w[i].q)), load32(w[i + 1].q), 1), x),
           dot32_vnni(load32(w[i].q), load32(xq + i * 32)))
#undef QKV_ROW512
#undef QKV_VNNI512
#endif
#undef QKV_ROW
#undef QKV_Q4_STEP_MADD
#undef QKV_Q8_STEP_MADD

#endif  // __AVX2__

// n rows (row stride rb bytes) into y, one after another. corr: Q4_0's lane corrections (unused
// for Q8_0). Measured on Zen 4 (qkv bench gemv, one thread, medians of alternating runs): dropping
// the sign trick took Q4_0's 1536 x 576 product from 48 to 40 us, and left 5632 x 2048 where it
// was (about 495 us, bound by memory); computing 2 or 4 rows at once (x loaded once for them)
// gained nothing on the small shape and made the large one 2-2.5x slower in single runs (the
// rows' interleaved streams stall the loads), and Q8_0 likewise.
#if defined(__AVX2__)
#define QKV_ROWS_LOOP(ROW, BLOCK)                                                                          \
  for (int64_t r = 0; r < n; ++r) y[r] = ROW(reinterpret_cast<const kernels::BLOCK*>(W + r * rb), xd, xq, corr, nb)
#endif
inline void rows_q4_0(const uint8_t* W, size_t rb, int64_t n, const float* xd, const int8_t* xq, const int32_t* corr,
                      int64_t nb, float* y, bool vnni) {
#if defined(__AVX512F__)
  if (vnni) {
    QKV_ROWS_LOOP(row_vnni512_q4_0, BlockQ4_0);
    return;
  }
#endif
#if defined(__AVX2__)
  (void)vnni;
  QKV_ROWS_LOOP(row_madd_q4_0, BlockQ4_0);
#else
  (void)corr, (void)vnni;
  for (int64_t r = 0; r < n; ++r)
    y[r] = dot_q4_0_generic(reinterpret_cast<const kernels::BlockQ4_0*>(W + r * rb), xd, xq, nb);
#endif
}
inline void rows_q8_0(const uint8_t* W, size_t rb, int64_t n, const float* xd, const int8_t* xq, const int32_t* corr,
                      int64_t nb, float* y, bool vnni) {
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
  (void)corr, (void)vnni;
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

inline float dot_bf16(const uint16_t* w, const float* x, int64_t K) {
#if defined(__AVX512F__)
  auto widen = [](const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  };
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 64 <= K; k += 64)
    for (int l = 0; l < 4; ++l) a[l] = _mm512_fmadd_ps(widen(w + k + 16 * l), _mm512_loadu_ps(x + k + 16 * l), a[l]);
  for (; k + 16 <= K; k += 16) a[0] = _mm512_fmadd_ps(widen(w + k), _mm512_loadu_ps(x + k), a[0]);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  for (; k < K; ++k) s += kernels::bf16_to_f32(w[k]) * x[k];
  return s;
#elif defined(__AVX2__)
  auto widen = [](const uint16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  };
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32)
    for (int l = 0; l < 4; ++l) a[l] = _mm256_fmadd_ps(widen(w + k + 8 * l), _mm256_loadu_ps(x + k + 8 * l), a[l]);
  for (; k + 8 <= K; k += 8) a[0] = _mm256_fmadd_ps(widen(w + k), _mm256_loadu_ps(x + k), a[0]);
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
  for (; k < K; ++k) s += kernels::bf16_to_f32(w[k]) * x[k];
  return s;
#else
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

}  // namespace QKV_ISA
}  // namespace qkv::simd

#pragma GCC diagnostic pop
