// /v1/completions and /v1/chat/completions: a request's fields read, its prompts submitted to the
// scheduler (continuous batching), and the answer written whole or streamed as server-sent events,
// with logprobs, stop strings, echo and structured output (qkv/json_constraint.h). A chat request
// becomes one prompt through the model's chat template (qkv/chat_template.h), then runs as a
// completion whose answer takes chat's shapes.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <string>

#include "models/model_dir.h"
#include "qkv/data.h"
#include "qkv/files.h"
#include "qkv/gguf.h"
#include "serve/server_impl.h"

namespace qkv::serve {

using OJson = nlohmann::ordered_json;  // keeps keys in order (a chat template sees messages as sent)
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// One completion request's events, between the scheduler thread and the handler thread

struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TokenEvent> events;
  std::vector<char> cancelled;  // per choice: the handler wants it stopped (a stop string)
  std::atomic<bool> gone{false};  // the client went away
  // How often the handler thread is woken. Waking it for every token costs the decoding threads
  // their cores on a small machine (measured: SmolLM-shape Q4_0 decoding in the server at 10 ms a
  // token against 3.75 in qkv bench decode): so a choice's last event always wakes it, stop
  // strings wake it on every token (they end a choice early), and otherwise a stream is woken at
  // most every kWake and a whole answer only at the end.
  static constexpr std::chrono::milliseconds kWake{20};
  enum class Wake { EachToken, Coalesced, AtTheEnd } wake = Wake::EachToken;
  std::chrono::steady_clock::time_point last_wake{};
  explicit Completion(int64_t n) : cancelled(static_cast<size_t>(n), 0) {}
  // On the scheduler thread: queue the event; false ends the choice (client gone, stop string).
  bool take(const TokenEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
    const auto now = std::chrono::steady_clock::now();
    if (e.last || wake == Wake::EachToken || (wake == Wake::Coalesced && now - last_wake >= kWake)) {
      last_wake = now;
      cv.notify_all();
    }
    return !gone && !cancelled[static_cast<size_t>(e.choice)];
  }
};

// The text of one choice as tokens arrive: decoded with the prompt (a tokenizer may mark a word
// start on the following token), stop strings found, and only text that can no longer change
// handed out (not a trailing U+FFFD of an unfinished character, nor what may begin a stop string).
struct ChoiceText {
  std::vector<int32_t> ids;
  std::string sent;  // handed out so far
  std::string text;  // the whole completion, once ended
  std::string finish;
  bool ended = false;
  Json logprobs = Json::object();
  int64_t cached = 0;  // prompt tokens the scheduler took from its prompt cache for this choice
};

// ---- /v1/completions --------------------------------------------------------------------------

struct ServerImpl::CompletionParams {
  CompletionRequest r;
  std::vector<std::string> stop;
  bool stream = false, echo = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  // /v1/chat/completions: answers in the chat shapes; logprobs as chat's (a boolean, then
  // top_logprobs alternatives per token)
  bool chat = false, chat_logprobs = false;
  int64_t chat_top = 0;
  // the prompts (a list of prompts is a batch: prompt k's choices are k n .. k n + n - 1) and
  // their texts (for echo); r.prompt is the first
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
  int64_t prompt_tokens() const {
    int64_t n = 0;
    for (const auto& q : prompts) n += static_cast<int64_t>(q.size());
    return n;
  }
};

// OpenAI's usage: prompt tokens (every prompt of a batch), generated tokens, and the prompt tokens
// taken from the prompt cache (each prompt's first choice: its other choices find its own chunks)
Json ServerImpl::usage(const CompletionParams& p, const std::vector<ChoiceText>& choices, int64_t generated) {
  const int64_t P = p.prompt_tokens();
  int64_t cached = 0;
  for (size_t k = 0; k < p.prompts.size(); ++k) cached += choices[k * static_cast<size_t>(p.r.n)].cached;
  return {{"prompt_tokens", P},
          {"completion_tokens", generated},
          {"total_tokens", P + generated},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

ServerImpl::CompletionParams ServerImpl::parse_completion(const std::string& body) {
  Fields f(body);
  CompletionParams p;
  if (const Json* m = f.get("model"); m && !m->is_string()) bad("model", "'model' must be a string");
  f.get("user");  // OpenAI's end-user tag: not used
  if (const Json* sfx = f.get("suffix"); sfx && !sfx->is_null() && !(sfx->is_string() && sfx->get<std::string>().empty()))
    bad("suffix", sfx->is_string() ? "'suffix' asks for text inserted before it (fill-in-the-middle); this model "
                                     "only continues a prompt, so only a null or empty suffix is accepted"
                                   : "'suffix' is " + sfx->dump() + "; expected a string or null");
  const Json* prompt = f.get("prompt");
  if (!prompt) bad("prompt", "'prompt' is required (a string, a list of token ids, or a list of either)");
  // one prompt: a string or a list of token ids; a batch: a list of strings or of lists of ids
  const auto ids_of = [&](const Json& list, const std::string& where) {
    std::vector<int32_t> ids;
    for (const Json& t : list) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok_->vocab_size())
        bad("prompt", detail::concat(where, " holds ", t.dump(), "; a list prompt holds token ids in [0, ",
                                     tok_->vocab_size(), ")"));
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return ids;
  };
  const auto add_text = [&](const std::string& text, const std::string& where) {
    if (const std::string why = utf8_problem(text); !why.empty()) bad("prompt", where + ": " + why);
    p.prompt_texts.push_back(text);
    p.prompts.push_back(prompt_ids(*tok_, text));
  };
  const auto add_ids = [&](const Json& list, const std::string& where) {
    if (!list.is_array() || list.empty()) bad("prompt", where + " must be a non-empty list of token ids");
    p.prompts.push_back(ids_of(list, where));
    p.prompt_texts.push_back(tok_->decode(p.prompts.back()));
  };
  constexpr size_t kMaxPrompts = 64;
  if (prompt->is_string()) {
    add_text(prompt->get<std::string>(), "'prompt'");
  } else if (prompt->is_array() && !prompt->empty() && prompt->front().is_number()) {
    add_ids(*prompt, "'prompt'");
  } else if (prompt->is_array() && !prompt->empty() && prompt->size() <= kMaxPrompts &&
             (prompt->front().is_string() || prompt->front().is_array())) {
    const bool strings = prompt->front().is_string();
    for (size_t k = 0; k < prompt->size(); ++k) {
      const Json& e = (*prompt)[k];
      const std::string where = detail::concat("'prompt'[", k, "]");
      if (strings != e.is_string())
        bad("prompt", where + " is " + e.dump() + "; a batch is all strings or all lists of token ids");
      if (strings) add_text(e.get<std::string>(), where);
      else add_ids(e, where);
    }
  } else {
    bad("prompt", detail::concat("'prompt' must be a string, a non-empty list of token ids, or a list of 1 to ",
                                 kMaxPrompts, " strings or lists of token ids (a batch)"));
  }
  p.r.prompt = p.prompts[0];
  // max_tokens 0 only with echo: the prompt scored, nothing generated (an evaluation harness's
  // log-likelihood request)
  p.echo = f.boolean("echo", false);
  p.r.max_tokens = f.integer("max_tokens", p.echo ? 0 : 1, o_.max_tokens, std::min<int64_t>(16, o_.max_tokens));
  const double temperature = f.number("temperature", 0, 100, 1.0);
  p.r.sampling.greedy = temperature == 0;
  p.r.sampling.temperature = static_cast<float>(temperature == 0 ? 1.0 : temperature);
  p.r.sampling.top_p = static_cast<float>(f.number("top_p", 1e-6, 1, 1));
  p.r.sampling.top_k = f.integer("top_k", 0, 1 << 30, 0);
  p.r.sampling.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 0.01, 100, 1));
  p.r.sampling.seed = static_cast<uint64_t>(f.integer("seed", 0, INT64_MAX, 0));
  p.r.sampling.vocab_limit = tok_->vocab_size();  // never an id the tokenizer cannot decode
  if (const Json* lb = f.get("logit_bias"); lb && !lb->is_null()) {
    // OpenAI's: {"token id": bias in [-100, 100]}, added to the logits before each choice
    if (!lb->is_object()) bad("logit_bias", "'logit_bias' is " + lb->dump() + "; expected an object of token ids");
    if (lb->size() > 1024) bad("logit_bias", detail::concat("'logit_bias' holds ", lb->size(), " tokens (at most 1024)"));
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& k = it.key();
      int64_t id = -1;
      const auto r = std::from_chars(k.data(), k.data() + k.size(), id);
      if (k.empty() || r.ec != std::errc() || r.ptr != k.data() + k.size() || id < 0 || id >= tok_->vocab_size())
        bad("logit_bias", detail::concat("'logit_bias' has the key '", k, "'; expected token ids in [0, ",
                                         tok_->vocab_size(), ") as decimal strings"));
      if (!it->is_number() || !std::isfinite(it->get<double>()) || std::fabs(it->get<double>()) > 100)
        bad("logit_bias", detail::concat("'logit_bias'[\"", k, "\"] is ", it->dump(), "; expected a number in [-100, 100]"));
      p.r.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), it->get<float>());
    }
  }
  p.r.n = f.integer("n", 1, o_.slots, 1);
  if (static_cast<int64_t>(p.prompts.size()) * p.r.n > o_.max_queue + o_.slots)
    bad("n", detail::concat(p.prompts.size(), " prompts x n = ", p.r.n, " choices are more than the server takes at "
                            "once (--slots ", o_.slots, " + --max-queue ", o_.max_queue, ")"));
  p.r.top_logprobs = f.integer("logprobs", 0, 20, 0);
  p.stream = f.boolean("stream", false);
  if (const Json* so = f.get("stream_options"); so && !so->is_null()) {
    // OpenAI's: only with stream; {"include_usage": bool} (each chunk's usage null, then one
    // chunk with no choices and the request's usage before [DONE])
    if (!p.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!so->is_object()) bad("stream_options", "'stream_options' is " + so->dump() + "; expected an object");
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it.key() != "include_usage")
        bad("stream_options." + it.key(), "unknown field 'stream_options." + it.key() + "' (qkv knows include_usage)");
      if (!it->is_boolean())
        bad("stream_options.include_usage",
            "'stream_options.include_usage' is " + it->dump() + "; expected true or false");
      p.include_usage = it->get<bool>();
    }
  }
  if (p.r.max_tokens == 0 && p.stream)
    bad("max_tokens", "'max_tokens' 0 (score the prompt, generate nothing) is not streamed; send it without stream");
  // OpenAI's: subtracted from a generated token's logit, once (presence) or per time it was
  // generated (frequency)
  p.r.sampling.presence_penalty = static_cast<float>(f.number("presence_penalty", -2, 2, 0));
  p.r.sampling.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2, 2, 0));
  p.stop = f.strings("stop", 4, false, true);
  if (const Json* rf = f.get("response_format"); rf && !rf->is_null()) p.r.constraint = output_constraint(*rf);
  p.r.cache_prompt = f.boolean("cache_prompt", true);  // llama.cpp's: reuse a cached prefix (same results)
  f.done();
  p.r.eos_id = tok_->eos_id();
  const int64_t context = sched_->options().max_len;
  for (size_t k = 0; k < p.prompts.size(); ++k)
    if (static_cast<int64_t>(p.prompts[k].size()) + p.r.max_tokens > context)
      bad("max_tokens", detail::concat("the prompt", p.prompts.size() > 1 ? detail::concat(" ", k) : std::string(),
                                       " (", p.prompts[k].size(), " tokens) + max_tokens (", p.r.max_tokens,
                                       ") exceed the model's context of ", context, " tokens"));
  return p;
}

// OpenAI's response_format: {"type": "text"} (none), {"type": "json_object"} (any JSON object),
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (qkv/json_constraint.h).
std::shared_ptr<const TokenConstraint> ServerImpl::output_constraint(const Json& rf) {
  const auto refuse = [&](const std::string& why) { bad("response_format", "'response_format' " + why); };
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    refuse("must be an object with a \"type\": text, json_object or json_schema");
  const std::string type = rf["type"].get<std::string>();
  for (auto it = rf.begin(); it != rf.end(); ++it)
    if (it.key() != "type" && it.key() != "json_schema") refuse("has the unknown field '" + it.key() + "'");
  if (type == "text") return nullptr;
  std::string schema;
  if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
      refuse("of type json_schema needs \"json_schema\": {\"name\", \"schema\"}");
    const Json& js = rf["json_schema"];
    if (!js.contains("schema") || !js["schema"].is_object()) refuse("needs json_schema.schema, an object");
    schema = js["schema"].dump();
  } else if (type != "json_object") {
    refuse("type '" + type + "' is not text, json_object or json_schema");
  }
  if (tok_->eos_id() < 0) refuse("needs a tokenizer with an end-of-sequence token to end the JSON");
  std::shared_ptr<const JsonMachine> m;
  try {
    m = json_machine(schema);
  } catch (const Error& e) {
    bad("response_format", e.what());
  }
  return json_constraint(m, token_trie(), static_cast<int32_t>(tok_->eos_id()));
}

// The vocabulary's bytes as a trie (built once): special tokens (those that decode to nothing)
// left out.
std::shared_ptr<const TokenTrie> ServerImpl::token_trie() {
  std::lock_guard<std::mutex> lock(trie_mu_);
  if (!trie_) {
    std::vector<std::string> bytes(static_cast<size_t>(model_->config().vocab_size));
    for (int64_t v = 0; v < tok_->vocab_size(); ++v)
      if (!tok_->decode({static_cast<int32_t>(v)}).empty()) bytes[static_cast<size_t>(v)] = tok_->token_bytes(static_cast<int32_t>(v));
    trie_ = std::make_shared<const TokenTrie>(bytes);
  }
  return trie_;
}

// Characters in UTF-8 text (bytes that do not continue a character; a stray byte counts as one).
int64_t ServerImpl::utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// A token as text for logprobs: the bytes it adds to the text (Tokenizer::token_bytes: a
// SentencePiece word start keeps its space, so a choice's tokens concatenate to its text), its
// piece for a special token such as </s>, or "<id N>" for a row of the model's table the
// tokenizer lacks. (Bytes that are part of a character read U+FFFD in the JSON.)
std::string ServerImpl::token_text(int32_t id) const {
  if (id >= tok_->vocab_size()) return "<id " + std::to_string(id) + ">";
  return tok_->token_bytes(id);
}

// Folds the events waiting in `c` into the choices' texts; returns the chunks of newly settled
// text (choice, delta, logprobs of its tokens, finish or "").
struct ServerImpl::Delta {
  int64_t choice;
  std::string text, finish;
  Json logprobs;
  Json chat_lp = nullptr;  // chat: {"token", "logprob", "bytes", "top_logprobs"} of the token
};

// A token for chat's logprobs: its text, log-probability and bytes (OpenAI's shape).
Json ServerImpl::chat_token(int32_t id, double logprob) const {
  const std::string t = token_text(id);
  Json bytes = Json::array();
  for (unsigned char b : t) bytes.push_back(static_cast<int>(b));
  return {{"token", t}, {"logprob", logprob}, {"bytes", bytes}};
}

std::vector<ServerImpl::Delta> ServerImpl::fold(Completion& c, std::vector<ChoiceText>& choices,
                                                const CompletionParams& p, const std::vector<std::string>& bases) {
  std::deque<TokenEvent> ev;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    ev.swap(c.events);
  }
  std::vector<Delta> out;
  for (const TokenEvent& e : ev) {
    ChoiceText& ch = choices[static_cast<size_t>(e.choice)];
    if (ch.ended) continue;  // after a stop string: the tokens the scheduler made meanwhile
    Delta d{e.choice, "", "", nullptr};
    if (e.token >= 0 && ch.ids.empty()) ch.cached = e.prompt_cached;
    if (e.token >= 0 && e.token != p.r.eos_id) {
      ch.ids.push_back(e.token);
      if (p.r.top_logprobs > 0) {
        Json top = Json::object();
        for (const auto& [t, lp] : e.top) top[token_text(t)] = lp;
        d.logprobs = {{"tokens", {token_text(e.token)}}, {"token_logprobs", {e.logprob}}, {"top_logprobs", {top}}};
        if (p.chat && p.chat_logprobs) {
          Json alts = Json::array();
          for (const auto& [t, lp] : e.top)
            if (static_cast<int64_t>(alts.size()) < p.chat_top) alts.push_back(chat_token(t, lp));
          d.chat_lp = chat_token(e.token, e.logprob);
          d.chat_lp["top_logprobs"] = alts;
        }
      }
    }
    // full <- the completion's text: decode(prompt + ids) past decode(prompt)
    const auto q = static_cast<size_t>(e.choice / p.r.n);  // its prompt
    const std::string& base = bases[q];
    std::vector<int32_t> all = p.prompts[q];
    all.insert(all.end(), ch.ids.begin(), ch.ids.end());
    std::string full = tok_->decode(all);
    full = full.compare(0, base.size(), base) == 0 ? full.substr(base.size()) : tok_->decode(ch.ids);
    // a stop string ends the choice before it
    size_t cut = std::string::npos;
    for (const std::string& s : p.stop) cut = std::min(cut, full.find(s));
    std::string settled = full;
    if (cut != std::string::npos) {
      settled = full.substr(0, cut);
      ch.ended = true;
      ch.finish = "stop";
      std::lock_guard<std::mutex> lock(c.mu);
      c.cancelled[static_cast<size_t>(e.choice)] = 1;
    } else if (e.last) {
      ch.ended = true;
      ch.finish = e.finish;
    } else {
      // hold back an unfinished character and what may begin a stop string
      while (settled.size() >= 3 && settled.compare(settled.size() - 3, 3, "\xEF\xBF\xBD") == 0)
        settled.resize(settled.size() - 3);
      size_t hold = 0;
      for (const std::string& s : p.stop)
        for (size_t k = std::min(s.size() - 1, settled.size()); k > hold; --k)
          if (settled.compare(settled.size() - k, k, s, 0, k) == 0) {
            hold = k;
            break;
          }
      settled.resize(settled.size() - hold);
      while (!settled.empty() && (static_cast<unsigned char>(settled.back()) & 0xc0) == 0x80 &&
             invalid_utf8_offset(settled) >= 0)
        settled.pop_back();
    }
    if (settled.size() > ch.sent.size() && settled.compare(0, ch.sent.size(), ch.sent) == 0) {
      d.text = settled.substr(ch.sent.size());
      ch.sent = settled;
    }
    if (ch.ended) {
      ch.text = settled;
      d.finish = ch.finish;
    }
    if (!d.text.empty() || !d.finish.empty() || !d.logprobs.is_null()) out.push_back(std::move(d));
  }
  return out;
}

void ServerImpl::completions(const http::Request& req, http::Response& res) {
  run_completion(std::make_shared<CompletionParams>(parse_completion(req.body)), res);
}

// A completion (or chat completion) once its request is read: submitted to the scheduler, then
// answered whole or streamed.
void ServerImpl::run_completion(const std::shared_ptr<CompletionParams>& p, http::Response& res) {
  const int64_t n = p->r.n, N = static_cast<int64_t>(p->prompts.size()) * n;  // choices in all
  auto c = std::make_shared<Completion>(N);
  c->wake = !p->stop.empty() ? Completion::Wake::EachToken
            : p->stream      ? Completion::Wake::Coalesced
                             : Completion::Wake::AtTheEnd;
  auto choices = std::make_shared<std::vector<ChoiceText>>(static_cast<size_t>(N));
  std::vector<std::string> bases;
  for (const auto& q : p->prompts) bases.push_back(tok_->decode(q));
  // echo with logprobs: the prompts' own tokens scored too (one forward pass each, on the
  // scheduler's thread, between decoding steps)
  std::vector<TokenScores> scores;
  if (p->echo && p->r.top_logprobs > 0)
    for (const auto& q : p->prompts) {
      const int64_t top = p->r.top_logprobs;
      try {
        scores.push_back(sched_->run([&q, top](const Model& m) { return score_tokens(m, q, top); }).get());
      } catch (const Error& e) {
        throw HttpError{500, e.what(), "server_error", ""};  // the model's logits, not the request
      }
    }
  if (p->r.max_tokens == 0)  // nothing to generate: every choice ends at once
    for (ChoiceText& ch : *choices) ch.ended = true, ch.finish = "length";
  // each prompt one request to the scheduler, its choices numbered after the earlier prompts';
  // the sinks hold the Completion alive for the scheduler. A prompt refused (a full queue)
  // stops the ones already submitted.
  const std::string cid = (p->chat ? "chatcmpl-" : "cmpl-") + std::to_string(++next_id_);
  for (size_t k = 0; k < p->prompts.size() && p->r.max_tokens > 0; ++k) {
    CompletionRequest r = p->r;
    r.prompt = p->prompts[k];
    r.id = cid;
    const int64_t offset = static_cast<int64_t>(k) * n;
    try {
      sched_->submit(r, [c, offset](const TokenEvent& e) {
        TokenEvent moved = e;
        moved.choice += offset;
        return c->take(moved);
      });
    } catch (...) {
      c->gone = true;
      throw;
    }
  }
  const auto created = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  const auto all_ended = [choices] {
    return std::all_of(choices->begin(), choices->end(), [](const ChoiceText& t) { return t.ended; });
  };
  // echo with logprobs: each prompt's tokens with their scores, the first null (nothing
  // precedes it); a choice's logprobs start with its prompt's
  std::vector<Json> prompt_lp;
  for (size_t k = 0; k < scores.size(); ++k) {
    Json l = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()}};
    for (size_t t = 0; t < p->prompts[k].size(); ++t) {
      l["tokens"].push_back(token_text(p->prompts[k][t]));
      if (t == 0) {
        l["token_logprobs"].push_back(nullptr);
        l["top_logprobs"].push_back(nullptr);
        continue;
      }
      l["token_logprobs"].push_back(scores[k].logprob[t]);
      Json top = Json::object();
      for (const auto& [id, v] : scores[k].top[t]) top[token_text(id)] = v;
      l["top_logprobs"].push_back(top);
    }
    prompt_lp.push_back(std::move(l));
  }
  if (!p->stream) {
    std::vector<Json> lp(static_cast<size_t>(N), Json{{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()}});
    for (int64_t i = 0; i < N && !prompt_lp.empty(); ++i) lp[static_cast<size_t>(i)] = prompt_lp[static_cast<size_t>(i / n)];
    std::vector<Json> chat_lp(static_cast<size_t>(N), Json::array());
    while (!all_ended()) {
      {
        std::unique_lock<std::mutex> lock(c->mu);
        c->cv.wait(lock, [&] { return !c->events.empty(); });
      }
      for (const Delta& d : fold(*c, *choices, *p, bases)) {
        if (!d.logprobs.is_null())
          for (const char* k : {"tokens", "token_logprobs", "top_logprobs"})
            lp[static_cast<size_t>(d.choice)][k].push_back(d.logprobs[k][0]);
        if (!d.chat_lp.is_null()) chat_lp[static_cast<size_t>(d.choice)].push_back(d.chat_lp);
      }
    }
    Json out = {{"id", cid}, {"object", p->chat ? "chat.completion" : "text_completion"}, {"created", created}, {"model", id_}};
    int64_t generated = 0;
    for (int64_t i = 0; i < N; ++i) {
      const ChoiceText& ch = (*choices)[static_cast<size_t>(i)];
      if (ch.finish.rfind("error: ", 0) == 0) throw HttpError{500, ch.finish.substr(7), "server_error", ""};
      generated += static_cast<int64_t>(ch.ids.size());
      if (p->chat) {
        out["choices"].push_back({{"index", i},
                                  {"message", {{"role", "assistant"}, {"content", ch.text}}},
                                  {"logprobs", p->chat_logprobs ? Json{{"content", chat_lp[static_cast<size_t>(i)]}} : Json(nullptr)},
                                  {"finish_reason", ch.finish}});
        continue;
      }
      if (p->r.top_logprobs > 0) {
        // text_offset: where each token starts in the choice's text (with echo, the prompt's
        // start), in characters
        Json& l = lp[static_cast<size_t>(i)];
        int64_t at = p->echo ? 0 : utf8_length(p->prompt_texts[static_cast<size_t>(i / n)]);
        l["text_offset"] = Json::array();
        for (const Json& t : l["tokens"]) {
          l["text_offset"].push_back(at);
          at += utf8_length(t.get<std::string>());
        }
      }
      out["choices"].push_back({{"index", i},
                                {"text", (p->echo ? p->prompt_texts[static_cast<size_t>(i / n)] : std::string()) + ch.text},
                                {"logprobs", p->r.top_logprobs > 0 ? lp[static_cast<size_t>(i)] : Json(nullptr)},
                                {"finish_reason", ch.finish}});
    }
    const int64_t P = p->prompt_tokens();
    ++completions_, prompt_tokens_ += P, generated_tokens_ += generated;
    out["usage"] = usage(*p, *choices, generated);
    res.body = dump(out);
    return;
  }
  // streaming: server-sent events, one chunk per settled piece of text, then [DONE]
  // on this worker thread, after the handler returns; the Completion ends as the stream does
  res.content_type = "text/event-stream";
  // streamed, the prompt's chunk carries its scores and where each token starts
  std::vector<Json> echo_lp = prompt_lp;
  for (Json& l : echo_lp) {
    int64_t at = 0;
    l["text_offset"] = Json::array();
    for (const Json& t : l["tokens"]) {
      l["text_offset"].push_back(at);
      at += utf8_length(t.get<std::string>());
    }
  }
  res.stream = [this, p, c, choices, bases, cid, created, all_ended, n, N, echo_lp](http::ChunkSink& sink) {
        struct End {
          Completion& c;
          ~End() { c.gone = true; }  // however it ended, the scheduler may free the slots
        } end{*c};
        // one choice's event: completions' {"text": ...}; chat's {"delta": ...} (the role first,
        // then content deltas, then an empty delta with the finish reason)
        const auto event = [&](int64_t i, const char* field, const Json& value, const Json& lps,
                               const std::string& finish) {
          Json j = {{"id", cid},
                    {"object", p->chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", id_},
                    {"choices",
                     {{{"index", i},
                       {field, value},
                       {"logprobs", lps},
                       {"finish_reason", finish.empty() ? Json(nullptr) : Json(finish)}}}}};
          if (p->include_usage) j["usage"] = nullptr;
          return sink.write("data: " + dump(j) + "\n\n");
        };
        const auto chunk = [&](int64_t i, const std::string& text, const Json& lps, const std::string& finish) {
          return event(i, "text", text, lps, finish);
        };
        const auto chat_chunk = [&](int64_t i, const Json& delta, const Json& lps, const std::string& finish) {
          return event(i, "delta", delta, lps, finish);
        };
        if (p->chat)
          for (int64_t i = 0; i < N; ++i)
            if (!chat_chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr, "")) return;
        if (p->echo)
          for (int64_t i = 0; i < N; ++i)
            if (!chunk(i, p->prompt_texts[static_cast<size_t>(i / n)],
                       echo_lp.empty() ? Json(nullptr) : echo_lp[static_cast<size_t>(i / n)], ""))
              return;
        while (!all_ended()) {
          {
            std::unique_lock<std::mutex> lock(c->mu);
            c->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return !c->events.empty(); });
          }
          if (!sink.open()) return;  // the client went away
          for (const Delta& d : fold(*c, *choices, *p, bases)) {
            if (!p->chat) {
              if (!chunk(d.choice, d.text, d.logprobs.is_null() ? Json(nullptr) : d.logprobs, d.finish)) return;
              continue;
            }
            if ((!d.text.empty() || !d.chat_lp.is_null()) &&
                !chat_chunk(d.choice, {{"content", d.text}},
                            d.chat_lp.is_null() ? Json(nullptr) : Json{{"content", Json::array({d.chat_lp})}}, ""))
              return;
            if (!d.finish.empty() && !chat_chunk(d.choice, Json::object(), nullptr, d.finish)) return;
          }
        }
        {
          int64_t all = 0;
          for (const ChoiceText& ch : *choices) all += static_cast<int64_t>(ch.ids.size());
          ++completions_, prompt_tokens_ += p->prompt_tokens(), generated_tokens_ += all;
        }
        if (p->include_usage) {
          int64_t generated = 0;
          for (const ChoiceText& ch : *choices) generated += static_cast<int64_t>(ch.ids.size());
          const Json j = {{"id", cid},
                          {"object", p->chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", created},
                          {"model", id_},
                          {"choices", Json::array()},
                          {"usage", usage(*p, *choices, generated)}};
          if (!sink.write("data: " + dump(j) + "\n\n")) return;
        }
        sink.write("data: [DONE]\n\n");
      };
}

// ---- /v1/chat/completions ----------------------------------------------------------------------

// The chat template: --chat-template FILE (an error there stops the server), else the model
// folder's (one that does not parse leaves chat answering that error, the other routes serving).
void ServerImpl::load_chat_template() {
  if (fs::is_directory(o_.model) || is_gguf_file(o_.model)) {
    try {
      if (find_chat_template(o_.model, &chat_source_) && o_.chat_template.empty())
        chat_ = std::make_unique<ChatTemplate>(chat_source_.source, chat_source_.name);
    } catch (const Error& e) {
      if (!o_.chat_template.empty()) throw;
      chat_error_ = std::string("the model's chat template cannot be used: ") + e.what();
      std::fprintf(stderr, "qkv serve: warning: %s (/v1/chat/completions will answer this; --chat-template FILE "
                           "gives another)\n", chat_error_.c_str());
    }
  }
  if (!o_.chat_template.empty()) {
    chat_source_.source = read_file(o_.chat_template, "--chat-template");
    chat_source_.name = o_.chat_template;
    chat_ = std::make_unique<ChatTemplate>(chat_source_.source, chat_source_.name);
  }
  // qkv's own tokenizers name no special tokens in a tokenizer_config.json: their pieces
  const auto add_special = [&](const char* key, int32_t id) {
    for (const auto& [k, v] : chat_source_.special_tokens)
      if (k == key) return;
    if (id >= 0 && id < tok_->vocab_size()) chat_source_.special_tokens.emplace_back(key, tok_->piece(id));
  };
  add_special("bos_token", tok_->bos_id());
  add_special("eos_token", tok_->eos_id());
}

// OpenAI's chat request: the messages become one prompt through the chat template, then it runs
// as a completion whose answer takes chat's shapes.
void ServerImpl::chat_completions(const http::Request& req, http::Response& res) {
  if (!chat_)
    throw HttpError{400,
                    chat_error_.empty() ? "this model has no chat template (no chat_template.jinja and no chat_template "
                                          "in its tokenizer_config.json): start qkv serve with --chat-template FILE, "
                                          "or send the prompt to /v1/completions"
                                        : chat_error_,
                    "invalid_request_error", "messages"};
  check_utf8_body(req.body);
  OJson body;
  try {
    body = OJson::parse(req.body);
  } catch (const OJson::exception& e) {
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) bad("", std::string("the body is JSON ") + body.type_name() + "; expected an object");
  for (const char* k : {"prompt", "echo", "suffix", "best_of"})
    if (body.contains(k)) bad(k, detail::concat("'", k, "' is a /v1/completions field; a chat request sends 'messages'"));
  // messages: [{"role", "content"}, ...]; content a string, null, or a list of text parts (joined)
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    bad("messages", "'messages' is required: a non-empty list of {\"role\", \"content\"} objects");
  if (body["messages"].size() > 4096) bad("messages", detail::concat("'messages' holds ", body["messages"].size(), " messages (at most 4096)"));
  OJson messages = OJson::array();
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    const OJson& m = body["messages"][i];
    const std::string where = detail::concat("messages[", i, "]");
    if (!m.is_object()) bad("messages", where + " is " + m.dump() + "; expected an object with 'role' and 'content'");
    if (!m.contains("role") || !m["role"].is_string() || m["role"].get<std::string>().empty())
      bad("messages", where + ".role must be a non-empty string (system, user, assistant, ...)");
    OJson out = m;
    if (!m.contains("content") || m["content"].is_null()) {
      out["content"] = nullptr;
    } else if (m["content"].is_array()) {
      std::string text;
      for (size_t k = 0; k < m["content"].size(); ++k) {
        const OJson& part = m["content"][k];
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad("messages", detail::concat(where, ".content[", k, "] is not a {\"type\": \"text\", \"text\": ...} part "
                                                               "(this model reads text only)"));
        text += part["text"].get<std::string>();
      }
      out["content"] = text;
    } else if (!m["content"].is_string()) {
      bad("messages", where + ".content is " + m["content"].dump() + "; expected a string, a list of text parts or null");
    }
    messages.push_back(out);
  }
  // what the completion runs on, from the chat's fields
  Json comp = Json::parse(req.body);
  for (const char* k : {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                        "tool_choice", "parallel_tool_calls", "min_p", "store", "metadata", "service_tier"})
    comp.erase(k);
  if (body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()) {
    if (body.contains("max_tokens") && !body["max_tokens"].is_null())
      bad("max_completion_tokens", "send 'max_completion_tokens' or 'max_tokens', not both");
    comp["max_tokens"] = Json::parse(body["max_completion_tokens"].dump());
  }
  bool logprobs = false;
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    if (!body["logprobs"].is_boolean()) bad("logprobs", "'logprobs' is " + body["logprobs"].dump() + "; expected true or false");
    logprobs = body["logprobs"].get<bool>();
  }
  int64_t top = 0;
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
    const OJson& t = body["top_logprobs"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > 20)
      bad("top_logprobs", "'top_logprobs' is " + t.dump() + "; expected a whole number in [0, 20]");
    if (!logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    top = t.get<int64_t>();
  }
  if (logprobs) comp["logprobs"] = std::max<int64_t>(1, top);
  if (body.contains("tools") && !body["tools"].is_null() && !(body["tools"].is_array() && body["tools"].empty()))
    bad("tools", "'tools' is not supported: qkv serve does not parse tool calls from a model's output");
  if (body.contains("tool_choice") && !body["tool_choice"].is_null() && body["tool_choice"] != "none" &&
      body["tool_choice"] != "auto")
    bad("tool_choice", "'tool_choice' is " + body["tool_choice"].dump() + "; without tools only \"none\" or \"auto\"");
  if (body.contains("min_p") && !body["min_p"].is_null() &&
      !(body["min_p"].is_number() && body["min_p"].get<double>() == 0))
    bad("min_p", "'min_p' is not supported (use top_p or top_k); only 0 is accepted");
  // the prompt: the template's text with the generation prompt opened, tokenized as
  // transformers does (special tokens in the text are the tokenizer's added tokens; none added)
  OJson ctx = {{"messages", messages}, {"add_generation_prompt", true}};
  for (const auto& [k, v] : chat_source_.special_tokens) ctx[k] = v;
  std::string text;
  try {
    text = chat_->render(ctx.dump());
  } catch (const Error& e) {
    throw HttpError{400, e.what(), "invalid_request_error", "messages"};
  }
  std::vector<int32_t> ids;
  try {
    ids = tok_->encode(text);
  } catch (const Error& e) {
    throw HttpError{400, std::string("the chat's prompt cannot be tokenized: ") + e.what(), "invalid_request_error", "messages"};
  }
  if (ids.empty()) bad("messages", "the chat template made an empty prompt of these messages");
  comp["prompt"] = ids;
  auto p = std::make_shared<CompletionParams>(parse_completion(comp.dump()));
  p->chat = true;
  p->chat_logprobs = logprobs;
  p->chat_top = top;
  p->prompt_texts[0] = text;
  run_completion(p, res);
}

}  // namespace qkv::serve
