// Helpers shared by the differentiable ops (src/ops/*.cpp): output creation, gradient
// accumulation and simple deterministic elementwise loops.
#pragma once
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "qkv/autograd.h"
#include "qkv/parallel.h"

namespace qkv::ops::detail {

inline bool needs_grad(const Var& v) { return v && v->requires_grad; }

// Threads for a loop over `work` elements: one below 16384 (a parallel region costs more than
// it saves there, and far more when the cores are shared with other processes).
inline int threads_for(int64_t work) { return work < (int64_t{1} << 14) ? 1 : num_threads(); }

// A new output node of the given shape whose requires_grad is set when any input needs grad.
Var new_output(std::vector<int64_t> shape, bool requires_grad);

// The incoming gradient of an op's output, or nullptr when none reached it.
inline const float* out_grad(const Node& out) { return out.has_grad ? out.grad.data<float>() : nullptr; }

// Runs compute(dst), which must overwrite all of dst with a gradient contribution of n.value.numel()
// floats, then adds it into n's gradient (writing directly when n has none yet).
template <class F>
void into_grad(Node& n, F&& compute) {
  bool add = false;
  float* g = n.grad_dest(&add);
  if (!add) {
    compute(g);
    return;
  }
  Tensor tmp = Tensor::empty(n.value.shape(), DType::F32);
  float* t = tmp.data<float>();
  compute(t);
  const int64_t count = n.value.numel();
#pragma omp parallel for num_threads(detail::threads_for(count)) schedule(static)
  for (int64_t i = 0; i < count; ++i) g[i] += t[i];
}

// n's gradient += src (n.value.numel() floats), or = src when it has none yet.
void accumulate_grad(Node& n, const float* src);

// n's gradient buffer zeroed if it held nothing, for ops that add into part of it.
float* grad_accum(Node& n);

// dst[i] += src[i] (or dst[i] = src[i] when !add).
void add_or_copy(float* dst, const float* src, int64_t count, bool add);

// col_sum[j] (+)= sum_i x[i*C + j] over N rows, summed in row order in double (per column):
// deterministic for any thread count.
void column_sums(const float* x, int64_t N, int64_t C, float* col_sum, bool add);

}  // namespace qkv::ops::detail
