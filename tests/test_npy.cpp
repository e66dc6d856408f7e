// .npy reading and writing: round trips, byte-for-byte agreement with NumPy, Fortran order, every
// rejection path, and atomic writes that leave the target alone when they fail.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/files.h"
#include "qkv/npy.h"

namespace {

namespace fs = std::filesystem;
using qkv::DType;
using qkv::testing::read_bytes;
using qkv::testing::TempDir;
using qkv::testing::write_bytes;
using qkv::Tensor;
using namespace std::string_literals;

const char kPython[] = "/usr/bin/python3";  // the system Python, which has NumPy (the one on PATH may not)

// ---------------------------------------------------------------------------------------------
// Helpers

// Runs `script` with the system Python and NumPy; returns the exit status.
int run_python(const TempDir& dir, const std::string& script) {
  const std::string file = dir / "script.py";
  write_bytes(file, script);
  const std::string cmd = std::string(kPython) + " " + file + " > " + (dir / "python.log") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) ADD_FAILURE() << "python failed (" << rc << "):\n" << read_bytes(dir / "python.log");
  return rc;
}

using qkv::testing::error_of;

// Expects a qkv::Error whose message starts with `prefix` and contains every one of `parts`.
void expect_error(const std::string& msg, const std::string& prefix, std::initializer_list<const char*> parts,
                  const std::string& context) {
  EXPECT_EQ(msg.rfind(prefix, 0), 0u) << context << ": message should start with \"" << prefix << "\": " << msg;
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << context << ": message lacks \"" << p << "\": " << msg;
}

#define EXPECT_PARSE_ERROR(bytes, ...) \
  expect_error(error_of([&] { qkv::parse_npy(bytes, "bad.npy"); }), "bad.npy: ", {__VA_ARGS__}, #bytes)

// A .npy file around a hand-written header dict: magic, version, little-endian length, the dict
// padded with spaces (unless pad is false) and a newline, then `data`.
std::string npy(const std::string& dict, const std::string& data = "", int major = 1, bool pad = true) {
  const size_t len_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  if (pad) header.append((64 - (6 + 2 + len_bytes + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string f32_header(const std::string& shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
}

const char* code_of(DType t) {
  switch (t) {
    case DType::F32: return "f4";
    case DType::F64: return "f8";
    case DType::I32: return "i4";
    case DType::I64: return "i8";
    case DType::Bool: return "b1";
    default: return "??";
  }
}

const DType kDtypes[] = {DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool};

// Deterministic values; the Python twin below (PY_SAMPLE) computes the same ones.
Tensor sample(DType dt, const std::vector<int64_t>& shape) {
  Tensor t(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (dt) {
      case DType::F32: t.data<float>()[i] = static_cast<float>(static_cast<double>(i) * 0.5 - 3); break;
      case DType::F64: t.data<double>()[i] = static_cast<double>(i) * 0.5 - 3; break;
      case DType::I32: t.data<int32_t>()[i] = static_cast<int32_t>(i * 7 - 20); break;
      case DType::I64: t.data<int64_t>()[i] = i * 1000000000007LL - 5; break;
      case DType::Bool: t.data<bool>()[i] = i % 3 == 0; break;
      default: break;
    }
  }
  return t;
}

const char kPySample[] = R"(
import sys, os
import numpy as np
def sample(code, shape):
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    if code == 'f4': v = (i * 0.5 - 3).astype(np.float32)
    elif code == 'f8': v = i * 0.5 - 3
    elif code == 'i4': v = (i * 7 - 20).astype(np.int32)
    elif code == 'i8': v = i * 1000000000007 - 5
    else: v = (i % 3) == 0
    return v.reshape(shape)
)";

std::string case_name(DType dt, const std::vector<int64_t>& shape) {
  std::string s = std::string(code_of(dt)) + "_";
  if (shape.empty()) return s + "scalar";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s;
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

const std::vector<std::vector<int64_t>> kShapes = {
    {},
    {0},
    {7},
    {1},
    {3, 4},
    {0, 5},
    {2, 0, 3},
    {2, 3, 4},
    {1, 2, 3, 4},
    {2, 1, 3, 2},
    {0, 0, 0, 0},
    {1000},
    {12345678901, 0},                             // many digits in the first axis (NumPy's growth padding)
    {0, 1, 1, 100, 100, 100, 100, 100, 100, 100}  // header already a multiple of 64: NumPy adds a full line
};

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(Npy, RoundTripEveryDtypeAndRank) {
  TempDir dir("npy");
  for (DType dt : kDtypes) {
    for (const auto& shape : kShapes) {
      const Tensor t = sample(dt, shape);
      const std::string bytes = qkv::to_npy_bytes(t);
      const std::string name = case_name(dt, shape);
      ASSERT_EQ((bytes.size() - t.nbytes()) % 64, 0u) << name << ": data must start at a multiple of 64";
      EXPECT_EQ(bytes[6], 1) << name;
      EXPECT_EQ(bytes[bytes.size() - t.nbytes() - 1], '\n') << name;
      EXPECT_TRUE(same_tensor(qkv::parse_npy(bytes, name), t)) << name;

      const std::string path = dir / (name + ".npy");
      qkv::write_npy(path, t);
      EXPECT_EQ(read_bytes(path), bytes) << name;
      const Tensor back = qkv::read_npy(path);
      EXPECT_TRUE(same_tensor(back, t)) << name;
      EXPECT_TRUE(back.is_contiguous()) << name;
    }
  }
}

TEST(Npy, HeaderLayout) {
  const std::string b = qkv::to_npy_bytes(Tensor({2, 3}, DType::F32));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(b.size(), 128u + 24u);
  EXPECT_EQ(b.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<unsigned char>(b[8]) | static_cast<unsigned char>(b[9]) << 8, 118);
  EXPECT_EQ(b.substr(10, dict.size()), dict);
  EXPECT_EQ(b.substr(10 + dict.size(), 128 - 11 - dict.size()), std::string(128 - 11 - dict.size(), ' '));
  EXPECT_EQ(b[127], '\n');
  EXPECT_NE(qkv::to_npy_bytes(Tensor({}, DType::Bool)).find("'descr': '|b1', 'fortran_order': False, 'shape': (), }"),
            std::string::npos);
  EXPECT_NE(qkv::to_npy_bytes(Tensor({5}, DType::I64)).find("'descr': '<i8', 'fortran_order': False, 'shape': (5,), }"),
            std::string::npos);
}

TEST(Npy, NonContiguousTensorsAreWrittenAsTheirContiguousCopy) {
  const Tensor t = sample(DType::I32, {3, 4, 5});
  const Tensor v = t.permute({2, 0, 1}).slice(1, 1, 3);
  ASSERT_FALSE(v.is_contiguous());
  const Tensor back = qkv::parse_npy(qkv::to_npy_bytes(v), "v");
  EXPECT_TRUE(same_tensor(back, v.contiguous()));
  EXPECT_EQ(qkv::to_npy_bytes(v), qkv::to_npy_bytes(v.contiguous()));
}

TEST(Npy, HugeHeaderSwitchesToVersion2) {
  // 30000 dimensions of size 1: the header no longer fits a 16-bit length.
  const Tensor t = sample(DType::F64, std::vector<int64_t>(30000, 1));
  const std::string b = qkv::to_npy_bytes(t);
  EXPECT_EQ(b[6], 2);
  EXPECT_EQ(b[7], 0);
  const uint32_t hlen = static_cast<unsigned char>(b[8]) | static_cast<unsigned char>(b[9]) << 8 |
                        static_cast<unsigned char>(b[10]) << 16 |
                        static_cast<uint32_t>(static_cast<unsigned char>(b[11])) << 24;
  EXPECT_GT(hlen, 65535u);
  EXPECT_EQ(12 + hlen + 8, b.size());
  EXPECT_EQ((12 + hlen) % 64, 0u);
  EXPECT_TRUE(same_tensor(qkv::parse_npy(b, "big"), t));
}

TEST(Npy, ToleratedHeaderSpellings) {
  const std::string data(24, '\0');
  const std::vector<std::string> dicts = {
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
      "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
      "{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 2 , 3 , ) , }",
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,3)}",
      "{'descr': '=f4', 'fortran_order': False, 'shape': (2, 3)}",
      "{'descr':'<f4',\n'fortran_order':False,\t'shape':(2,3),}",
  };
  for (const std::string& d : dicts) {
    for (int major : {1, 2, 3}) {
      for (bool pad : {true, false}) {
        const std::string ctx = d + " v" + std::to_string(major) + (pad ? " padded" : "");
        try {
          const Tensor t = qkv::parse_npy(npy(d, data, major, pad), "ok.npy");
          EXPECT_EQ(t.describe(), "float32 (2, 3)") << ctx;
        } catch (const qkv::Error& e) {
          ADD_FAILURE() << ctx << ": " << e.what();
        }
      }
    }
  }
  EXPECT_EQ(qkv::parse_npy(npy(f32_header("()"), std::string(4, '\0')), "x").dim(), 0);
  EXPECT_EQ(qkv::parse_npy(npy(f32_header("(6,)"), data), "x").describe(), "float32 (6,)");
  EXPECT_EQ(qkv::parse_npy(npy("{'descr': '=i8', 'fortran_order': False, 'shape': (3,)}", data), "x").describe(),
            "int64 (3,)");
}

TEST(Npy, FortranOrderIsReturnedInCOrder) {
  // A (2, 3) int32 array in Fortran order stores its columns: 0 3 | 1 4 | 2 5.
  std::string data;
  for (int32_t v : {0, 3, 1, 4, 2, 5}) data.append(reinterpret_cast<const char*>(&v), 4);
  const Tensor t = qkv::parse_npy(npy("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }", data), "f");
  ASSERT_EQ(t.describe(), "int32 (2, 3)");
  EXPECT_TRUE(t.is_contiguous());
  const int32_t* p = t.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(p, p + 6), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  // 1-d and 0-d Fortran arrays are the same as C arrays.
  EXPECT_EQ(
      qkv::parse_npy(npy("{'descr': '<i4', 'fortran_order': True, 'shape': (6,), }", data), "f").data<int32_t>()[1], 3);
  EXPECT_EQ(
      qkv::parse_npy(npy("{'descr': '<i4', 'fortran_order': True, 'shape': (), }", data.substr(0, 4)), "f").numel(), 1);
  EXPECT_EQ(qkv::parse_npy(npy("{'descr': '<i4', 'fortran_order': True, 'shape': (0, 3), }"), "f").describe(),
            "int32 (0, 3)");
}

// ---------------------------------------------------------------------------------------------
// Agreement with NumPy (the system /usr/bin/python3 must have NumPy; that is a test requirement)

std::string python_cases() {
  std::string s = "CASES = [";
  for (DType dt : kDtypes)
    for (const auto& shape : kShapes) s += "('" + std::string(code_of(dt)) + "', " + qkv::shape_str(shape) + "), ";
  return s + "]\n";
}

std::string python_name_fn() {
  return "def name(code, shape):\n"
         "    return code + '_' + ('x'.join(str(d) for d in shape) if len(shape) else 'scalar')\n";
}

TEST(NpyNumpy, OurBytesEqualNumpysAndWeReadThem) {
  TempDir dir("npy");
  const std::string script = std::string(kPySample) + python_cases() + python_name_fn() +
                             "d = sys.argv[1] if len(sys.argv) > 1 else '" + dir.path().string() +
                             "'\n"
                             "for code, shape in CASES:\n"
                             "    np.save(os.path.join(d, 'np_' + name(code, shape) + '.npy'), sample(code, shape))\n";
  ASSERT_EQ(run_python(dir, script), 0) << "needs " << kPython << " with NumPy";
  for (DType dt : kDtypes) {
    for (const auto& shape : kShapes) {
      const std::string path = dir / ("np_" + case_name(dt, shape) + ".npy");
      const std::string theirs = read_bytes(path);
      ASSERT_FALSE(theirs.empty()) << path;
      const Tensor expected = sample(dt, shape);
      const std::string ours = qkv::to_npy_bytes(expected);
      const size_t header = theirs.size() - expected.nbytes();
      EXPECT_EQ(ours.substr(0, header), theirs.substr(0, header)) << case_name(dt, shape) << ": header differs";
      EXPECT_EQ(ours, theirs) << case_name(dt, shape);
      EXPECT_TRUE(same_tensor(qkv::read_npy(path), expected)) << path;
    }
  }
}

TEST(NpyNumpy, NumpyReadsOurFiles) {
  TempDir dir("npy");
  for (DType dt : kDtypes) {
    for (const auto& shape : kShapes) {
      // Same values, but stored column-major, so the writer has to make the contiguous copy.
      const Tensor t = sample(dt, shape);
      const Tensor v = shape.size() >= 2 ? t.transpose(0, 1).contiguous().transpose(0, 1) : t;
      qkv::write_npy(dir / ("ours_" + case_name(dt, shape) + ".npy"), v);
    }
  }
  const std::string script =
      std::string(kPySample) + python_cases() + python_name_fn() + "d = '" + dir.path().string() + "'\n" +
      "want = {'f4': np.float32, 'f8': np.float64, 'i4': np.int32, 'i8': np.int64, 'b1': np.bool_}\n"
      "bad = 0\n"
      "for code, shape in CASES:\n"
      "    p = os.path.join(d, 'ours_' + name(code, shape) + '.npy')\n"
      "    a = np.load(p)\n"
      "    e = sample(code, shape)\n"
      "    if a.dtype != want[code] or a.shape != tuple(shape) or not np.array_equal(a, e):\n"
      "        print('mismatch', p, a.dtype, a.shape); bad += 1\n"
      "sys.exit(1 if bad else 0)\n";
  EXPECT_EQ(run_python(dir, script), 0);
}

TEST(NpyNumpy, FortranOrderAndVersions2And3FromNumpy) {
  TempDir dir("npy");
  const std::vector<std::vector<int64_t>> shapes = {{2, 3}, {2, 3, 4}, {3, 1, 2, 2}, {4, 5}};
  std::string cases = "FCASES = [";
  for (DType dt : kDtypes)
    for (const auto& s : shapes) cases += "('" + std::string(code_of(dt)) + "', " + qkv::shape_str(s) + "), ";
  cases += "]\n";
  const std::string script = std::string(kPySample) + cases + python_name_fn() + "d = '" + dir.path().string() + "'\n" +
                             "for code, shape in FCASES:\n"
                             "    a = np.asfortranarray(sample(code, shape))\n"
                             "    assert a.flags.f_contiguous and not a.flags.c_contiguous\n"
                             "    np.save(os.path.join(d, 'fo_' + name(code, shape) + '.npy'), a)\n"
                             "    for v in (2, 3):\n"
                             "        with open(os.path.join(d, 'v%d_' % v + name(code, shape) + '.npy'), 'wb') as f:\n"
                             "            np.lib.format.write_array(f, sample(code, shape), version=(v, 0))\n";
  ASSERT_EQ(run_python(dir, script), 0) << "needs " << kPython << " with NumPy";
  for (DType dt : kDtypes) {
    for (const auto& shape : shapes) {
      const std::string name = case_name(dt, shape);
      const std::string fo = dir / ("fo_" + name + ".npy");
      ASSERT_NE(read_bytes(fo).find("'fortran_order': True"), std::string::npos) << fo;
      const Tensor t = qkv::read_npy(fo);
      EXPECT_TRUE(t.is_contiguous()) << fo;
      EXPECT_TRUE(same_tensor(t, sample(dt, shape))) << fo;
      for (int v : {2, 3}) {
        const std::string p = dir / (std::string(v == 2 ? "v2_" : "v3_") + name + ".npy");
        ASSERT_EQ(read_bytes(p)[6], v) << p;
        EXPECT_TRUE(same_tensor(qkv::read_npy(p), sample(dt, shape))) << p;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Rejections: every message starts with the file name and says what was expected

TEST(NpyErrors, MagicVersionAndHeaderLength) {
  const std::string good = npy(f32_header("(2, 3)"), std::string(24, '\0'));
  EXPECT_PARSE_ERROR(std::string(), "empty file");
  EXPECT_PARSE_ERROR(std::string("hello, this is not numpy"), "not a .npy file", "\\x93NUMPY");
  EXPECT_PARSE_ERROR("\x93NUMPX" + good.substr(6), "not a .npy file");
  EXPECT_PARSE_ERROR(good.substr(0, 3), "truncated");
  EXPECT_PARSE_ERROR(good.substr(0, 6), "truncated");
  EXPECT_PARSE_ERROR(good.substr(0, 8), "truncated .npy header");
  EXPECT_PARSE_ERROR(good.substr(0, 9), "truncated .npy header");
  EXPECT_PARSE_ERROR(npy(f32_header("(2, 3)"), "", 2).substr(0, 11), "truncated .npy header");
  std::string v4 = good;
  v4[6] = 4;
  EXPECT_PARSE_ERROR(v4, "unsupported .npy format version 4.0", "expected 1.0, 2.0 or 3.0");
  std::string v11 = good;
  v11[7] = 1;
  EXPECT_PARSE_ERROR(v11, "version 1.1");
  // A header length beyond the end of the file, and one that eats part of the file.
  std::string long_len = good;
  long_len[8] = static_cast<char>(0xe8);
  long_len[9] = 0x03;  // 1000
  EXPECT_PARSE_ERROR(long_len, "header length 1000 runs past the end of the file");
  std::string v2 = npy(f32_header("(2, 3)"), std::string(24, '\0'), 2);
  v2[11] = 0x7f;
  EXPECT_PARSE_ERROR(v2, "runs past the end");
  EXPECT_PARSE_ERROR(good.substr(0, 100), "runs past the end");
}

TEST(NpyErrors, UnsupportedDtypes) {
  const auto with = [](const std::string& descr) {
    return npy("{'descr': " + descr + ", 'fortran_order': False, 'shape': (2,), }", std::string(16, '\0'));
  };
  const std::string expected = "(expected little-endian float32, float64, int32, int64 or bool";
  const std::string big = qkv::detail::concat("bad.npy: unsupported dtype '>f4' ", expected);
  const std::string msg = error_of([&] { qkv::parse_npy(with("'>f4'"), "bad.npy"); });
  EXPECT_EQ(msg.rfind(big, 0), 0u) << msg;
  for (const char* d :
       {"'>f8'", "'<f2'", "'|O'", "'<u2'", "'<b1'", "'|u1'", "'<c8'", "'<U3'", "'f4'", "'<f4 '", "''"}) {
    const std::string m = error_of([&] { qkv::parse_npy(with(d), "bad.npy"); });
    expect_error(m, "bad.npy: unsupported dtype ", {expected.c_str()}, d);
    EXPECT_NE(m.find(d), std::string::npos) << m;
  }
  EXPECT_PARSE_ERROR(with("[('a', '<f4'), ('b', '<i4')]"), "unsupported dtype", "structured");
  EXPECT_PARSE_ERROR(with("3"), "expected a quoted dtype string");
}

TEST(NpyErrors, BadShapes) {
  EXPECT_PARSE_ERROR(npy(f32_header("(-1, 3)")), "negative dimension -1", "non-negative");
  EXPECT_PARSE_ERROR(npy(f32_header("(4611686018427387904, 4611686018427387904)")), "too large",
                     "(4611686018427387904, 4611686018427387904)");
  EXPECT_PARSE_ERROR(npy(f32_header("(1152921504606846976, 4)")), "too large", "byte count");
  EXPECT_PARSE_ERROR(npy(f32_header("(0, 4611686018427387904, 4611686018427387904)")), "too large");
  EXPECT_PARSE_ERROR(npy(f32_header("(99999999999999999999,)")), "does not fit in int64");
  EXPECT_PARSE_ERROR(npy(f32_header("(3)")), "not a tuple", "(n,)");
  EXPECT_PARSE_ERROR(npy(f32_header("[2, 3]")), "tuple");
  EXPECT_PARSE_ERROR(npy(f32_header("(2.0, 3)")), "non-negative integer");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3}"), "expected ',' or ')'");
  EXPECT_PARSE_ERROR(npy(f32_header("(2,, 3)")), "non-negative integer");
  EXPECT_PARSE_ERROR(npy(f32_header("(+2,)")), "non-negative integer");
}

TEST(NpyErrors, DataSizeMustMatchExactly) {
  EXPECT_PARSE_ERROR(npy(f32_header("(2, 3)"), std::string(20, '\0')), "truncated data", "float32 (2, 3)",
                     "needs 24 bytes", "has 20");
  EXPECT_PARSE_ERROR(npy(f32_header("(2, 3)"), std::string(28, '\0')), "4 trailing bytes", "expected exactly 24");
  EXPECT_PARSE_ERROR(npy(f32_header("(0,)"), "x"), "1 trailing bytes");
  EXPECT_PARSE_ERROR(npy(f32_header("()")), "truncated data", "needs 4 bytes");
}

TEST(NpyErrors, MalformedHeaderDicts) {
  const std::string d(8, '\0');
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': False}", d), "no 'shape' key");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'shape': (2,)}", d), "no 'fortran_order' key");
  EXPECT_PARSE_ERROR(npy("{'fortran_order': False, 'shape': (2,)}", d), "no 'descr' key");
  EXPECT_PARSE_ERROR(npy("{}", d), "no 'descr' key");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (2,)}", d),
                     "duplicate key 'shape'");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'foo': 1}", d),
                     "unexpected key 'foo'", "'descr', 'fortran_order' and 'shape'");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': false, 'shape': (2,)}", d), "True or False");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", d), "True or False");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", d), "expected ',' or '}'");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", d), "unexpected text after");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", d), "expected ',' or '}'");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x", d), "unterminated string");
  EXPECT_PARSE_ERROR(npy("{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", d), "expected ':'");
  EXPECT_PARSE_ERROR(npy("{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", d), "quoted key");
  EXPECT_PARSE_ERROR(npy("{'de\\x73cr': '<f4', 'fortran_order': False, 'shape': (2,)}", d), "escape");
  EXPECT_PARSE_ERROR(npy("[1, 2]", d), "expected '{'");
  EXPECT_PARSE_ERROR(npy("{'descr': '<f4',\0 'fortran_order': False, 'shape': (2,)}"s, d), "malformed .npy header");
  EXPECT_PARSE_ERROR(npy(""), "malformed .npy header");
}

TEST(NpyErrors, BoolBytesMustBeZeroOrOne) {
  const std::string h = "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }";
  EXPECT_EQ(qkv::parse_npy(npy(h, std::string("\0\1\1\0", 4)), "ok").data<bool>()[1], true);
  EXPECT_PARSE_ERROR(npy(h, std::string("\0\1\2\0", 4)), "bool element 2", "byte value 2", "expected 0 or 1");
  EXPECT_PARSE_ERROR(npy(h, std::string("\xff\0\0\0", 4)), "bool element 0", "byte value 255");
}

TEST(NpyErrors, EveryTruncationAndManyCorruptionsAreCleanErrors) {
  const std::string good = qkv::to_npy_bytes(sample(DType::F32, {2, 3}));
  for (size_t n = 0; n < good.size(); ++n) {
    const std::string m = error_of([&] { qkv::parse_npy(good.substr(0, n), "cut.npy"); });
    EXPECT_EQ(m.rfind("cut.npy: ", 0), 0u) << "prefix of " << n << " bytes: " << m;
  }
  // Single-byte corruptions either parse or fail with a qkv::Error; never anything else.
  const std::string bool_file = qkv::to_npy_bytes(sample(DType::Bool, {3, 2}));
  for (const std::string& base : {good, bool_file}) {
    for (size_t i = 0; i < base.size(); ++i) {
      for (char c : {'\0', '\xff', '(', ')', ',', '-', '9', ' ', '\'', '{', '}', ':', '\x01', 'T'}) {
        std::string b = base;
        b[i] = c;
        const std::string m = error_of([&] { qkv::parse_npy(b, "mut.npy"); });
        if (m != "no exception") {
          EXPECT_EQ(m.rfind("mut.npy: ", 0), 0u) << "byte " << i << ": " << m;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Files: reading errors and atomic writes

TEST(NpyFiles, MissingOrUnreadableFiles) {
  TempDir dir("npy");
  const std::string missing = dir / "nope.npy";
  expect_error(error_of([&] { qkv::read_npy(missing); }), missing + ": ", {"cannot open", "No such file"}, "missing");
  const std::string d = dir.path().string();
  expect_error(error_of([&] { qkv::read_npy(d); }), d + ": ", {"directory"}, "directory");
  const std::string bad = dir / "bad.npy";
  write_bytes(bad, "not numpy at all");
  expect_error(error_of([&] { qkv::read_npy(bad); }), bad + ": ", {"not a .npy file"}, "bad file");
}

TEST(NpyFiles, WriteIntoMissingDirectoryFailsAndLeavesNothing) {
  TempDir dir("npy");
  const std::string path = dir / "no/such/dir/out.npy";
  expect_error(error_of([&] { qkv::write_npy(path, sample(DType::F32, {2})); }), path + ": ",
               {"cannot write", "No such file"}, "missing dir");
  EXPECT_FALSE(fs::exists(dir / "no"));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(NpyFiles, OverwriteReplacesTargetAndLeavesNoTemporaryFiles) {
  TempDir dir("npy");
  const std::string path = dir / "t.npy";
  write_bytes(path, "old contents");
  const Tensor t = sample(DType::I64, {3, 3});
  qkv::write_npy(path, t);
  EXPECT_TRUE(same_tensor(qkv::read_npy(path), t));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"t.npy"});
  qkv::write_file_atomic(dir / "empty", "");
  EXPECT_EQ(fs::file_size(dir / "empty"), 0u);
  qkv::write_file_atomic(dir / "raw", std::string("a\0b", 3));
  EXPECT_EQ(read_bytes(dir / "raw"), std::string("a\0b", 3));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"empty", "raw", "t.npy"}));
}

TEST(NpyFiles, FailedWriteLeavesExistingTargetUntouched) {
  TempDir dir("npy");
  const std::string path = dir / "keep.npy";
  const std::string original = qkv::to_npy_bytes(sample(DType::F32, {4}));
  write_bytes(path, original);

  // A dtype .npy cannot hold: fails before touching the file system.
  expect_error(error_of([&] { qkv::write_npy(path, Tensor({2}, DType::BF16)); }), path + ": ", {"bfloat16"}, "bf16");
  EXPECT_EQ(read_bytes(path), original);

  // A write that fails half way: the file size limit stops the temporary file at 4 KiB.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  const std::string msg = error_of([&] { qkv::write_npy(path, sample(DType::F64, {100000})); });
  ::signal(SIGXFSZ, old_handler);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  expect_error(msg, path + ": ", {"cannot write", "write failed"}, "size limit");
  EXPECT_EQ(read_bytes(path), original);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.npy"});  // the temporary file is gone
  EXPECT_TRUE(same_tensor(qkv::read_npy(path), sample(DType::F32, {4})));
}

TEST(NpyFiles, UnwritableTensors) {
  expect_error(error_of([] { qkv::to_npy_bytes(Tensor()); }), "to_npy_bytes: ", {"undefined"}, "undefined");
  expect_error(error_of([] { qkv::to_npy_bytes(Tensor({3}, DType::BF16)); }),
               "to_npy_bytes: ", {"bfloat16 (3,)", "expected float32, float64, int32, int64 or bool"}, "bf16");
}

}  // namespace
