// The chapter's worked example and claims on live numbers (viz/tour.h).
#include "viz/tour.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "kernels/flash_attention.h"
#include "qkv/qkv.h"

namespace qkv::tour {

using Json = nlohmann::json;

// ---- the worked example ----------------------------------------------------------------------------

ExampleInput ExampleInput::chapter() {
  ExampleInput e;
  e.q = {std::sqrt(2.0), 0.0};
  e.keys = {{1, 0}, {0, 1}, {1, 1}};
  e.values = {{10, 0}, {0, 10}, {4, 6}};
  e.allowed = {true, true, true};
  return e;
}

namespace {

constexpr size_t kMostKeys = 64, kMostDims = 64;

[[noreturn]] void field_error(const std::string& field, const std::string& message) {
  throw FieldError{field, "'" + field + "' " + message};
}

std::vector<double> numbers(const Json& v, const std::string& field, size_t want) {
  const std::string expected =
      want ? detail::concat("a list of ", want, " finite numbers") : detail::concat("a list of 1 .. ", kMostDims, " finite numbers");
  if (!v.is_array() || v.empty() || v.size() > kMostDims || (want && v.size() != want))
    field_error(field, "is " + v.dump() + "; expected " + expected);
  std::vector<double> out;
  for (const Json& x : v) {
    if (!x.is_number() || !std::isfinite(x.get<double>()) || std::fabs(x.get<double>()) > 1e6)
      field_error(field, "holds " + x.dump() + "; expected finite numbers within +-1e6");
    out.push_back(x.get<double>());
  }
  return out;
}

std::vector<std::vector<double>> rows_of(const Json& v, const std::string& field, size_t n, size_t width) {
  if (!v.is_array() || v.empty() || v.size() > kMostKeys || (n && v.size() != n))
    field_error(field, detail::concat("is ", v.dump(), "; expected a list of ", n ? std::to_string(n) : "1 .. 64",
                                      " rows"));
  std::vector<std::vector<double>> out;
  for (size_t i = 0; i < v.size(); ++i) {
    out.push_back(numbers(v[i], detail::concat(field, "[", i, "]"), width ? width : (i ? out[0].size() : 0)));
  }
  return out;
}

Tensor matrix(const std::vector<std::vector<double>>& rows) {
  const auto n = static_cast<int64_t>(rows.size()), d = static_cast<int64_t>(rows[0].size());
  Tensor t = Tensor::zeros({n, d});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) t.data<float>()[i * d + j] = static_cast<float>(rows[i][j]);
  return t;
}

std::vector<double> floats(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<double>(c.data<float>(), c.data<float>() + c.numel());
}

}  // namespace

ExampleInput example_from_json(const Json& body) {
  if (!body.is_object()) throw FieldError{"", "the body must be a JSON object"};
  ExampleInput e = ExampleInput::chapter();
  for (auto it = body.begin(); it != body.end(); ++it)
    if (it.key() != "q" && it.key() != "keys" && it.key() != "values" && it.key() != "mask" && it.key() != "scale")
      field_error(it.key(), "is not a field of /v1/attend (q, keys, values, mask, scale)");
  if (body.contains("q")) e.q = numbers(body["q"], "q", 0);
  if (body.contains("keys") || body.contains("q")) {
    if (body.contains("keys")) e.keys = rows_of(body["keys"], "keys", 0, e.q.size());
    if (e.keys[0].size() != e.q.size())
      field_error("keys", detail::concat("rows have ", e.keys[0].size(), " numbers; q has ", e.q.size()));
  }
  const size_t n = e.keys.size();
  if (body.contains("values")) {
    e.values = rows_of(body["values"], "values", n, 0);
  } else if (e.values.size() != n) {
    field_error("values", detail::concat("is required when there are ", n, " keys (one value row per key)"));
  }
  e.allowed.assign(n, true);
  if (body.contains("mask")) {
    const Json& m = body["mask"];
    if (!m.is_array() || m.size() != n)
      field_error("mask", detail::concat("is ", m.dump(), "; expected ", n, " booleans (true = may attend)"));
    for (size_t j = 0; j < n; ++j) {
      if (!m[j].is_boolean()) field_error("mask", "holds " + m[j].dump() + "; expected true or false");
      e.allowed[j] = m[j].get<bool>();
    }
  }
  if (body.contains("scale") && !body["scale"].is_null()) {
    const Json& s = body["scale"];
    if (!s.is_number() || !std::isfinite(s.get<double>()) || s.get<double>() <= 0 || s.get<double>() > 1e6)
      field_error("scale", "is " + s.dump() + "; expected a number in (0, 1e6]");
    e.scale = s.get<double>();
  }
  return e;
}

Json attend_steps(const ExampleInput& in) {
  const size_t n = in.keys.size(), Dk = in.q.size(), Dv = in.values.at(0).size();
  const double scale = in.scale.value_or(1.0 / std::sqrt(static_cast<double>(Dk)));
  // the long way, in double, every number visible
  std::vector<double> s(n), ex(n, 0.0), w(n, 0.0), z(Dv, 0.0);
  double mx = -INFINITY, sum = 0;
  for (size_t j = 0; j < n; ++j) {
    s[j] = scale * std::inner_product(in.q.begin(), in.q.end(), in.keys[j].begin(), 0.0);
    if (in.allowed[j]) mx = std::max(mx, s[j]);
  }
  Json shifted = Json::array(), exps = Json::array();
  for (size_t j = 0; j < n; ++j) {
    if (in.allowed[j]) sum += ex[j] = std::exp(s[j] - mx);
    shifted.push_back(in.allowed[j] ? Json(s[j] - mx) : Json(nullptr));
    exps.push_back(ex[j]);
  }
  for (size_t j = 0; j < n; ++j) {
    w[j] = sum > 0 ? ex[j] / sum : 0.0;
    for (size_t d = 0; d < Dv; ++d) z[d] += w[j] * in.values[j][d];
  }
  // the same through qkv's flash kernel (float32), the mask as a boolean mask
  const Tensor q = matrix({in.q}), k = matrix(in.keys), v = matrix(in.values);
  AttentionSpec spec;
  spec.scale = scale;
  const bool masked = std::find(in.allowed.begin(), in.allowed.end(), false) != in.allowed.end();
  if (masked) {
    Tensor m = Tensor::zeros({1, static_cast<int64_t>(n)}, DType::Bool);
    for (size_t j = 0; j < n; ++j) m.data<bool>()[j] = in.allowed[j];
    spec.bool_mask = m;
  }
  const AttentionOutput o = attention(q, k, v, spec);
  const Tensor qw = attention_weights(q, k, o.lse, spec, 0, 1);
  // zeroing the masked weights of the unmasked softmax, without renormalising
  AttentionSpec open = spec;
  open.bool_mask.reset();
  const AttentionOutput full = attention(q, k, v, open);
  std::vector<double> zw = floats(attention_weights(q, k, full.lse, open, 0, 1)), zz(Dv, 0.0);
  double zsum = 0;
  for (size_t j = 0; j < n; ++j) {
    if (!in.allowed[j]) zw[j] = 0;
    zsum += zw[j];
    for (size_t d = 0; d < Dv; ++d) zz[d] += zw[j] * in.values[j][d];
  }
  const double lse = o.lse.data<float>()[0];
  return {{"n", n},
          {"dk", Dk},
          {"dv", Dv},
          {"q", in.q},
          {"keys", in.keys},
          {"values", in.values},
          {"mask", in.allowed},
          {"scale", scale},
          {"scores", s},
          {"max", std::isfinite(mx) ? Json(mx) : Json(nullptr)},
          {"shifted", shifted},
          {"exp", exps},
          {"sum", sum},
          {"weights", w},
          {"output", z},
          {"qkv", {{"weights", floats(qw)}, {"output", floats(o.out)}, {"lse", std::isfinite(lse) ? Json(lse) : Json(nullptr)}}},
          {"zeroed", {{"weights", zw}, {"sum", zsum}, {"output", zz}}}};
}

// ---- the claims ---------------------------------------------------------------------------------------

std::string fmt(double x, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}

namespace {

std::string fmt_g(double x) {
  char b[64];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}
std::string vec(const std::vector<double>& v, int digits = 4) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt(v[i], digits);
  return s + "]";
}
std::string thousands(int64_t x) {
  const std::string d = std::to_string(x);
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) s += ',';
    s += d[i];
  }
  return s;
}

// A (rows, cols) float tensor as JSON rows.
Json rows_json(const Tensor& t) {
  const Tensor c = t.contiguous();
  const int64_t R = c.numel() / c.size(-1), C = c.size(-1);
  Json out = Json::array();
  for (int64_t i = 0; i < R; ++i) out.push_back(std::vector<double>(c.data<float>() + i * C, c.data<float>() + (i + 1) * C));
  return out;
}

Tensor randn(Rng& rng, std::vector<int64_t> shape, double std = 1.0) {
  Tensor t = Tensor::zeros(std::move(shape));
  rng.fill_normal(t.data<float>(), t.numel(), 0.0, std);
  return t;
}

// x (T, D) W (D, E) -> (T, E), in float32 as the layers do
Tensor matmul(const Tensor& x, const Tensor& w) {
  const int64_t T = x.size(0), D = x.size(1), E = w.size(1);
  Tensor out = Tensor::zeros({T, E});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t e = 0; e < E; ++e) {
      float acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += x.data<float>()[i * D + d] * w.data<float>()[d * E + e];
      out.data<float>()[i * E + e] = acc;
    }
  return out;
}

Tensor permute_rows(const Tensor& x, const std::vector<int64_t>& p) {
  Tensor out = Tensor::zeros(x.shape());
  const int64_t D = x.size(1);
  for (size_t i = 0; i < p.size(); ++i)
    std::copy(x.data<float>() + p[i] * D, x.data<float>() + (p[i] + 1) * D, out.data<float>() + static_cast<int64_t>(i) * D);
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(x.data<float>()[i]) - y.data<float>()[i]));
  return m;
}

// Self-attention of x (T, D) with projections Wq, Wk, Wv (D, E): the layer's core, one head.
Tensor self_attend(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& wv, const AttentionSpec& spec = {}) {
  return attention(matmul(x, wq), matmul(x, wk), matmul(x, wv), spec).out;
}

Tensor weights_of(const Tensor& q, const Tensor& k, const AttentionSpec& spec) {
  Tensor v = Tensor::zeros({k.size(0), 1});
  const AttentionOutput o = attention(q, k, v, spec);
  return attention_weights(q, k, o.lse, spec, 0, q.size(0));
}

// Sinusoidal positions (T, D): PE[t][2i] = sin(t / 10000^(2i/D)), PE[t][2i+1] = cos(...)
Tensor sinusoid(int64_t T, int64_t D) {
  Tensor pe = Tensor::zeros({T, D});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; i += 2) {
      const double a = static_cast<double>(t) / std::pow(10000.0, static_cast<double>(i) / static_cast<double>(D));
      pe.data<float>()[t * D + i] = static_cast<float>(std::sin(a));
      if (i + 1 < D) pe.data<float>()[t * D + i + 1] = static_cast<float>(std::cos(a));
    }
  return pe;
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::zeros(a.shape());
  for (int64_t i = 0; i < a.numel(); ++i) out.data<float>()[i] = a.data<float>()[i] + b.data<float>()[i];
  return out;
}

struct Claim {
  Json j;
  Claim(const char* id, const char* title, const char* claim) {
    j = {{"id", id}, {"title", title}, {"claim", claim}, {"holds", true}, {"lines", Json::array()},
         {"matrices", Json::array()}};
  }
  void line(const std::string& s) { j["lines"].push_back(s); }
  void holds(bool ok) { j["holds"] = j["holds"].get<bool>() && ok; }
  void matrix(const std::string& label, Json rows, std::vector<std::string> row_labels = {},
              std::vector<std::string> col_labels = {}) {
    j["matrices"].push_back({{"label", label}, {"rows", std::move(rows)}, {"row_labels", row_labels},
                             {"col_labels", col_labels}});
  }
};

std::vector<std::string> labels(const char* prefix, int64_t n) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(detail::concat(prefix, i + 1));
  return out;
}

// Logits of every position of `ids` at once (the causal mask: training's parallel pass) and
// one token at a time through the key/value cache (generation): the largest difference.
double parallel_vs_sequential(const Model& m, const std::vector<int32_t>& ids, int64_t* T_out) {
  const auto T = static_cast<int64_t>(ids.size());
  *T_out = T;
  Batch b;
  b.input = Tensor({1, T}, DType::I64);
  std::copy(ids.begin(), ids.end(), b.input.data<int64_t>());
  b.input_lengths = Tensor::from<int64_t>({1}, {T});
  Tape tape;
  tape.recording = false;
  const Tensor par = m.logits(tape, b)->value;  // (1, T, V)
  const int64_t V = par.size(2);
  DecodeSlots slots(m, 1, T);
  std::vector<float> row;
  const int64_t slot = slots.add({ids[0]}, &row);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (t > 0) row = slots.step({{slot, ids[static_cast<size_t>(t)]}});
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst, std::fabs(static_cast<double>(row[static_cast<size_t>(v)]) - par.data<float>()[t * V + v]));
  }
  return worst;
}

}  // namespace

Json chapter_claims(uint64_t seed, const Model* lm) {
  return chapter_claims(seed, lm ? &lm->config() : nullptr,
                        [lm](const std::function<double(const Model&)>& f) { return f(*lm); });
}

Json chapter_claims(uint64_t seed, const ModelConfig* lm, const LmRunner& run_lm) {
  Rng rng(seed);
  Json claims = Json::array();
  const ExampleInput ex = ExampleInput::chapter();
  const Json base = attend_steps(ex);

  {  // 1. shift invariance
    Claim c("shift", "Softmax ignores a constant added to every score",
            "Subtracting the maximum score before exponentiating changes nothing mathematically and keeps exp "
            "from overflowing.");
    // scores on a grid of 1/1024, so that s + 100 is exact in float32 (otherwise adding 100 would
    // itself round the scores, and the difference would be the addition's, not the softmax's)
    Tensor q = Tensor::from<float>({1, 1}, {1.0f}), k = randn(rng, {5, 1}, 2.0);
    for (int64_t j = 0; j < 5; ++j) k.data<float>()[j] = std::round(k.data<float>()[j] * 1024.0f) / 1024.0f;
    AttentionSpec spec;
    spec.scale = 1.0;  // q = 1, so the scores are the keys themselves
    const Tensor w0 = weights_of(q, k, spec);
    Tensor k2 = k.clone();
    for (int64_t j = 0; j < 5; ++j) k2.data<float>()[j] += 100.0f;
    const Tensor w1 = weights_of(q, k2, spec);
    c.line("scores s         = " + vec(floats(k)));
    c.line("softmax(s)       = " + vec(floats(w0)));
    c.line("softmax(s + 100) = " + vec(floats(w1)) + "   (max difference " + fmt_g(max_abs_diff(w0, w1)) +
           ": float32 rounding)");
    float largest = k2.data<float>()[0];
    for (int64_t j = 1; j < 5; ++j) largest = std::max(largest, k2.data<float>()[j]);
    const float naive = std::exp(largest);
    c.line("exp of the largest s + 100 without the max subtracted: " +
           std::string(std::isinf(naive) ? "inf" : fmt_g(naive)) + " in float32 (inf / inf would be NaN)");
    c.holds(max_abs_diff(w0, w1) < 1e-5);
    claims.push_back(c.j);
  }
  {  // 2. permutation equivariance
    Claim c("permutation", "Without positions or a mask, self-attention is permutation-equivariant",
            "Shuffle the tokens and the outputs shuffle the same way: attention alone sees a set, not a sequence. "
            "Positional information breaks the symmetry.");
    const int64_t T = 5, D = 8;
    const Tensor x = randn(rng, {T, D}), wq = randn(rng, {D, D}, 0.5), wk = randn(rng, {D, D}, 0.5),
                 wv = randn(rng, {D, D}, 0.5);
    const std::vector<int64_t> p = {3, 0, 4, 1, 2};
    const double plain = max_abs_diff(self_attend(permute_rows(x, p), wq, wk, wv), permute_rows(self_attend(x, wq, wk, wv), p));
    const Tensor pe = sinusoid(T, D);
    const double with_pos = max_abs_diff(self_attend(add(permute_rows(x, p), pe), wq, wk, wv),
                                         permute_rows(self_attend(add(x, pe), wq, wk, wv), p));
    AttentionSpec causal;
    causal.causal = true;
    const double with_mask = max_abs_diff(self_attend(permute_rows(x, p), wq, wk, wv, causal),
                                          permute_rows(self_attend(x, wq, wk, wv, causal), p));
    c.line("permutation P = [4, 1, 5, 2, 3] of 5 tokens (d = 8, random W_Q, W_K, W_V)");
    c.line("max |Attn(P X) - P Attn(X)|            = " + fmt_g(plain) + "   (equal up to float32 rounding)");
    c.line("with sinusoidal positions added: max |.| = " + fmt(with_pos) + "   (the order now matters)");
    c.line("with a causal mask:              max |.| = " + fmt(with_mask));
    c.holds(plain < 1e-5 && with_pos > 1e-3 && with_mask > 1e-3);
    claims.push_back(c.j);
  }
  {  // 3. asymmetry
    Claim c("asymmetry", "With W_Q != W_K, how much i attends to j differs from how much j attends to i",
            "Queries and keys are separate projections, so the score of token i against token j need not equal "
            "that of j against i.");
    const int64_t T = 4, D = 6;
    const Tensor x = randn(rng, {T, D}), wq = randn(rng, {D, D}, 0.5), wk = randn(rng, {D, D}, 0.5);
    const Tensor qx = matmul(x, wq), kx = matmul(x, wk), s = matmul(qx, kx.transpose(0, 1).contiguous());
    const Tensor sym = matmul(qx, qx.transpose(0, 1).contiguous());
    const auto asym = [T](const Tensor& m) {
      double worst = 0;
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) worst = std::max(worst, std::fabs(static_cast<double>(m.data<float>()[i * T + j]) - m.data<float>()[j * T + i]));
      return worst;
    };
    c.matrix("scores q_i . k_j (W_Q != W_K)", rows_json(s), labels("q", T), labels("k", T));
    c.line("max |s_ij - s_ji| with W_Q != W_K: " + fmt(asym(s)));
    c.line("max |s_ij - s_ji| with W_Q  = W_K: " + fmt_g(asym(sym)) + "   (a symmetric matrix)");
    c.holds(asym(s) > 1e-3 && asym(sym) < 1e-5);
    claims.push_back(c.j);
  }
  {  // 4. keys decide, values are mixed
    Claim c("keys-values", "Keys decide the weights; values are what gets mixed",
            "Changing a value changes the output without changing the compatibility scores.");
    ExampleInput e2 = ex;
    e2.values[2] = {8, 2};
    const Json changed = attend_steps(e2);
    c.line("values v3 = [4, 6]: weights " + vec(base["qkv"]["weights"].get<std::vector<double>>()) + ", output " +
           vec(base["qkv"]["output"].get<std::vector<double>>(), 3));
    c.line("values v3 = [8, 2]: weights " + vec(changed["qkv"]["weights"].get<std::vector<double>>()) + ", output " +
           vec(changed["qkv"]["output"].get<std::vector<double>>(), 3));
    c.holds(base["qkv"]["weights"] == changed["qkv"]["weights"] && base["qkv"]["output"] != changed["qkv"]["output"]);
    claims.push_back(c.j);
  }
  {  // 5. renormalisation
    Claim c("renormalise", "Masking happens before the softmax, so the weights renormalise",
            "A blocked position gets -inf added to its score; the remaining weights still sum to 1. Zeroing a "
            "weight after the softmax would leave a total below 1.");
    ExampleInput e2 = ex;
    e2.allowed = {true, true, false};
    const Json m = attend_steps(e2);
    c.line("mask [1, 1, 0] before the softmax: weights " + vec(m["qkv"]["weights"].get<std::vector<double>>()) +
           ", sum 1, output " + vec(m["qkv"]["output"].get<std::vector<double>>(), 3));
    c.line("zeroed after the softmax:          weights " + vec(m["zeroed"]["weights"].get<std::vector<double>>()) +
           ", sum " + fmt(m["zeroed"]["sum"].get<double>()) + ", output " + vec(m["zeroed"]["output"].get<std::vector<double>>(), 3));
    ExampleInput none = ex;
    none.allowed = {false, false, false};
    const Json z = attend_steps(none);
    c.line("every key masked: qkv gives weights " + vec(z["qkv"]["weights"].get<std::vector<double>>()) + " and output " +
           vec(z["qkv"]["output"].get<std::vector<double>>(), 3) + " (zeros, never NaN)");
    c.holds(std::fabs(m["zeroed"]["sum"].get<double>() - 1) > 0.1);
    claims.push_back(c.j);
  }
  {  // 6. n^2 cost
    Claim c("cost", "Scores grow with the square of the length; flash attention never stores them",
            "Each of n queries scores every one of n keys: n^2 scores per head. 4,096 positions give 16,777,216 "
            "scores, 32 MiB at 2 bytes each; doubling the length quadruples it. Tiled (flash) attention computes "
            "the same output holding one tile of scores at a time.");
    Json rows = Json::array();
    double worst_ratio = 0;
    for (int64_t n : {1024, 2048, 4096, 8192}) {
      kernels::AttnShape shape;
      shape.Tq = shape.Tk = n;
      shape.Dk = shape.Dv = 64;
      const double ws = static_cast<double>(kernels::flash_forward_workspace(shape, num_threads(), active_isa()));
      const double lse = static_cast<double>(n) * 4;
      const double scores = static_cast<double>(n) * static_cast<double>(n);
      c.line(detail::concat("n = ", thousands(n), ": ", thousands(n * n), " scores = ", fmt(scores * 2 / 1048576, 0),
                            " MiB at 2 bytes (", fmt(scores * 4 / 1048576, 0), " MiB at 4); qkv's flash kernel: ",
                            fmt((ws + lse) / 1048576, 2), " MiB (packed Q, K, V, one tile per thread, ", thousands(n),
                            " log-sum-exps)"));
      rows.push_back({static_cast<double>(n), scores * 2 / 1048576, (ws + lse) / 1048576});
      // ... and the same output: the flash kernel at this n (all n queries) against the float64
      // reference on 16 query rows spread over the n (every key each), beside the plain float32
      // implementation of the same rows (AttentionImpl::Reference / ReferenceFloat32)
      const int64_t D = 64, R = 16;
      const Tensor q = randn(rng, {n, D}), k = randn(rng, {n, D}), v = randn(rng, {n, D});
      const Tensor out = attention(q, k, v).out;
      Tensor rows_q = Tensor::zeros({R, D}), rows_flash = Tensor::zeros({R, D});
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = r * (n - 1) / (R - 1);
        std::copy(q.data<float>() + i * D, q.data<float>() + (i + 1) * D, rows_q.data<float>() + r * D);
        std::copy(out.data<float>() + i * D, out.data<float>() + (i + 1) * D, rows_flash.data<float>() + r * D);
      }
      AttentionSpec ref, plain;
      ref.impl = AttentionImpl::Reference;
      plain.impl = AttentionImpl::ReferenceFloat32;
      const Tensor want = attention(rows_q, k, v, ref).out;
      const double err_flash = max_abs_diff(rows_flash, want);
      const double err_plain = max_abs_diff(attention(rows_q, k, v, plain).out, want);
      double ref_max = 0;
      for (int64_t e = 0; e < want.numel(); ++e) ref_max = std::max(ref_max, std::fabs(static_cast<double>(want.data<float>()[e])));
      worst_ratio = std::max(worst_ratio, err_flash / std::max(err_plain, 1e-12));
      c.line(detail::concat("   the same output: flash against float64 on ", R, " of the ", thousands(n),
                            " query rows (every key), max error ", fmt_g(err_flash), "; a plain float32 softmax of "
                            "the same rows: ", fmt_g(err_plain), " (outputs up to ", fmt(ref_max, 2), ")"));
    }
    c.matrix("n, MiB of scores at 2 bytes, MiB the flash kernel holds (one head, d = 64)", rows);
    bool quadruples = true, smaller = true;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i > 0) quadruples = quadruples && rows[i][1].get<double>() == 4 * rows[i - 1][1].get<double>();
      smaller = smaller && rows[i][2].get<double>() < rows[i][1].get<double>() / 4;
    }
    c.line("doubling n quadruples the scores: " + std::string(quadruples ? "yes" : "no") +
           "; the flash kernel's memory grows linearly: " + fmt(rows[3][2].get<double>() / rows[2][2].get<double>(), 2) +
           "x from 4,096 to 8,192");
    c.line("the flash kernel's error is " + fmt(worst_ratio, 2) + "x a plain float32 implementation's at worst: the "
           "tiles change what is held, not what is computed");
    c.holds(quadruples && smaller && worst_ratio <= 2.0);
    claims.push_back(c.j);
  }
  {  // 7. parallel training = sequential generation
    Claim c("causal", "Causal training in parallel computes what generation computes one token at a time",
            "With the causal mask, position t sees only positions up to t, so one parallel pass over a sequence "
            "gives every position the logits that sequential generation (with its key/value cache) gives it.");
    std::unique_ptr<Model> own;
    const ModelConfig* mc = lm;
    if (!mc) {
      ModelConfig cfg;
      cfg.arch = Arch::Decoder;
      cfg.vocab_size = 32;
      cfg.d_model = 32;
      cfg.n_heads = 4;
      cfg.d_ff = 64;
      cfg.n_layers = 2;
      cfg.norm_first = true;
      cfg.positional = Positional::Learned;
      cfg.max_len = 32;
      own = std::make_unique<Model>(cfg);
      own->init(seed);
      mc = &own->config();
    }
    std::vector<int32_t> ids;
    const int64_t V = mc->vocab_size;
    const int64_t T = mc->positional == Positional::Learned ? std::min<int64_t>(12, mc->max_len) : 12;
    for (int64_t t = 0; t < T; ++t) ids.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(V))));
    int64_t n = 0;
    const auto compare = [&](const Model& m) { return parallel_vs_sequential(m, ids, &n); };
    const double d = own ? compare(*own) : run_lm(compare);
    c.line(detail::concat(lm ? "the served model" : "a random 2-layer decoder", ", ", n,
                          " random tokens: max |logits(parallel pass) - logits(one token at a time)| = ", fmt_g(d)));
    c.holds(d < 1e-3);
    claims.push_back(c.j);
  }
  {  // 8. multi-head
    Claim c("heads", "Heads attend separately; their outputs are concatenated and projected",
            "Each head has its own W_Q, W_K, W_V on a slice of the model width and its own weights; the head "
            "outputs are concatenated and W_O mixes them back to the model width.");
    const int64_t T = 4, H = 2, Dh = 3, D = H * Dh;
    const Tensor x = randn(rng, {T, D});
    Tensor q = Tensor::zeros({1, H, T, Dh}), k = Tensor::zeros({1, H, T, Dh}), v = Tensor::zeros({1, H, T, Dh});
    for (int64_t h = 0; h < H; ++h) {
      const Tensor qh = matmul(x, randn(rng, {D, Dh}, 0.7)), kh = matmul(x, randn(rng, {D, Dh}, 0.7)),
                   vh = matmul(x, randn(rng, {D, Dh}, 0.7));
      std::copy(qh.data<float>(), qh.data<float>() + T * Dh, q.data<float>() + h * T * Dh);
      std::copy(kh.data<float>(), kh.data<float>() + T * Dh, k.data<float>() + h * T * Dh);
      std::copy(vh.data<float>(), vh.data<float>() + T * Dh, v.data<float>() + h * T * Dh);
    }
    const AttentionOutput o = attention(q, k, v);
    const Tensor w = attention_weights(q, k, o.lse, {}, 0, T);  // (1, H, T, T)
    for (int64_t h = 0; h < H; ++h)
      c.matrix(detail::concat("head ", h + 1, " weights"), rows_json(w.slice(1, h, h + 1).contiguous().view({T, T})),
               labels("t", T), labels("t", T));
    const Tensor concat = o.out.permute({0, 2, 1, 3}).contiguous().view({T, D});  // (T, H * Dh)
    const Tensor wo = randn(rng, {D, D}, 0.5);
    const Tensor out = matmul(concat, wo);
    c.line(detail::concat(H, " heads of width ", Dh, ": outputs (", T, " x ", Dh, ") each, concatenated to (", T, " x ",
                          D, "), times W_O (", D, " x ", D, ") = (", T, " x ", D, ")"));
    // each head alone (its own slice of q, k, v, one attention call) gives its columns of the concatenation
    double alone = 0;
    for (int64_t h = 0; h < H; ++h) {
      const auto slice = [&](const Tensor& t) { return t.slice(1, h, h + 1).contiguous().view({T, Dh}); };
      const Tensor oh = attention(slice(q), slice(k), slice(v)).out;
      alone = std::max(alone, max_abs_diff(oh, concat.slice(1, h * Dh, (h + 1) * Dh).contiguous()));
    }
    c.line("each head computed alone gives its own columns of the concatenation: max difference " + fmt_g(alone));
    c.holds(alone < 1e-6);
    c.line("the heads' weights for token 1: " + vec(floats(w.slice(2, 0, 1).slice(1, 0, 1))) + " and " +
           vec(floats(w.slice(2, 0, 1).slice(1, 1, 2))));
    c.matrix("output = concat(heads) W_O", rows_json(out), labels("t", T));
    claims.push_back(c.j);
  }
  {  // 9. encoder, decoder, cross
    Claim c("stacks", "Encoder, decoder and cross-attention differ in what each query may see",
            "An encoder's self-attention is bidirectional; a decoder's is causal (no looking ahead); "
            "cross-attention lets each target position look at every source position.");
    const int64_t T = 4, S = 3, D = 4;
    const Tensor x = randn(rng, {T, D}), mem = randn(rng, {S, D});
    AttentionSpec causal;
    causal.causal = true;
    c.matrix("encoder self-attention (bidirectional)", rows_json(weights_of(x, x, {})), labels("t", T), labels("t", T));
    c.matrix("decoder self-attention (causal: zeros above the diagonal)", rows_json(weights_of(x, x, causal)),
             labels("t", T), labels("t", T));
    c.matrix("cross-attention (target queries over source keys)", rows_json(weights_of(x, mem, {})), labels("t", T),
             labels("s", S));
    const Tensor wc = weights_of(x, x, causal);
    bool upper_zero = true;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = i + 1; j < T; ++j) upper_zero = upper_zero && wc.data<float>()[i * T + j] == 0.0f;
    c.holds(upper_zero);
    claims.push_back(c.j);
  }
  {  // 10. post-norm and pre-norm both train
    Claim c("norms", "Layer normalisation before or after the sublayer: both train",
            "The 2017 transformer normalises after each residual addition (post-norm); most later models normalise "
            "the sublayer's input instead (pre-norm), which keeps the residual path an identity and trains more "
            "stably when deep. On a small model both learn: two 2-layer decoders, the same data and seed, "
            "trained here for 200 steps.");
    // the task: each sequence repeats a random pattern of 4 tokens, so from the 4th token on
    // every next token is the one 3 back (what attention can look up)
    const int64_t B = 16, T = 16, V = 16, P = 4, steps = 200;
    std::vector<Batch> data;
    for (int64_t s = 0; s < steps; ++s) {
      Batch b;
      b.input = Tensor({B, T}, DType::I64);
      b.target = Tensor({B, T}, DType::I64);
      for (int64_t i = 0; i < B; ++i) {
        int64_t pat[P];
        for (int64_t p = 0; p < P; ++p) pat[p] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(V)));
        for (int64_t t = 0; t < T; ++t) {
          b.input.data<int64_t>()[i * T + t] = pat[t % P];
          b.target.data<int64_t>()[i * T + t] = pat[(t + 1) % P];
        }
      }
      data.push_back(std::move(b));
    }
    std::vector<std::vector<double>> loss(2);
    Json rows = Json::array();
    for (int pre = 1; pre >= 0; --pre) {
      ModelConfig cfg;
      cfg.arch = Arch::Decoder;
      cfg.vocab_size = V;
      cfg.d_model = 32;
      cfg.n_heads = 4;
      cfg.d_ff = 64;
      cfg.n_layers = 2;
      cfg.norm_first = pre == 1;
      cfg.final_norm = pre == 1;  // the 2017 layout has no final norm; GPT-2's pre-norm one has
      cfg.positional = Positional::Learned;
      cfg.max_len = T;
      Model m(cfg);
      m.init(seed);
      TrainConfig tc;
      tc.schedule.lr = 5e-3;
      tc.schedule.warmup = 20;
      tc.seed = seed;
      Trainer tr(m, tc);
      for (const Batch& b : data) loss[static_cast<size_t>(1 - pre)].push_back(tr.step({b}).loss);
    }
    std::vector<std::string> at;
    for (int64_t s = 0; s <= steps; s += 25) {
      const int64_t i = std::max<int64_t>(s, 1);
      rows.push_back({loss[0][static_cast<size_t>(i - 1)], loss[1][static_cast<size_t>(i - 1)]});
      at.push_back(detail::concat("step ", i));
    }
    c.matrix("training loss (cross-entropy, nats per token)", rows, at, {"pre-norm", "post-norm"});
    const double chance = std::log(static_cast<double>(V));
    c.line(detail::concat("pre-norm:  loss ", fmt(loss[0].front(), 3), " -> ", fmt(loss[0].back(), 3), " in ", steps,
                          " steps; post-norm: ", fmt(loss[1].front(), 3), " -> ", fmt(loss[1].back(), 3),
                          " (guessing among ", V, " tokens: ln ", V, " = ", fmt(chance, 3),
                          "; the first ", P - 1, " targets of a sequence cannot be predicted, the other ", T - P + 1,
                          " can, so the floor is about ", P - 1, "/", T, " x ", fmt(chance, 3), " = ",
                          fmt(chance * static_cast<double>(P - 1) / static_cast<double>(T), 3), ")"));
    c.j["curves"] = {{"pre-norm", loss[0]}, {"post-norm", loss[1]}};
    c.j["floor"] = chance * static_cast<double>(P - 1) / static_cast<double>(T);
    c.holds(loss[0].back() < 0.6 * loss[0].front() && loss[1].back() < 0.6 * loss[1].front());
    claims.push_back(c.j);
  }
  return {{"seed", seed}, {"claims", claims}, {"note", "A weight is part of the computation, not an explanation of it."}};
}

}  // namespace qkv::tour
