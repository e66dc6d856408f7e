// .safetensors reading and writing: round trips, the byte layout, BF16/F16 conversion, every
// rejection path on hand-built files, truncation and random corruption, and atomic writes.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/safetensors.h"

namespace {

namespace fs = std::filesystem;
using qkv::DType;
using qkv::SafetensorsFile;
using qkv::Tensor;
using qkv::testing::error_of;
using qkv::testing::read_bytes;
using qkv::testing::TempDir;
using qkv::testing::write_bytes;
using Named = std::vector<std::pair<std::string, Tensor>>;

// ---------------------------------------------------------------------------------------------
// Helpers

// Expects a qkv::Error whose message starts with `prefix` and contains every one of `parts`.
void expect_error(const std::string& msg, const std::string& prefix, std::initializer_list<const char*> parts,
                  const std::string& context) {
  EXPECT_EQ(msg.rfind(prefix, 0), 0u) << context << ": message should start with \"" << prefix << "\": " << msg;
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << context << ": message lacks \"" << p << "\": " << msg;
}

#define EXPECT_PARSE_ERROR(bytes, ...) \
  expect_error(error_of([&] { qkv::parse_safetensors(bytes, "bad.st"); }), "bad.st: ", {__VA_ARGS__}, #bytes)

std::string le64(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file around a hand-written header: its length, the header as given, then `data`.
std::string st(const std::string& header, const std::string& data = "") { return le64(header.size()) + header + data; }

// One header with a single tensor "w" whose entry is `entry`, over `data`.
std::string one(const std::string& entry, const std::string& data = "") { return st("{\"w\":" + entry + "}", data); }

std::string zeros(size_t n) { return std::string(n, '\0'); }

// Little-endian bytes of 16-bit values.
std::string halves(const std::vector<uint16_t>& v) {
  std::string out;
  for (uint16_t h : v) {
    out += static_cast<char>(h & 0xff);
    out += static_cast<char>(h >> 8);
  }
  return out;
}

// Deterministic values of every writable dtype.
Tensor sample(DType dt, const std::vector<int64_t>& shape) {
  Tensor t(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (dt) {
      case DType::F32: t.data<float>()[i] = static_cast<float>(static_cast<double>(i) * 0.5 - 3); break;
      case DType::F64: t.data<double>()[i] = static_cast<double>(i) * 0.25 - 1e300; break;
      case DType::I32: t.data<int32_t>()[i] = static_cast<int32_t>(i * 7 - 20); break;
      case DType::I64: t.data<int64_t>()[i] = i * 1000000000007LL - 5; break;
      case DType::Bool: t.data<bool>()[i] = i % 3 == 0; break;
      default: break;
    }
  }
  return t;
}

// The same dtype, shape and bytes.
::testing::AssertionResult same_tensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return ::testing::AssertionFailure() << a.describe() << " vs " << b.describe();
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  if (ca.nbytes() && std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) != 0)
    return ::testing::AssertionFailure() << "values differ for " << a.describe();
  return ::testing::AssertionSuccess();
}

std::vector<std::string> names_of(const SafetensorsFile& f) {
  std::vector<std::string> out;
  for (const auto& [name, t] : f.tensors) out.push_back(name);
  return out;
}

// The header text of a file (without its padding) and its length field.
std::string header_of(const std::string& file) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  std::string h = file.substr(8, n);
  while (!h.empty() && h.back() == ' ') h.pop_back();
  return h;
}

std::vector<uint32_t> bits_of(const Tensor& t) {
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(std::bit_cast<uint32_t>(t.data<float>()[i]));
  return out;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

const DType kWritable[] = {DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool};

// ---------------------------------------------------------------------------------------------
// Round trips and layout

TEST(Safetensors, RoundTripEveryWritableDtypeAndRank) {
  TempDir dir("st");
  const std::vector<std::vector<int64_t>> shapes = {{}, {1}, {7}, {3, 4}, {2, 3, 4}, {1, 2, 1, 3}};
  for (DType dt : kWritable) {
    Named tensors;
    for (size_t i = 0; i < shapes.size(); ++i)
      tensors.emplace_back(std::string("t").append(std::to_string(i)), sample(dt, shapes[i]));
    const std::string bytes = qkv::to_safetensors_bytes(tensors);
    const std::string path = dir / (std::string(qkv::dtype_name(dt)) + ".safetensors");
    qkv::write_safetensors(path, tensors);
    EXPECT_EQ(read_bytes(path), bytes) << qkv::dtype_name(dt);
    for (const SafetensorsFile& back : {qkv::parse_safetensors(bytes, "mem"), qkv::read_safetensors(path)}) {
      ASSERT_EQ(back.tensors.size(), tensors.size());
      EXPECT_TRUE(back.metadata.empty());
      for (size_t i = 0; i < tensors.size(); ++i) {
        EXPECT_EQ(back.tensors[i].first, tensors[i].first);
        EXPECT_TRUE(same_tensor(back.tensors[i].second, tensors[i].second)) << tensors[i].first;
        EXPECT_TRUE(back.tensors[i].second.is_contiguous());
      }
    }
  }
}

TEST(Safetensors, ScalarHeaderAndBytes) {
  // A 0-d tensor is written with "shape":[] and one element of data.
  const std::string b = qkv::to_safetensors_bytes({{"s", Tensor::from<double>({}, {2.5})}});
  EXPECT_EQ(header_of(b), R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})");
  double v = 0;
  std::memcpy(&v, b.data() + b.size() - 8, 8);
  EXPECT_EQ(v, 2.5);
  const SafetensorsFile f = qkv::parse_safetensors(b, "scalar");
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].second.dim(), 0);
  EXPECT_EQ(f.tensors[0].second.data<double>()[0], 2.5);
}

TEST(Safetensors, ExactBytesOfASmallFile) {
  const std::string b = qkv::to_safetensors_bytes(
      {{"a", Tensor::from<int32_t>({2}, {1, -1})}, {"b", Tensor::from<bool>({3}, {true, false, true})}},
      {{"format", "pt"}});
  std::string header = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"BOOL","shape":[3],"data_offsets":[8,11]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string expected = le64(header.size()) + header + std::string("\x01\0\0\0\xff\xff\xff\xff\x01\0\x01", 11);
  EXPECT_EQ(b, expected);
}

TEST(Safetensors, HeaderIsPaddedWithSpacesToAMultipleOf8) {
  for (size_t len = 1; len <= 17; ++len) {
    const std::string name(len, 'n');
    const std::string b = qkv::to_safetensors_bytes({{name, Tensor::from<float>({1}, {1.f})}});
    const uint64_t n = b.size() - 8 - 4;
    EXPECT_EQ(b.substr(0, 8), le64(n)) << len;
    EXPECT_EQ((8 + n) % 8, 0u) << len;
    const std::string h = header_of(b);
    EXPECT_EQ(h.back(), '}') << len;
    EXPECT_LT(n - h.size(), 8u) << len;
    EXPECT_EQ(b.substr(8 + h.size(), n - h.size()), std::string(n - h.size(), ' ')) << len;
  }
  // No tensors at all: "{}" and padding; it reads back empty.
  const std::string empty = qkv::to_safetensors_bytes({});
  EXPECT_EQ(empty, le64(8) + "{}      ");
  EXPECT_TRUE(qkv::parse_safetensors(empty, "empty").tensors.empty());
}

TEST(Safetensors, ZeroSizeTensorsKeepTheirPlace) {
  const Named tensors = {{"z1", Tensor({0}, DType::F32)},
                         {"a", sample(DType::I64, {2})},
                         {"z3", Tensor({2, 0, 3}, DType::I32)},
                         {"z2", Tensor({0, 5}, DType::Bool)},
                         {"b", sample(DType::F32, {3})}};
  const std::string b = qkv::to_safetensors_bytes(tensors);
  EXPECT_NE(header_of(b).find(R"("z3":{"dtype":"I32","shape":[2,0,3],"data_offsets":[16,16]})"), std::string::npos);
  const SafetensorsFile f = qkv::parse_safetensors(b, "zero");
  EXPECT_EQ(names_of(f), (std::vector<std::string>{"z1", "a", "z3", "z2", "b"}));
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(same_tensor(f.tensors[i].second, tensors[i].second));
  EXPECT_EQ(f.tensors[2].second.describe(), "int32 (2, 0, 3)");
}

TEST(Safetensors, NonContiguousTensorsAreWrittenContiguous) {
  const Tensor t = sample(DType::F32, {3, 4});
  const Tensor v = t.transpose(0, 1);
  ASSERT_FALSE(v.is_contiguous());
  const std::string b = qkv::to_safetensors_bytes({{"v", v}});
  EXPECT_EQ(b, qkv::to_safetensors_bytes({{"v", v.contiguous()}}));
  const SafetensorsFile f = qkv::parse_safetensors(b, "v");
  const Tensor& back = f.tensors.at(0).second;
  ASSERT_EQ(back.describe(), "float32 (4, 3)");
  // back[i][j] == t[j][i]
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(back.data<float>()[i * 3 + j], t.data<float>()[j * 4 + i]);
}

TEST(Safetensors, MetadataRoundTrip) {
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"empty", ""},
                                                   {"quote\"and\\slash", "line\nbreak\ttab"},
                                                   {"unicode", "h\xc3\xa9llo \xe2\x9c\x93"}};
  const std::string b = qkv::to_safetensors_bytes({{"w", sample(DType::F32, {2})}}, meta);
  EXPECT_EQ(header_of(b).rfind(R"({"__metadata__":{)", 0), 0u);
  const SafetensorsFile f = qkv::parse_safetensors(b, "meta");
  EXPECT_EQ(f.metadata, meta);
  EXPECT_EQ(names_of(f), std::vector<std::string>{"w"});
  // Metadata alone, no tensors.
  EXPECT_EQ(qkv::parse_safetensors(qkv::to_safetensors_bytes({}, {{"k", "v"}}), "m").metadata.at("k"), "v");
}

TEST(Safetensors, TensorsComeInDataOffsetOrderAndFindWorks) {
  // The header lists "z" first, but "a" holds the first bytes; reading follows the offsets.
  std::string data;
  for (float v : {1.f, 2.f, 3.f}) data.append(reinterpret_cast<const char*>(&v), 4);
  const std::string b = st(R"({"z":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                           R"( "__metadata__" : {"k":"v"} ,)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   )",
                           data);
  const SafetensorsFile f = qkv::parse_safetensors(b, "order");
  EXPECT_EQ(names_of(f), (std::vector<std::string>{"a", "z"}));
  ASSERT_NE(f.find("z"), nullptr);
  EXPECT_EQ(f.find("z")->data<float>()[0], 3.f);
  EXPECT_EQ(f.find("a")->data<float>()[1], 2.f);
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.find("__metadata__"), nullptr);
}

// ---------------------------------------------------------------------------------------------
// BF16 and F16: read as float32

TEST(Safetensors, Bf16IsReadAsFloat32) {
  const std::vector<uint16_t> in = {0x3F80, 0xC020, 0x4049, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x7F7F, 0x7FC1};
  const std::string b = one(R"({"dtype":"BF16","shape":[2,5],"data_offsets":[0,20]})", halves(in));
  const Tensor t = qkv::parse_safetensors(b, "bf16").tensors.at(0).second;
  ASSERT_EQ(t.describe(), "float32 (2, 5)");
  const std::vector<uint32_t> got = bits_of(t);
  EXPECT_EQ(got[0], bits(1.0f));
  EXPECT_EQ(got[1], bits(-2.5f));
  EXPECT_EQ(got[2], bits(3.140625f));
  EXPECT_EQ(got[3], bits(0.0f));
  EXPECT_EQ(got[4], bits(-0.0f));
  EXPECT_EQ(got[5], bits(std::numeric_limits<float>::infinity()));
  EXPECT_EQ(got[6], bits(-std::numeric_limits<float>::infinity()));
  EXPECT_EQ(got[7], bits(std::ldexp(1.0f, -133)));  // smallest bf16 subnormal
  EXPECT_EQ(got[8], 0x7F7F0000u);                   // largest finite bf16, 3.3895314e38
  EXPECT_EQ(got[9], 0x7FC10000u);                   // NaN keeps its payload
}

TEST(Safetensors, F16IsReadAsFloat32) {
  const std::vector<uint16_t> in = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x03FF, 0x0400,
                                    0x8000, 0x8001, 0x7C00, 0xFC00, 0x3555, 0x7E01};
  const std::string b = one(R"({"dtype":"F16","shape":[3,4],"data_offsets":[0,24]})", halves(in));
  const Tensor t = qkv::parse_safetensors(b, "f16").tensors.at(0).second;
  ASSERT_EQ(t.describe(), "float32 (3, 4)");
  const std::vector<uint32_t> got = bits_of(t);
  EXPECT_EQ(got[0], bits(1.0f));
  EXPECT_EQ(got[1], bits(-2.5f));
  EXPECT_EQ(got[2], bits(65504.0f));                      // largest finite half
  EXPECT_EQ(got[3], bits(std::ldexp(1.0f, -24)));         // smallest subnormal, 5.96e-8
  EXPECT_EQ(got[4], bits(1023 * std::ldexp(1.0f, -24)));  // largest subnormal
  EXPECT_EQ(got[5], bits(std::ldexp(1.0f, -14)));         // smallest normal
  EXPECT_EQ(got[6], bits(-0.0f));
  EXPECT_EQ(got[7], bits(-std::ldexp(1.0f, -24)));
  EXPECT_EQ(got[8], bits(std::numeric_limits<float>::infinity()));
  EXPECT_EQ(got[9], bits(-std::numeric_limits<float>::infinity()));
  EXPECT_EQ(got[10], bits(0.333251953125f));
  EXPECT_EQ(got[11], 0x7FC02000u);  // NaN keeps its payload
}

TEST(Safetensors, HalfTensorsReadFromAFileBesideOthers) {
  // F16, BF16 and I32 side by side, read through read_safetensors (pread into storage).
  TempDir dir("st");
  const std::string data = halves({0x3C00, 0xC100, 0x7BFF}) + halves({0x3F80, 0xC020}) + std::string("\x07\0\0\0", 4);
  const std::string b = st(R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},)"
                           R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[6,10]},)"
                           R"("i":{"dtype":"I32","shape":[],"data_offsets":[10,14]}})",
                           data);
  write_bytes(dir / "h.safetensors", b);
  const SafetensorsFile f = qkv::read_safetensors(dir / "h.safetensors");
  EXPECT_EQ(names_of(f), (std::vector<std::string>{"h", "b", "i"}));
  const float* h = f.find("h")->data<float>();
  EXPECT_EQ(std::vector<float>(h, h + 3), (std::vector<float>{1.0f, -2.5f, 65504.0f}));
  const float* bf = f.find("b")->data<float>();
  EXPECT_EQ(std::vector<float>(bf, bf + 2), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(f.find("i")->data<int32_t>()[0], 7);
}

// ---------------------------------------------------------------------------------------------
// Rejections, on hand-built files

TEST(SafetensorsErrors, FileTooShortAndBadHeaderLength) {
  EXPECT_PARSE_ERROR(std::string(), "file is 0 bytes", "too short");
  EXPECT_PARSE_ERROR(std::string(7, '\x02'), "file is 7 bytes", "8-byte header length");
  EXPECT_PARSE_ERROR(le64(0) + "{}", "header length is 0");
  EXPECT_PARSE_ERROR(le64(3) + "{}", "header length 3 runs past the end of the file", "2 bytes follow");
  EXPECT_PARSE_ERROR(le64(~uint64_t{0}) + "{}", "header length 18446744073709551615", "exceeds the limit of 104857600");
  EXPECT_PARSE_ERROR(le64((uint64_t{100} << 20) + 1) + "{}", "exceeds the limit");
}

TEST(SafetensorsErrors, HeaderNotAJsonObject) {
  EXPECT_PARSE_ERROR(st("{"), "header is not valid JSON");
  EXPECT_PARSE_ERROR(st("{\"w\":}"), "header is not valid JSON");
  EXPECT_PARSE_ERROR(st("{} x"), "header is not valid JSON");
  EXPECT_PARSE_ERROR(st(std::string("{}\0 junk", 7)), "header is not valid JSON", "NUL byte at offset 2");
  EXPECT_PARSE_ERROR(st("{\"\xff\":1}"), "header is not valid JSON", "UTF-8");
  EXPECT_PARSE_ERROR(st(R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,0]}})"), "not valid JSON");
  EXPECT_PARSE_ERROR(st("[]"), "header is a JSON array (expected a JSON object)");
  EXPECT_PARSE_ERROR(st("\"text\""), "header is \"text\" (expected a JSON object)");
  EXPECT_PARSE_ERROR(st("7  "), "header is 7 (expected a JSON object)");
}

TEST(SafetensorsErrors, DuplicateKeys) {
  const std::string e = R"({"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  EXPECT_PARSE_ERROR(st("{\"w\":" + e + ",\"v\":" + e + ",\"w\":" + e + "}"), "tensor 'w' appears twice");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[0],"dtype":"F64","data_offsets":[0,0]})"),
                     "duplicate key \"dtype\" in the entry of tensor 'w'");
  EXPECT_PARSE_ERROR(st(R"({"__metadata__":{"a":"1","a":"2"}})"), "duplicate key \"a\" in __metadata__");
  EXPECT_PARSE_ERROR(st(R"({"__metadata__":{},"__metadata__":{}})"), "__metadata__ appears twice in the header");
  EXPECT_PARSE_ERROR(st(R"([{"x":1,"x":2}])"), "duplicate key \"x\" in the header");
}

TEST(SafetensorsErrors, EntryMustBeAnObjectWithExactlyThreeFields) {
  EXPECT_PARSE_ERROR(one("[1, 2]"), "tensor 'w': entry is a JSON array", "dtype, shape and data_offsets");
  EXPECT_PARSE_ERROR(one("null"), "tensor 'w': entry is null");
  EXPECT_PARSE_ERROR(one(R"({"shape":[0],"data_offsets":[0,0]})"), "tensor 'w': missing field \"dtype\"");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","data_offsets":[0,0]})"), "tensor 'w': missing field \"shape\"");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[0]})"), "tensor 'w': missing field \"data_offsets\"");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[0],"data_offsets":[0,0],"extra":1})"),
                     "tensor 'w': unexpected field \"extra\"", "expected only dtype, shape and data_offsets");
}

TEST(SafetensorsErrors, UnsupportedOrMistypedDtype) {
  for (const char* dt : {"F8_E4M3", "I8", "I16", "f32", "", "F32 "}) {
    const std::string b = one(R"({"dtype":")" + std::string(dt) + R"(","shape":[0],"data_offsets":[0,0]})");
    const std::string want = "unsupported dtype \"" + std::string(dt) + "\"";
    EXPECT_PARSE_ERROR(b, "tensor 'w'", want.c_str(), "supported: F32, F64, I32, I64, BOOL, BF16, F16 or U8");
  }
  // U8 (packed weights' raw bytes) is read as bytes, never as a tensor
  EXPECT_PARSE_ERROR(one(R"({"dtype":"U8","shape":[0],"data_offsets":[0,0]})"), "tensor 'w': U8 holds raw bytes");
  EXPECT_PARSE_ERROR(one(R"({"dtype":4,"shape":[0],"data_offsets":[0,0]})"), "tensor 'w': dtype is 4",
                     "expected a string");
  EXPECT_PARSE_ERROR(one(R"({"dtype":["F32"],"shape":[0],"data_offsets":[0,0]})"), "dtype is a JSON array");
}

TEST(SafetensorsErrors, ShapeMustBeNonNegativeIntegers) {
  auto with_shape = [](const std::string& shape) {
    return one(R"({"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,0]})");
  };
  EXPECT_PARSE_ERROR(with_shape("2"), "tensor 'w': shape is 2", "expected an array of non-negative integers");
  EXPECT_PARSE_ERROR(with_shape("{}"), "tensor 'w': shape is a JSON object");
  EXPECT_PARSE_ERROR(with_shape("[2, -1]"), "tensor 'w': shape[1] is -1", "from 0 to 2^62");
  EXPECT_PARSE_ERROR(with_shape("[2.0]"), "tensor 'w': shape[0] is 2.0");
  EXPECT_PARSE_ERROR(with_shape("[\"3\"]"), "tensor 'w': shape[0] is \"3\"");
  EXPECT_PARSE_ERROR(with_shape("[[1]]"), "tensor 'w': shape[0] is a JSON array");
  EXPECT_PARSE_ERROR(with_shape("[true]"), "tensor 'w': shape[0] is true");
  EXPECT_PARSE_ERROR(with_shape("[4611686018427387905]"), "shape[0] is 4611686018427387905");
  EXPECT_PARSE_ERROR(with_shape("[18446744073709551616]"), "shape[0] is 1.8446744073709552e+19");
  // -0 is zero, as in JSON; 2^62 itself is allowed, and then fails the size check.
  EXPECT_EQ(qkv::parse_safetensors(with_shape("[-0]"), "z").tensors.at(0).second.describe(), "float32 (0,)");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"BOOL","shape":[4611686018427387904],"data_offsets":[0,0]})"),
                     "tensor 'w': BOOL (4611686018427387904,) needs 4611686018427387904 bytes");
}

TEST(SafetensorsErrors, DataOffsetsMustBeTwoOrderedNonNegativeIntegers) {
  auto with_offsets = [](const std::string& offsets) {
    return one(R"({"dtype":"F32","shape":[1],"data_offsets":)" + offsets + "}", zeros(4));
  };
  EXPECT_PARSE_ERROR(with_offsets("4"), "tensor 'w': data_offsets is 4", "[begin, end]");
  EXPECT_PARSE_ERROR(with_offsets("[0]"), "tensor 'w': data_offsets is an array of 1 elements");
  EXPECT_PARSE_ERROR(with_offsets("[0, 4, 8]"), "tensor 'w': data_offsets is an array of 3 elements");
  EXPECT_PARSE_ERROR(with_offsets("[-1, 4]"), "tensor 'w': data_offsets[0] is -1", "non-negative integer");
  EXPECT_PARSE_ERROR(with_offsets("[0, 4.0]"), "tensor 'w': data_offsets[1] is 4.0");
  EXPECT_PARSE_ERROR(with_offsets("[0, null]"), "tensor 'w': data_offsets[1] is null");
  EXPECT_PARSE_ERROR(with_offsets("[4, 0]"), "tensor 'w': data_offsets [4, 0] has begin > end");
}

TEST(SafetensorsErrors, SizeMustMatchShapeWithoutOverflow) {
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", zeros(20)),
                     "tensor 'w': F32 (2, 3) needs 24 bytes but data_offsets [0, 20] hold 20");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"BF16","shape":[3],"data_offsets":[0,12]})", zeros(12)),
                     "tensor 'w': BF16 (3,) needs 6 bytes");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"I64","shape":[],"data_offsets":[0,0]})"), "tensor 'w': I64 () needs 8 bytes");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[4611686018427387904,2],"data_offsets":[0,0]})"),
                     "tensor 'w': shape (4611686018427387904, 2) is too large", "element count overflows");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,0]})"),
                     "tensor 'w': shape (2305843009213693952,) of F32 is too large", "byte count overflows");
  // Zero elements, but strides that could not be represented.
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]})"),
                     "tensor 'w': shape (0, 4611686018427387904, 4611686018427387904) is too large");
}

TEST(SafetensorsErrors, RangesMustTileTheDataSectionExactly) {
  const std::string a4 = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  // Past the end of the data section.
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})", zeros(6)),
                     "tensor 'w': data_offsets [4, 8] run past the end of the data section (6 bytes)");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]})"),
                     "tensor 'w': F32 (1,) needs 4 bytes");
  // A gap before the first tensor, and between two.
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})", zeros(8)),
                     "gap of 4 unused bytes before tensor 'w'", "expected it to begin at 0");
  EXPECT_PARSE_ERROR(st("{" + a4 + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[6,10]}})", zeros(10)),
                     "gap of 2 unused bytes before tensor 'b'", "begin at 4");
  // Overlap, including the same range twice and a zero-size tensor inside another.
  EXPECT_PARSE_ERROR(st("{" + a4 + R"(,"b":{"dtype":"I32","shape":[1],"data_offsets":[2,6]}})", zeros(6)),
                     "tensor 'b' (data_offsets [2, 6]) overlaps tensor 'a' (data_offsets [0, 4])");
  EXPECT_PARSE_ERROR(st("{" + a4 + R"(,"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", zeros(4)),
                     "overlaps tensor");
  EXPECT_PARSE_ERROR(st("{" + a4 + R"(,"z":{"dtype":"I32","shape":[0],"data_offsets":[2,2]}})", zeros(4)),
                     "tensor 'z' (data_offsets [2, 2]) overlaps tensor 'a'");
  // Trailing bytes after the last tensor, and data with no tensors.
  EXPECT_PARSE_ERROR(st("{" + a4 + "}", zeros(7)), "3 trailing bytes after the last tensor", "tensors end at 4");
  EXPECT_PARSE_ERROR(st("{}", "x"), "1 trailing bytes after the last tensor");
  // Zero-size tensors at the start, middle and end are fine.
  const std::string ok = st(R"({"z0":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)" + a4 +
                                R"(,"z4":{"dtype":"F64","shape":[3,0],"data_offsets":[4,4]}})",
                            zeros(4));
  EXPECT_EQ(names_of(qkv::parse_safetensors(ok, "ok")), (std::vector<std::string>{"z0", "a", "z4"}));
}

TEST(SafetensorsErrors, MetadataMustBeAnObjectOfStrings) {
  EXPECT_PARSE_ERROR(st(R"({"__metadata__":"x"})"), "__metadata__ is \"x\" (expected an object of strings)");
  EXPECT_PARSE_ERROR(st(R"({"__metadata__":["x"]})"), "__metadata__ is a JSON array");
  EXPECT_PARSE_ERROR(st(R"({"__metadata__":{"ok":"1","n":1}})"), "__metadata__ value of \"n\" is 1",
                     "expected a string");
  EXPECT_PARSE_ERROR(st(R"({"__metadata__":{"n":null}})"), "__metadata__ value of \"n\" is null");
  EXPECT_PARSE_ERROR(st(R"({"__metadata__":{"n":{"deep":"x"}}})"), "__metadata__ value of \"n\" is a JSON object");
}

TEST(SafetensorsErrors, EmptyTensorNameAndOddNames) {
  EXPECT_PARSE_ERROR(st(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"), "a tensor has an empty name");
  // Control characters in a name are escaped in messages.
  EXPECT_PARSE_ERROR(st(R"({"a\nb":{"dtype":"X","shape":[0],"data_offsets":[0,0]}})"), "tensor 'a\\x0ab'");
  // Any other UTF-8 name is fine.
  const SafetensorsFile f =
      qkv::parse_safetensors(st(R"({"layer.0/w\u00e9":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"), "utf8");
  EXPECT_EQ(names_of(f), std::vector<std::string>{"layer.0/w\xc3\xa9"});
}

TEST(SafetensorsErrors, BoolBytesMustBeZeroOrOne) {
  const std::string h = R"({"dtype":"BOOL","shape":[4],"data_offsets":[0,4]})";
  const Tensor t = qkv::parse_safetensors(one(h, std::string("\0\1\1\0", 4)), "ok").tensors.at(0).second;
  EXPECT_EQ(t.describe(), "bool (4,)");
  EXPECT_EQ(t.data<bool>()[1], true);
  EXPECT_EQ(t.data<bool>()[3], false);
  EXPECT_PARSE_ERROR(one(h, std::string("\0\1\2\0", 4)), "tensor 'w': BOOL element 2 has byte value 2",
                     "expected 0 or 1");
  EXPECT_PARSE_ERROR(one(h, std::string("\xff\0\0\0", 4)), "BOOL element 0 has byte value 255");
}

TEST(SafetensorsErrors, DeeplyNestedHeadersAreCleanErrors) {
  const int depth = 200000;
  EXPECT_PARSE_ERROR(st("{\"w\":" + std::string(depth, '[')), "header is not valid JSON");
  EXPECT_PARSE_ERROR(st("{\"w\":" + std::string(depth, '[') + std::string(depth, ']') + "}"),
                     "tensor 'w': entry is a JSON array");
  EXPECT_PARSE_ERROR(one(R"({"dtype":"F32","shape":)" + std::string(depth, '[') + std::string(depth, ']') +
                         R"(,"data_offsets":[0,0]})"),
                     "tensor 'w': shape[0] is a JSON array");
}

TEST(SafetensorsErrors, EveryTruncationIsACleanError) {
  const std::string good =
      qkv::to_safetensors_bytes({{"w", sample(DType::F32, {2, 3})}, {"m", sample(DType::Bool, {5})}}, {{"k", "v"}});
  for (size_t n = 0; n < good.size(); ++n) {
    const std::string m = error_of([&] { qkv::parse_safetensors(good.substr(0, n), "cut.st"); });
    EXPECT_EQ(m.rfind("cut.st: ", 0), 0u) << "prefix of " << n << " bytes: " << m;
  }
  EXPECT_PARSE_ERROR(good + "z", "1 trailing bytes");
}

TEST(SafetensorsErrors, RandomCorruptionNeverCrashes) {
  const std::string good = qkv::to_safetensors_bytes(
      {{"w", sample(DType::F32, {2, 3})}, {"flags", sample(DType::Bool, {5})}, {"idx", sample(DType::I64, {2})}},
      {{"format", "pt"}});
  // Odd iterations overwrite arbitrary bytes (mostly caught by the JSON parser); even ones
  // rewrite digits of the header, which keeps it valid JSON and so reaches the checks on
  // shapes, sizes and offsets.
  std::vector<size_t> digits;
  for (size_t i = 8; i < 8 + header_of(good).size(); ++i)
    if (good[i] >= '0' && good[i] <= '9') digits.push_back(i);
  const char interesting[] = {'\0', '\x01', '\xff', '{', '}', '[', ']', '"', ':', ',', '-', '0', '9', 'e', '.', ' '};
  std::mt19937 rng(20240531);
  int parsed = 0, rejected = 0, rejected_tensor = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string b = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      if (iter % 2 == 0) {
        b[digits[rng() % digits.size()]] = static_cast<char>('0' + rng() % 10);
      } else {
        const size_t at = rng() % b.size();
        b[at] = rng() % 2 ? static_cast<char>(rng() & 0xff) : interesting[rng() % sizeof interesting];
      }
    }
    if (rng() % 10 == 0) b.resize(rng() % b.size());
    try {
      const SafetensorsFile f = qkv::parse_safetensors(b, "fuzz.st");
      for (const auto& [name, t] : f.tensors) EXPECT_TRUE(t.defined()) << name;
      ++parsed;
    } catch (const qkv::Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("fuzz.st: ", 0), 0u) << "iteration " << iter << ": " << m;
      ++rejected;
      rejected_tensor += m.find("tensor '") != std::string::npos;
    }
  }
  // Both outcomes happen, and many rejections come from the per-tensor checks.
  EXPECT_GT(parsed, 50);
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(rejected_tensor, 300);
}

// ---------------------------------------------------------------------------------------------
// Files: reading errors and atomic writes

TEST(SafetensorsFiles, UnreadableAndTruncatedFiles) {
  TempDir dir("st");
  const std::string missing = dir / "nope.safetensors";
  expect_error(error_of([&] { qkv::read_safetensors(missing); }), missing + ": ", {"cannot open", "No such file"},
               "missing");
  const std::string d = dir / "";
  expect_error(error_of([&] { qkv::read_safetensors(d); }), d + ": ", {"is a directory"}, "directory");

  const std::string path = dir / "t.safetensors";
  qkv::write_safetensors(path, {{"a", sample(DType::F64, {4, 4})}, {"b", sample(DType::I32, {3})}});
  const uint64_t size = fs::file_size(path);
  const uint64_t data_at = size - 4 * 4 * 8 - 3 * 4;
  ASSERT_EQ(data_at % 8, 0u);
  const std::vector<std::pair<uint64_t, const char*>> cuts = {
      {size - 1, "tensor 'b': data_offsets [128, 140] run past the end of the data section (139 bytes)"},
      {data_at + 5, "tensor 'a': data_offsets [0, 128] run past the end of the data section (5 bytes)"},
      {data_at, "data section (0 bytes)"},
      {data_at - 1, "runs past the end of the file"},
      {8, "runs past the end of the file (0 bytes follow"},
      {5, "file is 5 bytes"},
      {0, "file is 0 bytes"}};
  for (const auto& [len, what] : cuts) {
    fs::resize_file(path, len);
    expect_error(error_of([&] { qkv::read_safetensors(path); }), path + ": ", {what}, std::to_string(len));
  }
  // A file that is too long has trailing bytes.
  qkv::write_safetensors(path, {{"a", sample(DType::F64, {4, 4})}});
  fs::resize_file(path, fs::file_size(path) + 3);
  expect_error(error_of([&] { qkv::read_safetensors(path); }), path + ": ", {"3 trailing bytes"}, "extended");
}

TEST(SafetensorsFiles, WriteIntoMissingDirectoryFailsAndLeavesNothing) {
  TempDir dir("st");
  const std::string path = dir / "no/such/dir/out.safetensors";
  expect_error(error_of([&] {
                 qkv::write_safetensors(path, {{"w", sample(DType::F32, {2})}});
               }),
               path + ": ", {"cannot write", "No such file"}, "missing dir");
  EXPECT_FALSE(fs::exists(dir / "no"));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(SafetensorsFiles, OverwriteReplacesTheWholeFileAndLeavesNoTemporaries) {
  TempDir dir("st");
  const std::string path = dir / "m.safetensors";
  write_bytes(path, std::string(100000, 'x'));  // longer than what replaces it
  const Named tensors = {{"w", sample(DType::F32, {3, 2})}, {"n", sample(DType::I64, {})}};
  qkv::write_safetensors(path, tensors, {{"step", "7"}});
  EXPECT_EQ(read_bytes(path), qkv::to_safetensors_bytes(tensors, {{"step", "7"}}));
  const SafetensorsFile f = qkv::read_safetensors(path);
  EXPECT_EQ(f.metadata.at("step"), "7");
  EXPECT_TRUE(same_tensor(*f.find("w"), tensors[0].second));
  EXPECT_TRUE(same_tensor(*f.find("n"), tensors[1].second));
  qkv::write_safetensors(path, {{"only", sample(DType::Bool, {4})}});
  EXPECT_EQ(names_of(qkv::read_safetensors(path)), std::vector<std::string>{"only"});
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.safetensors"});
}

TEST(SafetensorsFiles, UnwritableInputsFailAndLeaveTheTargetAlone) {
  TempDir dir("st");
  const std::string path = dir / "keep.safetensors";
  const std::string original = qkv::to_safetensors_bytes({{"w", sample(DType::F32, {4})}});
  write_bytes(path, original);
  const Tensor t = sample(DType::F32, {2});
  const std::vector<std::pair<Named, std::vector<const char*>>> cases = {
      {{{"", t}}, {"empty name"}},
      {{{"a", t}, {"b", t}, {"a", t}}, {"tensor 'a' appears twice"}},
      {{{"__metadata__", t}}, {"\"__metadata__\" is reserved"}},
      {{{"u", Tensor()}}, {"tensor 'u' is undefined"}},
      {{{"h", Tensor({3}, DType::BF16)}}, {"tensor 'h' is bfloat16 (3,)", "expected float32, float64"}},
      {{{"bad\xff", t}}, {"tensor name 'bad\xff' is not valid UTF-8"}},
  };
  for (const auto& [tensors, parts] : cases) {
    const std::string m = error_of([&] { qkv::write_safetensors(path, tensors); });
    EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << m;
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "lacks \"" << p << "\": " << m;
    EXPECT_EQ(read_bytes(path), original);
  }
  expect_error(error_of([&] {
                 qkv::to_safetensors_bytes({{"w", t}}, {{"k", "\xc3"}});
               }),
               "to_safetensors_bytes: ", {"metadata value", "not valid UTF-8"}, "metadata");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.safetensors"});
}

}  // namespace

// Entries given as bytes (packed weights): any readable dtype, U8 included, read back byte for
// byte by SafetensorsReader::read_bytes; BF16 entries read as float32 too; a byte count that does
// not match the shape is refused before anything is written.
TEST(SafetensorsFiles, EntriesOfBytesRoundTrip) {
  TempDir dir("st_entries");
  const std::string blocks = std::string("\x01\x02\x03\x04\x05\x06", 6);
  const uint16_t bf[2] = {0x3f80, 0xc000};  // 1.0, -2.0
  const std::string halves(reinterpret_cast<const char*>(bf), sizeof bf);
  const std::string path = dir / "e.safetensors";
  qkv::write_safetensors(path, std::vector<qkv::SafetensorsEntry>{{"q", "U8", {2, 3}, blocks}, {"h", "BF16", {2}, halves}},
                         {{"k", "v"}});
  const qkv::SafetensorsReader r(path);
  ASSERT_NE(r.find("q"), nullptr);
  EXPECT_EQ(r.find("q")->dtype, "U8");
  EXPECT_EQ(r.find("q")->bytes, 6u);
  std::string back(6, '\0');
  r.read_bytes("q", back.data(), 6);
  EXPECT_EQ(back, blocks);
  float h[2];
  r.read_f32("h", h);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_NE(error_of([&] { r.read_bytes("q", back.data(), 5); }).find("holds 6 bytes, not 5"), std::string::npos);
  EXPECT_NE(error_of([&] { r.read_f32("q", h); }).find("is U8; expected floating point"), std::string::npos);
  EXPECT_NE(error_of([&] { qkv::read_safetensors(path); }).find("tensor 'q': U8 holds raw bytes"), std::string::npos);
  const std::string bad = dir / "bad.safetensors";
  EXPECT_NE(error_of([&] {
              qkv::write_safetensors(bad, std::vector<qkv::SafetensorsEntry>{{"q", "U8", {2, 4}, blocks}});
            }).find("'q' U8 (2, 4) needs 8 bytes, given 6"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              qkv::write_safetensors(bad, std::vector<qkv::SafetensorsEntry>{{"q", "Q8", {6}, blocks}});
            }).find("has dtype 'Q8'"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(bad));
}
