// Flash attention against the float64 oracle across sizes, head layouts, every mask kind and
// several combinations, strided views, each SIMD variant this CPU has, and 1 and 2 threads.
// The bound: flash's error is at most 2x the plain float32 implementation's error + eps.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_testing.h"
#include "error_testing.h"

namespace qkv::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float& at4(Tensor& t, int64_t b, int64_t h, int64_t i, int64_t d) {
  return t.data<float>()[((b * t.size(1) + h) * t.size(2) + i) * t.size(3) + d];
}

// Gradient epsilon: relative to the largest true gradient of any of q, k, v (the scale of the
// problem's gradients), so that a gradient which is exactly 0 in truth (e.g. dK with a single
// key) is judged against the rounding residue of D = rowsum(dO * O). docs/numerics.md.
double geps(const Oracle& o) { return 2e-6 * (1 + std::max({max_abs(o.dq), max_abs(o.dk), max_abs(o.dv)})); }

// Every output and gradient of a flash result within the bound.
void expect_within_bounds(const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                          const AttentionOutput& po, const AttentionGrads& pg, const Oracle& o) {
  EXPECT_TRUE(within_bound("out", out, po.out, o.out, 1e-6 * (1 + max_abs(o.out))));
  EXPECT_TRUE(within_bound("lse", lse, po.lse, o.lse, 1e-6 * (1 + max_abs(o.lse))));
  EXPECT_TRUE(within_bound("dq", dq, pg.dq, o.dq, geps(o)));
  EXPECT_TRUE(within_bound("dk", dk, pg.dk, o.dk, geps(o)));
  EXPECT_TRUE(within_bound("dv", dv, pg.dv, o.dv, geps(o)));
}

// Masks: each case fills the spec for a problem of the given sizes.
std::string apply_mask(int kind, AttentionSpec& spec, int64_t B, int64_t H, int64_t Tq, int64_t Tk, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto additive = [&](std::vector<int64_t> shape, float p_block) {
    Tensor m = randn(shape, rng);
    float* x = m.data<float>();
    for (int64_t i = 0; i < m.numel(); ++i)
      if (u(rng) < p_block) x[i] = -kInf;
    if (shape[shape.size() - 2] > 1)  // one fully blocked row
      for (int64_t j = 0; j < shape.back(); ++j) x[j] = -kInf;
    return m;
  };
  auto boolean = [&](std::vector<int64_t> shape, float p_block) {
    Tensor m(shape, DType::Bool);
    bool* x = m.data<bool>();
    for (int64_t i = 0; i < m.numel(); ++i) x[i] = u(rng) >= p_block;
    if (shape[shape.size() - 2] > 2)  // one fully blocked row (the last of the first matrix)
      for (int64_t j = 0; j < shape.back(); ++j) x[(shape[shape.size() - 2] - 1) * shape.back() + j] = false;
    return m;
  };
  auto lengths = [&] {
    std::vector<int32_t> l(B);
    for (int64_t b = 0; b < B; ++b) l[b] = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, Tk)(rng));
    if (B > 1) l[0] = 0;  // a batch row with no key at all
    return Tensor::from<int32_t>({B}, l);
  };
  switch (kind) {
    case 0: return "none";
    case 1: spec.causal = true; return "causal bottom-right";
    case 2: spec.causal = true; spec.align = Align::TopLeft; return "causal top-left";
    case 3: spec.window = 7; return "window 7";
    case 4: spec.window = 5; spec.causal = true; return "causal window 5";
    case 5: spec.alibi = true; spec.causal = Tq > 1; return "alibi";
    case 6: spec.mask = additive({B, 1, Tq, Tk}, 0.2f); return "additive (B,1,Tq,Tk)";
    case 7: spec.bool_mask = boolean({B, H, Tq, Tk}, 0.3f); return "bool (B,H,Tq,Tk)";
    case 8: spec.key_lengths = lengths(); return "key lengths";
    case 9:
      spec.causal = true;
      spec.key_lengths = lengths();
      spec.alibi = true;
      return "causal + key lengths + alibi";
    case 10:
      spec.bool_mask = boolean({Tq, Tk}, 0.2f);
      spec.mask = additive({1, H, 1, Tk}, 0.1f);
      spec.window = 9;
      return "bool (Tq,Tk) + additive (1,H,1,Tk) + window 9";
    default:
      spec.causal = true;
      spec.align = Align::TopLeft;
      spec.bool_mask = boolean({B, 1, Tq, Tk}, 0.25f);
      spec.scale = 0.3;
      return "causal top-left + bool + scale 0.3";
  }
}
constexpr int kMaskKinds = 12;

struct Dims {
  int64_t Dk, Dv;
};

std::vector<Isa> isas() {
  std::vector<Isa> r;
  for (Isa i : {Isa::Generic, Isa::AVX2, Isa::AVX512})
    if (cpu_supports(i)) r.push_back(i);
  return r;
}

// A view of (B, H, T, D) data laid out in an unusual way.
Tensor strided(const Tensor& x, int how, std::mt19937& rng) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  Tensor base;
  Tensor view;
  if (how == 1) {  // (B, T, H, D) storage, permuted
    base = randn({B, T, H, D}, rng);
    view = base.permute({0, 2, 1, 3});
  } else {  // rows padded: (B, H, T, D + 3) sliced
    base = randn({B, H, T, D + 3}, rng);
    view = base.slice(3, 0, D);
  }
  // copy x's values into the view
  Tensor xc = x.contiguous();
  const float* src = xc.data<float>();
  float* dst = static_cast<float*>(base.raw_data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          dst[view.offset() + b * view.stride(0) + h * view.stride(1) + t * view.stride(2) + d * view.stride(3)] =
              src[((b * H + h) * T + t) * D + d];
  return view;
}

void check_masked_rows(const Tensor& out, const Tensor& lse, const Tensor& dq, const std::vector<double>& oracle_lse,
                       int64_t Dv, int64_t Dk, const std::string& ctx) {
  std::vector<float> o = values(out), l = values(lse), g = values(dq);
  for (size_t r = 0; r < oracle_lse.size(); ++r) {
    if (oracle_lse[r] != -std::numeric_limits<double>::infinity()) continue;
    ASSERT_EQ(l[r], -kInf) << ctx << ": row " << r << " has no allowed key; lse should be -inf";
    for (int64_t d = 0; d < Dv; ++d) ASSERT_EQ(o[r * Dv + d], 0.0f) << ctx << ": fully masked row " << r;
    for (int64_t d = 0; d < Dk; ++d) ASSERT_EQ(g[r * Dk + d], 0.0f) << ctx << ": fully masked row " << r << " dq";
  }
}

// Flash forward and backward with this ISA and thread count, every result within the bound and
// every fully masked row exact; returns the forward result.
AttentionOutput flash_within_bounds(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                    const AttentionSpec& spec, Isa isa, int threads, const AttentionOutput& po,
                                    const AttentionGrads& pg, const Oracle& o, int64_t Dk, int64_t Dv,
                                    const std::string& ctx) {
  SCOPED_TRACE(std::string("isa=") + isa_name(isa) + " threads=" + std::to_string(threads));
  AttentionSpec fs = spec;
  fs.isa = isa;
  fs.threads = threads;
  const AttentionOutput fo = attention(q, k, v, fs);
  const AttentionGrads fg = attention_backward(q, k, v, fo.out, fo.lse, dout, fs);
  // eps: docs/numerics.md (relative to the largest true value; gradients get twice the room
  // because flash forms D = rowsum(dO * O) from the rounded output).
  expect_within_bounds(fo.out, fo.lse, fg.dq, fg.dk, fg.dv, po, pg, o);
  check_masked_rows(fo.out, fo.lse, fg.dq, o.lse, Dv, Dk, ctx);
  return fo;
}

TEST(FlashVsOracle, Grid) {
  const std::vector<int64_t> Ts = {1, 3, 17, 64, 97, 128, 257, 1025};
  const std::vector<Dims> dims = {{1, 1}, {8, 8}, {21, 64}, {64, 64}, {80, 21}, {128, 80}, {64, 128}, {8, 21}};
  const std::vector<std::pair<int64_t, int64_t>> heads = {{1, 1}, {8, 8}, {8, 2}, {8, 1}};
  std::mt19937 rng(2024);
  int cases = 0;
  int64_t idx = 0;
  for (int64_t Tq : Ts) {
    for (int64_t Tk : Ts) {
      ++idx;
      const Dims d = dims[(idx * 3) % dims.size()];
      auto [H, Hkv] = heads[idx % heads.size()];
      int64_t B = 2;
      // keep the float64 oracle affordable on two cores
      const double work = static_cast<double>(Tq) * Tk * H * std::max(d.Dk, d.Dv) * B;
      if (work > 3e7) B = 1;
      if (Tq * Tk * H * std::max(d.Dk, d.Dv) > 3e7) H = Hkv = 1;
      const int mask_kind = static_cast<int>(idx % kMaskKinds);
      AttentionSpec spec;
      const std::string mname = apply_mask(mask_kind, spec, B, H, Tq, Tk, rng);
      Tensor q = randn({B, H, Tq, d.Dk}, rng), k = randn({B, Hkv, Tk, d.Dk}, rng), v = randn({B, Hkv, Tk, d.Dv}, rng);
      Tensor dout = randn({B, H, Tq, d.Dv}, rng);
      const std::string ctx = "Tq=" + std::to_string(Tq) + " Tk=" + std::to_string(Tk) + " Dk=" + std::to_string(d.Dk) +
                              " Dv=" + std::to_string(d.Dv) + " H/Hkv=" + std::to_string(H) + "/" +
                              std::to_string(Hkv) + " B=" + std::to_string(B) + " mask: " + mname;
      SCOPED_TRACE(ctx);
      const Oracle o = oracle(q, k, v, dout, spec);
      AttentionSpec plain = spec;
      plain.impl = AttentionImpl::ReferenceFloat32;
      const AttentionOutput po = attention(q, k, v, plain);
      const AttentionGrads pg = attention_backward(q, k, v, po.out, po.lse, dout, plain);
      // Unusual layouts for some cases: the kernel must honour strides.
      Tensor qv = q, kv = k, vv = v;
      if (idx % 3 == 1) qv = strided(q, 1, rng);
      if (idx % 3 == 2) kv = strided(k, 2, rng), vv = strided(v, 1, rng);
      for (Isa isa : isas()) {
        for (int threads : {1, 2}) {
          flash_within_bounds(qv, kv, vv, dout, spec, isa, threads, po, pg, o, d.Dk, d.Dv, ctx);
          ++cases;
        }
      }
      {
        // The AVX-512 variant's logic (W = 16), built for AVX2 so it runs here too.
        SCOPED_TRACE("isa=w16avx2 (the avx512 logic)");
        const DirectResult w = flash_w16(qv, kv, vv, dout, spec, 2);
        expect_within_bounds(w.out, w.lse, w.dq, w.dk, w.dv, po, pg, o);
        check_masked_rows(w.out, w.lse, w.dq, o.lse, d.Dv, d.Dk, ctx);
        ++cases;
      }
    }
  }
  EXPECT_GE(cases, 64 * 3);
}

// Random combinations of everything the grid varies one at a time: sizes, dims, heads, masks,
// layouts, thread counts and ISAs, drawn with a fixed seed.
TEST(FlashVsOracle, RandomSweep) {
  std::mt19937 rng(99);
  const std::vector<int64_t> Ts = {1, 2, 3, 5, 17, 47, 48, 49, 63, 64, 65, 97, 128, 200, 257};
  const std::vector<int64_t> Ds = {1, 3, 8, 16, 21, 33, 64, 80, 128};
  const std::vector<std::pair<int64_t, int64_t>> heads = {{1, 1}, {2, 1}, {3, 3}, {4, 2}, {6, 3}, {8, 1}};
  auto pick = [&](const auto& v) { return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)]; };
  const std::vector<Isa> all = isas();
  for (int c = 0; c < 60; ++c) {
    const int64_t B = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    const int64_t Tq = pick(Ts), Tk = pick(Ts), Dk = pick(Ds), Dv = pick(Ds);
    const auto [H, Hkv] = pick(heads);
    const int mask_kind = std::uniform_int_distribution<int>(0, kMaskKinds - 1)(rng);
    AttentionSpec spec;
    const std::string mname = apply_mask(mask_kind, spec, B, H, Tq, Tk, rng);
    const Isa isa = pick(all);
    const int threads = std::uniform_int_distribution<int>(1, 3)(rng);
    SCOPED_TRACE("case " + std::to_string(c) + ": B=" + std::to_string(B) + " H/Hkv=" + std::to_string(H) + "/" +
                 std::to_string(Hkv) + " Tq=" + std::to_string(Tq) + " Tk=" + std::to_string(Tk) +
                 " Dk=" + std::to_string(Dk) + " Dv=" + std::to_string(Dv) + " mask: " + mname + " isa=" +
                 isa_name(isa) + " threads=" + std::to_string(threads));
    Tensor q = randn({B, H, Tq, Dk}, rng), k = randn({B, Hkv, Tk, Dk}, rng), v = randn({B, Hkv, Tk, Dv}, rng);
    Tensor dout = randn({B, H, Tq, Dv}, rng);
    const Oracle o = oracle(q, k, v, dout, spec);
    AttentionSpec plain = spec;
    plain.impl = AttentionImpl::ReferenceFloat32;
    const AttentionOutput po = attention(q, k, v, plain);
    const AttentionGrads pg = attention_backward(q, k, v, po.out, po.lse, dout, plain);
    AttentionSpec fs = spec;
    fs.isa = isa;
    fs.threads = threads;
    Tensor qv = c % 2 ? strided(q, 1, rng) : q, kv = c % 3 ? strided(k, 2, rng) : k;
    const AttentionOutput fo = attention(qv, kv, v, fs);
    const AttentionGrads fg = attention_backward(qv, kv, v, fo.out, fo.lse, dout, fs);
    expect_within_bounds(fo.out, fo.lse, fg.dq, fg.dk, fg.dv, po, pg, o);
    check_masked_rows(fo.out, fo.lse, fg.dq, o.lse, Dv, Dk, "random sweep");
    const DirectResult w = flash_w16(qv, kv, v, dout, spec, threads);
    {
      SCOPED_TRACE("w16avx2 (the avx512 logic)");
      expect_within_bounds(w.out, w.lse, w.dq, w.dk, w.dv, po, pg, o);
    }
  }
}

// One query row per (b, h) (Tq = 1, a key/value-cache step) takes the decoding kernel, which
// reads K and V in place: every mask kind, GQA, Dk != Dv and tails of every width, strided
// keys, lengths long enough for its parallel branch, and the same bits for any thread count.
TEST(FlashDecode, EveryMaskAgainstTheOracle) {
  std::mt19937 rng(4242);
  const std::vector<int64_t> Tks = {1, 2, 17, 96, 97, 300, 1100};
  const std::vector<Dims> dims = {{64, 64}, {21, 80}, {1, 1}, {80, 21}, {128, 64}, {33, 17}};
  const std::vector<std::pair<int64_t, int64_t>> heads = {{9, 3}, {8, 8}, {4, 1}, {1, 1}};
  int cases = 0, idx = 0;
  for (int mask_kind = 0; mask_kind < kMaskKinds; ++mask_kind) {
    for (int64_t Tk : Tks) {
      ++idx;
      const Dims d = dims[idx % dims.size()];
      const auto [H, Hkv] = heads[idx % heads.size()];
      const int64_t B = 1 + idx % 3, Tq = 1;
      AttentionSpec spec;
      const std::string mname = apply_mask(mask_kind, spec, B, H, Tq, Tk, rng);
      SCOPED_TRACE("Tk=" + std::to_string(Tk) + " Dk=" + std::to_string(d.Dk) + " Dv=" + std::to_string(d.Dv) +
                   " H/Hkv=" + std::to_string(H) + "/" + std::to_string(Hkv) + " B=" + std::to_string(B) +
                   " mask: " + mname);
      Tensor q = randn({B, H, Tq, d.Dk}, rng), k = randn({B, Hkv, Tk, d.Dk}, rng), v = randn({B, Hkv, Tk, d.Dv}, rng);
      Tensor dout = randn({B, H, Tq, d.Dv}, rng);
      const Oracle o = oracle(q, k, v, dout, spec);
      AttentionSpec plain = spec;
      plain.impl = AttentionImpl::ReferenceFloat32;
      const AttentionOutput po = attention(q, k, v, plain);
      const AttentionGrads pg = attention_backward(q, k, v, po.out, po.lse, dout, plain);
      Tensor kv = idx % 2 ? strided(k, 2, rng) : k, vv = idx % 3 ? strided(v, 1, rng) : v;
      for (Isa isa : isas()) {
        AttentionOutput first;
        for (int threads : {1, 2, 3}) {
          const AttentionOutput fo =
              flash_within_bounds(q, kv, vv, dout, spec, isa, threads, po, pg, o, d.Dk, d.Dv, mname);
          if (threads == 1)
            first = fo;
          else
            EXPECT_TRUE(bitwise_equal(fo.out, first.out) && bitwise_equal(fo.lse, first.lse))
                << threads << " threads differ from 1";
          ++cases;
        }
      }
      SCOPED_TRACE("w16avx2 (the avx512 logic)");
      const DirectResult w = flash_w16(q, kv, vv, dout, spec, 2);
      expect_within_bounds(w.out, w.lse, w.dq, w.dk, w.dv, po, pg, o);
      check_masked_rows(w.out, w.lse, w.dq, o.lse, d.Dv, d.Dk, mname);
    }
  }
  EXPECT_GE(cases, kMaskKinds * 7 * 3);
}

// Decoding reads only the keys a row may see and skips weights of exactly 0: whatever a blocked
// key's K and V rows hold, the output is bitwise that of clean rows; a NaN that takes part shows.
TEST(FlashDecode, BlockedRowsAreNeverReadAndNaNPropagates) {
  std::mt19937 rng(77);
  const int64_t B = 2, H = 4, Hkv = 2, Tk = 400, D = 24;
  Tensor q = randn({B, H, 1, D}, rng), k = randn({B, Hkv, Tk, D}, rng), v = randn({B, Hkv, Tk, D}, rng);
  Tensor allow({Tk}, DType::Bool);
  for (int64_t j = 0; j < Tk; ++j) allow.data<bool>()[j] = j != 210;  // inside every row's range
  const Tensor lens = Tensor::from<int64_t>({B}, {300, 399});
  for (Isa isa : isas()) {
    AttentionSpec spec;
    spec.isa = isa;
    spec.bool_mask = allow;
    spec.key_lengths = lens;
    spec.window = 250;  // the query sits at position Tk - 1 = 399: keys below 150 are outside the window
    const AttentionOutput clean = attention(q, k, v, spec);
    for (float poison : {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf, 3e38f}) {
      Tensor k2 = k.clone(), v2 = v.clone();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < Hkv; ++g)
          for (int64_t j = 0; j < Tk; ++j) {
            const int64_t len = lens.data<int64_t>()[b];
            if (j == 210 || j >= len || j < 150)
              for (int64_t d = 0; d < D; ++d) at4(k2, b, g, j, d) = at4(v2, b, g, j, d) = poison;
          }
      const AttentionOutput r = attention(q, k2, v2, spec);
      EXPECT_TRUE(bitwise_equal(r.out, clean.out)) << isa_name(isa) << " poison " << poison;
      EXPECT_TRUE(bitwise_equal(r.lse, clean.lse)) << isa_name(isa) << " poison " << poison;
    }
    // An allowed NaN: in V, that column of the rows that see it; in K, their lse and output.
    Tensor v3 = v.clone(), k3 = k.clone();
    at4(v3, 1, 0, 200, 5) = std::numeric_limits<float>::quiet_NaN();
    at4(k3, 0, 1, 160, 0) = std::numeric_limits<float>::quiet_NaN();
    const AttentionOutput a = attention(q, k, v3, spec), c = attention(q, k3, v, spec);
    for (int64_t h = 0; h < H; ++h) {
      const bool sees_v = h / (H / Hkv) == 0, sees_k = h / (H / Hkv) == 1;
      EXPECT_EQ(std::isnan(a.out.data<float>()[((1 * H + h) * D) + 5]), sees_v) << "head " << h;
      EXPECT_FALSE(std::isnan(a.out.data<float>()[((1 * H + h) * D) + 4])) << "head " << h;
      EXPECT_EQ(std::isnan(c.lse.data<float>()[0 * H + h]), sees_k) << "head " << h;
      EXPECT_EQ(std::isnan(c.out.data<float>()[(0 * H + h) * D]), sees_k) << "head " << h;
      EXPECT_FALSE(std::isnan(c.lse.data<float>()[1 * H + h])) << "batch row 1, head " << h;
    }
  }
}

// The backward pass runs in one pass when there are at least two (b, kv-head) tasks per
// thread, else in two. Both must give the same bits, so results never depend on the thread
// count: B * Hkv = 3 is one pass on 1 thread and two passes on 2.
TEST(Determinism, OnePassAndTwoPassBackwardAgreeBitwise) {
  std::mt19937 rng(123);
  for (int mask_kind = 0; mask_kind < kMaskKinds; ++mask_kind) {
    const int64_t B = 3, H = 4, Hkv = 1, Tq = 150, Tk = 230, Dk = 40, Dv = 24;
    AttentionSpec spec;
    const std::string mname = apply_mask(mask_kind, spec, B, H, Tq, Tk, rng);
    SCOPED_TRACE(mname);
    Tensor q = randn({B, H, Tq, Dk}, rng), k = randn({B, Hkv, Tk, Dk}, rng), v = randn({B, Hkv, Tk, Dv}, rng);
    Tensor dout = randn({B, H, Tq, Dv}, rng);
    AttentionGrads g[2];
    for (int threads : {1, 2}) {
      AttentionSpec fs = spec;
      fs.threads = threads;
      const AttentionOutput fo = attention(q, k, v, fs);
      g[threads - 1] = attention_backward(q, k, v, fo.out, fo.lse, dout, fs);
    }
    EXPECT_TRUE(bitwise_equal(g[0].dq, g[1].dq));
    EXPECT_TRUE(bitwise_equal(g[0].dk, g[1].dk));
    EXPECT_TRUE(bitwise_equal(g[0].dv, g[1].dv));
  }
}

// The reference itself against central finite differences, in double, on small shapes.
TEST(Reference, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(7);
  for (int mask_kind = 0; mask_kind < kMaskKinds; ++mask_kind) {
    const int64_t B = 2, H = 2, Hkv = 1, Tq = 4, Tk = 5, Dk = 3, Dv = 2;
    AttentionSpec spec;
    const std::string mname = apply_mask(mask_kind, spec, B, H, Tq, Tk, rng);
    SCOPED_TRACE(mname);
    Tensor q = randn({B, H, Tq, Dk}, rng), k = randn({B, Hkv, Tk, Dk}, rng), v = randn({B, Hkv, Tk, Dv}, rng);
    Tensor dout = randn({B, H, Tq, Dv}, rng);
    const Oracle o = oracle(q, k, v, dout, spec);
    // loss(x) = sum(out(x) * dout), in double through the oracle
    std::vector<float> dov = values(dout);
    auto loss_with = [&](Tensor& t, int64_t i, double delta) {
      // perturb one input in double and run the double oracle
      const KernelInputs<double> ki(q, k, v, spec);
      const Tensor& target = &t == &q ? ki.q : &t == &k ? ki.k : ki.v;
      target.data<double>()[i] += delta;
      std::vector<double> out(B * H * Tq * Dv), lse(B * H * Tq);
      kernels::attention_ref_forward<double>(ki.in, out.data(), lse.data(), 1);
      double L = 0;
      for (size_t j = 0; j < out.size(); ++j) L += out[j] * dov[j];
      return L;
    };
    struct Var {
      Tensor* t;
      const std::vector<double>* grad;
      const char* name;
    } vars[] = {{&q, &o.dq, "dq"}, {&k, &o.dk, "dk"}, {&v, &o.dv, "dv"}};
    for (const Var& var : vars) {
      for (int64_t i = 0; i < var.t->numel(); ++i) {
        const double h = 1e-6;
        const double fd = (loss_with(*var.t, i, h) - loss_with(*var.t, i, -h)) / (2 * h);
        EXPECT_NEAR((*var.grad)[i], fd, 1e-6 + 1e-6 * std::fabs(fd)) << var.name << "[" << i << "]";
      }
    }
  }
}

TEST(WorkedExample, ChapterNumbers) {
  const float r2 = std::sqrt(2.0f);
  Tensor q = Tensor::from<float>({1, 2}, {r2, 0.0f});
  Tensor k = Tensor::from<float>({3, 2}, {1, 0, 0, 1, 1, 1});
  Tensor v = Tensor::from<float>({3, 2}, {10, 0, 0, 10, 4, 6});
  for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Reference, AttentionImpl::ReferenceFloat32}) {
    AttentionSpec spec;
    spec.impl = impl;
    AttentionOutput r = attention(q, k, v, spec);
    Tensor w = attention_weights(q, k, r.lse, spec, 0, 1);
    std::vector<float> wv = values(w), ov = values(r.out);
    EXPECT_NEAR(wv[0], 0.4223, 5e-5);
    EXPECT_NEAR(wv[1], 0.1554, 5e-5);
    EXPECT_NEAR(wv[2], 0.4223, 5e-5);
    EXPECT_NEAR(ov[0], 5.912, 5e-4);
    EXPECT_NEAR(ov[1], 4.088, 5e-4);
    spec.mask = Tensor::from<float>({1, 3}, {0.0f, 0.0f, -kInf});
    r = attention(q, k, v, spec);
    w = attention_weights(q, k, r.lse, spec, 0, 1);
    wv = values(w);
    ov = values(r.out);
    EXPECT_NEAR(wv[0], 0.7311, 5e-5);
    EXPECT_NEAR(wv[1], 0.2689, 5e-5);
    EXPECT_EQ(wv[2], 0.0f);
    EXPECT_NEAR(ov[0], 7.311, 5e-4);
    EXPECT_NEAR(ov[1], 2.689, 5e-4);
  }
}

// The float64 reference takes float64 inputs and gives float64 results (what a double-precision
// gradient check needs): the same numbers as on the inputs rounded to float32, to float32's
// rounding; the other paths refuse float64 by name.
TEST(Reference, Float64InputsGiveFloat64ResultsAndGradients) {
  std::mt19937 rng(3);
  const Tensor q = randn({2, 4, 5, 3}, rng), k = randn({2, 2, 7, 3}, rng), v = randn({2, 2, 7, 6}, rng);
  AttentionSpec spec;
  spec.causal = true;
  spec.impl = AttentionImpl::Reference;
  const AttentionOutput o32 = attention(q, k, v, spec);
  const AttentionOutput o64 = attention(q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), spec);
  ASSERT_EQ(o64.out.dtype(), DType::F64);
  ASSERT_EQ(o64.lse.dtype(), DType::F64);
  EXPECT_EQ(o64.out.shape(), o32.out.shape());
  for (int64_t i = 0; i < o32.out.numel(); ++i)
    EXPECT_NEAR(o64.out.data<double>()[i], o32.out.data<float>()[i], 1e-6);
  const Tensor dout = randn(o32.out.shape(), rng);
  const AttentionGrads g32 = attention_backward(q, k, v, o32.out, o32.lse, dout, spec);
  const AttentionGrads g64 = attention_backward(q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), o64.out,
                                                o64.lse, dout.to(DType::F64), spec);
  ASSERT_EQ(g64.dk.dtype(), DType::F64);
  for (int64_t i = 0; i < g32.dk.numel(); ++i) EXPECT_NEAR(g64.dk.data<double>()[i], g32.dk.data<float>()[i], 1e-5);
  spec.impl = AttentionImpl::Flash;
  EXPECT_NE(error_of([&] { attention(q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), spec); })
                .find("float64 reference only"),
            std::string::npos);
  spec.impl = AttentionImpl::Reference;
  EXPECT_NE(error_of([&] { attention(q.to(DType::F64), k, v, spec); }).find("k: expected float64"), std::string::npos);
}


// ---------------------------------------------------------------------------------------------
// bfloat16 tile products (training's --precision bf16, under a Bf16Matmul): each product's two
// operands rounded to bfloat16 and summed in float32 on AVX512_BF16. Judged three ways against
// the exact float64 oracle and against its twin, the float64 reference that rounds the same
// operands (AttnInputs::bf16):
//  - with one key block per row (Tk <= 96) the kernel rounds exactly what the twin rounds, so it
//    sits far closer to the twin than the twin sits to the exact result (a kernel that did not
//    round, or rounded other operands, is as far from the twin as the exact result is);
//  - always: its error against the exact result is at most twice the twin's (the plain bf16
//    attention's), plus the float32 epsilon; and at least a quarter of it (it did round);
//  - fully masked rows stay exact, and the bits do not depend on the thread count (one pass or
//    two in backward, whose dQ sums pair keys from an even key in both).
struct Bf16Errors {
  double fast_twin = 0, twin_exact = 0, fast_exact = 0;
};
Bf16Errors bf16_errors(const Tensor& fast, const std::vector<double>& twin, const std::vector<double>& exact) {
  Bf16Errors e;
  const std::vector<float> f = values(fast);
  for (size_t i = 0; i < f.size(); ++i) {
    if (!std::isfinite(twin[i]) || !std::isfinite(exact[i])) continue;  // -inf lse of a blocked row: checked apart
    e.fast_twin = std::max(e.fast_twin, std::fabs(f[i] - twin[i]));
    e.twin_exact = std::max(e.twin_exact, std::fabs(twin[i] - exact[i]));
    e.fast_exact = std::max(e.fast_exact, std::fabs(f[i] - exact[i]));
  }
  return e;
}

TEST(FlashBf16, MatchesItsTwinAndIsAsAccurateAsPlainBf16) {
  if (!kernels::flash_bf16_supported(Isa::AVX512))
    GTEST_SKIP() << "this CPU has no AVX512_BF16: attention's products stay float32 under a Bf16Matmul";
  std::mt19937 rng(31);
  const std::vector<int64_t> Ts = {2, 5, 17, 48, 49, 95, 96, 97, 150, 257};  // Tq = 1: see SingleQueryRowStaysFloat32
  const std::vector<int64_t> Ds = {1, 3, 16, 21, 33, 64, 80};
  const std::vector<std::pair<int64_t, int64_t>> heads = {{1, 1}, {3, 3}, {4, 2}, {8, 1}};
  auto pick = [&](const auto& v) { return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)]; };
  int tight = 0;
  for (int c = 0; c < 48; ++c) {
    const int64_t B = std::uniform_int_distribution<int64_t>(1, 3)(rng);
    const int64_t Tq = pick(Ts), Tk = c % 5 ? pick(Ts) : 1, Dk = pick(Ds), Dv = pick(Ds);
    const auto [H, Hkv] = pick(heads);
    AttentionSpec spec;
    const std::string mname = apply_mask(c % kMaskKinds, spec, B, H, Tq, Tk, rng);
    const std::string ctx = "case " + std::to_string(c) + ": B=" + std::to_string(B) + " H/Hkv=" + std::to_string(H) +
                            "/" + std::to_string(Hkv) + " Tq=" + std::to_string(Tq) + " Tk=" + std::to_string(Tk) +
                            " Dk=" + std::to_string(Dk) + " Dv=" + std::to_string(Dv) + " mask: " + mname;
    SCOPED_TRACE(ctx);
    Tensor q = randn({B, H, Tq, Dk}, rng), k = randn({B, Hkv, Tk, Dk}, rng), v = randn({B, Hkv, Tk, Dv}, rng);
    Tensor dout = randn({B, H, Tq, Dv}, rng);
    const Oracle exact = oracle(q, k, v, dout, spec), twin = oracle(q, k, v, dout, spec, /*bf16=*/true);
    AttentionOutput fo[2];
    AttentionGrads fg[2];
    for (int threads : {1, 2}) {
      AttentionSpec fs = spec;
      fs.isa = Isa::AVX512;
      fs.threads = threads;
      const Tensor qv = c % 2 ? strided(q, 1, rng) : q;
      Bf16Matmul bf16;
      fo[threads - 1] = attention(qv, k, v, fs);
      fg[threads - 1] = attention_backward(qv, k, v, fo[threads - 1].out, fo[threads - 1].lse, dout, fs);
    }
    EXPECT_TRUE(bitwise_equal(fo[0].out, fo[1].out) && bitwise_equal(fo[0].lse, fo[1].lse));
    EXPECT_TRUE(bitwise_equal(fg[0].dq, fg[1].dq) && bitwise_equal(fg[0].dk, fg[1].dk) &&
                bitwise_equal(fg[0].dv, fg[1].dv));
    check_masked_rows(fo[0].out, fo[0].lse, fg[0].dq, exact.lse, Dv, Dk, ctx);
    const double eps = 2e-6 * (1 + max_abs(exact.out)), gp = geps(exact);
    const struct {
      const char* name;
      const Tensor& fast;
      const std::vector<double>&twin, &exact;
      double eps;
    } outs[] = {{"out", fo[0].out, twin.out, exact.out, eps},
                {"lse", fo[0].lse, twin.lse, exact.lse, 2e-6 * (1 + max_abs(exact.lse))},
                {"dq", fg[0].dq, twin.dq, exact.dq, gp},
                {"dk", fg[0].dk, twin.dk, exact.dk, gp},
                {"dv", fg[0].dv, twin.dv, exact.dv, gp}};
    for (const auto& o : outs) {
      const Bf16Errors e = bf16_errors(o.fast, o.twin, o.exact);
      SCOPED_TRACE(std::string(o.name) + ": |fast - twin| " + std::to_string(e.fast_twin) + ", |twin - exact| " +
                   std::to_string(e.twin_exact) + ", |fast - exact| " + std::to_string(e.fast_exact));
      EXPECT_LE(e.fast_exact, 2 * e.twin_exact + o.eps);
      if (e.twin_exact > 50 * o.eps) {  // rounding to bf16 shows (not, e.g., for a single key's out = v)
        EXPECT_GE(e.fast_exact, 0.25 * e.twin_exact);
        if (Tk <= 96) {
          EXPECT_LE(e.fast_twin, 0.25 * e.twin_exact);
        }
      }
    }
    tight += Tk <= 96;
  }
  EXPECT_GE(tight, 16);
}

// One query row per (b, h), a decoding step's shape, takes the float32 decoding kernel in the
// forward pass, so both passes stay float32 there (backward recomputes the scores forward saved):
// the same bits as without the Bf16Matmul.
TEST(FlashBf16, SingleQueryRowStaysFloat32) {
  if (!kernels::flash_bf16_supported(Isa::AVX512))
    GTEST_SKIP() << "this CPU has no AVX512_BF16: attention's products stay float32 under a Bf16Matmul";
  std::mt19937 rng(8);
  Tensor k = randn({2, 2, 40, 32}, rng), v = randn({2, 2, 40, 16}, rng);
  AttentionSpec spec;
  spec.causal = true;
  for (int64_t Tq : {1, 2}) {
    Tensor q = randn({2, 4, Tq, 32}, rng), dout = randn({2, 4, Tq, 16}, rng);
    const AttentionOutput a = attention(q, k, v, spec);
    const AttentionGrads ga = attention_backward(q, k, v, a.out, a.lse, dout, spec);
    Bf16Matmul bf16;
    const AttentionOutput b = attention(q, k, v, spec);
    const AttentionGrads gb = attention_backward(q, k, v, b.out, b.lse, dout, spec);
    const bool same = bitwise_equal(a.out, b.out) && bitwise_equal(a.lse, b.lse) && bitwise_equal(ga.dq, gb.dq) &&
                      bitwise_equal(ga.dk, gb.dk) && bitwise_equal(ga.dv, gb.dv);
    // one row: the float32 bits; two rows round (so the first check cannot pass by bf16 being off)
    EXPECT_EQ(same, Tq == 1) << "Tq = " << Tq;
  }
}

// Blocked keys stay unread with bf16 products too: NaN in the K and V rows past each batch row's
// length (and a NaN query row's own output) change nothing else.
TEST(FlashBf16, BlockedKeysAreNeverRead) {
  if (!kernels::flash_bf16_supported(Isa::AVX512))
    GTEST_SKIP() << "this CPU has no AVX512_BF16: attention's products stay float32 under a Bf16Matmul";
  std::mt19937 rng(5);
  const int64_t B = 2, H = 4, Hkv = 2, Tq = 70, Tk = 130, D = 32;
  Tensor q = randn({B, H, Tq, D}, rng), k = randn({B, Hkv, Tk, D}, rng), v = randn({B, Hkv, Tk, D}, rng);
  Tensor dout = randn({B, H, Tq, D}, rng);
  AttentionSpec spec;
  spec.causal = true;
  spec.key_lengths = Tensor::from<int32_t>({B}, {101, 57});
  const int32_t lens[2] = {101, 57};
  Tensor k2 = k.clone(), v2 = v.clone();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t j = lens[b]; j < Tk; ++j)
        for (int64_t d = 0; d < D; ++d) at4(k2, b, h, j, d) = at4(v2, b, h, j, d) = std::nanf("");
  Bf16Matmul bf16;
  const AttentionOutput a = attention(q, k, v, spec), b = attention(q, k2, v2, spec);
  const AttentionGrads ga = attention_backward(q, k, v, a.out, a.lse, dout, spec);
  const AttentionGrads gb = attention_backward(q, k2, v2, b.out, b.lse, dout, spec);
  EXPECT_TRUE(bitwise_equal(a.out, b.out));
  EXPECT_TRUE(bitwise_equal(ga.dq, gb.dq));
  // dk, dv of the blocked keys are zero in both; the allowed keys' gradients are the same bits
  EXPECT_TRUE(bitwise_equal(ga.dk, gb.dk));
  EXPECT_TRUE(bitwise_equal(ga.dv, gb.dv));
  for (float x : values(b.out)) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace qkv::testing
