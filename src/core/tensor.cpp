// Tensor and Storage: shape/stride bookkeeping, views, and the copies (contiguous, clone, to).
#include "qkv/tensor.h"
#include "qkv/parallel.h"

#include <algorithm>

#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <limits>
#include <type_traits>
#include <utility>

namespace qkv {

namespace {

constexpr size_t kAlign = 64;

// Throws qkv::Error(concat(args...)). Unlike check(), callers build the message only on failure.
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
    if (mul_overflows(s, extent, &s))
      fail(what, ": shape ", shape_str(shape), " is too large (element count overflows int64)");
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

// Calls f(std::type_identity<T>{}) with the element type T of `t`.
template <class F>
void dispatch_numeric(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::F32: f(std::type_identity<float>{}); return;
    case DType::F64: f(std::type_identity<double>{}); return;
    case DType::I32: f(std::type_identity<int32_t>{}); return;
    case DType::I64: f(std::type_identity<int64_t>{}); return;
    case DType::Bool: f(std::type_identity<bool>{}); return;
    case DType::BF16: break;
  }
  throw Error(
      detail::concat(what, ": dtype ", dtype_name(t),
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
    if (!(t >= -hi && t < hi))
      fail("to: element ", index, " (", v, ") of ", dtype_name(from), " tensor cannot be represented as ",
           dtype_name(to));
    return static_cast<D>(t);
  } else {
    if (v < std::numeric_limits<D>::min() || v > std::numeric_limits<D>::max())
      fail("to: element ", index, " (", v, ") of ", dtype_name(from), " tensor cannot be represented as ",
           dtype_name(to));
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

namespace {

// Large blocks are kept after their tensor dies and handed to the next request of the same
// size class. A training loop allocates the same activation and gradient sizes every step;
// without this, each one is a fresh mmap whose pages the kernel faults in and zeroes again (a
// fifth of a GPT-2 training step's time, measured with perf). Blocks of at least kMinBytes are
// rounded up to one of 8 sizes per power of two (at most 12.5% more), so batches whose shapes
// change from step to step (batching by length) reuse them too. Bounded by QKV_ALLOC_CACHE_MB
// (default 4096; 0 disables); release_cached_memory() empties it.
class BlockCache {
 public:
  static constexpr size_t kMinBytes = size_t{256} << 10;

  // The size class of a block: bytes below kMinBytes unchanged; above, rounded up to a multiple
  // of 2^(floor(log2 bytes) - 3).
  static size_t size_class(size_t bytes) {
    if (bytes < kMinBytes) return bytes;
    const int top = 63 - __builtin_clzll(bytes);
    const size_t step = size_t{1} << (top - 3);
    if (bytes > std::numeric_limits<size_t>::max() - step) return bytes;
    return (bytes + step - 1) / step * step;
  }

  static BlockCache& get() {
    static BlockCache* c = new BlockCache();  // never destroyed: storages may die at exit
    return *c;
  }
  void* take(size_t bytes) {
    if (bytes < kMinBytes) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it == free_.end()) return nullptr;
    void* p = it->second;
    free_.erase(it);
    cached_ -= bytes;
    return p;
  }
  bool give(void* p, size_t bytes) {
    if (bytes < kMinBytes || bytes > limit_) return false;
    std::lock_guard<std::mutex> lock(mu_);
    // Make room by dropping the largest blocks first.
    while (cached_ + bytes > limit_ && !free_.empty()) {
      auto last = std::prev(free_.end());
      std::free(last->second);
      cached_ -= last->first;
      free_.erase(last);
    }
    if (cached_ + bytes > limit_) return false;
    free_.emplace(bytes, p);
    cached_ += bytes;
    return true;
  }
  size_t release() {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = cached_;
    for (auto& [size, p] : free_) std::free(p);
    free_.clear();
    cached_ = 0;
    return n;
  }

 private:
  BlockCache() {
    const char* env = std::getenv("QKV_ALLOC_CACHE_MB");
    long long mb = 4096;
    if (env && *env) {
      char* end = nullptr;
      const long long v = std::strtoll(env, &end, 10);
      if (end && *end == '\0' && v >= 0) mb = v;
    }
    limit_ = static_cast<size_t>(mb) << 20;
  }
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0, limit_ = 0;
};

// A new large block asks for transparent huge pages on the 2 MiB pages inside it (where the
// kernel's setting is "madvise", as on many distributions; "always" needs no asking): its first
// touch then costs one fault per 2 MiB instead of one per 4 KiB. Under a hypervisor each fault
// is an exit (tens of microseconds): GPT-2 small's first training step faults in gigabytes of
// activations, gradients and AdamW moments.
void advise_huge_pages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), begin = (a + kHuge - 1) & ~(kHuge - 1),
                  end = (a + bytes) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice: failure is harmless
}

}  // namespace

size_t release_cached_memory() { return BlockCache::get().release(); }

Storage::Storage(size_t bytes, bool zero) {
  if (bytes > std::numeric_limits<size_t>::max() - (kAlign - 1))
    fail("Storage: cannot allocate ", bytes, " bytes (size overflows when rounded up to ", kAlign, ")");
  // aligned_alloc needs a multiple of the alignment; a zero-size request still gets one line.
  size_t alloc = (bytes + kAlign - 1) / kAlign * kAlign;
  if (alloc == 0) alloc = kAlign;
  alloc = BlockCache::size_class(alloc);
  data_ = BlockCache::get().take(alloc);
  if (data_ == nullptr) {
    data_ = std::aligned_alloc(kAlign, alloc);
    if (data_ == nullptr) fail("Storage: cannot allocate ", bytes, " bytes (out of memory)");
    advise_huge_pages(data_, alloc);
  }
  if (zero) {
    // Large blocks are zeroed by every thread, each a slice (a lone memset of a training step's
    // zeroed gradients kept the other threads waiting).
    constexpr size_t kSlice = size_t{1} << 20;
    const int64_t slices = static_cast<int64_t>((alloc + kSlice - 1) / kSlice);
    char* p = static_cast<char*>(data_);
#pragma omp parallel for num_threads(slices > 1 ? num_threads() : 1) schedule(static)
    for (int64_t i = 0; i < slices; ++i)
      std::memset(p + i * kSlice, 0, std::min(kSlice, alloc - static_cast<size_t>(i) * kSlice));
  }
  bytes_ = bytes;
  alloc_ = alloc;
}

Storage::Storage(void* data, size_t bytes, std::shared_ptr<void> owner)
    : data_(data), bytes_(bytes), owner_(std::move(owner)) {
  if (!owner_) fail("Storage: borrowed memory needs an owner to keep it alive");
}

Storage::~Storage() {
  if (owner_) return;  // borrowed: the owner releases it
  if (!BlockCache::get().give(data_, alloc_)) std::free(data_);
}

// ---------------------------------------------------------------------------------------------
// Tensor: construction and metadata

Tensor::Tensor(std::vector<int64_t> shape, DType dtype) : Tensor(std::move(shape), dtype, true) {}

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype) { return Tensor(std::move(shape), dtype, false); }

Tensor Tensor::borrow(void* data, std::vector<int64_t> shape, std::vector<int64_t> strides, DType dtype,
                      std::shared_ptr<void> owner) {
  if (shape.size() != strides.size())
    fail("Tensor::borrow: ", shape.size(), " sizes and ", strides.size(), " strides");
  // the elements reached: 0 .. sum((size - 1) * stride), each stride >= 0
  int64_t last = 0, n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0 || strides[d] < 0)
      fail("Tensor::borrow: size ", shape[d], " and stride ", strides[d], " of dimension ", d, " (expected >= 0)");
    int64_t reach = 0;
    if (mul_overflows(n, shape[d], &n) || (shape[d] > 0 && mul_overflows(shape[d] - 1, strides[d], &reach)) ||
        reach > std::numeric_limits<int64_t>::max() - last)
      fail("Tensor::borrow: shape ", shape_str(shape), " is too large");
    last += reach;
  }
  if (data == nullptr && n > 0) fail("Tensor::borrow: no memory for ", n, " elements");
  const size_t bytes = n == 0 ? 0 : static_cast<size_t>(last + 1) * dtype_size(dtype);
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, bytes, std::move(owner));
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.dtype_ = dtype;
  return t;
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, bool zero) : dtype_(dtype) {
  const size_t item = dtype_size(dtype);
  for (int64_t d : shape)
    if (d < 0) fail("Tensor: negative dimension ", d, " in shape ", shape_str(shape), " (expected sizes >= 0)");
  strides_ = contiguous_strides(shape, "Tensor");
  int64_t n = 1;
  for (int64_t d : shape)
    if (mul_overflows(n, d, &n))
      fail("Tensor: shape ", shape_str(shape), " is too large (element count overflows int64)");
  int64_t bytes = 0;
  if (mul_overflows(n, static_cast<int64_t>(item), &bytes))
    fail("Tensor: shape ", shape_str(shape), " of ", dtype_name(dtype), " is too large (byte count overflows int64)");
  shape_ = std::move(shape);
  storage_ = std::make_shared<Storage>(static_cast<size_t>(bytes), zero);
}

namespace {

int64_t wrap_dim(int64_t d, const Tensor& t, const char* what) {
  const int64_t ndim = t.dim();
  const int64_t w = d < 0 ? d + ndim : d;
  if (w >= 0 && w < ndim) return w;
  if (ndim == 0) fail(what, ": dimension ", d, " out of range for 0-d tensor ", t.describe());
  fail(what, ": dimension ", d, " out of range for tensor ", t.describe(), " (expected ", -ndim, "..", ndim - 1, ")");
}

}  // namespace

int64_t Tensor::size(int64_t d) const { return shape_[static_cast<size_t>(wrap_dim(d, *this, "size"))]; }

int64_t Tensor::stride(int64_t d) const { return strides_[static_cast<size_t>(wrap_dim(d, *this, "stride"))]; }

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
  if (!defined()) fail("view: tensor is undefined");
  if (!is_contiguous())
    fail("view: cannot view ", describe(), " with strides ", shape_str(strides_), " as ", shape_str(shape),
         " (tensor is not contiguous; call contiguous() first)");
  int64_t known = 1;
  int64_t infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) fail("view: cannot view ", describe(), " as ", shape_str(shape), " (at most one -1 allowed)");
      infer_at = static_cast<int64_t>(i);
      continue;
    }
    if (shape[i] < 0)
      fail("view: cannot view ", describe(), " as ", shape_str(shape), " (negative dimension ", shape[i], ")");
    if (mul_overflows(known, shape[i], &known))
      fail("view: cannot view ", describe(), " as ", shape_str(shape), " (element count overflows)");
  }
  const int64_t n = numel();
  if (infer_at >= 0) {
    if (known == 0 || n % known != 0)
      fail("view: cannot view ", describe(), " (", n, " elements) as ", shape_str(shape),
           " (the -1 dimension cannot be inferred)");
    shape[static_cast<size_t>(infer_at)] = n / known;
    known = n;
  }
  if (known != n)
    fail("view: cannot view ", describe(), " (", n, " elements) as ", shape_str(shape), " (", known, " elements)");
  Tensor out = *this;
  out.strides_ = contiguous_strides(shape, "view");
  out.shape_ = std::move(shape);
  return out;
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  if (!defined()) fail("transpose: tensor is undefined");
  const size_t i = static_cast<size_t>(wrap_dim(a, *this, "transpose"));
  const size_t j = static_cast<size_t>(wrap_dim(b, *this, "transpose"));
  Tensor out = *this;
  std::swap(out.shape_[i], out.shape_[j]);
  std::swap(out.strides_[i], out.strides_[j]);
  return out;
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  if (!defined()) fail("permute: tensor is undefined");
  if (static_cast<int64_t>(order.size()) != dim())
    fail("permute: order ", shape_str(order), " has ", order.size(), " entries for tensor ", describe(), " (expected ",
         dim(), ")");
  std::vector<bool> seen(order.size(), false);
  Tensor out = *this;
  for (size_t k = 0; k < order.size(); ++k) {
    const int64_t d = order[k];
    const int64_t w = d < 0 ? d + dim() : d;
    if (w < 0 || w >= dim() || seen[static_cast<size_t>(w)])
      fail("permute: order ", shape_str(order), " is not a permutation of the dimensions of ", describe());
    seen[static_cast<size_t>(w)] = true;
    out.shape_[k] = shape_[static_cast<size_t>(w)];
    out.strides_[k] = strides_[static_cast<size_t>(w)];
  }
  return out;
}

Tensor Tensor::slice(int64_t d, int64_t begin, int64_t end) const {
  if (!defined()) fail("slice: tensor is undefined");
  const size_t i = static_cast<size_t>(wrap_dim(d, *this, "slice"));
  if (begin < 0 || begin > end || end > shape_[i])
    fail("slice: range [", begin, ", ", end, ") along dimension ", d, " of ", describe(),
         " (expected 0 <= begin <= end <= ", shape_[i], ")");
  Tensor out = *this;
  out.shape_[i] = end - begin;
  // A non-empty result starts at an element that was reachable before, so it stays in storage.
  if (out.numel() > 0) out.offset_ += begin * strides_[i];
  return out;
}

Tensor Tensor::as_strided(std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t offset_elems) const {
  if (!defined()) fail("as_strided: tensor is undefined");
  // The message is built only on failure: as_strided sits on hot paths.
  auto bad = [&](const auto&... why) {
    fail("as_strided: shape ", shape_str(shape), ", strides ", shape_str(strides), ", offset ", offset_elems, " on ",
         describe(), " (", why..., ")");
  };
  if (shape.size() != strides.size()) bad("shape and strides differ in length");
  if (offset_elems < 0) bad("expected offset >= 0");
  int64_t last = offset_elems;  // largest element index reached
  bool empty = false;
  int64_t n = 1;
  const int64_t item = static_cast<int64_t>(dtype_size(dtype_));
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) bad("negative dimension ", shape[i]);
    if (strides[i] < 0) bad("negative stride ", strides[i]);
    if (mul_overflows(n, shape[i], &n)) bad("element count overflows int64");
    if (shape[i] == 0) empty = true;
  }
  int64_t total_bytes = 0;
  if (mul_overflows(n, item, &total_bytes)) bad("byte count overflows int64");
  const int64_t capacity = static_cast<int64_t>(storage_->bytes()) / item;  // whole elements in storage
  if (!empty) {
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t reach = 0;
      if (mul_overflows(shape[i] - 1, strides[i], &reach) || add_overflows(last, reach, &last)) bad("view overflows");
    }
    if (last >= capacity) bad("view reaches element ", last, ", storage holds ", capacity, " elements");
  } else {
    if (offset_elems > capacity) bad("offset past the storage of ", capacity, " elements");
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
  if (!defined()) fail("clone: tensor is undefined");
  Tensor out = empty(shape_, dtype_);  // every element is written below
  const size_t item = dtype_size(dtype_);
  const char* src = static_cast<const char*>(storage_->data());
  char* dst = static_cast<char*>(out.raw_data());
  const size_t nd = shape_.size();
  if (nd >= 1 && strides_[nd - 1] == 1 && numel() > 0) {
    // Whole rows of the last dimension are contiguous: one move per row, the rows split between
    // threads when there are many bytes (a training step copies the heads' (B, H, T, D) outputs
    // into (B, T, H, D) this way; element by element on one thread it was 0.3-0.4% of a GPT-2
    // bf16 step, with the other thread waiting).
    const int64_t inner = shape_[nd - 1], rows = numel() / inner;
    const size_t row_bytes = static_cast<size_t>(inner) * item;
    const int threads = rows > 1 && numel() * static_cast<int64_t>(item) >= (int64_t{1} << 20) ? num_threads() : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      // the storage index of row r's first element: r's digits over dimensions nd-2 .. 0
      int64_t at = offset_, rest = r;
      for (size_t d = nd - 1; d-- > 0;) {
        at += (rest % shape_[d]) * strides_[d];
        rest /= shape_[d];
      }
      std::memcpy(dst + static_cast<size_t>(r) * row_bytes, src + at * static_cast<int64_t>(item), row_bytes);
    }
    return out;
  }
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
  if (!defined()) fail("to: tensor is undefined");
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
