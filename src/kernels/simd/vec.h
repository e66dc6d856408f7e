// The one small vector abstraction kernels use. It is written with GCC/Clang vector extensions,
// so the same source compiles to SSE2 (W = 4), AVX2+FMA (W = 8) or AVX-512 (W = 16) depending on
// the flags of the translation unit that includes it (see CMakeLists.txt: one object library
// per ISA, chosen at run time in src/core/cpu.cpp). No intrinsics anywhere else.
#pragma once
#include <cstdint>
#include <cstring>
#include <utility>

#ifndef QKV_VEC_WIDTH
#error "QKV_VEC_WIDTH must be defined by the build (4, 8 or 16)"
#endif
#ifndef QKV_ISA
#error "QKV_ISA must be defined by the build (generic, avx2, avx512 or w16avx2)"
#endif

namespace qkv::simd {
// One copy per ISA: the inline namespace QKV_ISA gives each translation unit's functions their
// own symbols. Without it, load(const float*) and set1(float) have the same mangled name at
// every width, and fma(vf, vf, vf) the same name for avx512 and w16avx2; where the compiler does
// not inline them (any -O0 build) they are weak symbols, the linker keeps one, and the other
// ISAs' kernels run it: wrong widths (a Debug build's AVX2 attention ignored key padding) or
// AVX-512 instructions on an AVX2-only CPU.
inline namespace QKV_ISA {

constexpr int W = QKV_VEC_WIDTH;
typedef float vf __attribute__((vector_size(W * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(W * sizeof(int32_t))));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// zip_lo(a, b) = a0 b0 a1 b1 ... (the low halves interleaved), zip_hi the high halves.
template <size_t... I>
inline vf zip_lo_impl(vf a, vf b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, ((I % 2) ? W + static_cast<int>(I / 2) : static_cast<int>(I / 2))...);
}
template <size_t... I>
inline vf zip_hi_impl(vf a, vf b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, ((I % 2) ? W + W / 2 + static_cast<int>(I / 2) : W / 2 + static_cast<int>(I / 2))...);
}
inline vf zip_lo(vf a, vf b) { return zip_lo_impl(a, b, std::make_index_sequence<W>{}); }
inline vf zip_hi(vf a, vf b) { return zip_hi_impl(a, b, std::make_index_sequence<W>{}); }

// r[0..W) <- its transpose (r[i][j] <-> r[j][i]) by log2(W) rounds of the perfect shuffle: row
// 2j <- zip_lo(row j, row j + W/2), row 2j + 1 <- zip_hi(the same two). Each round moves element
// (i, j) by rotating the 2 log2(W) bits of (i, j) one place; log2(W) rounds swap i and j. Pure data
// movement: every value keeps its bits.
inline void transpose(vf* r) {
  for (int round = 1; round < W; round *= 2) {
    vf t[W];
#pragma GCC unroll 16
    for (int j = 0; j < W / 2; ++j) {
      t[2 * j] = zip_lo(r[j], r[j + W / 2]);
      t[2 * j + 1] = zip_hi(r[j], r[j + W / 2]);
    }
#pragma GCC unroll 16
    for (int j = 0; j < W; ++j) r[j] = t[j];
  }
}
template <size_t... I>
inline vf set1_impl(float x, std::index_sequence<I...>) {
  return vf{((void)I, x)...};
}
inline vf set1(float x) { return set1_impl(x, std::make_index_sequence<W>{}); }  // one vbroadcastss
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf fma(vf a, vf b, vf c) { return a * b + c; }  // contracted to vfmadd under -mfma

inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < W; ++i) m = m > v[i] ? m : v[i];
  return m;
}
// Pairwise tree order: fixed, so results do not depend on anything but the inputs. Step w adds
// lane i + w to lane i (i < w) with one whole-vector rotation: lane 0 sees exactly the sums of
// the scalar tree (for i < w; v[i] += v[i + w]), which GCC compiled to a store and scalar adds.
template <int w, size_t... I>
inline vf rotate_lanes(vf v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, static_cast<int>((I + w) % W)...);
}
template <int w>
inline vf hsum_steps(vf v) {
  v += rotate_lanes<w>(v, std::make_index_sequence<W>{});
  if constexpr (w > 1)
    return hsum_steps<w / 2>(v);
  else
    return v;
}
inline float hsum(vf v) { return hsum_steps<W / 2>(v)[0]; }

// exp(x) for a vector: Cody-Waite range reduction to r in [-ln2/2, ln2/2], a degree-6
// polynomial, then scaling by 2^n through the exponent bits. Relative error about 2 ulp.
// exp(-inf) and anything below ~-87.3 (where the result would be subnormal) return exactly 0;
// NaN propagates.
inline vf exp(vf x) {
  const vf hi = set1(88.0f), lo = set1(-87.33654f);
  vf xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  // n <- round(x / ln2), with the 1.5 * 2^23 trick (valid for |n| < 2^22)
  const vf magic = set1(12582912.0f);
  vf t = xc * set1(1.44269504088896341f) + magic;
  vf n = t - magic;
  vi ni = (vi)t - 0x4B400000;
  // r <- x - n ln2   (ln2 split in two for accuracy)
  vf r = xc - n * set1(0.693359375f);
  r = r - n * set1(-2.12194440e-4f);
  // p(r) ~ exp(r)
  vf p = set1(1.9875691500e-4f);
  p = p * r + set1(1.3981999507e-3f);
  p = p * r + set1(8.3334519073e-3f);
  p = p * r + set1(4.1665795894e-2f);
  p = p * r + set1(1.6666665459e-1f);
  p = p * r + set1(5.0000001201e-1f);
  p = p * (r * r) + r + set1(1.0f);
  // * 2^n
  vi bits = (ni + 127) << 23;
  vf scale = (vf)bits;
  vf y = p * scale;
  y = x < lo ? vf{} : y;
  return x != x ? x : y;
}

}  // namespace QKV_ISA
}  // namespace qkv::simd
