#pragma once
#include <string>

namespace qkv {

// "OPENBLAS_CORETYPE=..." when OpenBLAS picked kernel `corename` although the CPU supports
// AVX2 / AVX-512 (Debian's 0.3.21 does this on CPUs it does not recognise); "" otherwise.
std::string blas_fallback_advice(const std::string& corename, bool cpu_avx2, bool cpu_avx512);

}  // namespace qkv
