// tests/support/raw_conn.hpp - a raw loopback TCP connection to a cclite TCP
// store, for tests that play the stranger: garbage, truncated frames, wrong
// tokens, idle and slow clients.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include <cclite/core/clock.hpp>
#include <cclite/tcp/store_auth.hpp>
#include <cclite/tcp/store_protocol.hpp>

namespace cclite::test {

/// A socket listening on 127.0.0.1 at a free port (fd -1 if that failed),
/// for tests that play a server.
struct loopback_listener {
  int fd = -1;
  std::uint16_t port = 0;
  explicit loopback_listener(int backlog = 16) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close();
      return;
    }
    port = ntohs(a.sin_port);
  }
  loopback_listener(const loopback_listener&) = delete;
  loopback_listener& operator=(const loopback_listener&) = delete;
  ~loopback_listener() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  /// A thread that takes one connection and answers as a web server would
  /// (after reading what the client sent first when `read_first`), then
  /// closes it 200 ms later. Join it.
  std::thread answer_like_a_web_server(bool read_first) {
    return std::thread([this, read_first] {
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, 5000) != 1) return;  // the client never came: its CHECKs fail
      const int s = ::accept(fd, nullptr, nullptr);
      if (s < 0) return;
      char buf[256];
      if (read_first) (void)::recv(s, buf, sizeof buf, 0);
      const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
      (void)::send(s, reply, sizeof reply - 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::close(s);
    });
  }
};

struct raw_conn {
  int fd = -1;
  explicit raw_conn(std::uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  raw_conn(const raw_conn&) = delete;
  raw_conn& operator=(const raw_conn&) = delete;
  ~raw_conn() {
    if (fd >= 0) ::close(fd);
  }

  void send(const void* p, std::size_t n) { (void)::send(fd, p, n, MSG_NOSIGNAL); }

  /// Reads exactly n bytes within `ms`; false on close, error or timeout.
  bool recv_all(void* p, std::size_t n, int ms = 5000) {
    auto* b = static_cast<char*>(p);
    auto until = std::chrono::steady_clock::now() + milliseconds(ms);
    while (n > 0 && std::chrono::steady_clock::now() < until) {
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, 50) <= 0) continue;
      ssize_t k = ::recv(fd, b, n, 0);
      if (k <= 0) return false;
      b += k;
      n -= static_cast<std::size_t>(k);
    }
    return n == 0;
  }

  /// Plays the job-token handshake as a real client would; returns the
  /// status byte of the server's answer (0 = ok), or -1 if it never came.
  int handshake(const std::string& token) {
    std::uint8_t ch[tcp::proto::auth_frame_bytes];
    if (!recv_all(ch, sizeof ch)) return -1;
    tcp::proto::auth_frame f, proof;
    if (tcp::proto::decode_auth(ch, sizeof ch, tcp::proto::auth_kind::challenge, f)) return -1;
    proof.kind = tcp::proto::auth_kind::proof;
    proof.payload = tcp::proto::auth_proof(token, f.payload);
    auto b = tcp::proto::encode(proof);
    send(b.data(), b.size());
    std::uint8_t rb[tcp::proto::reply_header_bytes];
    if (!recv_all(rb, sizeof rb)) return -1;
    return rb[5];
  }
  /// True when the handshake with `token` is accepted.
  bool auth(const std::string& token = {}) { return handshake(token) == 0; }

  /// True once the server closed the connection (within `ms`).
  bool closed_within(int ms) {
    auto until = std::chrono::steady_clock::now() + milliseconds(ms);
    char buf[256];
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0 && ::recv(fd, buf, sizeof buf, 0) <= 0) return true;
    }
    return false;
  }
};

}  // namespace cclite::test
