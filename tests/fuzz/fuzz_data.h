// Properties of the data readers' records (the rules are in qkv/data.h), shared by their targets.
#pragma once
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "qkv/data.h"

namespace qkv::fuzz {

inline constexpr const char* kSpace = " \t\r\n\v\f";

// A TSV field: non-empty, trimmed, one line, no TAB, valid UTF-8 without NUL.
inline void check_field(const std::string& f, const char* what) {
  if (f.empty()) finding(std::string("empty ") + what + " returned");
  if (std::string(kSpace).find(f.front()) != std::string::npos ||
      std::string(kSpace).find(f.back()) != std::string::npos)
    finding(std::string(what) + " not trimmed: \"" + f + "\"");
  if (f.find('\t') != std::string::npos || f.find('\n') != std::string::npos)
    finding(std::string(what) + " holds a TAB or a newline");
  if (!utf8_problem(f).empty()) finding(std::string(what) + " returned although " + utf8_problem(f));
}

inline void check_report(const ReadReport& r, size_t records) {
  if (r.used != static_cast<int64_t>(records)) finding("report.used differs from the records returned");
  if (r.used < 1 || r.malformed < 0 || r.used + r.malformed > r.lines) finding("report counts do not add up");
  if ((r.malformed == 0) != (r.first_malformed_line == 0)) finding("report.first_malformed_line inconsistent");
  if (r.first_malformed_line < 0 || r.first_malformed_line > r.lines)
    finding("report.first_malformed_line out of range");
}

}  // namespace qkv::fuzz
