// qkv/quant.h: weights kept in a lower precision for inference (docs/formats.md, "Weight types").
//
// A packed weight replaces a projection matrix's float32 values in the products that use it
// (ops::linear): bfloat16 and float16 rows are widened in registers, Q8_0 and Q4_0 (GGUF's blocks)
// multiply int8 activations exactly per block. Training never sees one: a packed weight cannot
// take a gradient.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "qkv/tensor.h"

namespace qkv {

enum class WType { F32, BF16, F16, Q8_0, Q4_0 };

const char* wtype_name(WType t);  // "f32", "bf16", "f16", "q8_0", "q4_0"
// "f32", "bf16", "f16", "int8" / "q8_0", "q4" / "q4_0"; anything else is an error naming `what`.
WType parse_wtype(const std::string& s, const std::string& what);

// A (rows, cols) matrix packed row by row (each row row_bytes long; docs/formats.md).
struct PackedWeight {
  WType type = WType::F32;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  std::shared_ptr<Storage> bytes;
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(bytes->data()) + static_cast<size_t>(r) * row_bytes; }
};

// `w` (rows, cols), float32, packed to `t` (not F32; cols a multiple of 32 for Q8_0 and Q4_0; a
// non-finite weight is an error naming `name`).
std::shared_ptr<const PackedWeight> pack_weight(const Tensor& w, WType t, const std::string& name);

}  // namespace qkv
