#include "kernels/embedding.h"

#include <omp.h>

#include <algorithm>

namespace qkv::kernels {
namespace {

// Columns are handed to threads in blocks of one 64-byte cache line of floats.
constexpr int64_t kColBlock = 16;

}  // namespace

int64_t embedding_check_ids(const int64_t* ids, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] < 0 || ids[i] >= V) return i;
  return -1;
}

void embedding_forward(const float* table, const int64_t* ids, float* out, int64_t N, int64_t /*V*/, int64_t C,
                       int threads) {
  // out_i <- table[ids_i]
#pragma omp parallel for num_threads(threads) schedule(static) if (N * C >= (1 << 14))
  for (int64_t i = 0; i < N; ++i) {
    const float* src = table + ids[i] * C;
    std::copy(src, src + C, out + i * C);
  }
}

void embedding_backward(const int64_t* ids, const float* dout, float* dtable, int64_t N, int64_t /*V*/, int64_t C,
                        int threads) {
  const int64_t nblocks = (C + kColBlock - 1) / kColBlock;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, N * C >= (1 << 14) ? nblocks : 1)));
  // Thread r owns the columns [c0, c1) (whole cache-line blocks) and walks every row:
  // dtable[ids_i, c] += dout[i, c]   for i = 0 .. N-1, c in [c0, c1)
#pragma omp parallel num_threads(nt)
  {
    const int64_t r = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t c0 = std::min(C, nblocks * r / T * kColBlock);
    const int64_t c1 = std::min(C, nblocks * (r + 1) / T * kColBlock);
    for (int64_t i = 0; c0 < c1 && i < N; ++i) {
      const float* src = dout + i * C;
      float* dst = dtable + ids[i] * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace qkv::kernels
