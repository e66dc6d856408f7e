// Run-time ISA dispatch for the tiled kernel, and attention weights recomputed from lse.
#include "kernels/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/quant.h"
#include "qkv/error.h"

namespace qkv::kernels {

bool flash_bf16_supported(Isa isa) { return isa == Isa::AVX512 && cpu_has_avx512_bf16(); }

namespace {
void check_bf16(const AttnInputs<float>& in, Isa isa) {
  check(!in.bf16 || flash_bf16_supported(isa), "attention: bfloat16 products need AVX512_BF16 and the avx512 "
        "kernel (isa ", isa_name(isa), ")");
}
}  // namespace

size_t flash_forward_workspace(const AttnShape& s, int threads, Isa isa, bool bf16) {
  switch (isa) {
    case Isa::AVX512: return avx512::flash_forward_workspace(s, threads, bf16);
    case Isa::AVX2: return avx2::flash_forward_workspace(s, threads, bf16);
    default: return generic::flash_forward_workspace(s, threads, bf16);
  }
}

void flash_forward(const AttnInputs<float>& in, float* out, float* lse, void* ws, int threads, Isa isa) {
  check_bf16(in, isa);
  switch (isa) {
    case Isa::AVX512: return avx512::flash_forward(in, out, lse, ws, threads);
    case Isa::AVX2: return avx2::flash_forward(in, out, lse, ws, threads);
    default: return generic::flash_forward(in, out, lse, ws, threads);
  }
}

size_t flash_backward_workspace(const AttnShape& s, int threads, Isa isa, bool bf16) {
  switch (isa) {
    case Isa::AVX512: return avx512::flash_backward_workspace(s, threads, bf16);
    case Isa::AVX2: return avx2::flash_backward_workspace(s, threads, bf16);
    default: return generic::flash_backward_workspace(s, threads, bf16);
  }
}

void flash_backward(const AttnInputs<float>& in, const float* out, const float* dout, const float* lse, float* dq,
                    float* dk, float* dv, void* ws, int threads, Isa isa) {
  check_bf16(in, isa);
  switch (isa) {
    case Isa::AVX512: return avx512::flash_backward(in, out, dout, lse, dq, dk, dv, ws, threads);
    case Isa::AVX2: return avx2::flash_backward(in, out, dout, lse, dq, dk, dv, ws, threads);
    default: return generic::flash_backward(in, out, dout, lse, dq, dk, dv, ws, threads);
  }
}

void attention_weights_from_lse(const AttnInputs<float>& in, const float* lse, int64_t row_begin, int64_t row_end,
                                float* weights, int threads) {
  const AttnShape& s = in.s;
  const int64_t rows = row_end - row_begin;
  const float ninf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bhr = 0; bhr < s.B * s.H * rows; ++bhr) {
    const int64_t bh = bhr / rows, i = row_begin + bhr % rows, b = bh / s.H, h = bh % s.H;
    const int64_t hk = h / (s.H / s.Hkv);
    const float* q = in.q + b * in.qs.b + h * in.qs.h + i * in.qs.t;
    const float* k = in.k + b * in.ks.b + hk * in.ks.h;
    float* w = weights + bhr * s.Tk;
    std::fill(w, w + s.Tk, 0.0f);
    const float l = lse[bh * s.Tq + i];
    if (l == ninf) continue;
    const KeyRange r = key_range(s, in.m, b, i);
    const int64_t p = query_pos(s, in.m, i);
    // w_ij <- exp(scale q_i . k_j + bias_ij - lse_i)
    for (int64_t j = r.lo; j < r.hi; ++j) {
      const float bias = in.m.elementwise() ? elementwise_bias<float>(in.m, b, h, i, j, p) : 0.0f;
      if (bias == ninf) continue;
      float dot = 0;
      for (int64_t d = 0; d < s.Dk; ++d) dot += q[d] * k[j * in.ks.t + d];
      w[j] = std::exp(dot * static_cast<float>(in.scale) + bias - l);
    }
  }
}

}  // namespace qkv::kernels
