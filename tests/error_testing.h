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

// True when `needle` occurs in `haystack`.
inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace qkv::testing

// Expects `needle` in `haystack` and prints both when it is not there.
#define EXPECT_CONTAINS(haystack, needle)                                          \
  EXPECT_TRUE(::qkv::testing::contains(haystack, needle))                          \
      << "expected \"" << (needle) << "\" in: " << (haystack)
