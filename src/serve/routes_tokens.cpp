// The token routes: llama.cpp's /tokenize and /detokenize (any model), and /v1/next-token (a
// language model's distribution over the next token, for the explorer page).
#include <algorithm>
#include <cmath>
#include <string>

#include "models/model_dir.h"
#include "qkv/data.h"
#include "serve/server_impl.h"

namespace qkv::serve {

// ---- /tokenize, /detokenize (llama.cpp's) -------------------------------------------------------

// {"content": text, "add_special": false, "with_pieces": false} -> {"tokens": [id, ...]}, or with
// pieces [{"id", "piece"}]: the bytes the token adds to a text (Tokenizer::token_bytes), a string
// when they are whole UTF-8 characters, else the list of byte values.
void ServerImpl::tokenize(const http::Request& req, http::Response& res) {
  Fields f(req.body);
  const std::vector<std::string> content = f.strings("content", 1, true, false);
  if (!f.get("content")->is_string()) bad("content", "'content' must be a string");
  const bool special = f.boolean("add_special", false), pieces = f.boolean("with_pieces", false);
  f.done();
  std::vector<int32_t> ids = tok_->encode(content[0]);
  if (special) ids = tok_->with_special_tokens(ids);
  Json tokens = Json::array();
  for (int32_t id : ids) {
    if (!pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string b = tok_->token_bytes(id);
    Json piece;
    if (utf8_problem(b).empty()) {
      piece = b;
    } else {
      piece = Json::array();
      for (unsigned char c : b) piece.push_back(static_cast<int>(c));
    }
    tokens.push_back({{"id", id}, {"piece", piece}});
  }
  res.body = dump({{"tokens", tokens}});
}

// {"tokens": [id, ...]} -> {"content": the decoded text}
void ServerImpl::detokenize(const http::Request& req, http::Response& res) {
  Fields f(req.body);
  const Json* t = f.get("tokens");
  f.done();
  if (!t || !t->is_array())
    bad("tokens", "'tokens' is required: a list of token ids in [0, " + std::to_string(tok_->vocab_size()) + ")");
  std::vector<int32_t> ids;
  for (const Json& e : *t) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= tok_->vocab_size())
      bad("tokens", detail::concat("'tokens' holds ", e.dump(), "; expected token ids in [0, ", tok_->vocab_size(), ")"));
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  res.body = dump({{"content", tok_->decode(ids)}});
}

// ---- /v1/next-token ---------------------------------------------------------------------------

void ServerImpl::next_token(const http::Request& req, http::Response& res) {
  Fields f(req.body);
  const std::string text = f.strings("text", 1, true, false)[0];
  const double temperature = f.number("temperature", 1e-4, 100, 1.0);
  const int64_t top_k = f.integer("top_k", 1, 1000, 10);
  f.done();
  const std::vector<int32_t> ids = prompt_ids(*tok_, text);
  const int64_t limit = sched_->options().max_len;
  if (static_cast<int64_t>(ids.size()) > limit)
    bad("text", detail::concat("'text' is ", ids.size(), " tokens; the model reads at most ", limit));
  const std::vector<float> z = sched_->run([&ids](const Model& m) {
    const Tensor logits = logits_of(m, ids);  // (1, T, V)
    const int64_t V = logits.size(-1);
    const float* last = logits.data<float>() + (static_cast<int64_t>(ids.size()) - 1) * V;
    return std::vector<float>(last, last + V);
  }).get();
  const auto V = static_cast<int64_t>(z.size());
  for (int64_t v = 0; v < V; ++v)
    if (!std::isfinite(z[v])) throw HttpError{500, "the model's logits are not finite", "server_error", ""};
  // p <- softmax(z / temperature), max subtracted first; the top_k by logit (ties: lower id)
  double mx = -INFINITY, sum = 0;
  for (float v : z) mx = std::max(mx, static_cast<double>(v) / temperature);
  for (float v : z) sum += std::exp(static_cast<double>(v) / temperature - mx);
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) order[v] = static_cast<int32_t>(v);
  const int64_t k = std::min(top_k, V);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return z[a] != z[b] ? z[a] > z[b] : a < b; });
  Json top = Json::array();
  for (int64_t i = 0; i < k; ++i) {
    const int32_t id = order[i];
    const bool known = id < tok_->vocab_size();
    top.push_back({{"id", id},
                   {"token", known ? tok_->decode({id}) : ""},
                   {"piece", known ? tok_->piece(id) : ""},
                   {"logit", z[id]},
                   {"prob", std::exp(static_cast<double>(z[id]) / temperature - mx) / sum}});
  }
  Json pieces = Json::array();
  for (int32_t id : ids) pieces.push_back(tok_->piece(id));
  res.body = dump({{"tokens", pieces}, {"ids", ids}, {"temperature", temperature}, {"top", top}});
}

}  // namespace qkv::serve
