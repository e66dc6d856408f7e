// Requests and errors (serve/request.h): OpenAI's error JSON and the validator of a request's fields.
#include "serve/request.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "qkv/data.h"
#include "qkv/error.h"

namespace qkv::serve {

void bad(const std::string& param, const std::string& message) {
  throw HttpError{400, message, "invalid_request_error", param};
}

void reply_error(http::Response& res, const HttpError& e) {
  res.status = e.status;
  res.stream = nullptr;
  const Json j = {{"error",
                   {{"message", e.message},
                    {"type", e.type},
                    {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
                    {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}}}};
  res.content_type = "application/json";
  res.body = j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void transport_error(http::Response& res, int status, const std::string& message) {
  const char* type = status == 404 ? "not_found" : status >= 500 ? "server_error" : "invalid_request_error";
  reply_error(res, {status, message, type, ""});
}

double short_float(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void check_utf8_body(const std::string& body) {
  if (const std::string why = utf8_problem(body); !why.empty()) bad("", "the body is not valid UTF-8: " + why);
}

Fields::Fields(const std::string& body) {
  check_utf8_body(body);
  try {
    j_ = Json::parse(body);
  } catch (const Json::exception& e) {
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j_.is_object()) bad("", std::string("the body is JSON ") + j_.type_name() + "; expected an object");
}

const Json* Fields::get(const char* k) {
  seen_.insert(k);
  return has(k) ? &j_[k] : nullptr;
}

int64_t Fields::integer(const char* k, int64_t lo, int64_t hi, int64_t fallback) {
  const Json* v = get(k);
  if (!v) return fallback;
  const auto out_of_range = [&] {
    bad(k, detail::concat("'", k, "' is ", v->dump(), "; expected a whole number in [", lo, ", ", hi, "]"));
  };
  if (!v->is_number_integer()) out_of_range();
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) out_of_range();
  const int64_t x = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
  if (x < lo || x > hi) out_of_range();
  return x;
}

double Fields::number(const char* k, double lo, double hi, double fallback) {
  const Json* v = get(k);
  if (!v) return fallback;
  if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo || v->get<double>() > hi)
    bad(k, detail::concat("'", k, "' is ", v->dump(), "; expected a number in [", lo, ", ", hi, "]"));
  return v->get<double>();
}

bool Fields::boolean(const char* k, bool fallback) {
  const Json* v = get(k);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(k, detail::concat("'", k, "' is ", v->dump(), "; expected true or false"));
  return v->get<bool>();
}

std::vector<std::string> Fields::strings(const char* k, size_t most, bool required, bool nonempty) {
  const Json* v = get(k);
  if (!v) {
    if (required) bad(k, detail::concat("'", k, "' is required"));
    return {};
  }
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array() && !v->empty() && v->size() <= most) {
    for (const Json& e : *v) {
      if (!e.is_string()) bad(k, detail::concat("'", k, "' holds ", e.type_name(), "; expected strings"));
      out.push_back(e.get<std::string>());
    }
  } else {
    bad(k, detail::concat("'", k, "' is ", v->type_name(), v->is_array() ? detail::concat(" of ", v->size()) : "",
                          "; expected a string or a list of 1 .. ", most, " strings"));
  }
  for (const std::string& s : out) {
    if (const std::string why = utf8_problem(s); !why.empty()) bad(k, detail::concat("'", k, "': ", why));
    if (nonempty && s.empty()) bad(k, detail::concat("'", k, "' holds an empty string"));
  }
  return out;
}

std::vector<int64_t> Fields::integers(const char* k, int64_t lo, int64_t hi) {
  const Json* v = get(k);
  if (!v) return {};
  if (!v->is_array() || v->empty())
    bad(k, detail::concat("'", k, "' is ", v->dump(), "; expected a non-empty list of whole numbers in [", lo, ", ",
                          hi, "]"));
  std::vector<int64_t> out;
  for (const Json& e : *v) {
    if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
        e.get<int64_t>() < lo || e.get<int64_t>() > hi)
      bad(k, detail::concat("'", k, "' holds ", e.dump(), "; expected whole numbers in [", lo, ", ", hi, "]"));
    if (std::find(out.begin(), out.end(), e.get<int64_t>()) != out.end())
      bad(k, detail::concat("'", k, "' holds ", e.dump(), " twice"));
    out.push_back(e.get<int64_t>());
  }
  return out;
}

void Fields::done() const {
  for (auto it = j_.begin(); it != j_.end(); ++it)
    if (!seen_.count(it.key())) bad(it.key(), detail::concat("unknown field '", it.key(), "'"));
}

}  // namespace qkv::serve
