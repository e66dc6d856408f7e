// qkv/npy.h: NumPy .npy files (format versions 1.0, 2.0, 3.0). Readable dtypes: little-endian
// float32, float64, int32, int64 and bool; C or Fortran order. Anything else is a qkv::Error
// naming the file and what was expected. Writes are atomic (temporary file, fsync, rename).
#pragma once
#include <string>

#include "qkv/tensor.h"

namespace qkv {

Tensor read_npy(const std::string& path);
Tensor parse_npy(const std::string& bytes, const std::string& name);  // `name` is used in errors
void write_npy(const std::string& path, const Tensor& t);
std::string to_npy_bytes(const Tensor& t);

}  // namespace qkv
