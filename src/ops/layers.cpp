// Differentiable layer ops: linear, residual add, scale, embedding, positions, norms,
// activations, SwiGLU and dropout. Each forward is followed by the backward it pushes.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/activations.h"
#include "kernels/dropout.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "kernels/quant.h"
#include "ops/op_util.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/ops.h"
#include "qkv/parallel.h"
#include "qkv/quant.h"

namespace qkv::ops {

using detail::add_or_copy;
using detail::grad_accum;
using detail::into_grad;
using detail::needs_grad;
using detail::new_output;
using detail::out_grad;

namespace {

const Tensor& value_of(const Var& v, const char* op, const char* what) {
  check(v && v->value.defined(), op, ": ", what, " is missing");
  return v->value;
}

std::vector<int64_t> with_last(std::vector<int64_t> shape, int64_t last) {
  shape.back() = last;
  return shape;
}

}  // namespace

Tensor as_ids(const Tensor& t, const char* what) {
  check(t.defined(), what, ": ids are missing");
  check(t.dtype() == DType::I64 || t.dtype() == DType::I32, what, ": expected int32 or int64 ids, got ",
        t.describe());
  return t.dtype() == DType::I64 ? t.contiguous() : t.to(DType::I64);
}

// ---- linear ------------------------------------------------------------------------------

namespace {

// Rows of x from which a packed product dequantises tiles of W for the float32 product.
constexpr int64_t kPackedGemmRows = 32;

// y <- x W[r0:r1]^T (+ b) with W packed (inference only): each row of x is one matrix-vector
// product (kernels::gemv), so a row's result is the same whatever the other rows.
Var linear_packed(Tape& tape, const Var& x, const PackedWeight& P, const Var& b, int64_t row_begin, int64_t row_end,
                  int64_t bias_begin) {
  const Tensor& X = value_of(x, "linear", "input");
  check(!(tape.recording && (needs_grad(x) || needs_grad(b))),
        "linear: a weight packed to ", wtype_name(P.type), " is for inference; it takes no gradient");
  const int64_t In = P.cols;
  if (row_end < 0) row_end = P.rows;
  check(0 <= row_begin && row_begin <= row_end && row_end <= P.rows, "linear: rows [", row_begin, ", ", row_end,
        ") outside the weight's ", P.rows, " rows");
  check(X.dim() >= 1 && X.size(-1) == In, "linear: input ", shape_str(X.shape()), " does not end in the weight's In = ",
        In);
  const int64_t Out = row_end - row_begin, N = X.numel() / std::max<int64_t>(In, 1);
  if (bias_begin < 0) bias_begin = row_begin;
  if (b) check(b->value.dim() == 1 && bias_begin + Out <= b->value.size(0), "linear: bias ",
               shape_str(b->value.shape()), " has no elements ", bias_begin, "..", bias_begin + Out - 1);
  Var y = new_output(with_last(X.shape(), Out), false);
  float* Y = y->value.data<float>();
  const float* Xp = X.data<float>();
  const int threads = num_threads();
  if (N >= kPackedGemmRows && !BatchInvariantGemm::active() && In > 0) {
    // Many rows (a prompt, a batch being scored). On a CPU with bf16 dot products, bf16, Q8_0 and
    // Q4_0 weights multiply the activations rounded to bfloat16 (nearest even), products exact and
    // sums in float32 (qkv::gemm_bf16_nt): bf16 weights as stored, the others dequantised 256 rows
    // at a time and rounded to bfloat16 too. Elsewhere (and f16 always, whose 11-bit mantissa
    // bf16 would cut) the tiles are dequantised to float32 for the float32 product, the
    // activations unrounded. Decoding's single rows, and every row under BatchInvariantGemm, take
    // the matrix-vector path below.
    const bool bf16 = P.type != WType::F16 && bf16_gemm_enabled();
    std::vector<uint16_t> xb;
    if (bf16) {
      xb.resize(static_cast<size_t>(N * In));
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t i = 0; i < N; ++i) kernels::f32_to_bf16_n(Xp + i * In, xb.data() + i * In, In);
    }
    auto add_bias = [&](int64_t c0, int64_t cols) {
      if (!b) return;
      const float* bias = b->value.data<float>() + bias_begin + c0;
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < cols; ++j) Y[i * Out + c0 + j] += bias[j];
    };
    if (bf16 && P.type == WType::BF16) {
      gemm_bf16_nt(N, Out, In, xb.data(), In, reinterpret_cast<const uint16_t*>(P.row(row_begin)), In, Y, Out);
      add_bias(0, Out);
      return y;
    }
    if (bf16) {
      // tiles of whole 16-row groups, up to 8 MiB of bf16: each product call packs the activations
      // again, so fewer, larger calls (Q4_0 groups dequantise straight from their grouped bytes)
      const int64_t kTile = std::max<int64_t>(256, (int64_t{8} << 20) / (2 * In) / 16 * 16);
      std::vector<uint16_t> tile_b(static_cast<size_t>(std::min(Out, kTile) * In));
      for (int64_t r0 = 0; r0 < Out; r0 += kTile) {
        const int64_t rows = std::min(kTile, Out - r0), chunks = (rows + 15) / 16;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t c = 0; c < chunks; ++c)
          P.dequantize_rows_bf16(row_begin + r0 + 16 * c, std::min<int64_t>(16, rows - 16 * c),
                                 tile_b.data() + 16 * c * In);
        gemm_bf16_nt(N, rows, In, xb.data(), In, tile_b.data(), In, Y + r0, Out);
        add_bias(r0, rows);
      }
      return y;
    }
    constexpr int64_t kTile = 256;
    std::vector<float> tile(static_cast<size_t>(std::min(Out, kTile) * In));
    for (int64_t r0 = 0; r0 < Out; r0 += kTile) {
      const int64_t rows = std::min(kTile, Out - r0);
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t r = 0; r < rows; ++r) P.dequantize_row(row_begin + r0 + r, tile.data() + r * In);
      if (b) {
        const float* bias = b->value.data<float>() + bias_begin + r0;
        for (int64_t i = 0; i < N; ++i) std::copy(bias, bias + rows, Y + i * Out + r0);
      }
      sgemm(false, true, N, rows, In, 1.0f, Xp, In, tile.data(), In, b ? 1.0f : 0.0f, Y + r0, Out);
    }
    return y;
  }
  // a grouped Q4_0 matrix's rows [row_begin, row_end) as the row products take them: whole groups,
  // then the matrix's own last rows
  check(P.type != WType::Q4_0 ||
            (row_begin % kernels::kQ4Group == 0 && (row_end == P.rows || row_end % kernels::kQ4Group == 0)),
        "linear: rows [", row_begin, ", ", row_end, ") of a q4_0 weight of ", P.rows,
        " rows do not start and end at multiples of ", kernels::kQ4Group, " (or its end)");
  std::vector<uint8_t> ws(kernels::gemv_workspace_bytes(P.type, In));
  for (int64_t i = 0; i < N; ++i) {
    kernels::gemv(P.type, P.row(row_begin), Out, In, Xp + i * In, Y + i * Out, ws.data(), threads);
    if (b) {
      const float* bias = b->value.data<float>() + bias_begin;
      for (int64_t j = 0; j < Out; ++j) Y[i * Out + j] += bias[j];
    }
  }
  return y;
}

}  // namespace

std::vector<Var> linear_parts(Tape& tape, const Var& x, const std::vector<Var>& w, const Var& b,
                              const std::vector<int64_t>& bias_begin) {
  check(w.size() == bias_begin.size() && !w.empty() && w.size() <= 16, "linear_parts: ", w.size(), " weights and ",
        bias_begin.size(), " bias offsets");
  const Tensor& X = value_of(x, "linear", "input");
  const int64_t N = X.dim() >= 1 ? X.numel() / std::max<int64_t>(X.size(-1), 1) : 0;
  bool shared = X.dim() >= 1 && (N < kPackedGemmRows || BatchInvariantGemm::active()) &&
                !(tape.recording && (needs_grad(x) || needs_grad(b)));
  for (const Var& wi : w)
    shared = shared && wi && wi->packed && wi->packed->type == w[0]->packed->type &&
             wi->packed->cols == w[0]->packed->cols && wi->packed->cols == X.size(-1);
  std::vector<Var> out;
  if (!shared) {
    for (size_t i = 0; i < w.size(); ++i) out.push_back(linear(tape, x, w[i], b, 0, -1, bias_begin[i]));
    return out;
  }
  // y_i <- x W_i^T + b_i, each row of x quantised once for every part
  const int64_t In = X.size(-1);
  std::vector<kernels::GemvPart> parts(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const PackedWeight& P = *w[i]->packed;
    if (b) check(b->value.dim() == 1 && bias_begin[i] + P.rows <= b->value.size(0), "linear: bias ",
                 shape_str(b->value.shape()), " has no elements ", bias_begin[i], "..", bias_begin[i] + P.rows - 1);
    out.push_back(new_output(with_last(X.shape(), P.rows), false));
  }
  const float* Xp = X.data<float>();
  std::vector<uint8_t> ws(kernels::gemv_workspace_bytes(w[0]->packed->type, In));
  for (int64_t r = 0; r < N; ++r) {
    for (size_t i = 0; i < w.size(); ++i)
      parts[i] = {w[i]->packed->row(0), w[i]->packed->rows, out[i]->value.data<float>() + r * w[i]->packed->rows};
    kernels::gemv_parts(w[0]->packed->type, parts.data(), static_cast<int64_t>(parts.size()), In, Xp + r * In,
                        ws.data(), num_threads());
    for (size_t i = 0; i < w.size() && b; ++i) {
      const int64_t Out = w[i]->packed->rows;
      const float* bias = b->value.data<float>() + bias_begin[i];
      float* y = out[i]->value.data<float>() + r * Out;
      for (int64_t j = 0; j < Out; ++j) y[j] += bias[j];
    }
  }
  return out;
}

Var linear(Tape& tape, const Var& x, const Var& w, const Var& b, int64_t row_begin, int64_t row_end,
           int64_t bias_begin) {
  if (w && w->packed) return linear_packed(tape, x, *w->packed, b, row_begin, row_end, bias_begin);
  const Tensor& X = value_of(x, "linear", "input");
  const Tensor& W = value_of(w, "linear", "weight");
  check(W.dim() == 2, "linear: weight must be (Out, In), got ", shape_str(W.shape()));
  const int64_t In = W.size(1);
  if (row_end < 0) row_end = W.size(0);
  check(0 <= row_begin && row_begin <= row_end && row_end <= W.size(0), "linear: rows [", row_begin, ", ", row_end,
        ") outside the weight's ", W.size(0), " rows");
  check(X.dim() >= 1 && X.size(-1) == In, "linear: input ", shape_str(X.shape()), " does not end in the weight's In = ",
        In, " (weight ", shape_str(W.shape()), ")");
  const int64_t Out = row_end - row_begin, N = X.numel() / std::max<int64_t>(In, 1);
  if (bias_begin < 0) bias_begin = row_begin;
  if (b) check(b->value.dim() == 1 && bias_begin + Out <= b->value.size(0), "linear: bias ",
               shape_str(b->value.shape()), " has no elements ", bias_begin, "..", bias_begin + Out - 1);
  Var y = new_output(with_last(X.shape(), Out), needs_grad(x) || needs_grad(w) || needs_grad(b));
  float* Y = y->value.data<float>();
  const float* Wr = W.data<float>() + row_begin * In;
  // y <- x W[r0:r1]^T (+ b[r0:r1]). With a bias, y starts as the bias rows and the product is
  // added to it (beta = 1, as PyTorch's addmm): one pass over y instead of the BLAS zeroing it
  // for beta = 0 and a second pass adding the bias.
  if (b) {
    const float* bias = b->value.data<float>() + bias_begin;
#pragma omp parallel for num_threads(detail::threads_for(N * Out)) schedule(static)
    for (int64_t i = 0; i < N; ++i) std::copy(bias, bias + Out, Y + i * Out);
  } else if (In == 0) {
    std::fill(Y, Y + N * Out, 0.0f);
  }
  if (In > 0) sgemm(false, true, N, Out, In, 1.0f, X.data<float>(), In, Wr, In, b ? 1.0f : 0.0f, Y, Out);
  if (y->requires_grad) {
    tape.push([x, w, b, y, row_begin, bias_begin, In, Out, N] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      const Bf16Unchanged dy_kept(dY);  // both products below round dY once under Bf16Matmul
      // Under Bf16Matmul, where a product will round dY, the bias gradient's column sums are taken
      // in that rounding's pass over dY (the same bits as column_sums below)
      const bool products = (needs_grad(x) && Out > 0) || (needs_grad(w) && N > 0 && In > 0);
      const bool bias_done = needs_grad(b) && products && Bf16Matmul::active() &&
                             dy_kept.round_with_column_sums(N, Out, Out, grad_accum(*b) + bias_begin);
      // dx <- dy W[r0:r1]
      if (needs_grad(x)) {
        bool add = false;
        float* dX = x->grad_dest(&add);
        if (Out == 0) {
          if (!add) std::fill(dX, dX + N * In, 0.0f);
        } else {
          sgemm(false, false, N, In, Out, 1.0f, dY, Out, w->value.data<float>() + row_begin * In, In,
                add ? 1.0f : 0.0f, dX, In);
        }
      }
      // dW[r0:r1] += dy^T x   (written directly, without zeroing first, when these rows are
      // the whole weight and it holds no gradient yet)
      if (needs_grad(w)) {
        const bool whole = row_begin == 0 && Out == w->value.size(0) && N > 0;
        bool add = true;
        float* dW = nullptr;
        if (whole) {
          dW = w->grad_dest(&add);
        } else {
          dW = grad_accum(*w) + row_begin * In;
        }
        if (N > 0 && In > 0)
          sgemm(true, false, Out, In, N, 1.0f, dY, Out, x->value.data<float>(), In, add ? 1.0f : 0.0f, dW, In);
      }
      // db[r0:r1] += sum over rows of dy
      if (needs_grad(b) && !bias_done) detail::column_sums(dY, N, Out, grad_accum(*b) + bias_begin, true);
    });
  }
  return y;
}

// ---- add, scale ----------------------------------------------------------------------------

Var add(Tape& tape, const Var& a, const Var& b) {
  const Tensor& A = value_of(a, "add", "first operand");
  const Tensor& Bv = value_of(b, "add", "second operand");
  check(A.shape() == Bv.shape(), "add: shapes differ: ", shape_str(A.shape()), " and ", shape_str(Bv.shape()));
  Var y = new_output(A.shape(), needs_grad(a) || needs_grad(b));
  const int64_t n = A.numel();
  const float *pa = A.data<float>(), *pb = Bv.data<float>();
  float* py = y->value.data<float>();
#pragma omp parallel for num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
  if (y->requires_grad) {
    tape.push([a, b, y, n] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // da <- dy;  db <- dy
      for (const Var* v : {&a, &b})
        if (needs_grad(*v)) detail::accumulate_grad(**v, dY);
    });
  }
  return y;
}

Var scale(Tape& tape, const Var& x, float s) {
  const Tensor& X = value_of(x, "scale", "input");
  Var y = new_output(X.shape(), needs_grad(x));
  const int64_t n = X.numel();
  const float* px = X.data<float>();
  float* py = y->value.data<float>();
#pragma omp parallel for num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) py[i] = s * px[i];
  if (y->requires_grad) {
    tape.push([x, y, n, s] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dx <- s dy
      into_grad(*x, [&](float* dX) {
#pragma omp parallel for num_threads(detail::threads_for(n)) schedule(static)
        for (int64_t i = 0; i < n; ++i) dX[i] = s * dY[i];
      });
    });
  }
  return y;
}

// ---- embedding and positions -----------------------------------------------------------------

namespace {

// E[ids] from a packed table (inference): each row dequantised.
Var embedding_packed(const Tensor& ids_in, const PackedWeight& P) {
  Tensor ids = as_ids(ids_in, "embedding");
  const int64_t N = ids.numel(), V = P.rows, C = P.cols;
  const int64_t bad = kernels::embedding_check_ids(ids.data<int64_t>(), N, V);
  check(bad < 0, "embedding: id ", bad < 0 ? 0 : ids.data<int64_t>()[bad], " at flat index ", bad,
        " is outside the vocabulary [0, ", V, ")");
  std::vector<int64_t> shape = ids.shape();
  shape.push_back(C);
  Var y = new_output(shape, false);
  const int64_t* id = ids.data<int64_t>();
  float* out = y->value.data<float>();
#pragma omp parallel for num_threads(detail::threads_for(N * C)) schedule(static)
  for (int64_t i = 0; i < N; ++i) P.dequantize_row(id[i], out + i * C);
  return y;
}

}  // namespace

Var embedding(Tape& tape, const Tensor& ids_in, const Var& table) {
  if (table && table->packed) {
    check(!(tape.recording && needs_grad(table)), "embedding: a table packed to ", wtype_name(table->packed->type),
          " is for inference; it takes no gradient");
    return embedding_packed(ids_in, *table->packed);
  }
  const Tensor& Tb = value_of(table, "embedding", "table");
  check(Tb.dim() == 2, "embedding: table must be (V, C), got ", shape_str(Tb.shape()));
  Tensor ids = as_ids(ids_in, "embedding");
  const int64_t N = ids.numel(), V = Tb.size(0), C = Tb.size(1);
  const int64_t bad = kernels::embedding_check_ids(ids.data<int64_t>(), N, V);
  check(bad < 0, "embedding: id ", bad < 0 ? 0 : ids.data<int64_t>()[bad], " at flat index ", bad,
        " is outside the vocabulary [0, ", V, ")");
  std::vector<int64_t> shape = ids.shape();
  shape.push_back(C);
  Var y = new_output(shape, needs_grad(table));
  kernels::embedding_forward(Tb.data<float>(), ids.data<int64_t>(), y->value.data<float>(), N, V, C, num_threads());
  if (y->requires_grad) {
    tape.push([ids, table, y, N, V, C] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dtable[ids_i] += dy_i
      kernels::embedding_backward(ids.data<int64_t>(), dY, grad_accum(*table), N, V, C, num_threads());
    });
  }
  return y;
}

Var add_positions(Tape& tape, const Var& x, const Var& table, int64_t offset) {
  const Tensor& X = value_of(x, "add_positions", "input");
  const Tensor& P = value_of(table, "add_positions", "position table");
  check(X.dim() == 3, "add_positions: input must be (B, T, C), got ", shape_str(X.shape()));
  const int64_t B = X.size(0), T = X.size(1), C = X.size(2);
  check(P.dim() == 2 && P.size(1) == C, "add_positions: table must be (P, ", C, "), got ", shape_str(P.shape()));
  check(offset >= 0 && offset + T <= P.size(0), "add_positions: positions ", offset, "..", offset + T - 1,
        " exceed the table's ", P.size(0), " positions (max_len)");
  Var y = new_output(X.shape(), needs_grad(x) || needs_grad(table));
  const float *px = X.data<float>(), *pp = P.data<float>() + offset * C;
  float* py = y->value.data<float>();
#pragma omp parallel for num_threads(detail::threads_for(B * T * C)) schedule(static)
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t c = 0; c < C; ++c) py[r * C + c] = px[r * C + c] + pp[(r % T) * C + c];
  if (y->requires_grad) {
    tape.push([x, table, y, B, T, C, offset] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dx <- dy
      if (needs_grad(x)) detail::accumulate_grad(*x, dY);
      // dtable[offset + t] += sum_b dy[b, t]
      if (needs_grad(table)) {
        float* dP = grad_accum(*table) + offset * C;
#pragma omp parallel for num_threads(detail::threads_for(B * T * C)) schedule(static)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < C; ++c) dP[t * C + c] += dY[(b * T + t) * C + c];
      }
    });
  }
  return y;
}

// ---- normalisation -----------------------------------------------------------------------------

namespace {

// Writes a parameter gradient computed by a kernel that overwrites its output.
template <class F>
void param_grad(const Var& p, F&& compute) {
  if (needs_grad(p)) into_grad(*p, compute);
}

// compute(dx) overwrites n floats with x's gradient contribution and may compute more on the
// side: written straight into x's gradient when that holds nothing yet (into_grad), else added
// to it; into a scratch tensor when x needs no gradient.
template <class F>
void input_grad(const Var& x, int64_t n, F&& compute) {
  if (needs_grad(x)) {
    into_grad(*x, compute);
    return;
  }
  Tensor scratch = Tensor::empty({n});
  compute(scratch.data<float>());
}

}  // namespace

Var layer_norm(Tape& tape, const Var& x, const Var& gamma, const Var& beta, float eps) {
  const Tensor& X = value_of(x, "layer_norm", "input");
  const Tensor& G = value_of(gamma, "layer_norm", "weight");
  check(X.dim() >= 1, "layer_norm: input must have at least one dimension");
  const int64_t C = X.size(-1), N = X.numel() / std::max<int64_t>(C, 1);
  check(G.dim() == 1 && G.size(0) == C, "layer_norm: weight ", shape_str(G.shape()), " does not match C = ", C);
  if (beta) check(beta->value.dim() == 1 && beta->value.size(0) == C, "layer_norm: bias ",
                  shape_str(beta->value.shape()), " does not match C = ", C);
  Var y = new_output(X.shape(), needs_grad(x) || needs_grad(gamma) || needs_grad(beta));
  Tensor mean({N}, DType::F32), rstd({N}, DType::F32);
  kernels::layernorm_forward(X.data<float>(), G.data<float>(), beta ? beta->value.data<float>() : nullptr,
                             y->value.data<float>(), mean.data<float>(), rstd.data<float>(), N, C, eps,
                             num_threads());
  if (y->requires_grad) {
    tape.push([x, gamma, beta, y, mean, rstd, N, C] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dx, dgamma, dbeta from the saved mean and rstd (kernels/norm.h)
      Tensor dg = Tensor::empty({C}), db = Tensor::empty({C});
      input_grad(x, N * C, [&](float* dx) {
        kernels::layernorm_backward(x->value.data<float>(), gamma->value.data<float>(), mean.data<float>(),
                                    rstd.data<float>(), dY, dx, dg.data<float>(), beta ? db.data<float>() : nullptr, N,
                                    C, num_threads());
      });
      param_grad(gamma, [&](float* d) { std::copy(dg.data<float>(), dg.data<float>() + C, d); });
      param_grad(beta, [&](float* d) { std::copy(db.data<float>(), db.data<float>() + C, d); });
    });
  }
  return y;
}

Var rms_norm(Tape& tape, const Var& x, const Var& gamma, float eps) {
  const Tensor& X = value_of(x, "rms_norm", "input");
  const Tensor& G = value_of(gamma, "rms_norm", "weight");
  check(X.dim() >= 1, "rms_norm: input must have at least one dimension");
  const int64_t C = X.size(-1), N = X.numel() / std::max<int64_t>(C, 1);
  check(G.dim() == 1 && G.size(0) == C, "rms_norm: weight ", shape_str(G.shape()), " does not match C = ", C);
  Var y = new_output(X.shape(), needs_grad(x) || needs_grad(gamma));
  Tensor rstd({N}, DType::F32);
  kernels::rmsnorm_forward(X.data<float>(), G.data<float>(), y->value.data<float>(), rstd.data<float>(), N, C, eps,
                           num_threads());
  if (y->requires_grad) {
    tape.push([x, gamma, y, rstd, N, C] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      Tensor dg = Tensor::empty({C});
      input_grad(x, N * C, [&](float* dx) {
        kernels::rmsnorm_backward(x->value.data<float>(), gamma->value.data<float>(), rstd.data<float>(), dY, dx,
                                  dg.data<float>(), N, C, num_threads());
      });
      param_grad(gamma, [&](float* d) { std::copy(dg.data<float>(), dg.data<float>() + C, d); });
    });
  }
  return y;
}

// ---- activations, SwiGLU, dropout --------------------------------------------------------------

Var activation(Tape& tape, const Var& x, Activation f) {
  const Tensor& X = value_of(x, "activation", "input");
  Var y = new_output(X.shape(), needs_grad(x));
  const int64_t n = X.numel();
  const Activation k = f;
  if (y->requires_grad && k != Activation::ReLU) {
    // GELU for training: f'(x) is computed with f(x), sharing the exponential, and saved, so
    // the backward pass is one product (ReLU's derivative is cheaper to recompute than to keep).
    Tensor D = Tensor::empty(X.shape(), DType::F32);
    kernels::activation_forward_grad(k, X.data<float>(), y->value.data<float>(), D.data<float>(), n, num_threads());
    tape.push([x, y, n, D] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dx <- dy f'(x)
      into_grad(*x, [&](float* dX) { kernels::multiply(dY, D.data<float>(), dX, n, num_threads()); });
    });
    return y;
  }
  kernels::activation_forward(k, X.data<float>(), y->value.data<float>(), n, num_threads());
  if (y->requires_grad) {
    tape.push([x, y, n, k] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dx <- dy f'(x)
      into_grad(*x, [&](float* dX) { kernels::activation_backward(k, x->value.data<float>(), dY, dX, n, num_threads()); });
    });
  }
  return y;
}

Var gated(Tape& tape, const Var& x, Activation f) {
  const Tensor& X = value_of(x, "gated", "input");
  check(X.dim() >= 1 && X.size(-1) % 2 == 0, "gated: last dimension must be even (gate and value halves), got ",
        shape_str(X.shape()));
  const int64_t F = X.size(-1) / 2, N = X.numel() / std::max<int64_t>(2 * F, 1);
  Var y = new_output(with_last(X.shape(), F), needs_grad(x));
  const float* px = X.data<float>();
  float* py = y->value.data<float>();
  // y[i] <- f(x[i, :F]) * x[i, F:]
#pragma omp parallel for num_threads(detail::threads_for(N * F)) schedule(static)
  for (int64_t i = 0; i < N; ++i) kernels::gated_forward(f, px + i * 2 * F, px + i * 2 * F + F, py + i * F, F, 1);
  if (y->requires_grad) {
    tape.push([x, y, N, F, f] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      const float* px2 = x->value.data<float>();
      into_grad(*x, [&](float* dX) {
#pragma omp parallel for num_threads(detail::threads_for(N * F)) schedule(static)
        for (int64_t i = 0; i < N; ++i)
          kernels::gated_backward(f, px2 + i * 2 * F, px2 + i * 2 * F + F, dY + i * F, dX + i * 2 * F,
                                   dX + i * 2 * F + F, F, 1);
      });
    });
  }
  return y;
}

Var dropout(Tape& tape, const Var& x, float p, uint64_t seed, uint64_t stream) {
  const Tensor& X = value_of(x, "dropout", "input");
  check(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got ", p);
  if (p == 0.0f) return x;
  Var y = new_output(X.shape(), needs_grad(x));
  const int64_t n = X.numel();
  kernels::dropout_forward(X.data<float>(), y->value.data<float>(), n, p, seed, stream, num_threads());
  if (y->requires_grad) {
    tape.push([x, y, n, p, seed, stream] {
      const float* dY = out_grad(*y);
      if (!dY) return;
      // dx <- dy * keep / (1 - p), the mask regenerated from (seed, stream)
      into_grad(*x, [&](float* dX) { kernels::dropout_backward(dY, dX, n, p, seed, stream, num_threads()); });
    });
  }
  return y;
}

}  // namespace qkv::ops
