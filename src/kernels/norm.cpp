#include "kernels/norm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace qkv::kernels {
namespace {

// dgamma / dbeta are summed by tasks that each own this many adjacent columns (one 64-byte
// line of floats per row). The blocks do not depend on the thread count, so neither do the sums.
constexpr int64_t kColBlock = 16;

int clamp_threads(int threads) { return std::max(1, threads); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// LayerNorm

void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                       int64_t N, int64_t C, float eps, int threads) {
  // x, y: (N, C)   gamma, beta: (C)   mean, rstd: (N)
#pragma omp parallel for num_threads(clamp_threads(threads)) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    float* yi = y + i * C;
    // mu <- sum_j x_ij / C   (double: exact enough for any float row)
    double mu = 0;
    for (int64_t j = 0; j < C; ++j) mu += xi[j];
    mu = C > 0 ? mu / static_cast<double>(C) : 0.0;
    // var <- sum_j (x_ij - mu)^2 / C   (two passes: no cancellation when |mu| >> spread)
    double var = 0;
    for (int64_t j = 0; j < C; ++j) {
      const double d = xi[j] - mu;
      var += d * d;
    }
    var = C > 0 ? var / static_cast<double>(C) : 0.0;
    // r <- 1 / sqrt(var + eps)
    const double r = 1.0 / std::sqrt(var + static_cast<double>(eps));
    // y_ij <- (x_ij - mu) * r * gamma_j + beta_j
    for (int64_t j = 0; j < C; ++j) {
      const double xhat = (xi[j] - mu) * r;
      yi[j] = static_cast<float>(xhat * gamma[j] + (beta ? static_cast<double>(beta[j]) : 0.0));
    }
    mean[i] = static_cast<float>(mu);
    rstd[i] = static_cast<float>(r);
  }
}

// With xhat = (x - mu) * r and g = dy * gamma, per row:
//   dx_j = r * (g_j - mean_k(g_k) - xhat_j * mean_k(g_k * xhat_k))
//   dgamma_j = sum_i dy_ij * xhat_ij,   dbeta_j = sum_i dy_ij
//
// The saved mean is the row mean rounded to float; when |mean| >> the row's spread that
// rounding (half an ulp of the mean) is a large error in xhat. So the centre used here is
// mean_i + corr_i with corr_i = sum_j (x_ij - mean_i) / C in double, which restores the mean to
// double precision at the cost of one pass over the row. corr_i is parked in dx[i, 0] between
// the passes (dx is overwritten anyway), so the kernel needs no scratch memory.
void layernorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                        float* dx, float* dgamma, float* dbeta, int64_t N, int64_t C, int threads) {
  // x, dy, dx: (N, C)   gamma, dgamma, dbeta: (C)   mean, rstd: (N)
  const int nt = clamp_threads(threads);
  if (N == 0 || C == 0) {
    std::fill(dgamma, dgamma + C, 0.0f);
    if (dbeta) std::fill(dbeta, dbeta + C, 0.0f);
    return;
  }
  const double inv_c = 1.0 / static_cast<double>(C);

  // dx[i, 0] <- corr_i = sum_j (x_ij - mean_i) / C
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    const double m = mean[i];
    double s = 0;
    for (int64_t j = 0; j < C; ++j) s += xi[j] - m;
    dx[i * C] = static_cast<float>(s * inv_c);
  }

  // dgamma_j <- sum_i dy_ij * xhat_ij ;  dbeta_j <- sum_i dy_ij   (one task per column block,
  // rows in order: the same sums for any thread count)
  const int64_t nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t j0 = blk * kColBlock, j1 = std::min(C, j0 + kColBlock);
    double acc_g[kColBlock] = {}, acc_b[kColBlock] = {};
    for (int64_t i = 0; i < N; ++i) {
      const float* xi = x + i * C;
      const float* dyi = dy + i * C;
      const double centre = static_cast<double>(mean[i]) + dx[i * C];
      const double r = rstd[i];
      for (int64_t j = j0; j < j1; ++j) {
        acc_g[j - j0] += dyi[j] * ((xi[j] - centre) * r);
        acc_b[j - j0] += dyi[j];
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      dgamma[j] = static_cast<float>(acc_g[j - j0]);
      if (dbeta) dbeta[j] = static_cast<float>(acc_b[j - j0]);
    }
  }

  // dx_ij <- r_i * (g_ij - mean_k(g_ik) - xhat_ij * mean_k(g_ik * xhat_ik)),  g = dy * gamma
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    const float* dyi = dy + i * C;
    float* dxi = dx + i * C;
    const double centre = static_cast<double>(mean[i]) + dxi[0];  // read corr_i before overwriting
    const double r = rstd[i];
    double g_mean = 0, gx_mean = 0;
    for (int64_t j = 0; j < C; ++j) {
      const double g = static_cast<double>(dyi[j]) * gamma[j];
      g_mean += g;
      gx_mean += g * ((xi[j] - centre) * r);
    }
    g_mean *= inv_c;
    gx_mean *= inv_c;
    for (int64_t j = 0; j < C; ++j) {
      const double g = static_cast<double>(dyi[j]) * gamma[j];
      const double xhat = (xi[j] - centre) * r;
      dxi[j] = static_cast<float>(r * (g - g_mean - xhat * gx_mean));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t N, int64_t C, float eps,
                     int threads) {
  // x, y: (N, C)   gamma: (C)   rstd: (N)
#pragma omp parallel for num_threads(clamp_threads(threads)) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    float* yi = y + i * C;
    // ms <- sum_j x_ij^2 / C ;  r <- 1 / sqrt(ms + eps)
    double ms = 0;
    for (int64_t j = 0; j < C; ++j) ms += static_cast<double>(xi[j]) * xi[j];
    ms = C > 0 ? ms / static_cast<double>(C) : 0.0;
    const double r = 1.0 / std::sqrt(ms + static_cast<double>(eps));
    // y_ij <- x_ij * r * gamma_j
    for (int64_t j = 0; j < C; ++j) yi[j] = static_cast<float>(xi[j] * r * gamma[j]);
    rstd[i] = static_cast<float>(r);
  }
}

// With r = (mean_k x_k^2 + eps)^(-1/2), dr/dx_j = -r^3 x_j / C, and g = dy * gamma, per row:
//   dx_j = r * g_j - x_j * r^3 * mean_k(g_k * x_k)
//   dgamma_j = sum_i dy_ij * x_ij * r_i
void rmsnorm_backward(const float* x, const float* gamma, const float* rstd, const float* dy, float* dx,
                      float* dgamma, int64_t N, int64_t C, int threads) {
  // x, dy, dx: (N, C)   gamma, dgamma: (C)   rstd: (N)
  const int nt = clamp_threads(threads);
  if (N == 0 || C == 0) {
    std::fill(dgamma, dgamma + C, 0.0f);
    return;
  }
  const double inv_c = 1.0 / static_cast<double>(C);

  // dgamma_j <- sum_i dy_ij * x_ij * r_i   (one task per column block, rows in order)
  const int64_t nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t j0 = blk * kColBlock, j1 = std::min(C, j0 + kColBlock);
    double acc[kColBlock] = {};
    for (int64_t i = 0; i < N; ++i) {
      const float* xi = x + i * C;
      const float* dyi = dy + i * C;
      const double r = rstd[i];
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += dyi[j] * (xi[j] * r);
    }
    for (int64_t j = j0; j < j1; ++j) dgamma[j] = static_cast<float>(acc[j - j0]);
  }

  // dx_ij <- r_i * g_ij - x_ij * r_i^3 * mean_k(g_ik * x_ik),  g = dy * gamma
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    const float* dyi = dy + i * C;
    float* dxi = dx + i * C;
    const double r = rstd[i];
    double gx_mean = 0;
    for (int64_t j = 0; j < C; ++j) gx_mean += static_cast<double>(dyi[j]) * gamma[j] * xi[j];
    gx_mean *= inv_c;
    const double r3 = r * r * r;
    for (int64_t j = 0; j < C; ++j) {
      const double g = static_cast<double>(dyi[j]) * gamma[j];
      dxi[j] = static_cast<float>(r * g - xi[j] * r3 * gx_mean);
    }
  }
}

}  // namespace qkv::kernels
