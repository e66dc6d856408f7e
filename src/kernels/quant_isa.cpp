// The row products of low-precision weights, compiled once per ISA (kernels/quant.h; the bodies
// are in simd/lowp.h, where the intrinsics live).
#include "kernels/quant.h"
#include "kernels/simd/lowp.h"

namespace qkv::kernels::QKV_ISA {

void rows_q4_0(const uint8_t* W, size_t rb, int64_t n, const float* xd, const int8_t* xq, const int32_t* corr,
               int64_t nb, float* y, bool vnni) {
  simd::rows_q4_0(W, rb, n, xd, xq, corr, nb, y, vnni);
}
void rows_q8_0(const uint8_t* W, size_t rb, int64_t n, const float* xd, const int8_t* xq, const int32_t* corr,
               int64_t nb, float* y, bool vnni) {
  simd::rows_q8_0(W, rb, n, xd, xq, corr, nb, y, vnni);
}
float dot_f16(const uint16_t* w, const float* x, int64_t K) { return simd::dot_f16(w, x, K); }
float dot_bf16(const uint16_t* w, const uint16_t* xb, int64_t K, bool dp) { return simd::dot_bf16(w, xb, K, dp); }
void round_bf16(const float* x, uint16_t* out, int64_t n) { simd::round_bf16(x, out, n); }
void quantize_blocks(const float* x, int64_t nb, float* d, int8_t* q) { simd::quantize_blocks(x, nb, d, q); }
void q4_0_group_bf16(const uint8_t* g, int64_t nb, uint16_t* out, int64_t ldo) { simd::q4_0_group_bf16(g, nb, out, ldo); }

}  // namespace qkv::kernels::QKV_ISA
