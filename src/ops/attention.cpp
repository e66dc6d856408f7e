// attention op: shape checks, mask assembly, workspace planning, dispatch to the kernels.
#include "qkv/attention.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include "kernels/attention_ref.h"
#include "kernels/flash_attention.h"
#include "qkv/cpu.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

using kernels::AttnInputs;
using kernels::AttnShape;

// (T, D) -> (1, 1, T, D); (H, T, D) -> (1, H, T, D); (B, H, T, D) as is. Last dim contiguous
// (an explicit copy is made otherwise).
Tensor as4d(const Tensor& t, const char* name, DType dtype) {
  check(t.defined(), name, ": tensor is empty (not defined)");
  check(t.dtype() == dtype, name, ": expected ", dtype == DType::F64 ? "float64 (as q is)" : "float32", ", got ",
        t.describe());
  check(t.dim() >= 2 && t.dim() <= 4, name, ": expected (B, H, T, D), (H, T, D) or (T, D), got shape ",
        shape_str(t.shape()));
  Tensor x = t;
  if (x.size(-1) > 1 && x.stride(-1) != 1) x = x.contiguous();
  while (x.dim() < 4) {
    std::vector<int64_t> sh = x.shape(), st = x.strides();
    sh.insert(sh.begin(), 1);
    st.insert(st.begin(), 0);
    x = x.as_strided(sh, st, x.offset());
  }
  return x;
}

struct Prepared {
  Tensor q, k, v;             // 4-D views
  AttnShape s;
  double scale = 1;
  kernels::MaskParams m;
  Tensor mask, bool_mask;     // kept alive
  std::vector<int64_t> key_len;
  std::vector<float> slopes;
  int threads = 1;
  std::vector<int64_t> q_shape;  // caller's shape of q, to shape results
};

kernels::Strides strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// Broadcast strides of `t` against (B, H, Tq, Tk).
void broadcast_strides(const Tensor& t, const AttnShape& s, const char* name, int64_t out[4]) {
  const int64_t target[4] = {s.B, s.H, s.Tq, s.Tk};
  check(t.dim() <= 4, name, ": expected at most 4 dimensions broadcastable to ",
        shape_str({s.B, s.H, s.Tq, s.Tk}), ", got ", shape_str(t.shape()));
  const int64_t lead = 4 - t.dim();
  for (int64_t d = 0; d < 4; ++d) {
    if (d < lead) {
      out[d] = 0;
      continue;
    }
    const int64_t n = t.size(d - lead);
    check(n == target[d] || n == 1, name, ": shape ", shape_str(t.shape()), " does not broadcast to (B, H, Tq, Tk) = ",
          shape_str({s.B, s.H, s.Tq, s.Tk}));
    out[d] = n == 1 ? 0 : t.stride(d - lead);
  }
}

Prepared prepare(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionSpec& spec) {
  Prepared p;
  p.q_shape = q_in.defined() ? q_in.shape() : std::vector<int64_t>{};
  // float64 runs on the float64 reference only (gradient checks in double precision)
  const DType dt = q_in.defined() && q_in.dtype() == DType::F64 ? DType::F64 : DType::F32;
  check(dt == DType::F32 || spec.impl == AttentionImpl::Reference, "q: expected float32, got ", q_in.describe(),
        " (float64 inputs run on the float64 reference only: impl = Reference)");
  p.q = as4d(q_in, "q", dt);
  p.k = as4d(k_in, "k", dt);
  p.v = as4d(v_in, "v", dt);
  AttnShape& s = p.s;
  s.B = p.q.size(0);
  s.H = p.q.size(1);
  s.Tq = p.q.size(2);
  s.Dk = p.q.size(3);
  s.Hkv = p.k.size(1);
  s.Tk = p.k.size(2);
  s.Dv = p.v.size(3);
  const auto shp = [](const Tensor& t) { return shape_str(t.shape()); };
  check(p.k.size(0) == s.B && p.v.size(0) == s.B, "batch sizes differ: q ", shp(q_in), ", k ", shp(k_in), ", v ",
        shp(v_in));
  check(p.k.size(3) == s.Dk, "q and k must have the same last dimension Dk: q ", shp(q_in), ", k ", shp(k_in));
  check(p.v.size(1) == s.Hkv && p.v.size(2) == s.Tk, "k and v must agree in (B, Hkv, Tk): k ", shp(k_in), ", v ",
        shp(v_in));
  check(s.Hkv >= 1 || s.H == 0, "k has zero heads: ", shp(k_in));
  check(s.Hkv == 0 || s.H % s.Hkv == 0, "the number of kv heads (", s.Hkv, ") must divide the number of query heads (",
        s.H, "): q ", shp(q_in), ", k ", shp(k_in));

  p.scale = spec.scale ? *spec.scale : (s.Dk > 0 ? 1.0 / std::sqrt(static_cast<double>(s.Dk)) : 1.0);
  check(std::isfinite(p.scale), "scale must be finite, got ", p.scale);
  check(spec.window >= 0, "window must be >= 0 (0 = no window), got ", spec.window);
  p.m.causal = spec.causal;
  p.m.top_left = spec.align == Align::TopLeft;
  p.m.window = spec.window;

  if (spec.alibi || !spec.alibi_slopes.empty()) {
    p.slopes = spec.alibi_slopes.empty() ? alibi_slopes(s.H) : spec.alibi_slopes;
    check(static_cast<int64_t>(p.slopes.size()) == s.H, "alibi_slopes: expected ", s.H, " values (one per head), got ",
          p.slopes.size());
    for (float x : p.slopes) check(std::isfinite(x), "alibi_slopes: every slope must be finite");
    p.m.alibi = p.slopes.data();
  }
  if (spec.mask) {
    check(spec.mask->dtype() == DType::F32, "mask: expected float32 additive mask (0 = allowed, -inf = blocked), got ",
          spec.mask->describe());
    p.mask = spec.mask->contiguous();
    const float* mp = p.mask.data<float>();
    for (int64_t i = 0; i < p.mask.numel(); ++i)
      check(!std::isnan(mp[i]) && mp[i] != std::numeric_limits<float>::infinity(),
            "mask: entry ", i, " is ", mp[i], "; expected finite values or -inf");
    broadcast_strides(p.mask, s, "mask", p.m.add_s);
    p.m.add = mp;
  }
  if (spec.bool_mask) {
    check(spec.bool_mask->dtype() == DType::Bool, "bool_mask: expected bool (true = may attend), got ",
          spec.bool_mask->describe());
    p.bool_mask = spec.bool_mask->contiguous();
    broadcast_strides(p.bool_mask, s, "bool_mask", p.m.allow_s);
    p.m.allow = reinterpret_cast<const uint8_t*>(p.bool_mask.raw_data());
  }
  if (spec.key_lengths) {
    const Tensor& kl = *spec.key_lengths;
    check(kl.dim() == 1 && kl.size(0) == s.B, "key_lengths: expected shape (B,) = ", shape_str({s.B}), ", got ",
          shape_str(kl.shape()));
    check(kl.dtype() == DType::I32 || kl.dtype() == DType::I64, "key_lengths: expected int32 or int64, got ",
          kl.describe());
    Tensor l64 = kl.to(DType::I64);
    p.key_len.assign(l64.data<int64_t>(), l64.data<int64_t>() + s.B);
    for (int64_t b = 0; b < s.B; ++b)
      check(p.key_len[b] >= 0 && p.key_len[b] <= s.Tk, "key_lengths[", b, "] = ", p.key_len[b],
            ": expected 0 <= length <= Tk = ", s.Tk);
    p.m.key_len = p.key_len.data();
  }
  p.threads = spec.threads > 0 ? spec.threads : num_threads();
  return p;
}

// Result shape: q's leading dims with the last replaced (or dropped).
std::vector<int64_t> result_shape(const std::vector<int64_t>& q_shape, int64_t last, bool drop_last) {
  std::vector<int64_t> r = q_shape;
  if (drop_last)
    r.pop_back();
  else
    r.back() = last;
  return r;
}

AttnInputs<float> inputs_f32(const Prepared& p, bool bf16) {
  AttnInputs<float> in;
  in.bf16 = bf16;
  in.s = p.s;
  in.scale = p.scale;
  in.m = p.m;
  in.q = p.q.data<float>();
  in.qs = strides_of(p.q);
  in.k = p.k.data<float>();
  in.ks = strides_of(p.k);
  in.v = p.v.data<float>();
  in.vs = strides_of(p.v);
  return in;
}

// The kernels' workspace, 64-byte aligned, contents unspecified: from Storage's block cache, so
// that a training step's calls reuse the blocks of the step before (a fresh block of megabytes is
// fresh pages: faults and the kernel's zeroing on first touch, every call).
struct Workspace {
  Storage block;
  void* ptr;
  explicit Workspace(size_t bytes) : block(bytes, false), ptr(block.data()) {}
};

// The reference in precision T on inputs converted to T (float: no copies needed).
template <class T>
struct RefInputs {
  Tensor q, k, v;
  AttnInputs<T> in;
  RefInputs(const Prepared& p, bool bf16) {
    in.bf16 = bf16;
    q = p.q.to(dtype_of<T>());
    k = p.k.to(dtype_of<T>());
    v = p.v.to(dtype_of<T>());
    in.s = p.s;
    in.scale = p.scale;
    in.m = p.m;
    in.q = q.data<T>();
    in.qs = strides_of(q);
    in.k = k.data<T>();
    in.ks = strides_of(k);
    in.v = v.data<T>();
    in.vs = strides_of(v);
  }
};

template <class T>
void ref_forward(const Prepared& p, bool bf16, Tensor& out, Tensor& lse) {
  const AttnShape& s = p.s;
  RefInputs<T> r(p, bf16);
  Tensor o({s.B, s.H, s.Tq, s.Dv}, dtype_of<T>()), l({s.B, s.H, s.Tq}, dtype_of<T>());
  kernels::attention_ref_forward<T>(r.in, o.data<T>(), l.data<T>(), p.threads);
  // float64 inputs keep float64 results
  const bool keep = p.q.dtype() == DType::F64;
  out = keep ? o : o.to(DType::F32);
  lse = keep ? l : l.to(DType::F32);
}

template <class T>
void ref_backward(const Prepared& p, bool bf16, const Tensor& dO, Tensor& dq, Tensor& dk, Tensor& dv) {
  RefInputs<T> r(p, bf16);
  Tensor dOt = dO.to(dtype_of<T>());
  Tensor a(dq.shape(), dtype_of<T>()), b(dk.shape(), dtype_of<T>()), c(dv.shape(), dtype_of<T>());
  kernels::attention_ref_backward<T>(r.in, dOt.data<T>(), a.data<T>(), b.data<T>(), c.data<T>(), p.threads);
  const bool keep = p.q.dtype() == DType::F64;
  dq = keep ? a : a.to(DType::F32);
  dk = keep ? b : b.to(DType::F32);
  dv = keep ? c : c.to(DType::F32);
}

Isa chosen_isa(const AttentionSpec& spec) {
  if (!spec.isa) return active_isa();
  check(cpu_supports(*spec.isa), "attention: isa ", isa_name(*spec.isa), " is not supported by this CPU");
  return *spec.isa;
}

// Products in bfloat16 (AttnInputs::bf16) while a Bf16Matmul lives on this thread and the
// kernel for the chosen ISA has them (AVX512_BF16); the references then round the same operands.
// A single query row (a decoding step's shape) stays float32: the flash kernel's forward pass
// takes its float32 decoding path there, and backward must recompute the scores it saved.
bool bf16_products(const AttentionSpec& spec, const kernels::AttnShape& s) {
  return s.Tq > 1 && Bf16Matmul::active() && kernels::flash_bf16_supported(chosen_isa(spec));
}

}  // namespace

bool bf16_attention_native() { return kernels::flash_bf16_supported(active_isa()); }

std::vector<float> alibi_slopes(int64_t H) {
  // Power-of-two n: 2^(-8/n), 2^(-16/n), ...; otherwise the closest smaller power of two's
  // slopes, then every other slope of twice that (Press et al. 2022).
  auto pow2_slopes = [](int64_t n) {
    std::vector<float> r;
    const double start = std::pow(2.0, -8.0 / static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i) r.push_back(static_cast<float>(std::pow(start, static_cast<double>(i + 1))));
    return r;
  };
  if (H <= 0) return {};
  int64_t p2 = 1;
  while (p2 * 2 <= H) p2 *= 2;
  std::vector<float> r = pow2_slopes(p2);
  if (p2 != H) {
    std::vector<float> extra = pow2_slopes(2 * p2);
    for (int64_t i = 0; static_cast<int64_t>(r.size()) < H; i += 2) r.push_back(extra[i]);
  }
  return r;
}

AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec) {
  Prepared p = prepare(q, k, v, spec);
  const AttnShape& s = p.s;
  Tensor out({s.B, s.H, s.Tq, s.Dv}, DType::F32);
  Tensor lse({s.B, s.H, s.Tq}, DType::F32);
  if (out.numel() > 0 || lse.numel() > 0) {
    const bool bf16 = bf16_products(spec, s);
    if (spec.impl == AttentionImpl::Reference) {
      ref_forward<double>(p, bf16, out, lse);
    } else if (spec.impl == AttentionImpl::ReferenceFloat32) {
      ref_forward<float>(p, bf16, out, lse);
    } else {
      const Isa isa = chosen_isa(spec);
      Workspace ws(kernels::flash_forward_workspace(s, p.threads, isa, bf16));
      kernels::flash_forward(inputs_f32(p, bf16), out.data<float>(), lse.data<float>(), ws.ptr, p.threads, isa);
    }
  }
  return {out.view(result_shape(p.q_shape, s.Dv, false)), lse.view(result_shape(p.q_shape, 0, true))};
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const AttentionSpec& spec) {
  Prepared p = prepare(q, k, v, spec);
  const AttnShape& s = p.s;
  const std::vector<int64_t> oshape = result_shape(p.q_shape, s.Dv, false);
  const std::vector<int64_t> lshape = result_shape(p.q_shape, 0, true);
  const DType dt = p.q.dtype();
  const char* dname = dt == DType::F64 ? "float64 " : "float32 ";
  check(out.defined() && out.shape() == oshape && out.dtype() == dt, "out: expected ", dname, shape_str(oshape),
        ", got ", out.defined() ? out.describe() : "nothing");
  check(dout.defined() && dout.shape() == oshape && dout.dtype() == dt, "dout: expected ", dname, shape_str(oshape),
        ", got ", dout.defined() ? dout.describe() : "nothing");
  check(lse.defined() && lse.shape() == lshape && lse.dtype() == dt, "lse: expected ", dname, shape_str(lshape),
        ", got ", lse.defined() ? lse.describe() : "nothing");
  // the flash kernel writes every element of the gradients (zeroing them itself, on every thread)
  const bool flash = spec.impl != AttentionImpl::Reference && spec.impl != AttentionImpl::ReferenceFloat32;
  auto grad = [flash](std::vector<int64_t> shape) {
    return flash ? Tensor::empty(std::move(shape), DType::F32) : Tensor(std::move(shape), DType::F32);
  };
  Tensor dq = grad({s.B, s.H, s.Tq, s.Dk}), dk = grad({s.B, s.Hkv, s.Tk, s.Dk}), dv = grad({s.B, s.Hkv, s.Tk, s.Dv});
  Tensor o = out.contiguous(), dO = dout.contiguous(), l = lse.contiguous();
  const bool bf16 = bf16_products(spec, s);
  if (spec.impl == AttentionImpl::Reference) {
    ref_backward<double>(p, bf16, dO, dq, dk, dv);
  } else if (spec.impl == AttentionImpl::ReferenceFloat32) {
    ref_backward<float>(p, bf16, dO, dq, dk, dv);
  } else {
    const Isa isa = chosen_isa(spec);
    Workspace ws(kernels::flash_backward_workspace(s, p.threads, isa, bf16));
    kernels::flash_backward(inputs_f32(p, bf16), o.data<float>(), dO.data<float>(), l.data<float>(), dq.data<float>(),
                            dk.data<float>(), dv.data<float>(), ws.ptr, p.threads, isa);
  }
  return {dq.view(q.shape()), dk.view(k.shape()), dv.view(v.shape())};
}

Tensor attention_weights(const Tensor& q, const Tensor& k, const Tensor& lse, const AttentionSpec& spec,
                         int64_t row_begin, int64_t row_end) {
  // v is only needed for its shape checks: use k in its place (Dv = Dk).
  Prepared p = prepare(q, k, k, spec);
  const AttnShape& s = p.s;
  check(0 <= row_begin && row_begin <= row_end && row_end <= s.Tq, "attention_weights: rows [", row_begin, ", ",
        row_end, ") are outside [0, Tq = ", s.Tq, ")");
  const std::vector<int64_t> lshape = result_shape(p.q_shape, 0, true);
  check(lse.defined() && lse.shape() == lshape && lse.dtype() == DType::F32, "lse: expected float32 ",
        shape_str(lshape), ", got ", lse.defined() ? lse.describe() : "nothing");
  Tensor l = lse.contiguous();
  Tensor w({s.B, s.H, row_end - row_begin, s.Tk}, DType::F32);
  if (w.numel() > 0)
    kernels::attention_weights_from_lse(inputs_f32(p, false), l.data<float>(), row_begin, row_end, w.data<float>(),
                                        p.threads);
  std::vector<int64_t> shape = p.q_shape;
  shape.back() = s.Tk;
  shape[shape.size() - 2] = row_end - row_begin;
  return w.view(shape);
}

}  // namespace qkv
