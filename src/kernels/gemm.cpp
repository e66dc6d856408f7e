// Matrix products: oneDNN's dnnl_sgemm for matrices, qkv's row products (or OpenBLAS's sgemv) for
// a single row, plus a check that OpenBLAS did not fall back to a generic kernel on a CPU it
// failed to recognise.
//
// Why two libraries: over the shapes of a GPT-2-small training step, dnnl_sgemm took 2-4% less
// time than OpenBLAS's sgemm in isolation and 3-4% less per training step end to end (steps
// alternating between the two in one process; BENCHMARKS.md), partly because it folds beta = 0
// into its kernel where OpenBLAS first zeroes C in a separate pass. One row (decoding) is bound by
// reading the matrix once: see sgemm's M == 1 case.
#include "qkv/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/column_sums.h"
#include "kernels/quant.h"
#include "kernels/train_isa.h"
#include "qkv/cpu.h"
#include "qkv/parallel.h"

#include "kernels/gemm_internal.h"

#include <cblas.h>
#include <dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <string>

#include "qkv/cpu.h"
#include "qkv/error.h"

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
int openblas_get_parallel(void);
}

namespace qkv {

namespace {
thread_local int g_batch_invariant = 0;
thread_local int g_bf16 = 0;
constexpr int64_t kInvariantMaxRows = 64;
constexpr int64_t kInvariantColumns = 64;  // columns per task: a fixed split, whatever M or the threads
}  // namespace

BatchInvariantGemm::BatchInvariantGemm() { ++g_batch_invariant; }
BatchInvariantGemm::~BatchInvariantGemm() { --g_batch_invariant; }
bool BatchInvariantGemm::active() { return g_batch_invariant > 0; }

// The matrix a Bf16Unchanged promises is not written, and the A operand whose rounded copy
// sgemm_bf16's scratch holds (null: none that may be reused).
thread_local const float* g_unchanged = nullptr;
struct RoundedKey {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0, ld = 0, out_ld = 0;
  bool operator==(const RoundedKey&) const = default;
};
thread_local RoundedKey g_rounded_a;

Bf16Unchanged::Bf16Unchanged(const float* data) : data_(data), previous_(g_unchanged) {
  g_unchanged = data;
  g_rounded_a = {};
}
Bf16Unchanged::~Bf16Unchanged() {
  g_unchanged = previous_;
  g_rounded_a = {};
}

Bf16Matmul::Bf16Matmul() { ++g_bf16; }

Bf16Matmul::~Bf16Matmul() { --g_bf16; }
bool Bf16Matmul::active() { return g_bf16 > 0; }

namespace {

// The attributes of a matmul computing alpha A B + beta C (beta: a sum post-op).
dnnl::primitive_attr matmul_attr(float alpha, float beta) {
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  return attr;
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// C (M, N) = alpha A B + beta C on oneDNN's bf16 matmul: A (M, K) and B (K, N) bfloat16 with the
// element strides given (so either may be a transposed view), C float32 with row stride ldc. beta
// = 0 overwrites C (what it held never reaches the result). oneDNN keeps a cache of primitives by
// descriptor, so a shape seen before costs a lookup, not a new kernel.
void bf16_matmul(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t a_row, int64_t a_col,
                 const uint16_t* B, int64_t b_row, int64_t b_col, float beta, float* C, int64_t ldc) {
  try {
    using dt = dnnl::memory::data_type;
    const dnnl::engine& eng = cpu_engine();
    const dnnl::memory::desc a({M, K}, dt::bf16, dnnl::memory::dims{a_row, a_col});
    const dnnl::memory::desc b({K, N}, dt::bf16, dnnl::memory::dims{b_row, b_col});
    const dnnl::memory::desc c({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), matmul_attr(alpha, beta), eng);
    const dnnl::matmul mm(pd);
    dnnl::stream st(eng);
    dnnl::memory ma(a, eng, const_cast<uint16_t*>(A)), mb(b, eng, const_cast<uint16_t*>(B)), mc(c, eng, C);
    mm.execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    st.wait();
  } catch (const dnnl::error& e) {
    fail("gemm_bf16: oneDNN's matmul failed (", e.what(), ", status ", static_cast<int>(e.status), ") for M=", M,
         " N=", N, " K=", K);
  }
}

// A per-thread scratch buffer that only grows, 64-byte aligned (every product sees operands with
// the same alignment, whatever was allocated before).
template <class T>
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p_); }
  T* get(int64_t n) {
    const size_t want = static_cast<size_t>(std::max<int64_t>(n, 1));
    if (want > n_) {
      constexpr size_t kAlign = 64;
      const size_t bytes = (want * sizeof(T) + kAlign - 1) / kAlign * kAlign;
      void* q = std::aligned_alloc(kAlign, bytes);
      check(q != nullptr, "sgemm (bf16): cannot allocate ", bytes, " bytes of scratch");
      std::free(p_);
      p_ = static_cast<T*>(q);
      n_ = want;
    }
    return p_;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// X (rows, cols; row stride ld) rounded to bfloat16 into out (rows x cols, row stride out_ld).
void round_rows_bf16(const float* X, int64_t rows, int64_t cols, int64_t ld, uint16_t* out, int64_t out_ld) {
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (rows * cols >= (int64_t{1} << 15))
  for (int64_t r = 0; r < rows; ++r) kernels::f32_to_bf16_n(X + r * ld, out + r * out_ld, cols);
}

// The rounded copies of sgemm_bf16's operands, kept per thread (A's for the next call, see
// Bf16Unchanged).
thread_local Scratch<uint16_t> g_a_scratch, g_b_scratch;

// A's copy's row stride: rows start 64 bytes apart for the native product (see sgemm_bf16).
int64_t a_copy_ld(bool native, int64_t cols) { return native ? round_up(cols, 32) : cols; }

}  // namespace

using Bf16Buffer = std::unique_ptr<uint16_t, decltype(&std::free)>;

struct Bf16WeightBuffers::Impl {
  std::vector<std::pair<size_t, Bf16Buffer>> spare;  // (bytes, buffer)
};
Bf16WeightBuffers::Bf16WeightBuffers() : impl_(std::make_unique<Impl>()) {}
Bf16WeightBuffers::~Bf16WeightBuffers() = default;
size_t Bf16WeightBuffers::bytes() const {
  size_t n = 0;
  for (const auto& s : impl_->spare) n += s.first;
  return n;
}

// Bf16Weights: the arrays it covers and the rounded copies made so far.
struct Bf16Weights::State {
  std::vector<std::pair<const float*, int64_t>> arrays;
  struct Copy {
    RoundedKey key;
    size_t bytes = 0;
    Bf16Buffer data{nullptr, &std::free};
  };
  std::vector<Copy> copies;
  // B's copies in the layout oneDNN's matmul prefers for a product (blocked: see
  // bf16_matmul_weight), one per view of a weight, way of reading it (op(B) = B or B^T) and layout
  struct Packed {
    const float* data = nullptr;
    int64_t rows = 0, cols = 0, ld = 0;
    bool trans = false;
    dnnl::memory::desc desc;
    size_t bytes = 0;
    Bf16Buffer buf{nullptr, &std::free};
  };
  std::vector<Packed> packed;
  Bf16WeightBuffers::Impl* keep = nullptr;  // where the buffers come from and go back to

  // A buffer of `bytes` (a multiple of 64): one the step before left of that size, or a new one.
  Bf16Buffer take(size_t bytes) {
    if (keep)
      for (auto it = keep->spare.begin(); it != keep->spare.end(); ++it)
        if (it->first == bytes) {
          Bf16Buffer b = std::move(it->second);
          keep->spare.erase(it);
          return b;
        }
    Bf16Buffer b(static_cast<uint16_t*>(std::aligned_alloc(64, bytes)), &std::free);
    check(b != nullptr, "sgemm (bf16): cannot allocate ", bytes, " bytes for a weight's rounded copy");
    return b;
  }

  bool covers(const float* B, int64_t rows, int64_t cols, int64_t ld) const {
    if (rows <= 0 || cols <= 0) return false;
    const int64_t extent = (rows - 1) * ld + cols;  // floats from B to its last element
    for (const auto& [p, n] : arrays)
      if (B >= p && extent <= n && B - p <= n - extent) return true;
    return false;
  }
  // B's copy (rows x cols, row stride out_ld), rounded on first use.
  const uint16_t* copy_of(const float* B, int64_t rows, int64_t cols, int64_t ld, int64_t out_ld) {
    const RoundedKey key{B, rows, cols, ld, out_ld};
    for (const Copy& c : copies)
      if (c.key == key) return c.data.get();
    const size_t bytes = std::max<size_t>((static_cast<size_t>(rows * out_ld) * sizeof(uint16_t) + 63) / 64 * 64, 64);
    Copy c;
    c.key = key;
    c.bytes = bytes;
    c.data = take(bytes);
    round_rows_bf16(B, rows, cols, ld, c.data.get(), out_ld);
    copies.push_back(std::move(c));
    return copies.back().data.get();
  }
};
thread_local Bf16Weights::State* g_weights = nullptr;

Bf16Weights::Bf16Weights(const std::vector<std::pair<const float*, int64_t>>& arrays, Bf16WeightBuffers* buffers)
    : state_(std::make_unique<State>()), previous_(g_weights) {
  state_->arrays = arrays;
  state_->keep = buffers ? buffers->impl_.get() : nullptr;
  g_weights = state_.get();
}
Bf16Weights::~Bf16Weights() {
  if (Bf16WeightBuffers::Impl* keep = state_->keep) {
    keep->spare.clear();  // what this object did not take
    for (State::Copy& c : state_->copies) keep->spare.emplace_back(c.bytes, std::move(c.data));
    for (State::Packed& p : state_->packed) keep->spare.emplace_back(p.bytes, std::move(p.buf));
  }
  g_weights = previous_;
}

namespace {

// Whether d is oneDNN's BA16a64b2a layout of a (K, N) bf16 matrix as kernels::TrainIsa::
// pack_bf16_blocks writes it: dims padded to multiples of 32 and 64, blocks of 32 x 64 with
// column blocks outermost, no offset or compensation.
bool is_16a64b2a(const dnnl::memory::desc& d, int64_t K, int64_t N) {
  const dnnl_memory_desc_t& m = d.data;
  if (m.ndims != 2 || m.data_type != dnnl_bf16 || m.format_kind != dnnl_blocked || m.offset0 != 0 ||
      m.extra.flags != 0 || m.dims[0] != K || m.dims[1] != N)
    return false;
  const int64_t padK = (K + 31) / 32 * 32, padN = (N + 63) / 64 * 64;
  const dnnl_blocking_desc_t& b = m.format_desc.blocking;
  return m.padded_dims[0] == padK && m.padded_dims[1] == padN && m.padded_offsets[0] == 0 &&
         m.padded_offsets[1] == 0 && b.inner_nblks == 3 && b.inner_blks[0] == 16 && b.inner_idxs[0] == 0 &&
         b.inner_blks[1] == 64 && b.inner_idxs[1] == 1 && b.inner_blks[2] == 2 && b.inner_idxs[2] == 0 &&
         b.strides[0] == 32 * 64 && b.strides[1] == padK * 64;
}

// C (M, N) = alpha A op(B) + beta C as bf16_matmul, with B a weight that a Bf16Weights covers (B
// stored (b_rows, b_cols) with row stride ldb; op(B) = B^T when trans_b): oneDNN's matmul is asked
// for the layout of B it prefers, and B, rounded to bfloat16 as stored, is reordered into that
// layout once for the Bf16Weights object's life (a training step), where plain row-major B would
// be repacked by every product. The reorder moves the rounded values without changing them.
// Measured on Zen 5, 2 threads, the 2017 base model's shapes with warm caches: 720-830 GFLOP/s
// with plain B, 850-910 with B in the preferred layout. Returns false where that layout is B's
// plain one (the caller then multiplies by the plain copy).
bool bf16_matmul_weight(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t a_row, int64_t a_col,
                        const float* B, int64_t b_rows, int64_t b_cols, int64_t ldb, bool trans_b, int64_t b_ld,
                        float beta, float* C, int64_t ldc, Bf16Weights::State& w) {
  using dt = dnnl::memory::data_type;
  const int64_t br = trans_b ? 1 : b_ld, bc = trans_b ? b_ld : 1;  // element strides of op(B)'s plain copy
  try {
    const dnnl::engine& eng = cpu_engine();
    const dnnl::memory::desc a({M, K}, dt::bf16, dnnl::memory::dims{a_row, a_col});
    const dnnl::memory::desc plain({K, N}, dt::bf16, dnnl::memory::dims{br, bc});
    const dnnl::memory::desc any({K, N}, dt::bf16, dnnl::memory::format_tag::any);
    const dnnl::memory::desc c({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, any, c), matmul_attr(alpha, beta), eng);
    const dnnl::memory::desc want = pd.weights_desc();
    if (want == plain) return false;
    dnnl::stream st(eng);
    Bf16Weights::State::Packed* p = nullptr;
    for (auto& q : w.packed)
      if (q.data == B && q.rows == b_rows && q.cols == b_cols && q.ld == ldb && q.trans == trans_b && q.desc == want)
        p = &q;
    if (p == nullptr) {
      Bf16Weights::State::Packed q;
      q.data = B, q.rows = b_rows, q.cols = b_cols, q.ld = ldb, q.trans = trans_b, q.desc = want;
      q.bytes = std::max<size_t>((want.get_size() + 63) / 64 * 64, 64);
      q.buf = w.take(q.bytes);
      const int64_t padK = (K + 31) / 32 * 32, padN = (N + 63) / 64 * 64;
      if (is_16a64b2a(want, K, N) && static_cast<size_t>(padK * padN) * sizeof(uint16_t) <= q.bytes) {
        // rounded and laid out in one pass (kernels::TrainIsa::pack_bf16_blocks), B's rows split
        // between the threads in blocks
        const kernels::TrainIsa k = kernels::train_isa(active_isa());
        const int64_t blocks = trans_b ? padN / 64 : padK / 32;
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (blocks > 1 && K * N >= (int64_t{1} << 15))
        for (int64_t b = 0; b < blocks; ++b) k.pack_bf16_blocks(B, ldb, trans_b, K, N, padK, q.buf.get(), b, b + 1);
      } else {
        // any other layout: B rounded into the plain scratch copy, then reordered by oneDNN
        uint16_t* copy = g_b_scratch.get(b_rows * b_ld);
        round_rows_bf16(B, b_rows, b_cols, ldb, copy, b_ld);
        dnnl::memory from(plain, eng, copy), to(want, eng, q.buf.get());
        dnnl::reorder(from, to).execute(st, from, to);
        st.wait();
      }
      w.packed.push_back(std::move(q));
      p = &w.packed.back();
    }
    const dnnl::matmul mm(pd);
    dnnl::memory ma(a, eng, const_cast<uint16_t*>(A)), mb(want, eng, p->buf.get()), mc(c, eng, C);
    mm.execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    st.wait();
  } catch (const dnnl::error& e) {
    fail("gemm_bf16: oneDNN's matmul failed (", e.what(), ", status ", static_cast<int>(e.status), ") for M=", M,
         " N=", N, " K=", K, " with a weight in its preferred layout");
  }
  return true;
}

}  // namespace

bool Bf16Unchanged::round_with_column_sums(int64_t rows, int64_t cols, int64_t ld, float* col_sum) const {
  if (g_bf16 == 0 || g_unchanged != data_ || rows <= 0 || cols <= 0) return false;
  check(ld >= cols, "Bf16Unchanged: row stride ", ld, " < ", cols, " columns");
  const int64_t out_ld = a_copy_ld(bf16_gemm_native(), cols);
  uint16_t* a16 = g_a_scratch.get(rows * out_ld);
  // the same column sums as ops::detail::column_sums, in the rounding's pass
  const int threads = rows * cols >= (int64_t{1} << 15) ? num_threads() : 1;
  kernels::column_sums(data_, rows, cols, ld, col_sum, true, a16, out_ld, threads);
  g_rounded_a = {data_, rows, cols, ld, out_ld};
  return true;
}

// sgemm under Bf16Matmul: A and B rounded to bfloat16 as stored (packed copies, kept per thread
// for the next call), then multiplied on bf16 dot products (native), or widened back to float32
// for the float32 product.
void sgemm_bf16(bool native, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check(M >= 0 && N >= 0 && K >= 0, "sgemm (bf16): negative size M=", M, " N=", N, " K=", K);
  check(!native || bf16_gemm_native(), "sgemm (bf16): this CPU has no bfloat16 dot-product instructions");
  if (M == 0 || N == 0) return;
  // A is stored (M, K), or transposed (K, M); B (K, N), or transposed (N, K)
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  // The copies' rows start 64 bytes apart for the native product: oneDNN's bf16 matmul slows down
  // on rows that do not (measured on Zen 4, 2 threads: GPT-2's output-layer weight gradient,
  // 50,257 x 768 x 1,024 with the 50,257 columns of dY as its rows, ran at 290 GFLOP/s with
  // 50,257-element rows and at 420 with rows padded to 50,272; the input gradient 365 against 420).
  const int64_t a_ld = a_copy_ld(native, a_cols), b_ld = a_copy_ld(native, b_cols);
  uint16_t* a16 = g_a_scratch.get(a_rows * a_ld);
  const RoundedKey a_key{A, a_rows, a_cols, lda, a_ld};
  if (!(A == g_unchanged && g_rounded_a == a_key)) {
    round_rows_bf16(A, a_rows, a_cols, lda, a16, a_ld);
    g_rounded_a = A == g_unchanged ? a_key : RoundedKey{};
  }
  // B: a weight's copy kept for the step (Bf16Weights), or rounded for this product
  const bool weight = g_weights != nullptr && g_weights->covers(B, b_rows, b_cols, ldb);
  // element strides of the (M, K) view of A's copy
  const int64_t ar = trans_a ? 1 : a_ld, ac = trans_a ? a_ld : 1;
  if (native && K > 0 && weight &&
      bf16_matmul_weight(M, N, K, alpha, a16, ar, ac, B, b_rows, b_cols, ldb, trans_b, b_ld, beta, C, ldc,
                         *g_weights))
    return;
  const uint16_t* b16 = nullptr;
  if (weight) {
    b16 = g_weights->copy_of(B, b_rows, b_cols, ldb, b_ld);
  } else {
    uint16_t* copy = g_b_scratch.get(b_rows * b_ld);
    round_rows_bf16(B, b_rows, b_cols, ldb, copy, b_ld);
    b16 = copy;
  }
  if (native && K > 0) {
    // element strides of the (K, N) view of B's copy
    const int64_t br = trans_b ? 1 : b_ld, bc = trans_b ? b_ld : 1;
    bf16_matmul(M, N, K, alpha, a16, ar, ac, b16, br, bc, beta, C, ldc);
    return;
  }
  thread_local Scratch<float> a_wide, b_wide;
  const int64_t na = a_rows * a_cols, nb = b_rows * b_cols;
  float* a32 = a_wide.get(na);
  float* b32 = b_wide.get(nb);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (na >= (int64_t{1} << 15))
  for (int64_t i = 0; i < na; ++i) a32[i] = kernels::bf16_to_f32(a16[i]);
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (nb >= (int64_t{1} << 15))
  for (int64_t i = 0; i < nb; ++i) b32[i] = kernels::bf16_to_f32(b16[i]);
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, a32, a_cols, b32,
                                      b_cols, beta, C, ldc);
  check(st == dnnl_success, "sgemm (bf16): oneDNN's dnnl_sgemm failed (status ", static_cast<int>(st), ") for M=", M,
        " N=", N, " K=", K);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check(M >= 0 && N >= 0 && K >= 0, "sgemm: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  if (g_batch_invariant > 0 && !trans_a && trans_b && M <= kInvariantMaxRows) {
    // C[:, j0:j1] for fixed blocks of columns, each block by one thread (kernels::dot_rows)
    const kernels::TrainIsa k = kernels::train_isa(active_isa());
    const int64_t blocks = (N + kInvariantColumns - 1) / kInvariantColumns;
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (blocks > 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t j0 = blk * kInvariantColumns, j1 = std::min(N, j0 + kInvariantColumns);
      k.dot_rows(A, lda, M, B, ldb, j0, j1, K, alpha, beta, C, ldc);
    }
    return;
  }
  if (g_bf16 > 0) {
    sgemm_bf16(bf16_gemm_native(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (M == 1 && !trans_a && trans_b && K > 0) {
    // One row against the rows of B (a decoding step's linear layers and output layer): each
    // element a dot product of two contiguous rows, B read once from front to back, in blocks of
    // 16 rows split evenly between the threads. The sums are those of the batch-invariant path
    // above (kernels::dot_rows), whatever the threads. Measured on Zen 4 (2 threads, weights read
    // from memory): 1.3-1.5x the bandwidth OpenBLAS's sgemv reached on decoding's shapes.
    const kernels::TrainIsa k = kernels::train_isa(active_isa());
    constexpr int64_t kRows = 16;
    const int64_t blocks = (N + kRows - 1) / kRows;
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (blocks > 1 && N * K >= (int64_t{1} << 14))
    for (int64_t blk = 0; blk < blocks; ++blk)
      k.dot_rows(A, lda, 1, B, ldb, blk * kRows, std::min(N, (blk + 1) * kRows), K, alpha, beta, C, ldc);
    return;
  }
  if (M == 1 && K > 0) {
    // One row (a decoding step): y = op(B)^T a as a matrix-vector product, which streams B once
    // instead of packing it first as sgemm does. a's elements are A[k * lda] when A is
    // transposed (stored K x 1), else A[k].
    //   C (1, N) = alpha a (1, K) op(B) (K, N) + beta C
    //   trans_b: B is (N, K), so C^T = B a ;  else B is (K, N), so C^T = B^T a
    cblas_sgemv(CblasRowMajor, trans_b ? CblasNoTrans : CblasTrans, static_cast<blasint>(trans_b ? N : K),
                static_cast<blasint>(trans_b ? K : N), alpha, B, static_cast<blasint>(ldb), A,
                static_cast<blasint>(trans_a ? lda : 1), beta, C, 1);
    return;
  }
  // Row-major, as the arguments here; sizes and strides are 64-bit (dnnl_dim_t).
  const dnnl_status_t st =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  check(st == dnnl_success, "sgemm: oneDNN's dnnl_sgemm failed (status ", static_cast<int>(st), ") for M=", M,
        " N=", N, " K=", K, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

bool bf16_gemm_native() {
  static const bool native = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return native;
}

bool bf16_gemm_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("QKV_BF16_GEMM");
    return bf16_gemm_native() && !(env && std::strcmp(env, "0") == 0);
  }();
  return enabled;
}

void gemm_bf16_nt(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                  float* C, int64_t ldc) {
  check(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size M=", M, " N=", N, " K=", K);
  check(lda >= K && ldb >= K && ldc >= N, "gemm_bf16: row strides lda=", lda, " ldb=", ldb, " ldc=", ldc,
        " below K=", K, " / N=", N);
  check(bf16_gemm_native(), "gemm_bf16: this CPU has no bfloat16 dot-product instructions (AVX512_BF16 or AMX)");
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  // A (M, K) with row stride lda; B^T as a (K, N) view of B (N, K)
  bf16_matmul(M, N, K, 1.0f, A, lda, 1, B, 1, ldb, 0.0f, C, ldc);
}

std::string blas_fallback_advice(const std::string& c, bool cpu_avx2, bool cpu_avx512) {
  // OpenBLAS kernels that use neither AVX2 nor AVX-512.
  static const char* const kOld[] = {"Prescott", "Core2",   "Penryn",     "Nehalem", "Dunnington",
                                     "Atom",     "Barcelona", "Opteron",  "Bulldozer", "Sandybridge",
                                     "Katmai",   "Coppermine", "Northwood", "Banias"};
  bool old = false;
  for (const char* k : kOld) old |= c == k;
  if (!old) return "";
  if (cpu_avx512) return "OPENBLAS_CORETYPE=SkylakeX";
  if (cpu_avx2) return "OPENBLAS_CORETYPE=Haswell";
  return "";
}

BlasInfo blas_info() {
  BlasInfo info;
  const dnnl_version_t* v = dnnl_version();
  info.gemm = detail::concat("oneDNN ", v->major, ".", v->minor, ".", v->patch);
  info.library = openblas_get_config();
  info.corename = openblas_get_corename();
  switch (openblas_get_parallel()) {
    case 0: info.threading = "sequential"; break;
    case 1: info.threading = "pthreads"; break;
    default: info.threading = "openmp"; break;
  }
  info.advice = blas_fallback_advice(info.corename, cpu_supports(Isa::AVX2), cpu_supports(Isa::AVX512));
  info.generic_fallback = !info.advice.empty();
  return info;
}

}  // namespace qkv
