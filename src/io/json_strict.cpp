#include "io/json_strict.h"

#include <set>
#include <vector>

#include "qkv/error.h"

namespace qkv::detail {

nlohmann::json parse_json_object(const std::string& text, const std::string& file) {
  using Json = nlohmann::json;
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    fail(file, ": not valid JSON: NUL byte at offset ", nul);
  std::vector<std::set<std::string>> seen;  // keys seen so far in each object being parsed
  const Json::parser_callback_t on_event = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) seen.emplace_back();
    if (event == Json::parse_event_t::object_end) seen.pop_back();
    if (event == Json::parse_event_t::key && !seen.back().insert(parsed.get<std::string>()).second)
      fail(file, ": duplicate key \"", parsed.get<std::string>(), "\"");
    return true;
  };
  Json j;
  try {
    j = Json::parse(text, on_event);
  } catch (const Json::exception& e) {
    fail(file, ": not valid JSON: ", e.what());
  }
  if (!j.is_object()) fail(file, ": expected a JSON object, found ", j.type_name());
  return j;
}

}  // namespace qkv::detail
