// qkv/cpu.h: which SIMD instruction set the kernels use, chosen once at run time.
#pragma once
#include <string>

namespace qkv {

enum class Isa { Generic, AVX2, AVX512 };

// The best ISA this CPU supports, lowered by QKV_ISA=generic|avx2|avx512 if set (a request
// for an ISA the CPU lacks is an error).
Isa active_isa();
const char* isa_name(Isa isa);
bool cpu_supports(Isa isa);
// "AMD EPYC ... (avx2, fma)": for benchmark reports.
std::string cpu_description();

// Memory this process may still take, in bytes: MemAvailable from /proc/meminfo (what can be
// allocated without swapping), else the free physical pages; -1 when neither can be read.
// `source`, when given, receives where the figure came from.
double available_memory_bytes(std::string* source = nullptr);

}  // namespace qkv
