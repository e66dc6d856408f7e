#include "kernels/positional.h"

#include <cmath>

namespace qkv::kernels {

void sinusoidal_positions(float* out, int64_t T, int64_t D, int64_t pos_offset, SinusoidalLayout layout) {
  // out: (T, D)
  if (layout == SinusoidalLayout::SplitHalf) {
    const int64_t h = (D + 1) / 2;
    for (int64_t t = 0; t < T; ++t) {
      const double pos = static_cast<double>(pos_offset + t);
      float* row = out + t * D;
      for (int64_t i = 0; i < h; ++i) {
        // angle <- pos / 10000^(2i / D);  row_i <- sin(angle);  row_{h+i} <- cos(angle)
        const double angle = pos / std::pow(10000.0, static_cast<double>(2 * i) / static_cast<double>(D));
        row[i] = static_cast<float>(std::sin(angle));
        if (h + i < D) row[h + i] = static_cast<float>(std::cos(angle));
      }
    }
    return;
  }
  for (int64_t t = 0; t < T; ++t) {
    const double pos = static_cast<double>(pos_offset + t);
    float* row = out + t * D;
    for (int64_t j = 0; j < D; j += 2) {
      // angle <- pos / 10000^(j / D)   (j = 2i);  row_j <- sin(angle);  row_{j+1} <- cos(angle)
      const double angle = pos / std::pow(10000.0, static_cast<double>(j) / static_cast<double>(D));
      row[j] = static_cast<float>(std::sin(angle));
      if (j + 1 < D) row[j + 1] = static_cast<float>(std::cos(angle));
    }
  }
}

}  // namespace qkv::kernels
