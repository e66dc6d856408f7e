// Attention kernel parameters: raw pointers, sizes and strides only. Shared by the reference
// (attention_ref) and the tiled kernel (flash_attention) so both apply one set of mask rules.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

namespace qkv::kernels {

struct AttnShape {
  int64_t B = 1, H = 1, Hkv = 1, Tq = 0, Tk = 0, Dk = 0, Dv = 0;
};

// Strides in elements of a (B, H, T, D) operand whose last dimension is contiguous.
struct Strides {
  int64_t b = 0, h = 0, t = 0;
};

// Everything that decides which (query, key) pairs are allowed and with which bias.
struct MaskParams {
  bool causal = false;
  bool top_left = false;         // alignment of causal / window / ALiBi positions
  int64_t window = 0;            // 0: no window
  const float* alibi = nullptr;  // (H) slopes
  const float* add = nullptr;    // additive mask, element [b,h,i,j] at b*add_s[0]+h*add_s[1]+i*add_s[2]+j*add_s[3]
  int64_t add_s[4] = {0, 0, 0, 0};  // stride 0 = broadcast
  const uint8_t* allow = nullptr;   // boolean mask, 1 = may attend, same indexing as add
  int64_t allow_s[4] = {0, 0, 0, 0};
  const int64_t* key_len = nullptr; // (B) keys j >= key_len[b] blocked (and never read)

  bool elementwise() const { return add || allow || alibi; }
};

// Query i's position among the keys.
inline int64_t query_pos(const AttnShape& s, const MaskParams& m, int64_t i) {
  return m.top_left ? i : i + (s.Tk - s.Tq);
}

// The contiguous range [lo, hi) of keys that causal, window and key-padding masks allow for
// query row i of batch b. Elementwise masks (add, allow) may block more inside it.
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange key_range(const AttnShape& s, const MaskParams& m, int64_t b, int64_t i) {
  int64_t lo = 0, hi = s.Tk;
  if (m.key_len) hi = std::min(hi, std::max<int64_t>(0, m.key_len[b]));
  const int64_t p = query_pos(s, m, i);
  if (m.causal) hi = std::min(hi, p + 1);
  if (m.window > 0) {
    // lo <- max(lo, p - window + 1);  hi <- min(hi, p + window) (not causal). The sums are only
    // formed where they lie inside [lo, hi], so a window near INT64_MAX cannot overflow: a
    // window reaching past both ends of the keys is no window.
    if (m.window <= p - lo) lo = p - m.window + 1;
    if (!m.causal && m.window < hi - p) hi = p + m.window;
  }
  if (hi < lo) hi = lo;
  return {lo, hi};
}

// Bias added to score (b, h, i, j) for a key inside key_range; -inf when blocked elementwise.
template <class T>
inline T elementwise_bias(const MaskParams& m, int64_t b, int64_t h, int64_t i, int64_t j, int64_t p) {
  T bias = 0;
  if (m.allow && !m.allow[b * m.allow_s[0] + h * m.allow_s[1] + i * m.allow_s[2] + j * m.allow_s[3]])
    return -std::numeric_limits<T>::infinity();
  if (m.add) bias += static_cast<T>(m.add[b * m.add_s[0] + h * m.add_s[1] + i * m.add_s[2] + j * m.add_s[3]]);
  if (m.alibi) bias -= static_cast<T>(m.alibi[h]) * static_cast<T>(std::llabs(p - j));
  return bias;
}

// Forward inputs. T is float for the kernels; the reference is also instantiated for double.
template <class T>
struct AttnInputs {
  AttnShape s;
  double scale = 1.0;
  MaskParams m;
  const T* q = nullptr;  // q: (B, H, Tq, Dk)
  Strides qs;
  const T* k = nullptr;  // k: (B, Hkv, Tk, Dk)
  Strides ks;
  const T* v = nullptr;  // v: (B, Hkv, Tk, Dv)
  Strides vs;
  // Products in bfloat16, as PyTorch's bf16 autocast runs attention's matmuls: each product's two
  // operands (scale * Q, K, V, the probabilities, dO, dS) rounded to bfloat16 (nearest even, NaN
  // kept; the kernel flushes denormals, as vdpbf16ps reads them), their products exact and summed
  // in float32; the softmax, its statistics and every
  // other sum stay float32. The flash kernel does this on AVX512_BF16 only
  // (flash_bf16_supported); the reference rounds the same operands (its twin).
  bool bf16 = false;
};

}  // namespace qkv::kernels
