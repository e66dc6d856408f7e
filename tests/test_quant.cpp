// Low-precision weights (kernels/quant.h): float16 and bfloat16 conversions against the
// compiler's _Float16 and an independent nearest-even rule; GGUF's Q8_0 and Q4_0 blocks byte by
// byte on hand-computed cases; the matrix-vector product of every type on every ISA this CPU has,
// against its float64 twin with the plain float32 loop's error as the yardstick; int8 products
// exact for every weight byte (-128 included); NaN and infinity never turned into numbers; the
// result independent of the thread count and of the other rows.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "error_testing.h"
#include "kernels/quant.h"
#include "qkv/cpu.h"

namespace {

using namespace qkv::kernels;
using qkv::Isa;
using qkv::testing::error_of;

float as_float(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

TEST(Quant, Float16AgainstTheCompilersFloat16) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 c;
    const auto h16 = static_cast<uint16_t>(h);
    std::memcpy(&c, &h16, 2);
    const float want = static_cast<float>(c), got = f16_to_f32(h16);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(got)))) << h;
      continue;
    }
    ASSERT_EQ(bits_of(got), bits_of(want)) << "half 0x" << std::hex << h;
    ASSERT_EQ(f32_to_f16(got), h16) << "round trip of half 0x" << std::hex << h;
  }
  // float -> half: random bit patterns over the whole range, and the edges of rounding
  std::mt19937 rng(16);
  std::vector<float> xs = {65504.0f, 65519.99f, 65520.0f, 1e9f, -1e9f, 6.1035156e-05f, 6.0975552e-05f,
                           5.96e-08f, 2.98e-08f, 2.9802322e-08f, 2.9802326e-08f, 1e-10f, 0.0f, -0.0f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           1.0009765625f /* 1 + 2^-10 */, 1.00048828125f /* halfway, to even */,
                           1.00146484375f /* halfway, to even upwards */};
  for (int i = 0; i < 200000; ++i) xs.push_back(as_float(static_cast<uint32_t>(rng())));
  for (int i = 0; i < 100000; ++i) xs.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), -14 - i % 12));
  for (const float x : xs) {
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(x))));
      continue;
    }
    const _Float16 c = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &c, 2);
    ASSERT_EQ(f32_to_f16(x), want) << "float " << x << " (0x" << std::hex << bits_of(x) << ")";
  }
}

TEST(Quant, BFloat16RoundsToNearestEven) {
  std::mt19937 rng(17);
  for (int i = 0; i < 300000; ++i) {
    const uint32_t b = static_cast<uint32_t>(rng());
    const float x = as_float(b);
    const uint16_t r = f32_to_bf16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(r)));
      continue;
    }
    // the two bfloat16 neighbours of x, in float64: the nearest, ties to the even one
    const uint32_t down = b & 0xffff0000u;
    const double lo = as_float(down), hi = (down & 0x7fffffffu) == 0x7f7f0000u
                                               ? std::copysign(std::numeric_limits<double>::infinity(), lo)
                                               : static_cast<double>(as_float(down + 0x10000u));
    const double dl = std::fabs(x - lo), dh = std::fabs(x - hi);
    const uint32_t want = dl < dh || (dl == dh && ((down >> 16) & 1) == 0) ? down : down + 0x10000u;
    ASSERT_EQ(static_cast<uint32_t>(r) << 16, want) << "float 0x" << std::hex << b;
    ASSERT_EQ(bits_of(bf16_to_f32(r)), want);
  }
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
}

TEST(Quant, GgufBlocksByteForByte) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);  // -16 .. 15
  // Q8_0: d = 16 / 127, q_j = round((j - 16) * 127 / 16)
  BlockQ8_0 b8;
  ASSERT_EQ(row_bytes(WType::Q8_0, 32), 34u);
  quantize_row(WType::Q8_0, x, 32, &b8);
  EXPECT_EQ(b8.d, f32_to_f16(16.0f / 127.0f));
  EXPECT_EQ(b8.q[0], -127);
  EXPECT_EQ(b8.q[16], 0);
  EXPECT_EQ(b8.q[31], 119);  // 15 * 127 / 16 = 119.06
  EXPECT_EQ(b8.q[20], 32);   // 4 * 127 / 16 = 31.75
  EXPECT_EQ(b8.q[12], -32);
  unsigned char raw[34];
  std::memcpy(raw, &b8, 34);
  EXPECT_EQ(raw[0] | (raw[1] << 8), b8.d);  // the scale first, little-endian, then the 32 bytes
  EXPECT_EQ(static_cast<int8_t>(raw[2]), -127);
  // Q4_0: the element of largest magnitude is -16, d = -16 / -8 = 2, q = min(15, trunc(x / 2 + 8.5))
  BlockQ4_0 b4;
  ASSERT_EQ(row_bytes(WType::Q4_0, 64), 36u);
  quantize_row(WType::Q4_0, x, 32, &b4);
  EXPECT_EQ(b4.d, f32_to_f16(2.0f));
  EXPECT_EQ(b4.q[0] & 15, 0);   // x_0 = -16 -> 0.5 -> 0
  EXPECT_EQ(b4.q[0] >> 4, 8);   // x_16 = 0 -> 8.5 -> 8
  EXPECT_EQ(b4.q[15] & 15, 8);  // x_15 = -1 -> -0.5 + 8.5 = 8
  float back[32];
  dequantize_row(WType::Q4_0, &b4, 32, back);
  EXPECT_EQ(back[0], -16.0f);
  EXPECT_EQ(back[31], 14.0f);  // x_31 = 15 -> 16 -> clamped to 15 -> 2 * (15 - 8)
  dequantize_row(WType::Q8_0, &b8, 32, back);
  EXPECT_FLOAT_EQ(back[0], f16_to_f32(b8.d) * -127.0f);
  // whole blocks only; non-finite weights have no scale
  EXPECT_NE(error_of([] { (void)row_bytes(WType::Q8_0, 33); }).find("q8_0 rows hold whole blocks of 32"),
            std::string::npos);
  EXPECT_NE(error_of([] { (void)qkv::pack_weight(qkv::Tensor::zeros({2, 32}), WType::F32, "w"); })
                .find("f32 is not packed"),
            std::string::npos);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(error_of([&] { quantize_row(WType::Q4_0, x, 32, &b4); }).find("element 5 of the row is nan"),
            std::string::npos);
}

// Every kernel table this CPU can run, by name.
std::vector<std::pair<std::string, QuantIsa>> tables() {
  std::vector<std::pair<std::string, QuantIsa>> t = {{"generic", quant_isa(Isa::Generic)}};
  if (qkv::cpu_supports(Isa::AVX2)) {
    t.emplace_back("avx2", quant_isa(Isa::AVX2));
    t.emplace_back("w16avx2", quant_isa_w16avx2());
  }
  if (qkv::cpu_supports(Isa::AVX512)) {
    QuantIsa k = quant_isa(Isa::AVX512);
    k.vnni = false, k.bf16dp = false;
    t.emplace_back("avx512", k);
    if (cpu_has_avx512_vnni()) {
      k.vnni = true;
      t.emplace_back("avx512+vnni", k);
    }
    if (cpu_has_avx512_bf16()) {
      k.bf16dp = true;
      t.emplace_back("avx512+bf16", k);
    }
  }
  return t;
}

struct Case {
  WType t;
  int64_t N, K;
};

std::vector<uint8_t> random_matrix(WType t, int64_t N, int64_t K, std::mt19937& rng, std::vector<float>* dense) {
  std::normal_distribution<float> g(0, 1);
  std::vector<float> w(static_cast<size_t>(N * K));
  for (float& v : w) v = g(rng) * (rng() % 7 == 0 ? 8.0f : 1.0f);  // some blocks with outliers
  std::vector<uint8_t> packed(row_bytes(t, K) * static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) quantize_row(t, w.data() + n * K, K, packed.data() + n * row_bytes(t, K));
  if (dense) *dense = w;
  return packed;
}

// A matrix in the layout gemv takes: Q4_0's rows grouped by 16 (kernels/quant.h), others as they are.
std::vector<uint8_t> for_gemv(WType t, std::vector<uint8_t> W, int64_t N, int64_t K) {
  if (t == WType::Q4_0) q4_0_group_rows(W.data(), N, K);
  return W;
}

TEST(Quant, Q4GroupingKeepsEveryRowAndItsSize) {
  // rows grouped by 16 read back as they were, byte for byte: a group's block holds its 16 scales
  // then four 64-byte runs of 4 bytes a row; the rows after the last whole group stay in place
  std::mt19937 rng(41);
  for (const int64_t N : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{37}, int64_t{64}}) {
    const int64_t K = 96;
    const auto W = random_matrix(WType::Q4_0, N, K, rng, nullptr);
    const auto G = for_gemv(WType::Q4_0, W, N, K);
    ASSERT_EQ(G.size(), W.size());
    const size_t rb = row_bytes(WType::Q4_0, K);
    std::vector<uint8_t> row(rb);
    for (int64_t r = 0; r < N; ++r) {
      q4_0_file_row(G.data(), N, K, r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), W.data() + r * rb, rb), 0) << "N " << N << " row " << r;
    }
    if (N >= 16) {
      // group 0, block 2: row 5's scale at byte 10, its bytes 8..11 at 32 + 64 * 2 + 4 * 5
      const auto* b = reinterpret_cast<const BlockQ4_0*>(W.data() + 5 * rb) + 2;
      const uint8_t* g = G.data() + 2 * kQ4GroupBlock;
      EXPECT_EQ(std::memcmp(g + 10, &b->d, 2), 0);
      EXPECT_EQ(std::memcmp(g + 32 + 128 + 20, b->q + 8, 4), 0);
    } else {
      EXPECT_EQ(G, W) << "fewer than 16 rows stay as they are";
    }
  }
  EXPECT_NE(error_of([] {
              std::vector<uint8_t> W(row_bytes(WType::Q4_0, 32)), out(W.size());
              q4_0_file_row(W.data(), 1, 32, 1, out.data());
            }).find("row 1 outside [0, 1)"),
            std::string::npos);
}

// A prompt's bf16 tiles (ops::linear on many rows): rows dequantised then rounded to bf16, bit for
// bit, whether a Q4_0 group is read straight from its grouped bytes (every ISA's kernel) or row by
// row (ranges that do not start or end at a group's edge, the rows after the last whole group).
TEST(Quant, Bf16TilesAreTheRowsDequantisedThenRounded) {
  std::mt19937 rng(43);
  for (const WType t : {WType::Q4_0, WType::Q8_0, WType::BF16}) {
    const int64_t N = 53, K = 96;
    std::vector<float> dense;
    const auto W = random_matrix(t == WType::BF16 ? WType::Q8_0 : t, N, K, rng, &dense);
    auto bytes = std::make_shared<qkv::Storage>(W.size());
    std::memcpy(bytes->data(), W.data(), W.size());
    const auto P = t == WType::BF16 ? pack_weight(qkv::Tensor::from({N, K}, dense), t, "w")
                                    : packed_from_bytes(t, N, K, bytes, "w");
    std::vector<float> row(static_cast<size_t>(K));
    std::vector<uint16_t> want(static_cast<size_t>(N * K)), got(want.size() + 1);
    for (int64_t r = 0; r < N; ++r) {
      P->dequantize_row(r, row.data());
      f32_to_bf16_n(row.data(), want.data() + r * K, K);
    }
    for (const auto& [r0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 53}, {0, 16}, {16, 32}, {3, 40}, {32, 21}, {48, 5}, {5, 0}}) {
      std::fill(got.begin(), got.end(), uint16_t{0xdead});
      P->dequantize_rows_bf16(r0, n, got.data());
      for (int64_t i = 0; i < n * K; ++i)
        ASSERT_EQ(got[i], want[r0 * K + i]) << wtype_name(t) << " rows [" << r0 << ", " << r0 + n << ") value " << i;
      ASSERT_EQ(got[n * K], 0xdead) << "wrote past the rows";
    }
    EXPECT_NE(error_of([&] { P->dequantize_rows_bf16(50, 4, got.data()); }).find("rows [50, 54) outside [0, 53)"),
              std::string::npos);
  }
  // each ISA's group kernel on a grouped Q4_0 matrix
  const int64_t N = 32, K = 128;
  const auto W = random_matrix(WType::Q4_0, N, K, rng, nullptr);
  const auto G = for_gemv(WType::Q4_0, W, N, K);
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<uint16_t> want(static_cast<size_t>(N * K)), got(want.size());
  for (int64_t r = 0; r < N; ++r) {
    dequantize_row(WType::Q4_0, W.data() + r * row_bytes(WType::Q4_0, K), K, row.data());
    f32_to_bf16_n(row.data(), want.data() + r * K, K);
  }
  for (const auto& [name, k] : tables()) {
    std::fill(got.begin(), got.end(), uint16_t{0});
    for (int64_t g = 0; g < N / kQ4Group; ++g)
      k.q4_0_group_bf16(G.data() + g * kQ4Group * row_bytes(WType::Q4_0, K), K / kQBlock, got.data() + g * kQ4Group * K, K);
    ASSERT_EQ(got, want) << name;
  }
}

// The vectorised rounding of many values equals the one-value rounding, bit for bit: random bit
// patterns (NaNs with any payload, infinities, subnormals, ties) and the edges.
TEST(Quant, Bf16RoundingOfManyValuesIsTheOneValueRounding) {
  std::mt19937 rng(17);
  std::vector<float> x(100003);
  for (float& v : x) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    std::memcpy(&v, &bits, sizeof v);
  }
  const uint32_t edges[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7f7fffffu,
                            0x3f808000u, 0x3f818000u, 0x00008000u, 0x80000000u, 0x3f807fffu, 0x7f7f8000u};
  for (size_t i = 0; i < std::size(edges); ++i) std::memcpy(&x[i], &edges[i], 4);
  std::vector<uint16_t> got(x.size());
  f32_to_bf16_n(x.data(), got.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(x[i])) << "value " << i << ": " << x[i];
  // each ISA's vector loop, with every tail length
  for (const auto& [name, k] : tables())
    for (const int64_t n : {int64_t{100000}, int64_t{16}, int64_t{15}, int64_t{17}, int64_t{31}, int64_t{1}}) {
      std::fill(got.begin(), got.end(), uint16_t{0xdead});
      k.round_bf16(x.data() + 3, got.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], f32_to_bf16(x[i + 3])) << name << ", n " << n << ", value " << i;
      ASSERT_EQ(got[n], 0xdead) << name << ": wrote past n = " << n;
    }
}

TEST(Quant, GemvAgainstItsFloat64TwinOnEveryIsa) {
  std::mt19937 rng(21);
  const std::vector<Case> cases = {{WType::Q8_0, 37, 32},   {WType::Q8_0, 40, 4096}, {WType::Q8_0, 9, 96},
                                   {WType::Q4_0, 37, 32},   {WType::Q4_0, 40, 4096}, {WType::Q4_0, 9, 160},
                                   // 18 and 17 blocks: the 512-bit loop's 16 blocks, then a pair or one
                                   {WType::Q4_0, 9, 576},   {WType::Q4_0, 9, 544},   {WType::Q8_0, 9, 576},
                                   // whole groups of 16 rows only, and groups then 15 rows
                                   {WType::Q4_0, 16, 32},   {WType::Q4_0, 48, 576},  {WType::Q4_0, 31, 2048},
                                   {WType::Q8_0, 9, 544},
                                   {WType::F16, 37, 77},    {WType::F16, 40, 4096},  {WType::F16, 3, 5},
                                   {WType::BF16, 37, 77},   {WType::BF16, 40, 4096}, {WType::BF16, 3, 1}};
  for (const Case& c : cases) {
    const auto W = random_matrix(c.t, c.N, c.K, rng, nullptr), G = for_gemv(c.t, W, c.N, c.K);
    std::normal_distribution<float> g(0, 1);
    std::vector<float> x(static_cast<size_t>(c.K));
    for (float& v : x) v = g(rng);
    std::vector<double> ref(static_cast<size_t>(c.N));
    gemv_reference(c.t, G.data(), c.N, c.K, x.data(), ref.data());
    // the yardstick: a plain float32 loop over the same dequantised weights and activations (bf16:
    // rounded to bf16, as gemv rounds them)
    std::vector<float> xa(x);
    if (c.t == WType::BF16)
      for (float& v : xa) v = bf16_to_f32(f32_to_bf16(v));
    if (c.t == WType::Q8_0 || c.t == WType::Q4_0) {
      std::vector<float> d(static_cast<size_t>(c.K / 32));
      std::vector<int8_t> q(static_cast<size_t>(c.K));
      quantize_activations(x.data(), c.K, d.data(), q.data());
      for (int64_t k = 0; k < c.K; ++k) xa[k] = d[k / 32] * q[k];
    }
    std::vector<float> w(static_cast<size_t>(c.K));
    double plain_err = 0;
    std::vector<double> scale(static_cast<size_t>(c.N));
    for (int64_t n = 0; n < c.N; ++n) {
      dequantize_row(c.t, W.data() + n * row_bytes(c.t, c.K), c.K, w.data());
      float s = 0;
      double a = 0;
      for (int64_t k = 0; k < c.K; ++k) s += w[k] * xa[k], a += std::fabs(static_cast<double>(w[k]) * xa[k]);
      scale[n] = a;
      plain_err = std::max(plain_err, std::fabs(s - ref[n]) / a);
    }
    std::vector<uint8_t> ws(gemv_workspace_bytes(c.t, c.K));
    std::vector<float> first;
    for (const auto& [name, k] : tables()) {
      std::vector<float> y(static_cast<size_t>(c.N));
      gemv_with(k, c.t, G.data(), c.N, c.K, x.data(), y.data(), ws.data(), 2);
      double err = 0;
      int64_t at = 0;
      for (int64_t n = 0; n < c.N; ++n)
        if (const double e = std::fabs(y[n] - ref[n]) / scale[n]; e > err) err = e, at = n;
      EXPECT_LE(err, 2 * plain_err + 1e-7)
          << name << " " << wtype_name(c.t) << " N=" << c.N << " K=" << c.K << ": row " << at << " gives " << y[at]
          << ", float64 " << ref[at] << " (error " << err << " of sum |w x|; the plain float32 loop's: " << plain_err
          << ")";
      // the int8 products are exact and every vector ISA sums the same lanes in the same order;
      // Q4_0 takes its blocks in one order on every ISA, the plain loops too
      if ((c.t == WType::Q8_0 && name != "generic") || c.t == WType::Q4_0) {
        if (first.empty()) first = y;
        EXPECT_EQ(std::memcmp(first.data(), y.data(), y.size() * 4), 0)
            << name << " " << wtype_name(c.t) << " N=" << c.N << " K=" << c.K << " differs from " << tables()[0].first;
      }
      // a grouped row gives what it gives alone (one row is never grouped), bit for bit
      if (c.t == WType::Q4_0)
        for (int64_t n = 0; n < c.N; ++n) {
          float alone = 0;
          gemv_with(k, c.t, W.data() + n * row_bytes(c.t, c.K), 1, c.K, x.data(), &alone, ws.data(), 1);
          ASSERT_EQ(bits_of(alone), bits_of(y[n])) << name << " N=" << c.N << " K=" << c.K << " row " << n;
        }
    }
  }
}

TEST(Quant, EveryWeightByteIsExactMinus128Included) {
  // Q8_0 blocks of -128 (no quantiser writes it; a file may hold it) against negative activations
  const int64_t K = 64;
  std::vector<BlockQ8_0> w(2);
  for (auto& b : w) {
    b.d = f32_to_f16(0.5f);
    for (auto& q : b.q) q = -128;
  }
  w[1].q[3] = 127, w[1].q[4] = 0, w[1].q[5] = -1;
  std::vector<float> x(K);
  for (int64_t k = 0; k < K; ++k) x[k] = -1.0f - static_cast<float>(k % 5);
  double ref = 0;
  gemv_reference(WType::Q8_0, w.data(), 1, K, x.data(), &ref);
  std::vector<uint8_t> ws(gemv_workspace_bytes(WType::Q8_0, K));
  for (const auto& [name, k] : tables()) {
    float y = 0;
    gemv_with(k, WType::Q8_0, w.data(), 1, K, x.data(), &y, ws.data(), 1);
    EXPECT_NEAR(y, ref, 1e-5 * std::fabs(ref)) << name;
  }
  EXPECT_GT(ref, 0);  // -128 * negative: positive, as it must be
}

TEST(Quant, NanAndInfinityAreNeverTurnedIntoNumbers) {
  const int64_t K = 64, N = 19;  // Q4_0: a group of 16 rows, then 3 rows
  std::mt19937 rng(5);
  for (WType t : {WType::Q8_0, WType::Q4_0, WType::F16, WType::BF16}) {
    auto W = random_matrix(t, N, K, rng, nullptr);
    std::vector<uint8_t> ws(gemv_workspace_bytes(t, K));
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(K, 0.5f);
      x[40] = bad;
      const auto G = for_gemv(t, W, N, K);
      for (const auto& [name, k] : tables()) {
        std::vector<float> y(N);
        gemv_with(k, t, G.data(), N, K, x.data(), y.data(), ws.data(), 1);
        for (int64_t n = 0; n < N; ++n) {
          if (std::isnan(bad) || t == WType::Q8_0 || t == WType::Q4_0)
            EXPECT_TRUE(std::isnan(y[n])) << name << " " << wtype_name(t) << " x holds " << bad << ": y = " << y[n];
          else
            EXPECT_FALSE(std::isfinite(y[n])) << name << " " << wtype_name(t) << " x holds " << bad << ": y = " << y[n];
        }
      }
    }
    // a NaN scale (Q types) or weight (float types) in rows 1 and 17 only (Q4_0: one in the
    // group, one after it)
    for (const int64_t r : {1, 17}) {
      uint8_t* row = W.data() + r * row_bytes(t, K);
      if (t == WType::Q8_0) reinterpret_cast<BlockQ8_0*>(row)[1].d = 0x7e00;
      if (t == WType::Q4_0) reinterpret_cast<BlockQ4_0*>(row)[1].d = 0x7e00;
      if (t == WType::F16) reinterpret_cast<uint16_t*>(row)[50] = 0x7e00;
      if (t == WType::BF16) reinterpret_cast<uint16_t*>(row)[50] = 0x7fc0;
    }
    const auto G = for_gemv(t, W, N, K);
    std::vector<float> x(K, 0.25f);
    for (const auto& [name, k] : tables()) {
      std::vector<float> y(N);
      gemv_with(k, t, G.data(), N, K, x.data(), y.data(), ws.data(), 1);
      for (int64_t n = 0; n < N; ++n)
        EXPECT_EQ(std::isnan(y[n]), n == 1 || n == 17) << name << " " << wtype_name(t) << ": row " << n << " " << y[n];
      for (int64_t n = 0; n < N; ++n) EXPECT_TRUE(std::isnan(y[n]) || std::isfinite(y[n]));
    }
  }
}

TEST(Quant, RowsDependOnNeitherThreadsNorOtherRows) {
  std::mt19937 rng(9);
  const int64_t N = 301, K = 512;
  for (WType t : {WType::Q8_0, WType::Q4_0, WType::F16, WType::BF16}) {
    const auto W = for_gemv(t, random_matrix(t, N, K, rng, nullptr), N, K);
    std::vector<float> x(K);
    for (float& v : x) v = std::normal_distribution<float>(0, 1)(rng);
    std::vector<uint8_t> ws(gemv_workspace_bytes(t, K));
    // the rows from 96 on (a multiple of 16: where a grouped Q4_0 matrix's part may start)
    std::vector<float> y1(N), y2(N), y7(N), part(N - 96);
    gemv(t, W.data(), N, K, x.data(), y1.data(), ws.data(), 1);
    gemv(t, W.data(), N, K, x.data(), y2.data(), ws.data(), 2);
    gemv(t, W.data(), N, K, x.data(), y7.data(), ws.data(), 7);
    gemv(t, W.data() + 96 * row_bytes(t, K), N - 96, K, x.data(), part.data(), ws.data(), 2);
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), N * 4), 0) << wtype_name(t);
    EXPECT_EQ(std::memcmp(y1.data(), y7.data(), N * 4), 0) << wtype_name(t);
    EXPECT_EQ(std::memcmp(y1.data() + 96, part.data(), (N - 96) * 4), 0) << wtype_name(t);
  }
}

TEST(Quant, PartsAreEachPartsOwnProductBitForBit) {
  // gemv_parts (q, k and v from one quantisation of x, one parallel region) against gemv on each
  // part, on every ISA and thread count: parts of uneven row counts (chunks of 16 crossing part
  // ends), an empty part, one row.
  std::mt19937 rng(17);
  const int64_t K = 160;
  const std::vector<int64_t> rows = {37, 0, 16, 1, 50};
  for (WType t : {WType::Q8_0, WType::Q4_0, WType::F16, WType::BF16}) {
    std::vector<std::vector<uint8_t>> W;
    for (int64_t n : rows) W.push_back(for_gemv(t, random_matrix(t, n, K, rng, nullptr), n, K));
    std::vector<float> x(K);
    for (float& v : x) v = std::normal_distribution<float>(0, 1)(rng);
    std::vector<uint8_t> ws(gemv_workspace_bytes(t, K));
    for (const auto& [name, k] : tables())
      for (int threads : {1, 2, 3}) {
        std::vector<std::vector<float>> want, got;
        std::vector<GemvPart> parts;
        for (size_t p = 0; p < rows.size(); ++p) {
          want.emplace_back(rows[p] + 1, -7.0f), got.emplace_back(rows[p] + 1, -7.0f);
          gemv_with(k, t, W[p].data(), rows[p], K, x.data(), want[p].data(), ws.data(), threads);
        }
        for (size_t p = 0; p < rows.size(); ++p) parts.push_back({W[p].data(), rows[p], got[p].data()});
        gemv_parts_with(k, t, parts.data(), static_cast<int64_t>(parts.size()), K, x.data(), ws.data(), threads);
        for (size_t p = 0; p < rows.size(); ++p) {
          EXPECT_EQ(std::memcmp(want[p].data(), got[p].data(), want[p].size() * 4), 0)
              << name << " " << wtype_name(t) << " threads " << threads << " part " << p;
          EXPECT_EQ(got[p].back(), -7.0f) << "part " << p << " written past its rows";
        }
      }
  }
}

TEST(Quant, EveryIsaQuantisesActivationsAsTheScalarRule) {
  // each table's quantize_blocks against quantize_activations, bit for bit: random blocks of
  // many scales, exact ties of x * 127 / amax (k + 1/2), an all-zero block, signed zeros,
  // subnormals, the largest floats, and blocks holding NaN or an infinity
  std::mt19937 rng(31);
  const int64_t nb = 64;
  std::vector<float> x(static_cast<size_t>(nb * 32));
  for (int64_t i = 0; i < nb; ++i)
    for (int j = 0; j < 32; ++j)
      x[i * 32 + j] = std::normal_distribution<float>(0, 1)(rng) * std::ldexp(1.0f, static_cast<int>(i % 9) * 9 - 36);
  for (int j = 0; j < 32; ++j) x[1 * 32 + j] = (j == 0 ? 127.0f : (j % 2 ? 0.5f : -2.5f) + static_cast<float>(j % 7));
  for (int j = 0; j < 32; ++j) x[2 * 32 + j] = 0.0f;
  for (int j = 0; j < 32; ++j) x[3 * 32 + j] = j % 2 ? -0.0f : 1e-45f * static_cast<float>(j);
  for (int j = 0; j < 32; ++j) x[4 * 32 + j] = (j % 3 ? -1 : 1) * std::numeric_limits<float>::max() / (1 + j);
  // 127 / max|x| overflows, though d = max|x| / 127 does not vanish: q = 0, not 0 * infinity
  for (int j = 0; j < 32; ++j) x[8 * 32 + j] = 1e-37f * static_cast<float>(j % 5 - 2);
  x[5 * 32 + 7] = std::numeric_limits<float>::quiet_NaN();
  x[6 * 32 + 31] = -std::numeric_limits<float>::infinity();
  x[7 * 32 + 16] = std::numeric_limits<float>::infinity();
  std::vector<float> d0(nb), d1(nb);
  std::vector<int8_t> q0(x.size()), q1(x.size());
  quantize_activations(x.data(), nb * 32, d0.data(), q0.data());
  for (const auto& [name, k] : tables()) {
    std::fill(d1.begin(), d1.end(), -1.0f);
    std::fill(q1.begin(), q1.end(), int8_t{99});
    k.quantize_blocks(x.data(), nb, d1.data(), q1.data());
    for (int64_t i = 0; i < nb; ++i) {
      EXPECT_EQ(bits_of(d0[i]), bits_of(d1[i])) << name << " block " << i << ": " << d1[i] << ", want " << d0[i];
      EXPECT_EQ(std::memcmp(q0.data() + i * 32, q1.data() + i * 32, 32), 0) << name << " block " << i;
    }
  }
  EXPECT_TRUE(std::isnan(d0[5]) && std::isnan(d0[6]) && std::isnan(d0[7]));
  EXPECT_GT(d0[8], 0.0f);
  for (int64_t i : {2, 3, 8})
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q0[i * 32 + j], 0) << "block " << i << " element " << j;
}

TEST(Quant, ActivationQuantisationErrorIsBounded) {
  // per block: |x - d q| <= d / 2 with d = max|x| / 127, and the all-zero block stays zero
  std::mt19937 rng(3);
  std::vector<float> x(256), d(8);
  std::vector<int8_t> q(256);
  for (float& v : x) v = std::normal_distribution<float>(0, 3)(rng);
  for (int j = 64; j < 96; ++j) x[j] = 0;
  quantize_activations(x.data(), 256, d.data(), q.data());
  EXPECT_EQ(d[2], 0.0f);
  for (int j = 0; j < 256; ++j) {
    EXPECT_LE(std::fabs(x[j] - d[j / 32] * q[j]), 0.5f * d[j / 32] * 1.0001f + 1e-30f) << j;
    EXPECT_LE(std::abs(static_cast<int>(q[j])), 127);
  }
}

}  // namespace
