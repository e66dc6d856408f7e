// The per-ISA vector bodies of the training kernels (train_isa.cpp, compiled once per ISA).
// Callers use the TrainIsa table of the active ISA; the threading and chunking stay with them.
#pragma once
#include <cstdint>

#include "qkv/cpu.h"

namespace qkv::kernels {

// AdamW's per-step scalars, formed in double by adamw_step and used in float.
struct AdamWScalars {
  float grad_scale, decay, beta1, beta2, one_minus_b1, one_minus_b2, neg_step, bc2_sqrt, eps;
};

#define QKV_DECLARE_TRAIN_ISA(ns)                                                                    \
  namespace ns {                                                                                     \
  /* max_j z_j (z[0] when n == 1; 0 when n == 0)   z: (n) */                                         \
  float row_max(const float* z, int64_t n);                                                          \
  /* sum_j exp(z_j - shift); *zsum <- sum_j z_j when zsum is not null   z: (n) */                    \
  double sum_exp(const float* z, int64_t n, float shift, double* zsum);                              \
  /* d_j <- a (exp(z_j - lse) - u); returns sum_j exp(z_j - lse)   z, d: (n) */                      \
  double softmax_grad_row(const float* z, int64_t n, float lse, float a, float u, float* d);         \
  /* one AdamW step on n elements (see adamw.h)   param, grad, m, v: (n) */                          \
  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,                  \
                    const AdamWScalars& c);                                                          \
  /* sum_i g_i^2   g: (n) */                                                                         \
  double sum_squares(const float* g, int64_t n);                                                     \
  /* C[i, j] <- alpha A[i, :] . B[j, :] + beta C[i, j] for i < M, j0 <= j < j1: every element     */ \
  /* summed in an order that depends on K only (batch-invariant)   A: (M, K) B: (N, K) C: (M, N) */ \
  void dot_rows(const float* A, int64_t lda, int64_t M, const float* B, int64_t ldb, int64_t j0,      \
                int64_t j1, int64_t K, float alpha, float beta, float* C, int64_t ldc);              \
  /* out_j <- bits(key, i0 + j) >= threshold ? in_j * scale : 0 (dropout.h's mask, bit for bit */ \
  /* dropout_mask_ref); threshold < 2^32 (dropout's ceil(p 2^32), p < 1)                        */ \
  /*   in, out: (n); out may alias in (out == in) */                                                 \
  void dropout_mask(const float* in, float* out, int64_t n, uint64_t i0, uint64_t key, uint64_t threshold, \
                    float scale);                                                                    \
  /* see pack_bf16_blocks below */                                                                   \
  void pack_bf16_blocks(const float* B, int64_t ldb, bool trans, int64_t K, int64_t N, int64_t padK,  \
                        uint16_t* dst, int64_t b0, int64_t b1);                                     \
  }
QKV_DECLARE_TRAIN_ISA(generic)
QKV_DECLARE_TRAIN_ISA(avx2)
QKV_DECLARE_TRAIN_ISA(avx512)
QKV_DECLARE_TRAIN_ISA(w16avx2)
#undef QKV_DECLARE_TRAIN_ISA

struct TrainIsa {
  float (*row_max)(const float*, int64_t);
  double (*sum_exp)(const float*, int64_t, float, double*);
  double (*softmax_grad_row)(const float*, int64_t, float, float, float, float*);
  void (*adamw_update)(float*, const float*, float*, float*, int64_t, const AdamWScalars&);
  double (*sum_squares)(const float*, int64_t);
  void (*dot_rows)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float, float,
                   float*, int64_t);
  // op(B) (K, N), each value rounded to bfloat16 as f32_to_bf16 rounds, into oneDNN's blocked
  // layout for a bf16 matmul's weights (format tag BA16a64b2a): blocks of 32 rows x 64 columns,
  // column blocks outermost (block (kb, nb) at dst + nb * padK * 64 + kb * 2048), and in a block
  // element (k, n) at (k % 32 / 2) * 128 + (n % 64) * 2 + k % 2 (row pairs interleaved); zeros
  // past K and N. op(B) is B, stored (K, N) with row stride ldb, or (trans) the transpose of B
  // stored (N, K); padK: K rounded up to a multiple of 32. Writes the blocks that B's rows b0 * R
  // .. b1 * R fill, reading those rows from front to back: with trans, column blocks b0 <= nb < b1
  // (R = 64); else row blocks b0 <= kb < b1 (R = 32).
  void (*pack_bf16_blocks)(const float*, int64_t, bool, int64_t, int64_t, int64_t, uint16_t*, int64_t, int64_t);
  void (*dropout_mask)(const float*, float*, int64_t, uint64_t, uint64_t, uint64_t, float);
};

// The table for `isa`.
inline TrainIsa train_isa(Isa isa) {
#define QKV_TRAIN_TABLE(ns) \
  TrainIsa{ns::row_max, ns::sum_exp, ns::softmax_grad_row, ns::adamw_update, ns::sum_squares, ns::dot_rows, \
           ns::pack_bf16_blocks, ns::dropout_mask}
  switch (isa) {
    case Isa::AVX512: return QKV_TRAIN_TABLE(avx512);
    case Isa::AVX2: return QKV_TRAIN_TABLE(avx2);
    default: return QKV_TRAIN_TABLE(generic);
  }
#undef QKV_TRAIN_TABLE
}

}  // namespace qkv::kernels
