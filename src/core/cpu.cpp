#include "qkv/cpu.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "qkv/error.h"

namespace qkv {

bool cpu_supports(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::Generic: return true;
    case Isa::AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::AVX512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  return false;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Generic: return "generic";
    case Isa::AVX2: return "avx2";
    case Isa::AVX512: return "avx512";
  }
  return "?";
}

static Isa detect() {
  Isa best = cpu_supports(Isa::AVX512) ? Isa::AVX512 : cpu_supports(Isa::AVX2) ? Isa::AVX2 : Isa::Generic;
  const char* env = std::getenv("QKV_ISA");
  if (!env || !*env) return best;
  std::string want = env;
  for (Isa isa : {Isa::Generic, Isa::AVX2, Isa::AVX512}) {
    if (want == isa_name(isa)) {
      check(cpu_supports(isa), "QKV_ISA=", want, ": this CPU does not support it (best available: ",
            isa_name(best), ")");
      return isa;
    }
  }
  throw Error("QKV_ISA='" + want + "': expected generic, avx2 or avx512");
}

Isa active_isa() {
  static const Isa isa = detect();
  return isa;
}

std::string cpu_description() {
  std::string model = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(colon + 2);
      break;
    }
  }
  std::string feats;
  for (Isa isa : {Isa::AVX2, Isa::AVX512})
    if (cpu_supports(isa)) feats += std::string(feats.empty() ? "" : ", ") + isa_name(isa);
  return model + " (" + (feats.empty() ? "no avx2" : feats) + ")";
}

double available_memory_bytes(std::string* source) {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) {
      if (source) *source = "MemAvailable in /proc/meminfo";
      return static_cast<double>(kb) * 1024.0;
    }
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    if (source) *source = "free physical pages";
    return static_cast<double>(pages) * static_cast<double>(page);
  }
  return -1;
}

}  // namespace qkv
