// Low-precision weights: bfloat16, float16, and GGUF's Q8_0 and Q4_0 blocks (docs/formats.md,
// "Weight types"); their conversions, GGUF's quantisers, and the matrix-vector product that
// decoding at batch 1 spends its time in, with its reference twin.
//
// A quantised matrix is stored row by row, each row K / 32 blocks laid out exactly as in a GGUF
// file, so a file's tensor data is used as it is:
//   Q8_0: { f16 d; int8 q[32] }    w_j = d * q_j                      34 bytes per 32 weights
//   Q4_0: { f16 d; u8 q[16] }      w_j = d * ((q_j & 15) - 8),        18 bytes per 32 weights
//                                  w_{j+16} = d * ((q_j >> 4) - 8)
// Products with Q8_0 and Q4_0 weights quantise the activation row once, per block of 32, to
// int8 with a float scale (d = max |x| / 127, q = x / d rounded to nearest even), and sum each
// block's products exactly in integers; each block's sum is scaled by d_w * d_x in float. The
// reference twin quantises the activations the same way, dequantises the weights, and sums in
// float64: the kernel's only departure from it is float32 rounding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "qkv/cpu.h"
#include "qkv/quant.h"

namespace qkv::kernels {

using qkv::WType;
using qkv::wtype_name;

constexpr int64_t kQBlock = 32;  // weights per Q8_0 / Q4_0 block

struct BlockQ8_0 {
  uint16_t d;  // float16 scale
  int8_t q[kQBlock];
};
struct BlockQ4_0 {
  uint16_t d;                 // float16 scale
  uint8_t q[kQBlock / 2];     // element j in the low nibble of byte j, element j + 16 in its high nibble
};
static_assert(sizeof(BlockQ8_0) == 34 && alignof(BlockQ8_0) == 2, "GGUF's Q8_0 block is 34 bytes");
static_assert(sizeof(BlockQ4_0) == 18 && alignof(BlockQ4_0) == 2, "GGUF's Q4_0 block is 18 bytes");

// GGUF's K-quant super-blocks of 256 weights, as llama.cpp's files hold them. qkv dequantises
// them (and packs the result to Q8_0 when loading a file): sub-blocks of 32 with 6-bit scales and
// mins (Q4_K: w = d sc q - dmin m, q 4 bits; Q5_K: q 5 bits), or of 16 with int8 scales (Q6_K:
// w = d sc (q - 32), q 6 bits).
constexpr int64_t kKBlock = 256;
struct BlockQ4_K {
  uint16_t d, dmin;     // float16 super-block scales of the scales and of the mins
  uint8_t scales[12];   // 8 scales and 8 mins, 6 bits each
  uint8_t qs[128];      // 4-bit values: for each 64, 32 low nibbles then 32 high nibbles
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];       // the fifth bit: bit j/32 of byte j%32 for value j
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];      // low 4 bits
  uint8_t qh[64];       // high 2 bits
  int8_t scales[16];    // one per 16 values
  uint16_t d;           // float16 super-block scale
};
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210,
              "GGUF's K-quant blocks are 144, 176 and 210 bytes");
// K weights (a multiple of 256) from their blocks (a scale that is not finite gives weights that
// are not, which the packing that follows refuses).
void dequantize_q4_k(const void* row, int64_t K, float* out);
void dequantize_q5_k(const void* row, int64_t K, float* out);
void dequantize_q6_k(const void* row, int64_t K, float* out);

// Bytes of one row of K weights; K must be a multiple of 32 for Q8_0 and Q4_0 (checked).
size_t row_bytes(WType t, int64_t K);

// IEEE binary16 and bfloat16 <-> float. To the narrow type: round to nearest even, overflow to
// infinity, NaN stays NaN (quiet). From it: exact.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
void f32_to_bf16_n(const float* x, uint16_t* out, int64_t n);  // f32_to_bf16 on each of n values

// One row of K floats to type t (GGUF's rules for Q8_0: d = max|x| / 127, q = round(x / d), half
// away from zero; Q4_0: m = the element of largest magnitude, d = m / -8, q = min(15, trunc(x / d
// + 8.5))), and back.
void quantize_row(WType t, const float* x, int64_t K, void* out);
void dequantize_row(WType t, const void* row, int64_t K, float* out);
// The index of the first weight of a packed row that is not finite (a float16 that overflowed, a
// block whose scale is infinite or NaN: its first weight), or -1.
int64_t first_nonfinite(WType t, const void* row, int64_t K);

// The activations of an int8 product: per block of 32, d = max|x| / 127 and q = x / d rounded to
// nearest even (q = 0 when the block is all zero, or its largest magnitude so small, below
// 127 / FLT_MAX, that 127 / max|x| overflows); a block holding NaN or infinity gets d = NaN,
// so that its products are NaN, never a number. K must be a multiple of 32.
void quantize_activations(const float* x, int64_t K, float* d, int8_t* q);

// c[i] = -8 (q[32 i] + ... + q[32 i + 31]) for each block i of quantised activations: what the
// Q4_0 products add back for the nibbles' offset of 8 (their unsigned nibbles 0..15 are the
// unsigned operand of the byte products as they are; simd/lowp.h).
void q4_block_corrections(const int8_t* q, int64_t nb, int32_t* c);

// Q4_0 matrices in memory ("grouped"): the products of decoding read 16 rows at once, so each
// whole group of 16 rows (rows 16 g .. 16 g + 15) is held as K / 32 group blocks of 16 x 18 =
// 288 bytes, block i being
//   the 16 rows' float16 scales d (32 bytes), then for c = 0..3 the 16 rows' bytes q[4c .. 4c+3]
//   (64 bytes: row r's four at 4 r),
// so that one 64-byte load holds four bytes of every row, the activations' matching bytes are one
// broadcast, and every int32 lane of a byte product belongs to one row. The rows after the last
// whole group (N % 16 of them) stay as files hold them. The matrix keeps its size, and files (GGUF,
// qkv's safetensors) keep GGUF's row layout: loading groups the rows, writing ungroups them.
constexpr int64_t kQ4Group = 16;
constexpr size_t kQ4GroupBlock = kQ4Group * sizeof(BlockQ4_0);  // 288
// N rows of K weights as files hold them -> grouped, in place (parallel over the groups).
void q4_0_group_rows(uint8_t* W, int64_t N, int64_t K);
// Row r of a grouped matrix of N rows, as files hold it (row_bytes(Q4_0, K) bytes).
void q4_0_file_row(const uint8_t* W, int64_t N, int64_t K, int64_t r, uint8_t* out);

// y[n] = W[n, :] . x for n < N: W is N rows of row_bytes(t, K) bytes (Q4_0: grouped, above; a
// part of a grouped matrix starts at a multiple of 16 rows and ends at a multiple of 16 or at the
// matrix's end). A Q4_0 row sums each block's products exactly in int32, P_i, and takes the
// blocks in order, acc = fma(d_w,i * d_x,i, P_i, acc) from 0, on every ISA. Each y[n] is summed by
// one thread in an order fixed by K (the rows are split across threads in fixed chunks): the
// result depends on neither the thread count nor which other rows are computed. `workspace`
// holds the quantised activations: gemv_workspace_bytes(t, K) bytes (0 for float types).
size_t gemv_workspace_bytes(WType t, int64_t K);
void gemv(WType t, const void* W, int64_t N, int64_t K, const float* x, float* y, void* workspace, int threads);
// Several matrices of one type and width K against the same x (decoding's q, k and v): y_p[n] =
// W_p[n, :] . x for each part, every y_p[n] bitwise what gemv gives, from one quantisation of x
// and one parallel region over all parts' rows.
struct GemvPart {
  const void* W;  // N rows of row_bytes(t, K) bytes
  int64_t N;
  float* y;       // (N)
};
void gemv_parts(WType t, const GemvPart* parts, int64_t n_parts, int64_t K, const float* x, void* workspace,
                int threads);
// The twin: weights dequantised, activations quantised as gemv does (for Q8_0 / Q4_0), float64.
// W as gemv takes it (Q4_0 grouped).
void gemv_reference(WType t, const void* W, int64_t N, int64_t K, const float* x, double* y);

// The per-ISA row products (quant_isa.cpp). xd, xq: the quantised activations (nb blocks).
#define QKV_DECLARE_QUANT_ISA(ns)                                                                  \
  namespace ns {                                                                                   \
  void rows_q4_0(const uint8_t* W, size_t rb, int64_t n, const float* xd, const int8_t* xq,        \
                 const int32_t* corr, int64_t nb, float* y, bool vnni);                            \
  void rows_q8_0(const uint8_t* W, size_t rb, int64_t n, const float* xd, const int8_t* xq,        \
                 const int32_t* corr, int64_t nb, float* y, bool vnni);                            \
  float dot_f16(const uint16_t* w, const float* x, int64_t K);                                     \
  float dot_bf16(const uint16_t* w, const uint16_t* xb, int64_t K, bool dp);                      \
  void round_bf16(const float* x, uint16_t* out, int64_t n);                                       \
  void quantize_blocks(const float* x, int64_t nb, float* d, int8_t* q);                           \
  void q4_0_group_bf16(const uint8_t* g, int64_t nb, uint16_t* out, int64_t ldo);                 \
  }
QKV_DECLARE_QUANT_ISA(generic)
QKV_DECLARE_QUANT_ISA(avx2)
QKV_DECLARE_QUANT_ISA(avx512)
QKV_DECLARE_QUANT_ISA(w16avx2)
#undef QKV_DECLARE_QUANT_ISA

struct QuantIsa {
  // n rows of Q4_0 / Q8_0 at once (Q4_0: a group of 16 grouped, or n < 16 rows as files hold them,
  // with the activations' block corrections, q4_block_corrections)
  void (*rows_q4_0)(const uint8_t*, size_t, int64_t, const float*, const int8_t*, const int32_t*, int64_t, float*,
                    bool);
  void (*rows_q8_0)(const uint8_t*, size_t, int64_t, const float*, const int8_t*, const int32_t*, int64_t, float*,
                    bool);
  float (*dot_f16)(const uint16_t*, const float*, int64_t);
  // a bf16 row against the activations rounded to bf16 (dp: AVX512_BF16's vdpbf16ps)
  float (*dot_bf16)(const uint16_t*, const uint16_t*, int64_t, bool);
  void (*round_bf16)(const float*, uint16_t*, int64_t);  // f32_to_bf16_n, compiled for the ISA
  // quantize_activations over nb blocks, bit for bit (vectorised on AVX-512)
  void (*quantize_blocks)(const float*, int64_t, float*, int8_t*);
  // a group of 16 grouped Q4_0 rows dequantised and rounded to bf16, row r to out + r * ldo
  // (dequantize_row, then f32_to_bf16_n, bit for bit)
  void (*q4_0_group_bf16)(const uint8_t*, int64_t, uint16_t*, int64_t);
  bool vnni;  // the int8 products use AVX512_VNNI's vpdpbusd (else vpmaddubsw + vpmaddwd)
  bool bf16dp = false;  // the bf16 products use AVX512_BF16's vdpbf16ps (else both widened, fma)
};

// The table for `isa` (the test-only w16avx2 too); `vnni` where the CPU has AVX512_VNNI and the
// ISA is AVX-512, unless QKV_VNNI=0.
QuantIsa quant_isa(Isa isa);
QuantIsa quant_isa_w16avx2();
bool cpu_has_avx512_vnni();
bool cpu_has_avx512_bf16();  // unless QKV_BF16_DOT=0

// gemv and gemv_parts with the given table (the tests run every ISA this CPU has).
void gemv_with(const QuantIsa& k, WType t, const void* W, int64_t N, int64_t K, const float* x, float* y,
               void* workspace, int threads);
void gemv_parts_with(const QuantIsa& k, WType t, const GemvPart* parts, int64_t n_parts, int64_t K, const float* x,
                     void* workspace, int threads);

}  // namespace qkv::kernels
