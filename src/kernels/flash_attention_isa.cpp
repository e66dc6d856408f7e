// The tiled attention kernel body. This file is compiled once per ISA (QKV_ISA names the
// namespace, QKV_VEC_WIDTH the vector width W); flash_attention.cpp picks one at run time.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/flash_attention.h"
#include "kernels/simd/vec.h"

namespace qkv::kernels::QKV_ISA {
namespace {

using simd::vf;
using simd::W;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Tile GEMM: C (M, N) (+)= A (M, K) B (K, N), row-major, N a multiple of W, B readable in whole
// vectors. A register-blocked micro-kernel of MR rows x NV vectors, the accumulators held in
// registers across the K loop.
constexpr int NV = 2;
constexpr int NR = NV * W;
constexpr int MR = W == 16 ? 12 : 6;

template <int M, int NVEC, bool kAccumulate>
void ukernel(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
  vf c[M][NVEC];
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) c[r][v] = kAccumulate ? simd::load(C + r * ldc + v * W) : vf{};
  for (int64_t k = 0; k < K; ++k) {
    vf b[NVEC];
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) b[v] = simd::load(B + k * ldb + v * W);
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      const vf a = simd::set1(A[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) c[r][v] = simd::fma(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) simd::store(C + r * ldc + v * W, c[r][v]);
}

using UkernelFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t);

// fn[accumulate][rows - 1][vectors - 1]
template <int... Ms>
struct UkernelTable {
  UkernelFn fn[2][sizeof...(Ms)][NV];
  constexpr UkernelTable()
      : fn{{{&ukernel<Ms + 1, 1, false>, &ukernel<Ms + 1, 2, false>}...},
           {{&ukernel<Ms + 1, 1, true>, &ukernel<Ms + 1, 2, true>}...}} {}
};
template <size_t... I>
constexpr auto make_table(std::index_sequence<I...>) {
  return UkernelTable<static_cast<int>(I)...>{};
}
constexpr auto kUkernels = make_table(std::make_index_sequence<MR>{});
static_assert(NV == 2, "the micro-kernel table is written for two vectors per row");

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
          int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < N; j += NR) {
    const int nv = N - j >= NR ? NV : static_cast<int>((N - j) / W);
    for (int64_t i = 0; i < M; i += MR) {
      const int m = static_cast<int>(std::min<int64_t>(MR, M - i));
      kUkernels.fn[accumulate][m - 1][nv - 1](K, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bfloat16 tile products (AttnInputs::bf16), compiled where vectors are AVX-512's: C (M, N) (+)=
// A (M, K) B (K, N) with both operands rounded to bfloat16 (nearest even, NaN kept, denormals
// flushed to zero; see the staging below) and their products summed in float32 by vdpbf16ps, two
// terms of K per instruction and lane. Each call stages its operands in the thread's buffers: A's rows as
// bf16 pairs along K, B as pairs along K (row 2p and 2p+1 interleaved, VNNI order), K padded with
// a zero to an even count. Staging is O(MK + KN) against the product's O(MKN) and re-rounds a
// value each time a tile is used; every tile of the same operand is rounded to the same bits.
// The sum over K goes pair by pair from the tile's first index, so a tile starting at an even
// index sums every output element the same way however the surrounding tiles are cut (the
// backward pass's two strategies rely on this, see flash_backward).
struct Tiles {
  bool bf16 = false;
  uint16_t* a = nullptr;  // A staged: M rows of 2 * ceil(K / 2) bf16
  uint32_t* b = nullptr;  // B staged: ceil(K / 2) rows of N pairs
};
// Operands staged before the call, in the layouts above but with their own row strides: a
// (a_ld bf16 per row) for A, b (b_ld pairs per row) for B; null: the call stages it. The callers
// stage an operand once for all the tiles that read it (a head's K, V, dO, scaled Q; a query
// block's scaled Q) and pass a view whose pairs hold exactly the bits the call's own staging would
// (the same values, pairs starting at the same index, the same zero past K), so the products do not
// change by a bit.
struct Staged {
  const uint16_t* a = nullptr;
  int64_t a_ld = 0;
  const uint32_t* b = nullptr;
  int64_t b_ld = 0;
};

#if defined(__AVX512F__) && QKV_VEC_WIDTH == 16
#define QKV_FLASH_BF16 1
// GCC 12's AVX-512 headers build results on _mm512_undefined_*(), which -Wuninitialized reports
// at every call site (a known false positive of the headers; as in simd/lowp.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define QKV_BF16_TARGET __attribute__((target("avx512bf16,avx512bw,avx512f")))

// Staging converts with AVX512_BF16's own instructions (vcvtneps2bf16, vcvtne2ps2bf16): nearest
// even, NaN kept (quiet), and denormal inputs and results flushed to zero, which changes nothing
// in the products since vdpbf16ps reads denormal bf16 inputs as zero too.

// out (M, 2 Kp) <- bf16(A (M, K)), zero past K.
QKV_BF16_TARGET void stage_rows_bf16(const float* A, int64_t lda, int64_t M, int64_t K, int64_t Kp, uint16_t* out) {
  for (int64_t r = 0; r < M; ++r) {
    const float* a = A + r * lda;
    uint16_t* o = out + r * 2 * Kp;
    int64_t c = 0;
    for (; c + 16 <= K; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(a + c))));
    if (c < 2 * Kp) {  // the tail and the zero that pads K to even
      const __mmask16 in = static_cast<__mmask16>((1u << (K - c)) - 1), all = static_cast<__mmask16>((1u << (2 * Kp - c)) - 1);
      _mm256_mask_storeu_epi16(o + c, all, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(in, a + c))));
    }
  }
}

// out (Kp, N) pairs <- (bf16(B[2p][n]), bf16(B[2p + 1][n])); N a multiple of 16; B[K][n] = 0.
QKV_BF16_TARGET void stage_pairs_bf16(const float* B, int64_t ldb, int64_t K, int64_t N, uint32_t* out) {
  // vcvtne2ps2bf16 puts row 2p's 16 values in the low 16 halves and row 2p+1's in the high ones:
  // interleave them, (0, 16), (1, 17), ...
  alignas(64) static constexpr int16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t k = 0; k < K; k += 2) {
    const float* r0 = B + k * ldb;
    uint32_t* o = out + k / 2 * N;
    for (int64_t n = 0; n < N; n += 16) {
      const __m512 hi = k + 1 < K ? _mm512_loadu_ps(r0 + ldb + n) : _mm512_setzero_ps();
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, _mm512_loadu_ps(r0 + n)));
      _mm512_storeu_si512(o + n, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

template <int M, int NVEC, bool kAccumulate>
QKV_BF16_TARGET void ukernel_bf16(int64_t Kp, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb, float* C,
                                  int64_t ldc) {
  __m512 c[M][NVEC];
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) c[r][v] = kAccumulate ? _mm512_loadu_ps(C + r * ldc + v * 16) : _mm512_setzero_ps();
  for (int64_t k = 0; k < Kp; ++k) {
    __m512bh b[NVEC];
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) b[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(B + k * ldb + v * 16));
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      uint32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * k, sizeof pair);
      __m512i a32 = _mm512_set1_epi32(static_cast<int>(pair));
#if defined(__clang__)
      // clang 16 crashes when it folds this broadcast into vdpbf16ps ({1to16}): keep it a register
      __asm__("" : "+v"(a32));
#endif
      const __m512bh a = reinterpret_cast<__m512bh>(a32);
#pragma GCC unroll 4
      for (int v = 0; v < NVEC; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NVEC; ++v) _mm512_storeu_ps(C + r * ldc + v * 16, c[r][v]);
}

using UkernelBf16Fn = void (*)(int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t, float*, int64_t);
template <int... Ms>
struct UkernelBf16Table {
  UkernelBf16Fn fn[2][sizeof...(Ms)][NV];
  constexpr UkernelBf16Table()
      : fn{{{&ukernel_bf16<Ms + 1, 1, false>, &ukernel_bf16<Ms + 1, 2, false>}...},
           {{&ukernel_bf16<Ms + 1, 1, true>, &ukernel_bf16<Ms + 1, 2, true>}...}} {}
};
template <size_t... I>
constexpr auto make_table_bf16(std::index_sequence<I...>) {
  return UkernelBf16Table<static_cast<int>(I)...>{};
}
constexpr auto kUkernelsBf16 = make_table_bf16(std::make_index_sequence<MR>{});

void gemm_bf16(const Tiles& t, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, float* C, int64_t ldc, bool accumulate, const Staged& pre) {
  const int64_t Kp = (K + 1) / 2;
  const uint16_t* a = pre.a;
  int64_t a_ld = pre.a_ld;
  if (a == nullptr) {
    stage_rows_bf16(A, lda, M, K, Kp, t.a);
    a = t.a;
    a_ld = 2 * Kp;
  }
  const uint32_t* b = pre.b;
  int64_t b_ld = pre.b_ld;
  if (b == nullptr) {
    stage_pairs_bf16(B, ldb, K, N, t.b);
    b = t.b;
    b_ld = N;
  }
  for (int64_t j = 0; j < N; j += NR) {
    const int nv = N - j >= NR ? NV : static_cast<int>((N - j) / W);
    for (int64_t i = 0; i < M; i += MR) {
      const int m = static_cast<int>(std::min<int64_t>(MR, M - i));
      kUkernelsBf16.fn[accumulate][m - 1][nv - 1](Kp, a + i * a_ld, a_ld, b + j, b_ld, C + i * ldc + j, ldc);
    }
  }
}
#pragma GCC diagnostic pop
#endif

// A tile product in float32, or in bfloat16 where the call asked for it (flash_forward refuses
// that request on an ISA without the bf16 kernel, so it never reaches here without one).
inline void tile_gemm(const Tiles& t, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                      int64_t ldb, float* C, int64_t ldc, bool accumulate, const Staged& pre = {}) {
#if defined(QKV_FLASH_BF16)
  if (t.bf16) return gemm_bf16(t, M, N, K, A, lda, B, ldb, C, ldc, accumulate, pre);
#endif
  (void)pre;
  gemm(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

// ---------------------------------------------------------------------------------------------
// Workspace layout: computed in one place for both the size query and the kernel.
constexpr int64_t Bq = 48;  // queries per block (a multiple of W and of MR)
constexpr int64_t Bk = 96;  // keys per block (a multiple of W and of MR; 64 and 48 measured slower)
static_assert(Bq % W == 0 && Bk % W == 0 && Bq % MR == 0 && Bk % MR == 0, "block sizes");

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Layout {
  int64_t Dk_pad, Dv_pad, Tq_pad, Tk_pad, nqb, nkb;
  // byte offsets; SIZE_MAX = not used by this pass
  size_t qs_rows = 0, qs_t = 0, k_rows = 0, k_t = 0, v_rows = 0, v_t = 0, do_rows = 0, do_t = 0, drow = 0,
         lse_eff = 0, qrange = 0, vbad = 0;
  size_t thread_base = 0, thread_stride = 0, total = 0;
  // per-thread float offsets (in floats from the thread's base)
  size_t t_s = 0, t_dp = 0, t_acc = 0, t_acc2 = 0, t_m = 0, t_l = 0, t_q = 0, t_row = 0;
  // Forward packs only K^T globally: each query block is scaled into the thread's slice, and
  // V is read in place when its rows are whole vectors (Dv % W == 0; the op guarantees a
  // contiguous last dimension). Backward packs everything.
  bool pack_q_rows = false, pack_v_rows = false;
  bool track_vbad = false;  // forward: count non-finite V rows (see pack_forward)
  // Backward in one pass, one task per (b, kv-head), when there are enough of those tasks to
  // keep every thread busy; else two passes (see flash_backward). Both give the same bits.
  bool one_pass = false;
  bool backward = false;
  size_t t_dk = 0, t_dv = 0, t_dqt = 0;
  size_t t_bf_a = 0, t_bf_b = 0;  // bf16 staging (Tiles): up to R rows or pairs of R
  // bf16: operands staged once (Staged), byte offsets. Rows layouts hold 2 * ceil(K / 2) bf16 per
  // row, pairs layouts ceil(K / 2) rows of pairs. Forward: K^T's pairs along Dk (kt_bf; Dk_pad / 2
  // rows of Tk_pad), V's pairs along keys (v_bf; ceil(Tk / 2) rows of Dv_pad), and per thread a
  // query block's scaled Q (t_bf_q). Backward: K's and V's rows (krows_bf, vrows_bf), K^T's rows
  // (ktrows_bf; Dk rows of Tk_pad), scaled Q^T's and dO^T's pairs along D (qst_bf, dot_bf), scaled
  // Q's and dO's pairs along queries (qsrows_bf, dorows_bf).
  size_t kt_bf = 0, v_bf = 0, krows_bf = 0, vrows_bf = 0, ktrows_bf = 0, qst_bf = 0, dot_bf = 0, dorows_bf = 0,
         qsrows_bf = 0;
  size_t t_bf_q = 0;
  int64_t Kp_k = 0, Kp_v = 0, Tq_pairs = 0, Tk_pairs = 0;

  Layout(const AttnShape& s, int threads, bool for_backward, bool bf16) : backward(for_backward) {
    Dk_pad = round_up(std::max<int64_t>(s.Dk, 1), W);
    Dv_pad = round_up(std::max<int64_t>(s.Dv, 1), W);
    Tq_pad = round_up(std::max<int64_t>(s.Tq, 1), W);
    Tk_pad = round_up(std::max<int64_t>(s.Tk, 1), W) + W;
    nqb = (s.Tq + Bq - 1) / Bq;
    nkb = (s.Tk + Bk - 1) / Bk;
    const size_t BH = s.B * s.H, BHkv = s.B * s.Hkv;
    size_t at = 0;
    auto take = [&](size_t floats) {
      size_t off = at;
      at += round_up(static_cast<int64_t>(floats * sizeof(float)), 64);
      return off;
    };
    one_pass = backward && s.B * s.Hkv >= 2 * static_cast<int64_t>(std::max(threads, 1));
    pack_q_rows = backward;
    pack_v_rows = backward || s.Dv % W != 0;
    if (pack_q_rows) qs_rows = take(BH * s.Tq * Dk_pad);
    k_t = take(BHkv * Dk_pad * Tk_pad);
    if (pack_v_rows) v_rows = take(BHkv * s.Tk * Dv_pad);
    track_vbad = !backward;
    if (track_vbad) vbad = take(BHkv * (s.Tk + 1));  // int32 prefix counts of non-finite V rows
    if (backward) {
      qs_t = take(BH * Dk_pad * Tq_pad);
      k_rows = take(BHkv * s.Tk * Dk_pad);
      if (!one_pass) v_t = take(BHkv * Dv_pad * Tk_pad);
      do_rows = take(BH * s.Tq * Dv_pad);
      do_t = take(BH * Dv_pad * Tq_pad);
      drow = take(BH * Tq_pad);
      lse_eff = take(BH * Tq_pad);
      qrange = take(s.B * nqb * 2 * (sizeof(int64_t) / sizeof(float)));
    }
    Kp_k = (s.Dk + 1) / 2;
    Kp_v = (s.Dv + 1) / 2;
    Tq_pairs = (s.Tq + 1) / 2;
    Tk_pairs = (s.Tk + 1) / 2;
    if (bf16 && !backward) {  // sizes in floats: a pair is one float's size, two bf16 are one
      kt_bf = take(BHkv * (Dk_pad / 2) * Tk_pad);
      v_bf = take(BHkv * Tk_pairs * Dv_pad);
    }
    if (bf16 && backward) {
      krows_bf = take(BHkv * s.Tk * Kp_k);
      vrows_bf = take(BHkv * s.Tk * Kp_v);
      if (one_pass) ktrows_bf = take(BHkv * s.Dk * (Tk_pad / 2));
      qst_bf = take(BH * Kp_k * Tq_pad);
      dot_bf = take(BH * Kp_v * Tq_pad);
      qsrows_bf = take(BH * Tq_pairs * Dk_pad);
      dorows_bf = take(BH * Tq_pairs * Dv_pad);
    }
    thread_base = at;
    size_t t = 0;
    auto take_t = [&](size_t floats) {
      size_t off = t;
      t += round_up(static_cast<int64_t>(floats), 16);  // 64-byte aligned
      return off;
    };
    if (!backward) {
      t_s = take_t(Bq * Bk);
      t_acc = take_t(Bq * Dv_pad);
      t_m = take_t(Bq);
      t_l = take_t(Bq);
      t_q = take_t(Bq * Dk_pad);
      t_row = take_t(std::max<int64_t>(s.Tk, 1));
      if (bf16) t_bf_q = take_t(Bq * Kp_k);
    } else {
      // pass 1 uses (Bk x Bq) tiles and (Bk x D) accumulators; pass 2 (Bq x Bk) and (Bq x Dk).
      t_s = take_t(Bq * Bk);
      t_dp = take_t(Bq * Bk);
      t_acc = take_t(Bk * std::max(Dk_pad, Dv_pad));
      t_acc2 = take_t(Bk * Dv_pad);
      if (one_pass) {  // a whole head's dK, dV, and a query block's dQ^T
        t_dk = take_t(std::max<int64_t>(s.Tk, 1) * Dk_pad);
        t_dv = take_t(std::max<int64_t>(s.Tk, 1) * Dv_pad);
        t_dqt = take_t(Dk_pad * Bq);
      }
    }
    if (bf16) {  // every tile product's M, N and K are at most R (K padded to even: R is)
      const int64_t R = std::max({Bq, Bk, Dk_pad, Dv_pad});
      t_bf_a = take_t(R * R / 2);
      t_bf_b = take_t(R * R / 2);
    }
    thread_stride = t * sizeof(float);
    total = thread_base + thread_stride * static_cast<size_t>(std::max(threads, 1));
  }
};

template <class T>
T* at(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

// The thread's staging for bf16 tile products (unused in float32).
Tiles tiles_of(const AttnInputs<float>& in, const Layout& L, float* tws) {
  Tiles t;
  t.bf16 = in.bf16;
  if (in.bf16) {
    t.a = reinterpret_cast<uint16_t*>(tws + L.t_bf_a);
    t.b = reinterpret_cast<uint32_t*>(tws + L.t_bf_b);
  }
  return t;
}

inline int64_t key_limit(const AttnShape& s, const MaskParams& m, int64_t b) {
  return m.key_len ? std::clamp<int64_t>(m.key_len[b], 0, s.Tk) : s.Tk;
}

// dst (rows, ld) <- scale * src rows (rows, cols) with row stride src_ld; zero padding.
// finite_only: NaN and inf become 0. Used for K as the right operand of dQ <- dS K, where a
// blocked key (dS = 0) must contribute nothing even if its row holds NaN; a NaN in an allowed
// key still reaches dQ through dS, since it made that row's lse NaN.
void pack_rows(const float* src, int64_t src_ld, int64_t rows, int64_t valid_rows, int64_t cols, float scale,
               float* dst, int64_t ld, bool finite_only = false) {
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * ld;
    if (r < valid_rows) {
      const float* sp = src + r * src_ld;
      for (int64_t c = 0; c < cols; ++c) d[c] = sp[c] * scale;
      if (finite_only)
        for (int64_t c = 0; c < cols; ++c) d[c] = std::isfinite(d[c]) ? d[c] : 0.0f;
      std::fill(d + cols, d + ld, 0.0f);
    } else {
      std::fill(d, d + ld, 0.0f);
    }
  }
}

// dst (cols_pad, ld) <- (scale * src (valid_rows, cols))^T; everything else in dst is zero.
void pack_transposed(const float* src, int64_t src_ld, int64_t valid_rows, int64_t cols,
                     int64_t cols_pad, float scale, float* dst, int64_t ld, bool finite_only = false) {
  // zero only what the transpose below does not write: padding columns and padding rows
  for (int64_t c = 0; c < cols; ++c) std::fill(dst + c * ld + valid_rows, dst + (c + 1) * ld, 0.0f);
  std::fill(dst + cols * ld, dst + cols_pad * ld, 0.0f);
  // W source rows at a time: W x W blocks loaded as W row vectors and transposed in registers,
  // each result a contiguous run of a row of dst; the columns past the last whole block gathered
  // one column of the W rows at a time (whole-vector writes either way).
  const vf vscale = simd::set1(scale);
  int64_t r0 = 0;
  for (; r0 + W <= valid_rows; r0 += W) {
    const float* sp = src + r0 * src_ld;
    int64_t c0 = 0;
    for (; c0 + W <= cols; c0 += W) {
      vf x[W];
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i) x[i] = simd::load(sp + i * src_ld + c0);
      simd::transpose(x);
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i) {
        vf y = x[i] * vscale;
        if (finite_only) y = y - y == vf{} ? y : vf{};
        simd::store(dst + (c0 + i) * ld + r0, y);
      }
    }
    for (int64_t c = c0; c < cols; ++c) {
      vf x;
      for (int i = 0; i < W; ++i) x[i] = sp[i * src_ld + c];
      x = x * vscale;
      if (finite_only) x = x - x == vf{} ? x : vf{};  // x - x is 0 exactly when x is finite
      simd::store(dst + c * ld + r0, x);
    }
  }
  for (int64_t r = r0; r < valid_rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float x = src[r * src_ld + c] * scale;
      dst[c * ld + r] = finite_only && !std::isfinite(x) ? 0.0f : x;
    }
}

// score <- score + bias, where a blocked pair (bias -inf) becomes -inf even if its score was
// NaN or inf (a blocked key's contents must not matter).
inline void add_bias(float& score, float bias) { score = bias == kNegInf ? kNegInf : score + bias; }

// Scores tile S (rows, nc) for query rows i0.. and keys k0..: block what the masks block, add
// the elementwise bias, and set the padding columns c >= nk to -inf. Returns nothing; `full`
// tiles (every pair allowed, no bias) only need the padding columns.
void mask_tile(const AttnInputs<float>& in, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t k0, int64_t nk,
               int64_t nc, const KeyRange* range, float* S, int64_t ld) {
  bool full = !in.m.elementwise();
  for (int64_t r = 0; r < rows && full; ++r) full = range[r].lo <= k0 && range[r].hi >= k0 + nk;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = S + r * ld;
    if (!full) {
      const int64_t i = i0 + r;
      const int64_t p = query_pos(in.s, in.m, i);
      const int64_t lo = std::clamp<int64_t>(range[r].lo - k0, 0, nk);
      const int64_t hi = std::clamp<int64_t>(range[r].hi - k0, lo, nk);
      for (int64_t c = 0; c < lo; ++c) row[c] = kNegInf;
      if (in.m.elementwise())
        for (int64_t c = lo; c < hi; ++c) add_bias(row[c], elementwise_bias<float>(in.m, b, h, i, k0 + c, p));
      for (int64_t c = hi; c < nk; ++c) row[c] = kNegInf;
    }
    for (int64_t c = nk; c < nc; ++c) row[c] = kNegInf;
  }
}

// The same for a transposed tile St (nk rows of keys, columns = query rows).
void mask_tile_t(const AttnInputs<float>& in, int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t k0, int64_t nk,
                 const KeyRange* range, float* St, int64_t ld) {
  bool full = !in.m.elementwise();
  for (int64_t r = 0; r < mq && full; ++r) full = range[r].lo <= k0 && range[r].hi >= k0 + nk;
  if (full) return;  // padding columns (query rows >= mq) are zeroed through lse_eff = +inf
  for (int64_t r = 0; r < mq; ++r) {
    const int64_t i = i0 + r;
    const int64_t p = query_pos(in.s, in.m, i);
    for (int64_t c = 0; c < nk; ++c) {
      const int64_t j = k0 + c;
      float& x = St[c * ld + r];
      if (j < range[r].lo || j >= range[r].hi)
        x = kNegInf;
      else if (in.m.elementwise())
        add_bias(x, elementwise_bias<float>(in.m, b, h, i, j, p));
    }
  }
}

void query_ranges(const AttnInputs<float>& in, int64_t b, int64_t i0, int64_t mq, KeyRange* range, int64_t* lo,
                  int64_t* hi) {
  *lo = in.s.Tk;
  *hi = 0;
  for (int64_t r = 0; r < mq; ++r) {
    range[r] = key_range(in.s, in.m, b, i0 + r);
    if (range[r].lo < range[r].hi) {
      *lo = std::min(*lo, range[r].lo);
      *hi = std::max(*hi, range[r].hi);
    }
  }
  if (*hi <= *lo) *lo = *hi = 0;
}

// Pack what the forward pass reads (also used by backward). Runs inside a parallel region.
void pack_forward(const AttnInputs<float>& in, const Layout& L, void* ws) {
  const AttnShape& s = in.s;
  const float scale = static_cast<float>(in.scale);
  if (L.pack_q_rows) {
#pragma omp for schedule(static) nowait
    for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      // Qs <- scale * Q   (rows padded to Dk_pad)
      pack_rows(in.q + b * in.qs.b + h * in.qs.h, in.qs.t, s.Tq, s.Tq, s.Dk, scale,
                at<float>(ws, L.qs_rows) + bh * s.Tq * L.Dk_pad, L.Dk_pad);
    }
  }
#pragma omp for schedule(static)
  for (int64_t bk = 0; bk < s.B * s.Hkv; ++bk) {
    const int64_t b = bk / s.Hkv, hk = bk % s.Hkv;
    const int64_t kl = key_limit(s, in.m, b);  // keys past a row's length are never read
    const float* k = in.k + b * in.ks.b + hk * in.ks.h;
    const float* v = in.v + b * in.vs.b + hk * in.vs.h;
    // Backward also multiplies K^T by dS^T (one pass): sanitise as for k_rows below.
    pack_transposed(k, in.ks.t, kl, s.Dk, L.Dk_pad, 1.0f, at<float>(ws, L.k_t) + bk * L.Dk_pad * L.Tk_pad,
                    L.Tk_pad, /*finite_only=*/L.backward);
    // Backward multiplies V by probabilities that are 0 for blocked keys: a non-finite V row
    // must not turn those zeros into NaN (an allowed one still poisons its rows through D).
    if (L.pack_v_rows)
      pack_rows(v, in.vs.t, s.Tk, kl, s.Dv, 1.0f, at<float>(ws, L.v_rows) + bk * s.Tk * L.Dv_pad, L.Dv_pad,
                /*finite_only=*/!L.track_vbad);
#if defined(QKV_FLASH_BF16)
    if (in.bf16 && !L.backward) {
      // K^T's pairs along Dk and V's pairs along keys, staged once for every query block
      stage_pairs_bf16(at<float>(ws, L.k_t) + bk * L.Dk_pad * L.Tk_pad, L.Tk_pad, s.Dk, L.Tk_pad,
                       at<uint32_t>(ws, L.kt_bf) + bk * (L.Dk_pad / 2) * L.Tk_pad);
      const float* vr = L.pack_v_rows ? at<float>(ws, L.v_rows) + bk * s.Tk * L.Dv_pad : v;
      stage_pairs_bf16(vr, L.pack_v_rows ? L.Dv_pad : in.vs.t, kl, L.Dv_pad,
                       at<uint32_t>(ws, L.v_bf) + bk * L.Tk_pairs * L.Dv_pad);
    }
#endif
    if (L.track_vbad) {
      // vbad[j] <- number of keys before j whose V row holds NaN or inf (forward re-does, the
      // plain way, any block whose keys include one, so that 0 * NaN from a blocked key never
      // reaches an output, exactly as in the reference).
      int32_t* cnt = at<int32_t>(ws, L.vbad) + bk * (s.Tk + 1);
      cnt[0] = 0;
      for (int64_t j = 0; j < s.Tk; ++j) {
        bool bad = false;
        if (j < kl) {
          // x - x is +0 for a finite x and NaN otherwise: the row's sum of them is 0 exactly
          // when every value is finite (W lanes at a time; a scalar isfinite loop was a tenth
          // of a bf16 forward pass)
          const float* row = v + j * in.vs.t;
          vf z = vf{};
          int64_t d = 0;
          for (; d + W <= s.Dv; d += W) {
            const vf x = simd::load(row + d);
            z += x - x;
          }
          float zs = simd::hsum(z);
          for (; d < s.Dv; ++d) zs += row[d] - row[d];
          bad = zs != 0.0f;
        }
        cnt[j + 1] = cnt[j] + (bad ? 1 : 0);
      }
    }
  }
}

// x[c] <- exp(x[c] - m) for c < n (a multiple of W); returns their sum (lane-wise, then hsum).
inline float exp_shifted(float* x, int64_t n, float m) {
  const vf vm = simd::set1(m);
  vf vsum = vf{};
  for (int64_t c = 0; c < n; c += W) {
    const vf p = simd::exp(simd::load(x + c) - vm);
    simd::store(x + c, p);
    vsum += p;
  }
  return simd::hsum(vsum);
}

// One query row the plain way (scores in `buf`, Tk floats), reading only the values of keys
// with non-zero weight. Used for blocks whose keys include a non-finite V row.
void row_plain(const AttnInputs<float>& in, int64_t b, int64_t h, int64_t i, float* buf, float* out, float* lse) {
  const AttnShape& s = in.s;
  const int64_t hk = h / (s.H / s.Hkv);
  const float* q = in.q + b * in.qs.b + h * in.qs.h + i * in.qs.t;
  const float* k = in.k + b * in.ks.b + hk * in.ks.h;
  const float* v = in.v + b * in.vs.b + hk * in.vs.h;
  const KeyRange r = key_range(s, in.m, b, i);
  const int64_t p = query_pos(s, in.m, i);
  float mx = kNegInf;
  for (int64_t j = r.lo; j < r.hi; ++j) {
    const float bias = in.m.elementwise() ? elementwise_bias<float>(in.m, b, h, i, j, p) : 0.0f;
    float dot = 0;
    if (bias != kNegInf)
      for (int64_t d = 0; d < s.Dk; ++d) dot += q[d] * k[j * in.ks.t + d];
    buf[j] = bias == kNegInf ? kNegInf : dot * static_cast<float>(in.scale) + bias;
    if (buf[j] > mx) mx = buf[j];
  }
  const float m_use = mx == kNegInf ? 0.0f : mx;
  float sum = 0;
  for (int64_t j = r.lo; j < r.hi; ++j) sum += buf[j] = buf[j] == kNegInf ? 0.0f : std::exp(buf[j] - m_use);
  std::fill(out, out + s.Dv, 0.0f);
  if (sum == 0.0f) {
    *lse = kNegInf;
    return;
  }
  for (int64_t j = r.lo; j < r.hi; ++j)
    if (buf[j] != 0.0f)
      for (int64_t d = 0; d < s.Dv; ++d) out[d] += buf[j] / sum * v[j * in.vs.t + d];
  *lse = m_use + std::log(sum);
}

// One block of Bq query rows of one (b, h), all of its keys.
void forward_block(const AttnInputs<float>& in, const Layout& L, void* ws, float* tws, int64_t b, int64_t h,
                   int64_t qb, float* out, float* lse) {
  const AttnShape& s = in.s;
  const int64_t bh = b * s.H + h, bk = b * s.Hkv + h / (s.H / s.Hkv);
  const int64_t i0 = qb * Bq, mq = std::min(Bq, s.Tq - i0);
  float* S = tws + L.t_s;      // (Bq, Bk) scores, then probabilities
  float* O = tws + L.t_acc;    // (Bq, Dv_pad) unnormalised output
  float* m = tws + L.t_m;      // (Bq) running max
  float* l = tws + L.t_l;      // (Bq) running sum
  KeyRange range[Bq];
  int64_t blo, bhi;
  query_ranges(in, b, i0, mq, range, &blo, &bhi);

  // Qs <- scale * Q for this block
  float* qs = tws + L.t_q;
  pack_rows(in.q + b * in.qs.b + h * in.qs.h + i0 * in.qs.t, in.qs.t, mq, mq, s.Dk, static_cast<float>(in.scale), qs,
            L.Dk_pad);
  const float* kt = at<float>(ws, L.k_t) + bk * L.Dk_pad * L.Tk_pad;
  const int64_t hk = h / (s.H / s.Hkv);
  const float* vr = L.pack_v_rows ? at<float>(ws, L.v_rows) + bk * s.Tk * L.Dv_pad : in.v + b * in.vs.b + hk * in.vs.h;
  const int64_t ldv = L.pack_v_rows ? L.Dv_pad : in.vs.t;
  std::fill(m, m + mq, kNegInf);
  std::fill(l, l + mq, 0.0f);
  std::fill(O, O + mq * L.Dv_pad, 0.0f);
  const Tiles tl = tiles_of(in, L, tws);
  // bf16: this block's Qs staged once for all its key blocks; K^T and V were staged by pack_forward
  Staged qk, pv;
#if defined(QKV_FLASH_BF16)
  if (in.bf16) {
    uint16_t* q16 = reinterpret_cast<uint16_t*>(tws + L.t_bf_q);
    stage_rows_bf16(qs, L.Dk_pad, mq, s.Dk, L.Kp_k, q16);
    qk.a = q16;
    qk.a_ld = 2 * L.Kp_k;
    qk.b_ld = L.Tk_pad;
    pv.b_ld = L.Dv_pad;
  }
#endif
  const uint32_t* kt_bf = at<uint32_t>(ws, L.kt_bf) + bk * (L.Dk_pad / 2) * L.Tk_pad;
  const uint32_t* v_bf = at<uint32_t>(ws, L.v_bf) + bk * L.Tk_pairs * L.Dv_pad;

  for (int64_t k0 = blo; k0 < bhi; k0 += Bk) {
    const int64_t nk = std::min(Bk, bhi - k0), nc = round_up(nk, W);
    // S <- Qs K^T   (the scale is already in Qs)
    if (in.bf16) qk.b = kt_bf + k0;
    tile_gemm(tl, mq, nc, s.Dk, qs, L.Dk_pad, kt + k0, L.Tk_pad, S, Bk, false, qk);
    mask_tile(in, b, h, i0, mq, k0, nk, nc, range, S, Bk);
    for (int64_t r = 0; r < mq; ++r) {
      float* row = S + r * Bk;
      // m_new <- max(m_old, rowmax S)
      vf vmx = simd::set1(kNegInf);
      for (int64_t c = 0; c < nc; c += W) vmx = simd::vmax(vmx, simd::load(row + c));
      const float m_new = std::max(m[r], simd::hmax(vmx));
      const float m_use = m_new == kNegInf ? 0.0f : m_new;  // a row blocked so far stays all zero
      // P <- exp(S - m_new);  l <- l * exp(m_old - m_new) + rowsum P
      const float rowsum = exp_shifted(row, nc, m_use);
      const float alpha = std::exp(m[r] - m_use);
      l[r] = l[r] * alpha + rowsum;
      m[r] = m_new;
      // O <- O * exp(m_old - m_new)
      if (alpha != 1.0f) {
        const vf va = simd::set1(alpha);
        float* o = O + r * L.Dv_pad;
        for (int64_t c = 0; c < L.Dv_pad; c += W) simd::store(o + c, simd::load(o + c) * va);
      }
    }
    // O <- O + P V   (V's staged pairs start at even keys: a tile at an odd key or with an odd
    // count, whose pairs or padding differ, stages its own)
    pv.b = in.bf16 && k0 % 2 == 0 && nk % 2 == 0 ? v_bf + k0 / 2 * L.Dv_pad : nullptr;
    tile_gemm(tl, mq, L.Dv_pad, nk, S, Bk, vr + k0 * ldv, ldv, O, L.Dv_pad, true, pv);
  }
  // out <- O / l ;  lse <- m + log(l). l = 0 exactly when every score was -inf (no allowed
  // key): zeros and -inf. A NaN score makes l NaN, and NaN propagates.
  for (int64_t r = 0; r < mq; ++r) {
    float* o = out + (bh * s.Tq + i0 + r) * s.Dv;
    if (l[r] == 0.0f) {
      std::fill(o, o + s.Dv, 0.0f);
      lse[bh * s.Tq + i0 + r] = kNegInf;
    } else {
      const float inv = 1.0f / l[r];
      for (int64_t d = 0; d < s.Dv; ++d) o[d] = O[r * L.Dv_pad + d] * inv;
      lse[bh * s.Tq + i0 + r] = (m[r] == kNegInf ? 0.0f : m[r]) + std::log(l[r]);
    }
  }
  const int32_t* vbad = at<int32_t>(ws, L.vbad) + bk * (s.Tk + 1);
  if (bhi > blo && vbad[bhi] != vbad[blo])
    for (int64_t r = 0; r < mq; ++r)
      row_plain(in, b, h, i0 + r, tws + L.t_row, out + (bh * s.Tq + i0 + r) * s.Dv, lse + bh * s.Tq + i0 + r);
}

// The packed operands of the backward pass.
struct BackwardBuffers {
  const float *qs_rows, *qs_t, *k_rows, *k_t, *v_rows, *v_t, *do_rows, *do_t, *drow, *lse_eff;
  // bf16: the same operands staged once (Layout's *_bf; null in float32)
  const uint16_t *krows_bf, *vrows_bf, *ktrows_bf;
  const uint32_t *qst_bf, *dot_bf, *qsrows_bf, *dorows_bf;
};

// One tile of backward in transposed form: keys k0 .. k0+nk of (b, kv-head bk) against query
// block qb of head h. Adds the tile's contributions to dKacc (nk, Dk_pad) and dVacc (nk, Dv_pad)
// and leaves dS^T (nk, Bq) in St.
void backward_tile_t(const AttnInputs<float>& in, const Layout& L, const BackwardBuffers& bb, const Tiles& tl,
                     int64_t b, int64_t h, int64_t bk, int64_t k0, int64_t nk, int64_t qb, float* St, float* dPt,
                     float* dKacc, float* dVacc) {
  const AttnShape& s = in.s;
  const int64_t bh = b * s.H + h;
  const int64_t i0 = qb * Bq, mq = std::min(Bq, s.Tq - i0), mqp = round_up(mq, W);
  const float* kr = bb.k_rows + (bk * s.Tk + k0) * L.Dk_pad;
  const float* vr = bb.v_rows + (bk * s.Tk + k0) * L.Dv_pad;
  KeyRange range[Bq];
  int64_t lo_, hi_;
  query_ranges(in, b, i0, mq, range, &lo_, &hi_);
  // bf16: every operand but the tile's own P^T and dS^T comes staged (i0 is even: the pairs along
  // queries start where the call's own would, and an odd count only ends at Tq, past which the
  // staged pairs hold the same zero)
  Staged s1, s2, s3, s4;
  if (in.bf16) {
    s1 = {bb.krows_bf + (bk * s.Tk + k0) * 2 * L.Kp_k, 2 * L.Kp_k, bb.qst_bf + bh * L.Kp_k * L.Tq_pad + i0, L.Tq_pad};
    s2 = {nullptr, 0, bb.dorows_bf + (bh * L.Tq_pairs + i0 / 2) * L.Dv_pad, L.Dv_pad};
    s3 = {bb.vrows_bf + (bk * s.Tk + k0) * 2 * L.Kp_v, 2 * L.Kp_v, bb.dot_bf + bh * L.Kp_v * L.Tq_pad + i0, L.Tq_pad};
    s4 = {nullptr, 0, bb.qsrows_bf + (bh * L.Tq_pairs + i0 / 2) * L.Dk_pad, L.Dk_pad};
  }
  // S^T <- K Qs^T
  tile_gemm(tl, nk, mqp, s.Dk, kr, L.Dk_pad, bb.qs_t + bh * L.Dk_pad * L.Tq_pad + i0, L.Tq_pad, St, Bq, false, s1);
  mask_tile_t(in, b, h, i0, mq, k0, nk, range, St, Bq);
  // P^T <- exp(S^T - lse)
  const float* le = bb.lse_eff + bh * L.Tq_pad + i0;
  for (int64_t c = 0; c < nk; ++c)
    for (int64_t r = 0; r < mqp; r += W)
      simd::store(St + c * Bq + r, simd::exp(simd::load(St + c * Bq + r) - simd::load(le + r)));
  // dV <- dV + P^T dO
  tile_gemm(tl, nk, L.Dv_pad, mq, St, Bq, bb.do_rows + (bh * s.Tq + i0) * L.Dv_pad, L.Dv_pad, dVacc, L.Dv_pad, true,
            s2);
  // dP^T <- V dO^T
  tile_gemm(tl, nk, mqp, s.Dv, vr, L.Dv_pad, bb.do_t + bh * L.Dv_pad * L.Tq_pad + i0, L.Tq_pad, dPt, Bq, false, s3);
  // dS^T <- P^T * (dP^T - D)
  const float* Dr = bb.drow + bh * L.Tq_pad + i0;
  for (int64_t c = 0; c < nk; ++c)
    for (int64_t r = 0; r < mqp; r += W)
      simd::store(St + c * Bq + r, simd::load(St + c * Bq + r) * (simd::load(dPt + c * Bq + r) - simd::load(Dr + r)));
  // dK <- dK + dS^T Qs    (Qs carries the scale)
  tile_gemm(tl, nk, L.Dk_pad, mq, St, Bq, bb.qs_rows + (bh * s.Tq + i0) * L.Dk_pad, L.Dk_pad, dKacc, L.Dk_pad, true,
            s4);
}

// ---------------------------------------------------------------------------------------------
// Decoding: one query row per (b, h), as a key/value-cache step has (Tq = 1). Nothing is packed:
// the scores read K's rows in place (a dot product along Dk each), one softmax over the row,
// then the weighted sum of V's rows, skipping every key whose weight is exactly 0, as row_plain
// does, so a blocked key's non-finite V row never reaches the output. The tiled path would
// transpose all of K and scan all of V for non-finite rows at every step.
struct DecodeLayout {
  int64_t Dk_pad, Dv_pad, Tk_pad;
  size_t stride;  // floats per thread: scaled q, scores, the output accumulator
  explicit DecodeLayout(const AttnShape& s)
      : Dk_pad(round_up(std::max<int64_t>(s.Dk, 1), W)),
        Dv_pad(round_up(std::max<int64_t>(s.Dv, 1), W)),
        Tk_pad(round_up(std::max<int64_t>(s.Tk, 1), W)),
        stride(static_cast<size_t>(Dk_pad + Tk_pad + Dv_pad)) {}
  size_t total(int threads) const { return stride * sizeof(float) * static_cast<size_t>(std::max(threads, 1)); }
};

// S[j] <- qs . k_j for n rows of k (row stride ldk); Dk = NK * W: q stays in registers.
template <int NK>
void decode_scores(const float* qs, const float* k, int64_t ldk, int64_t n, float* S) {
  vf q[NK];
  for (int c = 0; c < NK; ++c) q[c] = simd::load(qs + c * W);
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = k + j * ldk;
    vf a = q[0] * simd::load(kr);
    for (int c = 1; c < NK; ++c) a = simd::fma(q[c], simd::load(kr + c * W), a);
    S[j] = simd::hsum(a);
  }
}

// Any Dk: whole vectors, then the tail.
void decode_scores_any(const float* qs, const float* k, int64_t ldk, int64_t n, int64_t Dk, float* S) {
  const int64_t dk_vec = Dk / W * W;
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = k + j * ldk;
    vf a = vf{};
    for (int64_t d = 0; d < dk_vec; d += W) a = simd::fma(simd::load(qs + d), simd::load(kr + d), a);
    float dot = simd::hsum(a);
    for (int64_t d = dk_vec; d < Dk; ++d) dot += qs[d] * kr[d];
    S[j] = dot;
  }
}

// acc (Dv = NV * W) <- sum_j w_j v_j over the keys of non-zero weight, in registers.
template <int NV>
void decode_values(const float* w, const float* v, int64_t ldv, int64_t n, float* acc) {
  vf o[NV];
  for (int c = 0; c < NV; ++c) o[c] = vf{};
  for (int64_t j = 0; j < n; ++j) {
    if (w[j] == 0.0f) continue;
    const vf vw = simd::set1(w[j]);
    const float* vr = v + j * ldv;
    for (int c = 0; c < NV; ++c) o[c] = simd::fma(vw, simd::load(vr + c * W), o[c]);
  }
  for (int c = 0; c < NV; ++c) simd::store(acc + c * W, o[c]);
}

void decode_values_any(const float* w, const float* v, int64_t ldv, int64_t n, int64_t Dv, float* acc) {
  const int64_t dv_vec = Dv / W * W;
  std::fill(acc, acc + Dv, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    if (w[j] == 0.0f) continue;
    const float* vr = v + j * ldv;
    const vf vw = simd::set1(w[j]);
    for (int64_t d = 0; d < dv_vec; d += W)
      simd::store(acc + d, simd::fma(vw, simd::load(vr + d), simd::load(acc + d)));
    for (int64_t d = dv_vec; d < Dv; ++d) acc[d] += w[j] * vr[d];
  }
}

// The register-resident variants cover head sizes of 1, 2, 4, 8 and 16 vectors.
template <class Fixed, class Any>
void by_vectors(int64_t D, Fixed fixed, Any any) {
  if (D % W == 0) switch (D / W) {
      case 1: return fixed(std::integral_constant<int, 1>{});
      case 2: return fixed(std::integral_constant<int, 2>{});
      case 4: return fixed(std::integral_constant<int, 4>{});
      case 8: return fixed(std::integral_constant<int, 8>{});
      case 16: return fixed(std::integral_constant<int, 16>{});
      default: break;
    }
  any();
}

void decode_row(const AttnInputs<float>& in, const DecodeLayout& L, float* tws, int64_t b, int64_t h, float* out,
                float* lse) {
  const AttnShape& s = in.s;
  const int64_t hk = h / (s.H / s.Hkv), bh = b * s.H + h;
  const float* q = in.q + b * in.qs.b + h * in.qs.h;
  const float* k = in.k + b * in.ks.b + hk * in.ks.h;
  const float* v = in.v + b * in.vs.b + hk * in.vs.h;
  const KeyRange r = key_range(s, in.m, b, 0);
  const int64_t p = query_pos(s, in.m, 0), n = r.hi - r.lo;
  float* qs = tws;             // (Dk_pad) scale * q, as the tiled path scales Q
  float* S = qs + L.Dk_pad;    // (Tk_pad) scores of keys lo .. hi, then weights
  float* acc = S + L.Tk_pad;   // (Dv_pad) unnormalised output
  const float scale = static_cast<float>(in.scale);
  for (int64_t d = 0; d < s.Dk; ++d) qs[d] = q[d] * scale;
  // S_j <- qs . k_j (+ bias_j; -inf where blocked: a blocked key's score is replaced, never added to)
  const float* k0 = k + r.lo * in.ks.t;
  by_vectors(
      s.Dk, [&](auto nk) { decode_scores<decltype(nk)::value>(qs, k0, in.ks.t, n, S); },
      [&] { decode_scores_any(qs, k0, in.ks.t, n, s.Dk, S); });
  if (in.m.elementwise())
    for (int64_t j = 0; j < n; ++j) {
      const float bias = elementwise_bias<float>(in.m, b, h, 0, r.lo + j, p);
      S[j] = bias == kNegInf ? kNegInf : S[j] + bias;
    }
  float mx = kNegInf;
  for (int64_t j = 0; j < n; ++j)
    if (S[j] > mx) mx = S[j];
  // w_j <- exp(S_j - max); l <- sum_j w_j. A row blocked everywhere has max -inf: all weights 0.
  const float m_use = mx == kNegInf ? 0.0f : mx;
  const int64_t n_pad = round_up(n, W);
  std::fill(S + n, S + n_pad, kNegInf);
  const float l = exp_shifted(S, n_pad, m_use);
  // acc <- sum_j w_j v_j over keys of non-zero weight (a NaN weight is not zero: it propagates)
  const float* v0 = v + r.lo * in.vs.t;
  by_vectors(
      s.Dv, [&](auto nv) { decode_values<decltype(nv)::value>(S, v0, in.vs.t, n, acc); },
      [&] { decode_values_any(S, v0, in.vs.t, n, s.Dv, acc); });
  // out <- acc / l ; lse <- max + log(l). l = 0 exactly when no key is allowed: zeros and -inf.
  float* o = out + bh * s.Dv;
  if (l == 0.0f) {
    std::fill(o, o + s.Dv, 0.0f);
    lse[bh] = kNegInf;
    return;
  }
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < s.Dv; ++d) o[d] = acc[d] * inv;
  lse[bh] = m_use + std::log(l);
}

void decode_forward(const AttnInputs<float>& in, float* out, float* lse, void* ws, int threads) {
  const AttnShape& s = in.s;
  const DecodeLayout L(s);
  const int64_t items = s.B * s.H;
  // A parallel region costs microseconds: worth it only for this much multiply-adding.
  const bool parallel = threads > 1 && items > 1 && items * s.Tk * (s.Dk + s.Dv) >= (int64_t{1} << 18);
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
  for (int64_t it = 0; it < items; ++it)
    decode_row(in, L, static_cast<float*>(ws) + L.stride * static_cast<size_t>(omp_get_thread_num()), it / s.H,
               it % s.H, out, lse);
}

}  // namespace

size_t flash_forward_workspace(const AttnShape& s, int threads, bool bf16) {
  if (s.Tq == 1) return DecodeLayout(s).total(threads);
  return Layout(s, threads, false, bf16).total;
}

void flash_forward(const AttnInputs<float>& in, float* out, float* lse, void* ws, int threads) {
  const AttnShape& s = in.s;
  if (s.Tq == 0 || s.B == 0 || s.H == 0) return;
  if (s.Tq == 1) return decode_forward(in, out, lse, ws, threads);
  const Layout L(s, threads, false, in.bf16);
  const int64_t items = s.B * s.H * L.nqb;
#pragma omp parallel num_threads(threads)
  {
    pack_forward(in, L, ws);
    float* tws = at<float>(ws, L.thread_base + L.thread_stride * omp_get_thread_num());
    // Largest blocks first (the last query blocks under a causal mask) to balance the threads.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qb = L.nqb - 1 - it % L.nqb, bh = it / L.nqb;
      forward_block(in, L, ws, tws, bh / s.H, bh % s.H, qb, out, lse);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward. With at least two (b, kv-head) tasks per thread: one pass, one task per (b, kv-head)
// that visits each tile once (5 tile GEMMs, 1 exponential). Otherwise two passes that keep every
// thread busy however few heads there are: pass 1 per (b, kv-head, key block), dK and dV over
// every query block of every head that shares the kv-head; pass 2 per (b, head, query block),
// dQ over its keys (7 tile GEMMs, 2 exponentials). No output element is ever written by two
// threads, and both strategies add the same products in the same order, so the result does
// not depend on the thread count.

size_t flash_backward_workspace(const AttnShape& s, int threads, bool bf16) {
  return Layout(s, threads, true, bf16).total;
}

void flash_backward(const AttnInputs<float>& in, const float* out, const float* dout, const float* lse, float* dq,
                    float* dk, float* dv, void* ws, int threads) {
  const AttnShape& s = in.s;
  const int64_t BH = s.B * s.H, BHkv = s.B * s.Hkv, group = s.H / std::max<int64_t>(s.Hkv, 1);
  // dK, dV and dQ start at zero, each thread zeroing slices of 64 KiB (a training step's
  // attention gradients are megabytes; zeroed on one thread, the others waited)
  {
    const int64_t nk = BHkv > 0 && s.Tk > 0 ? BHkv * s.Tk : 0, nq = BH * s.Tq;
    float* const parts[3] = {dk, dv, dq};
    const int64_t sizes[3] = {nk * s.Dk, nk * s.Dv, nq * s.Dk};
    constexpr int64_t kSlice = 16384;
    int64_t slices = 0;
    for (int64_t n : sizes) slices += (n + kSlice - 1) / kSlice;
#pragma omp parallel for num_threads(slices > 1 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < slices; ++t) {
      int64_t i = t;
      for (int part = 0; part < 3; ++part) {
        const int64_t here = (sizes[part] + kSlice - 1) / kSlice;
        if (i < here) {
          std::fill(parts[part] + i * kSlice, parts[part] + std::min(sizes[part], (i + 1) * kSlice), 0.0f);
          break;
        }
        i -= here;
      }
    }
  }
  if (BH == 0 || s.Tq == 0 || s.Tk == 0) return;
  const Layout L(s, threads, true, in.bf16);
  float* qs_rows = at<float>(ws, L.qs_rows);
  float* qs_t = at<float>(ws, L.qs_t);
  float* k_rows = at<float>(ws, L.k_rows);
  float* k_t = at<float>(ws, L.k_t);
  float* v_rows = at<float>(ws, L.v_rows);
  float* v_t = at<float>(ws, L.v_t);
  float* do_rows = at<float>(ws, L.do_rows);
  float* do_t = at<float>(ws, L.do_t);
  float* drow = at<float>(ws, L.drow);
  float* lse_eff = at<float>(ws, L.lse_eff);
  int64_t* qrange = at<int64_t>(ws, L.qrange);
  const float scale = static_cast<float>(in.scale);
  uint16_t* krows_bf = at<uint16_t>(ws, L.krows_bf);
  uint16_t* vrows_bf = at<uint16_t>(ws, L.vrows_bf);
  uint16_t* ktrows_bf = at<uint16_t>(ws, L.ktrows_bf);
  uint32_t* qst_bf = at<uint32_t>(ws, L.qst_bf);
  uint32_t* dot_bf = at<uint32_t>(ws, L.dot_bf);
  uint32_t* qsrows_bf = at<uint32_t>(ws, L.qsrows_bf);
  uint32_t* dorows_bf = at<uint32_t>(ws, L.dorows_bf);
  const BackwardBuffers bb{qs_rows, qs_t,     k_rows,    k_t,    v_rows,    v_t,      do_rows,  do_t,
                           drow,    lse_eff,  krows_bf,  vrows_bf, ktrows_bf, qst_bf, dot_bf, qsrows_bf,
                           dorows_bf};

#pragma omp parallel num_threads(threads)
  {
    pack_forward(in, L, ws);
#pragma omp for schedule(static) nowait
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      const float* q = in.q + b * in.qs.b + h * in.qs.h;
      const float* dO = dout + bh * s.Tq * s.Dv;
      const float* O = out + bh * s.Tq * s.Dv;
      pack_transposed(q, in.qs.t, s.Tq, s.Dk, L.Dk_pad, scale, qs_t + bh * L.Dk_pad * L.Tq_pad, L.Tq_pad);
      pack_rows(dO, s.Dv, s.Tq, s.Tq, s.Dv, 1.0f, do_rows + bh * s.Tq * L.Dv_pad, L.Dv_pad);
      pack_transposed(dO, s.Dv, s.Tq, s.Dv, L.Dv_pad, 1.0f, do_t + bh * L.Dv_pad * L.Tq_pad, L.Tq_pad);
      // D_i <- sum_d dO_id O_id ;  lse_eff <- lse, or +inf where no key is allowed / padding,
      // so that exp(s - lse_eff) is exactly 0 there.
      for (int64_t i = 0; i < L.Tq_pad; ++i) {
        double acc = 0;
        if (i < s.Tq)
          for (int64_t d = 0; d < s.Dv; ++d) acc += static_cast<double>(dO[i * s.Dv + d]) * O[i * s.Dv + d];
        drow[bh * L.Tq_pad + i] = static_cast<float>(acc);
        const float x = i < s.Tq ? lse[bh * s.Tq + i] : kNegInf;
        lse_eff[bh * L.Tq_pad + i] = x == kNegInf ? kPosInf : x;
      }
#if defined(QKV_FLASH_BF16)
      if (in.bf16) {  // (qs_rows was packed before pack_forward's barrier)
        stage_pairs_bf16(qs_t + bh * L.Dk_pad * L.Tq_pad, L.Tq_pad, s.Dk, L.Tq_pad, qst_bf + bh * L.Kp_k * L.Tq_pad);
        stage_pairs_bf16(do_t + bh * L.Dv_pad * L.Tq_pad, L.Tq_pad, s.Dv, L.Tq_pad, dot_bf + bh * L.Kp_v * L.Tq_pad);
        stage_pairs_bf16(qs_rows + bh * s.Tq * L.Dk_pad, L.Dk_pad, s.Tq, L.Dk_pad,
                         qsrows_bf + bh * L.Tq_pairs * L.Dk_pad);
        stage_pairs_bf16(do_rows + bh * s.Tq * L.Dv_pad, L.Dv_pad, s.Tq, L.Dv_pad,
                         dorows_bf + bh * L.Tq_pairs * L.Dv_pad);
      }
#endif
    }
#pragma omp for schedule(static) nowait
    for (int64_t bk = 0; bk < BHkv; ++bk) {
      const int64_t b = bk / s.Hkv, hk = bk % s.Hkv;
      const int64_t kl = key_limit(s, in.m, b);
      pack_rows(in.k + b * in.ks.b + hk * in.ks.h, in.ks.t, s.Tk, kl, s.Dk, 1.0f, k_rows + bk * s.Tk * L.Dk_pad,
                L.Dk_pad, /*finite_only=*/true);
      if (!L.one_pass)
        pack_transposed(in.v + b * in.vs.b + hk * in.vs.h, in.vs.t, kl, s.Dv, L.Dv_pad, 1.0f,
                        v_t + bk * L.Dv_pad * L.Tk_pad, L.Tk_pad, /*finite_only=*/true);
#if defined(QKV_FLASH_BF16)
      if (in.bf16) {  // (v_rows and k_t were packed before pack_forward's barrier)
        stage_rows_bf16(k_rows + bk * s.Tk * L.Dk_pad, L.Dk_pad, s.Tk, s.Dk, L.Kp_k, krows_bf + bk * s.Tk * 2 * L.Kp_k);
        stage_rows_bf16(v_rows + bk * s.Tk * L.Dv_pad, L.Dv_pad, s.Tk, s.Dv, L.Kp_v, vrows_bf + bk * s.Tk * 2 * L.Kp_v);
        // K^T's rows for dQ^T <- K^T dS^T: tiles start at even keys (multiples of Bk) and an odd
        // count ends at Tk, where K^T's padding holds the zero the call's own staging would add
        if (L.one_pass)
          stage_rows_bf16(k_t + bk * L.Dk_pad * L.Tk_pad, L.Tk_pad, s.Dk, L.Tk_pad, L.Tk_pad / 2,
                          ktrows_bf + bk * s.Dk * L.Tk_pad);
      }
#endif
    }
#pragma omp for schedule(static)
    for (int64_t bq = 0; bq < s.B * L.nqb; ++bq) {
      const int64_t b = bq / L.nqb, i0 = (bq % L.nqb) * Bq;
      KeyRange range[Bq];
      query_ranges(in, b, i0, std::min(Bq, s.Tq - i0), range, &qrange[2 * bq], &qrange[2 * bq + 1]);
    }

    float* tws = at<float>(ws, L.thread_base + L.thread_stride * omp_get_thread_num());
    const Tiles tl = tiles_of(in, L, tws);
    float* St = tws + L.t_s;    // (Bk, Bq) scores^T, then P^T, then dS^T
    float* dPt = tws + L.t_dp;  // (Bk, Bq)
    if (L.one_pass) {
      // ---- one pass per (b, kv-head): every tile once; dK, dV for the whole head and dQ^T
      // for one query block at a time. The same tiles, in the same order per output element,
      // as the two passes below: the same bits.
#pragma omp for schedule(dynamic, 1)
      for (int64_t bk = 0; bk < BHkv; ++bk) {
        const int64_t b = bk / s.Hkv, hk = bk % s.Hkv;
        float* dKall = tws + L.t_dk;  // (Tk, Dk_pad)
        float* dVall = tws + L.t_dv;  // (Tk, Dv_pad)
        float* dQt = tws + L.t_dqt;   // (Dk_pad, Bq)
        std::fill(dKall, dKall + s.Tk * L.Dk_pad, 0.0f);
        std::fill(dVall, dVall + s.Tk * L.Dv_pad, 0.0f);
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          const int64_t bh = b * s.H + h;
          for (int64_t qb = 0; qb < L.nqb; ++qb) {
            const int64_t qlo = qrange[2 * (b * L.nqb + qb)], qhi = qrange[2 * (b * L.nqb + qb) + 1];
            if (qhi <= qlo) continue;
            const int64_t i0 = qb * Bq, mq = std::min(Bq, s.Tq - i0), mqp = round_up(mq, W);
            std::fill(dQt, dQt + L.Dk_pad * Bq, 0.0f);
            for (int64_t k0 = qlo / Bk * Bk; k0 < qhi; k0 += Bk) {
              const int64_t nk = std::min(Bk, s.Tk - k0);
              backward_tile_t(in, L, bb, tl, b, h, bk, k0, nk, qb, St, dPt, dKall + k0 * L.Dk_pad, dVall + k0 * L.Dv_pad);
              // dQ^T <- dQ^T + K^T dS^T
              Staged s5;
              if (in.bf16) s5 = {ktrows_bf + bk * s.Dk * L.Tk_pad + k0, L.Tk_pad, nullptr, 0};
              tile_gemm(tl, s.Dk, mqp, nk, k_t + bk * L.Dk_pad * L.Tk_pad + k0, L.Tk_pad, St, Bq, dQt, Bq, true, s5);
            }
            // dq <- scale * dQ
            for (int64_t r = 0; r < mq; ++r)
              for (int64_t d = 0; d < s.Dk; ++d) dq[(bh * s.Tq + i0 + r) * s.Dk + d] = dQt[d * Bq + r] * scale;
          }
        }
        for (int64_t j = 0; j < s.Tk; ++j) {
          std::memcpy(dk + (bk * s.Tk + j) * s.Dk, dKall + j * L.Dk_pad, s.Dk * sizeof(float));
          std::memcpy(dv + (bk * s.Tk + j) * s.Dv, dVall + j * L.Dv_pad, s.Dv * sizeof(float));
        }
      }
    } else {
    // ---- pass 1: dK, dV
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < BHkv * L.nkb; ++it) {
      const int64_t bk = it / L.nkb, b = bk / s.Hkv, hk = bk % s.Hkv;
      const int64_t k0 = (it % L.nkb) * Bk, nk = std::min(Bk, s.Tk - k0);
      if (k0 >= key_limit(s, in.m, b)) continue;  // padding keys: zero gradient
      float* dKacc = tws + L.t_acc;  // (Bk, Dk_pad)
      float* dVacc = tws + L.t_acc2; // (Bk, Dv_pad)
      std::fill(dKacc, dKacc + nk * L.Dk_pad, 0.0f);
      std::fill(dVacc, dVacc + nk * L.Dv_pad, 0.0f);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t qb = 0; qb < L.nqb; ++qb) {
          const int64_t qlo = qrange[2 * (b * L.nqb + qb)], qhi = qrange[2 * (b * L.nqb + qb) + 1];
          if (qhi <= k0 || qlo >= k0 + nk) continue;
          backward_tile_t(in, L, bb, tl, b, h, bk, k0, nk, qb, St, dPt, dKacc, dVacc);
        }
      }
      for (int64_t c = 0; c < nk; ++c) {
        std::memcpy(dk + (bk * s.Tk + k0 + c) * s.Dk, dKacc + c * L.Dk_pad, s.Dk * sizeof(float));
        std::memcpy(dv + (bk * s.Tk + k0 + c) * s.Dv, dVacc + c * L.Dv_pad, s.Dv * sizeof(float));
      }
    }
    // ---- pass 2: dQ
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < BH * L.nqb; ++it) {
      const int64_t qb = L.nqb - 1 - it % L.nqb, bh = it / L.nqb, b = bh / s.H, h = bh % s.H;
      const int64_t bk = b * s.Hkv + h / group;
      const int64_t i0 = qb * Bq, mq = std::min(Bq, s.Tq - i0);
      float* S = tws + L.t_s;       // (Bq, Bk)
      float* dP = tws + L.t_dp;     // (Bq, Bk)
      float* dQacc = tws + L.t_acc; // (Bq, Dk_pad)
      std::fill(dQacc, dQacc + mq * L.Dk_pad, 0.0f);
      KeyRange range[Bq];
      int64_t blo, bhi;
      query_ranges(in, b, i0, mq, range, &blo, &bhi);
      const float* qs = qs_rows + (bh * s.Tq + i0) * L.Dk_pad;
      const float* dOr = do_rows + (bh * s.Tq + i0) * L.Dv_pad;
      // bf16 sums dQ's keys in pairs from each tile's first key: start at an even key, as the one
      // pass's tiles do (the keys before blo are blocked: their terms are zero).
      for (int64_t k0 = in.bf16 ? blo / 2 * 2 : blo; k0 < bhi; k0 += Bk) {
        const int64_t nk = std::min(Bk, bhi - k0), nc = round_up(nk, W);
        // S <- Qs K^T ;  P <- exp(S - lse)
        tile_gemm(tl, mq, nc, s.Dk, qs, L.Dk_pad, k_t + bk * L.Dk_pad * L.Tk_pad + k0, L.Tk_pad, S, Bk, false);
        mask_tile(in, b, h, i0, mq, k0, nk, nc, range, S, Bk);
        // dP <- dO V^T
        tile_gemm(tl, mq, nc, s.Dv, dOr, L.Dv_pad, v_t + bk * L.Dv_pad * L.Tk_pad + k0, L.Tk_pad, dP, Bk, false);
        // dS <- P * (dP - D)
        for (int64_t r = 0; r < mq; ++r) {
          const vf vl = simd::set1(lse_eff[bh * L.Tq_pad + i0 + r]);
          const vf vd = simd::set1(drow[bh * L.Tq_pad + i0 + r]);
          for (int64_t c = 0; c < nc; c += W) {
            const vf p = simd::exp(simd::load(S + r * Bk + c) - vl);
            simd::store(S + r * Bk + c, p * (simd::load(dP + r * Bk + c) - vd));
          }
        }
        // dQ <- dQ + dS K
        tile_gemm(tl, mq, L.Dk_pad, nk, S, Bk, k_rows + (bk * s.Tk + k0) * L.Dk_pad, L.Dk_pad, dQacc, L.Dk_pad, true);
      }
      // dq <- scale * dQ
      for (int64_t r = 0; r < mq; ++r)
        for (int64_t d = 0; d < s.Dk; ++d) dq[(bh * s.Tq + i0 + r) * s.Dk + d] = dQacc[r * L.Dk_pad + d] * scale;
    }
    }  // two passes
  }
}

}  // namespace qkv::kernels::QKV_ISA
