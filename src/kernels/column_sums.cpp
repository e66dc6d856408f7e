#include "kernels/column_sums.h"

#include <algorithm>
#include <cstring>

namespace qkv::kernels {
namespace {

// The widest band of columns one thread sums at a time (its double accumulators: 16 KiB).
constexpr int64_t kMaxBand = 2048;

// acc[j] += x[i * ld + j] for j < width, row after row; with out, each value is also rounded
// to bfloat16 into out[i * out_ld + j] (nearest even, NaN kept quiet: f32_to_bf16). Per column,
// so vectorising it reorders no sum.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void band_sums(const float* x, int64_t N, int64_t ld, int64_t width, double* acc) {
  for (int64_t i = 0; i < N; ++i) {
    const float* r = x + i * ld;
    for (int64_t j = 0; j < width; ++j) acc[j] += r[j];
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void band_round_and_sum(const float* x, int64_t N, int64_t ld, int64_t width, uint16_t* out, int64_t out_ld,
                        double* acc) {
  for (int64_t i = 0; i < N; ++i) {
    const float* r = x + i * ld;
    uint16_t* o = out + i * out_ld;
    for (int64_t j = 0; j < width; ++j) {
      uint32_t bits;
      std::memcpy(&bits, r + j, sizeof bits);
      const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16, quiet = (bits >> 16) | 0x40u;
      o[j] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
      acc[j] += r[j];
    }
  }
}

}  // namespace

void column_sums(const float* x, int64_t N, int64_t C, int64_t ld, float* col_sum, bool add, uint16_t* bf16_out,
                 int64_t out_ld, int threads) {
  if (C <= 0) return;
  // Each thread takes a band of columns and reads the band of each row from front to back. (A
  // band of 64 columns read row after row, as before, crossed a page every row or two of a wide
  // matrix, where the prefetchers stop: that pass ran at memory latency, not bandwidth.) Bands
  // narrower than a row of 2,048 columns gain nothing from a second thread: measured on Zen 5
  // (1,024 rows, warm caches, rounding included), one thread took 0.07 / 0.22 / 0.33 ms for 512 /
  // 1,536 / 2,048 columns and two 0.14 / 0.48 / 0.48; at 4,096 columns two took 0.56 against 1.28.
  threads = C <= kMaxBand ? 1 : std::max(threads, 1);
  const int64_t per = (C + threads - 1) / threads;
  const int64_t band = std::clamp<int64_t>((per + 15) / 16 * 16, 16, kMaxBand), bands = (C + band - 1) / band;
#pragma omp parallel for num_threads(bands > 1 ? threads : 1) schedule(static)
  for (int64_t b = 0; b < bands; ++b) {
    const int64_t j0 = b * band, width = std::min(band, C - j0);
    double acc[kMaxBand];
    std::fill(acc, acc + width, 0.0);
    if (bf16_out)
      band_round_and_sum(x + j0, N, ld, width, bf16_out + j0, out_ld, acc);
    else
      band_sums(x + j0, N, ld, width, acc);
    for (int64_t j = 0; j < width; ++j)
      col_sum[j0 + j] = add ? col_sum[j0 + j] + static_cast<float>(acc[j]) : static_cast<float>(acc[j]);
  }
}

}  // namespace qkv::kernels
