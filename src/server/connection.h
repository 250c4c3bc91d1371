// The HTTP transport under the API: connection handling that one slow or hostile client cannot
// take over, and strict request framing. cpp-httplib (Debian's 0.11) parses requests and writes
// responses; this layer replaces its per-connection loop and socket stream:
//
// - A thread per connection, up to `max_connections`. A fixed pool let 200 slowloris
//   connections (one header byte a second) queue /health behind them; with a thread each, they
//   only sleep in poll(). At the cap, the connection that has waited longest for a request
//   (idle keep-alive, or a request head still arriving) is closed to make room; connections in
//   the middle of a request or a stream are never evicted. No per-address cap: behind a proxy or
//   on loopback every client shares one address.
// - Deadlines: a request head (request line + headers) must arrive within `head_timeout_s`, a body
//   within `body_timeout_s` of its head; an idle keep-alive connection closes after
//   `idle_timeout_s`, and at once when the server stops (close_idle()).
// - Framing (check_framing, before any body byte is read): one Content-Length of decimal digits,
//   within --max-body, required on POST unless chunked (411); Transfer-Encoding only "chunked" and
//   never with Content-Length; no Content-Encoding (compressed bodies are refused with 415, so
//   --max-body is the size the handlers see). Chunked bodies are validated as they stream in: hex
//   sizes only, the running total within --max-body, CRLF where the grammar says.
// - An early answer (401, 503, a framing error, a body read that failed) leaves unread body bytes
//   on the connection, so the connection is closed after it ("Connection: close") instead of
//   parsing those bytes as the next request. The close lingers (FIN, then the rest of the body read
//   and dropped, at most 2 s) so that the client still reads the answer instead of a reset.
#pragma once

#include "server/httplib_abi.h"

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace lilac::server {

struct ConnectionLimits {
  size_t max_connections = 512;  // below select()'s FD_SETSIZE, which httplib still checks
  double head_timeout_s = 10;    // request line + headers, from their first byte
  double idle_timeout_s = 5;     // keep-alive wait for the next request
  double body_timeout_s = 60;    // the whole body, from the end of the head
  size_t max_requests = 1000;    // per connection
};

// A request whose framing is refused: the status (400, 411, 413, 415, 501) and why.
struct FramingError {
  int status;
  std::string message;
};

// Checks a request head's framing headers (see the file comment). Bodies over `max_body` are 413.
std::optional<FramingError> check_framing(const httplib::Request& req, size_t max_body);

class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(ConnectionLimits limits = {});
  ~HttpServer() override;

  // For the request being handled on this thread (call from the pre-routing handler): its body
  // is next, chunked or not, at most `max_body` bytes after decoding the chunks.
  static void begin_body(bool chunked, size_t max_body);
  // The connection of the request handled on this thread closes after its response.
  static void close_after_response();
  // True when that connection will close (for the response's Connection header).
  static bool closing_after_response();
  // A body read on this thread failed because the body was over its limit (413, not 400).
  static bool body_over_limit();

  // Closes every connection that is waiting for a request; later responses close their
  // connection. Running requests and streams go on.
  void close_idle();
  // After bind_to_port: a listen queue as deep as the connection cap. httplib listens with a
  // backlog of 5; a burst of clients (16 agents starting at once) overflows it, the kernel drops
  // their SYNs, and each retries only after TCP's 1 s retransmission timeout (seen as ~1 s of
  // extra time to first token for 3 of 16 clients on the GPU machine).
  void deepen_listen_queue();
  size_t open_connections() const;
  size_t evicted_connections() const { return evicted_; }

  struct Connection;

 private:
  bool process_and_close_socket(socket_t sock) override;
  // Registers a connection, evicting the longest-waiting idle one at the cap; null when every
  // connection is busy (the caller answers 503).
  std::shared_ptr<Connection> admit(socket_t sock);

  ConnectionLimits limits_;
  mutable std::mutex mutex_;
  std::list<std::shared_ptr<Connection>> connections_;
  std::atomic<bool> closing_{false};
  std::atomic<size_t> evicted_{0};
  std::atomic<int> listen_socket_{-1};  // the last socket httplib set up for listening
};

}  // namespace lilac::server
