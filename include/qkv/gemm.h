// qkv/gemm.h: matrix multiplication through oneDNN (matrices) and OpenBLAS (a single row).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qkv {

// C (M, N) = alpha * op(A) op(B) + beta * C, row-major. op(X) = X or X^T.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// C (M, N) = A B^T with A (M, K) and B (N, K) bfloat16 (row strides lda, ldb) and C float32
// (row stride ldc, overwritten): products of bfloat16 values, exact in float32, summed in float32
// (oneDNN's matmul on the CPU's bf16 dot-product instructions). Only where
// bf16_gemm_native() says the CPU has them (AVX512_BF16 or AMX); elsewhere it throws.
bool bf16_gemm_native();
// Whether products of many rows with bfloat16 weights take gemm_bf16_nt (their activations rounded
// to bfloat16): bf16_gemm_native(), unless QKV_BF16_GEMM=0 asks for the float32 product of the
// dequantised weights (slower; the activations unrounded).
bool bf16_gemm_enabled();
void gemm_bf16_nt(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                  float* C, int64_t ldc);

// While an object of this class lives, sgemm on the constructing thread computes products of up to
// 64 rows with B transposed (what a linear layer's forward pass asks: x W^T) by a kernel whose
// every element is summed in an order that depends on K only: a row's result is bitwise the same
// whatever other rows share the product and however many threads run it. Decoding with
// continuous batching (qkv::DecodeSlots) runs its steps this way, so that a sequence's tokens do
// not depend on the load. It streams B once per call, like the single-row path.
class BatchInvariantGemm {
 public:
  BatchInvariantGemm();
  ~BatchInvariantGemm();
  BatchInvariantGemm(const BatchInvariantGemm&) = delete;
  BatchInvariantGemm& operator=(const BatchInvariantGemm&) = delete;
  // Whether one lives on this thread (packed weights then multiply row by row too).
  static bool active();
};

// While an object of this class lives, sgemm on the constructing thread multiplies in bfloat16, as
// torch.set_float32_matmul_precision("medium") (or autocast to bfloat16) does to a float32 matmul:
// A and B are rounded to bfloat16 (nearest even; NaN and infinity kept), their products are exact in
// float32 and summed in float32, then alpha and beta apply as usual. On a CPU with bf16 dot
// products (bf16_gemm_native()) this runs on oneDNN's bf16 matmul, about twice float32's rate;
// elsewhere the rounded values go through the float32 product (the same products, the sums in
// another order, no faster). Training's --precision bf16 (TrainConfig::precision) runs its
// forward and backward passes inside one. BatchInvariantGemm, where both live, takes precedence.
// qkv::attention and attention_backward multiply in bfloat16 under one too, where
// bf16_attention_native() (qkv/attention.h) says the CPU can.
class Bf16Matmul {
 public:
  Bf16Matmul();
  ~Bf16Matmul();
  Bf16Matmul(const Bf16Matmul&) = delete;
  Bf16Matmul& operator=(const Bf16Matmul&) = delete;
  static bool active();  // whether one lives on this thread
};

// While an object of this class lives on a thread, the float32 matrix at `data` is not written, so
// products under Bf16Matmul on that thread that take it as their first operand (A), stored with
// the same rows, columns and stride, round it to bfloat16 once and reuse the copy: a linear
// layer's backward pass takes dY as A in both of its products (dX = dY W and dW = dY^T X).
class Bf16Unchanged {
 public:
  explicit Bf16Unchanged(const float* data);
  ~Bf16Unchanged();
  Bf16Unchanged(const Bf16Unchanged&) = delete;
  Bf16Unchanged& operator=(const Bf16Unchanged&) = delete;

  // Under a Bf16Matmul on this thread: rounds the matrix now, as (rows, cols) with row stride ld
  // (the copy the products that take it as A, stored so or transposed, then reuse), and in the
  // same pass adds its column sums to col_sum[0, cols): col_sum[j] += float(the double sum of
  // column j in row order), the bits of a separate column sum. A linear layer's bias gradient
  // thus reads dY once with its rounding. Returns false and does nothing outside a Bf16Matmul.
  bool round_with_column_sums(int64_t rows, int64_t cols, int64_t ld, float* col_sum) const;

 private:
  const float* data_;
  const float* previous_;
};

// While an object of this class lives on a thread, products under Bf16Matmul on that thread whose
// second operand (B) lies inside one of the given float32 arrays round it once and reuse the
// copy (one per pointer, rows, columns and stride, and on bf16 hardware per way of reading it,
// laid out as oneDNN's matmul reads fastest): a training step's weights, which the forward pass
// (x W^T) and the backward pass's input gradient (dy W) both multiply by. PyTorch's autocast keeps
// its weights' casts the same way within a region. The arrays must not be written while it
// lives; the copies (2 bytes per weight used, 4 where both ways are used) are freed with it, or
// kept in `buffers` when given. Nested objects: the innermost one serves.
class Bf16WeightBuffers;
class Bf16Weights {
 public:
  // (data, number of floats) of each array; buffers: see Bf16WeightBuffers (nullptr: none)
  explicit Bf16Weights(const std::vector<std::pair<const float*, int64_t>>& arrays,
                       Bf16WeightBuffers* buffers = nullptr);
  ~Bf16Weights();
  Bf16Weights(const Bf16Weights&) = delete;
  Bf16Weights& operator=(const Bf16Weights&) = delete;
  struct State;

 private:
  std::unique_ptr<State> state_;
  State* previous_;
};

// Memory for Bf16Weights' copies that outlives one Bf16Weights: a training step's object takes
// its copies' buffers from the step before's (one of the same size per copy) instead of fresh
// ones, which would be freshly mapped pages (page faults and the kernel's zeroing: with attention's
// workspace, 3-16% of a GPT-2-small bf16 step on 2 cores under KVM). Holds the last object's copies (2 bytes per weight) until destroyed;
// what an object does not take is freed when it ends. For one thread's objects at a time.
class Bf16WeightBuffers {
 public:
  Bf16WeightBuffers();
  ~Bf16WeightBuffers();
  Bf16WeightBuffers(const Bf16WeightBuffers&) = delete;
  Bf16WeightBuffers& operator=(const Bf16WeightBuffers&) = delete;
  size_t bytes() const;  // held between objects
  struct Impl;

 private:
  friend class Bf16Weights;
  std::unique_ptr<Impl> impl_;
};

struct BlasInfo {
  std::string gemm;      // the library behind sgemm for more than one row, e.g. "oneDNN 2.6.3"
  std::string library;   // "OpenBLAS 0.3.21 ..." (single-row products)
  std::string corename;  // the kernel OpenBLAS picked, e.g. "Haswell", "SkylakeX", "Prescott"
  std::string threading; // "openmp", "pthreads" or "sequential"
  bool generic_fallback; // true when the picked kernel is far below what this CPU supports
  std::string advice;    // how to fix a fallback (OPENBLAS_CORETYPE=...), empty otherwise
};
BlasInfo blas_info();

}  // namespace qkv
