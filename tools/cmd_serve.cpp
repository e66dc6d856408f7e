// qkv serve: a model behind an HTTP API that OpenAI's clients speak.
//
// The transport (src/serve/http_server.h: Boost.Beast on one I/O thread) takes the connections;
// handlers only parse, validate and queue (docs/design.md, "Serving"). One Scheduler thread owns
// the model: completions decode with continuous batching, everything else runs on it as a job
// between steps. Every limit is explicit: header bytes (431), body size (413), deadlines for a
// request's headers and body, connections in all and per client (503), queue length (429),
// max_tokens, context length. /health is answered on the I/O thread, so it answers under load.
// Errors are OpenAI's JSON: {"error": {"message", "type", "param", "code"}}.
#include <arpa/inet.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "commands.h"
#include "qkv/chat_template.h"
#include "qkv/files.h"
#include "qkv/json_constraint.h"
#include "qkv/qkv.h"
#include "qkv/scheduler.h"
#include "qkv/signals.h"
#include "qkv/tokenizer.h"
#include "serve/http_server.h"
#include "task_util.h"
#include "tour.h"

namespace qkv::cli {

extern const unsigned char kExplorerHtml[];  // tools/explorer.html, embedded at build time
extern const size_t kExplorerHtmlSize;

namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;  // keeps keys in order (a chat template sees messages as sent)
namespace fs = std::filesystem;
namespace http = qkv::http;

struct ServeOptions {
  std::string model, host = "127.0.0.1", api_key, dtype;
  std::string chat_template;  // a Jinja2 file for /v1/chat/completions instead of the model's
  std::string embedding_pooling;  // mean, cls or last: overrides the folder's sentence-transformers pooling
  bool embedding_normalize = false;  // L2-normalise embeddings (also when the folder's modules say so)
  bool metrics = false;  // GET /metrics (Prometheus' text format)
  std::vector<std::string> allow_hosts, cors_origins;
  int port = 8080;
  int64_t max_connections = 1024, max_client_connections = 256;
  int64_t slots = 8, max_len = 0, max_queue = 64, max_body = 1 << 20, max_tokens = 1024, max_attention = 4 << 20;
};

// ---------------------------------------------------------------------------------------------
// Errors as OpenAI writes them

struct HttpError {
  int status;
  std::string message, type, param;
  std::string code = "";  // OpenAI's error code ("model_not_found"), or none
};

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw HttpError{400, message, "invalid_request_error", param};
}

// Never throws: text from the request (a path, a field name) may hold any bytes, and invalid
// UTF-8 is replaced by U+FFFD rather than failing the reply.
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

// What the transport answers by itself, in OpenAI's words.
void transport_error(http::Response& res, int status, const std::string& message) {
  const char* type = status == 404 ? "not_found" : status >= 500 ? "server_error" : "invalid_request_error";
  reply_error(res, {status, message, type, ""});
}

// The double whose shortest decimal form is the float's own (0.1f -> 0.1, not 0.10000000149011612):
// JSON that says what float32 computed, in as few digits as that takes.
double short_float(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A JSON body must be UTF-8 (RFC 8259): say so, and where, before the parser does.
void check_utf8_body(const std::string& body) {
  if (const std::string why = utf8_problem(body); !why.empty()) bad("", "the body is not valid UTF-8: " + why);
}

// An address as the host part of a URL: IPv6 in brackets.
std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// A request's JSON object, read field by field; a field nobody read is an error (a typo, or an
// option qkv does not have), as is a wrong type or a value out of range. Each names the field.
class Fields {
 public:
  explicit Fields(const std::string& body) {
    check_utf8_body(body);
    try {
      j_ = Json::parse(body);
    } catch (const Json::exception& e) {
      bad("", std::string("the body is not valid JSON: ") + e.what());
    }
    if (!j_.is_object()) bad("", std::string("the body is JSON ") + j_.type_name() + "; expected an object");
  }
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const Json* get(const char* k) {
    seen_.insert(k);
    return has(k) ? &j_[k] : nullptr;
  }
  int64_t integer(const char* k, int64_t lo, int64_t hi, int64_t fallback) {
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
  double number(const char* k, double lo, double hi, double fallback) {
    const Json* v = get(k);
    if (!v) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo || v->get<double>() > hi)
      bad(k, detail::concat("'", k, "' is ", v->dump(), "; expected a number in [", lo, ", ", hi, "]"));
    return v->get<double>();
  }
  bool boolean(const char* k, bool fallback) {
    const Json* v = get(k);
    if (!v) return fallback;
    if (!v->is_boolean()) bad(k, detail::concat("'", k, "' is ", v->dump(), "; expected true or false"));
    return v->get<bool>();
  }
  // A string, or a list of strings (1 .. most, each non-empty when `nonempty`).
  std::vector<std::string> strings(const char* k, size_t most, bool required, bool nonempty) {
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
  // A list of whole numbers in [lo, hi], each once (absent: empty).
  std::vector<int64_t> integers(const char* k, int64_t lo, int64_t hi) {
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
  void done() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!seen_.count(it.key())) bad(it.key(), detail::concat("unknown field '", it.key(), "'"));
  }

 private:
  Json j_;
  std::set<std::string> seen_;
};

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
};

class Server {
 public:
  explicit Server(const ServeOptions& o) : o_(o), http_(limits(o), transport_error) {
    check(fs::is_directory(o.model) || is_gguf_file(o.model), "--model ", o.model,
          ": neither a model directory nor a GGUF file");
    std::string no_task;
    try {
      info_ = model_task_info(o.model);
    } catch (const Error& e) {
      no_task = e.what();  // a Hugging Face encoder: served for embeddings (below), else the error
    }
    (void)dtype_of(o.dtype);
    // Loaded on a thread of its own that then ends: its OpenMP threads (loading runs parallel
    // regions) end with it, so the scheduler's team is the process's only one. With a second,
    // idle team libgomp counts more threads than cores and its threads stop spinning at barriers
    // almost at once: every parallel region of a decoding step then wakes a sleeping thread
    // (measured: SmolLM-shape Q4_0 decoding in the server at 10 ms a token against 3.75 alone).
    {
      std::exception_ptr failed;
      std::thread loader([&] {
        try {
          model_ = std::make_unique<Model>(load_model(o.model, o.dtype));
        } catch (...) {
          failed = std::current_exception();
        }
      });
      loader.join();
      if (failed) std::rethrow_exception(failed);
    }
    if (!no_task.empty()) {
      const Arch a = model_->config().arch;
      if (a != Arch::Encoder && a != Arch::EncoderMLM) throw Error(no_task);
      // an encoder (BERT, a sentence-transformers folder): /v1/embeddings, /v1/attention, the token
      // routes; its inputs are built as a classifier's ([CLS] ... [SEP])
      encoder_only_ = true;
      info_.task = Task::Classify;
      info_.max_len = model_->config().positional == Positional::Learned ? model_->config().max_len : 0;
    }
    tok_ = load_tokenizer(o.model);
    check(tok_->vocab_size() <= model_->config().vocab_size, "--model ", o.model, ": the tokenizer's vocabulary (",
          tok_->vocab_size(), ") is larger than config.json's vocab_size (", model_->config().vocab_size, ")");
    id_ = fs::path(fs::absolute(o.model)).lexically_normal().filename().string();
    if (id_.empty()) id_ = "model";
    // OpenAI's "created": when the model was written (its directory's or file's modification time)
    struct stat st {};
    if (::stat(o.model.c_str(), &st) == 0) created_ = static_cast<int64_t>(st.st_mtime);
    SchedulerOptions so;
    so.slots = o.slots;
    so.max_queue = o.max_queue;
    const ModelConfig& c = model_->config();
    so.max_len = o.max_len > 0 ? o.max_len : c.positional == Positional::Learned ? c.max_len : 2048;
    sched_ = std::make_unique<Scheduler>(*model_, so);
    load_chat_template();
    load_embedding_setup();
    routes();
  }

  // Binds and serves until stop(); port 0 takes a free port. Prints where it listens, then calls
  // on_listen with the address.
  int run(StopRequest& stop, const std::function<void(const std::string&)>& on_listen = {}) {
    const int port = http_.bind(o_.host, o_.port);
    port_ = port;
    std::fprintf(stderr, "qkv serve: %s (%s, %s, %s weights) on http://%s:%d/  (%lld slots, queue %lld)\n",
                 o_.model.c_str(), task_label(), arch_name(model_->config().arch),
                 wtype_name(model_->weight_type()), o_.host.c_str(), port, static_cast<long long>(o_.slots),
                 static_cast<long long>(o_.max_queue));
    if (const char* wait = std::getenv("QKV_THREADS_WAIT"))
      std::fprintf(stderr, "qkv serve: threads wait %s; OMP_WAIT_POLICY=active chooses spinning\n", wait);
    const std::string url = detail::concat("http://", url_host(o_.host), ":", port, "/");
    std::printf("%s\n", url.c_str());
    std::fflush(stdout);
    if (on_listen) on_listen(url);
    // SIGTERM / SIGINT: stop taking connections (idle and half-sent ones are closed), let the
    // requests in flight finish, then stop
    std::thread watcher([&] {
      while (!stop.requested() && !stopped_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (stopped_) return;
      std::fprintf(stderr, "qkv serve: stopping: finishing %lld requests in flight\n",
                   static_cast<long long>(sched_->waiting() + sched_->decoding()));
      draining_ = true;
      http_.stop_accepting();
      sched_->drain();
      while (http_.handlers_running() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      http_.stop();
    });
    http_.run();
    stopped_ = true;
    watcher.join();
    std::fprintf(stderr, "qkv serve: stopped\n");
    return 0;
  }

 private:
  // Every handler: counted in flight, errors turned into OpenAI's JSON, never an exception out.
  template <class F>
  http::Handler handler(F f) {
    return [this, f](const http::Request& req, http::Response& res) {
      try {
        if (draining_) throw HttpError{503, "the server is shutting down", "server_error", ""};
        f(req, res);
      } catch (const HttpError& e) {
        reply_error(res, e);
      } catch (const QueueFull& e) {
        reply_error(res, {429, e.what(), "rate_limit_exceeded", ""});
      } catch (const Error& e) {
        reply_error(res, {400, e.what(), "invalid_request_error", ""});
      } catch (const std::exception& e) {
        reply_error(res, {500, e.what(), "server_error", ""});
      }
      std::lock_guard<std::mutex> lock(status_mu_);
      ++statuses_[res.status];
    };
  }

  static http::Limits limits(const ServeOptions& o) {
    http::Limits l;
    l.max_body_bytes = o.max_body;
    l.max_connections = o.max_connections;
    l.max_connections_per_client = o.max_client_connections;
    return l;
  }

  // The Host header a request may carry (DNS rebinding: a page on evil.example whose name was
  // pointed at 127.0.0.1 sends Host: evil.example). Allowed: localhost, the bound address,
  // loopback addresses when bound to loopback, any address literal when bound to all
  // interfaces, and the names given by --allow-host. No Host at all (HTTP/1.0) is allowed:
  // browsers always send one.
  bool host_allowed(const std::string* header) const {
    if (!header) return true;
    std::string h = *header;
    // strip the port: "name:8080", "[::1]:8080"
    if (!h.empty() && h[0] == '[') {
      const size_t close = h.find(']');
      if (close == std::string::npos) return false;
      h = h.substr(1, close - 1);
    } else if (const size_t colon = h.rfind(':'); colon != std::string::npos && h.find(':') == colon) {
      h = h.substr(0, colon);
    }
    for (char& ch : h) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (!h.empty() && h.back() == '.') h.pop_back();
    if (h == "localhost" || h == o_.host) return true;
    for (const std::string& a : o_.allow_hosts)
      if (h == a) return true;
    in6_addr a6{};
    in_addr a4{};
    const bool v4 = inet_pton(AF_INET, h.c_str(), &a4) == 1, v6 = inet_pton(AF_INET6, h.c_str(), &a6) == 1;
    if (!v4 && !v6) return false;  // a name nobody vouched for
    const bool wildcard = o_.host == "0.0.0.0" || o_.host == "::" || o_.host.empty();
    const bool loopback = v4 ? (ntohl(a4.s_addr) >> 24) == 127 : IN6_IS_ADDR_LOOPBACK(&a6);
    const bool bound_loopback = o_.host == "localhost" || o_.host.rfind("127.", 0) == 0 || o_.host == "::1";
    return wildcard || (loopback && bound_loopback);
  }

  void need_task(Task t, const char* route) const {
    if (encoder_only_)
      throw HttpError{400,
                      detail::concat(route, " needs a ", task_name(t), " model; this one is an encoder, served for "
                                     "/v1/embeddings, /v1/attention and the token routes"),
                      "invalid_request_error", ""};
    if (info_.task != t)
      throw HttpError{400,
                      detail::concat(route, " needs a ", task_name(t), " model; this one is a ", task_label(),
                                     " model"),
                      "invalid_request_error", ""};
  }

  void routes() {
    http_.set_cors_origins(o_.cors_origins);
    http_.set_guard([this](const http::Request& req, http::Response& res) {
      if (!host_allowed(req.header("Host"))) {
        reply_error(res, {403,
                          "Host '" + *req.header("Host") +
                              "' is not a name of this server (qkv serve --allow-host NAME adds one)",
                          "permission_error", ""});
        return true;
      }
      // the page itself and the health check are open; the page sends the key on its requests
      if (o_.api_key.empty() || req.path == "/health" || (req.path == "/" && req.method == "GET")) return false;
      if (const std::string* a = req.header("Authorization"); a && *a == "Bearer " + o_.api_key) return false;
      reply_error(res, {401, "missing or wrong API key (send 'Authorization: Bearer KEY')", "authentication_error", ""});
      return true;
    });
    // answered on the I/O thread: never waits on the model
    http_.route("GET", "/health", handler([this](const http::Request&, http::Response& res) {
      const Json j = {{"status", draining_ ? "stopping" : "ok"}, {"model", id_}, {"task", task_label()},
                      {"waiting", sched_->waiting()}, {"decoding", sched_->decoding()}};
      res.body = dump(j);
    }), true);
    http_.route("GET", "/v1/models", handler([this](const http::Request&, http::Response& res) {
      const Json j = {{"object", "list"}, {"data", {model_object()}}};
      res.body = dump(j);
    }), true);
    if (o_.metrics)
      http_.route("GET", "/metrics", handler([this](const http::Request&, http::Response& res) {
        res.content_type = "text/plain; version=0.0.4; charset=utf-8";
        res.body = metrics_text();
      }), true);
    // models.retrieve(id): the one served model, or OpenAI's 404
    http_.route_prefix("GET", "/v1/models/", handler([this](const http::Request& req, http::Response& res) {
      const std::string id = req.path.substr(std::string("/v1/models/").size());
      if (id != id_)
        throw HttpError{404, "The model '" + id + "' does not exist; this server serves '" + id_ + "'",
                        "invalid_request_error", "model", "model_not_found"};
      res.body = dump(model_object());
    }), true);
    http_.route("GET", "/", handler([](const http::Request&, http::Response& res) {
      res.body.assign(reinterpret_cast<const char*>(kExplorerHtml), kExplorerHtmlSize);
      res.content_type = "text/html; charset=utf-8";
      res.headers.emplace_back("Content-Security-Policy",
                               "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src data:");
    }), true);
    http_.route("GET", "/v1/model", handler([this](const http::Request&, http::Response& res) {
      res.body = dump(model_json());
    }), true);
    http_.route("POST", "/v1/attend", handler([](const http::Request& req, http::Response& res) {
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
    }));
    http_.route("GET", "/v1/claims", handler([this](const http::Request& req, http::Response& res) {
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
    }));
    http_.route("POST", "/v1/completions", handler([this](const http::Request& req, http::Response& res) {
      need_task(Task::LanguageModel, "/v1/completions");
      completions(req, res);
    }));
    http_.route("POST", "/v1/chat/completions", handler([this](const http::Request& req, http::Response& res) {
      need_task(Task::LanguageModel, "/v1/chat/completions");
      chat_completions(req, res);
    }));
    http_.route("POST", "/v1/embeddings", handler([this](const http::Request& req, http::Response& res) {
      embeddings(req, res);
    }));
    http_.route("POST", "/v1/next-token", handler([this](const http::Request& req, http::Response& res) {
      need_task(Task::LanguageModel, "/v1/next-token");
      next_token(req, res);
    }));
    http_.route("POST", "/v1/attention", handler([this](const http::Request& req, http::Response& res) {
      attention(req, res);
    }));
    http_.route("POST", "/v1/translations", handler([this](const http::Request& req, http::Response& res) {
      need_task(Task::Translate, "/v1/translations");
      translations(req, res);
    }));
    // llama.cpp's token routes (any model)
    http_.route("POST", "/tokenize", handler([this](const http::Request& req, http::Response& res) {
      tokenize(req, res);
    }));
    http_.route("POST", "/detokenize", handler([this](const http::Request& req, http::Response& res) {
      detokenize(req, res);
    }));
    http_.route("POST", "/v1/classifications", handler([this](const http::Request& req, http::Response& res) {
      need_task(Task::Classify, "/v1/classifications");
      classifications(req, res);
    }));
  }

  // GET /metrics: Prometheus' text exposition format, counters since the start and gauges now.
  std::string metrics_text() {
    std::string out;
    const auto one = [&](const char* name, const char* type, const char* help, int64_t v) {
      out += detail::concat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", v, "\n");
    };
    one("qkv_completions_total", "counter", "Completion requests answered (a batch of prompts counts once).",
        completions_.load());
    one("qkv_prompt_tokens_total", "counter", "Prompt tokens of the completions answered.", prompt_tokens_.load());
    one("qkv_generated_tokens_total", "counter", "Tokens generated for the completions answered.",
        generated_tokens_.load());
    one("qkv_requests_waiting", "gauge", "Sequences queued for a decoding slot.", sched_->waiting());
    one("qkv_sequences_decoding", "gauge", "Sequences being decoded.", sched_->decoding());
    one("qkv_slots", "gauge", "Sequences decoded together at most (--slots).", o_.slots);
    out += "# HELP qkv_http_responses_total Answers of the API's routes, by status code.\n"
           "# TYPE qkv_http_responses_total counter\n";
    std::lock_guard<std::mutex> lock(status_mu_);
    for (const auto& [code, n] : statuses_) out += detail::concat("qkv_http_responses_total{code=\"", code, "\"} ", n, "\n");
    return out;
  }

  // The served model as OpenAI's model object (and qkv's task).
  Json model_object() const {
    return {{"id", id_}, {"object", "model"}, {"created", created_}, {"owned_by", "qkv"}, {"task", task_label()}};
  }

  // What the explorer page needs to know of the model.
  Json model_json() const {
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

  // ---- /v1/completions --------------------------------------------------------------------------

  struct CompletionParams {
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

  CompletionParams parse_completion(const std::string& body) {
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
  std::shared_ptr<const TokenConstraint> output_constraint(const Json& rf) {
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
  std::shared_ptr<const TokenTrie> token_trie() {
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
  static int64_t utf8_length(const std::string& s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  // A token as text for logprobs: the bytes it adds to the text (Tokenizer::token_bytes: a
  // SentencePiece word start keeps its space, so a choice's tokens concatenate to its text), its
  // piece for a special token such as </s>, or "<id N>" for a row of the model's table the
  // tokenizer lacks. (Bytes that are part of a character read U+FFFD in the JSON.)
  std::string token_text(int32_t id) const {
    if (id >= tok_->vocab_size()) return "<id " + std::to_string(id) + ">";
    return tok_->token_bytes(id);
  }

  // Folds the events waiting in `c` into the choices' texts; returns the chunks of newly settled
  // text (choice, delta, logprobs of its tokens, finish or "").
  struct Delta {
    int64_t choice;
    std::string text, finish;
    Json logprobs;
    Json chat_lp = nullptr;  // chat: {"token", "logprob", "bytes", "top_logprobs"} of the token
  };

  // A token for chat's logprobs: its text, log-probability and bytes (OpenAI's shape).
  Json chat_token(int32_t id, double logprob) const {
    const std::string t = token_text(id);
    Json bytes = Json::array();
    for (unsigned char b : t) bytes.push_back(static_cast<int>(b));
    return {{"token", t}, {"logprob", logprob}, {"bytes", bytes}};
  }
  std::vector<Delta> fold(Completion& c, std::vector<ChoiceText>& choices, const CompletionParams& p,
                          const std::vector<std::string>& bases) {
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

  void completions(const http::Request& req, http::Response& res) {
    run_completion(std::make_shared<CompletionParams>(parse_completion(req.body)), res);
  }

  // A completion (or chat completion) once its request is read: submitted to the scheduler, then
  // answered whole or streamed.
  void run_completion(const std::shared_ptr<CompletionParams>& p, http::Response& res) {
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
    for (size_t k = 0; k < p->prompts.size() && p->r.max_tokens > 0; ++k) {
      CompletionRequest r = p->r;
      r.prompt = p->prompts[k];
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
    const std::string cid = (p->chat ? "chatcmpl-" : "cmpl-") + std::to_string(++next_id_);
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
      out["usage"] = {{"prompt_tokens", P}, {"completion_tokens", generated}, {"total_tokens", P + generated}};
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
            const int64_t P = p->prompt_tokens();
            const Json j = {{"id", cid},
                            {"object", p->chat ? "chat.completion.chunk" : "text_completion"},
                            {"created", created},
                            {"model", id_},
                            {"choices", Json::array()},
                            {"usage", {{"prompt_tokens", P}, {"completion_tokens", generated}, {"total_tokens", P + generated}}}};
            if (!sink.write("data: " + dump(j) + "\n\n")) return;
          }
          sink.write("data: [DONE]\n\n");
        };
  }

  // ---- /v1/chat/completions ----------------------------------------------------------------------

  // The chat template: --chat-template FILE (an error there stops the server), else the model
  // folder's (one that does not parse leaves chat answering that error, the other routes serving).
  void load_chat_template() {
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
  void chat_completions(const http::Request& req, http::Response& res) {
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

  // ---- /v1/embeddings -----------------------------------------------------------------------------

  // How texts become vectors: the pooling of the final hidden states, and whether they are
  // normalised. A sentence-transformers folder says both (modules.json: a Pooling module's
  // config.json, a Normalize module); --embedding-pooling and --embedding-normalize override.
  void load_embedding_setup() {
    pooling_ = "mean";
    normalize_ = o_.embedding_normalize;
    if (fs::is_directory(o_.model)) {
      std::string pooling_dir;
      const fs::path modules = fs::path(o_.model) / "modules.json";
      if (fs::is_regular_file(modules)) {
        Json m;
        try {
          m = Json::parse(read_file(modules.string(), "modules.json"));
        } catch (const Json::exception& e) {
          fail(modules.string(), ": not valid JSON (", e.what(), ")");
        }
        check(m.is_array(), modules.string(), ": expected a list of modules");
        for (const Json& e : m) {
          if (!e.is_object() || !e.contains("type") || !e["type"].is_string()) continue;
          const std::string type = e["type"].get<std::string>();
          if (type == "sentence_transformers.models.Normalize") normalize_ = true;
          if (type == "sentence_transformers.models.Pooling" && e.contains("path") && e["path"].is_string())
            pooling_dir = e["path"].get<std::string>();
        }
        check(pooling_dir.find("..") == std::string::npos && (pooling_dir.empty() || pooling_dir[0] != '/'),
              modules.string(), ": the Pooling module's path '", pooling_dir, "' leaves the model folder");
      } else if (fs::is_regular_file(fs::path(o_.model) / "1_Pooling" / "config.json")) {
        pooling_dir = "1_Pooling";
      }
      if (!pooling_dir.empty()) {
        const fs::path cfg = fs::path(o_.model) / pooling_dir / "config.json";
        Json c;
        try {
          c = Json::parse(read_file(cfg.string(), "the pooling config"));
        } catch (const Json::exception& e) {
          fail(cfg.string(), ": not valid JSON (", e.what(), ")");
        }
        check(c.is_object(), cfg.string(), ": expected an object");
        std::vector<std::string> modes;
        for (const auto& [key, name] : {std::pair<const char*, const char*>{"pooling_mode_mean_tokens", "mean"},
                                        {"pooling_mode_cls_token", "cls"}, {"pooling_mode_lasttoken", "last"},
                                        {"pooling_mode_max_tokens", "max"}, {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"},
                                        {"pooling_mode_weightedmean_tokens", "weightedmean"}})
          if (c.contains(key) && c[key] == true) modes.push_back(name);
        if (modes.size() == 1 && (modes[0] == "mean" || modes[0] == "cls" || modes[0] == "last")) {
          pooling_ = modes[0];
          pooling_from_ = cfg.string();
        } else if (o_.embedding_pooling.empty()) {
          std::string list;
          for (const std::string& m : modes) list += (list.empty() ? "" : ", ") + m;
          embedding_error_ = detail::concat(cfg.string(), " asks for pooling '", list.empty() ? "none" : list,
                                            "'; qkv pools by one of mean, cls, last (--embedding-pooling)");
        }
      }
    }
    if (!o_.embedding_pooling.empty()) pooling_ = o_.embedding_pooling, pooling_from_ = "--embedding-pooling";
  }

  // OpenAI's embeddings: {"input": a string, a list of strings, a list of token ids or a list of
  // those; "encoding_format": "float" | "base64"; "dimensions": the model's only} -> one vector per
  // input, each computed alone (so the same whatever else was sent with it).
  void embeddings(const http::Request& req, http::Response& res) {
    if (model_->config().arch == Arch::EncoderDecoder)
      bad("input", "/v1/embeddings needs a decoder or encoder model; this one is encoder-decoder (a translator)");
    if (!embedding_error_.empty()) throw HttpError{400, embedding_error_, "invalid_request_error", "input"};
    Fields f(req.body);
    if (const Json* m = f.get("model"); m && !m->is_string()) bad("model", "'model' must be a string");
    f.get("user");
    const Json* in = f.get("input");
    const Json* ef = f.get("encoding_format");
    const std::string format = ef && ef->is_string() ? ef->get<std::string>() : ef ? ef->dump() : "float";
    if (format != "float" && format != "base64")
      bad("encoding_format", "'encoding_format' is " + (ef ? ef->dump() : format) + "; expected \"float\" or \"base64\"");
    const int64_t D = model_->config().d_model;
    const int64_t dims = f.integer("dimensions", 1, 1 << 20, D);
    if (dims != D)
      bad("dimensions", detail::concat("'dimensions' is ", dims, "; this model's embeddings have ", D,
                                       " dimensions and it cannot give fewer"));
    f.done();
    if (!in) bad("input", "'input' is required: a string, a list of strings, or token ids");
    constexpr size_t kMaxInputs = 256;
    std::vector<std::vector<int32_t>> inputs;
    const auto ids_of = [&](const Json& list, const std::string& where) {
      std::vector<int32_t> ids;
      for (const Json& t : list) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok_->vocab_size())
          bad("input", detail::concat(where, " holds ", t.dump(), "; token ids are in [0, ", tok_->vocab_size(), ")"));
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      return ids;
    };
    const auto add_text = [&](const Json& t, const std::string& where) {
      const std::string text = t.get<std::string>();
      if (const std::string why = utf8_problem(text); !why.empty()) bad("input", where + ": " + why);
      inputs.push_back(encode_input(*tok_, text));
    };
    if (in->is_string()) {
      add_text(*in, "'input'");
    } else if (in->is_array() && !in->empty() && in->front().is_number()) {
      inputs.push_back(ids_of(*in, "'input'"));
    } else if (in->is_array() && !in->empty() && in->size() <= kMaxInputs) {
      for (size_t k = 0; k < in->size(); ++k) {
        const Json& e = (*in)[k];
        const std::string where = detail::concat("'input'[", k, "]");
        if (e.is_string()) add_text(e, where);
        else if (e.is_array()) inputs.push_back(ids_of(e, where));
        else bad("input", where + " is " + e.dump() + "; expected a string or a list of token ids");
      }
    } else {
      bad("input", detail::concat("'input' must be a string, a list of token ids, or a list of 1 to ", kMaxInputs,
                                  " strings or lists of token ids"));
    }
    const int64_t context = sched_->options().max_len;
    int64_t tokens = 0;
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k].empty()) bad("input", detail::concat("input ", k, " has no tokens"));
      if (static_cast<int64_t>(inputs[k].size()) > context)
        bad("input", detail::concat("input ", k, " is ", inputs[k].size(), " tokens; the model reads at most ", context));
      tokens += static_cast<int64_t>(inputs[k].size());
    }
    // e <- pool(hidden states of the input alone); e <- e / max(|e|, 1e-12) when normalising
    const std::string pooling = pooling_;
    const bool normalize = normalize_;
    std::vector<std::vector<float>> vecs;
    try {
      vecs = sched_->run([&inputs, &pooling, normalize, D](const Model& m) {
        std::vector<std::vector<float>> out;
        for (const auto& ids : inputs) {
          Tensor t({1, static_cast<int64_t>(ids.size())}, DType::I64);
          std::copy(ids.begin(), ids.end(), t.data<int64_t>());
          Tape tape;
          tape.recording = false;
          const Tensor h = m.hidden_states(tape, t)->value.contiguous();  // (1, T, D)
          const auto T = static_cast<int64_t>(ids.size());
          const float* x = h.data<float>();
          std::vector<double> e(static_cast<size_t>(D), 0.0);
          if (pooling == "mean") {
            for (int64_t i = 0; i < T; ++i)
              for (int64_t d = 0; d < D; ++d) e[d] += x[i * D + d];
            for (double& v : e) v /= static_cast<double>(T);
          } else {
            const int64_t row = pooling == "cls" ? 0 : T - 1;
            for (int64_t d = 0; d < D; ++d) e[d] = x[row * D + d];
          }
          double norm = 0;
          for (double v : e) norm += v * v;
          norm = std::sqrt(norm);
          std::vector<float> v(static_cast<size_t>(D));
          for (int64_t d = 0; d < D; ++d) {
            check(std::isfinite(e[d]), "the model's hidden states are not finite");
            v[d] = static_cast<float>(normalize ? e[d] / std::max(norm, 1e-12) : e[d]);
          }
          out.push_back(std::move(v));
        }
        return out;
      }).get();
    } catch (const Error& e) {
      throw HttpError{500, e.what(), "server_error", ""};
    }
    Json data = Json::array();
    for (size_t k = 0; k < vecs.size(); ++k) {
      Json emb;
      if (format == "float") {
        emb = Json::array();
        for (float v : vecs[k]) emb.push_back(v);
      } else {
        // the float32 values' little-endian bytes, base64 (OpenAI's)
        std::string bytes(vecs[k].size() * 4, '\0');
        for (size_t i = 0; i < vecs[k].size(); ++i) {
          uint32_t u;
          std::memcpy(&u, &vecs[k][i], 4);
          for (int b = 0; b < 4; ++b) bytes[4 * i + static_cast<size_t>(b)] = static_cast<char>((u >> (8 * b)) & 0xff);
        }
        emb = base64(bytes);
      }
      data.push_back({{"object", "embedding"}, {"index", k}, {"embedding", emb}});
    }
    res.body = dump({{"object", "list"},
                     {"data", data},
                     {"model", id_},
                     {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
  }

  static std::string base64(const std::string& in) {
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
      const uint32_t v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                         static_cast<unsigned char>(in[i + 2]);
      out += k[(v >> 18) & 63], out += k[(v >> 12) & 63], out += k[(v >> 6) & 63], out += k[v & 63];
    }
    if (i + 1 == in.size()) {
      const uint32_t v = static_cast<unsigned char>(in[i]) << 16;
      out += k[(v >> 18) & 63], out += k[(v >> 12) & 63], out += "==";
    } else if (i + 2 == in.size()) {
      const uint32_t v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8);
      out += k[(v >> 18) & 63], out += k[(v >> 12) & 63], out += k[(v >> 6) & 63], out += '=';
    }
    return out;
  }

  // ---- /tokenize, /detokenize (llama.cpp's) -------------------------------------------------------

  // {"content": text, "add_special": false, "with_pieces": false} -> {"tokens": [id, ...]}, or with
  // pieces [{"id", "piece"}]: the bytes the token adds to a text (Tokenizer::token_bytes), a string
  // when they are whole UTF-8 characters, else the list of byte values.
  void tokenize(const http::Request& req, http::Response& res) {
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
  void detokenize(const http::Request& req, http::Response& res) {
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

  void next_token(const http::Request& req, http::Response& res) {
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

  // ---- /v1/attention ------------------------------------------------------------------------------

  // Every (or the chosen) layer's and head's weights on a text: one forward pass on the scheduler
  // thread keeps each module's queries, keys and logsumexp (qkv/inspect.h); the weights are then
  // recomputed here, head by head in blocks of rows, never all heads' matrices at once.
  void attention(const http::Request& req, http::Response& res) {
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
    Batch b;
    std::vector<int32_t> src, ids;
    if (encdec) {
      src = tok_->encode(source);
      if (src.empty()) bad("source", "'source' has no tokens");
      src = source_ids(*tok_, std::move(src));
      ids.push_back(static_cast<int32_t>(c.bos_id));
      for (int32_t t : tok_->encode(text)) ids.push_back(t);
    } else if (info_.task == Task::Classify) {
      ids = classifier_ids(*tok_, text, info_.max_len);
    } else {
      ids = prompt_ids(*tok_, text);
    }
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
    const auto to_tensor = [](const std::vector<int32_t>& v) {
      Tensor t({1, static_cast<int64_t>(v.size())}, DType::I64);
      std::copy(v.begin(), v.end(), t.data<int64_t>());
      return t;
    };
    if (encdec) {
      b.input = to_tensor(src);
      b.decoder_input = to_tensor(ids);
    } else {
      b.input = to_tensor(ids);
    }
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

  // ---- /v1/translations, /v1/classifications ---------------------------------------------------------

  void translations(const http::Request& req, http::Response& res) {
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
  void stream_translations(const std::vector<std::string>& texts, const std::vector<size_t>& rows,
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

  struct TranslationItem {
    std::vector<int32_t> src;
    std::vector<int32_t> prefix;  // the target prefix, forced (may be empty)
    GenerateConfig g;
    std::promise<std::vector<Generation>> done;  // its num_return hypotheses, best first
  };

  // On the scheduler thread: every waiting translation, in batches of equal settings.
  void flush_translations(const Model& m) {
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

  void classifications(const http::Request& req, http::Response& res) {
    Fields f(req.body);
    const std::vector<std::string> texts = f.strings("text", 256, true, false);
    f.done();
    std::vector<std::vector<int32_t>> rows;
    for (const std::string& t : texts) rows.push_back(classifier_ids(*tok_, t, info_.max_len));
    const std::vector<std::vector<float>> z = sched_->run([&rows](const Model& m) {
      std::vector<std::vector<float>> out;
      for (const auto& ids : rows) {
        const Tensor l = logits_of(m, ids);
        out.emplace_back(l.data<float>(), l.data<float>() + l.numel());
      }
      return out;
    }).get();
    Json results = Json::array();
    for (const auto& row : z) {
      double mx = -INFINITY, sum = 0;
      for (float v : row) {
        if (!std::isfinite(v)) throw HttpError{500, "the model's logits are not finite", "server_error", ""};
        mx = std::max(mx, static_cast<double>(v));
      }
      for (float v : row) sum += std::exp(static_cast<double>(v) - mx);
      Json probs = Json::object();
      size_t best = 0;
      for (size_t k = 0; k < row.size(); ++k) {
        probs[info_.labels.at(k)] = std::exp(static_cast<double>(row[k]) - mx) / sum;
        if (row[k] > row[best]) best = k;
      }
      results.push_back({{"label", info_.labels.at(best)}, {"prob", probs[info_.labels.at(best)]}, {"probs", probs}});
    }
    res.body = dump({{"model", id_}, {"classifications", results}});
  }

  ServeOptions o_;
  TaskInfo info_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::string id_;
  int64_t created_ = 0;  // the model's modification time, seconds since 1970
  std::unique_ptr<Scheduler> sched_;
  http::Server http_;
  int port_ = 0;
  std::atomic<bool> draining_{false}, stopped_{false};
  std::atomic<int64_t> next_id_{0};
  // --metrics: counters since the start
  std::atomic<int64_t> prompt_tokens_{0}, generated_tokens_{0}, completions_{0};
  std::mutex status_mu_;
  std::map<int, int64_t> statuses_;  // the routes' answers by status code
  ChatTemplateSource chat_source_;     // the chat template's text and special tokens
  std::unique_ptr<ChatTemplate> chat_;  // null: no template (chat_error_ says why, when one failed)
  std::string chat_error_;
  std::mutex trie_mu_;
  std::shared_ptr<const TokenTrie> trie_;  // the vocabulary for structured output, built on first use
  std::string pooling_ = "mean", pooling_from_;  // /v1/embeddings: mean, cls or last, and who said so
  bool normalize_ = false;
  std::string embedding_error_;  // a folder's pooling qkv does not do
  bool encoder_only_ = false;    // a Hugging Face encoder: embeddings and attention, no task route
  const char* task_label() const { return encoder_only_ ? "embeddings" : task_name(info_.task); }
  std::mutex tr_mu_;
  std::vector<std::shared_ptr<TranslationItem>> tr_pending_;
};

}  // namespace

namespace {

// The options qkv serve and qkv explore share.
void serve_options(CLI::App* c, ServeOptions* o) {
  c->add_option("--model", o->model, "Model directory (qkv's, or a Hugging Face folder)")->required();
  c->add_option("--dtype", o->dtype, kDtypeHelp);
  c->add_option("--host", o->host, "Address to listen on (default 127.0.0.1: this machine only)");
  c->add_option("--port", o->port, "Port (default 8080; 0: a free port, printed on standard output)")
      ->transform(whole(0, 65535));
  c->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  c->add_option("--chat-template", o->chat_template,
                "A Jinja2 chat template file for /v1/chat/completions (default: the model folder's "
                "chat_template.jinja or tokenizer_config.json's chat_template)");
  c->add_option("--embedding-pooling", o->embedding_pooling,
                "How /v1/embeddings pools a text's final hidden states: mean, cls (the first token) or last (the "
                "last token). Default: the folder's sentence-transformers 1_Pooling/config.json, else mean")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  c->add_flag("--embedding-normalize", o->embedding_normalize,
              "L2-normalise /v1/embeddings' vectors (also done when the folder's modules.json has a Normalize "
              "module)");
  c->add_flag("--metrics", o->metrics,
              "Serve GET /metrics: request, token and queue counters in Prometheus' text format (with --api-key it "
              "needs the key too)");
  c->add_option("--allow-host", o->allow_hosts,
                "A name clients may reach the server by (the Host header; repeatable). Always allowed: localhost "
                "and the --host address; others are refused with 403 (DNS rebinding)");
  c->add_option("--cors-origin", o->cors_origins,
                "An origin whose web pages may call this server from a browser (CORS; repeatable), as browsers "
                "send it: scheme://host[:port], e.g. http://localhost:3000; * allows any. Default: none")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "*") return "";
            const size_t sep = v.find("://");
            const std::string scheme = sep == std::string::npos ? "" : v.substr(0, sep);
            const std::string rest = sep == std::string::npos ? "" : v.substr(sep + 3);
            const bool ok = (scheme == "http" || scheme == "https") && !rest.empty() &&
                            rest.find_first_of("/?#@ \t\r\n") == std::string::npos && rest.back() != ':';
            return ok ? "" : "'" + v + "' is not an origin; expected scheme://host[:port] (http or https, no path) or *";
          },
          "ORIGIN"));
  c->add_option("--max-connections", o->max_connections,
                "Connections open at once at most; more are answered 503 and closed (default 1024)")
      ->transform(whole(1, 1 << 20));
  c->add_option("--max-client-connections", o->max_client_connections,
                "Connections from one address at most (default 256)")
      ->transform(whole(1, 1 << 20));
  c->add_option("--slots", o->slots,
                "Sequences decoded together (continuous batching), and sentences per translation batch (default 8)")
      ->transform(whole(1, 64));
  c->add_option("--max-len", o->max_len, "Context: prompt + completion tokens at most (default: the model's)")
      ->transform(whole(2, 1 << 20));
  c->add_option("--max-queue", o->max_queue, "Requests waiting at most; more get 429 (default 64)")
      ->transform(whole(1, 1 << 20));
  c->add_option("--max-body", o->max_body, "Request body bytes at most; more get 413 (default 1 MiB)")
      ->transform(whole(64, int64_t{1} << 30));
  c->add_option("--max-tokens", o->max_tokens, "max_tokens a request may ask for (default 1024)")
      ->transform(whole(1, 1 << 20));
  c->add_option("--max-attention", o->max_attention,
                "Attention weights one /v1/attention answer may hold (default 4194304)")
      ->transform(whole(1, int64_t{1} << 30));
}

// Opens url in the desktop's browser when there is a desktop (xdg-open), without a shell.
void open_browser(const std::string& url) {
  const char* display = std::getenv("DISPLAY");
  const char* wayland = std::getenv("WAYLAND_DISPLAY");
  if ((!display || !*display) && (!wayland || !*wayland)) {
    std::fprintf(stderr, "qkv explore: no desktop here: open %s in a browser (from another machine: forward the "
                 "port with ssh -L)\n", url.c_str());
    return;
  }
  const std::string arg = url;
  char* argv[] = {const_cast<char*>("xdg-open"), const_cast<char*>(arg.c_str()), nullptr};
  pid_t pid = 0;
  if (posix_spawnp(&pid, "xdg-open", nullptr, nullptr, argv, environ) != 0)
    std::fprintf(stderr, "qkv explore: could not start xdg-open: open %s in a browser\n", url.c_str());
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* c = app.add_subcommand(
      "serve", "Serve a model over HTTP: OpenAI-style /v1/completions and /v1/chat/completions (streaming), /v1/translations, "
               "/v1/classifications, /v1/next-token, /v1/attention, /health; the explorer page at /");
  serve_options(c, o.get());
  return [o] {
    StopRequest stop;
    Server server(*o);
    return server.run(stop);
  };
}

Runner add_explore(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto no_open = std::make_shared<bool>(false);
  CLI::App* c = app.add_subcommand(
      "explore", "Open the explorer page on a model: the worked example, every layer and head's attention on your "
                 "text, the next token, the chapter's claims (qkv serve, then a browser at its address)");
  serve_options(c, o.get());
  c->add_flag("--no-open", *no_open, "Only print the address; do not start a browser");
  return [o, no_open] {
    StopRequest stop;
    Server server(*o);
    return server.run(stop, [no_open](const std::string& url) {
      std::fprintf(stderr, "qkv explore: the explorer is at %s (Ctrl-C stops it)\n", url.c_str());
      if (!*no_open) open_browser(url);
    });
  };
}

}  // namespace qkv::cli
