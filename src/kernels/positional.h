// positional: the fixed sinusoidal position encoding of "Attention Is All You Need" (2017), in
// two column layouts. Interleaved (the paper's, and PyTorch tutorials'):
//   PE[t][2i]   = sin(pos / 10000^(2i/D))
//   PE[t][2i+1] = cos(pos / 10000^(2i/D)),   pos = pos_offset + t
// SplitHalf (Hugging Face's Marian / OPUS-MT): all the sines, then all the cosines:
//   PE[t][i]     = sin(pos / 10000^(2i/D)),  i < ceil(D/2)
//   PE[t][h + i] = cos(pos / 10000^(2i/D)),  i < floor(D/2), h = ceil(D/2)
// Each value is computed in double and rounded once to float (within half a float ulp of the
// exact value, plus the double error of the angle: about 1e-16 * |pos|). For odd D the last
// column, 2i = D - 1, is the sin of its pair (its cos would be column D). T == 0 or D == 0 writes
// nothing. pos_offset may be negative. (SplitHalf with odd D: the sines take the extra column.)
#pragma once
#include <cstdint>

namespace qkv::kernels {

enum class SinusoidalLayout { Interleaved, SplitHalf };

// out: (T, D), overwritten
void sinusoidal_positions(float* out, int64_t T, int64_t D, int64_t pos_offset,
                          SinusoidalLayout layout = SinusoidalLayout::Interleaved);

}  // namespace qkv::kernels
