// cclite/tcp/socket.hpp - the POSIX socket pieces of the TCP data path.
//
// The data path uses plain non-blocking sockets driven by poll(), like NCCL's
// socket transport, not Asio (the TCP store does the same). Reasons:
//   - cclite's progress model is the caller's: link::poll()/wait() move bytes
//     when an algorithm asks, on the caller's thread. Asio's model is an
//     executor running completion handlers; bridging the two costs a handler
//     allocation/dispatch per operation and hides the loop we need to control.
//   - recv() lands bytes straight into the link's staging ring at their stream
//     position (zero extra copies); send() reads straight from the send ring.
//   - Nothing here needs exceptions, RTTI or threads.
//
// Contents: socket_fd (RAII descriptor), endpoint ("addr:port" text <->
// sockaddr), socket options, deadline-bounded helpers used only during
// connection setup, and mapped_memory (the links' staging rings).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/ifname.hpp>

namespace cclite::tcp {

/// Owns one file descriptor; closes it on destruction. Movable, not copyable.
class socket_fd {
 public:
  socket_fd() noexcept = default;
  explicit socket_fd(int fd) noexcept : fd_(fd) {}
  socket_fd(socket_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  socket_fd& operator=(socket_fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  socket_fd(const socket_fd&) = delete;
  socket_fd& operator=(const socket_fd&) = delete;
  ~socket_fd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

/// An IPv4 or IPv6 address and port. Text form: "192.0.2.2:41234" or
/// "[fd00::2]:41234" (the value of the store key "tcp/<rank>").
struct endpoint {
  sockaddr_storage addr{};

  int family() const noexcept { return addr.ss_family; }
  socklen_t size() const noexcept {
    return static_cast<socklen_t>(family() == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  }
  const sockaddr* sa() const noexcept { return reinterpret_cast<const sockaddr*>(&addr); }
  int port() const noexcept {
    if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
    if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
    return 0;
  }
  void set_port(int p) noexcept {
    if (family() == AF_INET) reinterpret_cast<sockaddr_in&>(addr).sin_port = htons(static_cast<std::uint16_t>(p));
    if (family() == AF_INET6) reinterpret_cast<sockaddr_in6&>(addr).sin6_port = htons(static_cast<std::uint16_t>(p));
  }
CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  std::string to_string() const {
    std::string a = address_text(addr);
    if (family() == AF_INET6) a = "[" + a + "]";
    return a + ":" + std::to_string(port());
  }

  static endpoint from(const sockaddr_storage& a) {
    endpoint e;
    e.addr = a;
    return e;
  }

  /// Parses "1.2.3.4:5", "[::1]:5". Errors: protocol_error (it came from the store).
  static result<endpoint> parse(const std::string& text) {
    std::string host, port;
    if (!text.empty() && text[0] == '[') {
      auto close = text.find(']');
      if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
        return make_error(errc::protocol_error, "malformed tcp endpoint '%s' (want [addr]:port)",
                          text.c_str());
      }
      host = text.substr(1, close - 1);
      port = text.substr(close + 2);
    } else {
      auto colon = text.rfind(':');
      if (colon == std::string::npos) {
        return make_error(errc::protocol_error, "malformed tcp endpoint '%s' (want addr:port)",
                          text.c_str());
      }
      host = text.substr(0, colon);
      port = text.substr(colon + 1);
    }
    char* end = nullptr;
    long p = std::strtol(port.c_str(), &end, 10);
    net_interface i = make_interface("", host);
    if (port.empty() || *end != '\0' || p <= 0 || p > 65535 || i.family == AF_UNSPEC) {
      return make_error(errc::protocol_error, "malformed tcp endpoint '%s'", text.c_str());
    }
    endpoint e = from(i.addr);
    e.set_port(static_cast<int>(p));
    return e;
  }
CCLITE_SETUP_CODE_END
};

namespace detail {
CCLITE_SETUP_CODE_BEGIN  // set-up code (connections, handshakes): compiled for size

inline std::string errno_text(int e) {
  char buf[128];
  // GNU strerror_r may return a static string instead of filling buf.
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  return ::strerror_r(e, buf, sizeof buf);
#else
  if (::strerror_r(e, buf, sizeof buf) != 0) return "errno " + std::to_string(e);
  return buf;
#endif
}

/// Keepalive: probe after 10 s idle, every 5 s, give up after 3 misses, so a
/// peer whose host died (no FIN/RST ever comes) is noticed in ~25 s instead of
/// the kernel default of two hours. Linux sends no keepalive probes while sent
/// data waits for its acknowledgement; then it retransmits for ~15 minutes
/// (tcp_retries2), so TCP_USER_TIMEOUT bounds that too, at the same 25 s. A
/// live peer's kernel acknowledges within moments even when the process is
/// late or busy: a sender here never has more in flight than the receiver
/// granted (a rank 45 s late over tcp: no error). A dead *process* is seen at
/// once (its kernel closes the sockets).
/// The 25 s ("silent limit") is CCLITE_TCP_KEEPALIVE (transport_config::
/// keepalive_s): shorter finds a lost host sooner, longer rides out a network
/// that stalls for longer (a switch reboot, a congested uplink).
/// Test: tests/netns host_lost.
inline constexpr int default_silent_s = 25;
inline constexpr int min_silent_s = 3, max_silent_s = 86400;

/// How a silent limit of `silent_s` seconds splits into keepalive's idle time,
/// probe interval and probe count: 3 probes a fifth of it apart at the end,
/// the rest idle (25 s: 10 + 3 x 5; 8 s: 5 + 3 x 1).
struct keepalive_plan {
  int idle_s, interval_s, count;
};
inline constexpr keepalive_plan keepalive_for(int silent_s) noexcept {
  const int interval = silent_s / 5 > 1 ? silent_s / 5 : 1;
  const int idle = silent_s - 3 * interval > 1 ? silent_s - 3 * interval : 1;
  return {idle, interval, 3};
}

/// Options of every data socket. `sockbuf` > 0 sets SO_SNDBUF/SO_RCVBUF (which
/// turns off Linux's buffer autotuning); 0 keeps the kernel's autotuning.
/// Buffer sizes must be set before connect()/listen() to affect window scaling.
/// `silent_s`: the silent limit above.
inline status set_socket_options(int fd, int sockbuf, int silent_s) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0) {
    return make_error(errc::system_error, "setsockopt(TCP_NODELAY/SO_KEEPALIVE) failed: %s",
                      errno_text(errno).c_str());
  }
#if defined(TCP_KEEPIDLE) && defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
  const keepalive_plan k = keepalive_for(silent_s);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k.idle_s, sizeof k.idle_s);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k.interval_s, sizeof k.interval_s);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k.count, sizeof k.count);
#endif
#if defined(TCP_USER_TIMEOUT)
  const unsigned user_ms = unsigned(silent_s) * 1000u;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
#endif
  if (sockbuf > 0) {
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
  }
  return {};
}

/// A non-blocking, close-on-exec TCP socket of `family`.
inline result<socket_fd> make_socket(int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    int e = errno;
    return make_error(e == EMFILE || e == ENFILE ? errc::resource_exhausted : errc::system_error,
                      "socket() failed: %s", errno_text(e).c_str());
  }
  return socket_fd(fd);
}

/// A non-blocking listening socket on `at` (port 0 = ephemeral).
inline result<socket_fd> listen_on(const endpoint& at, int sockbuf, int silent_s) {
  auto s = make_socket(at.family());
  if (!s) return s.error();
  int one = 1;
  (void)::setsockopt(s->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  CCLITE_TRY(set_socket_options(s->get(), sockbuf, silent_s));  // inherited by accepted sockets
  if (::bind(s->get(), at.sa(), at.size()) != 0) {
    return make_error(errc::system_error, "bind(%s) failed: %s", at.to_string().c_str(),
                      errno_text(errno).c_str());
  }
  if (::listen(s->get(), SOMAXCONN) != 0) {
    return make_error(errc::system_error, "listen(%s) failed: %s", at.to_string().c_str(),
                      errno_text(errno).c_str());
  }
  return std::move(s.value());
}

/// The address a socket is bound to (listen port after binding port 0).
inline result<endpoint> local_endpoint(int fd) {
  endpoint e;
  socklen_t len = sizeof e.addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&e.addr), &len) != 0) {
    return make_error(errc::system_error, "getsockname() failed: %s", errno_text(errno).c_str());
  }
  return e;
}

/// poll() on one descriptor for at most `slice`; returns revents (0 on timeout/EINTR).
inline short poll_one(int fd, short events, milliseconds slice) {
  pollfd p{fd, events, 0};
  int r = ::poll(&p, 1, static_cast<int>(slice.count()));
  return r > 0 ? p.revents : 0;
}

/// The check every setup loop runs each slice: abort flag, then deadline.
inline status setup_check(deadline until, const std::atomic<bool>* aborted, const char* what) {
  if (aborted && aborted->load(std::memory_order_relaxed)) {
    return make_error(errc::aborted, "communicator aborted while %s", what);
  }
  if (until.expired()) return make_error(errc::timeout, "timed out %s", what);
  return {};
}

/// Writes all of [p, p+n) to a non-blocking socket during setup, bounded by
/// `until`. `what` completes "timed out <what>" / "... while <what>".
inline status write_all(int fd, const void* p, std::size_t n, deadline until,
                        const std::atomic<bool>* aborted, const char* what) {
  auto* b = static_cast<const std::uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      b += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return make_error(errc::peer_lost, "connection lost while %s: %s", what,
                        errno_text(errno).c_str());
    }
    CCLITE_TRY(setup_check(until, aborted, what));
    poll_one(fd, POLLOUT, until.remaining(milliseconds(50)));
  }
  return {};
}

/// Reads exactly n bytes during setup, bounded by `until`. EOF -> peer_lost.
inline status read_exact(int fd, void* p, std::size_t n, deadline until,
                         const std::atomic<bool>* aborted, const char* what) {
  auto* b = static_cast<std::uint8_t*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, b, n, MSG_DONTWAIT);
    if (r > 0) {
      b += r;
      n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return make_error(errc::peer_lost, "connection closed by the other side while %s", what);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return make_error(errc::peer_lost, "connection lost while %s: %s", what,
                        errno_text(errno).c_str());
    }
    CCLITE_TRY(setup_check(until, aborted, what));
    poll_one(fd, POLLIN, until.remaining(milliseconds(50)));
  }
  return {};
}
CCLITE_SETUP_CODE_END

/// Anonymous page-aligned memory (mmap), released on destruction. Movable.
class mapped_memory {
 public:
  mapped_memory() noexcept = default;
  mapped_memory(mapped_memory&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  mapped_memory& operator=(mapped_memory&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  mapped_memory(const mapped_memory&) = delete;
  mapped_memory& operator=(const mapped_memory&) = delete;
  ~mapped_memory() { release(); }

  /// Maps and touches n bytes, so that the first collectives do not fault.
  /// Touched twice: by the kernel (a read from /dev/zero writes every page)
  /// and by the program. The rings are copied by both (sendmsg / recvmsg,
  /// and the primitives' copies in and out), and under a hypervisor that
  /// shadows the kernel's and the program's views of user pages apart (this
  /// project's VM) each view's first touch of a page costs ~5 us, populated
  /// or not. Measured there: the first 64 tcp allreduces of 64 KiB took 200
  /// us each, then 40 (docs/performance.md, "Session 17"). Elsewhere the
  /// second touch costs what a memset does.
  static result<mapped_memory> map(std::size_t n) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_POPULATE
    flags |= MAP_POPULATE;
#endif
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) {
      return make_error(errc::resource_exhausted, "cannot map %zu bytes of tcp staging memory: %s",
                        n, errno_text(errno).c_str());
    }
    std::size_t done = 0;
    const int zero = ::open("/dev/zero", O_RDONLY | O_CLOEXEC);
    while (zero >= 0 && done < n) {
      const ssize_t k = ::read(zero, static_cast<std::uint8_t*>(p) + done, n - done);
      if (k <= 0 && errno == EINTR) continue;
      if (k <= 0) break;
      done += static_cast<std::size_t>(k);
    }
    if (zero >= 0) ::close(zero);
    auto* b = static_cast<volatile std::uint8_t*>(p);
    for (std::size_t i = 0; i < n; i += 4096) b[i] = 0;
    mapped_memory m;
    m.p_ = static_cast<std::uint8_t*>(p);
    m.n_ = n;
    return {std::move(m)};  // nvcc: no implicit move into result<T> (CWG1579)
  }
  std::uint8_t* data() const noexcept { return p_; }

 private:
  void release() noexcept {
    if (p_) ::munmap(p_, n_);
    p_ = nullptr;
    n_ = 0;
  }
  std::uint8_t* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace detail
}  // namespace cclite::tcp
