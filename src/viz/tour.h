// The chapter's worked example and its claims, computed by the library on live numbers. One
// source for `qkv tour` (text in the terminal: tools/tour.h prints these) and the explorer page
// (JSON from the server's /v1/attend and /v1/claims), so the page and the terminal show the same
// computation. Internal: nlohmann::json is not part of the public API.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/model.h"

namespace qkv::tour {

// One query against n keys and values, as in the chapter: q (Dk), keys n x Dk, values n x Dv,
// allowed (n; false = masked), scale (default 1/sqrt(Dk)).
struct ExampleInput {
  std::vector<double> q;
  std::vector<std::vector<double>> keys, values;
  std::vector<bool> allowed;
  std::optional<double> scale;
  static ExampleInput chapter();  // q = [sqrt 2, 0], keys [1,0] [0,1] [1,1], values [10,0] [0,10] [4,6]
};

// Reads and checks a request body {"q", "keys", "values", "mask", "scale"} (every field
// optional: the chapter's example fills what is missing; mask: true = may attend). Throws
// FieldError naming the field and what was expected.
struct FieldError {
  std::string field, message;
};
ExampleInput example_from_json(const nlohmann::json& body);

// Every step of softmax(q K^T * scale + M) V: scores, the max subtracted, exponentials, their
// sum, weights and output in double (shown), the weights and output qkv's flash kernel computes
// (float32), and what zeroing the masked weights without renormalising would give instead.
nlohmann::json attend_steps(const ExampleInput& in);

// The chapter's claims, each on live numbers drawn from `seed`: {"claims": [{"id", "title",
// "claim", "holds", "lines": [...], "matrices": [{"label", "rows", "row_labels", "col_labels"}]}]}.
// `lm`: a decoder-only model to show that causal training in parallel equals sequential
// generation (null: a small random one).
nlohmann::json chapter_claims(uint64_t seed, const Model* lm);
// The same, the model reached only through `run_lm`, which calls its argument with the model and
// returns what it returns, wherever the model lives (qkv serve: on its scheduler thread, so that
// only that one claim waits for the decoding steps, and the rest runs on the request's thread);
// `lm_config`: the model's configuration (null: no model, a small random one).
using LmRunner = std::function<double(const std::function<double(const Model&)>&)>;
nlohmann::json chapter_claims(uint64_t seed, const ModelConfig* lm_config, const LmRunner& run_lm);

// A number as the claims' lines write it (fixed point, `digits` decimals); qkv tour's text too.
std::string fmt(double x, int digits = 4);

}  // namespace qkv::tour
