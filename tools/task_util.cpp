#include "task_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <limits>
#include <unordered_set>

#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/gguf.h"
#include "qkv/npy.h"

namespace qkv::cli {

Progress::Progress(double every_s)
    : tty_(isatty(fileno(stderr)) != 0), every_s_(every_s), t0_(std::chrono::steady_clock::now()) {}

void Progress::update(double fraction, const std::string& status) {
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (!tty_ && el - last_ < every_s_) return;
  last_ = el;
  std::string eta = "?";
  // eta <- time so far * left / done in this session
  const double done = fraction - start_fraction_;
  if (done > 0.001 && fraction <= 1) eta = fmt_duration(el * (1 - fraction) / done);
  const int width = 24, filled = fraction < 0 ? 0 : static_cast<int>(std::lround(fraction * width));
  std::string line = "[";
  line.append(static_cast<size_t>(filled), '#').append(static_cast<size_t>(width - filled), '.').append("] ");
  char pct[16];
  std::snprintf(pct, sizeof pct, fraction < 0 ? "  ?%%" : "%3.0f%%", fraction * 100);
  line.append(pct).append(" ").append(status).append(" | ").append(fmt_duration(el)).append(" ETA ").append(eta);
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
    drawn_ = true;
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

const char* const kDtypeHelp =
    "Weight type of the projection matrices: f32, bf16, f16, int8 (GGUF's Q8_0) or q4 (Q4_0), packed as they load "
    "(default: as stored: float32, or what qkv quantize packed); the output layer and token embeddings at 8 bits or "
    "more, norms float32 (docs/formats.md)";

void pack_for_dtype(Model& m, const std::string& dtype) {
  const std::optional<WType> t = dtype_of(dtype);
  if (!t) return;
  std::vector<std::string> fallback;
  m.pack_weights(*t, &fallback);
  note_dtype_fallback(fallback, dtype);
}

}  // namespace qkv::cli
