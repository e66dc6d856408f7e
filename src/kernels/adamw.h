// adamw: one step of torch.optim.AdamW (decoupled weight decay, no amsgrad, no maximize),
// element for element in the order of PyTorch 1.13's _single_tensor_adamw, and the global
// gradient norm used for clipping by norm.
#pragma once
#include <cstdint>

namespace qkv::kernels {

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  int64_t step = 1;  // 1-based: the number of this step, counter already incremented (>= 1)
  float grad_scale = 1.0f;  // g <- grad * grad_scale first (clipping by norm), grad itself unchanged
};

// The scalars (1 - lr wd, bias corrections, step size) are formed in double, as Python does,
// then used in float:
//   g     <- grad * grad_scale            (skipped when grad_scale == 1)
//   param <- param * (1 - lr wd)
//   m     <- beta1 m + (1 - beta1) g
//   v     <- beta2 v + (1 - beta2) g g
//   denom <- sqrt(v) / sqrt(1 - beta2^step) + eps
//   param <- param + (-lr / (1 - beta1^step)) m / denom
// param, grad, m, v: (n); param, m, v updated in place (m, v start at zero before step 1).
// Elementwise, so bitwise identical for any thread count. The vector body (train_isa.cpp) may
// fuse a multiply and an add where the ISA has FMA: within an ulp of the unfused order.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p, int threads);

// adamw_step on many tensors in one parallel region (a training step's parameters): their
// kSlice-element slices, in order, split evenly between the threads, instead of one region per
// tensor with small tensors on the calling thread alone. The same bits as adamw_step on each.
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
  AdamWParams p;
};
void adamw_steps(const AdamWTensor* tensors, int64_t count, int threads);

// sum over tensors k of sum_i grads[k][i]^2, accumulated in double. Each tensor is split into
// chunks whose size depends only on its length; chunks and tensors are added in order, so the
// result is bitwise identical for any thread count. The norm is sqrt of the result.
// grads: (count) pointers, grads[k]: (sizes[k])   sizes: (count)
double global_grad_norm_sq(const float* const* grads, const int64_t* sizes, int64_t count, int threads);

}  // namespace qkv::kernels
