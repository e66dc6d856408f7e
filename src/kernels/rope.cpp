#include "kernels/rope.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace qkv::kernels {
namespace {

// Below this many rotated elements the work runs on the calling thread.
constexpr int64_t kParallelMin = 1 << 14;
// Frequencies whose cos / sin are computed together and then applied to every (b, h) of a
// position: 2 x 64 doubles on the stack, so the kernel allocates nothing.
constexpr int64_t kChunk = 64;

int clamp_threads(int threads) { return std::max(1, threads); }

}  // namespace

void rope_apply(float* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
                double theta, bool inverse, int threads) {
  // x: (B, T, row_stride), heads (H, D) at the start of each row
  if (B <= 0 || T <= 0 || H <= 0 || D < 2) return;
  const int64_t half = D / 2;
  const int nt = clamp_threads(threads);
  const double sign = inverse ? -1.0 : 1.0;

  // One task per (t, block of b): the cos / sin of position t are computed once per task and
  // shared by its rows. T alone gives enough tasks except when decoding (T = 1), where the
  // batch is split as well. The split changes which task computes an element, never how.
  const int64_t want_tasks = 4 * static_cast<int64_t>(nt);
  const int64_t b_blocks_wanted = T >= want_tasks ? 1 : std::min(B, (want_tasks + T - 1) / T);
  const int64_t b_per_task = (B + b_blocks_wanted - 1) / b_blocks_wanted;
  const int64_t b_blocks = (B + b_per_task - 1) / b_per_task;
  const int64_t tasks = T * b_blocks;

#pragma omp parallel for num_threads(nt) schedule(static) if (B * T * H * D >= kParallelMin)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t t = task / b_blocks;
    const int64_t b0 = (task % b_blocks) * b_per_task, b1 = std::min(B, b0 + b_per_task);
    const double pos = static_cast<double>(pos_offset + t);
    double c[kChunk], s[kChunk];
    for (int64_t i0 = 0; i0 < half; i0 += kChunk) {
      const int64_t n = std::min(kChunk, half - i0);
      // angle_i <- pos * theta^(-2i / D);  c_i <- cos(angle_i);  s_i <- +-sin(angle_i)  (- when inverse)
      for (int64_t k = 0; k < n; ++k) {
        const double angle =
            pos * std::pow(theta, -2.0 * static_cast<double>(i0 + k) / static_cast<double>(D));
        c[k] = std::cos(angle);
        s[k] = sign * std::sin(angle);
      }
      // (x_i, x_{i+half}) <- (x_i c_i - x_{i+half} s_i,  x_{i+half} c_i + x_i s_i)   for every (b, h)
      for (int64_t b = b0; b < b1; ++b) {
        float* row = x + (b * T + t) * row_stride;
        for (int64_t h = 0; h < H; ++h) {
          float* lo = row + h * D + i0;
          float* hi = lo + half;
          for (int64_t k = 0; k < n; ++k) {
            const double a = lo[k], e = hi[k];
            lo[k] = static_cast<float>(a * c[k] - e * s[k]);
            hi[k] = static_cast<float>(e * c[k] + a * s[k]);
          }
        }
      }
    }
  }
}

}  // namespace qkv::kernels
