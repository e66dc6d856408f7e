#include "io/json_strict.h"

#include <set>
#include <vector>

#include "qkv/error.h"

namespace qkv::detail {

namespace {

using Json = nlohmann::json;

Json parse_or_fail(const std::string& text, const std::string& file, const Json::parser_callback_t& on_event) {
  try {
    return Json::parse(text, on_event);
  } catch (const Json::exception& e) {
    fail(file, ": not valid JSON: ", e.what());
  }
}

// The slow pass that names a duplicate key: the keys of each open object in a set.
[[noreturn]] void fail_duplicate(const std::string& text, const std::string& file) {
  std::vector<std::set<std::string>> seen;
  parse_or_fail(text, file, [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) seen.emplace_back();
    if (event == Json::parse_event_t::object_end) seen.pop_back();
    if (event == Json::parse_event_t::key && !seen.back().insert(parsed.get<std::string>()).second)
      fail(file, ": duplicate key \"", parsed.get<std::string>(), "\"");
    return true;
  });
  fail(file, ": duplicate key");  // not reached: the first pass found one
}

}  // namespace

nlohmann::json parse_json_object(const std::string& text, const std::string& file) {
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    fail(file, ": not valid JSON: NUL byte at offset ", nul);
  // A repeated key overwrites the first, so an object holding fewer members than keys were read
  // for it had a duplicate; only then is the file read again to name it.
  std::vector<size_t> keys;  // keys read so far in each open object
  bool duplicate = false;
  const Json j = parse_or_fail(text, file, [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.push_back(0);
    if (event == Json::parse_event_t::key) ++keys.back();
    if (event == Json::parse_event_t::object_end) {
      duplicate = duplicate || parsed.size() != keys.back();
      keys.pop_back();
    }
    return true;
  });
  if (duplicate) fail_duplicate(text, file);
  if (!j.is_object()) fail(file, ": expected a JSON object, found ", j.type_name());
  return j;
}

}  // namespace qkv::detail
