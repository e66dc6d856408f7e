// qkv's HTTP/1.1 transport on Boost.Beast + Boost.Asio (see http_server.h for why and what).
//
// Threads: one I/O thread runs the io_context and owns every socket, the acceptor and the table
// of connections; nothing else touches them except by posting to it. A worker route gets a thread
// of its own for the handler; a streamed body is written by posting each chunk to the I/O thread
// and waiting for its completion, so a client that stops reading holds one chunk, not memory.
#include "serve/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "qkv/error.h"

namespace qkv::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// Text from the wire, safe to put in a message: bytes outside printable ASCII become %XX (as a
// URL would write them).
std::string printable(std::string_view s, size_t most = 200) {
  std::string out;
  static const char* hex = "0123456789ABCDEF";
  for (unsigned char c : s.substr(0, most)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > most) out += "...";
  return out;
}

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return &v;
  return nullptr;
}

const std::string* Request::param(std::string_view name) const {
  for (const auto& [k, v] : query)
    if (k == name) return &v;
  return nullptr;
}

bool percent_decode(std::string_view s, std::string& out) {
  out.clear();
  const auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return false;
    const int hi = val(s[i + 1]), lo = val(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

struct Conn;

struct Server::Impl {
  Limits limits;
  ErrorFormatter format_error;
  struct Route {
    Handler handler;
    bool inline_handler;
  };
  std::map<std::pair<std::string, std::string>, Route> routes;
  std::map<std::pair<std::string, std::string>, Route> prefix_routes;
  std::vector<std::string> cors_origins;
  std::function<bool(const Request&, Response&)> guard;

  // The route for a request: an exact one, else the longest prefix route it extends.
  const Route* find_route(const std::string& method, const std::string& path) const {
    if (const auto it = routes.find({method, path}); it != routes.end()) return &it->second;
    const Route* best = nullptr;
    size_t longest = 0;
    for (const auto& [key, r] : prefix_routes)
      if (key.first == method && path.size() > key.second.size() && path.compare(0, key.second.size(), key.second) == 0 &&
          key.second.size() >= longest)
        best = &r, longest = key.second.size();
    return best;
  }
  // Access-Control-Allow-Origin for a request's Origin header: the origin, "*", or "" (none).
  std::string cors_for(const std::string* origin) const {
    if (!origin || cors_origins.empty()) return "";
    for (const std::string& o : cors_origins) {
      if (o == "*") return "*";
      if (o == *origin) return o;
    }
    return "";
  }

  std::atomic<bool> stopping{false}, stopped{false};
  std::atomic<int64_t> workers{0}, open{0};
  std::mutex mu;  // guards the tables below (a connection may be destroyed on a worker thread)
  std::condition_variable workers_done;
  std::unordered_map<uint64_t, std::weak_ptr<Conn>> conns;
  std::unordered_map<std::string, int64_t> per_client;
  uint64_t next_id = 0;
  // last, so destroyed first: the handlers still queued release their connections while the
  // tables above exist
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};

  void accept();
  void on_accept(error_code ec, tcp::socket socket);
  Response error(int status, const std::string& message) const {
    Response r;
    r.status = status;
    format_error(r, status, message);
    return r;
  }
};

// One connection. Everything but write_chunk's caller runs on the I/O thread.
struct Conn : std::enable_shared_from_this<Conn> {
  enum class State { Reading, Handling, Closed };

  Server::Impl* srv;
  beast::tcp_stream stream;
  beast::flat_buffer buf;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser;
  std::string client;
  uint64_t id = 0;
  int64_t requests = 0;
  State state = State::Reading;
  bool keep_alive = false;
  std::string cors;  // this request's Access-Control-Allow-Origin ("" when none)
  // a streamed answer's head, alive while it is written
  std::unique_ptr<bhttp::response<bhttp::empty_body>> head;
  std::unique_ptr<bhttp::response_serializer<bhttp::empty_body>> head_sr;

  Conn(Server::Impl* s, tcp::socket socket, std::string peer) : srv(s), stream(std::move(socket)), client(std::move(peer)) {}

  ~Conn() {
    std::lock_guard<std::mutex> lock(srv->mu);
    srv->conns.erase(id);
    if (--srv->per_client[client] <= 0) srv->per_client.erase(client);
    --srv->open;
  }

  void start() {
    beast::error_code ignored;
    stream.socket().set_option(tcp::no_delay(true), ignored);  // no 40 ms Nagle / delayed-ACK stall
    read_request();
  }

  // Waits for a request: a kept-alive connection may idle for idle_seconds before its first
  // byte; from there its headers must arrive within header_seconds, its body in body_seconds.
  void read_request() {
    state = State::Reading;
    cors.clear();
    if (srv->stopping) return close();
    if (requests > 0 && buf.size() == 0) {
      stream.expires_after(seconds(srv->limits.idle_seconds));
      stream.async_read_some(buf.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
        if (ec) return self->close();
        self->buf.commit(n);
        self->read_header();
      });
      return;
    }
    read_header();
  }

  void read_header() {
    parser.emplace();
    parser->header_limit(static_cast<uint32_t>(srv->limits.max_header_bytes));
    parser->body_limit(static_cast<uint64_t>(srv->limits.max_body_bytes));
    stream.expires_after(seconds(srv->limits.header_seconds));
    bhttp::async_read_header(stream, buf, *parser,
                             [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  // A read that failed: a parse error or a limit gets its status; a closed socket, nothing.
  void read_failed(error_code ec, bool started) {
    if (ec == bhttp::error::header_limit)
      return refuse(431, "the request's header is over " + std::to_string(srv->limits.max_header_bytes) + " bytes");
    if (ec == bhttp::error::body_limit)
      return refuse(413, "the request body is over " + std::to_string(srv->limits.max_body_bytes) +
                             " bytes (--max-body)");
    // a deadline that passed has closed the socket already (beast::tcp_stream): nothing to answer
    if (ec == beast::error::timeout || ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message)
      return close();
    if (started && ec.category() == bhttp::make_error_code(bhttp::error::bad_target).category())
      return refuse(400, "malformed request: " + ec.message());
    close();  // the socket failed or was closed
  }

  void on_header(error_code ec) {
    if (ec) return read_failed(ec, buf.size() > 0 || parser->got_some());
    if (srv->stopping) return close();
    const auto& req = parser->get();
    if (const auto it = req.find(bhttp::field::expect); it != req.end()) {
      if (!iequals(it->value(), "100-continue")) return refuse(417, "unsupported Expect header");
      if (!parser->is_done()) {
        auto cont = std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, 11);
        stream.expires_after(seconds(srv->limits.write_seconds));
        bhttp::async_write(stream, *cont, [self = shared_from_this(), cont](error_code e, size_t) {
          if (e) return self->close();
          self->read_body();
        });
        return;
      }
    }
    read_body();
  }

  void read_body() {
    if (parser->is_done()) return on_request();
    stream.expires_after(seconds(srv->limits.body_seconds));
    bhttp::async_read(stream, buf, *parser, [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->read_failed(ec, true);
      self->on_request();
    });
  }

  void on_request() {
    stream.expires_never();
    ++requests;
    auto& m = parser->get();
    auto req = std::make_shared<Request>();
    req->method = std::string(m.method_string());
    req->target = std::string(m.target());
    req->client = client;
    for (const auto& f : m) req->headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    req->body = std::move(m.body());
    keep_alive = m.keep_alive() && requests < srv->limits.max_requests_per_connection;
    cors = srv->cors_for(req->header("Origin"));
    if (!cors.empty() && req->method == "OPTIONS" && req->header("Access-Control-Request-Method")) {
      // a browser's preflight: what a request from this origin may carry (no API key is sent here)
      Response pre;
      pre.status = 204;
      pre.content_type.clear();
      std::string allow = "Authorization, Content-Type";
      if (const std::string* h = req->header("Access-Control-Request-Headers");
          h && !h->empty() && h->size() <= 1000 &&
          h->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_, ") == std::string::npos)
        allow = *h;
      pre.headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                     {"Access-Control-Allow-Headers", allow},
                     {"Access-Control-Max-Age", "600"}};
      return send(pre);
    }
    const std::string_view target = req->target;
    const size_t q = target.find('?');
    if (!percent_decode(target.substr(0, q), req->path))
      return send(srv->error(400, "malformed percent escape in the path " + printable(target.substr(0, q))));
    if (q != std::string_view::npos) {
      std::string_view rest = target.substr(q + 1);
      while (!rest.empty()) {
        const size_t amp = rest.find('&');
        const std::string_view part = rest.substr(0, amp);
        rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
        if (part.empty()) continue;
        const size_t eq = part.find('=');
        std::string k, v;
        std::string kp(part.substr(0, eq)), vp(eq == std::string_view::npos ? "" : part.substr(eq + 1));
        for (std::string* s : {&kp, &vp})
          for (char& c : *s)
            if (c == '+') c = ' ';
        if (!percent_decode(kp, k) || !percent_decode(vp, v))
          return send(srv->error(400, "malformed percent escape in the query " + printable(target.substr(q + 1))));
        req->query.emplace_back(std::move(k), std::move(v));
      }
    }
    Response res;
    if (srv->guard) {
      bool handled = false;
      try {
        handled = srv->guard(*req, res);
      } catch (const std::exception& e) {
        res = srv->error(500, std::string("internal error: ") + e.what());
        handled = true;
      }
      if (handled) return send(res);
    }
    const Server::Impl::Route* found = srv->find_route(req->method, req->path);
    if (!found) return send(srv->error(404, "no route " + printable(req->method) + " " + printable(req->target)));
    const Server::Impl::Route& route = *found;
    if (route.inline_handler) {
      try {
        route.handler(*req, res);
      } catch (const std::exception& e) {
        res = srv->error(500, std::string("internal error: ") + e.what());
      } catch (...) {
        res = srv->error(500, "internal error");
      }
      res.stream = nullptr;
      return send(res);
    }
    if (srv->workers >= srv->limits.max_workers)
      return send(srv->error(503, "the server is busy: " + std::to_string(srv->limits.max_workers) +
                                      " requests are being handled; try again later"));
    ++srv->workers;
    state = State::Handling;
    std::thread([self = shared_from_this(), req, h = route.handler, s = srv]() mutable {
      self->work(*req, h);
      self.reset();  // the connection may end here, while the server still exists
      std::lock_guard<std::mutex> lock(s->mu);
      --s->workers;
      s->workers_done.notify_all();
    }).detach();
  }

  // On the worker thread: the handler, then its answer through the I/O thread.
  void work(const Request& req, const Handler& h) {
    Response res;
    try {
      h(req, res);
    } catch (const std::exception& e) {
      res = srv->error(500, std::string("internal error: ") + e.what());
    } catch (...) {
      res = srv->error(500, "internal error");
    }
    if (!res.stream) {
      auto r = std::make_shared<Response>(std::move(res));
      post_and_wait([self = shared_from_this(), r](std::function<void(bool)> done) {
        self->send(*r);
        done(true);
      });
    } else {
      Sink sink(shared_from_this());
      if (sink.call([self = shared_from_this(), r = &res](std::function<void(bool)> done) { self->write_head(*r, std::move(done)); })) {
        res.stream(sink);
        if (sink.open())
          sink.call([self = shared_from_this()](std::function<void(bool)> done) { self->write_last(std::move(done)); });
      }
      sink.call([self = shared_from_this()](std::function<void(bool)> done) {
        self->after_response(!self->failed);
        done(true);
      });
    }
  }

  bool failed = false;

  // Runs f(done) on the I/O thread and waits for done(ok); false when the server stopped first.
  bool post_and_wait(std::function<void(std::function<void(bool)>)> f) {
    auto p = std::make_shared<std::promise<bool>>();
    auto fut = p->get_future();
    net::post(srv->ioc, [f = std::move(f), p] {
      f([p](bool ok) { p->set_value(ok); });
    });
    while (fut.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready)
      if (srv->stopped) return false;
    return fut.get();
  }

  struct Sink : ChunkSink {
    std::shared_ptr<Conn> c;
    explicit Sink(std::shared_ptr<Conn> conn) : c(std::move(conn)) {}
    bool call(std::function<void(std::function<void(bool)>)> f) { return c->post_and_wait(std::move(f)); }
    bool write(std::string_view data) override {
      if (!open()) return false;
      auto s = std::make_shared<std::string>(data);
      return call([c = c, s](std::function<void(bool)> done) { c->write_chunk(s, std::move(done)); });
    }
    bool open() const override { return !c->failed && !c->srv->stopped; }
  };

  void write_head(const Response& r, std::function<void(bool)> done) {
    head = std::make_unique<bhttp::response<bhttp::empty_body>>(static_cast<bhttp::status>(r.status), 11);
    head->set(bhttp::field::content_type, r.content_type);
    head->set(bhttp::field::cache_control, "no-cache");
    for (const auto& [k, v] : r.headers) head->set(k, v);
    if (!cors.empty()) head->set(bhttp::field::access_control_allow_origin, cors), head->set(bhttp::field::vary, "Origin");
    head->keep_alive(keep_alive && !srv->stopping);
    head->chunked(true);
    head_sr = std::make_unique<bhttp::response_serializer<bhttp::empty_body>>(*head);
    stream.expires_after(seconds(srv->limits.write_seconds));
    bhttp::async_write_header(stream, *head_sr, [self = shared_from_this(), done](error_code ec, size_t) {
      if (ec) self->failed = true;
      done(!ec);
    });
  }

  void write_chunk(std::shared_ptr<std::string> s, std::function<void(bool)> done) {
    if (failed) return done(false);
    stream.expires_after(seconds(srv->limits.write_seconds));
    net::async_write(stream, bhttp::make_chunk(net::buffer(*s)), [self = shared_from_this(), s, done](error_code ec, size_t) {
      if (ec) self->failed = true;
      done(!ec);
    });
  }

  void write_last(std::function<void(bool)> done) {
    if (failed) return done(false);
    stream.expires_after(seconds(srv->limits.write_seconds));
    net::async_write(stream, bhttp::make_chunk_last(), [self = shared_from_this(), done](error_code ec, size_t) {
      if (ec) self->failed = true;
      done(!ec);
    });
  }

  // On the I/O thread: a whole answer.
  void send(const Response& r) {
    auto msg = std::make_shared<bhttp::response<bhttp::string_body>>(static_cast<bhttp::status>(r.status), 11);
    if (!r.content_type.empty()) msg->set(bhttp::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) msg->set(k, v);
    if (!cors.empty()) msg->set(bhttp::field::access_control_allow_origin, cors), msg->set(bhttp::field::vary, "Origin");
    msg->body() = r.body;
    const bool keep = keep_alive && !srv->stopping && r.status < 500 && r.status != 408 && r.status != 413 &&
                      r.status != 431 && r.status != 400;
    msg->keep_alive(keep);
    msg->prepare_payload();
    state = State::Handling;
    stream.expires_after(seconds(srv->limits.write_seconds));
    bhttp::async_write(stream, *msg, [self = shared_from_this(), msg, keep](error_code ec, size_t) {
      self->after_response(!ec && keep);
    });
  }

  void after_response(bool again) {
    head_sr.reset();
    head.reset();
    if (again && keep_alive && !srv->stopping) return read_request();
    linger();
  }

  // An answer that refuses the request: sent, then the connection closes.
  void refuse(int status, const std::string& message) {
    keep_alive = false;
    send(srv->error(status, message));
  }

  // Closes after an answer: stop sending, then read and drop what the client still sends for a
  // moment, so that closing with unread bytes does not reset the connection before the client
  // has read the answer.
  void linger() {
    state = State::Closed;
    error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream.expires_after(std::chrono::seconds(2));
    drain();
  }
  std::unique_ptr<std::array<char, 16384>> scratch;  // what linger() reads and drops
  void drain() {
    if (!scratch) scratch = std::make_unique<std::array<char, 16384>>();
    stream.async_read_some(net::buffer(*scratch), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }

  void close() {
    state = State::Closed;
    error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
  }
};

void Server::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    on_accept(ec, std::move(socket));
  });
}

void Server::Impl::on_accept(error_code ec, tcp::socket socket) {
  if (stopping || !acceptor.is_open()) return;
  if (ec) {
    // out of file descriptors and the like: wait a moment rather than spin
    if (ec != net::error::operation_aborted) {
      auto t = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
      t->async_wait([this, t](error_code) { if (!stopping) accept(); });
    }
    return;
  }
  error_code e2;
  const tcp::endpoint peer = socket.remote_endpoint(e2);
  std::string client = e2 ? "?" : peer.address().to_string();
  std::shared_ptr<Conn> c;
  int64_t from_client = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    from_client = ++per_client[client];
    ++open;
    c = std::make_shared<Conn>(this, std::move(socket), client);
    c->id = ++next_id;
    conns[c->id] = c;
  }
  if (open > limits.max_connections)
    c->refuse(503, "the server has " + std::to_string(limits.max_connections) + " connections open; try again later");
  else if (from_client > limits.max_connections_per_client)
    c->refuse(503, "this client has " + std::to_string(limits.max_connections_per_client) +
                       " connections open; close some or try again later");
  else
    c->start();
  accept();
}

Server::Server(const Limits& limits, ErrorFormatter format_error) : impl_(std::make_shared<Impl>()) {
  impl_->limits = limits;
  impl_->format_error = std::move(format_error);
}

Server::~Server() {
  stop();
  // a worker still running holds a connection that points at impl_: wait for it (it ends once
  // its handler does; writes fail at once after stop())
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->workers_done.wait(lock, [this] { return impl_->workers == 0; });
}

void Server::route(const std::string& method, const std::string& path, Handler h, bool inline_handler) {
  impl_->routes[{method, path}] = {std::move(h), inline_handler};
}

void Server::route_prefix(const std::string& method, const std::string& prefix, Handler h, bool inline_handler) {
  impl_->prefix_routes[{method, prefix}] = {std::move(h), inline_handler};
}

void Server::set_cors_origins(std::vector<std::string> origins) { impl_->cors_origins = std::move(origins); }

void Server::set_guard(std::function<bool(const Request&, Response&)> guard) { impl_->guard = std::move(guard); }

int Server::bind(const std::string& host, int port) {
  tcp::resolver resolver(impl_->ioc);
  error_code ec;
  const auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
  check(!ec && !results.empty(), "serve: --host ", host, ": not an address of this machine (", ec.message(), ")");
  const tcp::endpoint ep = results.begin()->endpoint();
  tcp::acceptor& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  check(!ec, "serve: cannot open a socket for ", host, ":", port, ": ", ec.message());
  a.set_option(tcp::acceptor::reuse_address(true), ec);  // not SO_REUSEPORT: a port in use must fail
  a.bind(ep, ec);
  check(!ec, "serve: cannot listen on ", host, ":", port, ": ",
        ec == net::error::address_in_use ? std::string("address already in use") : ec.message());
  a.listen(net::socket_base::max_listen_connections, ec);
  check(!ec, "serve: cannot listen on ", host, ":", port, ": ", ec.message());
  return a.local_endpoint().port();
}

void Server::run() {
  impl_->accept();
  impl_->ioc.run();
  impl_->stopped = true;
}

void Server::stop_accepting() {
  impl_->stopping = true;
  // a raw pointer: the io_context is the Impl's own, so a handler still queued when it is destroyed
  // must not own the Impl (that cycle would keep both alive)
  net::post(impl_->ioc, [impl = impl_.get()] {
    error_code ignored;
    impl->acceptor.close(ignored);
    std::vector<std::shared_ptr<Conn>> cs;
    {
      std::lock_guard<std::mutex> lock(impl->mu);
      for (auto& [id, w] : impl->conns)
        if (auto c = w.lock()) cs.push_back(std::move(c));
    }
    for (auto& c : cs)
      if (c->state != Conn::State::Handling) c->close();
  });
}

void Server::stop() {
  impl_->stopping = true;
  impl_->stopped = true;
  impl_->ioc.stop();
}

int64_t Server::handlers_running() const { return impl_->workers; }
int64_t Server::connections() const { return impl_->open; }

}  // namespace qkv::http
