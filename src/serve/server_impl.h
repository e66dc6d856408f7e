// The server behind qkv::Server (qkv/server.h): its state, shared by the route files, and the
// declaration of every route's handler. Each route family has a file of its own that defines its
// handlers (docs/design.md, "Where a new route goes"):
//
//   server.cpp                  construction, run(), the route table, the Host / API-key guard,
//                               /health, /v1/models, /metrics
//   routes_completions.cpp      /v1/completions, /v1/chat/completions (the chat template)
//   routes_embeddings.cpp       /v1/embeddings (the pooling setup)
//   routes_tokens.cpp           /tokenize, /detokenize, /v1/next-token
//   routes_inspect.cpp          /v1/attention, and the explorer's page, /v1/model, /v1/attend, /v1/claims
//   routes_translations.cpp     /v1/translations (batched across requests, or streamed)
//   routes_classifications.cpp  /v1/classifications
//
// The transport (serve/http_server.h: Boost.Beast on one I/O thread) takes the connections;
// handlers only parse, validate and queue (docs/design.md, "Serving"). One Scheduler thread owns
// the model: completions decode with continuous batching, everything else runs on it as a job
// between steps. Every limit is explicit: header bytes (431), body size (413), deadlines for a
// request's headers and body, connections in all and per client (503), queue length (429),
// max_tokens, context length. /health is answered on the I/O thread, so it answers under load.
// Errors are OpenAI's JSON: {"error": {"message", "type", "param", "code"}}.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "qkv/chat_template.h"
#include "qkv/generate.h"
#include "qkv/json_constraint.h"
#include "qkv/model.h"
#include "qkv/scheduler.h"
#include "qkv/server.h"
#include "qkv/task.h"
#include "qkv/tokenizer.h"
#include "serve/http_server.h"
#include "serve/request.h"

namespace qkv::serve {

struct Completion;  // one completion request's events (routes_completions.cpp)
struct ChoiceText;  // the text of one choice as tokens arrive (routes_completions.cpp)

class ServerImpl {
 public:
  explicit ServerImpl(const ServerOptions& o);

  // Binds and serves until `stop` is set (qkv::Server::run).
  int run(const std::atomic<bool>& stop, const std::function<void(const std::string&)>& on_listen);

 private:
  // ---- server.cpp: the route table and what every request passes through -----------------------

  template <class F>
  http::Handler handler(std::string route, F f);  // route: its name in /metrics
  template <class F>
  void route(const char* method, const std::string& path, F f, bool quick = false);
  static http::Limits limits(const ServerOptions& o);
  bool host_allowed(const std::string* header) const;
  void need_task(Task t, const char* route) const;
  void routes();
  std::string metrics_text();
  Json model_object() const;

  // ---- routes_completions.cpp: /v1/completions, /v1/chat/completions -------------------------------

  struct CompletionParams;
  struct Delta;
  CompletionParams parse_completion(const std::string& body);
  static Json usage(const CompletionParams& p, const std::vector<ChoiceText>& choices, int64_t generated);
  std::shared_ptr<const TokenConstraint> output_constraint(const Json& rf);
  std::shared_ptr<const TokenTrie> token_trie();
  static int64_t utf8_length(const std::string& s);
  std::string token_text(int32_t id) const;
  Json chat_token(int32_t id, double logprob) const;
  std::vector<Delta> fold(Completion& c, std::vector<ChoiceText>& choices, const CompletionParams& p,
                          const std::vector<std::string>& bases);
  void completions(const http::Request& req, http::Response& res);
  void run_completion(const std::shared_ptr<CompletionParams>& p, http::Response& res);
  void load_chat_template();
  void chat_completions(const http::Request& req, http::Response& res);

  // ---- routes_embeddings.cpp: /v1/embeddings ---------------------------------------------------------

  void load_embedding_setup();
  void embeddings(const http::Request& req, http::Response& res);
  static std::string base64(const std::string& in);

  // ---- routes_tokens.cpp: /tokenize, /detokenize, /v1/next-token -------------------------------------

  void tokenize(const http::Request& req, http::Response& res);
  void detokenize(const http::Request& req, http::Response& res);
  void next_token(const http::Request& req, http::Response& res);

  // ---- routes_inspect.cpp: /v1/attention and the explorer page's routes -------------------------------

  void attention(const http::Request& req, http::Response& res);
  Json model_json() const;
  void explorer_page(const http::Request& req, http::Response& res);
  void explorer_attend(const http::Request& req, http::Response& res);
  void explorer_claims(const http::Request& req, http::Response& res);

  // ---- routes_translations.cpp, routes_classifications.cpp ----------------------------------------------

  struct TranslationItem;
  void translations(const http::Request& req, http::Response& res);
  void stream_translations(const std::vector<std::string>& texts, const std::vector<size_t>& rows,
                           std::vector<std::vector<int32_t>> src, std::vector<std::vector<int32_t>> prefixes,
                           GenerateConfig g, http::Response& res);
  void flush_translations(const Model& m);
  void classifications(const http::Request& req, http::Response& res);

  ServerOptions o_;
  TaskInfo info_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::string id_;
  int64_t created_ = 0;  // the model's modification time, seconds since 1970
  std::unique_ptr<Scheduler> sched_;
  http::Server http_;
  std::atomic<bool> draining_{false}, stopped_{false};
  std::atomic<int64_t> next_id_{0};
  // --metrics: counters since the start
  std::atomic<int64_t> prompt_tokens_{0}, generated_tokens_{0}, completions_{0};
  std::mutex status_mu_;
  std::map<std::pair<std::string, int>, int64_t> statuses_;  // the routes' answers by route and status code
  ChatTemplateSource chat_source_;     // the chat template's text and special tokens
  std::unique_ptr<ChatTemplate> chat_;  // null: no template (chat_error_ says why, when one failed)
  std::string chat_error_;
  std::mutex trie_mu_;
  std::shared_ptr<const TokenTrie> trie_;  // the vocabulary for structured output, built on first use
  std::string pooling_ = "mean";  // /v1/embeddings: mean, cls or last
  bool normalize_ = false;
  std::string embedding_error_;  // a folder's pooling qkv does not do
  bool encoder_only_ = false;    // a Hugging Face encoder: embeddings and attention, no task route
  const char* task_label() const { return encoder_only_ ? "embeddings" : task_name(info_.task); }
  std::mutex tr_mu_;
  std::vector<std::shared_ptr<TranslationItem>> tr_pending_;
};

}  // namespace qkv::serve
