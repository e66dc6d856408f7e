// qkv/autograd.h: a small reverse-mode tape of coarse operations.
//
// A Var is a value (a float32 Tensor) plus, once backward reaches it, its gradient. Each
// differentiable op in qkv/ops.h computes its output and, when the tape is recording, pushes one
// closure that reads the output's gradient and adds into its inputs' gradients. The closure
// holds only what that op's backward needs (saved statistics such as LayerNorm's mean and rstd,
// attention's logsumexp), never a T x T matrix. Tape::backward runs the closures in reverse
// order, so a new architecture composed from existing ops needs no new backward code.
//
//   Tape tape;                       // recording
//   Var h = ops::linear(tape, x, w, b);
//   Var loss = ops::cross_entropy(tape, h, targets);
//   tape.backward(loss);             // w->grad, b->grad now hold dloss/dw, dloss/db
//
// Gradients accumulate: a parameter used twice (a tied embedding) or over several micro-batches
// sums its contributions, until zero_grad(). Everything is float32 and results are bitwise
// identical for a given thread count.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

struct PackedWeight;  // qkv/quant.h

struct Node {
  Tensor value;               // float32, contiguous
  // A projection matrix packed for inference (Model::pack_weights): ops::linear multiplies by
  // this instead of `value` (which keeps the float32 values it was packed from).
  std::shared_ptr<const PackedWeight> packed;
  Tensor grad;                // same shape; meaningful only when has_grad
  bool has_grad = false;      // false: grad holds nothing yet (the next write overwrites)
  bool requires_grad = false; // false: backward skips this node (inputs, constants)
  // The index on its tape of the last backward closure that wrote this gradient (-1: none since
  // it was reset). Backward runs closures from the last recorded to the first, so once the
  // closure at this index has run the gradient is final: what data parallelism needs to know to
  // send a gradient while the backward pass goes on.
  int64_t last_writer = -1;

  // The gradient buffer to write into. `*add` is set to true when it already holds a
  // contribution (the caller must add to it) and false when the caller may overwrite it.
  float* grad_dest(bool* add);
  void zero_grad() { has_grad = false; }
};
using Var = std::shared_ptr<Node>;

// A leaf holding `value` (made contiguous float32). requires_grad marks parameters.
Var make_var(Tensor value, bool requires_grad = false);

class Tape {
 public:
  // Not recording: ops only compute forward values (inference, or a forward without backward).
  bool recording = true;

  // Called by ops. The closure runs during backward(), after every op recorded later.
  void push(std::function<void()> backward_fn);

  // Seeds d(loss)/d(loss) = `seed` (loss must have one element), runs every recorded closure in
  // reverse order, then clears the tape (freeing saved activations).
  void backward(const Var& loss, float seed = 1.0f);
  // The same from any output with a given gradient (a vector-Jacobian product):
  // d(sum(out * grad_out)) reaches every input. grad_out: out's shape, float32.
  void backward(const Var& out, const Tensor& grad_out);
  void clear() { ops_.clear(); }
  size_t size() const { return ops_.size(); }

  // Called during backward() after each closure has run, with that closure's index (recorded
  // order; they run from size() - 1 down to 0).
  std::function<void(size_t)> after_op;

 private:
  void run();
  std::vector<std::function<void()>> ops_;
};

// A named trainable tensor.
struct Parameter {
  std::string name;   // PyTorch state_dict naming, e.g. "layers.0.self_attn.in_proj_weight"
  Var var;
  bool decay = true;  // AdamW weight decay applies (projection matrices; not norms, biases, embeddings)
};

}  // namespace qkv
