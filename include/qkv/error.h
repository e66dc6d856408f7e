// qkv/error.h: the one exception type the library throws. Library code never prints or exits;
// it throws qkv::Error with a message that names the input, its shape and what was expected.
#pragma once
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace qkv {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// "(2, 8, 17, 64)"
std::string shape_str(const std::vector<int64_t>& shape);

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throws qkv::Error(concat(args...)).
template <class... Args>
[[noreturn]] inline void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

// Throws qkv::Error(concat(args...)) when `ok` is false.
template <class... Args>
inline void check(bool ok, const Args&... args) {
  if (!ok) throw Error(detail::concat(args...));
}

}  // namespace qkv
