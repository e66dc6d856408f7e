// qkv bench attention: time, GFLOP/s and peak extra memory of the flash and reference
// attention, against this machine's own ceiling (one large SGEMM measured in the same run).
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cli_checks.h"
#include "commands.h"
#include "qkv/qkv.h"

namespace qkv::cli {
namespace {

struct BenchOptions {
  std::vector<int64_t> seq = {512, 1024, 2048, 4096, 8192};
  int64_t batch = 1, heads = 8, dim = 64, ref_max_t = 4096, gemm_n = 2048;
  int reps = 3;
  double min_time = 1.0;
  bool json = false;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Resets VmHWM (proc_status_kb("VmHWM"): peak resident memory) to the current RSS.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  return static_cast<bool>(f);
}

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t(std::move(shape), DType::F32);
  std::normal_distribution<float> n(0.0f, 1.0f);
  float* p = t.data<float>();
  const int64_t count = t.numel();
  for (int64_t i = 0; i < count; ++i) p[i] = n(rng);
  return t;
}

// A progress line on stderr (only when it is a terminal): elapsed time and an ETA over the
// cases left. A flash case takes about max(2 * min_time, reps * FLOPs / rate); a reference case
// FLOPs / rate; the rates are those measured so far (the reference is ~20x slower).
class Progress {
 public:
  struct Case {
    bool ref;
    double flops;  // one causal + one non-causal run
  };
  Progress(std::vector<Case> cases, int reps, double min_time)
      : cases_(std::move(cases)), reps_(reps), min_time_(min_time), enabled_(isatty(fileno(stderr)) != 0),
        start_(now_s()) {}
  void clear() const {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
  }
  // The next case finished after `seconds` (`runs` rounds).
  void done(double seconds, int runs) {
    const Case& c = cases_[next_++];
    (c.ref ? ref_flops_ : flash_flops_) += c.flops * runs;
    (c.ref ? ref_s_ : flash_s_) += seconds;
    if (!enabled_ || next_ >= cases_.size()) return;
    const double flash_rate = flash_s_ > 0 ? flash_flops_ / flash_s_ : 50e9;
    const double ref_rate = ref_s_ > 0 ? ref_flops_ / ref_s_ : flash_rate / 20;
    double eta = 0;
    for (size_t i = next_; i < cases_.size(); ++i)
      eta += cases_[i].ref ? cases_[i].flops / ref_rate
                           : std::max(2 * min_time_, reps_ * cases_[i].flops / flash_rate);
    std::fprintf(stderr, "\r\033[K[case %zu/%zu, %.0f s elapsed, about %.0f s left]", next_ + 1, cases_.size(),
                 now_s() - start_, eta);
    std::fflush(stderr);
  }

 private:
  std::vector<Case> cases_;
  size_t next_ = 0;
  int reps_;
  double min_time_;
  bool enabled_;
  double start_, flash_flops_ = 0, ref_flops_ = 0, flash_s_ = 0, ref_s_ = 0;
};

// VmHWM and VmRSS come from counters the kernel updates in batches per thread, so their
// difference is good to about a MiB: a small case can read slightly negative, and a ratio of
// two readings below this means nothing.
constexpr double kMemoryResolutionMiB = 1.0;

struct Row {
  std::string impl, pass;
  int64_t T;
  bool causal;
  double seconds, gflops, peak_mib;
};

// Refuses sizes whose arrays cannot fit before any is allocated: per case q, k, v, dout and
// the outputs and gradients, 10 float arrays of B*H*T*D, and for the reference its (Tq, Tk)
// float64 scores and probabilities per thread.
void check_sizes(const BenchOptions& o) {
  std::string source;
  const double avail = available_memory_bytes(&source);
  if (avail < 0) return;
  for (int64_t T : o.seq) {
    const double bhtd = static_cast<double>(o.batch) * static_cast<double>(o.heads) * static_cast<double>(T) *
                        static_cast<double>(o.dim);
    double bytes = 10.0 * 4.0 * bhtd;
    if (T <= o.ref_max_t) bytes += 2.0 * 8.0 * static_cast<double>(T) * static_cast<double>(T) * num_threads();
    char need[32], have[32];
    std::snprintf(need, sizeof need, "%.1f", bytes / (1 << 30));
    std::snprintf(have, sizeof have, "%.1f", avail / (1 << 30));
    check(bytes <= avail, "--seq ", T, ": a case of B = ", o.batch, ", H = ", o.heads, ", T = ", T, ", D = ", o.dim,
          T <= o.ref_max_t ? " with the reference" : "", " needs about ", need, " GiB, more than the ", have,
          " GiB of memory available (", source, ")", T <= o.ref_max_t ? "; lower --ref-max-t, or " : "; lower ",
          "--seq, --batch, --heads or --dim");
  }
  const double gemm = 3.0 * 4.0 * static_cast<double>(o.gemm_n) * static_cast<double>(o.gemm_n);
  check(gemm <= avail, "--gemm-n ", o.gemm_n, ": three ", o.gemm_n, " x ", o.gemm_n,
        " float matrices do not fit the memory available");
}

int run_bench(const BenchOptions& o) {
  check_sizes(o);
  const int threads = num_threads();
  const BlasInfo blas = blas_info();
  const Ceiling measured = measure_gemm_ceiling(o.gemm_n, o.reps);
  const double ceiling = measured.gflops;
  std::vector<std::string> warnings;
  if (!measured.warning().empty()) warnings.push_back(measured.warning());
  std::vector<Row> rows;
  if (!o.json) {
    std::printf("qkv bench attention: B=%lld H=%lld D=%lld, %d threads, kernels: %s\nCPU: %s\n",
                static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(o.dim),
                threads, isa_name(active_isa()), cpu_description().c_str());
    std::printf("GEMM: %s; single rows: %s, kernel %s (%s)%s\n", blas.gemm.c_str(), blas.library.c_str(),
                blas.corename.c_str(), blas.threading.c_str(),
                blas.generic_fallback ? "  WARNING: generic fallback kernel" : "");
    std::printf("ceiling: SGEMM %lldx%lldx%lld = %.1f GFLOP/s\n\n", static_cast<long long>(o.gemm_n),
                static_cast<long long>(o.gemm_n), static_cast<long long>(o.gemm_n), ceiling);
    std::printf("%-9s %-8s %6s %-7s %10s %9s %8s %11s\n", "impl", "pass", "T", "causal", "time (s)", "GFLOP/s",
                "%ceiling", "peak MiB");
    std::fflush(stdout);
  }
  auto case_flops = [&](int64_t T, bool backward) {  // causal (half) + non-causal
    return 4.0 * T * T * o.dim * o.heads * o.batch * 1.5 * (backward ? 3.5 : 1.0);
  };
  std::vector<Progress::Case> plan;
  for (int64_t T : o.seq)
    for (bool ref : {false, true})
      for (bool backward : {false, true})
        if (!ref || T <= o.ref_max_t) plan.push_back({ref, case_flops(T, backward)});
  Progress progress(plan, o.reps, o.min_time);
  std::mt19937 rng(42);
  for (int64_t T : o.seq) {
    Tensor q = random_tensor({o.batch, o.heads, T, o.dim}, rng);
    Tensor k = random_tensor({o.batch, o.heads, T, o.dim}, rng);
    Tensor v = random_tensor({o.batch, o.heads, T, o.dim}, rng);
    Tensor dout = random_tensor({o.batch, o.heads, T, o.dim}, rng);
    for (AttentionImpl impl : {AttentionImpl::Flash, AttentionImpl::Reference}) {
      if (impl == AttentionImpl::Reference && T > o.ref_max_t) continue;
      const bool ref = impl == AttentionImpl::Reference;
      for (bool backward : {false, true}) {
        // The causal and non-causal runs alternate, so that both see the same machine (this
        // shared 2-core machine drifts by tens of percent): flash takes the best of at least
        // --reps rounds and at least --min-time seconds of rounds.
        const int reps = o.reps;
        double best[2] = {1e30, 1e30};
        int64_t peak_kb[2] = {0, 0};
        const double start = now_s();
        int rounds = 0;
        auto run = [&](int causal) {
          AttentionSpec spec;
          spec.causal = causal == 1;
          spec.impl = impl;
          AttentionOutput out = attention(q, k, v, spec);
          if (backward) {
            AttentionGrads g = attention_backward(q, k, v, out.out, out.lse, dout, spec);
          }
        };
        // Memory: runs with every block over 64 KiB straight from and back to the OS, so the
        // resident peak counts what the call allocates (recycled blocks would hide it); the
        // smaller of two rounds, so one-time growth (thread arenas) is not charged to a case.
        mallopt(M_MMAP_THRESHOLD, 64 * 1024);
        mallopt(M_TRIM_THRESHOLD, 128 * 1024);
        malloc_trim(0);
        peak_kb[0] = peak_kb[1] = INT64_MAX;
        for (int round = 0; round < (ref ? 1 : 2); ++round)
          for (int causal = 0; causal < 2; ++causal) {
            reset_peak();
            const int64_t base = proc_status_kb("VmRSS");
            const double t0 = now_s();
            run(causal);
            if (ref) best[causal] = now_s() - t0;  // the reference is slow and steady: this one run
            peak_kb[causal] = std::min(peak_kb[causal], proc_status_kb("VmHWM") - base);
          }
        if (ref) rounds = 1;
        mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
        mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
        // Timing: glibc's default allocator, which reuses freed memory as a program in a loop
        // would (blocks over 32 MiB still come fresh from the OS each call).
        for (int r = 0; !ref && (r < reps || (now_s() - start < 2 * o.min_time && r < 1000)); ++r) {
          for (int causal = 0; causal < 2; ++causal) {
            const double t0 = now_s();
            run(causal);
            best[causal] = std::min(best[causal], now_s() - t0);
          }
          ++rounds;
        }

        progress.clear();
        for (int causal = 0; causal < 2; ++causal) {
          double flops = 4.0 * T * T * o.dim * o.heads * o.batch * (causal ? 0.5 : 1.0);
          if (backward) flops *= 3.5;
          // peak: extra memory, never below zero (a negative reading is counter noise)
          Row row{ref ? "reference" : "flash", backward ? "fwd+bwd" : "fwd", T, causal == 1, best[causal],
                  flops / best[causal] / 1e9, std::max<int64_t>(0, peak_kb[causal]) / 1024.0};
          rows.push_back(row);
          if (!o.json) {
            std::printf("%-9s %-8s %6lld %-7s %10.4f %9.1f %7.1f%% %11.1f\n", row.impl.c_str(), row.pass.c_str(),
                        static_cast<long long>(T), causal ? "yes" : "no", row.seconds, row.gflops,
                        100.0 * row.gflops / ceiling, row.peak_mib);
            std::fflush(stdout);
          }
        }
        progress.done(now_s() - start, rounds);
      }
    }
  }
  progress.clear();
  // A kernel above the ceiling means the ceiling was measured low (a busy machine), or a kernel
  // beats this BLAS's SGEMM: either way the ratio is not what it claims to be.
  double top = 0;
  for (const Row& r : rows) top = std::max(top, r.gflops / ceiling);
  if (top > 1.0) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "warning: a kernel ran at %.0f%% of the SGEMM ceiling: the ceiling was measured while something "
                  "else ran, or is not this machine's; rerun on an idle machine before quoting ratios",
                  100 * top);
    warnings.push_back(buf);
  }
  for (const std::string& w : warnings) std::fprintf(stderr, "qkv bench attention: %s\n", w.c_str());
  if (o.json) {
    nlohmann::json j;
    j["cpu"] = cpu_description();
    j["isa"] = isa_name(active_isa());
    j["threads"] = threads;
    j["blas"] = {{"gemm", blas.gemm}, {"library", blas.library}, {"corename", blas.corename}, {"threading", blas.threading},
                 {"generic_fallback", blas.generic_fallback}};
    j["shape"] = {{"B", o.batch}, {"H", o.heads}, {"D", o.dim}};
    j["gemm_ceiling_gflops"] = ceiling;
    j["gemm_ceiling_slowest_gflops"] = measured.slowest_gflops;
    j["warnings"] = warnings;
    j["gemm_n"] = o.gemm_n;
    for (const Row& r : rows)
      j["results"].push_back({{"impl", r.impl}, {"pass", r.pass}, {"T", r.T}, {"causal", r.causal},
                              {"seconds", r.seconds}, {"gflops", r.gflops}, {"fraction_of_ceiling", r.gflops / ceiling},
                              {"peak_extra_mib", r.peak_mib}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  // Summary of the ratios the project tracks, at the largest T that has them.
  auto find = [&](const std::string& impl, const std::string& pass, int64_t T, bool causal) -> const Row* {
    for (const Row& r : rows)
      if (r.impl == impl && r.pass == pass && r.T == T && r.causal == causal) return &r;
    return nullptr;
  };
  std::printf("\nsummary:\n");
  for (int64_t T : o.seq) {
    const Row* f = find("flash", "fwd", T, false);
    const Row* fb = find("flash", "fwd+bwd", T, false);
    const Row* fc = find("flash", "fwd", T, true);
    const Row* rf = find("reference", "fwd", T, false);
    if (!f || !fb || !fc) continue;
    std::printf("  T=%-5lld flash fwd %.0f%% of ceiling, fwd+bwd %.0f%%, causal/non-causal time %.2f", static_cast<long long>(T),
                100 * f->gflops / ceiling, 100 * fb->gflops / ceiling, fc->seconds / f->seconds);
    if (rf) {
      std::printf(", reference/flash time %.1fx", rf->seconds / f->seconds);
      if (f->peak_mib >= kMemoryResolutionMiB && rf->peak_mib >= kMemoryResolutionMiB)
        std::printf(", memory %.1fx", rf->peak_mib / f->peak_mib);
      else
        std::printf(", memory: below the %.0f MiB that VmHWM resolves", kMemoryResolutionMiB);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* b = app.add_subcommand("bench", "Benchmarks that print figures: attention kernels, model training, decoding, low-precision products");
  b->require_subcommand(1);
  CLI::App* c = b->add_subcommand("attention", "Flash vs reference attention vs the machine's SGEMM ceiling");
  c->add_option("--seq", o->seq, "Sequence lengths T")->delimiter(',')->transform(whole(1, 1 << 24));
  c->add_option("--batch", o->batch, "Batch size B")->transform(whole(1, 1 << 20));
  c->add_option("--heads", o->heads, "Heads H")->transform(whole(1, 1 << 16));
  c->add_option("--dim", o->dim, "Head dimension D")->transform(whole(1, 1 << 16));
  c->add_option("--ref-max-t", o->ref_max_t, "Largest T at which to run the (slow) float64 reference")->transform(whole(0));
  c->add_option("--gemm-n", o->gemm_n, "Size of the square SGEMM that measures the ceiling")->transform(whole(1, 1 << 16));
  c->add_option("--reps", o->reps, "Repetitions (best time is reported)")->transform(whole(1, 1000000));
  c->add_option("--min-time", o->min_time, "Keep repeating each flash case for at least this many seconds")
      ->transform(finite(0, 1e6));
  c->add_flag("--json", o->json, "Print JSON instead of a table");
  Runner train = add_bench_train(*b);
  Runner decode = add_bench_decode(*b);
  Runner gemv = add_bench_gemv(*b);
  CLI::App* dc = b->get_subcommand("decode");
  CLI::App* gc = b->get_subcommand("gemv");
  return [o, c, train, decode, dc, gemv, gc] {
    return c->parsed() ? run_bench(*o) : dc->parsed() ? decode() : gc->parsed() ? gemv() : train();
  };
}

}  // namespace qkv::cli
