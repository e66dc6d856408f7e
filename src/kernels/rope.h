// rope: rotary position embedding in the "rotate half" convention of GPT-NeoX and Hugging Face
// LLaMA. For a head vector x of even length D, half = D / 2 and position pos, each pair
// (x_i, x_{i+half}), i < half, is rotated by the angle pos * theta^(-2i/D):
//   y_i        = x_i        cos - x_{i+half} sin
//   y_{i+half} = x_{i+half} cos + x_i        sin
// (Not the interleaved pairs (x_{2i}, x_{2i+1}) of the RoFormer paper and Meta's original LLaMA
// code: weights converted between the two need their Q/K rows permuted.)
//
// Angles, cos and sin are computed in double (pos up to 2^53 keeps its angle exact to double
// rounding) and each output is formed in double from the float inputs and rounded once. Every
// element is computed the same way whatever the split of work, so results are bitwise identical
// for any thread count. The op layer checks that D is even and theta > 0; the kernel assumes it.
#pragma once
#include <cstdint>

namespace qkv::kernels {

// Rotates x in place. x holds rows r = b * T + t (b < B, t < T), each row holding H heads of D
// floats at x + r * row_stride + h * D (row_stride >= H * D; the columns [H * D, row_stride) of a
// row are neither read nor written). Row t has position pos_offset + t, for every b.
// inverse = true applies the transposed rotation (angle -> -angle), which undoes the forward
// rotation and is also its backward pass: dx = R^T dy.
// x: (B, T, row_stride) with (H, D) used at the start of each row
void rope_apply(float* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
                double theta, bool inverse, int threads);

}  // namespace qkv::kernels
