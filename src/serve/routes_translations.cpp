// /v1/translations: CTranslate2's options (beam search with the n best, length penalty, sampling,
// a forced target prefix). Whole answers join the other requests' texts in one job on the scheduler
// thread, batched by their decoding settings; a streamed one (beam 1) is decoded by a job of its
// own that hands each token over as it is chosen.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <set>
#include <string>
#include <utility>

#include "models/model_dir.h"
#include "serve/server_impl.h"

namespace qkv::serve {

// A text waiting for the translation job (flush_translations), and where its answer goes.
struct ServerImpl::TranslationItem {
  std::vector<int32_t> src;
  std::vector<int32_t> prefix;  // the target prefix, forced (may be empty)
  GenerateConfig g;
  std::promise<std::vector<Generation>> done;  // its num_return hypotheses, best first
};

void ServerImpl::translations(const http::Request& req, http::Response& res) {
  Fields f(req.body);
  const std::vector<std::string> texts = f.strings("text", 64, true, false);
  const int64_t beam = f.integer("beam", 1, 16, 4);
  const int64_t max_tokens = f.integer("max_tokens", 1, o_.max_tokens, 0);
  // CTranslate2's options: the n best hypotheses with their scores, the length penalty of the
  // beam's ranking, and sampling (beam 1) instead of search
  const int64_t n_best = f.integer("n", 1, 16, 1);
  const double length_penalty = f.number("length_penalty", -10, 10, 1.0);
  const double temperature = f.number("temperature", 0, 100, 0);
  const int64_t top_k = f.integer("top_k", 0, 1 << 30, 0);
  const double top_p = f.number("top_p", 1e-6, 1, 1);
  const auto seed = static_cast<uint64_t>(f.integer("seed", 0, INT64_MAX, 0));
  // CTranslate2's target_prefix: the start of each translation, forced (one per text, or one
  // string for a single text); the translation includes it
  const std::vector<std::string> prefixes = f.strings("target_prefix", 64, false, false);
  const bool stream = f.boolean("stream", false);
  f.done();
  if (stream && (beam != 1 || n_best != 1))
    bad("stream", "a streamed translation is decoded token by token: give beam 1 (greedy, or sampling with a "
                  "temperature) and n 1");
  if (!prefixes.empty() && prefixes.size() != texts.size())
    bad("target_prefix", detail::concat("'target_prefix' holds ", prefixes.size(), " prefixes for ", texts.size(),
                                        " texts; give one per text"));
  if (n_best > beam) bad("n", detail::concat("'n' is ", n_best, "; the beam (", beam, ") holds at most that many hypotheses"));
  if (temperature > 0 && beam > 1)
    bad("temperature", detail::concat("sampling (temperature ", temperature, ") draws one hypothesis; give beam 1, or "
                                      "temperature 0 for beam search"));
  if (temperature == 0 && (top_k != 0 || top_p != 1))
    bad(top_k != 0 ? "top_k" : "top_p", "top_k and top_p shape sampling; give a temperature > 0 too");
  // a text with no tokens translates to "" (as qkv translate does), the others in one batch
  std::vector<std::vector<int32_t>> src, tgt_prefix;
  std::vector<size_t> rows;  // the texts that have tokens
  const ModelConfig& c = model_->config();
  int64_t longest_prefix = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> ids = tok_->encode(texts[i]);
    if (ids.empty()) continue;
    rows.push_back(i);
    tgt_prefix.push_back(prefixes.empty() ? std::vector<int32_t>{} : tok_->encode_target(prefixes[i]));
    longest_prefix = std::max<int64_t>(longest_prefix, static_cast<int64_t>(tgt_prefix.back().size()));
    ids = source_ids(*tok_, std::move(ids));
    if (c.positional == Positional::Learned && static_cast<int64_t>(ids.size()) > c.max_len)
      bad("text", detail::concat("a text of ", ids.size(), " tokens exceeds the model's ", c.max_len, " positions"));
    src.push_back(std::move(ids));
  }
  int64_t longest = 0;
  for (const auto& s : src) longest = std::max<int64_t>(longest, static_cast<int64_t>(s.size()));
  GenerateConfig g;
  g.beam_size = beam;
  g.beam_search = n_best > 1;
  g.num_return = n_best;
  g.length_penalty = length_penalty;
  if (temperature > 0) {
    g.sampling.greedy = false;
    g.sampling.temperature = static_cast<float>(temperature);
    g.sampling.top_k = top_k;
    g.sampling.top_p = static_cast<float>(top_p);
    g.sampling.seed = seed;
  }
  g.max_new_tokens = max_tokens > 0 ? max_tokens : std::min<int64_t>(2 * longest + 10, o_.max_tokens);
  if (c.positional == Positional::Learned) {
    if (longest_prefix >= c.max_len)
      bad("target_prefix", detail::concat("a target prefix of ", longest_prefix, " tokens leaves none of the model's ",
                                          c.max_len, " positions to translate"));
    g.max_new_tokens = std::min(g.max_new_tokens, c.max_len - longest_prefix);
  }
  if (stream) {
    stream_translations(texts, rows, std::move(src), std::move(tgt_prefix), g, res);
    return;
  }
  // the texts join whatever other requests wait for translation: one job translates them all,
  // grouped by their decoding settings (concurrent clients share batches)
  std::vector<std::shared_ptr<TranslationItem>> items;
  for (size_t k = 0; k < src.size(); ++k)
    items.push_back(std::make_shared<TranslationItem>(TranslationItem{std::move(src[k]), tgt_prefix[k], g, {}}));
  if (!items.empty()) {
    std::lock_guard<std::mutex> lock(tr_mu_);
    sched_->run([this](const Model& m) {
      flush_translations(m);
      return 0;
    });
    tr_pending_.insert(tr_pending_.end(), items.begin(), items.end());
  }
  // each text: its best translation, its log-probability, and with n > 1 the n best with
  // their log-probabilities and the beam's scores (logprob / length^length_penalty)
  std::vector<std::string> tr(texts.size());
  Json logprobs = Json::array(), best = Json::array();
  for (size_t i = 0; i < texts.size(); ++i) logprobs.push_back(0.0), best.push_back(Json::array());
  for (size_t k = 0; k < items.size(); ++k) {
    const std::vector<Generation> out = items[k]->done.get_future().get();
    const auto with_prefix = [&](const std::vector<int32_t>& t) {
      std::vector<int32_t> all = items[k]->prefix;
      all.insert(all.end(), t.begin(), t.end());
      return output_text(*tok_, all);
    };
    tr[rows[k]] = with_prefix(out[0].tokens);
    logprobs[rows[k]] = out[0].logprob;
    for (const Generation& h : out) {
      const double len = std::max<double>(1, static_cast<double>(h.tokens.size()));
      best[rows[k]].push_back({{"text", with_prefix(h.tokens)}, {"logprob", h.logprob},
                               {"score", h.logprob / std::pow(len, length_penalty)}});
    }
  }
  Json body = {{"model", id_}, {"translations", Json(tr)}, {"logprobs", logprobs}};
  if (n_best > 1) body["n_best"] = best;
  res.body = dump(body);
}

// A streamed translation (beam 1): one job on the scheduler thread decodes the texts together,
// handing each token over as it is chosen; this request's thread sends each text's settled text
// as server-sent events {"model", "index", "text"}, then per text a last event with its
// "logprob" and "finish_reason", then [DONE]. A text with no tokens gets its (empty) last event.
void ServerImpl::stream_translations(const std::vector<std::string>& texts, const std::vector<size_t>& rows,
                                     std::vector<std::vector<int32_t>> src, std::vector<std::vector<int32_t>> prefixes,
                                     GenerateConfig g, http::Response& res) {
  struct Live {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<int64_t, int32_t>> tokens;  // (row, token) as chosen
    bool done = false;
    std::string error;
    std::vector<Generation> out;
    std::atomic<bool> gone{false};
  };
  auto live = std::make_shared<Live>();
  g.on_token = [live](int64_t row, int32_t t) {
    if (live->gone) throw Error("the client went away");
    std::lock_guard<std::mutex> lock(live->mu);
    live->tokens.emplace_back(row, t);
    live->cv.notify_all();
  };
  bool any_prefix = false;
  for (const auto& p : prefixes) any_prefix = any_prefix || !p.empty();
  if (!src.empty()) {
    (void)sched_->run([live, src, prefixes, any_prefix, g](const Model& m) {
      try {
        auto out = translate(m, src, g, any_prefix ? prefixes : std::vector<std::vector<int32_t>>{});
        std::lock_guard<std::mutex> lock(live->mu);
        live->out = std::move(out);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(live->mu);
        live->error = e.what();
      }
      std::lock_guard<std::mutex> lock(live->mu);
      live->done = true;
      live->cv.notify_all();
      return 0;
    });
  } else {
    live->done = true;
  }
  res.content_type = "text/event-stream";
  res.stream = [this, live, rows, prefixes, n_texts = texts.size()](http::ChunkSink& sink) {
    struct End {
      Live& l;
      ~End() { l.gone = true; }
    } end{*live};
    const auto send = [&](const Json& j) { return sink.write("data: " + dump(j) + "\n\n"); };
    std::vector<std::vector<int32_t>> ids(rows.size());
    std::vector<std::string> sent(rows.size());
    // the text of row k so far, less what may still change (an unfinished character)
    const auto settled = [&](size_t k) {
      std::vector<int32_t> all = prefixes[k];
      all.insert(all.end(), ids[k].begin(), ids[k].end());
      std::string t = output_text(*tok_, all);
      while (t.size() >= 3 && t.compare(t.size() - 3, 3, "\xEF\xBF\xBD") == 0) t.resize(t.size() - 3);
      return t;
    };
    bool finished = false;
    while (!finished) {
      std::deque<std::pair<int64_t, int32_t>> got;
      {
        std::unique_lock<std::mutex> lock(live->mu);
        live->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return !live->tokens.empty() || live->done; });
        got.swap(live->tokens);
        finished = live->done && live->tokens.empty();
      }
      if (!sink.open()) return;
      std::set<size_t> touched;
      for (const auto& [row, t] : got) {
        ids[static_cast<size_t>(row)].push_back(t);
        touched.insert(static_cast<size_t>(row));
      }
      for (size_t k : touched) {
        const std::string now = settled(k);
        if (now.size() > sent[k].size() && now.compare(0, sent[k].size(), sent[k]) == 0) {
          if (!send({{"model", id_}, {"index", rows[k]}, {"text", now.substr(sent[k].size())}})) return;
          sent[k] = now;
        }
      }
    }
    if (!live->error.empty()) {
      send({{"error", {{"message", live->error}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}});
      return;
    }
    // each text's last event: the rest of its text, its log-probability and why it ended
    std::vector<bool> has(n_texts, false);
    for (size_t k = 0; k < rows.size(); ++k) {
      std::vector<int32_t> all = prefixes[k];
      all.insert(all.end(), live->out[k].tokens.begin(), live->out[k].tokens.end());
      const std::string whole = output_text(*tok_, all);
      const std::string rest = whole.compare(0, sent[k].size(), sent[k]) == 0 ? whole.substr(sent[k].size()) : "";
      if (!send({{"model", id_}, {"index", rows[k]}, {"text", rest}, {"logprob", live->out[k].logprob},
                 {"finish_reason", live->out[k].finished ? "stop" : "length"}}))
        return;
      has[rows[k]] = true;
    }
    for (size_t i = 0; i < n_texts; ++i)
      if (!has[i] && !send({{"model", id_}, {"index", i}, {"text", ""}, {"logprob", 0.0}, {"finish_reason", "stop"}}))
        return;
    sink.write("data: [DONE]\n\n");
  };
}

// On the scheduler thread: every waiting translation, in batches of equal settings.
void ServerImpl::flush_translations(const Model& m) {
  std::vector<std::shared_ptr<TranslationItem>> all;
  {
    std::lock_guard<std::mutex> lock(tr_mu_);
    all.swap(tr_pending_);
  }
  while (!all.empty()) {
    // a batch: one beam size; it decodes to its longest limit, each text cut to its own (a row's
    // tokens do not depend on the others' limits)
    GenerateConfig g = all.front()->g;
    std::vector<std::shared_ptr<TranslationItem>> batch, rest;
    // --slots bounds a translation batch too; a sampled text decodes alone (the draws of a
    // batch share one generator, so a text's translation would depend on its batch mates)
    const auto most = g.sampling.greedy ? static_cast<size_t>(o_.slots) : size_t{1};
    const size_t prefix_len = all.front()->prefix.size();
    // settings a batch shares (not the limit), and the target prefix's length (so that every
    // row's prefix + limit fits the positions it would alone)
    const auto same = [&g](const GenerateConfig& o) {
      return o.beam_size == g.beam_size && o.beam_search == g.beam_search && o.num_return == g.num_return &&
             o.length_penalty == g.length_penalty && o.sampling.greedy == g.sampling.greedy &&
             o.sampling.temperature == g.sampling.temperature && o.sampling.top_k == g.sampling.top_k &&
             o.sampling.top_p == g.sampling.top_p && o.sampling.seed == g.sampling.seed;
    };
    for (auto& it : all)
      (same(it->g) && it->prefix.size() == prefix_len && batch.size() < most ? batch : rest).push_back(it);
    all.swap(rest);
    std::vector<std::vector<int32_t>> src, prefixes;
    bool any_prefix = false;
    for (auto& it : batch) {
      src.push_back(it->src);
      prefixes.push_back(it->prefix);
      any_prefix = any_prefix || !it->prefix.empty();
      g.max_new_tokens = std::max(g.max_new_tokens, it->g.max_new_tokens);
    }
    try {
      std::vector<Generation> out = translate(m, src, g, any_prefix ? prefixes : std::vector<std::vector<int32_t>>{});
      const auto R = static_cast<size_t>(g.num_return);
      for (size_t k = 0; k < batch.size(); ++k) {
        const auto limit = static_cast<size_t>(batch[k]->g.max_new_tokens);
        std::vector<Generation> mine(out.begin() + static_cast<std::ptrdiff_t>(k * R),
                                     out.begin() + static_cast<std::ptrdiff_t>((k + 1) * R));
        for (Generation& h : mine)
          if (h.tokens.size() > limit) h.tokens.resize(limit), h.finished = false;
        batch[k]->done.set_value(std::move(mine));
      }
    } catch (...) {
      for (auto& it : batch) it->done.set_exception(std::current_exception());
    }
  }
}

}  // namespace qkv::serve
