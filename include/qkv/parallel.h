// qkv/parallel.h: the one thread pool (OpenMP) that every kernel uses.
#pragma once
#include <cstdint>

namespace qkv {

// Threads used by kernels. Default: QKV_NUM_THREADS if set, else all cores.
int num_threads();
// n <= 0 restores the default.
void set_num_threads(int n);

}  // namespace qkv
