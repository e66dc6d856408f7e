// qkv/server.h: a model behind an HTTP API that OpenAI's clients speak (what `qkv serve` runs).
//
// The routes: /v1/completions and /v1/chat/completions (streamed or whole, logprobs, stop strings,
// JSON-schema output), /v1/embeddings, /v1/translations, /v1/classifications, /tokenize and
// /detokenize, /v1/next-token, /v1/attention, the explorer page's /v1/model, /v1/attend and
// /v1/claims, /v1/models, /health and (with `metrics`) /metrics. docs/serving.md describes each;
// docs/design.md ("Serving") how the server is built and where a new route goes.
//
//   qkv::ServerOptions o;
//   o.model = "models/smollm";
//   o.port = 0;                      // a free port
//   qkv::Server server(o);           // loads the model and its tokenizer; throws qkv::Error
//   std::atomic<bool> stop{false};   // set it (from any thread) to drain and stop
//   server.run(stop, [](const std::string& url) { /* listening at url */ });
//
// One I/O thread takes the connections and one scheduler thread owns the model; every limit is an
// option below. Messages about the server (where it listens, a chat template it cannot use,
// stopping) go to standard error.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

namespace serve {
class ServerImpl;
}

struct ServerOptions {
  std::string model, host = "127.0.0.1", api_key, dtype;
  std::string chat_template;  // a Jinja2 file for /v1/chat/completions instead of the model's
  std::string embedding_pooling;  // mean, cls or last: overrides the folder's sentence-transformers pooling
  bool embedding_normalize = false;  // L2-normalise embeddings (also when the folder's modules say so)
  bool metrics = false;  // GET /metrics (Prometheus' text format)
  std::vector<std::string> allow_hosts, cors_origins;
  int port = 8080;
  int64_t max_connections = 1024, max_client_connections = 256;
  int64_t slots = 8, max_len = 0, max_queue = 64, max_body = 1 << 20, max_tokens = 1024, max_attention = 4 << 20;
  // Prompt reuse (docs/serving.md): past prompts' keys and values kept, MiB (0: none, and each prompt
  // runs in one pass), and the prompt tokens run together when there is a cache (its granularity).
  int64_t prompt_cache_mib = 256, prompt_chunk = 128;
  // The HTML page answered at GET / (qkv's explorer page, which the qkv binary embeds), open without
  // the API key; its bytes must outlive the Server. Empty: no page (GET / is a 404).
  std::string_view page;
};

class Server {
 public:
  // Loads the model (qkv's directory, a Hugging Face folder or a GGUF file) and its tokenizer,
  // chat template and embedding setup; throws qkv::Error naming what is wrong.
  explicit Server(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and serves until `stop` is set; port 0 takes a free port. Says where it listens on
  // standard error, then calls on_listen with the address ("http://127.0.0.1:8080/"). Once `stop`
  // is set it stops taking connections (idle and half-sent ones are closed), lets the requests in
  // flight finish, and returns 0. Throws qkv::Error when it cannot bind.
  int run(const std::atomic<bool>& stop, const std::function<void(const std::string& url)>& on_listen = {});

 private:
  std::unique_ptr<serve::ServerImpl> impl_;
};

}  // namespace qkv
