#include "qkv/parallel.h"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "qkv/error.h"

namespace qkv {
namespace {

int default_threads() {
  if (const char* env = std::getenv("QKV_NUM_THREADS"); env && *env) {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    check(end && *end == '\0' && n >= 1 && n <= 4096, "QKV_NUM_THREADS='", env,
          "': expected a whole number of threads between 1 and 4096");
    return static_cast<int>(n);
  }
  return omp_get_num_procs();
}

std::atomic<int> g_threads{0};

}  // namespace

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    n = default_threads();
    g_threads.store(n, std::memory_order_relaxed);
    // OpenBLAS's OpenMP build follows omp_get_max_threads(); keep it in step with ours.
    omp_set_num_threads(n);
  }
  return n;
}

void set_num_threads(int n) {
  if (n <= 0) n = default_threads();
  g_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
}

}  // namespace qkv
