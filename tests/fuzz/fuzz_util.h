// Shared by the fuzz targets (one per reader of untrusted bytes, LLVMFuzzerTestOneInput each).
//
// The contract every target checks: for any input, the reader either returns a value or throws
// qkv::Error. Anything else is a finding that libFuzzer reports and saves: a crash, a sanitizer
// report, another exception type (uncaught, so std::terminate), a hang (-timeout), an
// allocation over -malloc_limit_mb, or a broken property (finding() below).
#pragma once
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "qkv/error.h"

namespace qkv::fuzz {

inline std::string bytes(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A property the reader promises does not hold: libFuzzer saves the input as a crash.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Runs f(); qkv::Error is the expected outcome for bad input. Returns whether f returned.
template <class F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (const qkv::Error&) {
    return false;
  }
}

// Whether `text` parses as JSON with a key repeated in some object (a reader that accepts such
// text has silently dropped all but one of the values).
inline bool json_repeats_a_key(const std::string& text) {
  std::vector<std::set<std::string>> open;
  bool repeated = false;
  const nlohmann::json::parser_callback_t cb = [&](int, nlohmann::json::parse_event_t e, nlohmann::json& v) {
    if (e == nlohmann::json::parse_event_t::object_start) open.emplace_back();
    if (e == nlohmann::json::parse_event_t::object_end) open.pop_back();
    if (e == nlohmann::json::parse_event_t::key && !open.back().insert(v.get<std::string>()).second) repeated = true;
    return true;
  };
  try {
    static_cast<void>(nlohmann::json::parse(text, cb));
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return repeated;
}

// One scratch directory per process ($TMPDIR or /tmp), removed at exit, for readers that take
// a path rather than bytes.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/qkv-fuzz-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) finding("cannot create a scratch directory under $TMPDIR");
    static std::string keep;
    keep = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return tmpl;
  }();
  return dir;
}

// scratch_dir()/name <- bytes; returns the path.
inline std::string put_file(const std::string& name, const std::string& contents) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  f.close();
  if (!f) finding("cannot write the scratch file " + path);
  return path;
}

}  // namespace qkv::fuzz
