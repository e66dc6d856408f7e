// qkv serve and qkv explore: the command line of the server (qkv/server.h, src/serve/), which
// serves a model behind an HTTP API that OpenAI's clients speak, and the explorer page at /.
// SIGTERM / SIGINT stop it: it stops taking connections, finishes the requests in flight, and exits.
#include <spawn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "cli_checks.h"
#include "commands.h"
#include "qkv/server.h"
#include "qkv/signals.h"
#include "task_util.h"

namespace qkv::cli {

extern const unsigned char kExplorerHtml[];  // tools/explorer.html, embedded at build time
extern const size_t kExplorerHtmlSize;

namespace {

// The options qkv serve and qkv explore share.
void serve_options(CLI::App* c, ServerOptions* o) {
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
  c->add_option("--prompt-cache", o->prompt_cache_mib,
                "MiB of past prompts' keys and values kept, so that a prompt starting with a kept prefix reuses "
                "it with bitwise the same results (docs/serving.md, Prompt reuse). 0: none, and each prompt runs "
                "in one pass (default 256)")
      ->transform(whole(0, 1 << 20));
  c->add_option("--prompt-chunk", o->prompt_chunk,
                "With a prompt cache, prompts run in chunks of this many tokens at fixed positions: the granularity "
                "of reuse; smaller chunks reuse more and run new prompts slower (default 128)")
      ->transform(whole(1, 65536));
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

// The server on the options, with the explorer page; stops on SIGTERM / SIGINT. The address goes
// to standard output (with --port 0, how a script learns the port), then to on_listen.
int serve(const ServerOptions& options, const std::function<void(const std::string&)>& on_listen = {}) {
  ServerOptions o = options;
  o.page = std::string_view(reinterpret_cast<const char*>(kExplorerHtml), kExplorerHtmlSize);
  StopRequest stop;
  Server server(o);
  return server.run(stop.flag(), [&on_listen](const std::string& url) {
    std::printf("%s\n", url.c_str());
    std::fflush(stdout);
    if (on_listen) on_listen(url);
  });
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto o = std::make_shared<ServerOptions>();
  CLI::App* c = app.add_subcommand(
      "serve", "Serve a model over HTTP: OpenAI-style /v1/completions and /v1/chat/completions (streaming), /v1/translations, "
               "/v1/classifications, /v1/next-token, /v1/attention, /health; the explorer page at /");
  serve_options(c, o.get());
  return [o] { return serve(*o); };
}

Runner add_explore(CLI::App& app) {
  auto o = std::make_shared<ServerOptions>();
  auto no_open = std::make_shared<bool>(false);
  CLI::App* c = app.add_subcommand(
      "explore", "Open the explorer page on a model: the worked example, every layer and head's attention on your "
                 "text, the next token, the chapter's claims (qkv serve, then a browser at its address)");
  serve_options(c, o.get());
  c->add_flag("--no-open", *no_open, "Only print the address; do not start a browser");
  return [o, no_open] {
    return serve(*o, [no_open](const std::string& url) {
      std::fprintf(stderr, "qkv explore: the explorer is at %s (Ctrl-C stops it)\n", url.c_str());
      if (!*no_open) open_browser(url);
    });
  };
}

}  // namespace qkv::cli
