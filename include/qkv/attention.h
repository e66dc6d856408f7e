// qkv/attention.h: scaled dot-product attention, the chapter's formula
//
//   Z = softmax(Q K^T * scale + M) V
//
// q: (B, H, Tq, Dk)   k: (B, Hkv, Tk, Dk)   v: (B, Hkv, Tk, Dv)   out: (B, H, Tq, Dv)
// Also accepted: (H, T, D) and (T, D), treated as B = 1 (and H = 1); results keep q's rank.
// Hkv must divide H (grouped-query and multi-query attention). Dv may differ from Dk.
//
// Every mask below combines into one set of allowed (query, key) pairs plus an additive bias;
// a query row with no allowed key outputs zeros and gets zero gradient (never NaN). The rules
// are in docs/numerics.md and are the same for both implementations.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "qkv/cpu.h"
#include "qkv/tensor.h"

namespace qkv {

enum class AttentionImpl {
  Flash,      // tiled, online softmax, O(T*D) memory, saves logsumexp; float32
  Reference,  // materialises the Tq x Tk matrix, accumulates in float64: the oracle. The only path
              // that also takes float64 q, k, v (then out, lse and the gradients are float64 too;
              // masks stay float32): gradient checks in double precision
  // The same plain algorithm entirely in float32: the baseline whose error bounds fused kernels.
  ReferenceFloat32,
};

// Where query i sits among the keys when Tq != Tk: its position p = i + (Tk - Tq) for
// BottomRight (the last query lines up with the last key: what a KV cache needs; the default)
// or p = i for TopLeft. Causal masking, the sliding window and ALiBi all use p.
enum class Align { BottomRight, TopLeft };

struct AttentionSpec {
  std::optional<double> scale;      // default 1 / sqrt(Dk)
  bool causal = false;              // query position p sees keys j <= p
  Align align = Align::BottomRight;
  // Sliding window of w keys (0 = off). With causal masking position p sees keys p-w+1 .. p;
  // without it, keys with |j - p| < w.
  int64_t window = 0;
  // ALiBi: bias -slope_h * |p - j| added to the scores. alibi = true uses the standard slopes
  // 2^(-8 (h+1) / H) (interpolated for H not a power of two, as in the paper); alibi_slopes
  // (H values) overrides them.
  bool alibi = false;
  std::vector<float> alibi_slopes;
  std::optional<Tensor> mask;       // additive float32, broadcastable to (B, H, Tq, Tk); -inf blocks
  std::optional<Tensor> bool_mask;  // bool, broadcastable to (B, H, Tq, Tk); true = may attend
  std::optional<Tensor> key_lengths;// int32/int64 (B): keys j >= len[b] are blocked and never read
  AttentionImpl impl = AttentionImpl::Flash;
  int threads = 0;                  // 0: qkv::num_threads()
  std::optional<Isa> isa;           // force a SIMD variant of the flash kernel (tests, benchmarks)
};

struct AttentionOutput {
  Tensor out;  // (…, Tq, Dv) float32
  Tensor lse;  // (…, Tq) float32: log sum_j exp(s_ij); -inf for a row with no allowed key
};

AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec = {});

struct AttentionGrads {
  Tensor dq, dk, dv;  // shaped like q, k, v (float32, contiguous)
};

// Gradients of sum(out * dout). `out` and `lse` are what attention() returned for these inputs.
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const AttentionSpec& spec = {});

// Attention weights softmax(...) for query rows [row_begin, row_end), recomputed from the saved
// logsumexp: (…, row_end - row_begin, Tk). Never needs the full Tq x Tk matrix.
Tensor attention_weights(const Tensor& q, const Tensor& k, const Tensor& lse, const AttentionSpec& spec,
                         int64_t row_begin, int64_t row_end);

// Whether attention multiplies in bfloat16 while a qkv::Bf16Matmul lives on the calling thread
// (training's --precision bf16): where the CPU has AVX512_BF16 and the avx512 kernel runs (and
// QKV_BF16_DOT is not 0), each product's operands (scale * Q, K, V, the probabilities, dO, dS)
// are rounded to bfloat16 and summed in float32, as PyTorch's bf16 autocast runs attention's
// matmuls; the softmax and its statistics stay float32. Elsewhere, and for a single query row
// (a decoding step), attention stays float32. docs/numerics.md.
bool bf16_attention_native();

// The standard ALiBi slopes for H heads.
std::vector<float> alibi_slopes(int64_t H);

}  // namespace qkv
