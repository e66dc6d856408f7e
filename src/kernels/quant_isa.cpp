// The row products of low-precision weights, compiled once per ISA (kernels/quant.h; the bodies
// are in simd/lowp.h, where the intrinsics live).
#include "kernels/quant.h"
#include "kernels/simd/lowp.h"

namespace qkv::kernels::QKV_ISA {

float dot_q8_0(const BlockQ8_0* w, const float* xd, const int8_t* xq, int64_t nb, bool vnni) {
  return simd::dot_q8_0(w, xd, xq, nb, vnni);
}
float dot_q4_0(const BlockQ4_0* w, const float* xd, const int8_t* xq, int64_t nb, bool vnni) {
  return simd::dot_q4_0(w, xd, xq, nb, vnni);
}
float dot_f16(const uint16_t* w, const float* x, int64_t K) { return simd::dot_f16(w, x, K); }
float dot_bf16(const uint16_t* w, const float* x, int64_t K) { return simd::dot_bf16(w, x, K); }

}  // namespace qkv::kernels::QKV_ISA
