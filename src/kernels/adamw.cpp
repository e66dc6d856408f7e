#include "kernels/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/train_isa.h"

namespace qkv::kernels {
namespace {

// Below this many elements a step or a norm runs on the calling thread only.
constexpr int64_t kSerialBelow = 1 << 14;
// A tensor's squares are summed in at most kMaxChunks chunks of at least kMinChunk elements;
// both depend on the tensor's length only.
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kMinChunk = 4096;
// AdamW hands the vector body slices of this many elements.
constexpr int64_t kSlice = 1 << 14;

}  // namespace

namespace {
AdamWScalars scalars_of(const AdamWParams& p) {
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2, wd = p.weight_decay;
  const double step = static_cast<double>(p.step);
  // decay <- 1 - lr wd ;  bc1 <- 1 - beta1^step ;  bc2 <- 1 - beta2^step
  const double bc1 = 1.0 - std::pow(b1, step);
  const double bc2 = 1.0 - std::pow(b2, step);
  AdamWScalars c;
  c.grad_scale = p.grad_scale;
  c.decay = static_cast<float>(1.0 - lr * wd);
  c.beta1 = p.beta1;
  c.beta2 = p.beta2;
  c.one_minus_b1 = static_cast<float>(1.0 - b1);
  c.one_minus_b2 = static_cast<float>(1.0 - b2);
  // neg_step <- -lr / bc1 ;  bc2_sqrt <- sqrt(bc2)
  c.neg_step = static_cast<float>(-(lr / bc1));
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = p.eps;
  return c;
}
}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p, int threads) {
  const AdamWScalars c = scalars_of(p);
  const auto update = train_isa(active_isa()).adamw_update;
  // Each thread updates one contiguous slice of whole kSlice blocks; elementwise, so the
  // split does not change any result.
  const int64_t nslices = (n + kSlice - 1) / kSlice;
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= kSerialBelow)
  for (int64_t s = 0; s < nslices; ++s) {
    const int64_t i0 = s * kSlice, len = std::min(kSlice, n - i0);
    update(param + i0, grad + i0, m + i0, v + i0, len, c);
  }
}

void adamw_steps(const AdamWTensor* tensors, int64_t count, int threads) {
  // first[k]: the index of tensor k's first slice among all of them
  std::vector<int64_t> first(static_cast<size_t>(count) + 1, 0);
  std::vector<AdamWScalars> c(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    first[k + 1] = first[k] + (std::max<int64_t>(tensors[k].n, 0) + kSlice - 1) / kSlice;
    c[k] = scalars_of(tensors[k].p);
  }
  const int64_t total = first[count];
  const auto update = train_isa(active_isa()).adamw_update;
#pragma omp parallel num_threads(threads) if (total > 1)
  {
    // a contiguous run of slices per thread (as schedule(static)), its tensor found once
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t s0 = total * t / nt, s1 = total * (t + 1) / nt;
    int64_t k = std::upper_bound(first.begin(), first.end(), s0) - first.begin() - 1;
    for (int64_t s = s0; s < s1; ++s) {
      while (s >= first[k + 1]) ++k;
      const AdamWTensor& x = tensors[k];
      const int64_t i0 = (s - first[k]) * kSlice, len = std::min(kSlice, x.n - i0);
      update(x.param + i0, x.grad + i0, x.m + i0, x.v + i0, len, c[k]);
    }
  }
}

double global_grad_norm_sq(const float* const* grads, const int64_t* sizes, int64_t count, int threads) {
  double total = 0;
  for (int64_t k = 0; k < count; ++k) {
    const float* g = grads[k];
    const int64_t n = sizes[k];
    if (n <= 0) continue;
    const int64_t chunk = std::max(kMinChunk, (n + kMaxChunks - 1) / kMaxChunks);
    const int64_t nchunks = (n + chunk - 1) / chunk;
    double part[kMaxChunks];
    const auto sum_squares = train_isa(active_isa()).sum_squares;
    // part_c <- sum_{i in chunk c} g_i^2
#pragma omp parallel for num_threads(threads) schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t end = std::min(n, (c + 1) * chunk);
      part[c] = sum_squares(g + c * chunk, end - c * chunk);
    }
    // total <- total + sum_c part_c, in chunk order
    for (int64_t c = 0; c < nchunks; ++c) total += part[c];
  }
  return total;
}

}  // namespace qkv::kernels
