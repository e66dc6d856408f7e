// dropout: counter-based, so the mask is a pure function of (seed, stream, element index) and is
// never stored: the backward pass regenerates it. The same (seed, stream) gives the same mask on
// any machine and for any thread count; a training loop gives each dropout site and step its own
// stream (for example stream = step * sites + site) under one run-wide seed.
//
// Mask: bits_i = dropout_bits(seed, stream, i), a 32-bit value; element i is kept when
// bits_i >= p * 2^32 (exactly: bits_i >= ceil(p * 2^32), computed in double), which happens with
// probability 1 - p rounded to a multiple of 2^-32. bits_i is the high half of the SplitMix64
// output numbered i + 1 from the state key(seed, stream) = mix(seed ^ mix(stream ^ c)), with
// mix the SplitMix64 finaliser (a bijection of 64-bit words with full avalanche).
//
// Kept elements are multiplied by dropout_scale(p) = float(1.0 / (1.0 - p)), the reciprocal
// computed in double and rounded once to float, then one float multiply (x * scale, as
// PyTorch's x * mask * scale; not a division by 1 - p). Dropped elements are exactly +0, even
// where x is inf or NaN.
//
// p must lie in [0, 1) (the op layer checks). p == 0 copies (bitwise, NaN payloads included).
// n == 0 is allowed.
#pragma once
#include <cstdint>

namespace qkv::kernels {

namespace dropout_detail {
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;  // SplitMix64's increment (2^64 / golden ratio)

// SplitMix64's finaliser (Stafford's "Mix13").
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// bits_i <- high 32 bits of mix(key + (i + 1) * gamma), SplitMix64's output number i + 1.
inline uint32_t bits_at(uint64_t key, uint64_t i) { return static_cast<uint32_t>(mix64(key + (i + 1) * kGamma) >> 32); }
}  // namespace dropout_detail

// The 32-bit value deciding element i of the mask for (seed, stream).
uint32_t dropout_bits(uint64_t seed, uint64_t stream, uint64_t i);

// The slow twin of the ISA bodies' dropout_mask (train_isa.h): out_j <- bits_at(key, i0 + j) >=
// threshold ? in_j * scale : 0, with key = mix(seed ^ mix(stream ^ c)) and threshold = ceil(p 2^32)
// (below 2^32: p < 1).
// in, out: (n); out may alias in (out == in).
void dropout_mask_ref(const float* in, float* out, int64_t n, uint64_t i0, uint64_t key, uint64_t threshold,
                      float scale);

// float(1.0 / (1.0 - p)): the factor applied to kept elements.
float dropout_scale(float p);

// y_i <- keep_i ? x_i * scale : 0
// x, y: (n); y may alias x (y == x), but must not partially overlap it.
void dropout_forward(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream, int threads);

// dx_i <- keep_i ? dy_i * scale : 0, with the mask of dropout_forward for the same (p, seed, stream).
// dy, dx: (n); dx may alias dy (dx == dy), but must not partially overlap it.
void dropout_backward(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t stream, int threads);

}  // namespace qkv::kernels
