// Tensor and Storage: shape/stride bookkeeping, views, and the copies (contiguous, clone, to).
#include "qkv/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

namespace qkv {

namespace {

constexpr size_t kAlign = 64;

bool mul_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool add_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

// C-order strides for `shape`. Size-0 and size-1 dimensions count as 1 so that every stride is
// defined (and overflow-checked) even for zero-size tensors.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape, const char* what) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    const int64_t extent = shape[i] > 1 ? shape[i] : 1;
    check(!mul_overflows(s, extent, &s), what, ": shape ", shape_str(shape), " is too large (element count overflows int64)");
  }
  return strides;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // callers have already checked that this cannot overflow
  return n;
}

// Calls f(storage_index) for every element of (shape, strides, offset), in C order.
template <class F>
void for_each_index(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t offset, F&& f) {
  const size_t n = shape.size();
  if (n == 0) {
    f(offset);
    return;
  }
  for (int64_t d : shape)
    if (d == 0) return;
  const int64_t inner = shape[n - 1], inner_stride = strides[n - 1];
  std::vector<int64_t> idx(n, 0);
  int64_t base = offset;
  for (;;) {
    for (int64_t i = 0; i < inner; ++i) f(base + i * inner_stride);
    // Advance the odometer over dimensions n-2 .. 0.
    size_t d = n - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      base += strides[d];
      if (++idx[d] < shape[d]) break;
      base -= idx[d] * strides[d];
      idx[d] = 0;
    }
  }
}

// Element types by dtype, for the conversion dispatch.
template <DType> struct Elem;
template <> struct Elem<DType::F32> { using type = float; };
template <> struct Elem<DType::F64> { using type = double; };
template <> struct Elem<DType::I32> { using type = int32_t; };
template <> struct Elem<DType::I64> { using type = int64_t; };
template <> struct Elem<DType::Bool> { using type = bool; };

template <class F>
void dispatch_numeric(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::F32: f(Elem<DType::F32>{}); return;
    case DType::F64: f(Elem<DType::F64>{}); return;
    case DType::I32: f(Elem<DType::I32>{}); return;
    case DType::I64: f(Elem<DType::I64>{}); return;
    case DType::Bool: f(Elem<DType::Bool>{}); return;
    case DType::BF16: break;
  }
  throw Error(detail::concat(what, ": dtype ", dtype_name(t),
                             " is reserved and has no conversions yet (expected float32, float64, int32, int64 or bool)"));
}

// One value from S to D. Floating to integer truncates toward zero; a value the target cannot
// represent (NaN, infinity, out of range) is an error rather than undefined behaviour.
template <class D, class S>
D convert_value(S v, int64_t index, DType from, DType to) {
  if constexpr (std::is_same_v<D, bool>) {
    return v != S{};
  } else if constexpr (std::is_floating_point_v<D> || std::is_same_v<S, bool>) {
    return static_cast<D>(v);
  } else if constexpr (std::is_floating_point_v<S>) {
    // 2^63 and 2^31 are exact in every floating type; the valid range is [-2^k, 2^k).
    constexpr double hi = -static_cast<double>(std::numeric_limits<D>::min());
    const double t = std::trunc(static_cast<double>(v));
    check(t >= -hi && t < hi, "to: element ", index, " (", v, ") of ", dtype_name(from),
          " tensor cannot be represented as ", dtype_name(to));
    return static_cast<D>(t);
  } else {
    check(v >= std::numeric_limits<D>::min() && v <= std::numeric_limits<D>::max(), "to: element ", index, " (", v,
          ") of ", dtype_name(from), " tensor cannot be represented as ", dtype_name(to));
    return static_cast<D>(v);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// dtypes

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::Bool: return 1;
    case DType::BF16: return 2;
  }
  throw Error(detail::concat("dtype_size: invalid dtype value ", static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::Bool: return "bool";
    case DType::BF16: return "bfloat16";
  }
  return "invalid-dtype";
}

// ---------------------------------------------------------------------------------------------
// Storage

Storage::Storage(size_t bytes) {
  check(bytes <= std::numeric_limits<size_t>::max() - (kAlign - 1), "Storage: cannot allocate ", bytes,
        " bytes (size overflows when rounded up to ", kAlign, ")");
  // aligned_alloc needs a multiple of the alignment; a zero-size request still gets one line.
  size_t alloc = (bytes + kAlign - 1) / kAlign * kAlign;
  if (alloc == 0) alloc = kAlign;
  data_ = std::aligned_alloc(kAlign, alloc);
  check(data_ != nullptr, "Storage: cannot allocate ", bytes, " bytes (out of memory)");
  std::memset(data_, 0, alloc);
  bytes_ = bytes;
}

Storage::~Storage() { std::free(data_); }

// ---------------------------------------------------------------------------------------------
// Tensor: construction and metadata

Tensor::Tensor(std::vector<int64_t> shape, DType dtype) : dtype_(dtype) {
  const size_t item = dtype_size(dtype);
  for (int64_t d : shape)
    check(d >= 0, "Tensor: negative dimension ", d, " in shape ", shape_str(shape), " (expected sizes >= 0)");
  strides_ = contiguous_strides(shape, "Tensor");
  int64_t n = 1;
  for (int64_t d : shape)
    check(!mul_overflows(n, d, &n), "Tensor: shape ", shape_str(shape), " is too large (element count overflows int64)");
  int64_t bytes = 0;
  check(!mul_overflows(n, static_cast<int64_t>(item), &bytes), "Tensor: shape ", shape_str(shape), " of ",
        dtype_name(dtype), " is too large (byte count overflows int64)");
  shape_ = std::move(shape);
  storage_ = std::make_shared<Storage>(static_cast<size_t>(bytes));
}

namespace {

int64_t wrap_dim(int64_t d, int64_t ndim, const char* what, const std::string& desc) {
  const int64_t w = d < 0 ? d + ndim : d;
  if (w < 0 || w >= ndim) {
    if (ndim == 0)
      throw Error(detail::concat(what, ": dimension ", d, " out of range for 0-d tensor ", desc));
    throw Error(detail::concat(what, ": dimension ", d, " out of range for tensor ", desc, " (expected ", -ndim, "..",
                               ndim - 1, ")"));
  }
  return w;
}

}  // namespace

int64_t Tensor::size(int64_t d) const { return shape_[static_cast<size_t>(wrap_dim(d, dim(), "size", describe()))]; }

int64_t Tensor::stride(int64_t d) const {
  return strides_[static_cast<size_t>(wrap_dim(d, dim(), "stride", describe()))];
}

int64_t Tensor::numel() const { return defined() ? product(shape_) : 0; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 0) return true;  // no elements: any strides describe them
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!defined()) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return detail::concat(dtype_name(dtype_), " ", shape_str(shape_));
}

// ---------------------------------------------------------------------------------------------
// Views

Tensor Tensor::view(std::vector<int64_t> shape) const {
  check(defined(), "view: tensor is undefined");
  check(is_contiguous(), "view: cannot view ", describe(), " with strides ", shape_str(strides_), " as ",
        shape_str(shape), " (tensor is not contiguous; call contiguous() first)");
  int64_t known = 1;
  int64_t infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      check(infer_at < 0, "view: cannot view ", describe(), " as ", shape_str(shape), " (at most one -1 allowed)");
      infer_at = static_cast<int64_t>(i);
      continue;
    }
    check(shape[i] >= 0, "view: cannot view ", describe(), " as ", shape_str(shape), " (negative dimension ", shape[i],
          ")");
    check(!mul_overflows(known, shape[i], &known), "view: cannot view ", describe(), " as ", shape_str(shape),
          " (element count overflows)");
  }
  const int64_t n = numel();
  if (infer_at >= 0) {
    check(known != 0 && n % known == 0, "view: cannot view ", describe(), " (", n, " elements) as ", shape_str(shape),
          " (the -1 dimension cannot be inferred)");
    shape[static_cast<size_t>(infer_at)] = n / known;
    known = n;
  }
  check(known == n, "view: cannot view ", describe(), " (", n, " elements) as ", shape_str(shape), " (", known,
        " elements)");
  Tensor out = *this;
  out.strides_ = contiguous_strides(shape, "view");
  out.shape_ = std::move(shape);
  return out;
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  check(defined(), "transpose: tensor is undefined");
  const size_t i = static_cast<size_t>(wrap_dim(a, dim(), "transpose", describe()));
  const size_t j = static_cast<size_t>(wrap_dim(b, dim(), "transpose", describe()));
  Tensor out = *this;
  std::swap(out.shape_[i], out.shape_[j]);
  std::swap(out.strides_[i], out.strides_[j]);
  return out;
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  check(defined(), "permute: tensor is undefined");
  check(static_cast<int64_t>(order.size()) == dim(), "permute: order ", shape_str(order), " has ", order.size(),
        " entries for tensor ", describe(), " (expected ", dim(), ")");
  std::vector<bool> seen(order.size(), false);
  Tensor out = *this;
  for (size_t k = 0; k < order.size(); ++k) {
    const int64_t d = order[k];
    const int64_t w = d < 0 ? d + dim() : d;
    check(w >= 0 && w < dim() && !seen[static_cast<size_t>(w)], "permute: order ", shape_str(order),
          " is not a permutation of the dimensions of ", describe());
    seen[static_cast<size_t>(w)] = true;
    out.shape_[k] = shape_[static_cast<size_t>(w)];
    out.strides_[k] = strides_[static_cast<size_t>(w)];
  }
  return out;
}

Tensor Tensor::slice(int64_t d, int64_t begin, int64_t end) const {
  check(defined(), "slice: tensor is undefined");
  const size_t i = static_cast<size_t>(wrap_dim(d, dim(), "slice", describe()));
  check(0 <= begin && begin <= end && end <= shape_[i], "slice: range [", begin, ", ", end, ") along dimension ", d,
        " of ", describe(), " (expected 0 <= begin <= end <= ", shape_[i], ")");
  Tensor out = *this;
  out.shape_[i] = end - begin;
  // A non-empty result starts at an element that was reachable before, so it stays in storage.
  if (out.numel() > 0) out.offset_ += begin * strides_[i];
  return out;
}

Tensor Tensor::as_strided(std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t offset_elems) const {
  check(defined(), "as_strided: tensor is undefined");
  const std::string what = detail::concat("as_strided: shape ", shape_str(shape), ", strides ", shape_str(strides),
                                          ", offset ", offset_elems, " on ", describe());
  check(shape.size() == strides.size(), what, " (shape and strides differ in length)");
  check(offset_elems >= 0, what, " (expected offset >= 0)");
  int64_t last = offset_elems;  // largest element index reached
  bool empty = false;
  int64_t n = 1;
  const int64_t item = static_cast<int64_t>(dtype_size(dtype_));
  for (size_t i = 0; i < shape.size(); ++i) {
    check(shape[i] >= 0, what, " (negative dimension ", shape[i], ")");
    check(strides[i] >= 0, what, " (negative stride ", strides[i], ")");
    check(!mul_overflows(n, shape[i], &n), what, " (element count overflows int64)");
    if (shape[i] == 0) empty = true;
  }
  int64_t total_bytes = 0;
  check(!mul_overflows(n, item, &total_bytes), what, " (byte count overflows int64)");
  const int64_t capacity = static_cast<int64_t>(storage_->bytes()) / item;  // whole elements in storage
  if (!empty) {
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t reach = 0;
      check(!mul_overflows(shape[i] - 1, strides[i], &reach) && !add_overflows(last, reach, &last), what,
            " (view overflows)");
    }
    check(last < capacity, what, " (view reaches element ", last, ", storage holds ", capacity, " elements)");
  } else {
    check(offset_elems <= capacity, what, " (offset past the storage of ", capacity, " elements)");
  }
  Tensor out = *this;
  out.shape_ = std::move(shape);
  out.strides_ = std::move(strides);
  out.offset_ = offset_elems;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Copies

Tensor Tensor::contiguous() const {
  if (!defined() || is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  check(defined(), "clone: tensor is undefined");
  Tensor out(shape_, dtype_);
  const size_t item = dtype_size(dtype_);
  const char* src = static_cast<const char*>(storage_->data());
  char* dst = static_cast<char*>(out.raw_data());
  // dst[j] <- src[index(j)] for every element j in C order; the switch makes each copy a fixed-size move.
  auto copy_all = [&](auto size_tag) {
    constexpr size_t n = decltype(size_tag)::value;
    for_each_index(shape_, strides_, offset_, [&](int64_t i) {
      std::memcpy(dst, src + i * static_cast<int64_t>(n), n);
      dst += n;
    });
  };
  switch (item) {
    case 1: copy_all(std::integral_constant<size_t, 1>{}); break;
    case 2: copy_all(std::integral_constant<size_t, 2>{}); break;
    case 4: copy_all(std::integral_constant<size_t, 4>{}); break;
    case 8: copy_all(std::integral_constant<size_t, 8>{}); break;
    default: throw Error(detail::concat("clone: unexpected item size ", item, " for ", describe()));
  }
  return out;
}

Tensor Tensor::to(DType t) const {
  check(defined(), "to: tensor is undefined");
  if (t == dtype_) return clone();
  Tensor out(shape_, t);
  const DType from = dtype_;
  dispatch_numeric(from, "to", [&](auto src_tag) {
    using S = typename decltype(src_tag)::type;
    dispatch_numeric(t, "to", [&](auto dst_tag) {
      using D = typename decltype(dst_tag)::type;
      const S* src = static_cast<const S*>(storage_->data());
      D* dst = static_cast<D*>(out.raw_data());
      int64_t j = 0;
      // dst[j] <- convert(src[index(j)])
      for_each_index(shape_, strides_, offset_, [&](int64_t i) {
        dst[j] = convert_value<D>(src[i], j, from, t);
        ++j;
      });
    });
  });
  return out;
}

}  // namespace qkv
