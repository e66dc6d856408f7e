// Differentiable multi-head attention on projected inputs, cross-entropy and pooling.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/rope.h"
#include "ops/op_util.h"
#include "qkv/error.h"
#include "qkv/ops.h"
#include "qkv/parallel.h"

namespace qkv::ops {

using detail::grad_accum;
using detail::into_grad;
using detail::needs_grad;
using detail::new_output;
using detail::out_grad;

namespace {

// Copies `heads` heads of D columns starting at column `col` of src (B, T, W) into a new
// contiguous (B, T, heads, D) tensor.
Tensor gather_heads(const Tensor& src, int64_t col, int64_t heads, int64_t D) {
  const int64_t B = src.size(0), T = src.size(1), W = src.size(2), w = heads * D;
  Tensor out = Tensor::empty({B, T, heads, D});
  const float* s = src.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for num_threads(detail::threads_for(B * T * w)) schedule(static)
  for (int64_t r = 0; r < B * T; ++r) std::copy(s + r * W + col, s + r * W + col + w, o + r * w);
  return out;
}

// (B, heads, T, D) contiguous  ->  added into columns col .. col + heads*D of dst (B, T, W), or
// (add false) written there as g + 0: the bits of adding g to zeros (-0 becomes +0, as 0 + -0).
void scatter_heads(const float* g, float* dst, int64_t B, int64_t T, int64_t W, int64_t col, int64_t heads, int64_t D,
                   bool add) {
#pragma omp parallel for num_threads(detail::threads_for(B * T * heads * D)) schedule(static)
  for (int64_t r = 0; r < B * T; ++r) {
    const int64_t b = r / T, t = r % T;
    float* d = dst + r * W + col;
    for (int64_t h = 0; h < heads; ++h) {
      const float* s = g + ((b * heads + h) * T + t) * D;
      if (add) {
        for (int64_t i = 0; i < D; ++i) d[h * D + i] += s[i];
      } else {
        for (int64_t i = 0; i < D; ++i) d[h * D + i] = s[i] + 0.0f;
      }
    }
  }
}

// The heads' gradients dq, dk, dv into the gradients of the nodes they were read from. A node
// whose gradient holds nothing yet and whose columns the parts read from it cover exactly (a fused
// [Q | K | V] projection, or cross-attention's [K | V]) has them written in, without zeroing it
// first; any other is zeroed if need be and added to. The same bits either way.
struct HeadGrad {
  const Var* src;
  const float* g;
  int64_t T, col, heads, D;
};
void scatter_head_grads(const HeadGrad* parts, int n, int64_t B) {
  for (int i = 0; i < n; ++i) {
    const Var& src = *parts[i].src;
    if (!needs_grad(src)) continue;
    bool earlier = false;  // handled with an earlier part of the same node
    for (int j = 0; j < i; ++j) earlier = earlier || *parts[j].src == src;
    if (earlier) continue;
    std::vector<const HeadGrad*> mine;
    for (int j = i; j < n; ++j)
      if (*parts[j].src == src) mine.push_back(&parts[j]);
    std::sort(mine.begin(), mine.end(), [](const HeadGrad* a, const HeadGrad* b) { return a->col < b->col; });
    const int64_t W = src->value.size(2);
    int64_t end = 0;
    for (const HeadGrad* p : mine) end = p->col == end ? end + p->heads * p->D : -1;
    bool add = true;
    float* dst = nullptr;
    if (end == W && !src->has_grad) {
      dst = src->grad_dest(&add);
    } else {
      dst = grad_accum(*src);
    }
    for (const HeadGrad* p : mine) scatter_heads(p->g, dst, B, p->T, W, p->col, p->heads, p->D, add);
  }
}

// A (B, heads, T, D) view of `heads` heads of D columns from column `col` of t (B, T, W).
Tensor head_view(const Tensor& t, int64_t col, int64_t heads, int64_t D) {
  const int64_t B = t.size(0), T = t.size(1), W = t.size(2);
  return t.as_strided({B, heads, T, D}, {T * W, D, W, 1}, t.offset() + col);
}

}  // namespace

Var attention(Tape& tape, const Var& q_src, const Var& k_src, const Var& v_src, const HeadLayout& hl,
              const AttentionSpec& spec) {
  check(q_src && k_src && v_src, "attention: missing input");
  const Tensor& Q = q_src->value;
  const Tensor& K = k_src->value;
  const Tensor& Vv = v_src->value;
  check(Q.dim() == 3 && K.dim() == 3 && Vv.dim() == 3, "attention: inputs must be (B, T, W), got ",
        shape_str(Q.shape()), ", ", shape_str(K.shape()), " and ", shape_str(Vv.shape()));
  check(Q.size(0) == K.size(0) && K.size(0) == Vv.size(0), "attention: batch sizes differ");
  check(K.size(1) == Vv.size(1), "attention: keys and values have different lengths ", K.size(1), " and ",
        Vv.size(1));
  check(hl.H >= 1 && hl.Hkv >= 1 && hl.H % hl.Hkv == 0, "attention: H = ", hl.H, " must be a multiple of Hkv = ",
        hl.Hkv);
  check(hl.Dk >= 1 && hl.Dv >= 1, "attention: Dk and Dv must be positive, got ", hl.Dk, " and ", hl.Dv);
  check(hl.q_col >= 0 && hl.q_col + hl.H * hl.Dk <= Q.size(2), "attention: query heads need columns ", hl.q_col,
        "..", hl.q_col + hl.H * hl.Dk, " of ", Q.size(2));
  check(hl.k_col >= 0 && hl.k_col + hl.Hkv * hl.Dk <= K.size(2), "attention: key heads need columns ", hl.k_col,
        "..", hl.k_col + hl.Hkv * hl.Dk, " of ", K.size(2));
  check(hl.v_col >= 0 && hl.v_col + hl.Hkv * hl.Dv <= Vv.size(2), "attention: value heads need columns ", hl.v_col,
        "..", hl.v_col + hl.Hkv * hl.Dv, " of ", Vv.size(2));
  const bool rope = hl.rope_theta > 0;
  check(!rope || hl.Dk % 2 == 0, "attention: rotary embedding needs an even Dk, got ", hl.Dk);
  const int64_t B = Q.size(0), Tq = Q.size(1), Tk = K.size(1), H = hl.H, Hkv = hl.Hkv, Dk = hl.Dk, Dv = hl.Dv;

  // Q and K heads: views into the projections, or rotated copies (B, T, heads, D) for RoPE.
  Tensor q, k;
  if (rope) {
    Tensor qr = gather_heads(Q, hl.q_col, H, Dk), kr = gather_heads(K, hl.k_col, Hkv, Dk);
    kernels::rope_apply(qr.data<float>(), B, Tq, H, Dk, H * Dk, hl.q_pos, hl.rope_theta, false, num_threads());
    kernels::rope_apply(kr.data<float>(), B, Tk, Hkv, Dk, Hkv * Dk, hl.k_pos, hl.rope_theta, false, num_threads());
    q = head_view(qr.view({B, Tq, H * Dk}), 0, H, Dk);
    k = head_view(kr.view({B, Tk, Hkv * Dk}), 0, Hkv, Dk);
  } else {
    q = head_view(Q, hl.q_col, H, Dk);
    k = head_view(K, hl.k_col, Hkv, Dk);
  }
  Tensor v = head_view(Vv, hl.v_col, Hkv, Dv);
  AttentionSpec sp = spec;
  sp.impl = AttentionImpl::Flash;
  AttentionOutput o = qkv::attention(q, k, v, sp);

  // y[b, t, h*Dv + i] <- out[b, h, t, i]
  Var y = new_output({B, Tq, H * Dv}, needs_grad(q_src) || needs_grad(k_src) || needs_grad(v_src));
  {
    const float* po = o.out.data<float>();
    float* py = y->value.data<float>();
#pragma omp parallel for num_threads(detail::threads_for(B * Tq * H * Dv)) schedule(static)
    for (int64_t r = 0; r < B * Tq; ++r) {
      const int64_t b = r / Tq, t = r % Tq;
      for (int64_t h = 0; h < H; ++h)
        std::copy(po + ((b * H + h) * Tq + t) * Dv, po + ((b * H + h) * Tq + t + 1) * Dv, py + r * H * Dv + h * Dv);
    }
  }
  if (y->requires_grad) {
    Tensor lse = o.lse;
    tape.push([q_src, k_src, v_src, hl, sp, y, q, k, v, lse, B, Tq, Tk, H, Hkv, Dk, Dv, rope] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      Tensor out = head_view(y->value, 0, H, Dv);
      Tensor dout = head_view(y->grad, 0, H, Dv);
      AttentionGrads g = qkv::attention_backward(q, k, v, out, lse, dout, sp);
      // RoPE backward: rotate the gradients back, dq <- R^T dq (dq is (B*H, Tq, 1, Dk))
      if (rope) {
        kernels::rope_apply(g.dq.data<float>(), B * H, Tq, 1, Dk, Dk, hl.q_pos, hl.rope_theta, true, num_threads());
        kernels::rope_apply(g.dk.data<float>(), B * Hkv, Tk, 1, Dk, Dk, hl.k_pos, hl.rope_theta, true,
                            num_threads());
      }
      const HeadGrad parts[3] = {{&q_src, g.dq.data<float>(), Tq, hl.q_col, H, Dk},
                                 {&k_src, g.dk.data<float>(), Tk, hl.k_col, Hkv, Dk},
                                 {&v_src, g.dv.data<float>(), Tk, hl.v_col, Hkv, Dv}};
      scatter_head_grads(parts, 3, B);
    });
  }
  return y;
}

// ---- cross-entropy -----------------------------------------------------------------------------

Var cross_entropy(Tape& tape, const Var& logits, const Tensor& targets_in, int64_t ignore_index,
                  float label_smoothing, int64_t* n_counted) {
  check(logits && logits->value.dim() >= 1, "cross_entropy: logits must have a class dimension");
  const Tensor& L = logits->value;
  const int64_t V = L.size(-1), N = L.numel() / std::max<int64_t>(V, 1);
  check(V >= 1, "cross_entropy: logits have no classes");
  Tensor targets = as_ids(targets_in, "cross_entropy targets");
  check(targets.numel() == N, "cross_entropy: ", targets.numel(), " targets ", shape_str(targets.shape()), " for ", N,
        " rows of logits ", shape_str(L.shape()));
  check(label_smoothing >= 0.0f && label_smoothing <= 1.0f, "cross_entropy: label_smoothing must be in [0, 1], got ",
        label_smoothing);
  const int64_t bad = kernels::cross_entropy_check_targets(targets.data<int64_t>(), N, V, ignore_index);
  check(bad < 0, "cross_entropy: target ", bad < 0 ? 0 : targets.data<int64_t>()[bad], " at flat index ", bad,
        " is neither in [0, ", V, ") nor the ignore index ", ignore_index);
  Tensor lse({N}, DType::F32);
  int64_t counted = 0;
  const double loss = kernels::cross_entropy_forward(L.data<float>(), targets.data<int64_t>(), lse.data<float>(), N,
                                                     V, ignore_index, label_smoothing, &counted, num_threads());
  if (n_counted) *n_counted = counted;
  Var y = new_output({1}, needs_grad(logits));
  y->value.data<float>()[0] = static_cast<float>(loss);
  if (y->requires_grad) {
    tape.push([logits, targets, lse, y, N, V, ignore_index, label_smoothing, counted] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dlogits <- dy * (softmax(z) - smoothed one-hot) / n_counted
      into_grad(*logits, [&](float* dL) {
        kernels::cross_entropy_backward(logits->value.data<float>(), targets.data<int64_t>(), lse.data<float>(), dL, N,
                                        V, ignore_index, label_smoothing, counted, dY[0], num_threads());
      });
    });
  }
  return y;
}

// ---- pooling -------------------------------------------------------------------------------------

Var mean_pool(Tape& tape, const Var& x, const Tensor& lengths_in) {
  check(x && x->value.dim() == 3, "mean_pool: input must be (B, T, C)");
  const Tensor& X = x->value;
  const int64_t B = X.size(0), T = X.size(1), C = X.size(2);
  std::vector<int64_t> len(static_cast<size_t>(B), T);
  if (lengths_in.defined()) {
    Tensor l = as_ids(lengths_in, "mean_pool lengths");
    check(l.numel() == B, "mean_pool: ", l.numel(), " lengths for a batch of ", B);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t v = l.data<int64_t>()[b];
      check(v >= 0 && v <= T, "mean_pool: length ", v, " of sequence ", b, " is outside [0, ", T, "]");
      len[static_cast<size_t>(b)] = v;
    }
  }
  Var y = new_output({B, C}, needs_grad(x));
  const float* px = X.data<float>();
  float* py = y->value.data<float>();
  // y[b] <- (1 / len_b) sum_{t < len_b} x[b, t]   (summed in double, in order)
#pragma omp parallel for num_threads(detail::threads_for(B * T * C)) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len[static_cast<size_t>(b)];
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t t = 0; t < n; ++t) s += px[(b * T + t) * C + c];
      py[b * C + c] = n > 0 ? static_cast<float>(s / static_cast<double>(n)) : 0.0f;
    }
  }
  if (y->requires_grad) {
    tape.push([x, y, len, B, T, C] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dx[b, t] <- dy[b] / len_b for t < len_b, else 0
      into_grad(*x, [&](float* dX) {
#pragma omp parallel for num_threads(detail::threads_for(B * T * C)) schedule(static)
        for (int64_t b = 0; b < B; ++b) {
          const int64_t n = len[static_cast<size_t>(b)];
          const float inv = n > 0 ? static_cast<float>(1.0 / static_cast<double>(n)) : 0.0f;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < C; ++c) dX[(b * T + t) * C + c] = t < n ? dY[b * C + c] * inv : 0.0f;
        }
      });
    });
  }
  return y;
}

Var first_token(Tape& tape, const Var& x) {
  check(x && x->value.dim() == 3 && x->value.size(1) >= 1, "first_token: input must be (B, T, C) with T >= 1");
  const Tensor& X = x->value;
  const int64_t B = X.size(0), T = X.size(1), C = X.size(2);
  Var y = new_output({B, C}, needs_grad(x));
  for (int64_t b = 0; b < B; ++b)
    std::copy(X.data<float>() + b * T * C, X.data<float>() + b * T * C + C, y->value.data<float>() + b * C);
  if (y->requires_grad) {
    tape.push([x, y, B, T, C] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dx[b, 0] <- dy[b]; other positions 0
      into_grad(*x, [&](float* dX) {
        std::fill(dX, dX + B * T * C, 0.0f);
        for (int64_t b = 0; b < B; ++b) std::copy(dY + b * C, dY + b * C + C, dX + b * T * C);
      });
    });
  }
  return y;
}

}  // namespace qkv::ops
