#include "server/connection.h"

#include "util/error.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <thread>
#include <vector>

namespace lilac::server {

namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

int64_t seconds_ns(double s) {
  return int64_t(s * 1e9);
}

// A thread per connection (httplib's TaskQueue: enqueue runs process_and_close_socket). Finished
// threads are joined on the next enqueue; shutdown joins the rest.
class ThreadPerConnection : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mutex_);
    reap();
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back({std::thread([fn = std::move(fn), done] {
                          fn();
                          *done = true;
                        }),
                        done});
  }
  void shutdown() override {
    std::lock_guard lock(mutex_);
    for (auto& t : threads_) t.thread.join();
    threads_.clear();
  }

 private:
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void reap() {
    for (auto it = threads_.begin(); it != threads_.end();) {
      if (*it->done) {
        it->thread.join();
        it = threads_.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::mutex mutex_;
  std::list<Worker> threads_;
};

// Validates a chunked body as its bytes are handed to the parser (RFC 9112 7.1, without
// trailers' contents being used): chunk-size = 1*16HEXDIG [ ";" ext ] CRLF, data, CRLF; the
// decoded total within the limit.
class ChunkValidator {
 public:
  explicit ChunkValidator(size_t max_body) : max_body_(max_body) {}
  // Feeds bytes; false (and error()) at the first violation.
  bool feed(const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const char c = p[i];
      switch (state_) {
        case State::SizeFirst:
        case State::Size: {
          const int d = hex(c);
          if (d >= 0) {
            if (++digits_ > 15) return fail("a chunk size longer than 15 hex digits");
            size_ = size_ * 16 + uint64_t(d);
            state_ = State::Size;
          } else if (state_ == State::SizeFirst) {
            return fail("a chunk size that is not a hex number");
          } else if (c == ';') {
            state_ = State::Ext;
          } else if (c == '\r') {
            state_ = State::SizeLf;
          } else {
            return fail("a chunk size that is not a hex number");
          }
          break;
        }
        case State::Ext:
          if (c == '\n') return fail("a bare LF in a chunk extension");
          if (c == '\r') state_ = State::SizeLf;
          break;
        case State::SizeLf:
          if (c != '\n') return fail("a chunk size line not ended by CRLF");
          if (size_ > max_body_ - std::min(total_, max_body_)) {
            over_limit_ = true;
            return fail("the chunked body is larger than the limit");
          }
          total_ += size_;
          remaining_ = size_;
          state_ = size_ == 0 ? State::TrailerLineStart : State::Data;
          size_ = 0;
          digits_ = 0;
          break;
        case State::Data: {
          const size_t take = size_t(std::min<uint64_t>(remaining_, n - i));
          remaining_ -= take;
          i += take - 1;
          if (remaining_ == 0) state_ = State::DataCr;
          break;
        }
        case State::DataCr:
          if (c != '\r') return fail("chunk data longer than its size");
          state_ = State::DataLf;
          break;
        case State::DataLf:
          if (c != '\n') return fail("chunk data not followed by CRLF");
          state_ = State::SizeFirst;
          break;
        case State::TrailerLineStart:
          if (c == '\r')
            state_ = State::EndLf;
          else if (c == '\n')
            return fail("a bare LF after the last chunk");
          else
            state_ = State::Trailer;
          break;
        case State::Trailer:
          if (c == '\r') state_ = State::TrailerLf;
          break;
        case State::TrailerLf:
          if (c != '\n') return fail("a trailer line not ended by CRLF");
          state_ = State::TrailerLineStart;
          break;
        case State::EndLf:
          if (c != '\n') return fail("the chunked body not ended by CRLF");
          state_ = State::Done;
          break;
        case State::Done:
          return fail("bytes after the end of the chunked body");
      }
    }
    return true;
  }
  const std::string& error() const { return error_; }
  bool over_limit() const { return over_limit_; }

 private:
  enum class State {
    SizeFirst,
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerLineStart,
    Trailer,
    TrailerLf,
    EndLf,
    Done
  };
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool fail(const char* why) {
    error_ = why;
    return false;
  }
  size_t max_body_;
  State state_ = State::SizeFirst;
  uint64_t size_ = 0, remaining_ = 0, total_ = 0;
  int digits_ = 0;
  bool over_limit_ = false;
  std::string error_;
};

}  // namespace

enum class Phase { Idle, Head, Body };

struct HttpServer::Connection {
  explicit Connection(socket_t s) : sock(s) {}
  const socket_t sock;
  std::atomic<Phase> phase{Phase::Idle};
  std::atomic<int64_t> phase_start{now_ns()};
  bool shut = false;  // shutdown() called (under the server's mutex)
  // Per request (the owning thread only):
  bool close_after = false;
  bool body_over_limit = false;
  std::optional<ChunkValidator> chunks;
  // Bytes read from the socket and not yet handed to the parser (a pipelined request's too).
  std::vector<char> buffer = std::vector<char>(4096);
  size_t buffer_begin = 0, buffer_end = 0;

  void set_phase(Phase p) {
    phase_start = now_ns();
    phase = p;
  }
};

namespace {

thread_local HttpServer::Connection* t_connection = nullptr;

// Waits until `sock` is readable, at most until `deadline_ns`; polls in short slices so that a
// stop is noticed. 1: readable (or closed by the peer), 0: deadline or stop, -1: error.
int wait_readable(socket_t sock, int64_t deadline_ns, const std::function<bool()>& stop) {
  for (;;) {
    const int64_t left = deadline_ns - now_ns();
    if (left <= 0 || (stop && stop())) return 0;
    pollfd p{sock, POLLIN, 0};
    const int ms = int(std::min<int64_t>(left / 1000000 + 1, 100));
    const int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r > 0) return 1;
  }
}

// httplib::Stream over a connection: reads through the connection's buffer with the current
// phase's deadline, feeds chunked bodies to their validator, writes with a timeout.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(HttpServer::Connection& c, const ConnectionLimits& limits, int64_t read_ns,
                   int64_t write_ns)
      : c_(c), limits_(limits), read_ns_(read_ns), write_ns_(write_ns) {}

  bool is_readable() const override {
    if (c_.buffer_begin < c_.buffer_end) return true;
    return wait_readable(c_.sock, now_ns() + read_ns_, nullptr) > 0;
  }
  bool is_writable() const override {
    pollfd p{c_.sock, POLLOUT, 0};
    if (::poll(&p, 1, int(write_ns_ / 1000000)) <= 0 || !(p.revents & POLLOUT)) return false;
    // Alive unless the peer closed: readable with nothing to peek.
    pollfd r{c_.sock, POLLIN, 0};
    if (::poll(&r, 1, 0) <= 0) return true;
    char b;
    return ::recv(c_.sock, &b, 1, MSG_PEEK) > 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (c_.buffer_begin == c_.buffer_end) {
      const Phase ph = c_.phase;
      const int64_t limit = ph == Phase::Body ? seconds_ns(limits_.body_timeout_s)
                                              : seconds_ns(limits_.head_timeout_s);
      const int64_t deadline = std::min(c_.phase_start + limit, now_ns() + read_ns_);
      if (wait_readable(c_.sock, deadline, nullptr) <= 0) return -1;
      const ssize_t n = ::recv(c_.sock, c_.buffer.data(), c_.buffer.size(), 0);
      if (n <= 0) return n;
      c_.buffer_begin = 0;
      c_.buffer_end = size_t(n);
    }
    const size_t n = std::min(size, c_.buffer_end - c_.buffer_begin);
    const char* p = c_.buffer.data() + c_.buffer_begin;
    if (c_.phase == Phase::Body && c_.chunks && !c_.chunks->feed(p, n)) {
      c_.body_over_limit = c_.chunks->over_limit();
      c_.close_after = true;
      return -1;
    }
    std::memcpy(ptr, p, n);
    c_.buffer_begin += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    pollfd p{c_.sock, POLLOUT, 0};
    if (::poll(&p, 1, int(write_ns_ / 1000000)) <= 0 || !(p.revents & POLLOUT)) return -1;
    return ::send(c_.sock, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(false, ip, port);
  }
  socket_t socket() const override { return c_.sock; }

 private:
  void address(bool remote, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    auto* sa = reinterpret_cast<sockaddr*>(&a);
    if ((remote ? ::getpeername(c_.sock, sa, &len) : ::getsockname(c_.sock, sa, &len)) != 0) return;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (::getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv),
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      return;
    ip = host;
    port = std::atoi(serv);
  }

  HttpServer::Connection& c_;
  const ConnectionLimits& limits_;
  int64_t read_ns_, write_ns_;
};

// A "lingering close" after an early answer: the client may still be sending the body we did not
// read, and closing a socket with unread bytes makes the kernel send a reset, which can destroy
// the answer before the client reads it. So stop writing (FIN), then read and discard until the
// client closes, for at most 2 s and 16 MiB.
void linger(socket_t sock) {
  ::shutdown(sock, SHUT_WR);
  const int64_t deadline = now_ns() + seconds_ns(2);
  size_t discarded = 0;
  char buf[16384];
  while (discarded < (16u << 20) && wait_readable(sock, deadline, nullptr) > 0) {
    const ssize_t n = ::recv(sock, buf, sizeof buf, 0);
    if (n <= 0) break;
    discarded += size_t(n);
  }
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::optional<FramingError> check_framing(const httplib::Request& req, size_t max_body) {
  const size_t n_length = req.get_header_value_count("Content-Length");
  const size_t n_te = req.get_header_value_count("Transfer-Encoding");
  std::string length;
  for (size_t i = 0; i < n_length; ++i) {
    const std::string v = req.get_header_value("Content-Length", i);
    if (!all_digits(v) || v.size() > 18)
      return FramingError{400, "Content-Length '" + v + "' is not a byte count"};
    if (i > 0 && v != length)
      return FramingError{400, "the request has conflicting Content-Length headers"};
    length = v;
  }
  if (n_te > 0) {
    if (n_length > 0)
      return FramingError{400, "the request has both Transfer-Encoding and Content-Length"};
    if (n_te > 1 || ::strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked"))
      return FramingError{501, "Transfer-Encoding '" + req.get_header_value("Transfer-Encoding") +
                                   "' is not supported (only 'chunked')"};
  }
  // Without either, httplib would read a POST body until the client closes the connection.
  if (n_length == 0 && n_te == 0 &&
      (req.method == "POST" || req.method == "PUT" || req.method == "PATCH"))
    return FramingError{
        411, "a " + req.method + " request needs a Content-Length (or Transfer-Encoding: chunked)"};
  for (size_t i = 0; i < req.get_header_value_count("Content-Encoding"); ++i) {
    const std::string v = req.get_header_value("Content-Encoding", i);
    if (::strcasecmp(v.c_str(), "identity") != 0)
      return FramingError{415, "compressed request bodies are not accepted (Content-Encoding: " +
                                   v + "); send the body uncompressed"};
  }
  if (!length.empty() && std::stoull(length) > max_body)
    return FramingError{413, "the request body is larger than the limit of " +
                                 std::to_string(max_body) + " bytes (--max-body)"};
  return std::nullopt;
}

HttpServer::HttpServer(ConnectionLimits limits) : limits_(limits) {
  new_task_queue = [] { return new ThreadPerConnection(); };
  set_keep_alive_timeout(time_t(limits_.idle_timeout_s));
  set_keep_alive_max_count(limits_.max_requests);
  // Called on each socket httplib creates to listen on, before bind(): the one that binds is the
  // last one (the others are closed), so remember it for deepen_listen_queue().
  set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_socket_ = int(sock);
  });
}

void HttpServer::deepen_listen_queue() {
  // Linux: listen() on a listening socket changes its backlog (capped at net.core.somaxconn).
  const int fd = listen_socket_;
  if (fd >= 0 && ::listen(fd, int(limits_.max_connections)) != 0)
    lilac::fail("listen(backlog {}): {}", limits_.max_connections, std::strerror(errno));
}

HttpServer::~HttpServer() = default;

void HttpServer::begin_body(bool chunked, size_t max_body) {
  if (!t_connection) return;
  t_connection->set_phase(Phase::Body);
  if (chunked) t_connection->chunks.emplace(max_body);
}

void HttpServer::close_after_response() {
  if (t_connection) t_connection->close_after = true;
}

bool HttpServer::closing_after_response() {
  return t_connection && t_connection->close_after;
}

bool HttpServer::body_over_limit() {
  return t_connection && t_connection->body_over_limit;
}

size_t HttpServer::open_connections() const {
  std::lock_guard lock(mutex_);
  return connections_.size();
}

void HttpServer::close_idle() {
  closing_ = true;
  std::lock_guard lock(mutex_);
  for (auto& c : connections_)
    if (c->phase != Phase::Body && !c->shut) {
      ::shutdown(c->sock, SHUT_RDWR);
      c->shut = true;
    }
}

std::shared_ptr<HttpServer::Connection> HttpServer::admit(socket_t sock) {
  auto c = std::make_shared<Connection>(sock);
  std::lock_guard lock(mutex_);
  size_t open = 0;
  std::shared_ptr<Connection> oldest;
  for (auto& o : connections_) {
    if (o->shut) continue;
    ++open;
    if (o->phase != Phase::Body && (!oldest || o->phase_start < oldest->phase_start)) oldest = o;
  }
  if (open >= limits_.max_connections) {
    if (!oldest) return nullptr;
    ::shutdown(oldest->sock, SHUT_RDWR);
    oldest->shut = true;
    evicted_++;
  }
  connections_.push_back(c);
  return c;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  std::shared_ptr<Connection> c = admit(sock);
  if (!c) {
    static const std::string body =
        R"({"error":{"message":"the server has too many open connections; retry shortly",)"
        R"("type":"server_error","param":null,"code":"too_many_connections"}})";
    const std::string reply =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body;
    [[maybe_unused]] auto sent = ::send(sock, reply.data(), reply.size(), MSG_NOSIGNAL);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return false;
  }
  t_connection = c.get();
  const int64_t read_ns = read_timeout_sec_ * 1000000000 + read_timeout_usec_ * 1000;
  const int64_t write_ns = write_timeout_sec_ * 1000000000 + write_timeout_usec_ * 1000;
  // Stopped: close. Closing (draining): a new connection still gets its one answer (a 503), an
  // idle one closes at once.
  bool first = true;
  auto stopping = [this, &first] { return svr_sock_ == INVALID_SOCKET || (closing_ && !first); };
  bool ok = false;
  for (size_t count = limits_.max_requests; count > 0; --count, first = false) {
    c->set_phase(Phase::Idle);
    if (stopping()) break;  // after set_phase: close_idle() either sees Idle or we see closing_
    if (c->buffer_begin == c->buffer_end &&
        wait_readable(sock, now_ns() + seconds_ns(limits_.idle_timeout_s), stopping) <= 0)
      break;
    c->set_phase(Phase::Head);
    c->close_after = false;
    c->body_over_limit = false;
    c->chunks.reset();
    ConnectionStream stream(*c, limits_, read_ns, write_ns);
    bool closed = false;
    ok = process_request(stream, count == 1, closed, nullptr);
    if (!ok || closed || c->close_after) break;
  }
  t_connection = nullptr;
  if (c->close_after && !c->shut) {
    c->set_phase(Phase::Idle);  // evictable while it lingers
    linger(sock);
  }
  {
    // Under the mutex, so that no eviction calls shutdown() on a descriptor being reused.
    std::lock_guard lock(mutex_);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    connections_.remove(c);
  }
  return ok;
}

}  // namespace lilac::server
