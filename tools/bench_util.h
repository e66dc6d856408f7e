// Shared by the benchmarks: this machine's SGEMM ceiling and the process's memory from /proc.
#pragma once
#include <cstdint>
#include <string>

#include "qkv/model.h"

namespace qkv::cli {

// GFLOP/s of the best of `reps` (and at least one second of) n x n x n SGEMMs after a warm-up:
// the machine's own ceiling, measured in the same run as what it is compared with.
double gemm_ceiling(int64_t n, int reps);

// The same, with its slowest run too: when the runs disagree (the slowest under 3/4 of the best),
// something else was using the machine, and ratios against the ceiling mean little.
struct Ceiling {
  double gflops = 0, slowest_gflops = 0;
  // a warning line for stderr, or "" when the runs agree
  std::string warning() const;
};
Ceiling measure_gemm_ceiling(int64_t n, int reps);

// A field of /proc/self/status in kB ("VmHWM": peak resident memory, "VmRSS": current), or -1.
int64_t proc_status_kb(const char* key);

// The benchmark models: "gpt2-small" (GPT-2 small's shape) or "transformer-base" (the 2017 base
// encoder-decoder). Defined in cmd_bench_train.cpp.
ModelConfig bench_preset(const std::string& name);

// Read bandwidth in GB/s: the best of `reps` passes summing a `mib` MiB array with every thread
// (measured in the same run as what it bounds).
double read_bandwidth_gbs(int64_t mib, int reps);

}  // namespace qkv::cli
