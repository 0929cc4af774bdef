// cclite/tcp/store_socket.hpp - one client connection to a rendezvous store.
//
// What every store client needs below its protocol: resolve host:port, connect
// with a deadline (non-blocking connect + poll), then move exact byte counts
// with a deadline. Used by store_client (cclite's own store) and
// torch_store_client (torchrun's c10d TCPStore). Any failure closes the socket:
// a byte stream cut in the middle of a message cannot be trusted again.
//
// Thread safety: one thread at a time.
#pragma once

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/store_protocol.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp::detail {

inline long long elapsed_ms(clock::time_point t0) {
  return static_cast<long long>(std::chrono::duration_cast<milliseconds>(clock::now() - t0).count());
}

class store_socket {
 public:
  /// `host`: a name, an IPv4 address, or an IPv6 address with or without
  /// brackets. `owner`: who hosts the store, for messages ("rank 0").
  store_socket(std::string host, std::uint16_t port, const char* owner, poll_hook hook = {})
      : host_(std::move(host)), port_(port), owner_(owner), hook_(hook) {
    if (host_.size() > 2 && host_.front() == '[' && host_.back() == ']') host_ = host_.substr(1, host_.size() - 2);
    endpoint_ = (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
  }
  ~store_socket() { close(); }
  store_socket(const store_socket&) = delete;
  store_socket& operator=(const store_socket&) = delete;

  /// "host:port", as used in messages.
  const std::string& endpoint() const noexcept { return endpoint_; }
  /// Who hosts the store, for messages; `owner` must outlive the socket (a literal).
  void set_owner(const char* owner) noexcept { owner_ = owner; }
  bool is_open() const noexcept { return fd_ >= 0; }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  /// True when the server has closed its end (an end of stream is waiting):
  /// checked before a query that gets no reply, which would otherwise seem
  /// to succeed.
  bool peer_closed() {
    char c;
    return fd_ >= 0 && ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }

  /// poll() on fd (< 0: just sleep) for at most `ms`, or the hook.
  short wait_fd(int fd, short events, int ms) {
    if (hook_.wait) return hook_.wait(hook_.ctx, fd, events, ms);
    pollfd p{fd, events, 0};
    int r = ::poll(&p, fd >= 0 ? 1 : 0, ms);
    return r > 0 ? p.revents : 0;
  }
  void sleep_ms(int ms) { (void)wait_fd(-1, 0, ms); }

  /// The protocol's opening on a freshly connected socket (a handshake).
  using greeter = status (*)(void* ctx, deadline until);

  /// One attempt over every address of the host, each connect bounded by
  /// `until` and 5 s; `greet(ctx, greet_until)` then runs the protocol's
  /// opening on the connected socket. On failure `why` says what happened, and
  /// `fatal` is set when greet fails with bootstrap_error or protocol_error:
  /// retrying will not change a refusal or a foreign protocol.
  bool connect_once(deadline until, deadline greet_until, std::string& why, status& fatal, greeter greet, void* ctx) {
    close();
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0 || !res) {
      why = "cannot resolve '" + host_ + "': " + ::gai_strerror(rc);
      return false;
    }
    bool ok = false;
    for (addrinfo* ai = res; ai && !ok; ai = ai->ai_next) {
      fd_ = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd_ < 0) {
        why = std::strerror(errno);
        continue;
      }
      int err = ::connect(fd_, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
      if (err == EINPROGRESS || err == EINTR) {
        int ms =
            static_cast<int>(deadline::min(until, deadline::after(milliseconds(5000))).remaining().count());
        short ev = 0;
        for (auto t = deadline::after(milliseconds(ms)); !ev && !t.expired();)
          ev = wait_fd(fd_, POLLOUT, static_cast<int>(t.remaining().count()));
        socklen_t len = sizeof err;
        if (!ev)
          err = ETIMEDOUT;
        else if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = errno;
      }
      if (err == 0) {
        int one = 1;
        (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        (void)::setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        status st = greet(ctx, greet_until);
        if (st.ok()) {
          ok = true;
          break;
        }
        close();
        why = st.message();
        if (st.code() == errc::bootstrap_error || st.code() == errc::protocol_error) {
          fatal = st;
          break;
        }
        continue;
      }
      why = std::strerror(err);
      close();
    }
    ::freeaddrinfo(res);
    if (!ok && why.empty()) why = "no address";
    return ok;
  }

  /// connect_once() (each greeting bounded by `greet_cap` too), retried with
  /// backoff (10 ms doubling to 1 s) until it works, fails for good
  /// (`fatal`), or `until` passes: then errc::timeout, "could not connect to
  /// `what` at host:port within N ms (last error: ...); `hint`".
  status connect_until(deadline until, milliseconds greet_cap, status& fatal, greeter greet, void* ctx,
                       const char* what, const char* hint) {
    auto t0 = clock::now();
    milliseconds backoff(10);
    std::string why;
    for (;;) {
      if (connect_once(until, deadline::min(until, deadline::after(greet_cap)), why, fatal, greet, ctx)) return {};
      if (!fatal.ok()) return fatal;
      if (until.expired())
        return make_error(errc::timeout, "could not connect to %s at %s within %lld ms (last error: %s); %s", what,
                          endpoint_.c_str(), elapsed_ms(t0), why.c_str(), hint);
      sleep_ms(static_cast<int>(std::min(backoff, until.remaining()).count()));
      backoff = std::min(backoff * 2, milliseconds(1000));
    }
  }

  /// Moves all `n` bytes or fails; any failure closes the connection. `during`
  /// names the operation for messages ("get of key 'x'").
  status io(bool write, char* p, std::size_t n, deadline until, const std::string& during) {
    while (n > 0) {
      long k = write ? ::send(fd_, p, n, MSG_NOSIGNAL) : ::recv(fd_, p, n, 0);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        continue;
      }
      const int err = k == 0 ? 0 : errno;
      if (k < 0 && err == EINTR) continue;
      if (k == 0 || (err != EAGAIN && err != EWOULDBLOCK)) {
        close();
        return make_error(errc::peer_lost, "lost connection to the rendezvous store at %s (%s gone?) during %s: %s",
                          endpoint_.c_str(), owner_, during.c_str(), k == 0 ? "connection closed" : std::strerror(err));
      }
      if (until.expired()) {
        close();
        return make_error(errc::timeout,
                          "the rendezvous store at %s did not answer %s in time; is %s stuck or overloaded?",
                          endpoint_.c_str(), during.c_str(), owner_);
      }
      (void)wait_fd(fd_, static_cast<short>(write ? POLLOUT : POLLIN),
                    static_cast<int>(until.remaining(milliseconds(1000)).count()));
    }
    return {};
  }

  /// One recv() of up to `n` bytes once any arrive (at least one, or an
  /// error): for a reply whose first bytes tell its sender apart. Unlike io(),
  /// a timeout leaves the connection open (the caller may send more and wait
  /// again).
  result<std::size_t> read_some(char* p, std::size_t n, deadline until, const std::string& during) {
    for (;;) {
      long k = ::recv(fd_, p, n, 0);
      if (k > 0) return static_cast<std::size_t>(k);
      const int err = k == 0 ? 0 : errno;
      if (k < 0 && err == EINTR) continue;
      if (k == 0 || (err != EAGAIN && err != EWOULDBLOCK)) {
        close();
        return make_error(errc::peer_lost, "the rendezvous store at %s closed the connection during %s: %s",
                          endpoint_.c_str(), during.c_str(), k == 0 ? "connection closed" : std::strerror(err));
      }
      if (until.expired())
        return make_error(errc::timeout, "the rendezvous store at %s did not answer %s in time",
                          endpoint_.c_str(), during.c_str());
      (void)wait_fd(fd_, POLLIN, static_cast<int>(until.remaining(milliseconds(1000)).count()));
    }
  }

 private:
  int fd_ = -1;
  std::string host_;
  std::uint16_t port_;
  std::string endpoint_;
  const char* owner_;
  poll_hook hook_;
};

}  // namespace cclite::tcp::detail
CCLITE_SETUP_CODE_END
