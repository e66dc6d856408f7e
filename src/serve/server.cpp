// qkv::Server (qkv/server.h): loading the model, the route table, the checks every request passes
// (Host, API key, CORS), the cheap routes answered on the I/O thread (/health, /v1/models,
// /metrics), and run(). The routes themselves are in routes_*.cpp (serve/server_impl.h lists them).
#include <arpa/inet.h>
#include <sys/stat.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <thread>

#include "models/model_dir.h"
#include "qkv/error.h"
#include "qkv/gguf.h"
#include "serve/server_impl.h"

namespace qkv::serve {

namespace fs = std::filesystem;

namespace {

// An address as the host part of a URL: IPv6 in brackets.
std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

}  // namespace

ServerImpl::ServerImpl(const ServerOptions& o) : o_(o), http_(limits(o), transport_error) {
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
  check(o.prompt_cache_mib >= 0 && o.prompt_cache_mib <= (int64_t{1} << 30), "--prompt-cache ", o.prompt_cache_mib,
        " (expected 0 .. 2^30 MiB)");
  so.prompt_cache_bytes = o.prompt_cache_mib << 20;
  so.prompt_chunk = o.prompt_cache_mib > 0 ? o.prompt_chunk : 0;
  sched_ = std::make_unique<Scheduler>(*model_, so);
  load_chat_template();
  load_embedding_setup();
  routes();
}

// Binds and serves until `stop` is set; port 0 takes a free port. Says where it listens, then calls
// on_listen with the address (qkv serve prints it on standard output).
int ServerImpl::run(const std::atomic<bool>& stop, const std::function<void(const std::string&)>& on_listen) {
  const int port = http_.bind(o_.host, o_.port);
  std::fprintf(stderr, "qkv serve: %s (%s, %s, %s weights) on http://%s:%d/  (%lld slots, queue %lld)\n",
               o_.model.c_str(), task_label(), arch_name(model_->config().arch),
               wtype_name(model_->weight_type()), o_.host.c_str(), port, static_cast<long long>(o_.slots),
               static_cast<long long>(o_.max_queue));
  if (const char* wait = std::getenv("QKV_THREADS_WAIT"))
    std::fprintf(stderr, "qkv serve: threads wait %s; OMP_WAIT_POLICY=active chooses spinning\n", wait);
  const std::string url = detail::concat("http://", url_host(o_.host), ":", port, "/");
  if (on_listen) on_listen(url);
  // `stop` (qkv serve: SIGTERM / SIGINT): stop taking connections (idle and half-sent ones are
  // closed), let the requests in flight finish, then stop
  std::thread watcher([&] {
    while (!stop.load() && !stopped_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
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

// Every handler: counted in flight, errors turned into OpenAI's JSON, never an exception out.
template <class F>
http::Handler ServerImpl::handler(std::string route, F f) {
  return [this, route, f](const http::Request& req, http::Response& res) {
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
    ++statuses_[{route, res.status}];
  };
}

// A route through handler(), named by its path in /metrics; quick ones are answered on the I/O
// thread. A path ending in '/' takes every path under it.
template <class F>
void ServerImpl::route(const char* method, const std::string& path, F f, bool quick) {
  if (path.size() > 1 && path.back() == '/')
    http_.route_prefix(method, path, handler(path + "{id}", std::move(f)), quick);
  else
    http_.route(method, path, handler(path, std::move(f)), quick);
}

http::Limits ServerImpl::limits(const ServerOptions& o) {
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
bool ServerImpl::host_allowed(const std::string* header) const {
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

void ServerImpl::need_task(Task t, const char* route) const {
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

void ServerImpl::routes() {
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
  route("GET", "/health", [this](const http::Request&, http::Response& res) {
    const Json j = {{"status", draining_ ? "stopping" : "ok"}, {"model", id_}, {"task", task_label()},
                    {"waiting", sched_->waiting()}, {"decoding", sched_->decoding()}};
    res.body = dump(j);
  }, true);
  route("GET", "/v1/models", [this](const http::Request&, http::Response& res) {
    const Json j = {{"object", "list"}, {"data", {model_object()}}};
    res.body = dump(j);
  }, true);
  if (o_.metrics)
    route("GET", "/metrics", [this](const http::Request&, http::Response& res) {
      res.content_type = "text/plain; version=0.0.4; charset=utf-8";
      res.body = metrics_text();
    }, true);
  // llama.cpp's /slots: what each decoding slot is doing (no request's text, only its id and counts)
  route("GET", "/slots", [this](const http::Request&, http::Response& res) {
    Json out = Json::array();
    for (const SlotReport& r : sched_->slot_reports()) {
      Json j = {{"id", r.slot}, {"is_processing", r.busy}, {"n_ctx", sched_->options().max_len}};
      if (r.busy) {
        j["id_task"] = r.request;
        j["choice"] = r.choice;
        j["n_prompt_tokens"] = r.prompt_tokens;
        j["n_prompt_tokens_cached"] = r.prompt_cached;
        j["n_decoded"] = r.generated;
        j["n_remain"] = r.max_tokens - r.generated;
      }
      out.push_back(j);
    }
    res.body = dump(out);
  }, true);
  // models.retrieve(id): the one served model, or OpenAI's 404
  route("GET", "/v1/models/", [this](const http::Request& req, http::Response& res) {
    const std::string id = req.path.substr(std::string("/v1/models/").size());
    if (id != id_)
      throw HttpError{404, "The model '" + id + "' does not exist; this server serves '" + id_ + "'",
                      "invalid_request_error", "model", "model_not_found"};
    res.body = dump(model_object());
  }, true);
  // the explorer page, when the options carry one (qkv serve's and qkv explore's do)
  if (!o_.page.empty())
    route("GET", "/", [this](const http::Request& req, http::Response& res) {
      explorer_page(req, res);
    }, true);
  route("GET", "/v1/model", [this](const http::Request&, http::Response& res) {
    res.body = dump(model_json());
  }, true);
  route("POST", "/v1/attend", [this](const http::Request& req, http::Response& res) {
    explorer_attend(req, res);
  });
  route("GET", "/v1/claims", [this](const http::Request& req, http::Response& res) {
    explorer_claims(req, res);
  });
  route("POST", "/v1/completions", [this](const http::Request& req, http::Response& res) {
    need_task(Task::LanguageModel, "/v1/completions");
    completions(req, res);
  });
  route("POST", "/v1/chat/completions", [this](const http::Request& req, http::Response& res) {
    need_task(Task::LanguageModel, "/v1/chat/completions");
    chat_completions(req, res);
  });
  route("POST", "/v1/embeddings", [this](const http::Request& req, http::Response& res) {
    embeddings(req, res);
  });
  route("POST", "/v1/next-token", [this](const http::Request& req, http::Response& res) {
    need_task(Task::LanguageModel, "/v1/next-token");
    next_token(req, res);
  });
  route("POST", "/v1/attention", [this](const http::Request& req, http::Response& res) {
    attention(req, res);
  });
  route("POST", "/v1/translations", [this](const http::Request& req, http::Response& res) {
    need_task(Task::Translate, "/v1/translations");
    translations(req, res);
  });
  // llama.cpp's token routes (any model)
  route("POST", "/tokenize", [this](const http::Request& req, http::Response& res) {
    tokenize(req, res);
  });
  route("POST", "/detokenize", [this](const http::Request& req, http::Response& res) {
    detokenize(req, res);
  });
  route("POST", "/v1/classifications", [this](const http::Request& req, http::Response& res) {
    need_task(Task::Classify, "/v1/classifications");
    classifications(req, res);
  });
}

// GET /metrics: Prometheus' text exposition format, counters since the start and gauges now.
std::string ServerImpl::metrics_text() {
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
  const Scheduler::PromptStats ps = sched_->prompt_stats();
  one("qkv_prompt_tokens_cached_total", "counter",
      "Prompt tokens taken from the prompt cache instead of computed (every choice's).", ps.reused_tokens);
  one("qkv_prompt_cache_tokens", "gauge", "Prompt tokens whose keys and values the prompt cache holds.",
      ps.cache.tokens);
  one("qkv_prompt_cache_bytes", "gauge", "Bytes the prompt cache holds (at most --prompt-cache MiB).", ps.cache.bytes);
  // histograms: cumulative buckets, sum and count (Prometheus' text format)
  const auto [ttft, tpot] = sched_->latencies();
  const auto histogram = [&](const char* name, const char* help, const LatencyHistogram& h) {
    out += detail::concat("# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
    int64_t below = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      below += h.counts[i];
      out += detail::concat(name, "_bucket{le=\"", h.bounds[i], "\"} ", below, "\n");
    }
    out += detail::concat(name, "_bucket{le=\"+Inf\"} ", h.count, "\n", name, "_sum ", h.sum, "\n", name, "_count ",
                          h.count, "\n");
  };
  histogram("qkv_time_to_first_token_seconds",
            "From a completion request's queueing to its first token (each prompt of a batch counts).", ttft);
  histogram("qkv_time_per_output_token_seconds", "Between a choice's successive tokens.", tpot);
  out += "# HELP qkv_http_responses_total Answers of the API's routes, by route and status code.\n"
         "# TYPE qkv_http_responses_total counter\n";
  std::lock_guard<std::mutex> lock(status_mu_);
  for (const auto& [key, n] : statuses_)
    out += detail::concat("qkv_http_responses_total{route=\"", key.first, "\",code=\"", key.second, "\"} ", n, "\n");
  return out;
}

// The served model as OpenAI's model object (and qkv's task).
Json ServerImpl::model_object() const {
  return {{"id", id_}, {"object", "model"}, {"created", created_}, {"owned_by", "qkv"}, {"task", task_label()}};
}

}  // namespace qkv::serve

namespace qkv {

Server::Server(const ServerOptions& options) : impl_(std::make_unique<serve::ServerImpl>(options)) {}

Server::~Server() = default;

int Server::run(const std::atomic<bool>& stop, const std::function<void(const std::string& url)>& on_listen) {
  return impl_->run(stop, on_listen);
}

}  // namespace qkv
