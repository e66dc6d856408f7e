// The one place where the command line checks the numbers it is given. Every numeric option of
// every subcommand uses one of these instead of CLI11's Range / PositiveNumber, which let NaN
// through (every comparison with NaN is false), print DBL_MAX in full, call a word "not in
// range", and hand the text to strtoull / strtold afterwards: "-1" became 2^64 - 1, "010" was 8,
// a literal beyond 64 bits saturated. These parse the text themselves (decimal only), refuse
// what does not fit, and pass CLI11 the number rewritten in a form its conversion reads back
// exactly. Attach them with ->transform(...): ->check(...) would discard the rewritten text.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>

namespace qkv::cli {

constexpr double kMaxDouble = std::numeric_limits<double>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

// A finite number x in [lo, hi]; `bounds` "(]", "[)" or "()" leaves out lo, hi or both. NaN,
// infinity and literals that overflow a double are refused whatever the range.
CLI::Validator finite(double lo = -kMaxDouble, double hi = kMaxDouble, const char* bounds = "[]");

// A whole number in [lo, hi], written in decimal: no wrapping, no saturation, no octal or hex.
CLI::Validator whole(int64_t lo = std::numeric_limits<int64_t>::min(), int64_t hi = kMaxInt64);

// A seed: a whole number in [0, 2^64 - 1] (a minus sign is refused, not wrapped).
CLI::Validator seed_number();
// One of `presets`, or a model directory (qkv's or a Hugging Face folder: a directory with config.json).
CLI::Validator preset_or_model_dir(std::vector<std::string> presets);

}  // namespace qkv::cli

namespace qkv::cli {
// Ranks other than 0 under mpirun: standard output and error go to /dev/null (rank 0 reports);
// restore_error_output() brings standard error back, for an error that ends the process.
void silence_output();
void restore_error_output();
}  // namespace qkv::cli
