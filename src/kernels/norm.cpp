#include "kernels/norm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace qkv::kernels {
namespace {

int clamp_threads(int threads) { return std::max(1, threads); }

// dgamma / dbeta are sums down the columns: f(j0, j1) sums columns j0 .. j1 - 1 over the rows in
// order, reading each row's band from front to back, one band per thread. Up to kBand columns
// take one thread: shorter bands than that read by two threads were slower than one thread
// reading whole rows (see kernels::column_sums). Each column's sum is the same for any bands.
constexpr int64_t kBand = 2048;
template <class F>
void for_column_bands(int64_t C, int threads, F&& f) {
  const int nt = C <= kBand ? 1 : clamp_threads(threads);
  const int64_t per = (C + nt - 1) / nt;
  const int64_t band = std::clamp<int64_t>((per + 15) / 16 * 16, 16, kBand), bands = (C + band - 1) / band;
#pragma omp parallel for num_threads(bands > 1 ? nt : 1) schedule(static)
  for (int64_t b = 0; b < bands; ++b) f(b * band, std::min(C, (b + 1) * band));
}

// Row sums for LayerNorm on explicit vectors of 4 doubles (GCC vector extensions; AVX2 in the
// x86-64-v3 clone picked at load time): GCC does not vectorise a floating-point sum, since that
// reorders it. Each sum runs four lanes over j = 4q + lane, then adds the lanes in a fixed
// order and the tail last, so the result does not depend on the machine or the thread count.
typedef double vd4 __attribute__((vector_size(4 * sizeof(double))));
typedef float vf4 __attribute__((vector_size(4 * sizeof(float))));

inline vd4 load4d(const float* p) {
  vf4 f;
  __builtin_memcpy(&f, p, sizeof f);
  return __builtin_convertvector(f, vd4);
}
inline double lanes(vd4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

// sum_j (x_j - c)
__attribute__((target_clones("arch=x86-64-v3", "default")))
double sum_dev(const float* x, double c, int64_t C) {
  vd4 acc = {0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 4 <= C; j += 4) acc += load4d(x + j) - c;
  double s = lanes(acc);
  for (; j < C; ++j) s += x[j] - c;
  return s;
}

// sum_j (x_j - c)^2
__attribute__((target_clones("arch=x86-64-v3", "default")))
double sum_sq_dev(const float* x, double c, int64_t C) {
  vd4 acc = {0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 4 <= C; j += 4) {
    const vd4 d = load4d(x + j) - c;
    acc += d * d;
  }
  double s = lanes(acc);
  for (; j < C; ++j) {
    const double d = x[j] - c;
    s += d * d;
  }
  return s;
}

// y_j <- (x_j - mu) r gamma_j + beta_j, rounded once
__attribute__((target_clones("arch=x86-64-v3", "default")))
void normalize_row(const float* x, double mu, double r, const float* gamma, const float* beta, float* y, int64_t C) {
  int64_t j = 0;
  for (; j + 4 <= C; j += 4) {
    const vd4 b = beta ? load4d(beta + j) : vd4{0, 0, 0, 0};
    const vf4 out = __builtin_convertvector((load4d(x + j) - mu) * r * load4d(gamma + j) + b, vf4);
    __builtin_memcpy(y + j, &out, sizeof out);
  }
  for (; j < C; ++j) {
    const double xhat = (x[j] - mu) * r;
    y[j] = static_cast<float>(xhat * gamma[j] + (beta ? static_cast<double>(beta[j]) : 0.0));
  }
}

// *g_sum <- sum_j dy_j gamma_j ;  *gx_sum <- sum_j dy_j gamma_j (x_j - centre) r
__attribute__((target_clones("arch=x86-64-v3", "default")))
void backward_row_sums(const float* x, const float* dy, const float* gamma, double centre, double r, double* g_sum,
                       double* gx_sum, int64_t C) {
  vd4 ag = {0, 0, 0, 0}, agx = {0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 4 <= C; j += 4) {
    const vd4 g = load4d(dy + j) * load4d(gamma + j);
    ag += g;
    agx += g * ((load4d(x + j) - centre) * r);
  }
  double sg = lanes(ag), sgx = lanes(agx);
  for (; j < C; ++j) {
    const double g = static_cast<double>(dy[j]) * gamma[j];
    sg += g;
    sgx += g * ((x[j] - centre) * r);
  }
  *g_sum = sg;
  *gx_sum = sgx;
}

// dx_j <- r (dy_j gamma_j - g_mean - (x_j - centre) r gx_mean), rounded once
__attribute__((target_clones("arch=x86-64-v3", "default")))
void backward_row_dx(const float* x, const float* dy, const float* gamma, double centre, double r, double g_mean,
                     double gx_mean, float* dx, int64_t C) {
  int64_t j = 0;
  for (; j + 4 <= C; j += 4) {
    const vd4 g = load4d(dy + j) * load4d(gamma + j);
    const vd4 xhat = (load4d(x + j) - centre) * r;
    const vf4 out = __builtin_convertvector(r * (g - g_mean - xhat * gx_mean), vf4);
    __builtin_memcpy(dx + j, &out, sizeof out);
  }
  for (; j < C; ++j) {
    const double g = static_cast<double>(dy[j]) * gamma[j];
    const double xhat = (x[j] - centre) * r;
    dx[j] = static_cast<float>(r * (g - g_mean - xhat * gx_mean));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// LayerNorm

void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                       int64_t N, int64_t C, float eps, int threads) {
  // x, y: (N, C)   gamma, beta: (C)   mean, rstd: (N). One row (a decoding step) forks no threads.
#pragma omp parallel for num_threads(clamp_threads(threads)) schedule(static) if (N > 1)
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    float* yi = y + i * C;
    // mu <- sum_j x_ij / C   (double: exact enough for any float row)
    const double mu = C > 0 ? sum_dev(xi, 0.0, C) / static_cast<double>(C) : 0.0;
    // var <- sum_j (x_ij - mu)^2 / C   (two passes: no cancellation when |mu| >> spread)
    const double var = C > 0 ? sum_sq_dev(xi, mu, C) / static_cast<double>(C) : 0.0;
    // r <- 1 / sqrt(var + eps)
    const double r = 1.0 / std::sqrt(var + static_cast<double>(eps));
    // y_ij <- (x_ij - mu) * r * gamma_j + beta_j
    normalize_row(xi, mu, r, gamma, beta, yi, C);
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
    dx[i * C] = static_cast<float>(sum_dev(x + i * C, mean[i], C) * inv_c);
  }

  // dgamma_j <- sum_i dy_ij * xhat_ij ;  dbeta_j <- sum_i dy_ij   (rows in order: the same sums
  // for any thread count)
  for_column_bands(C, nt, [&](int64_t j0, int64_t j1) {
    double acc_g[kBand], acc_b[kBand];
    std::fill(acc_g, acc_g + (j1 - j0), 0.0);
    std::fill(acc_b, acc_b + (j1 - j0), 0.0);
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
  });

  // dx_ij <- r_i * (g_ij - mean_k(g_ik) - xhat_ij * mean_k(g_ik * xhat_ik)),  g = dy * gamma
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    const float* dyi = dy + i * C;
    float* dxi = dx + i * C;
    const double centre = static_cast<double>(mean[i]) + dxi[0];  // read corr_i before overwriting
    const double r = rstd[i];
    double g_mean = 0, gx_mean = 0;
    backward_row_sums(xi, dyi, gamma, centre, r, &g_mean, &gx_mean, C);
    g_mean *= inv_c;
    gx_mean *= inv_c;
    backward_row_dx(xi, dyi, gamma, centre, r, g_mean, gx_mean, dxi, C);
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t N, int64_t C, float eps,
                     int threads) {
  // x, y: (N, C)   gamma: (C)   rstd: (N). One row (a decoding step) forks no threads.
#pragma omp parallel for num_threads(clamp_threads(threads)) schedule(static) if (N > 1)
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

  // dgamma_j <- sum_i dy_ij * x_ij * r_i   (rows in order)
  for_column_bands(C, nt, [&](int64_t j0, int64_t j1) {
    double acc[kBand];
    std::fill(acc, acc + (j1 - j0), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      const float* xi = x + i * C;
      const float* dyi = dy + i * C;
      const double r = rstd[i];
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += dyi[j] * (xi[j] * r);
    }
    for (int64_t j = j0; j < j1; ++j) dgamma[j] = static_cast<float>(acc[j - j0]);
  });

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
