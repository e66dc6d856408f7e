#include "kernels/cross_entropy.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/train_isa.h"

namespace qkv::kernels {
namespace {

// Rows are summed in at most kMaxChunks chunks of ceil(N / kMaxChunks) rows: the chunking
// depends on N only, so the order of every addition is the same for any thread count, and the
// partial sums fit on the stack.
constexpr int64_t kMaxChunks = 256;

bool counted(int64_t t, int64_t ignore_index) { return t != ignore_index; }

}  // namespace

int64_t cross_entropy_check_targets(const int64_t* targets, int64_t N, int64_t V, int64_t ignore_index) {
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = targets[i];
    if (counted(t, ignore_index) && (t < 0 || t >= V)) return i;
  }
  return -1;
}

double cross_entropy_forward(const float* logits, const int64_t* targets, float* lse, int64_t N, int64_t V,
                             int64_t ignore_index, float label_smoothing, int64_t* n_counted, int threads) {
  const double eps = label_smoothing;
  const int64_t chunk = std::max<int64_t>(1, (N + kMaxChunks - 1) / kMaxChunks);
  const int64_t nchunks = N == 0 ? 0 : (N + chunk - 1) / chunk;
  double loss_part[kMaxChunks];
  int64_t count_part[kMaxChunks];
  const TrainIsa k = train_isa(active_isa());
#pragma omp parallel for num_threads(threads) schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    double loss_sum = 0;
    int64_t count = 0;
    for (int64_t i = c * chunk; i < std::min(N, (c + 1) * chunk); ++i) {
      const float* z = logits + i * V;
      // m <- max_j z_ij
      const float m = k.row_max(z, V);
      // s <- sum_j exp(z_ij - m)  and  zsum <- sum_j z_ij   (accumulated in double)
      double zsum = 0;
      const double s = k.sum_exp(z, V, m, eps != 0 ? &zsum : nullptr);
      // lse_i <- m + log(s)
      const double lse_i = static_cast<double>(m) + std::log(s);
      lse[i] = static_cast<float>(lse_i);
      const int64_t t = targets[i];
      if (!counted(t, ignore_index)) continue;
      // loss_i <- (1 - eps) (lse_i - z_it) + eps (lse_i - zsum / V)
      double li = (1.0 - eps) * (lse_i - static_cast<double>(z[t]));
      if (eps != 0) li += eps * (lse_i - zsum / static_cast<double>(V));
      loss_sum += li;
      ++count;
    }
    loss_part[c] = loss_sum;
    count_part[c] = count;
  }
  // total <- sum of the chunk sums, in chunk order
  double total = 0;
  int64_t n = 0;
  for (int64_t c = 0; c < nchunks; ++c) {
    total += loss_part[c];
    n += count_part[c];
  }
  *n_counted = n;
  return n == 0 ? 0.0 : total / static_cast<double>(n);
}

void cross_entropy_backward(const float* logits, const int64_t* targets, const float* lse, float* dlogits, int64_t N,
                            int64_t V, int64_t ignore_index, float label_smoothing, int64_t n_counted,
                            float grad_scale, int threads) {
  const double eps = label_smoothing;
  // a <- grad_scale / n ;  u <- eps / V  (the smoothing target's mass on each class)
  const float a = n_counted > 0 ? static_cast<float>(static_cast<double>(grad_scale) / static_cast<double>(n_counted))
                                : 0.0f;
  const float u = static_cast<float>(eps / static_cast<double>(V));
  // 1 - p_t is formed as the sum of the other classes' p (q below), not by cancellation, so it
  // keeps its relative accuracy for a confident row and each gradient row sums to ~0.
  const double target_extra = eps * (1.0 - 1.0 / static_cast<double>(V));
  const TrainIsa k = train_isa(active_isa());
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    float* d = dlogits + i * V;
    const int64_t t = targets[i];
    if (n_counted <= 0 || !counted(t, ignore_index)) {
      std::fill(d, d + V, 0.0f);
      continue;
    }
    const float* z = logits + i * V;
    const float l = lse[i];
    // d_ij <- a (p_ij - u),  p_ij = exp(z_ij - lse_i)   (j != t);   q <- sum_{j != t} p_ij
    const double q = k.softmax_grad_row(z, t, l, a, u, d) + k.softmax_grad_row(z + t + 1, V - t - 1, l, a, u, d + t + 1);
    // d_it <- a (p_it - (1 - eps) - u) = a (eps (1 - 1/V) - q)
    d[t] = static_cast<float>(static_cast<double>(a) * (target_extra - q));
  }
}

}  // namespace qkv::kernels
