// positional: the fixed sinusoidal position encoding of "Attention Is All You Need" (2017).
//   PE[t][2i]   = sin(pos / 10000^(2i/D))
//   PE[t][2i+1] = cos(pos / 10000^(2i/D)),   pos = pos_offset + t
// Each value is computed in double and rounded once to float (within half a float ulp of the
// exact value, plus the double error of the angle: about 1e-16 * |pos|). For odd D the last
// column, 2i = D - 1, is the sin of its pair (its cos would be column D). T == 0 or D == 0 writes
// nothing. pos_offset may be negative.
#pragma once
#include <cstdint>

namespace qkv::kernels {

// out: (T, D), overwritten
void sinusoidal_positions(float* out, int64_t T, int64_t D, int64_t pos_offset);

}  // namespace qkv::kernels
