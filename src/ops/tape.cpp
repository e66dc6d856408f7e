// The reverse-mode tape (qkv/autograd.h) and the helpers the ops share (op_util.h).
#include "qkv/autograd.h"

#include <algorithm>
#include <utility>

#include "kernels/column_sums.h"
#include "ops/op_util.h"
#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {
// The closure Tape::run is running on this thread (-1: none).
thread_local int64_t running_op = -1;
}  // namespace

float* Node::grad_dest(bool* add) {
  if (!grad.defined() || grad.shape() != value.shape()) grad = Tensor::empty(value.shape(), DType::F32);
  *add = has_grad;
  has_grad = true;
  if (running_op >= 0) last_writer = running_op;
  return grad.data<float>();
}

Var make_var(Tensor value, bool requires_grad) {
  check(value.defined(), "make_var: tensor is not defined");
  auto n = std::make_shared<Node>();
  n->value = value.dtype() == DType::F32 ? value.contiguous() : value.to(DType::F32);
  n->requires_grad = requires_grad;
  return n;
}

void Tape::push(std::function<void()> backward_fn) {
  if (recording) ops_.push_back(std::move(backward_fn));
}

void Tape::backward(const Var& loss, float seed) {
  check(loss && loss->value.numel() == 1, "Tape::backward: the loss must have exactly one element, got ",
        loss ? loss->value.describe() : std::string("nothing"));
  if (loss->requires_grad) {
    bool add = false;
    float* g = loss->grad_dest(&add);
    g[0] = add ? g[0] + seed : seed;
  }
  run();
}

void Tape::backward(const Var& out, const Tensor& grad_out) {
  check(out && grad_out.defined() && grad_out.shape() == out->value.shape(), "Tape::backward: gradient ",
        grad_out.defined() ? grad_out.describe() : std::string("nothing"), " does not match the output ",
        out ? out->value.describe() : std::string("nothing"));
  if (out->requires_grad) {
    const Tensor g = grad_out.to(DType::F32);
    ops::detail::accumulate_grad(*out, g.data<float>());
  }
  run();
}

void Tape::run() {
  // Each closure is released as soon as it has run, so saved activations are freed layer by layer.
  while (!ops_.empty()) {
    std::function<void()> fn = std::move(ops_.back());
    ops_.pop_back();
    running_op = static_cast<int64_t>(ops_.size());
    try {
      fn();
    } catch (...) {
      running_op = -1;
      throw;
    }
    running_op = -1;
    if (after_op) after_op(ops_.size());
  }
}

namespace ops::detail {

Var new_output(std::vector<int64_t> shape, bool requires_grad) {
  auto n = std::make_shared<Node>();
  n->value = Tensor::empty(std::move(shape), DType::F32);  // every op writes all of its output
  n->requires_grad = requires_grad;
  return n;
}

float* grad_accum(Node& n) {
  bool add = false;
  float* g = n.grad_dest(&add);
  if (!add) {
    const int64_t count = n.value.numel();
#pragma omp parallel for num_threads(detail::threads_for(count)) schedule(static)
    for (int64_t i = 0; i < count; ++i) g[i] = 0.0f;
  }
  return g;
}

void accumulate_grad(Node& n, const float* src) {
  bool add = false;
  float* g = n.grad_dest(&add);  // sets add: a separate statement from its use
  add_or_copy(g, src, n.value.numel(), add);
}

void add_or_copy(float* dst, const float* src, int64_t count, bool add) {
  if (add) {
#pragma omp parallel for num_threads(detail::threads_for(count)) schedule(static)
    for (int64_t i = 0; i < count; ++i) dst[i] += src[i];
  } else if (count > 0) {
    std::copy(src, src + count, dst);
  }
}

void column_sums(const float* x, int64_t N, int64_t C, float* col_sum, bool add) {
  kernels::column_sums(x, N, C, C, col_sum, add, nullptr, 0, detail::threads_for(N * C));
}

}  // namespace ops::detail
}  // namespace qkv
