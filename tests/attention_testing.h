// Shared helpers for the attention tests: random problems, the float64 oracle called directly
// (so its result is not rounded to float32), and error reports that say where and by how much.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention_ref.h"
#include "kernels/flash_attention.h"
#include "qkv/qkv.h"

namespace qkv::testing {

inline Tensor randn(std::vector<int64_t> shape, std::mt19937& rng, float sd = 1.0f) {
  Tensor t(std::move(shape), DType::F32);
  std::normal_distribution<float> n(0.0f, sd);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = n(rng);
  return t;
}

inline std::vector<float> values(const Tensor& t) {
  Tensor c = t.contiguous();
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

// Largest |a - b| and where; a is float32, b a float64 oracle.
struct MaxErr {
  double err = 0;
  int64_t at = -1;
  double got = 0, want = 0;
  bool nan = false;
};
inline MaxErr max_err(const Tensor& a, const std::vector<double>& b) {
  std::vector<float> av = values(a);
  MaxErr m;
  for (size_t i = 0; i < av.size(); ++i) {
    if (std::isnan(av[i]) || std::isnan(b[i])) {
      m.nan = true;
      m.at = static_cast<int64_t>(i);
      return m;
    }
    const double e = std::fabs(static_cast<double>(av[i]) - b[i]);
    if (e > m.err) m = {e, static_cast<int64_t>(i), av[i], b[i], false};
  }
  return m;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// The FlashAttention-style bound: the fused kernel's error against float64 is at most twice
// the plain float32 implementation's error, plus eps.
inline ::testing::AssertionResult within_bound(const char* what, const Tensor& fused, const Tensor& plain,
                                                const std::vector<double>& oracle, double eps) {
  const MaxErr f = max_err(fused, oracle), p = max_err(plain, oracle);
  const double bound = 2.0 * p.err + eps;
  if (!f.nan && f.err <= bound) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << what << ": flash error " << f.err << " at element " << f.at << " (got " << f.got << ", want " << f.want
     << (f.nan ? ", NaN" : "") << ") exceeds bound " << bound << " = 2 x plain-float32 error " << p.err << " + " << eps;
  return ::testing::AssertionFailure() << os.str();
}

// The float64 oracle, called directly on double copies of the float32 inputs.
struct Oracle {
  std::vector<double> out, lse, dq, dk, dv;
};

inline kernels::MaskParams mask_params(const AttentionSpec& spec, const kernels::AttnShape& s, Tensor& mask_c,
                                       Tensor& bool_c, std::vector<int64_t>& lens, std::vector<float>& slopes) {
  kernels::MaskParams m;
  m.causal = spec.causal;
  m.top_left = spec.align == Align::TopLeft;
  m.window = spec.window;
  if (spec.alibi) {
    slopes = spec.alibi_slopes.empty() ? alibi_slopes(s.H) : spec.alibi_slopes;
    m.alibi = slopes.data();
  }
  auto bstrides = [&](const Tensor& t, int64_t* out) {
    const int64_t target[4] = {s.B, s.H, s.Tq, s.Tk};
    const int64_t lead = 4 - t.dim();
    for (int64_t d = 0; d < 4; ++d)
      out[d] = d < lead || t.size(d - lead) == 1 ? 0 : t.stride(d - lead);
    (void)target;
  };
  if (spec.mask) {
    mask_c = spec.mask->contiguous();
    m.add = mask_c.data<float>();
    bstrides(mask_c, m.add_s);
  }
  if (spec.bool_mask) {
    bool_c = spec.bool_mask->contiguous();
    m.allow = reinterpret_cast<const uint8_t*>(bool_c.raw_data());
    bstrides(bool_c, m.allow_s);
  }
  if (spec.key_lengths) {
    Tensor l = spec.key_lengths->to(DType::I64);
    lens.assign(l.data<int64_t>(), l.data<int64_t>() + l.numel());
    m.key_len = lens.data();
  }
  return m;
}

// Kernel arguments for 4-D q, k, v (last dimension contiguous) and a spec, in precision T
// (double: converted copies; float: the tensors themselves). Owns what the pointers point to.
template <class T>
struct KernelInputs {
  Tensor q, k, v, mask_c, bool_c;
  std::vector<int64_t> lens;
  std::vector<float> slopes;
  kernels::AttnInputs<T> in;
  KernelInputs(const Tensor& q4, const Tensor& k4, const Tensor& v4, const AttentionSpec& spec)
      : q(convert(q4)), k(convert(k4)), v(convert(v4)) {
    in.s = {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
    in.scale = spec.scale ? *spec.scale : 1.0 / std::sqrt(static_cast<double>(in.s.Dk));
    in.m = mask_params(spec, in.s, mask_c, bool_c, lens, slopes);
    in.q = q.data<T>();
    in.qs = {q.stride(0), q.stride(1), q.stride(2)};
    in.k = k.data<T>();
    in.ks = {k.stride(0), k.stride(1), k.stride(2)};
    in.v = v.data<T>();
    in.vs = {v.stride(0), v.stride(1), v.stride(2)};
  }
  KernelInputs(const KernelInputs&) = delete;
  KernelInputs& operator=(const KernelInputs&) = delete;

 private:
  static Tensor convert(const Tensor& t) { return t.dtype() == dtype_of<T>() ? t : t.to(dtype_of<T>()); }
};

// q, k, v: 4-D float32; dout may be undefined (forward only). bf16: the reference that rounds the
// operands of each product as the flash kernel's bf16 products do (AttnInputs::bf16), its twin.
inline Oracle oracle(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const AttentionSpec& spec,
                     bool bf16 = false) {
  KernelInputs<double> ki(q, k, v, spec);
  ki.in.bf16 = bf16;
  const kernels::AttnShape& s = ki.in.s;
  Oracle o;
  o.out.resize(s.B * s.H * s.Tq * s.Dv);
  o.lse.resize(s.B * s.H * s.Tq);
  kernels::attention_ref_forward<double>(ki.in, o.out.data(), o.lse.data(), 2);
  if (dout.defined()) {
    Tensor dd = dout.to(DType::F64);
    o.dq.resize(s.B * s.H * s.Tq * s.Dk);
    o.dk.resize(s.B * s.Hkv * s.Tk * s.Dk);
    o.dv.resize(s.B * s.Hkv * s.Tk * s.Dv);
    kernels::attention_ref_backward<double>(ki.in, dd.data<double>(), o.dq.data(), o.dk.data(), o.dv.data(), 2);
  }
  return o;
}

// The test-only w16avx2 variant of the flash kernel (the AVX-512 logic built for AVX2), called
// directly. q, k, v: 4-D float32 with a contiguous last dimension; dout 4-D contiguous.
struct DirectResult {
  Tensor out, lse, dq, dk, dv;
};
inline DirectResult flash_w16(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                              const AttentionSpec& spec, int threads) {
  const KernelInputs<float> ki(q, k, v, spec);
  const kernels::AttnInputs<float>& in = ki.in;
  const kernels::AttnShape& s = in.s;
  DirectResult r{Tensor({s.B, s.H, s.Tq, s.Dv}, DType::F32), Tensor({s.B, s.H, s.Tq}, DType::F32),
                 Tensor({s.B, s.H, s.Tq, s.Dk}, DType::F32), Tensor({s.B, s.Hkv, s.Tk, s.Dk}, DType::F32),
                 Tensor({s.B, s.Hkv, s.Tk, s.Dv}, DType::F32)};
  auto workspace = [](size_t bytes) {
    return std::unique_ptr<void, decltype(&std::free)>(std::aligned_alloc(64, (bytes + 127) / 64 * 64), &std::free);
  };
  auto ws = workspace(kernels::w16avx2::flash_forward_workspace(s, threads, false));
  kernels::w16avx2::flash_forward(in, r.out.data<float>(), r.lse.data<float>(), ws.get(), threads);
  Tensor dc = dout.contiguous();
  auto wb = workspace(kernels::w16avx2::flash_backward_workspace(s, threads, false));
  kernels::w16avx2::flash_backward(in, r.out.data<float>(), dc.data<float>(), r.lse.data<float>(), r.dq.data<float>(),
                                   r.dk.data<float>(), r.dv.data<float>(), wb.get(), threads);
  return r;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  std::vector<float> x = values(a), y = values(b);
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace qkv::testing
