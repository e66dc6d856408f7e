// LayerNorm and RMSNorm over the last dimension of a row-major (N, C) matrix, forward and
// backward side by side. Row statistics are accumulated in double, so inputs of large magnitude
// and small spread (x ~ 1e4 +- 0.01) do not lose their variance to cancellation.
//
// Every output is bitwise identical for any thread count: rows are split across threads for
// y and dx (each row is one task), and dgamma / dbeta are summed over rows in a fixed order by
// tasks that each own a fixed block of columns (no reduction across threads).
//
// All pointers are contiguous; outputs must not alias inputs. N == 0 or C == 0 is allowed.
#pragma once
#include <cstdint>

namespace qkv::kernels {

// y <- (x - mean) * rstd * gamma + beta, per row, with mean and the biased variance of the row
// and rstd = 1 / sqrt(var + eps) (as PyTorch). mean and rstd are saved for the backward pass.
// x, y: (N, C)   gamma: (C)   beta: (C) or nullptr (no shift)   mean, rstd: (N)
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                       int64_t N, int64_t C, float eps, int threads);

// dx, dgamma and dbeta are overwritten (not accumulated). dbeta may be nullptr.
// mean, rstd: as saved by layernorm_forward for the same x and eps.
// x, dy, dx: (N, C)   gamma, dgamma, dbeta: (C)   mean, rstd: (N)
void layernorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                        float* dx, float* dgamma, float* dbeta, int64_t N, int64_t C, int threads);

// y <- x * rstd * gamma, per row, with rstd = 1 / sqrt(mean(x^2) + eps). rstd is saved.
// x, y: (N, C)   gamma: (C)   rstd: (N)
void rmsnorm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t N, int64_t C, float eps,
                     int threads);

// dx and dgamma are overwritten. rstd: as saved by rmsnorm_forward.
// x, dy, dx: (N, C)   gamma, dgamma: (C)   rstd: (N)
void rmsnorm_backward(const float* x, const float* gamma, const float* rstd, const float* dy, float* dx,
                      float* dgamma, int64_t N, int64_t C, int threads);

}  // namespace qkv::kernels
