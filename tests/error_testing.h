// Shared by the tests: run something that should throw qkv::Error and get its message.
#pragma once
#include <exception>
#include <string>

#include "qkv/error.h"

namespace qkv::testing {

// Runs `f`, expects a qkv::Error, and returns its message (or says what happened instead).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const qkv::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("unexpected exception type: ") + e.what();
  }
  return "no exception";
}

}  // namespace qkv::testing
