// Shared by the benchmarks: this machine's SGEMM ceiling and the process's memory from /proc.
#pragma once
#include <cstdint>

namespace qkv::cli {

// GFLOP/s of the best of `reps` (and at least one second of) n x n x n SGEMMs after a warm-up:
// the machine's own ceiling, measured in the same run as what it is compared with.
double gemm_ceiling(int64_t n, int reps);

// A field of /proc/self/status in kB ("VmHWM": peak resident memory, "VmRSS": current), or -1.
int64_t proc_status_kb(const char* key);

}  // namespace qkv::cli
