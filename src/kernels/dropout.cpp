#include "kernels/dropout.h"

#include "kernels/train_isa.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace qkv::kernels {
namespace {

// Below this many elements the loop runs on the calling thread.
constexpr int64_t kParallelMin = 1 << 14;

using dropout_detail::bits_at;
using dropout_detail::mix64;

constexpr uint64_t kStreamSalt = 0x6a09e667f3bcc909ULL;  // frac(sqrt(2)): keeps stream 0 from mixing 0

int clamp_threads(int threads) { return std::max(1, threads); }

// key <- mix(seed ^ mix(stream ^ salt)): for a fixed stream a bijection of seeds, for a fixed
// seed a bijection of streams.
inline uint64_t stream_key(uint64_t seed, uint64_t stream) { return mix64(seed ^ mix64(stream ^ kStreamSalt)); }

// ceil(p * 2^32): keep_i <- bits_i >= threshold. Exact in double; below 2^32 for p < 1.
uint64_t keep_threshold(float p) { return static_cast<uint64_t>(std::ceil(static_cast<double>(p) * 4294967296.0)); }

// Elements per task: a multiple of every vector width, so the chunking never changes a result.
constexpr int64_t kChunk = 4096;

// out_i <- keep_i ? in_i * scale : 0   (the forward and the backward pass), the mask computed by
// the active ISA's vector body (train_isa.cpp), which gives dropout_mask_ref's bits.
void apply_mask(const float* in, float* out, int64_t n, float p, uint64_t seed, uint64_t stream, int threads) {
  if (n <= 0) return;
  if (p == 0.0f) {
    if (out != in) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint64_t key = stream_key(seed, stream);
  const uint64_t threshold = keep_threshold(p);
  const float scale = dropout_scale(p);
  const auto mask = train_isa(active_isa()).dropout_mask;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(clamp_threads(threads)) schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
    mask(in + i0, out + i0, len, static_cast<uint64_t>(i0), key, threshold, scale);
  }
}

}  // namespace

uint32_t dropout_bits(uint64_t seed, uint64_t stream, uint64_t i) { return bits_at(stream_key(seed, stream), i); }

void dropout_mask_ref(const float* in, float* out, int64_t n, uint64_t i0, uint64_t key, uint64_t threshold,
                      float scale) {
  // in, out: (n), element j being element i0 + j of the mask
  for (int64_t j = 0; j < n; ++j)
    out[j] = bits_at(key, i0 + static_cast<uint64_t>(j)) >= threshold ? in[j] * scale : 0.0f;
}

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
