// train.json, read back by `qkv train --resume` (the rules are in train_json.h).
#include "train/train_json.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/json_strict.h"
#include "qkv/error.h"

namespace qkv {
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
  // One JSON object, no NUL byte (nlohmann would stop there), every key once (it would keep the last).
  const json j = detail::parse_json_object(text, path);
  RunOptions r = o;
  get_string(j, "task", path, r.task, {"translate", "lm", "classify"});
  get_string(j, "data", path, r.data);
  get_string(j, "source", path, r.source);
  get_string(j, "train_only", path, r.train_only);
  get_string(j, "target", path, r.target);
  get_string(j, "preset", path, r.preset, {"tiny", "small", "base"});
  get_int(j, "max_tokens", 1, int64_t{1} << 24, path, r.max_tokens);
  get_int(j, "max_len", 2, int64_t{1} << 20, path, r.max_len);
  get_int(j, "eval_every", 1, int64_t{1} << 30, path, r.eval_every);
  get_int(j, "average", 1, 1000, path, r.average);
  get_string(j, "init", path, r.init_recorded);
  get_int(j, "tokenizer_vocab", 1, (int64_t{1} << 31) - 1, path, r.tokenizer_vocab);
  get_fraction(j, "valid_fraction", path, r.valid_fraction);
  get_fraction(j, "test_fraction", path, r.test_fraction);
  if (const auto it = j.find("train_only_ratio"); it != j.end()) {
    const double v = it->is_number() ? it->get<double>() : -1;
    check(it->is_number() && (v == 0 || (v >= 0.001 && v <= 1000)), path, ": \"train_only_ratio\" is ", show(*it),
          " (expected 0 or a number from 0.001 to 1000)");
    r.train_only_ratio = v;
  }
  if (const auto it = j.find("subword_alpha"); it != j.end()) {
    const double v = it->is_number() ? it->get<double>() : -1;
    check(it->is_number() && v >= 0 && v <= 1, path, ": \"subword_alpha\" is ", show(*it),
          " (expected 0 or a number in (0, 1])");
    r.subword_alpha = v;
  }
  if (const auto it = j.find("seed"); it != j.end()) {
    check(it->is_number_unsigned(), path, ": \"seed\" is ", show(*it), " (expected an integer from 0 to 2^64-1)");
    r.seed = it->get<uint64_t>();
  }
  if (const auto it = j.find("data_files"); it != j.end()) {
    check(it->is_array(), path, ": \"data_files\" is ", show(*it), " (expected an array)");
    r.data_files.clear();
    for (const json& f : *it) {
      const bool ok = f.is_object() && f.size() == 3 && f.contains("path") && f["path"].is_string() &&
                      f.contains("bytes") && f["bytes"].is_number_unsigned() && f.contains("fnv1a64") &&
                      f["fnv1a64"].is_string() && f["fnv1a64"].get<std::string>().size() == 16 &&
                      f["fnv1a64"].get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos;
      check(ok, path, ": a \"data_files\" entry is ", show(f),
            " (expected {\"path\": string, \"bytes\": integer, \"fnv1a64\": 16 hex digits})");
      r.data_files.push_back({f["path"].get<std::string>(), f["bytes"].get<uint64_t>(), f["fnv1a64"].get<std::string>()});
    }
    r.data_files_given = true;
  }
  o = r;
}

}  // namespace qkv
