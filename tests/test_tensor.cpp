// Tensor and Storage: construction, metadata, views, copies and conversions.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "error_testing.h"
#include "qkv/tensor.h"

namespace {

using qkv::DType;
using qkv::Tensor;

using qkv::testing::error_of;

#define EXPECT_QKV_ERROR(expr, ...)                                                                                 \
  do {                                                                                                              \
    const std::string msg_ = error_of([&] { (void)(expr); });                                                       \
    EXPECT_NE(msg_, "no exception") << #expr;                                                                       \
    for (const char* part_ : {__VA_ARGS__})                                                                         \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "message of " #expr " lacks \"" << part_ << "\": " << msg_; \
  } while (0)

// 0, 1, 2, ... as float32 in the given shape.
Tensor iota(std::vector<int64_t> shape) {
  Tensor t(std::move(shape), DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i);
  return t;
}

// Reads element `idx` of a float32 tensor through its strides.
float at(const Tensor& t, const std::vector<int64_t>& idx) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
  return t.data<float>()[off];
}

std::vector<float> values(const Tensor& t) {
  const Tensor c = t.contiguous();
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

const DType kAllDtypes[] = {DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool, DType::BF16};
const DType kNumeric[] = {DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool};

TEST(DType, SizesAndNames) {
  EXPECT_EQ(qkv::dtype_size(DType::F32), 4u);
  EXPECT_EQ(qkv::dtype_size(DType::F64), 8u);
  EXPECT_EQ(qkv::dtype_size(DType::I32), 4u);
  EXPECT_EQ(qkv::dtype_size(DType::I64), 8u);
  EXPECT_EQ(qkv::dtype_size(DType::Bool), 1u);
  EXPECT_EQ(qkv::dtype_size(DType::BF16), 2u);
  EXPECT_STREQ(qkv::dtype_name(DType::F32), "float32");
  EXPECT_STREQ(qkv::dtype_name(DType::F64), "float64");
  EXPECT_STREQ(qkv::dtype_name(DType::I32), "int32");
  EXPECT_STREQ(qkv::dtype_name(DType::I64), "int64");
  EXPECT_STREQ(qkv::dtype_name(DType::Bool), "bool");
  EXPECT_STREQ(qkv::dtype_name(DType::BF16), "bfloat16");
}

TEST(Storage, AlignedAndZeroed) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}}) {
    qkv::Storage s(bytes);
    ASSERT_NE(s.data(), nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u) << bytes;
    EXPECT_EQ(s.bytes(), bytes);
    // The whole rounded-up allocation is zero, not only the requested bytes.
    const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    const auto* p = static_cast<const unsigned char*>(s.data());
    for (size_t i = 0; i < rounded; ++i) ASSERT_EQ(p[i], 0) << "byte " << i << " of " << bytes;
  }
}

TEST(Storage, LargeBlocksAreReusedAndStillZeroed) {
  // A freed block of >= 256 KiB goes back to the cache and serves the next tensor of that size;
  // Tensor(shape) must still be all zeros, whatever the block held before.
  qkv::release_cached_memory();
  const void* first = nullptr;
  {
    Tensor a({1 << 18}, DType::F32);  // 1 MiB
    first = a.raw_data();
    std::fill(a.data<float>(), a.data<float>() + a.numel(), 7.0f);
  }
  Tensor b({1 << 18}, DType::F32);
  EXPECT_EQ(b.raw_data(), first);
  for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(b.data<float>()[i], 0.0f) << i;
  Tensor other({(1 << 18) + 16}, DType::F32);  // another size: not that block
  EXPECT_NE(other.raw_data(), first);
  { Tensor c = std::move(b); }
  EXPECT_GE(qkv::release_cached_memory(), size_t{1} << 20);
  EXPECT_EQ(qkv::release_cached_memory(), 0u);
}

TEST(Storage, ImpossibleSizeThrowsInsteadOfCrashing) {
  EXPECT_QKV_ERROR(qkv::Storage(std::numeric_limits<size_t>::max()), "Storage", "cannot allocate");
  EXPECT_QKV_ERROR(qkv::Storage(std::numeric_limits<size_t>::max() - 10), "Storage");
}

TEST(Tensor, ConstructionIsContiguousAndZeroFilled) {
  for (DType dt : kAllDtypes) {
    Tensor t({2, 3, 4}, dt);
    EXPECT_TRUE(t.defined());
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_EQ(t.dim(), 3);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3, 4}));
    EXPECT_EQ(t.strides(), (std::vector<int64_t>{12, 4, 1}));
    EXPECT_EQ(t.numel(), 24);
    EXPECT_EQ(t.nbytes(), 24 * qkv::dtype_size(dt));
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
    const auto* p = static_cast<const unsigned char*>(t.raw_data());
    for (size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(p[i], 0);
  }
  Tensor z = Tensor::zeros({5});
  EXPECT_EQ(z.dtype(), DType::F32);
  EXPECT_EQ(z.numel(), 5);
}

TEST(Tensor, ZeroDimensionalAndZeroSize) {
  Tensor s({}, DType::F64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.nbytes(), 8u);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.data<double>()[0], 0.0);

  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{0}, {2, 0, 3}, {0, 0}, {3, 0}}) {
    Tensor e(shape, DType::I32);
    EXPECT_EQ(e.numel(), 0);
    EXPECT_EQ(e.nbytes(), 0u);
    EXPECT_NE(e.raw_data(), nullptr);  // still backed by a 64-byte line
    EXPECT_TRUE(e.is_contiguous());
    EXPECT_EQ(e.clone().shape(), shape);
    EXPECT_EQ(e.to(DType::F64).numel(), 0);
    EXPECT_EQ(e.view({-1}).shape(), (std::vector<int64_t>{0}));
  }
  EXPECT_EQ(Tensor({2, 0, 3}, DType::F32).strides(), (std::vector<int64_t>{3, 3, 1}));
}

TEST(Tensor, BadShapesAreErrorsNamingTheShape) {
  EXPECT_QKV_ERROR(Tensor({2, -1}, DType::F32), "negative dimension -1", "(2, -1)");
  const int64_t big = int64_t{1} << 62;
  EXPECT_QKV_ERROR(Tensor({big, big}, DType::F32), "too large", "(4611686018427387904, 4611686018427387904)");
  EXPECT_QKV_ERROR(Tensor({int64_t{1} << 61}, DType::F64), "too large", "float64");
  EXPECT_QKV_ERROR(Tensor({0, big, big}, DType::F32), "too large");  // strides would overflow
  EXPECT_QKV_ERROR(Tensor::from<float>({2, 2}, {1, 2, 3}), "3 values", "(2, 2)");
}

TEST(Tensor, UndefinedTensor) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.raw_data(), nullptr);
  EXPECT_EQ(t.describe(), "undefined tensor");
  EXPECT_FALSE(t.contiguous().defined());
  EXPECT_QKV_ERROR(t.view({1}), "undefined");
  EXPECT_QKV_ERROR(t.clone(), "undefined");
  EXPECT_QKV_ERROR(t.to(DType::F64), "undefined");
}

TEST(Tensor, SizeAndStrideWithNegativeIndices) {
  Tensor t({2, 3, 4}, DType::F32);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.stride(-2), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_QKV_ERROR(t.size(3), "dimension 3 out of range", "float32 (2, 3, 4)", "-3..2");
  EXPECT_QKV_ERROR(t.size(-4), "dimension -4 out of range", "(2, 3, 4)");
  EXPECT_QKV_ERROR(t.stride(7), "dimension 7", "(2, 3, 4)");
  EXPECT_QKV_ERROR(Tensor({}, DType::F32).size(0), "0-d");
}

TEST(Tensor, DescribeAndTypedAccess) {
  EXPECT_EQ(Tensor({2, 3}, DType::F32).describe(), "float32 (2, 3)");
  EXPECT_EQ(Tensor({5}, DType::Bool).describe(), "bool (5,)");
  EXPECT_EQ(Tensor({}, DType::I64).describe(), "int64 ()");
  EXPECT_EQ(Tensor({1, 0}, DType::BF16).describe(), "bfloat16 (1, 0)");
  Tensor t({2}, DType::I32);
  EXPECT_QKV_ERROR(t.data<float>(), "int32", "float32");
  Tensor f = Tensor::from<int64_t>({3}, {7, -8, 9});
  EXPECT_EQ(f.data<int64_t>()[1], -8);
}

TEST(Tensor, IsContiguousIgnoresSizeOneStrides) {
  Tensor t = iota({2, 1, 3});
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.as_strided({2, 1, 3}, {3, 999, 1}, 0).is_contiguous());
  EXPECT_TRUE(t.as_strided({1, 6}, {42, 1}, 0).is_contiguous());
  EXPECT_FALSE(t.as_strided({2, 3}, {1, 2}, 0).is_contiguous());
  EXPECT_FALSE(iota({2, 3}).transpose(0, 1).is_contiguous());
  EXPECT_TRUE(iota({4, 3}).slice(0, 1, 3).is_contiguous());
  EXPECT_FALSE(iota({4, 3}).slice(1, 0, 2).is_contiguous());
  EXPECT_TRUE(iota({4, 3}).slice(1, 1, 2).slice(0, 2, 3).is_contiguous());  // (1, 1)
}

TEST(Tensor, ViewSharesStorageAndInfersOneDimension) {
  Tensor t = iota({2, 3, 4});
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(v.strides(), (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(v.raw_data(), t.raw_data());
  v.data<float>()[5] = 100.f;
  EXPECT_EQ(t.data<float>()[5], 100.f);
  EXPECT_EQ(t.view({-1}).shape(), (std::vector<int64_t>{24}));
  EXPECT_EQ(t.view({2, -1, 3}).shape(), (std::vector<int64_t>{2, 4, 3}));
  EXPECT_EQ(iota({1}).view({}).dim(), 0);
  EXPECT_EQ(iota({}).view({1, 1}).shape(), (std::vector<int64_t>{1, 1}));

  // A view of a contiguous slice keeps its offset.
  Tensor s = iota({4, 3}).slice(0, 2, 4).view({6});
  EXPECT_EQ(values(s), (std::vector<float>{6, 7, 8, 9, 10, 11}));
}

TEST(Tensor, ViewErrorsNameBothShapes) {
  Tensor t = iota({2, 3});
  EXPECT_QKV_ERROR(t.view({4, 2}), "float32 (2, 3)", "(4, 2)", "6 elements", "8 elements");
  EXPECT_QKV_ERROR(t.view({-1, -1}), "(2, 3)", "(-1, -1)", "one -1");
  EXPECT_QKV_ERROR(t.view({4, -1}), "(2, 3)", "(4, -1)");
  EXPECT_QKV_ERROR(t.view({-2, -3}), "(2, 3)", "negative");
  EXPECT_QKV_ERROR(t.transpose(0, 1).view({6}), "(3, 2)", "(6,)", "contiguous");
  EXPECT_QKV_ERROR(Tensor({0, 4}, DType::F32).view({0, -1}), "(0, 4)", "(0, -1)", "inferred");
}

TEST(Tensor, TransposeAndContiguous) {
  Tensor t = iota({2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(tt.strides(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(tt.raw_data(), t.raw_data());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(at(tt, {i, j}), at(t, {j, i}));
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.raw_data(), t.raw_data());
  EXPECT_EQ(values(c), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(t.transpose(-1, -2).shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(t.transpose(1, 1).strides(), t.strides());
  EXPECT_QKV_ERROR(t.transpose(0, 2), "dimension 2", "(2, 3)");
}

TEST(Tensor, PermuteMatchesIndexArithmetic) {
  Tensor t = iota({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(p.strides(), (std::vector<int64_t>{1, 12, 4}));
  const std::vector<float> v = values(p);
  size_t k = 0;
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(v[k++], static_cast<float>(a * 12 + b * 4 + c));
  EXPECT_EQ(t.permute({-1, 0, 1}).shape(), p.shape());
  EXPECT_QKV_ERROR(t.permute({0, 0, 1}), "(0, 0, 1)", "not a permutation", "(2, 3, 4)");
  EXPECT_QKV_ERROR(t.permute({0, 1, 3}), "not a permutation");
  EXPECT_QKV_ERROR(t.permute({0, 1}), "(0, 1)", "expected 3", "(2, 3, 4)");
}

TEST(Tensor, SliceSelectsAndValidatesRanges) {
  Tensor t = iota({4, 5});
  Tensor s = t.slice(1, 1, 4);
  EXPECT_EQ(s.shape(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(static_cast<char*>(s.raw_data()) - static_cast<char*>(t.raw_data()), 4);
  EXPECT_EQ(values(s.slice(0, 2, 4)), (std::vector<float>{11, 12, 13, 16, 17, 18}));
  EXPECT_EQ(values(t.slice(-1, 4, 5)), (std::vector<float>{4, 9, 14, 19}));
  Tensor e = t.slice(0, 4, 4);
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.clone().shape(), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(t.slice(0, 0, 4).raw_data(), t.raw_data());
  EXPECT_QKV_ERROR(t.slice(0, 3, 2), "[3, 2)", "(4, 5)", "0 <= begin <= end <= 4");
  EXPECT_QKV_ERROR(t.slice(1, 0, 6), "[0, 6)", "<= 5");
  EXPECT_QKV_ERROR(t.slice(1, -1, 2), "[-1, 2)");
  EXPECT_QKV_ERROR(t.slice(2, 0, 1), "dimension 2");
}

TEST(Tensor, AsStridedStaysInsideStorage) {
  Tensor t = iota({6});
  // Overlapping windows of 3 over 6 elements.
  Tensor w = t.as_strided({4, 3}, {1, 1}, 0);
  EXPECT_EQ(values(w), (std::vector<float>{0, 1, 2, 1, 2, 3, 2, 3, 4, 3, 4, 5}));
  EXPECT_EQ(values(t.as_strided({2}, {2}, 3)), (std::vector<float>{3, 5}));
  EXPECT_EQ(values(t.as_strided({3}, {0}, 5)), (std::vector<float>{5, 5, 5}));
  // The offset is in elements from the start of the storage, not from the view.
  EXPECT_EQ(values(t.slice(0, 4, 6).as_strided({2}, {1}, 0)), (std::vector<float>{0, 1}));
  EXPECT_EQ(t.as_strided({0, 3}, {100, 100}, 6).numel(), 0);

  EXPECT_QKV_ERROR(t.as_strided({4, 3}, {1, 2}, 0), "reaches element 7", "storage holds 6");
  EXPECT_QKV_ERROR(t.as_strided({1}, {1}, 6), "reaches element 6");
  EXPECT_QKV_ERROR(t.as_strided({2}, {-1}, 3), "negative stride");
  EXPECT_QKV_ERROR(t.as_strided({2}, {1}, -1), "offset >= 0");
  EXPECT_QKV_ERROR(t.as_strided({2, 2}, {1}, 0), "differ in length");
  EXPECT_QKV_ERROR(t.as_strided({-2}, {1}, 0), "negative dimension");
  EXPECT_QKV_ERROR(t.as_strided({int64_t{1} << 62, 4}, {0, 0}, 0), "overflows");
  EXPECT_QKV_ERROR(t.as_strided({3, 2}, {int64_t{1} << 62, 1}, 0), "view overflows");
  EXPECT_QKV_ERROR(t.as_strided({0}, {1}, 7), "offset past the storage");
}

TEST(Tensor, ContiguousReturnsSelfOrCopies) {
  Tensor t = iota({3, 4});
  Tensor c = t.contiguous();
  EXPECT_EQ(c.raw_data(), t.raw_data());  // no copy
  Tensor k = t.clone();
  EXPECT_NE(k.raw_data(), t.raw_data());
  EXPECT_EQ(values(k), values(t));
  k.data<float>()[0] = -1.f;
  EXPECT_EQ(t.data<float>()[0], 0.f);

  // A 4-d view with a permutation, a step and an offset, against direct indexing.
  Tensor big = iota({3, 4, 5, 6});
  Tensor v = big.permute({3, 1, 0, 2}).slice(0, 1, 5).slice(3, 2, 5);  // (4, 4, 3, 3)
  Tensor vc = v.contiguous();
  ASSERT_EQ(vc.shape(), (std::vector<int64_t>{4, 4, 3, 3}));
  const float* p = vc.data<float>();
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t c2 = 0; c2 < 3; ++c2)
        for (int64_t d = 0; d < 3; ++d) ASSERT_EQ(*p++, static_cast<float>(c2 * 120 + b * 30 + (d + 2) * 6 + (a + 1)));
}

TEST(Tensor, CopiesWorkForEveryDtype) {
  for (DType dt : kAllDtypes) {
    Tensor t({2, 3, 4}, dt);
    const size_t item = qkv::dtype_size(dt);
    auto* bytes = static_cast<unsigned char*>(t.raw_data());
    // Element i gets a distinct bit pattern (bool elements stay 0/1).
    for (int64_t i = 0; i < 24; ++i)
      for (size_t b = 0; b < item; ++b)
        bytes[static_cast<size_t>(i) * item + b] =
            dt == DType::Bool ? static_cast<unsigned char>(i % 2) : static_cast<unsigned char>(i * 7 + b + 1);
    Tensor p = t.permute({2, 0, 1}).contiguous();
    ASSERT_EQ(p.shape(), (std::vector<int64_t>{4, 2, 3})) << qkv::dtype_name(dt);
    const auto* out = static_cast<const unsigned char*>(p.raw_data());
    size_t k = 0;
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t a = 0; a < 2; ++a)
        for (int64_t b = 0; b < 3; ++b, ++k)
          ASSERT_EQ(std::memcmp(out + k * item, bytes + static_cast<size_t>(a * 12 + b * 4 + c) * item, item), 0)
              << qkv::dtype_name(dt);
    Tensor s({}, dt);
    EXPECT_EQ(s.clone().nbytes(), item);
  }
}

TEST(Tensor, ToConvertsBetweenNumericDtypes) {
  // Small integers survive every conversion chain.
  for (DType a : kNumeric) {
    for (DType b : kNumeric) {
      Tensor t = Tensor::from<int32_t>({2, 2}, {0, 1, 1, 0}).to(a);
      Tensor back = t.to(b).to(DType::I32);
      EXPECT_EQ(back.dtype(), DType::I32);
      const int32_t* p = back.data<int32_t>();
      EXPECT_EQ(std::vector<int32_t>(p, p + 4), (std::vector<int32_t>{0, 1, 1, 0}))
          << qkv::dtype_name(a) << " -> " << qkv::dtype_name(b);
    }
  }
  Tensor f = Tensor::from<float>({5}, {-1.7f, 2.9f, 0.f, -0.f, 3.f});
  const Tensor fi = f.to(DType::I64);
  const int64_t* i = fi.data<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(i, i + 5), (std::vector<int64_t>{-1, 2, 0, 0, 3}));
  const Tensor fb = f.to(DType::Bool);
  const bool* b = fb.data<bool>();
  EXPECT_EQ(std::vector<bool>(b, b + 5), (std::vector<bool>{true, true, false, false, true}));
  EXPECT_TRUE(Tensor::from<float>({1}, {NAN}).to(DType::Bool).data<bool>()[0]);
  EXPECT_EQ(Tensor::from<bool>({2}, {true, false}).to(DType::F64).data<double>()[0], 1.0);
  const int64_t big = (int64_t{1} << 53) + 1;  // not a double: must not go through one
  EXPECT_EQ(Tensor::from<int64_t>({1}, {big}).to(DType::I64).data<int64_t>()[0], big);
  EXPECT_EQ(Tensor::from<double>({1}, {-2147483648.0}).to(DType::I32).data<int32_t>()[0],
            std::numeric_limits<int32_t>::min());
  EXPECT_EQ(Tensor::from<double>({1}, {2147483647.9}).to(DType::I32).data<int32_t>()[0],
            std::numeric_limits<int32_t>::max());

  // The result is contiguous even for a transposed input, and same-dtype to() copies.
  Tensor t = iota({2, 3}).transpose(0, 1);
  Tensor d = t.to(DType::F64);
  EXPECT_TRUE(d.is_contiguous());
  const double* dp = d.data<double>();
  EXPECT_EQ(std::vector<double>(dp, dp + 6), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor same = iota({2}).to(DType::F32);
  same.data<float>()[0] = 9;
  EXPECT_EQ(iota({2}).data<float>()[0], 0);
}

TEST(Tensor, ToRejectsUnrepresentableValuesAndBf16) {
  EXPECT_QKV_ERROR(Tensor::from<float>({2}, {1.f, NAN}).to(DType::I32), "element 1", "float32", "int32");
  EXPECT_QKV_ERROR(Tensor::from<double>({1}, {INFINITY}).to(DType::I64), "cannot be represented as int64");
  EXPECT_QKV_ERROR(Tensor::from<double>({1}, {2147483648.0}).to(DType::I32), "int32");
  EXPECT_QKV_ERROR(Tensor::from<float>({1}, {9.3e18f}).to(DType::I64), "int64");
  EXPECT_QKV_ERROR(Tensor::from<int64_t>({2}, {0, int64_t{1} << 40}).to(DType::I32), "element 1", "int64", "int32");
  EXPECT_QKV_ERROR(Tensor({2}, DType::F32).to(DType::BF16), "bfloat16", "reserved");
  EXPECT_QKV_ERROR(Tensor({2}, DType::BF16).to(DType::F32), "bfloat16", "reserved");
  EXPECT_EQ(Tensor({2}, DType::BF16).to(DType::BF16).nbytes(), 4u);
}

// A borrowed tensor reads the caller's memory in place, keeps its owner alive as long as any view
// of it lives, and never frees the memory itself.
TEST(Tensor, BorrowReadsMemoryInPlaceAndKeepsItsOwnerAlive) {
  auto buf = std::make_shared<std::vector<float>>(std::vector<float>{0, 1, 2, 3, 4, 5});
  std::weak_ptr<std::vector<float>> alive = buf;
  Tensor view;
  {
    const Tensor t = Tensor::borrow(buf->data(), {2, 3}, {3, 1}, DType::F32, buf);
    EXPECT_EQ(t.data<float>(), buf->data());
    EXPECT_TRUE(t.is_contiguous());
    view = t.transpose(0, 1);
  }
  buf.reset();
  ASSERT_FALSE(alive.expired());  // the view holds it
  EXPECT_EQ(view.contiguous().data<float>()[1], 3.0f);
  view = Tensor();
  EXPECT_TRUE(alive.expired());
  float x[4] = {1, 2, 3, 4};
  EXPECT_QKV_ERROR(Tensor::borrow(x, {2, 2}, {2, 1}, DType::F32, nullptr), "owner");
  EXPECT_QKV_ERROR(Tensor::borrow(x, {2, 2}, {-2, 1}, DType::F32, std::make_shared<int>(0)), "stride");
  EXPECT_QKV_ERROR(Tensor::borrow(x, {2}, {1, 1}, DType::F32, std::make_shared<int>(0)), "strides");
}

}  // namespace

// clone copies whole rows when the last dimension is contiguous (split between threads past
// 1 MiB) and element by element otherwise; every path gives each element where C order puts it,
// and a large zeroed tensor (zeroed in slices by every thread) is all zeros.
TEST(Tensor, CloneOfViewsPutsEveryElementInCOrder) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{3, 4, 5, 7}, std::vector<int64_t>{4, 24, 16, 320}}) {  // 1.6 KiB and 1.9 MiB
    const Tensor t = iota(shape);
    for (const std::vector<int64_t>& order : {std::vector<int64_t>{0, 2, 1, 3}, std::vector<int64_t>{1, 0, 3, 2}}) {
      const Tensor p = t.permute(order).slice(1, 1, t.permute(order).size(1));
      SCOPED_TRACE(::testing::Message() << "shape " << qkv::shape_str(shape) << " order " << order[0] << order[1]
                                        << order[2] << order[3]);
      const Tensor c = p.clone();
      ASSERT_TRUE(c.is_contiguous());
      ASSERT_EQ(c.shape(), p.shape());
      const float* q = c.data<float>();
      int64_t j = 0;
      for (int64_t a = 0; a < p.size(0); ++a)
        for (int64_t b = 0; b < p.size(1); ++b)
          for (int64_t d = 0; d < p.size(2); ++d)
            for (int64_t e = 0; e < p.size(3); ++e, ++j) ASSERT_EQ(q[j], at(p, {a, b, d, e})) << "element " << j;
    }
  }
  {
    // a block of the same size filled with ones and dropped: the zeroed tensor below reuses it
    // from the cache of large blocks, so fresh (already zero) pages cannot pass for the zeroing
    Tensor ones = Tensor::empty({3, 1000, 1000}, DType::F32);
    std::fill(ones.data<float>(), ones.data<float>() + ones.numel(), 1.0f);
  }
  const Tensor z({3, 1000, 1000}, DType::F32);
  const float* zp = z.data<float>();
  EXPECT_TRUE(std::all_of(zp, zp + z.numel(), [](float x) { return x == 0.0f; }));
}
