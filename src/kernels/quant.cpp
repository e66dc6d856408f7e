// Low-precision weights: conversions, GGUF's quantisers, the matrix-vector product and its twin.
#include "kernels/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv {

const char* wtype_name(WType t) {
  switch (t) {
    case WType::F32: return "f32";
    case WType::BF16: return "bf16";
    case WType::F16: return "f16";
    case WType::Q8_0: return "q8_0";
    case WType::Q4_0: return "q4_0";
  }
  return "?";
}

WType parse_wtype(const std::string& s, const std::string& what) {
  if (s == "f32" || s == "float32") return WType::F32;
  if (s == "bf16" || s == "bfloat16") return WType::BF16;
  if (s == "f16" || s == "float16") return WType::F16;
  if (s == "int8" || s == "q8_0") return WType::Q8_0;
  if (s == "q4" || s == "q4_0") return WType::Q4_0;
  fail(what, " ", s, ": expected f32, bf16, f16, int8 (q8_0) or q4 (q4_0)");
}

size_t packed_row_bytes(WType t, int64_t cols) { return kernels::row_bytes(t, cols); }

void PackedWeight::file_row(int64_t r, uint8_t* out) const {
  check(r >= 0 && r < rows, "packed weight: row ", r, " outside [0, ", rows, ")");
  if (type == WType::Q4_0)
    kernels::q4_0_file_row(static_cast<const uint8_t*>(bytes->data()), rows, cols, r, out);
  else
    std::memcpy(out, row(r), row_bytes);
}

void PackedWeight::dequantize_row(int64_t r, float* out) const {
  if (type != WType::Q4_0) {
    check(r >= 0 && r < rows, "packed weight: row ", r, " outside [0, ", rows, ")");
    return kernels::dequantize_row(type, row(r), cols, out);
  }
  thread_local std::vector<uint8_t> buf;
  buf.resize(row_bytes);
  file_row(r, buf.data());
  kernels::dequantize_row(type, buf.data(), cols, out);
}

void PackedWeight::dequantize_rows_bf16(int64_t r0, int64_t n, uint16_t* out) const {
  check(r0 >= 0 && n >= 0 && r0 + n <= rows, "packed weight: rows [", r0, ", ", r0 + n, ") outside [0, ", rows, ")");
  static const kernels::QuantIsa k = kernels::quant_isa(active_isa());
  const int64_t grouped = type == WType::Q4_0 ? rows / kernels::kQ4Group * kernels::kQ4Group : 0;
  thread_local std::vector<float> buf;
  for (int64_t r = r0; r < r0 + n;) {
    uint16_t* o = out + (r - r0) * cols;
    if (r % kernels::kQ4Group == 0 && r + kernels::kQ4Group <= std::min(r0 + n, grouped)) {
      k.q4_0_group_bf16(row(r), cols / kernels::kQBlock, o, cols);
      r += kernels::kQ4Group;
      continue;
    }
    buf.resize(static_cast<size_t>(cols));
    dequantize_row(r, buf.data());
    k.round_bf16(buf.data(), o, cols);
    ++r;
  }
}

std::string PackedWeight::file_bytes() const {
  std::string out(row_bytes * static_cast<size_t>(rows), '\0');
  auto* dst = reinterpret_cast<uint8_t*>(out.data());
#pragma omp parallel for num_threads(num_threads()) schedule(static) if (rows > 1024)
  for (int64_t r = 0; r < rows; ++r) file_row(r, dst + static_cast<size_t>(r) * row_bytes);
  return out;
}

namespace {

// Runs fill(r) for every row in parallel; an error in any row is rethrown (the lowest row's),
// after `name`.
template <class Fill>
void for_each_row(int64_t rows, const std::string& name, Fill&& fill) {
  int64_t bad = rows;
#pragma omp parallel for num_threads(num_threads()) schedule(static) reduction(min : bad)
  for (int64_t r = 0; r < rows; ++r) {
    try {
      fill(r);
    } catch (const Error&) {
      bad = std::min(bad, r);
    }
  }
  if (bad == rows) return;
  try {
    fill(bad);
  } catch (const Error& e) {
    fail(name, " ", e.what());
  }
  fail(name, " row ", bad, ": cannot be packed");
}

// A packed row holding something that is not finite is an error naming the weight.
void check_row_finite(WType t, const void* row, int64_t K) {
  const int64_t k = kernels::first_nonfinite(t, row, K);
  if (k < 0) return;
  fail("weight ", k, " is not finite as ", wtype_name(t),
       t == WType::F16 ? " (beyond float16's range of +-65504, or infinite or NaN)"
                       : t == WType::BF16 ? " (infinite or NaN)" : " (its block's float16 scale is infinite or NaN)");
}

// A packed matrix's description (no bytes yet): the type, shape and row size, checked.
std::shared_ptr<PackedWeight> describe_packed(WType t, int64_t rows, int64_t cols, const std::string& name) {
  check(t != WType::F32, name, ": f32 is not packed (float32 products go through qkv::sgemm)");
  check(rows >= 0 && cols >= 0, name, ": negative shape (", rows, ", ", cols, ")");
  auto p = std::make_shared<PackedWeight>();
  p->type = t, p->rows = rows, p->cols = cols;
  try {
    p->row_bytes = kernels::row_bytes(t, cols);
  } catch (const Error& e) {
    fail(name, " (", rows, ", ", cols, "): ", e.what());
  }
  return p;
}

}  // namespace

std::shared_ptr<const PackedWeight> pack_rows(WType t, int64_t rows, int64_t cols, const std::string& name,
                                              const std::function<void(int64_t, int64_t, float*)>& read) {
  const std::shared_ptr<PackedWeight> p = describe_packed(t, rows, cols, name);
  p->bytes = std::make_shared<Storage>(p->row_bytes * static_cast<size_t>(rows), false);
  // chunks of about 4 MiB of float32 rows
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(cols, 1));
  std::vector<float> buf(static_cast<size_t>(std::min(chunk, rows) * cols));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    read(r0, n, buf.data());
    for_each_row(n, name, [&](int64_t r) {
      try {
        uint8_t* row = const_cast<uint8_t*>(p->row(r0 + r));
        kernels::quantize_row(t, buf.data() + r * cols, cols, row);
        check_row_finite(t, row, cols);
      } catch (const Error& e) {
        fail("row ", r0 + r, ": ", e.what());
      }
    });
  }
  if (t == WType::Q4_0) kernels::q4_0_group_rows(static_cast<uint8_t*>(p->bytes->data()), rows, cols);
  return p;
}

std::shared_ptr<const PackedWeight> pack_weight(const Tensor& w, WType t, const std::string& name) {
  check(w.dim() == 2 && w.dtype() == DType::F32, name, ": a packed weight is a float32 matrix, got ", w.describe());
  const Tensor c = w.contiguous();
  const float* src = c.data<float>();
  const int64_t cols = w.size(1);
  return pack_rows(t, w.size(0), cols, name, [&](int64_t r0, int64_t n, float* dst) {
    std::copy(src + r0 * cols, src + (r0 + n) * cols, dst);
  });
}

std::shared_ptr<const PackedWeight> packed_from_bytes(WType t, int64_t rows, int64_t cols,
                                                      std::shared_ptr<Storage> bytes, const std::string& name) {
  const std::shared_ptr<PackedWeight> p = describe_packed(t, rows, cols, name);
  const size_t need = p->row_bytes * static_cast<size_t>(rows);
  check(bytes && bytes->bytes() == need, name, ": ", wtype_name(t), " (", rows, ", ", cols, ") takes ", need,
        " bytes, given ", bytes ? bytes->bytes() : 0);
  p->bytes = std::move(bytes);
  for_each_row(rows, name, [&](int64_t r) {
    try {
      check_row_finite(t, p->row(r), cols);
    } catch (const Error& e) {
      fail("row ", r, ": ", e.what());
    }
  });
  if (t == WType::Q4_0) kernels::q4_0_group_rows(static_cast<uint8_t*>(p->bytes->data()), rows, cols);
  return p;
}

}  // namespace qkv

namespace qkv::kernels {

size_t row_bytes(WType t, int64_t K) {
  check(K >= 0, "row_bytes: negative row length ", K);
  const bool blocks = t == WType::Q8_0 || t == WType::Q4_0;
  check(!blocks || K % kQBlock == 0, wtype_name(t), " rows hold whole blocks of ", kQBlock, " weights, but a row has ",
        K);
  const auto k = static_cast<size_t>(K);
  switch (t) {
    case WType::F32: return k * 4;
    case WType::BF16:
    case WType::F16: return k * 2;
    case WType::Q8_0: return k / kQBlock * sizeof(BlockQ8_0);
    case WType::Q4_0: return k / kQBlock * sizeof(BlockQ4_0);
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// float16 and bfloat16

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // infinity, or NaN with its payload
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);  // normal: rebias 15 -> 127
  } else if (man == 0) {
    bits = sign;  // zero
  } else {
    // subnormal: man * 2^-24, exact in float
    bits = std::bit_cast<uint32_t>(static_cast<float>(man) * 0x1p-24f) | sign;
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  const auto bits = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00 | ((abs >> 13) & 0x3ff));  // NaN, quiet
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to >= 65520: infinity
  if (abs >= 0x38800000u) {
    // normal in f16: drop 13 mantissa bits, round to nearest even (a carry may step the exponent)
    const uint32_t r = abs - 0x38000000u;  // rebias 127 -> 15
    const uint32_t half = r >> 13, rest = r & 0x1fff;
    const uint32_t rounded = half + (rest > 0x1000 || (rest == 0x1000 && (half & 1)));
    return static_cast<uint16_t>(sign | rounded);
  }
  // subnormal or zero in f16: the value in units of 2^-24, rounded to nearest even
  const float units = std::bit_cast<float>(abs) * 0x1p24f;  // exact: a < 2^-14, so units < 1024
  const auto r = static_cast<uint32_t>(std::nearbyint(units));
  return static_cast<uint16_t>(sign | r);  // r == 1024 is the smallest normal, correctly
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const auto bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN, quiet
  const uint32_t lsb = (bits >> 16) & 1;
  return static_cast<uint16_t>((bits + 0x7fff + lsb) >> 16);  // nearest even; overflow reaches infinity
}

// The same rounding over n values, written without branches so that it vectorises (prompts round
// their activations and dequantised tiles through it).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void f32_to_bf16_n(const float* x, uint16_t* out, int64_t n) {
  static const QuantIsa k = quant_isa(active_isa());
  k.round_bf16(x, out, n);
}

// ---------------------------------------------------------------------------------------------
// Quantisers (GGUF's published rules) and dequantisers

void quantize_row(WType t, const float* x, int64_t K, void* out) {
  (void)row_bytes(t, K);
  if (t == WType::Q8_0 || t == WType::Q4_0)
    for (int64_t k = 0; k < K; ++k)
      check(std::isfinite(x[k]), "quantize to ", wtype_name(t), ": element ", k, " of the row is ", x[k],
            " (a block's scale needs finite weights)");
  switch (t) {
    case WType::F32: std::memcpy(out, x, static_cast<size_t>(K) * 4); return;
    case WType::BF16:
      for (int64_t k = 0; k < K; ++k) static_cast<uint16_t*>(out)[k] = f32_to_bf16(x[k]);
      return;
    case WType::F16:
      for (int64_t k = 0; k < K; ++k) static_cast<uint16_t*>(out)[k] = f32_to_f16(x[k]);
      return;
    case WType::Q8_0: {
      auto* b = static_cast<BlockQ8_0*>(out);
      for (int64_t i = 0; i < K / kQBlock; ++i, x += kQBlock) {
        float amax = 0;
        for (int64_t j = 0; j < kQBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int64_t j = 0; j < kQBlock; ++j) b[i].q[j] = static_cast<int8_t>(std::round(x[j] * id));
      }
      return;
    }
    case WType::Q4_0: {
      auto* b = static_cast<BlockQ4_0*>(out);
      for (int64_t i = 0; i < K / kQBlock; ++i, x += kQBlock) {
        float amax = 0, m = 0;
        for (int64_t j = 0; j < kQBlock; ++j)
          if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), m = x[j];
        const float d = m / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int64_t j = 0; j < kQBlock / 2; ++j) {
          const auto lo = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f))));
          const auto hi = static_cast<uint8_t>(
              std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQBlock / 2] * id + 8.5f))));
          b[i].q[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
      return;
    }
  }
}

namespace {

// Q4_K's and Q5_K's 6-bit scale and min of sub-block j (of 8) from their 12 packed bytes: the
// first four whole in the low 6 bits of bytes j and j + 4; the last four split between the low
// or high nibble of byte j + 4 and the top 2 bits of bytes j - 4 and j.
void scale_min_k4(int j, const uint8_t* q, float* sc, float* m) {
  if (j < 4) {
    *sc = static_cast<float>(q[j] & 63);
    *m = static_cast<float>(q[j + 4] & 63);
  } else {
    *sc = static_cast<float>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<float>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void check_k(int64_t K, const char* what) {
  check(K >= 0 && K % kKBlock == 0, what, " rows hold whole super-blocks of ", kKBlock, " weights, but a row has ", K);
}

}  // namespace

namespace {

// Q4_K and Q5_K: each 64 weights, sub-block 2s from the low nibbles of 32 bytes and 2s + 1 from
// their high ones; Q5_K's fifth bits come from qh (bit 2s, then 2s + 1, of byte l).
template <class Block, bool kFifthBit>
void dequantize_k4(const void* row, int64_t K, float* out, const char* what) {
  check_k(K, what);
  const auto* b = static_cast<const Block*>(row);
  for (int64_t i = 0; i < K / kKBlock; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int s = 0; s < 4; ++s, q += 32) {
      float sc0, m0, sc1, m1;
      scale_min_k4(2 * s, b[i].scales, &sc0, &m0);
      scale_min_k4(2 * s + 1, b[i].scales, &sc1, &m1);
      const auto high = [&](int l, int bit) -> int {
        if constexpr (kFifthBit) return (b[i].qh[l] >> bit & 1) * 16;
        return 0;
      };
      for (int l = 0; l < 32; ++l) *out++ = d * sc0 * static_cast<float>((q[l] & 0xF) + high(l, 2 * s)) - dmin * m0;
      for (int l = 0; l < 32; ++l) *out++ = d * sc1 * static_cast<float>((q[l] >> 4) + high(l, 2 * s + 1)) - dmin * m1;
    }
  }
}

}  // namespace

void dequantize_q4_k(const void* row, int64_t K, float* out) { dequantize_k4<BlockQ4_K, false>(row, K, out, "Q4_K"); }
void dequantize_q5_k(const void* row, int64_t K, float* out) { dequantize_k4<BlockQ5_K, true>(row, K, out, "Q5_K"); }

void dequantize_q6_k(const void* row, int64_t K, float* out) {
  check_k(K, "Q6_K");
  const auto* b = static_cast<const BlockQ6_K*>(row);
  for (int64_t i = 0; i < K / kKBlock; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t *ql = b[i].ql, *qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    // each 128 weights: four runs of 32 from 64 low-bit bytes and 32 high-bit bytes
    for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, out += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        out[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

int64_t first_nonfinite(WType t, const void* row, int64_t K) {
  (void)row_bytes(t, K);
  switch (t) {
    case WType::F32:
      for (int64_t k = 0; k < K; ++k)
        if (!std::isfinite(static_cast<const float*>(row)[k])) return k;
      return -1;
    case WType::BF16:
    case WType::F16: {
      // all exponent bits set: infinity or NaN, in either layout
      const uint16_t mask = t == WType::BF16 ? 0x7f80 : 0x7c00;
      for (int64_t k = 0; k < K; ++k)
        if ((static_cast<const uint16_t*>(row)[k] & mask) == mask) return k;
      return -1;
    }
    case WType::Q8_0:
    case WType::Q4_0: {
      const size_t block = t == WType::Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
      for (int64_t i = 0; i < K / kQBlock; ++i) {
        uint16_t d;
        std::memcpy(&d, static_cast<const uint8_t*>(row) + static_cast<size_t>(i) * block, 2);
        if ((d & 0x7c00) == 0x7c00) return i * kQBlock;
      }
      return -1;
    }
  }
  return -1;
}

void dequantize_row(WType t, const void* row, int64_t K, float* out) {
  (void)row_bytes(t, K);
  switch (t) {
    case WType::F32: std::memcpy(out, row, static_cast<size_t>(K) * 4); return;
    case WType::BF16:
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(static_cast<const uint16_t*>(row)[k]);
      return;
    case WType::F16:
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(static_cast<const uint16_t*>(row)[k]);
      return;
    case WType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(row);
      for (int64_t i = 0; i < K / kQBlock; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int64_t j = 0; j < kQBlock; ++j) out[i * kQBlock + j] = d * static_cast<float>(b[i].q[j]);
      }
      return;
    }
    case WType::Q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(row);
      for (int64_t i = 0; i < K / kQBlock; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int64_t j = 0; j < kQBlock / 2; ++j) {
          out[i * kQBlock + j] = d * static_cast<float>((b[i].q[j] & 15) - 8);
          out[i * kQBlock + j + kQBlock / 2] = d * static_cast<float>((b[i].q[j] >> 4) - 8);
        }
      }
      return;
    }
  }
}

void quantize_activations(const float* x, int64_t K, float* d, int8_t* q) {
  check(K % kQBlock == 0, "quantize_activations: ", K, " is not a whole number of blocks of ", kQBlock);
  for (int64_t i = 0; i < K / kQBlock; ++i, x += kQBlock, q += kQBlock) {
    float amax = 0;
    bool finite = true;
    for (int64_t j = 0; j < kQBlock; ++j) {
      finite = finite && std::isfinite(x[j]);
      amax = std::max(amax, std::fabs(x[j]));
    }
    if (!finite) {
      d[i] = std::numeric_limits<float>::quiet_NaN();
      std::fill(q, q + kQBlock, int8_t{0});
      continue;
    }
    d[i] = amax / 127.0f;
    // 127 / amax overflows for amax below 127 / FLT_MAX (an all-zero block too): q = 0, never the
    // NaN of 0 * infinity
    const float inv = 127.0f / amax, id = std::isfinite(inv) ? inv : 0.0f;
    // |x * id| <= 127 up to rounding of id: clamped, so that the products' operands stay in
    // [-127, 127] whatever the rounding
    for (int64_t j = 0; j < kQBlock; ++j)
      q[j] = static_cast<int8_t>(std::clamp(std::nearbyint(x[j] * id), -127.0f, 127.0f));
  }
}

// ---------------------------------------------------------------------------------------------
// The matrix-vector product

bool cpu_has_avx512_vnni() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512vnni")) return false;
  const char* env = std::getenv("QKV_VNNI");
  return !(env && std::strcmp(env, "0") == 0);
}

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) return false;
  const char* env = std::getenv("QKV_BF16_DOT");
  return !(env && std::strcmp(env, "0") == 0);
}

QuantIsa quant_isa(Isa isa) {
#define QKV_QUANT_TABLE(ns, v, dp) \
  QuantIsa { ns::rows_q4_0, ns::rows_q8_0, ns::dot_f16, ns::dot_bf16, ns::round_bf16, ns::quantize_blocks, \
             ns::q4_0_group_bf16, v, dp }
  switch (isa) {
    case Isa::AVX512: return QKV_QUANT_TABLE(avx512, cpu_has_avx512_vnni(), cpu_has_avx512_bf16());
    case Isa::AVX2: return QKV_QUANT_TABLE(avx2, false, false);
    default: return QKV_QUANT_TABLE(generic, false, false);
  }
}

QuantIsa quant_isa_w16avx2() { return QKV_QUANT_TABLE(w16avx2, false, false); }
#undef QKV_QUANT_TABLE

void q4_block_corrections(const int8_t* q, int64_t nb, int32_t* c) {
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = 0;
    for (int64_t j = 0; j < kQBlock; ++j) s += q[i * kQBlock + j];
    c[i] = -8 * s;
  }
}

namespace {

// Group g's block i, and where row r (of 16) keeps its scale and its bytes 4k .. 4k + 3 there.
uint8_t* group_block(uint8_t* W, int64_t K, int64_t g, int64_t i) {
  return W + static_cast<size_t>(g) * kQ4Group * row_bytes(WType::Q4_0, K) + static_cast<size_t>(i) * kQ4GroupBlock;
}
constexpr size_t scale_at(int64_t r) { return static_cast<size_t>(2 * r); }
constexpr size_t bytes_at(int64_t r, int64_t k) { return static_cast<size_t>(32 + 64 * k + 4 * r); }

}  // namespace

void q4_0_group_rows(uint8_t* W, int64_t N, int64_t K) {
  const int64_t nb = K / kQBlock, groups = N / kQ4Group;
  const size_t rb = row_bytes(WType::Q4_0, K);
#pragma omp parallel num_threads(num_threads()) if (groups > 1)
  {
    std::vector<uint8_t> rows(kQ4Group * rb);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* base = W + static_cast<size_t>(g) * kQ4Group * rb;
      std::memcpy(rows.data(), base, rows.size());
      for (int64_t r = 0; r < kQ4Group; ++r) {
        const auto* b = reinterpret_cast<const BlockQ4_0*>(rows.data() + static_cast<size_t>(r) * rb);
        for (int64_t i = 0; i < nb; ++i) {
          uint8_t* out = group_block(W, K, g, i);
          std::memcpy(out + scale_at(r), &b[i].d, 2);
          for (int64_t k = 0; k < 4; ++k) std::memcpy(out + bytes_at(r, k), b[i].q + 4 * k, 4);
        }
      }
    }
  }
}

void q4_0_file_row(const uint8_t* W, int64_t N, int64_t K, int64_t r, uint8_t* out) {
  const size_t rb = row_bytes(WType::Q4_0, K);
  check(r >= 0 && r < N, "q4_0_file_row: row ", r, " outside [0, ", N, ")");
  if (r >= N / kQ4Group * kQ4Group) {
    std::memcpy(out, W + static_cast<size_t>(r) * rb, rb);
    return;
  }
  auto* b = reinterpret_cast<BlockQ4_0*>(out);
  const int64_t g = r / kQ4Group, l = r % kQ4Group;
  for (int64_t i = 0; i < K / kQBlock; ++i) {
    const uint8_t* in = group_block(const_cast<uint8_t*>(W), K, g, i);
    std::memcpy(&b[i].d, in + scale_at(l), 2);
    for (int64_t k = 0; k < 4; ++k) std::memcpy(b[i].q + 4 * k, in + bytes_at(l, k), 4);
  }
}

// Workspace: xd (nb floats), xq (K bytes), then for Q4_0 the block corrections (nb int32); for
// bf16 the activations rounded to bf16 (K values).
size_t gemv_workspace_bytes(WType t, int64_t K) {
  if (t == WType::BF16) return static_cast<size_t>(K) * sizeof(uint16_t);
  if (t != WType::Q8_0 && t != WType::Q4_0) return 0;
  const size_t nb = static_cast<size_t>(K / kQBlock);
  return nb * sizeof(float) + static_cast<size_t>(K) + (t == WType::Q4_0 ? nb * sizeof(int32_t) : 0);
}

void gemv_parts_with(const QuantIsa& k, WType t, const GemvPart* parts, int64_t n_parts, int64_t K, const float* x,
                     void* workspace, int threads) {
  check(t != WType::F32, "gemv: f32 weights go through qkv::sgemm");
  check(n_parts >= 0 && n_parts <= 16, "gemv: ", n_parts, " parts (at most 16)");
  // Rows in fixed chunks of 16: each row's sum is one thread's, in an order set by K alone.
  constexpr int64_t kRows = 16;
  int64_t first[17] = {0};  // part p's chunks are [first[p], first[p + 1])
  for (int64_t p = 0; p < n_parts; ++p) {
    check(parts[p].N >= 0, "gemv: negative row count ", parts[p].N);
    first[p + 1] = first[p] + (parts[p].N + kRows - 1) / kRows;
  }
  const size_t rb = row_bytes(t, K);
  const int64_t chunks = first[n_parts];
  if (chunks == 0) return;
  const int64_t nb = K / kQBlock;
  float* xd = nullptr;
  int8_t* xq = nullptr;
  int32_t* corr = nullptr;
  uint16_t* xb = nullptr;
  if (t == WType::BF16) {
    check(workspace != nullptr || K == 0, "gemv: bf16 needs a workspace of ", gemv_workspace_bytes(t, K), " bytes");
    xb = static_cast<uint16_t*>(workspace);
    k.round_bf16(x, xb, K);
  }
  if (t == WType::Q8_0 || t == WType::Q4_0) {
    check(workspace != nullptr, "gemv: ", wtype_name(t), " needs a workspace of ", gemv_workspace_bytes(t, K),
          " bytes");
    xd = static_cast<float*>(workspace);
    xq = reinterpret_cast<int8_t*>(xd + nb);
    k.quantize_blocks(x, nb, xd, xq);
    if (t == WType::Q4_0) {
      corr = reinterpret_cast<int32_t*>(xq + K);
      q4_block_corrections(xq, nb, corr);
    }
  }
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(static) if (chunks > 1 && threads > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t p = 0;
    while (c >= first[p + 1]) ++p;
    const GemvPart& part = parts[p];
    const auto* base = static_cast<const uint8_t*>(part.W);
    const int64_t n0 = (c - first[p]) * kRows, n1 = std::min(part.N, n0 + kRows);
    float* y = part.y;
    if (t == WType::Q4_0 || t == WType::Q8_0) {
      (t == WType::Q4_0 ? k.rows_q4_0 : k.rows_q8_0)(base + static_cast<size_t>(n0) * rb, rb, n1 - n0, xd, xq, corr,
                                                     nb, y + n0, k.vnni);
      continue;
    }
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* row = base + static_cast<size_t>(n) * rb;
      switch (t) {
        case WType::F32: break;  // refused above
        case WType::BF16: y[n] = k.dot_bf16(reinterpret_cast<const uint16_t*>(row), xb, K, k.bf16dp); break;
        case WType::F16: y[n] = k.dot_f16(reinterpret_cast<const uint16_t*>(row), x, K); break;
        case WType::Q8_0:
        case WType::Q4_0: break;  // above
      }
    }
  }
}

void gemv_with(const QuantIsa& k, WType t, const void* W, int64_t N, int64_t K, const float* x, float* y,
               void* workspace, int threads) {
  const GemvPart part{W, N, y};
  gemv_parts_with(k, t, &part, 1, K, x, workspace, threads);
}

void gemv(WType t, const void* W, int64_t N, int64_t K, const float* x, float* y, void* workspace, int threads) {
  static const QuantIsa k = quant_isa(active_isa());
  gemv_with(k, t, W, N, K, x, y, workspace, threads);
}

void gemv_parts(WType t, const GemvPart* parts, int64_t n_parts, int64_t K, const float* x, void* workspace,
                int threads) {
  static const QuantIsa k = quant_isa(active_isa());
  gemv_parts_with(k, t, parts, n_parts, K, x, workspace, threads);
}

void gemv_reference(WType t, const void* W, int64_t N, int64_t K, const float* x, double* y) {
  const size_t rb = row_bytes(t, K);
  // the activations as the kernel sees them: for bf16 rounded to bf16, for Q8_0 and Q4_0 d * q per block
  std::vector<double> xa(x, x + K);
  if (t == WType::BF16)
    for (int64_t k = 0; k < K; ++k) xa[k] = bf16_to_f32(f32_to_bf16(x[k]));
  if (t == WType::Q8_0 || t == WType::Q4_0) {
    std::vector<float> d(static_cast<size_t>(K / kQBlock));
    std::vector<int8_t> q(static_cast<size_t>(K));
    quantize_activations(x, K, d.data(), q.data());
    for (int64_t k = 0; k < K; ++k) xa[k] = static_cast<double>(d[k / kQBlock]) * q[k];
  }
  std::vector<float> w(static_cast<size_t>(K));
  std::vector<uint8_t> row(t == WType::Q4_0 ? rb : 0);
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* r = static_cast<const uint8_t*>(W) + static_cast<size_t>(n) * rb;
    if (t == WType::Q4_0) q4_0_file_row(static_cast<const uint8_t*>(W), N, K, n, row.data()), r = row.data();
    dequantize_row(t, r, K, w.data());
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += static_cast<double>(w[k]) * xa[k];
    y[n] = s;
  }
}

}  // namespace qkv::kernels
