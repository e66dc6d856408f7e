// qkv attend: the chapter's worked example, or attention on .npy files.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "cli_checks.h"
#include "commands.h"
#include "qkv/qkv.h"
#include "task_util.h"
#include "tour.h"

namespace qkv::cli {
namespace {

struct AttendOptions {
  std::string q, k, v, mask, bool_mask, key_lengths, out, weights, lse, dout, dq, dk, dv;
  std::string causal;  // "", "bottom-right", "top-left"
  int64_t window = 0;
  bool alibi = false;
  std::optional<double> scale;
  std::string impl = "flash";
  std::string rows;  // "BEGIN:END" for --weights
};

// "BEGIN:END" (either side may be empty) -> [begin, end) within [0, n).
std::pair<int64_t, int64_t> parse_rows(const std::string& spec, int64_t n) {
  if (spec.empty()) return {0, n};
  const auto colon = spec.find(':');
  check(colon != std::string::npos, "--rows '", spec, "': expected BEGIN:END, e.g. 0:16 or 100:");
  auto number = [&](const std::string& x, int64_t dflt) -> int64_t {
    if (x.empty()) return dflt;
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(x, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == x.size() && used > 0, "--rows '", spec, "': '", x, "' is not a whole number");
    return v;
  };
  const int64_t b = number(spec.substr(0, colon), 0), e = number(spec.substr(colon + 1), n);
  check(0 <= b && b <= e && e <= n, "--rows ", spec, ": expected 0 <= BEGIN <= END <= Tq = ", n);
  return {b, e};
}

// Reads a float array, converting float64 (NumPy's default) to float32.
Tensor read_float(const std::string& path) {
  Tensor t = read_npy(path);
  if (t.dtype() == DType::F64) return t.to(DType::F32);
  check(t.dtype() == DType::F32, path, ": expected a float32 or float64 array, got ", t.describe());
  return t;
}

std::string fmt(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

std::string vec_str(const float* p, int64_t n, int digits) {
  std::string s = "[";
  for (int64_t i = 0; i < n; ++i) s += (i ? ", " : "") + fmt(p[i], digits);
  return s + "]";
}

int worked_example(const AttendOptions& o) {
  const float r2 = std::sqrt(2.0f);
  Tensor q = Tensor::from<float>({1, 2}, {r2, 0.0f});
  Tensor k = Tensor::from<float>({3, 2}, {1, 0, 0, 1, 1, 1});
  Tensor v = Tensor::from<float>({3, 2}, {10, 0, 0, 10, 4, 6});
  AttentionSpec spec;
  spec.impl = o.impl == "reference" ? AttentionImpl::Reference : AttentionImpl::Flash;
  std::cout << "The chapter's worked example: one query, three keys, Dk = Dv = 2 (qkv attend --impl " << o.impl
            << ")\n\n"
            << "  q  = [sqrt(2), 0] = " << vec_str(q.data<float>(), 2, 4) << "\n"
            << "  keys   k1 = [1, 0]    k2 = [0, 1]    k3 = [1, 1]\n"
            << "  values v1 = [10, 0]   v2 = [0, 10]   v3 = [4, 6]\n\n";
  // Step 1: scores, computed here the long way so every number is visible.
  float s[3];
  for (int j = 0; j < 3; ++j) s[j] = (q.data<float>()[0] * k.data<float>()[2 * j] + q.data<float>()[1] * k.data<float>()[2 * j + 1]) / r2;
  std::cout << "1. scores s_j = q . k_j / sqrt(Dk), sqrt(Dk) = " << fmt(r2, 4) << "\n"
            << "     s = " << vec_str(s, 3, 4) << "\n";
  const float mx = std::max({s[0], s[1], s[2]});
  float e[3], sum = 0;
  for (int j = 0; j < 3; ++j) sum += e[j] = std::exp(s[j] - mx);
  std::cout << "2. softmax, max subtracted first (max = " << fmt(mx, 4) << ")\n"
            << "     exp(s - max) = " << vec_str(e, 3, 4) << ", sum = " << fmt(sum, 4) << "\n";
  // Steps 2-3 as the library computes them.
  AttentionOutput r = attention(q, k, v, spec);
  Tensor w = attention_weights(q, k, r.lse, spec, 0, 1);
  std::cout << "     weights a_j = exp(s_j - max) / sum = " << vec_str(w.data<float>(), 3, 4) << "\n"
            << "3. output z = sum_j a_j v_j = " << vec_str(r.out.data<float>(), 2, 3) << "\n"
            << "   (keys decide the weights; values are what gets mixed)\n\n";
  // Blocking the third key with the additive mask M = [0, 0, -inf].
  AttentionSpec blocked = spec;
  blocked.mask = Tensor::from<float>({1, 3}, {0.0f, 0.0f, -INFINITY});
  AttentionOutput rb = attention(q, k, v, blocked);
  Tensor wb = attention_weights(q, k, rb.lse, blocked, 0, 1);
  std::cout << "4. block the third key: M = [0, 0, -inf] added to the scores, softmax renormalises\n"
            << "     weights = " << vec_str(wb.data<float>(), 3, 4) << "\n"
            << "     output  = " << vec_str(rb.out.data<float>(), 2, 3) << "\n"
            << "   Zeroing the third weight after the softmax instead would leave "
            << vec_str(w.data<float>(), 2, 4) << ", summing to " << fmt(w.data<float>()[0] + w.data<float>()[1], 4)
            << ": not a distribution.\n";
  return 0;
}

int run_attend(const AttendOptions& o) {
  check(o.impl == "flash" || o.impl == "reference", "--impl: expected flash or reference, got '", o.impl, "'");
  check(o.causal.empty() || o.causal == "bottom-right" || o.causal == "top-left",
        "--causal: expected bottom-right or top-left, got '", o.causal, "'");
  const bool any_input = !o.q.empty() || !o.k.empty() || !o.v.empty();
  if (!any_input) {
    const bool extras = !o.mask.empty() || !o.bool_mask.empty() || !o.key_lengths.empty() || !o.out.empty() ||
                        !o.weights.empty() || !o.rows.empty() || !o.lse.empty() || !o.dout.empty() || !o.causal.empty() ||
                        o.window != 0 || o.alibi || o.scale;
    check(!extras, "these options need input arrays: give --q, --k and --v (or no options at all for the worked example)");
    return worked_example(o);
  }
  check(!o.q.empty() && !o.k.empty() && !o.v.empty(), "--q, --k and --v are needed together");
  check(!o.out.empty(), "--out is required with --q/--k/--v (where to write the output .npy)");
  const bool want_grads = !o.dout.empty();
  check(want_grads || (o.dq.empty() && o.dk.empty() && o.dv.empty()),
        "--dq/--dk/--dv need --dout (the gradient of the loss with respect to the output)");
  AttentionSpec spec;
  spec.impl = o.impl == "reference" ? AttentionImpl::Reference : AttentionImpl::Flash;
  spec.scale = o.scale;
  if (!o.causal.empty()) {
    spec.causal = true;
    spec.align = o.causal == "top-left" ? Align::TopLeft : Align::BottomRight;
  }
  spec.window = o.window;
  spec.alibi = o.alibi;
  Tensor q = read_float(o.q), k = read_float(o.k), v = read_float(o.v);
  if (!o.mask.empty()) spec.mask = read_float(o.mask);
  if (!o.bool_mask.empty()) {
    Tensor b = read_npy(o.bool_mask);
    check(b.dtype() == DType::Bool, o.bool_mask, ": expected a bool array (true = may attend), got ", b.describe());
    spec.bool_mask = b;
  }
  if (!o.key_lengths.empty()) {
    Tensor l = read_npy(o.key_lengths);
    check(l.dtype() == DType::I32 || l.dtype() == DType::I64, o.key_lengths, ": expected int32 or int64 lengths, got ",
          l.describe());
    spec.key_lengths = l;
  }
  // Every output's directory must exist before any work is done or any file is written.
  for (const std::string* path : {&o.out, &o.lse, &o.weights, &o.dq, &o.dk, &o.dv}) {
    if (path->empty()) continue;
    const std::filesystem::path dir = std::filesystem::absolute(*path).parent_path();
    std::error_code ec;
    check(std::filesystem::is_directory(dir, ec), *path, ": cannot write here, directory ", dir.string(),
          " does not exist");
  }
  // attention's errors name its arguments (q, k, v, mask, bool_mask, key_lengths, dout): here
  // they also name the files
  const std::pair<const char*, std::string> args[] = {{"mask", "--mask " + o.mask},
                                                      {"bool_mask", "--bool-mask " + o.bool_mask},
                                                      {"key_lengths", "--key-lengths " + o.key_lengths},
                                                      {"dout", "--dout " + o.dout}};
  auto named = [&](auto&& f) {
    try {
      return f();
    } catch (const Error& e) {
      const std::string m = e.what();
      for (const auto& [name, flag] : args)
        if (m.rfind(std::string(name) + ":", 0) == 0 || m.rfind(std::string(name) + "[", 0) == 0)
          throw Error(flag + ": " + m);
      throw Error(detail::concat("--q ", o.q, ", --k ", o.k, ", --v ", o.v, ": ", m));
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  AttentionOutput r = named([&] { return attention(q, k, v, spec); });
  // Compute everything before writing anything, so a failure leaves no partial set of outputs.
  std::optional<Tensor> weights;
  check(o.rows.empty() || !o.weights.empty(), "--rows selects rows of --weights: give --weights too");
  if (!o.weights.empty()) {
    const auto [b, e] = parse_rows(o.rows, q.size(-2));
    weights = attention_weights(q, k, r.lse, spec, b, e);
  }
  std::optional<AttentionGrads> g;
  if (want_grads) {
    Tensor dout = read_float(o.dout);
    g = named([&] { return attention_backward(q, k, v, r.out, r.lse, dout, spec); });
  }
  write_npy(o.out, r.out);
  if (!o.lse.empty()) write_npy(o.lse, r.lse);
  if (weights) write_npy(o.weights, *weights);
  if (g) {
    if (!o.dq.empty()) write_npy(o.dq, g->dq);
    if (!o.dk.empty()) write_npy(o.dk, g->dk);
    if (!o.dv.empty()) write_npy(o.dv, g->dv);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "wrote " << o.out << " " << r.out.describe() << " (" << o.impl << ", " << (want_grads ? "forward+backward" : "forward")
            << ", " << fmt(ms, 1) << " ms)\n";
  return 0;
}

}  // namespace

Runner add_attend(CLI::App& app) {
  auto o = std::make_shared<AttendOptions>();
  CLI::App* c = app.add_subcommand(
      "attend",
      "Z = softmax(Q K^T * scale + M) V. Without inputs: the chapter's worked example, step by step.\n"
      "Arrays are (B, H, T, D), (H, T, D) or (T, D) .npy files (float32, or float64 converted).");
  c->add_option("--q", o->q, "Queries Q.npy (.., Tq, Dk)");
  c->add_option("--k", o->k, "Keys K.npy (.., Tk, Dk); fewer heads than q = grouped-query attention");
  c->add_option("--v", o->v, "Values V.npy (.., Tk, Dv)");
  c->add_option("--mask", o->mask, "Additive float mask broadcastable to (B, H, Tq, Tk): 0 allowed, -inf blocked");
  c->add_option("--bool-mask", o->bool_mask, "Bool mask broadcastable to (B, H, Tq, Tk): true = may attend");
  c->add_option("--key-lengths", o->key_lengths, "int (B,) key-padding lengths: keys >= length are blocked");
  c->add_flag("--causal{bottom-right}", o->causal,
              "Causal mask; =bottom-right (default: query i sees keys <= i + Tk - Tq) or =top-left (keys <= i)");
  c->add_option("--window", o->window, "Sliding window of W keys (0 = off)")->transform(whole(0));
  c->add_flag("--alibi", o->alibi, "Add ALiBi position biases with the standard per-head slopes");
  c->add_option("--scale", o->scale, "Score scale (default 1/sqrt(Dk))")->transform(finite());
  c->add_option("--impl", o->impl, "flash (tiled, float32) or reference (float64 oracle)")
      ->check(CLI::IsMember({"flash", "reference"}));
  c->add_option("--out", o->out, "Write the output Z here (.npy)");
  c->add_option("--weights", o->weights, "Also write the attention weights (.., Tq, Tk), recomputed from lse");
  c->add_option("--rows", o->rows, "Only these query rows of --weights, as BEGIN:END (e.g. 0:16)");
  c->add_option("--lse", o->lse, "Also write the log-sum-exp of each query row (.., Tq)");
  c->add_option("--dout", o->dout, "Gradient of the loss w.r.t. Z (.npy): enables --dq/--dk/--dv");
  c->add_option("--dq", o->dq, "Write dL/dQ here");
  c->add_option("--dk", o->dk, "Write dL/dK here");
  c->add_option("--dv", o->dv, "Write dL/dV here");
  return [o] { return run_attend(*o); };
}

Runner add_tour(CLI::App& app) {
  struct TourOptions {
    uint64_t seed = 1;
    std::string model;
    bool json = false;
  };
  auto o = std::make_shared<TourOptions>();
  CLI::App* c = app.add_subcommand(
      "tour", "The chapter's worked example and claims, each computed on live numbers (what the explorer page shows, "
              "in the terminal)");
  c->add_option("--seed", o->seed, "Seed of the random numbers the claims are shown on (default 1)")
      ->transform(seed_number());
  c->add_option("--model", o->model,
                "A language model directory: show parallel = sequential on it (default: a small random decoder)");
  c->add_flag("--json", o->json, "Print the numbers as JSON (what qkv serve's /v1/attend and /v1/claims answer)");
  return [o] {
    std::unique_ptr<Model> lm;
    if (!o->model.empty()) {
      lm = std::make_unique<Model>(load_model(o->model));
      check(lm->config().arch == Arch::Decoder, "--model ", o->model, ": the model is ", arch_name(lm->config().arch),
            "; the tour needs a decoder-only language model (or no --model: a small random one)");
    }
    const nlohmann::json steps = attend_steps(ExampleInput::chapter());
    const nlohmann::json claims = chapter_claims(o->seed, lm.get());
    if (o->json) {
      std::cout << nlohmann::json{{"worked_example", steps}, {"claims", claims}}.dump(1) << "\n";
      return 0;
    }
    print_steps(std::cout, steps);
    print_claims(std::cout, claims);
    return 0;
  };
}

}  // namespace qkv::cli
