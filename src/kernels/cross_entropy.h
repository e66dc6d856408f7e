// cross_entropy: softmax cross-entropy of logits against integer targets, with PyTorch's
// reduction='mean', ignore_index and label_smoothing semantics
// (torch.nn.functional.cross_entropy without class weights). The forward pass saves the row
// log-sum-exp so backward can form softmax(z) = exp(z - lse) without a second reduction.
//
// Targets are trusted here: the op layer calls cross_entropy_check_targets first and throws.
// V >= 1. Logits are assumed finite; a NaN or inf logit propagates into the loss and its row's
// gradient.
#pragma once
#include <cstdint>

namespace qkv::kernels {

// Index of the first row whose target is neither ignore_index nor in [0, V), or -1 if none.
// targets: (N)
int64_t cross_entropy_check_targets(const int64_t* targets, int64_t N, int64_t V, int64_t ignore_index);

// Returns the mean over counted rows (target != ignore_index) of
//   loss_i = (1 - eps) * (lse_i - z_i[t_i]) + eps * (lse_i - mean_j z_ij),   eps = label_smoothing,
// and stores the number of counted rows in *n_counted. With no counted row it returns 0 (not
// the 0/0 = NaN PyTorch gives) and *n_counted = 0.
// lse is written for every row, ignored ones included. Each row is reduced by the active ISA's
// vector body (train_isa.cpp): float lanes over blocks of 32 vectors, the blocks added in double;
// rows are summed in chunks whose size depends only on N, and the chunks in order, so the result
// is bitwise identical for any thread count.
// logits: (N, V)   targets: (N)   lse: (N), written
double cross_entropy_forward(const float* logits, const int64_t* targets, float* lse, int64_t N, int64_t V,
                             int64_t ignore_index, float label_smoothing, int64_t* n_counted, int threads);

// dlogits <- grad_scale * d(mean loss)/d(logits), overwritten; rows whose target is ignore_index
// get 0. grad_scale is dL/d(mean loss) (1 for a plain loss.backward()). n_counted must be the
// value cross_entropy_forward reported for the same targets: the 1/n_counted of the mean is
// applied here. n_counted <= 0 (every row ignored) gives an all-zero dlogits.
// lse is the forward's; since it is stored in float, softmax(z) = exp(z - lse) carries a
// relative error of about ulp(lse) / 2 (PyTorch's float log_softmax has the same).
// logits: (N, V)   targets: (N)   lse: (N)   dlogits: (N, V)
void cross_entropy_backward(const float* logits, const int64_t* targets, const float* lse, float* dlogits, int64_t N,
                            int64_t V, int64_t ignore_index, float label_smoothing, int64_t n_counted,
                            float grad_scale, int threads);

}  // namespace qkv::kernels
