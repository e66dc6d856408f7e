// qkv bench gemv: the matrix-vector product of decoding at batch 1, by weight type, in GB/s of
// weights read, against the machine's read bandwidth measured in the same run, and float32's
// product as qkv decodes today (qkv::sgemm -> qkv's row products).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cli_checks.h"
#include "commands.h"
#include "kernels/quant.h"
#include "qkv/cpu.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "qkv/rng.h"

namespace qkv::cli {
namespace {

struct GemvBenchOptions {
  int64_t rows = 5632, cols = 2048;  // TinyLlama-1.1B's feed-forward projection
  std::vector<std::string> dtypes = {"f32", "bf16", "f16", "q8_0", "q4_0"};
  int64_t matrix_mib = 512;
  int reps = 5;
  bool json = false;
};

kernels::WType parse_wtype(const std::string& s) {
  for (auto t : {kernels::WType::F32, kernels::WType::BF16, kernels::WType::F16, kernels::WType::Q8_0,
                 kernels::WType::Q4_0})
    if (s == kernels::wtype_name(t)) return t;
  fail("--dtype ", s, ": expected f32, bf16, f16, q8_0 or q4_0");
}

int run_bench_gemv(const GemvBenchOptions& o) {
  const int threads = num_threads();
  const int64_t N = o.rows, K = o.cols;
  Rng rng(7);
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N)), dense(static_cast<size_t>(K));
  for (float& v : x) v = static_cast<float>(rng.normal());
  const double bw = read_bandwidth_gbs(1024, 5);
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json)
    std::printf("qkv bench gemv: y (%lld) = W (%lld x %lld) x, %d threads, %s; read bandwidth %.1f GB/s\n",
                static_cast<long long>(N), static_cast<long long>(N), static_cast<long long>(K), threads,
                cpu_description().c_str(), bw);
  for (const std::string& name : o.dtypes) {
    const kernels::WType t = parse_wtype(name);
    const size_t bytes = kernels::row_bytes(t, K) * static_cast<size_t>(N);
    // enough copies of W that together they are far larger than the caches: each product reads
    // its weights from memory, as decoding's layers do
    const auto copies = static_cast<size_t>(std::max<int64_t>(2, o.matrix_mib * (int64_t{1} << 20) / static_cast<int64_t>(bytes)));
    std::vector<std::vector<uint8_t>> W(copies, std::vector<uint8_t>(bytes));
    for (size_t c = 0; c < copies; ++c)
      for (int64_t n = 0; n < N; ++n) {
        for (float& v : dense) v = static_cast<float>(rng.normal()) * 0.02f;
        kernels::quantize_row(t, dense.data(), K, W[c].data() + static_cast<size_t>(n) * kernels::row_bytes(t, K));
      }
    if (t == kernels::WType::Q4_0)  // held as the models hold it: rows grouped by 16 (kernels/quant.h)
      for (auto& w : W) kernels::q4_0_group_rows(w.data(), N, K);
    std::vector<uint8_t> ws(kernels::gemv_workspace_bytes(t, K));
    auto product = [&](size_t c) {
      if (t == kernels::WType::F32)
        sgemm(false, true, 1, N, K, 1.0f, x.data(), K, reinterpret_cast<const float*>(W[c].data()), K, 0.0f, y.data(), N);
      else
        kernels::gemv(t, W[c].data(), N, K, x.data(), y.data(), ws.data(), threads);
    };
    for (size_t c = 0; c < copies; ++c) product(c);  // warm-up
    double best = 1e30;
    for (int r = 0; r < o.reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t c = 0; c < copies; ++c) product(c);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                                static_cast<double>(copies));
    }
    const double gbs = static_cast<double>(bytes) / best / 1e9;
    const std::string path = t == kernels::WType::F32 ? "qkv::sgemm (qkv's row products)" : "qkv gemv";
    rows.push_back({{"dtype", name}, {"path", path}, {"weight_mib", static_cast<double>(bytes) / (1 << 20)},
                    {"us", best * 1e6}, {"gb_per_s", gbs}, {"fraction_of_bandwidth", gbs / bw}});
    if (!o.json)
      std::printf("  %-5s %8.2f MiB  %9.1f us  %6.1f GB/s  %4.0f%% of bandwidth  (%s)\n", name.c_str(),
                  static_cast<double>(bytes) / (1 << 20), best * 1e6, gbs, 100 * gbs / bw, path.c_str());
  }
  // a product reading faster than the measured bandwidth read from the caches (--matrix-mib too
  // small), or the bandwidth was measured low (another process ran): the ratios mean little
  std::vector<std::string> warnings;
  for (const auto& e : rows)
    if (e["fraction_of_bandwidth"].get<double>() > 1.0)
      warnings.push_back(detail::concat(e["dtype"].get<std::string>(), " read its weights at ",
                                        static_cast<int>(100 * e["fraction_of_bandwidth"].get<double>()),
                                        "% of the measured bandwidth: its weights stayed in the caches (raise --matrix-mib) "
                                        "or the bandwidth was measured low (a busy machine); the ratios mean little"));
  for (const std::string& w : warnings) std::fprintf(stderr, "qkv bench gemv: warning: %s\n", w.c_str());
  if (!o.json) {
    // products per second relative to float32's: what decoding gains when it is this product
    const auto& r = rows;
    auto f32 = std::find_if(r.begin(), r.end(), [](const nlohmann::json& e) { return e["dtype"] == "f32"; });
    if (f32 != r.end())
      for (const auto& e : r)
        if (e["dtype"] != "f32")
          std::printf("  %s: %.2fx float32's products per second\n", e["dtype"].get<std::string>().c_str(),
                      (*f32)["us"].get<double>() / e["us"].get<double>());
    return 0;
  }
  nlohmann::json j = {{"rows", N},   {"cols", K}, {"threads", threads}, {"cpu", cpu_description()},
                      {"isa", isa_name(active_isa())}, {"vnni", kernels::cpu_has_avx512_vnni()},
                      {"read_bandwidth_gbs", bw}, {"results", rows}, {"warnings", warnings}};
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace

Runner add_bench_gemv(CLI::App& bench) {
  auto o = std::make_shared<GemvBenchOptions>();
  CLI::App* c = bench.add_subcommand(
      "gemv", "Decoding's matrix-vector product by weight type (f32, bf16, f16, q8_0, q4_0) against the read bandwidth");
  c->add_option("--rows", o->rows, "Rows N of W (outputs)")->transform(whole(1, 1 << 20));
  c->add_option("--cols", o->cols, "Columns K of W (inputs; a multiple of 32 for q8_0 and q4_0)")
      ->transform(whole(32, 1 << 20));
  c->add_option("--dtype", o->dtypes, "Weight types, comma-separated")->delimiter(',');
  c->add_option("--matrix-mib", o->matrix_mib, "MiB of weights cycled through per timed pass (far above the caches)")
      ->transform(whole(1, 1 << 16));
  c->add_option("--reps", o->reps, "Timed passes (the best is reported)")->transform(whole(1, 1000));
  c->add_flag("--json", o->json, "Print JSON");
  return [o] {
    for (const std::string& d : o->dtypes) (void)kernels::row_bytes(parse_wtype(d), o->cols);  // errors before work
    return run_bench_gemv(*o);
  };
}

}  // namespace qkv::cli
