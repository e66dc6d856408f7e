// qkv tour's text: the chapter's worked example and claims, which the library computes (viz/tour.h,
// shared with the explorer page's /v1/attend and /v1/claims), printed for a terminal.
#pragma once
#include <ostream>

#include <nlohmann/json.hpp>

#include "viz/tour.h"

namespace qkv::cli {

using tour::attend_steps;
using tour::chapter_claims;
using tour::ExampleInput;
using tour::fmt;

// Both, as text.
void print_steps(std::ostream& os, const nlohmann::json& steps);
void print_claims(std::ostream& os, const nlohmann::json& claims);

}  // namespace qkv::cli
