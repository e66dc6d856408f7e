// Requests and errors, as every route of the server reads and answers them: OpenAI's error JSON
// (HttpError, reply_error), the validator of a request's JSON fields (Fields), and the helpers
// that write JSON bodies.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/http_server.h"

namespace qkv::serve {

using Json = nlohmann::json;
namespace http = qkv::http;

// ---------------------------------------------------------------------------------------------
// Errors as OpenAI writes them

struct HttpError {
  int status;
  std::string message, type, param;
  std::string code = "";  // OpenAI's error code ("model_not_found"), or none
};

// A 400 naming the request's field `param` ("" for the body as a whole).
[[noreturn]] void bad(const std::string& param, const std::string& message);

// Never throws: text from the request (a path, a field name) may hold any bytes, and invalid
// UTF-8 is replaced by U+FFFD rather than failing the reply.
void reply_error(http::Response& res, const HttpError& e);

// What the transport answers by itself, in OpenAI's words.
void transport_error(http::Response& res, int status, const std::string& message);

// The double whose shortest decimal form is the float's own (0.1f -> 0.1, not 0.10000000149011612):
// JSON that says what float32 computed, in as few digits as that takes.
double short_float(float x);

// A reply's JSON, invalid UTF-8 replaced by U+FFFD.
std::string dump(const Json& j);

// A JSON body must be UTF-8 (RFC 8259): say so, and where, before the parser does.
void check_utf8_body(const std::string& body);

// A request's JSON object, read field by field; a field nobody read is an error (a typo, or an
// option qkv does not have), as is a wrong type or a value out of range. Each names the field.
class Fields {
 public:
  explicit Fields(const std::string& body);
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const Json* get(const char* k);
  int64_t integer(const char* k, int64_t lo, int64_t hi, int64_t fallback);
  double number(const char* k, double lo, double hi, double fallback);
  bool boolean(const char* k, bool fallback);
  // A string, or a list of strings (1 .. most, each non-empty when `nonempty`).
  std::vector<std::string> strings(const char* k, size_t most, bool required, bool nonempty);
  // A list of whole numbers in [lo, hi], each once (absent: empty).
  std::vector<int64_t> integers(const char* k, int64_t lo, int64_t hi);
  void done() const;

 private:
  Json j_;
  std::set<std::string> seen_;
};

}  // namespace qkv::serve
