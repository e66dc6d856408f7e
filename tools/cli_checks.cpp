#include "qkv/gguf.h"
#include "cli_checks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include <filesystem>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

namespace qkv::cli {
namespace {

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// "in [0, 0.9]", "> 0", ">= 1", "" (no bound), for the help text and the error message.
std::string float_range(double lo, double hi, bool lo_open, bool hi_open) {
  const bool has_lo = lo > -kMaxDouble, has_hi = hi < kMaxDouble;
  if (has_lo && has_hi)
    return std::string("in ") + (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]");
  if (has_lo) return (lo_open ? "> " : ">= ") + num(lo);
  if (has_hi) return (hi_open ? "< " : "<= ") + num(hi);
  return "";
}

template <class T>
std::string int_range(T lo, T hi) {
  const bool has_lo = lo > std::numeric_limits<T>::min(), has_hi = hi < std::numeric_limits<T>::max();
  if (has_hi || !std::numeric_limits<T>::is_signed) return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (has_lo) return ">= " + std::to_string(lo);
  return "";
}

std::string expected(const char* what, const std::string& range) {
  return std::string("; expected ") + what + (range.empty() ? "" : " ") + range;
}

// Decimal digits with an optional sign ('-' only where T is signed), all of the text; or a
// number such as 1e3 that is whole and exactly a double.
template <class T>
std::string parse_whole(std::string& text, T lo, T hi) {
  const std::string want = expected("a whole number", int_range(lo, hi));
  const char* b = text.data();
  const char* e = b + text.size();
  if (b != e && *b == '+') ++b;
  T v{};
  const auto [end, ec] = std::from_chars(b, e, v, 10);
  if (ec == std::errc::result_out_of_range) return "'" + text + "' is out of range" + want;
  if (ec != std::errc() || end != e || b == e) {
    // "1e3": a whole number in other words (taken while a double holds it exactly); "1.5": not
    // whole; "-1" for an unsigned value: out of range
    double d = 0;
    const auto [dend, dec] = std::from_chars(b, e, d);
    if (dec != std::errc() || dend != e || b == e) return "'" + text + "' is not a number" + want;
    if (!std::isfinite(d) || d != std::floor(d)) return "'" + text + "' is not a whole number" + want;
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi) || std::fabs(d) > 0x1p53)
      return "'" + text + "' is out of range" + want;
    v = static_cast<T>(d);
  }
  if (v < lo || v > hi) return "'" + text + "' is out of range" + want;
  text = std::to_string(v);  // what CLI11's strtoll/strtoull (base 0) reads back as v
  return "";
}

}  // namespace

CLI::Validator finite(double lo, double hi, const char* bounds) {
  const std::string kind = bounds;
  const bool lo_open = kind == "(]" || kind == "()", hi_open = kind == "[)" || kind == "()";
  const std::string range = float_range(lo, hi, lo_open, hi_open);
  return CLI::Validator(
      [lo, hi, lo_open, hi_open, range](std::string& text) -> std::string {
        const std::string want = expected("a finite number", range);
        const char* b = text.data();
        const char* e = b + text.size();
        if (b != e && *b == '+') ++b;
        double v = 0;
        const auto [end, ec] = std::from_chars(b, e, v);
        if (ec == std::errc::result_out_of_range) return "'" + text + "' is beyond the range of a double" + want;
        if (ec != std::errc() || end != e || b == e) return "'" + text + "' is not a number" + want;
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number" + want;
        if (v < lo || v > hi || (lo_open && v == lo) || (hi_open && v == hi))
          return "'" + text + "' is out of range" + want;
        // hexadecimal: exact, so CLI11's strtold reads back this very double
        char buf[64];
        std::snprintf(buf, sizeof buf, "%a", v);
        text = buf;
        return "";
      },
      range.empty() ? "finite" : range);
}

CLI::Validator whole(int64_t lo, int64_t hi) {
  return CLI::Validator([lo, hi](std::string& text) { return parse_whole<int64_t>(text, lo, hi); }, int_range(lo, hi));
}

CLI::Validator seed_number() {
  return CLI::Validator(
      [](std::string& text) {
        return parse_whole<uint64_t>(text, 0, std::numeric_limits<uint64_t>::max());
      },
      "in [0, 2^64 - 1]");
}

CLI::Validator preset_or_model_dir(std::vector<std::string> presets) {
  std::string names;
  for (const auto& p : presets) names += (names.empty() ? "" : ", ") + p;
  return CLI::Validator(
      [presets, names](std::string& v) -> std::string {
        for (const auto& p : presets)
          if (v == p) return "";
        std::error_code ec;
        if (std::filesystem::is_directory(v, ec) && std::filesystem::exists(v + "/config.json", ec)) return "";
        if (qkv::is_gguf_file(v)) return "";
        return "'" + v + "' is neither a preset (" + names + ") nor a model (a directory with config.json, or a GGUF file)";
      },
      "PRESET|DIR|FILE.gguf");
}

}  // namespace qkv::cli

namespace qkv::cli {
namespace {
int saved_stderr = -1;
}
void silence_output() {
  std::fflush(stdout);
  std::fflush(stderr);
  const int null = ::open("/dev/null", O_WRONLY);
  if (null < 0) return;
  saved_stderr = ::dup(2);
  ::dup2(null, 1);
  ::dup2(null, 2);
  ::close(null);
}
void restore_error_output() {
  if (saved_stderr < 0) return;
  std::fflush(stderr);
  ::dup2(saved_stderr, 2);
}
}  // namespace qkv::cli
