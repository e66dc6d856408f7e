// qkv/quant.h: weights kept in a lower precision for inference (docs/formats.md, "Weight types").
//
// A packed weight replaces a projection matrix's float32 values in the products that use it
// (ops::linear): bfloat16 and float16 rows are widened in registers, Q8_0 and Q4_0 (GGUF's blocks)
// multiply int8 activations exactly per block. Training never sees one: a packed weight cannot
// take a gradient.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "qkv/tensor.h"

namespace qkv {

enum class WType { F32, BF16, F16, Q8_0, Q4_0 };

const char* wtype_name(WType t);  // "f32", "bf16", "f16", "q8_0", "q4_0"
// "f32", "bf16", "f16", "int8" / "q8_0", "q4" / "q4_0"; anything else is an error naming `what`.
WType parse_wtype(const std::string& s, const std::string& what);

// A (rows, cols) matrix packed row by row (each row row_bytes long; docs/formats.md). Q4_0 rows
// are held grouped, 16 rows interleaved for the row products (kernels/quant.h), so a Q4_0 row is
// not at row(r): file_row and dequantize_row read any row of any type.
struct PackedWeight {
  WType type = WType::F32;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  std::shared_ptr<Storage> bytes;
  // The bytes where row r starts: row r itself for every type but Q4_0; for Q4_0 the start of the
  // rows from r on (r a multiple of 16), as the row products take them.
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(bytes->data()) + static_cast<size_t>(r) * row_bytes; }
  void file_row(int64_t r, uint8_t* out) const;     // row r as files hold it (row_bytes bytes)
  void dequantize_row(int64_t r, float* out) const;  // row r as cols floats
  // rows [r0, r0 + n) dequantised and rounded to bfloat16 (dequantize_row, then nearest even),
  // row i to out + i * cols; whole groups of a Q4_0 matrix straight from their grouped bytes
  void dequantize_rows_bf16(int64_t r0, int64_t n, uint16_t* out) const;
  std::string file_bytes() const;                    // every row as files hold them
};

// Bytes of one packed row of `cols` weights (an error when Q8_0 / Q4_0 rows are not whole blocks
// of 32).
size_t packed_row_bytes(WType t, int64_t cols);

// `w` (rows, cols), float32, packed to `t` (not F32; cols a multiple of 32 for Q8_0 and Q4_0). A
// weight that is not finite once packed (NaN, infinity, a float16 beyond +-65504, a block scale
// that overflows) is an error naming `name` and the row.
std::shared_ptr<const PackedWeight> pack_weight(const Tensor& w, WType t, const std::string& name);
// The same, the float32 rows produced by read(first_row, n, dst) (dst: n x cols floats) a few MiB at
// a time, so that the whole float32 matrix is never held (loading).
std::shared_ptr<const PackedWeight> pack_rows(WType t, int64_t rows, int64_t cols, const std::string& name,
                                              const std::function<void(int64_t, int64_t, float*)>& read);
// A matrix from its packed bytes as a file holds them (rows x packed_row_bytes(t, cols)), checked
// as pack_weight checks: a weight or block scale that is not finite is an error naming `name`.
std::shared_ptr<const PackedWeight> packed_from_bytes(WType t, int64_t rows, int64_t cols,
                                                      std::shared_ptr<Storage> bytes, const std::string& name);

}  // namespace qkv
