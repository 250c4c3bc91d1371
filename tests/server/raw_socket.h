// A raw TCP client for the transport tests: bytes exactly as written (framing a normal client
// refuses to produce), reads with a deadline.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace lilac::test {

class RawSocket {
 public:
  explicit RawSocket(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;
  bool ok() const { return fd_ >= 0; }
  bool send(const std::string& s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size());
  }
  // Reads until the peer closes or `seconds` pass; eof() says which.
  std::string read_all(double seconds) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return out;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, int(left)) <= 0) return out;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        eof_ = true;
        return out;
      }
      out.append(buf, size_t(n));
    }
  }
  // Reads until `marker` has been seen (or EOF / timeout).
  std::string read_until(const std::string& marker, double seconds) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (out.find(marker) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, int(left)) <= 0) break;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        eof_ = true;
        break;
      }
      out.append(buf, size_t(n));
    }
    return out;
  }
  bool eof() const { return eof_; }

 private:
  int fd_ = -1;
  bool eof_ = false;
};

// The status code of the first response in `raw` (0 when there is none).
inline int status_of(const std::string& raw) {
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || raw.size() < 12) return 0;
  return std::stoi(raw.substr(9, 3));
}

// How many responses `raw` holds.
inline int responses_in(const std::string& raw) {
  int n = 0;
  for (size_t p = raw.find("HTTP/1.1 "); p != std::string::npos; p = raw.find("HTTP/1.1 ", p + 1))
    ++n;
  return n;
}

}  // namespace lilac::test
