#include "kernels/dropout.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace qkv::kernels {
namespace {

// Below this many elements the loop runs on the calling thread.
constexpr int64_t kParallelMin = 1 << 14;

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;       // SplitMix64's increment (2^64 / golden ratio)
constexpr uint64_t kStreamSalt = 0x6a09e667f3bcc909ULL;  // frac(sqrt(2)): keeps stream 0 from mixing 0

int clamp_threads(int threads) { return std::max(1, threads); }

// SplitMix64's finaliser (Stafford's "Mix13").
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// key <- mix(seed ^ mix(stream ^ salt)): for a fixed stream a bijection of seeds, for a fixed
// seed a bijection of streams.
inline uint64_t stream_key(uint64_t seed, uint64_t stream) { return mix64(seed ^ mix64(stream ^ kStreamSalt)); }

// bits_i <- high 32 bits of mix(key + (i + 1) * gamma), SplitMix64's output number i + 1.
inline uint32_t bits_at(uint64_t key, uint64_t i) { return static_cast<uint32_t>(mix64(key + (i + 1) * kGamma) >> 32); }

// ceil(p * 2^32): keep_i <- bits_i >= threshold. Exact in double; below 2^32 for p < 1.
uint64_t keep_threshold(float p) { return static_cast<uint64_t>(std::ceil(static_cast<double>(p) * 4294967296.0)); }

// out_i <- keep_i ? in_i * scale : 0   (the forward and the backward pass)
void apply_mask(const float* in, float* out, int64_t n, float p, uint64_t seed, uint64_t stream, int threads) {
  if (n <= 0) return;
  if (p == 0.0f) {
    if (out != in) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint64_t key = stream_key(seed, stream);
  const uint64_t threshold = keep_threshold(p);
  const float scale = dropout_scale(p);
#pragma omp parallel for num_threads(clamp_threads(threads)) schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    out[i] = bits_at(key, static_cast<uint64_t>(i)) >= threshold ? in[i] * scale : 0.0f;
}

}  // namespace

uint32_t dropout_bits(uint64_t seed, uint64_t stream, uint64_t i) { return bits_at(stream_key(seed, stream), i); }

float dropout_scale(float p) { return static_cast<float>(1.0 / (1.0 - static_cast<double>(p))); }

void dropout_forward(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream, int threads) {
  // x, y: (n)
  apply_mask(x, y, n, p, seed, stream, threads);
}

void dropout_backward(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t stream, int threads) {
  // dy, dx: (n)
  apply_mask(dy, dx, n, p, seed, stream, threads);
}

}  // namespace qkv::kernels
