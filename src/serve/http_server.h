// qkv's HTTP/1.1 transport: Boost.Beast's parser on Boost.Asio (Debian's libboost-dev), behind an
// interface of plain std types so that nothing above it sees Boost.
//
// Why not cpp-httplib any more (docs/design.md, "The HTTP transport"): it gives each connection a
// thread from a fixed pool for the whole time it is open, so a few dozen slow clients leave no
// thread for /health; it has a per-read timeout but no deadline for a request's headers or body,
// no limit on the number of header lines (one request could carry 200 MiB of them), a fixed listen
// backlog of 5, and it sets SO_REUSEPORT, so a second server on the same port starts silently.
//
// Here one I/O thread owns every socket and every read and write is asynchronous, so an idle or
// slow connection costs a few kilobytes and no thread. Each limit is explicit (Limits). A route is
// either inline (answered on the I/O thread: it must be quick and never wait, like /health) or runs
// on a worker thread of its own, which may wait on the model and may stream a chunked body.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::http {

using Fields = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query, percent-encoded
  std::string path;    // the target's path, percent-decoded (may hold any bytes)
  Fields query;        // the target's query, percent-decoded, in order
  Fields headers;      // names as sent
  std::string body;
  std::string client;  // the peer's address
  // The first header / query parameter of that name (headers: case-insensitively), or nullptr.
  const std::string* header(std::string_view name) const;
  const std::string* param(std::string_view name) const;
};

// A chunked body being sent: write() queues one chunk and waits until the socket took it; false
// once the client has gone, a write passed its deadline, or the server is stopping.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  virtual bool write(std::string_view data) = 0;
  virtual bool open() const = 0;  // false once write() would fail
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Fields headers;
  // When set (worker routes only), the body is sent chunked: this runs on the worker thread after
  // the status line and headers went out, writing through the sink, and returns when done.
  std::function<void(ChunkSink&)> stream;
};

using Handler = std::function<void(const Request&, Response&)>;

struct Limits {
  int64_t max_header_bytes = 16 << 10;  // request line + header lines (431 past it)
  int64_t max_body_bytes = 1 << 20;     // 413 past it, answered as soon as Content-Length says so
  double header_seconds = 10;           // from a request's first byte to the end of its headers
  double body_seconds = 60;             // from the end of the headers to the end of the body
  double idle_seconds = 30;             // a kept-alive connection waiting for its next request
  double write_seconds = 60;            // one write waiting for the client to read
  int64_t max_connections = 1024;       // open at once; more are answered 503 and closed
  int64_t max_connections_per_client = 256;  // from one address
  int64_t max_workers = 512;            // worker routes running at once; more get 503
  int64_t max_requests_per_connection = 10000;
};

// What the server answers by itself (no route, limits, overload) goes through this, so the
// errors speak the application's protocol (qkv serve: OpenAI's JSON).
using ErrorFormatter = std::function<void(Response&, int status, const std::string& message)>;

class Server {
 public:
  explicit Server(const Limits& limits, ErrorFormatter format_error);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes: exact path match. An inline handler runs on the I/O thread and must not wait.
  void route(const std::string& method, const std::string& path, Handler h, bool inline_handler = false);
  // A route for every path that starts with `prefix` and goes on (taken when no exact route
  // matches; the longest prefix first), e.g. "/v1/models/" for /v1/models/{id}.
  void route_prefix(const std::string& method, const std::string& prefix, Handler h, bool inline_handler = false);
  // Cross-origin requests from browsers (CORS): a request whose Origin is one of `origins` ("*":
  // any) gets Access-Control-Allow-Origin on its answer (the origin, or *), and its preflight
  // (OPTIONS with Access-Control-Request-Method) is answered 204 before the guard, allowing GET,
  // POST and the headers asked for (Authorization and Content-Type when none are). Empty: no
  // cross-origin access (the default).
  void set_cors_origins(std::vector<std::string> origins);
  // Runs on the I/O thread before routing (API key, Host check): true means it answered.
  void set_guard(std::function<bool(const Request&, Response&)> guard);

  // Binds and listens (SO_REUSEADDR, never SO_REUSEPORT: a port in use is an error). Port 0 takes
  // a free one. Returns the port. Throws qkv::Error naming the address on failure.
  int bind(const std::string& host, int port);
  // Serves until stop(); call once, after bind().
  void run();
  // Stops taking connections and requests: closes the listener and every connection that is not
  // inside a handler (idle, slow or half-sent requests); a handler running finishes and its answer
  // is sent with Connection: close. Thread-safe.
  void stop_accepting();
  // Ends run() (after stop_accepting(); waits for no handler). Thread-safe.
  void stop();
  int64_t handlers_running() const;  // worker handlers now running (streams included)
  int64_t connections() const;       // connections now open

  struct Impl;  // defined in http_server.cpp, where the connections use it

 private:
  std::shared_ptr<Impl> impl_;
};

// Percent-decodes s ('+' stays '+'); false when an escape is malformed.
bool percent_decode(std::string_view s, std::string& out);

}  // namespace qkv::http
