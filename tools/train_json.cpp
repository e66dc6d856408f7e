// train.json, read back by `qkv train --resume` (the rules are in train_json.h).
#include "train_json.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "qkv/error.h"

namespace qkv::cli {
namespace {

using json = nlohmann::json;

// A value for a message: scalars as written, containers by kind.
std::string show(const json& v) { return v.is_structured() ? std::string("a JSON ") + v.type_name() : v.dump(); }

void get_string(const json& j, const char* key, const std::string& path, std::string& out,
                std::initializer_list<const char*> allowed = {}) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  check(it->is_string(), path, ": \"", key, "\" is ", show(*it), " (expected a string)");
  const std::string s = it->get<std::string>();
  if (allowed.size() > 0) {
    std::string list;
    for (const char* a : allowed) {
      if (s == a) {
        out = s;
        return;
      }
      list += list.empty() ? "" : ", ";
      list += a;
    }
    fail(path, ": \"", key, "\" is ", it->dump(), " (expected one of ", list, ")");
  }
  out = s;
}

// 0 (the preset's default) or an integer in [lo, hi].
void get_int(const json& j, const char* key, int64_t lo, int64_t hi, const std::string& path, int64_t& out) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  const bool integer = it->is_number_integer() &&
                       (it->is_number_unsigned() ? it->get<uint64_t>() <= uint64_t(hi) : it->get<int64_t>() >= 0);
  const int64_t v = integer ? it->get<int64_t>() : -1;
  check(integer && (v == 0 || (v >= lo && v <= hi)), path, ": \"", key, "\" is ", show(*it),
        " (expected 0 or an integer from ", lo, " to ", hi, ")");
  out = v;
}

void get_fraction(const json& j, const char* key, const std::string& path, double& out) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  const double v = it->is_number() ? it->get<double>() : -1;
  check(it->is_number() && v >= 0 && v <= 0.5, path, ": \"", key, "\" is ", show(*it),
        " (expected a number from 0 to 0.5)");
  out = v;
}

}  // namespace

void read_train_json(const std::string& text, const std::string& path, RunOptions& o) {
  // nlohmann::json stops at a NUL byte as if the text ended there; JSON never holds one.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    fail(path, ": not valid JSON: NUL byte at offset ", nul);
  // nlohmann::json keeps the last of a repeated key silently: refuse it instead.
  std::vector<std::set<std::string>> open;  // keys seen so far in each object being parsed
  const json::parser_callback_t on_event = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open.emplace_back();
    if (event == json::parse_event_t::object_end) open.pop_back();
    if (event == json::parse_event_t::key && !open.back().insert(parsed.get<std::string>()).second)
      fail(path, ": key ", parsed.dump(), " appears twice");
    return true;
  };
  json j;
  try {
    j = json::parse(text, on_event);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  check(j.is_object(), path, ": is ", show(j), " (expected a JSON object of qkv train options)");
  RunOptions r = o;
  get_string(j, "task", path, r.task, {"translate", "lm", "classify"});
  get_string(j, "data", path, r.data);
  get_string(j, "source", path, r.source);
  get_string(j, "target", path, r.target);
  get_string(j, "preset", path, r.preset, {"tiny", "small", "base"});
  get_int(j, "max_tokens", 1, int64_t{1} << 24, path, r.max_tokens);
  get_int(j, "max_len", 2, int64_t{1} << 20, path, r.max_len);
  get_int(j, "eval_every", 1, int64_t{1} << 30, path, r.eval_every);
  get_fraction(j, "valid_fraction", path, r.valid_fraction);
  get_fraction(j, "test_fraction", path, r.test_fraction);
  if (const auto it = j.find("seed"); it != j.end()) {
    check(it->is_number_unsigned(), path, ": \"seed\" is ", show(*it), " (expected an integer from 0 to 2^64-1)");
    r.seed = it->get<uint64_t>();
  }
  o = r;
}

}  // namespace qkv::cli
