// qkv/tensor.h: an n-dimensional array with shape, strides (in elements) and dtype, that either
// owns 64-byte aligned storage or views another tensor's storage.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/error.h"

namespace qkv {

enum class DType : uint8_t { F32, F64, I32, I64, Bool, BF16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }

// 64-byte aligned bytes, zero-initialised unless `zero` is false.
class Storage {
 public:
  explicit Storage(size_t bytes, bool zero = true);
  // Memory qkv does not own (a NumPy array's, a PyTorch tensor's): `owner` stays alive as long as
  // this storage does and is released after it; nothing is copied or freed here.
  Storage(void* data, size_t bytes, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t alloc_ = 0;  // bytes actually allocated (a multiple of 64)
  std::shared_ptr<void> owner_;  // set for borrowed memory
};

// Storage keeps freed blocks of 256 KiB and more for reuse by the next tensor of the same size
// (up to QKV_ALLOC_CACHE_MB, default 4096 MiB; 0 turns it off). This frees them; returns bytes.
size_t release_cached_memory();

class Tensor {
 public:
  Tensor() = default;
  // A new zero-filled, contiguous tensor.
  Tensor(std::vector<int64_t> shape, DType dtype);
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::F32) { return Tensor(std::move(shape), dtype); }
  // A new contiguous tensor whose contents are unspecified: for outputs that are written in
  // full before anything reads them (saves a pass over memory).
  static Tensor empty(std::vector<int64_t> shape, DType dtype = DType::F32);
  template <class T>
  static Tensor from(std::vector<int64_t> shape, const std::vector<T>& values);
  // A tensor over memory qkv does not own, without a copy: `data` holds elements at `strides`
  // (in elements, >= 0) from it, valid while `owner` lives (kept alive by this tensor and every
  // view of it). For bindings: a NumPy array or a PyTorch tensor passed to qkv's kernels.
  static Tensor borrow(void* data, std::vector<int64_t> shape, std::vector<int64_t> strides, DType dtype,
                       std::shared_ptr<void> owner);
  // The storage's keep-alive handle: a shared pointer that keeps this tensor's memory valid (for
  // handing a result to NumPy or PyTorch without a copy).
  std::shared_ptr<void> keep_alive() const { return storage_; }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  int64_t offset() const { return offset_; }  // in elements, from the start of the storage
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw_data() const;
  template <class T> T* data() const {
    check(dtype_of<T>() == dtype_, "tensor has dtype ", dtype_name(dtype_), ", accessed as ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw_data());
  }

  // Views (share storage).
  Tensor view(std::vector<int64_t> shape) const;  // contiguous tensors only; one -1 allowed
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor permute(const std::vector<int64_t>& order) const;
  Tensor slice(int64_t d, int64_t begin, int64_t end) const;  // [begin, end) along d
  // A view with the given shape and strides starting `offset_elems` from the start of the storage.
  Tensor as_strided(std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t offset_elems) const;

  // Copies.
  Tensor contiguous() const;  // returns *this when already contiguous
  Tensor clone() const;       // always a new contiguous tensor
  Tensor to(DType t) const;   // numeric conversion, contiguous result

  std::string describe() const;  // "float32 (2, 3)"

 private:
  Tensor(std::vector<int64_t> shape, DType dtype, bool zero);
  std::shared_ptr<Storage> storage_;
  std::vector<int64_t> shape_, strides_;
  int64_t offset_ = 0;  // in elements
  DType dtype_ = DType::F32;
};

template <class T>
Tensor Tensor::from(std::vector<int64_t> shape, const std::vector<T>& values) {
  Tensor t(std::move(shape), dtype_of<T>());
  check(static_cast<int64_t>(values.size()) == t.numel(), "Tensor::from: ", values.size(),
        " values for shape ", shape_str(t.shape()));
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

}  // namespace qkv
