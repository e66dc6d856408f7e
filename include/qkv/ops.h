// qkv/ops.h: differentiable operations on the tape (qkv/autograd.h). Each op checks shapes,
// calls the kernels for its forward pass and, when the tape records, pushes its hand-written
// backward (which sits beside the forward in src/ops/). All values are float32; ids and targets
// are int64 (int32 is accepted and converted).
//
// Dimension names: B batch, T sequence, C channels (d_model), V vocabulary, N = rows.
#pragma once
#include <cstdint>
#include <vector>

#include "qkv/activation.h"
#include "qkv/attention.h"
#include "qkv/autograd.h"

namespace qkv {

namespace ops {

// y = x W[r0:r1]^T + b[c0:c0 + r1 - r0]: rows [row_begin, row_end) of w (row_end = -1: all
// rows), so one fused weight can serve several projections (cross-attention's Q and K/V parts).
// The bias segment starts at bias_begin (-1: at row_begin), for separate weights that share one
// fused bias (PyTorch's q_proj_weight / k_proj_weight / v_proj_weight with in_proj_bias).
// x: (..., In)   w: (Out, In)   b: (>= c0 + r1 - r0) or nullptr   ->   (..., r1 - r0)
Var linear(Tape& tape, const Var& x, const Var& w, const Var& b, int64_t row_begin = 0, int64_t row_end = -1,
           int64_t bias_begin = -1);

// ops::linear of x by each of several weights (decoding's q, k and v projections): part i is
// x w_i^T + b[bias_begin[i] ..] (b may be nullptr). Weights packed to one type, of one width,
// multiplied row by row as ops::linear does (decoding's few rows, or under BatchInvariantGemm),
// take one quantisation of each row of x and one parallel region for all parts; the results are
// ops::linear's bit for bit either way.
std::vector<Var> linear_parts(Tape& tape, const Var& x, const std::vector<Var>& w, const Var& b,
                              const std::vector<int64_t>& bias_begin);

// a + b (same shape): a residual connection.
Var add(Tape& tape, const Var& a, const Var& b);

// s * x
Var scale(Tape& tape, const Var& x, float s);

// Rows of `table` picked by ids. ids: int (any shape), each in [0, V)   table: (V, C)  ->  (ids..., C)
Var embedding(Tape& tape, const Tensor& ids, const Var& table);

// x[b, t] + table[offset + t]: absolute positions (learned when table requires grad, sinusoidal
// when it is a constant). x: (B, T, C)   table: (P, C) with offset + T <= P
Var add_positions(Tape& tape, const Var& x, const Var& table, int64_t offset = 0);

// Over the last dimension. x: (..., C)   gamma, beta: (C); beta may be nullptr
Var layer_norm(Tape& tape, const Var& x, const Var& gamma, const Var& beta, float eps);
Var rms_norm(Tape& tape, const Var& x, const Var& gamma, float eps);

// Elementwise f(x).
Var activation(Tape& tape, const Var& x, Activation f);

// Gated: f(x[..., :F]) * x[..., F:] (SwiGLU: f = SiLU; GeGLU: f = GELU)   x: (..., 2F)  ->  (..., F)
Var gated(Tape& tape, const Var& x, Activation f);

// Inverted dropout with a counter-based mask: element i is kept iff hash(seed, stream, i)
// passes, so backward regenerates the mask instead of storing it. p == 0 returns x itself.
Var dropout(Tape& tape, const Var& x, float p, uint64_t seed, uint64_t stream);

// Where the heads of Q, K and V sit inside projection outputs, and rotary embedding.
struct HeadLayout {
  int64_t H = 1, Hkv = 1, Dk = 0, Dv = 0;
  int64_t q_col = 0;  // head h of Q: columns q_col + h*Dk .. of q_src
  int64_t k_col = 0;  // head g of K: columns k_col + g*Dk .. of k_src
  int64_t v_col = 0;  // head g of V: columns v_col + g*Dv .. of v_src
  double rope_theta = 0;  // > 0: rotate Q and K by position (RoPE, rotate-half form)
  int64_t q_pos = 0, k_pos = 0;  // positions of the first query and key (RoPE)
};

// Multi-head attention core on projected inputs (the flash kernel; saves only the output and
// logsumexp). Q, K and V heads are read from column ranges of q_src, k_src and v_src, which may
// be one Var (a fused self-attention projection) or two (cross-attention's Q and K/V parts).
// q_src: (B, Tq, Wq)   k_src: (B, Tk, Wk)   v_src: (B, Tk, Wv)   ->   (B, Tq, H*Dv), heads concatenated
Var attention(Tape& tape, const Var& q_src, const Var& k_src, const Var& v_src, const HeadLayout& heads,
              const AttentionSpec& spec);

// Mean softmax cross-entropy of logits against targets, rows whose target is ignore_index not
// counted, with label smoothing (torch.nn.functional.cross_entropy). Returns a 1-element Var.
// *n_counted (if given) receives the number of counted rows.
// logits: (..., V)   targets: int (...)
Var cross_entropy(Tape& tape, const Var& logits, const Tensor& targets, int64_t ignore_index = -100,
                  float label_smoothing = 0.0f, int64_t* n_counted = nullptr);

// Mean over the first lengths[b] positions (all T when lengths is undefined); a sequence of
// length 0 pools to zeros. x: (B, T, C)   lengths: int (B)  ->  (B, C)
Var mean_pool(Tape& tape, const Var& x, const Tensor& lengths);

// x[:, 0, :]   x: (B, T, C) with T >= 1  ->  (B, C)
Var first_token(Tape& tape, const Var& x);

// Integer tensor (int32 or int64, any layout) as contiguous int64; `what` names it in errors.
Tensor as_ids(const Tensor& t, const char* what);

}  // namespace ops
}  // namespace qkv
