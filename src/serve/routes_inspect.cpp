// The routes for looking inside the model: /v1/attention (every layer's and head's weights on a
// text), and the explorer page's: the page itself, /v1/model (what the page shows of the model),
// /v1/attend (the chapter's worked example) and /v1/claims (its claims on live numbers, viz/tour.h).
#include <algorithm>
#include <charconv>
#include <string>
#include <utility>

#include "models/model_dir.h"
#include "qkv/inspect.h"
#include "serve/server_impl.h"
#include "viz/tour.h"

namespace qkv::serve {

using tour::attend_steps;
using tour::chapter_claims;
using tour::example_from_json;
using tour::FieldError;

// ---- /v1/attention ------------------------------------------------------------------------------

// Every (or the chosen) layer's and head's weights on a text: one forward pass on the scheduler
// thread keeps each module's queries, keys and logsumexp (qkv/inspect.h); the weights are then
// recomputed here, head by head in blocks of rows, never all heads' matrices at once.
void ServerImpl::attention(const http::Request& req, http::Response& res) {
  Fields f(req.body);
  const bool encdec = info_.task == Task::Translate;
  const ModelConfig& c = model_->config();
  const std::vector<std::string> given = f.strings("text", 1, !encdec, false);
  const std::string text = given.empty() ? "" : given[0];
  std::string source;
  if (encdec) {
    source = f.strings("source", 1, true, true)[0];
  } else if (f.has("source")) {
    bad("source", "'source' is for translation models; this one is a " + std::string(task_label()) +
                      " model");
  }
  const int64_t L = encdec ? std::max(c.n_encoder_layers, c.n_decoder_layers) : c.n_layers;
  std::vector<int64_t> layers = f.integers("layers", 0, std::max<int64_t>(L - 1, 0));
  std::vector<int64_t> heads = f.integers("heads", 0, c.n_heads - 1);
  f.done();
  if (layers.empty())
    for (int64_t l = 0; l < L; ++l) layers.push_back(l);
  if (heads.empty())
    for (int64_t h = 0; h < c.n_heads; ++h) heads.push_back(h);
  // the token ids the model reads, as its own commands build them
  std::vector<int32_t> src;
  if (encdec) {
    src = tok_->encode(source);
    if (src.empty()) bad("source", "'source' has no tokens");
    src = source_ids(*tok_, std::move(src));
  }
  const std::vector<int32_t> ids = trace_ids(*tok_, c, info_, text);
  const int64_t limit = c.positional == Positional::Learned ? c.max_len : sched_->options().max_len;
  for (const auto& [field, v] : {std::pair<const char*, const std::vector<int32_t>*>{"text", &ids}, {"source", &src}})
    if (static_cast<int64_t>(v->size()) > limit)
      bad(field, detail::concat("'", field, "' is ", v->size(), " tokens; the model reads at most ", limit));
  // the answer's size: rows x cols numbers per map, within --max-attention
  const auto T = static_cast<int64_t>(ids.size()), S = static_cast<int64_t>(src.size());
  int64_t per_layer = encdec ? 0 : T * T;
  if (encdec) per_layer = S * S + T * T + T * S;
  const int64_t numbers = per_layer * static_cast<int64_t>(layers.size() * heads.size());
  if (numbers > o_.max_attention)
    bad("text", detail::concat("the maps would hold ", numbers, " weights (", layers.size(), " layers x ",
                               heads.size(), " heads of ", T, encdec ? detail::concat(" target and ", S, " source") : "",
                               " tokens); this server answers at most ", o_.max_attention,
                               " (--max-attention): ask for fewer 'layers' or 'heads', or a shorter text"));
  const Batch b = trace_batch(ids, src);
  const AttentionTrace trace = sched_->run([&b](const Model& m) { return trace_attention(m, b); }).get();
  Json maps = Json::array();
  constexpr int64_t kBlock = 64;  // query rows recomputed at a time
  for (const AttentionMap& m : trace.maps) {
    if (std::find(layers.begin(), layers.end(), m.layer) == layers.end()) continue;
    for (int64_t h : heads) {
      Json w = Json::array();
      for (int64_t r0 = 0; r0 < m.rows(); r0 += kBlock) {
        const int64_t r1 = std::min(m.rows(), r0 + kBlock);
        const std::vector<float> x = m.weights(0, h, r0, r1);
        for (int64_t r = 0; r < r1 - r0; ++r) {
          std::vector<double> row(static_cast<size_t>(m.cols()));
          for (int64_t j = 0; j < m.cols(); ++j) row[static_cast<size_t>(j)] = short_float(x[static_cast<size_t>(r * m.cols() + j)]);
          w.push_back(std::move(row));
        }
      }
      maps.push_back({{"stack", m.stack}, {"layer", m.layer}, {"head", h}, {"kind", m.kind}, {"weights", std::move(w)}});
    }
  }
  const auto pieces = [this](const std::vector<int32_t>& v) {
    Json p = Json::array();
    for (int32_t id : v) p.push_back(id < tok_->vocab_size() ? tok_->piece(id) : detail::concat("<", id, ">"));
    return p;
  };
  Json out = {{"model", id_}, {"tokens", pieces(ids)}, {"ids", ids}, {"layers", L}, {"heads", c.n_heads},
              {"maps", std::move(maps)}};
  if (encdec) {
    out["source_tokens"] = pieces(src);
    out["source_ids"] = src;
  }
  res.body = dump(out);
}

// What the explorer page needs to know of the model.
Json ServerImpl::model_json() const {
  const ModelConfig& c = model_->config();
  const bool encdec = c.arch == Arch::EncoderDecoder;
  Json j = {{"id", id_},
            {"task", task_label()},
            {"arch", arch_name(c.arch)},
            {"layers", encdec ? Json{{"encoder", c.n_encoder_layers}, {"decoder", c.n_decoder_layers}}
                              : Json{{c.arch == Arch::Decoder ? "decoder" : "encoder", c.n_layers}}},
            {"heads", c.n_heads},
            {"kv_heads", c.kv_heads()},
            {"d_model", c.d_model},
            {"d_ff", c.d_ff},
            {"positional", positional_name(c.positional)},
            {"norm_first", c.norm_first},
            {"vocab_size", c.vocab_size},
            {"parameters", model_->num_parameters()},
            {"max_len", sched_->options().max_len},
            {"max_attention", o_.max_attention}};
  if (info_.task == Task::Classify) j["labels"] = info_.labels;
  return j;
}

// GET /: the page the options carry (qkv/server.h: ServerOptions::page), which may reach no other origin.
void ServerImpl::explorer_page(const http::Request&, http::Response& res) {
  res.body.assign(o_.page.data(), o_.page.size());
  res.content_type = "text/html; charset=utf-8";
  res.headers.emplace_back("Content-Security-Policy",
                           "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                           "connect-src 'self'; img-src data:");
}

// POST /v1/attend: the chapter's worked example, every step, on the numbers sent (tour::example_from_json).
void ServerImpl::explorer_attend(const http::Request& req, http::Response& res) {
  check_utf8_body(req.body);
  Json body;
  try {
    body = Json::parse(req.body);
  } catch (const Json::exception& e) {
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  try {
    res.body = dump(attend_steps(example_from_json(body)));
  } catch (const FieldError& e) {
    bad(e.field, e.message);
  }
}

// GET /v1/claims?seed=N: the chapter's claims on numbers drawn from the seed; the language-model claim
// on the served model when it is one.
void ServerImpl::explorer_claims(const http::Request& req, http::Response& res) {
  uint64_t seed = 1;
  if (const std::string* p = req.param("seed")) {
    const std::string& v = *p;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), seed);
    if (r.ec != std::errc() || r.ptr != v.data() + v.size() || v.empty() || seed > (uint64_t{1} << 53))
      bad("seed", "'seed' is '" + v + "'; expected a whole number in [0, 2^53]");
  }
  // on this request's thread: only the claim that uses the served model waits for (and briefly
  // holds) the scheduler's thread, so decoding goes on while the others compute
  const bool lm = info_.task == Task::LanguageModel;
  const Json claims = chapter_claims(seed, lm ? &model_->config() : nullptr,
                                     [this](const std::function<double(const Model&)>& f) {
                                       return sched_->run([&f](const Model& m) { return f(m); }).get();
                                     });
  res.body = dump(claims);
}

}  // namespace qkv::serve
