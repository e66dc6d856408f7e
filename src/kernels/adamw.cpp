#include "kernels/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace qkv::kernels {
namespace {

// Below this many elements a step or a norm runs on the calling thread only.
constexpr int64_t kSerialBelow = 1 << 14;
// A tensor's squares are summed in at most kMaxChunks chunks of at least kMinChunk elements;
// both depend on the tensor's length only.
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kMinChunk = 4096;

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p, int threads) {
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2, wd = p.weight_decay;
  const double step = static_cast<double>(p.step);
  // decay <- 1 - lr wd ;  bc1 <- 1 - beta1^step ;  bc2 <- 1 - beta2^step
  const double bc1 = 1.0 - std::pow(b1, step);
  const double bc2 = 1.0 - std::pow(b2, step);
  const float decay = static_cast<float>(1.0 - lr * wd);
  const float beta1 = p.beta1, beta2 = p.beta2;
  const float one_minus_b1 = static_cast<float>(1.0 - b1), one_minus_b2 = static_cast<float>(1.0 - b2);
  // neg_step <- -lr / bc1 ;  bc2_sqrt <- sqrt(bc2)
  const float neg_step = static_cast<float>(-(lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = p.eps;
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= kSerialBelow)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    // param <- param decay ;  m <- beta1 m + (1 - beta1) g ;  v <- beta2 v + (1 - beta2) g g
    const float w = param[i] * decay;
    const float mi = m[i] * beta1 + one_minus_b1 * g;
    const float vi = v[i] * beta2 + one_minus_b2 * g * g;
    // param <- param + neg_step m / (sqrt(v) / bc2_sqrt + eps)
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    param[i] = w + neg_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
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
    // part_c <- sum_{i in chunk c} g_i^2
#pragma omp parallel for num_threads(threads) schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; ++c) {
      double s = 0;
      const int64_t end = std::min(n, (c + 1) * chunk);
      for (int64_t i = c * chunk; i < end; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
      part[c] = s;
    }
    // total <- total + sum_c part_c, in chunk order
    for (int64_t c = 0; c < nchunks; ++c) total += part[c];
  }
  return total;
}

}  // namespace qkv::kernels
