// JSON read from a file, strictly: valid JSON (no NUL bytes), a top-level object, and every key
// once in each object (nlohmann would silently keep the last of two). Errors name the file.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace qkv::detail {

nlohmann::json parse_json_object(const std::string& text, const std::string& file);

}  // namespace qkv::detail
