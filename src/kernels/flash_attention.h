// flash_attention: exact attention in tiles (Dao et al. 2022; the loop structure of PyTorch's
// CPU FlashAttentionKernel). A block of Bq queries against a block of Bk keys is two small
// GEMMs plus an online softmax; each thread holds one tile of scores at a time, and the
// forward pass saves lse = max + log(sum) per query row so backward and attention-weight
// inspection can recompute any tile without the Tq x Tk matrix.
//
// Inputs are packed once per call into a workspace (transposed / padded copies of Q, K, V,
// dO: O(T*D) memory), which also makes arbitrary input strides free. Results are bitwise
// identical for any thread count: every output element is produced by one task in a fixed
// order (no atomics or reductions across threads; see flash_backward for its two strategies).
#pragma once
#include <cstddef>

#include "kernels/attention_params.h"
#include "qkv/cpu.h"

namespace qkv::kernels {

// Whether the kernel for `isa` can run with AttnInputs::bf16 (AVX-512 with AVX512_BF16's
// vdpbf16ps, unless QKV_BF16_DOT=0). Elsewhere a bf16 request is refused.
bool flash_bf16_supported(Isa isa);

// out: (B, H, Tq, Dv) contiguous; lse: (B, H, Tq) contiguous. bf16: the workspace of a call whose
// inputs ask for bfloat16 products (AttnInputs::bf16).
size_t flash_forward_workspace(const AttnShape& s, int threads, Isa isa, bool bf16 = false);
void flash_forward(const AttnInputs<float>& in, float* out, float* lse, void* workspace, int threads, Isa isa);

// out, dout: (B, H, Tq, Dv) contiguous; lse from flash_forward.
// dq: (B, H, Tq, Dk), dk: (B, Hkv, Tk, Dk), dv: (B, Hkv, Tk, Dv): contiguous, overwritten.
size_t flash_backward_workspace(const AttnShape& s, int threads, Isa isa, bool bf16 = false);
void flash_backward(const AttnInputs<float>& in, const float* out, const float* dout, const float* lse, float* dq,
                    float* dk, float* dv, void* workspace, int threads, Isa isa);

// weights: (B, H, row_end - row_begin, Tk) contiguous: exp(s_ij - lse_i) for the given rows.
void attention_weights_from_lse(const AttnInputs<float>& in, const float* lse, int64_t row_begin, int64_t row_end,
                                float* weights, int threads);

// One instantiation per ISA (flash_attention_isa.cpp compiled with different flags).
#define QKV_DECLARE_FLASH_ISA(ns)                                                                          \
  namespace ns {                                                                                           \
  size_t flash_forward_workspace(const AttnShape& s, int threads, bool bf16);                             \
  void flash_forward(const AttnInputs<float>& in, float* out, float* lse, void* ws, int threads);         \
  size_t flash_backward_workspace(const AttnShape& s, int threads, bool bf16);                            \
  void flash_backward(const AttnInputs<float>& in, const float* out, const float* dout, const float* lse,  \
                      float* dq, float* dk, float* dv, void* ws, int threads);                             \
  }
QKV_DECLARE_FLASH_ISA(generic)
QKV_DECLARE_FLASH_ISA(avx2)
QKV_DECLARE_FLASH_ISA(avx512)
QKV_DECLARE_FLASH_ISA(w16avx2)  // test-only: the avx512 logic compiled for AVX2
#undef QKV_DECLARE_FLASH_ISA

}  // namespace qkv::kernels
