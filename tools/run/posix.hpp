// tools/run/posix.hpp - small POSIX helpers for cclite-run: whole writes, fd
// flags, signal names, the host name and a free TCP port.
//
// cclite-run depends on nothing but POSIX and the C++ standard library, so that
// it builds and works even where the rest of cclite is not configured.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <random>
#include <string>

namespace cclite::run {

/// Writes all of [data, data + size) to `fd`, retrying on EINTR and waiting out
/// EAGAIN (our stdout may be a non-blocking fd inherited from the caller).
/// Returns false on a hard error such as EPIPE (the reader went away); the
/// caller then stops writing to that fd but keeps supervising the job.
inline bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return false;
    }
  }
  return true;
}

inline bool write_all(int fd, const std::string& s) { return write_all(fd, s.data(), s.size()); }

/// Marks `fd` close-on-exec: a worker must not inherit the other workers' pipe
/// ends, or those pipes would never reach EOF.
inline bool set_cloexec(int fd) {
  int flags = ::fcntl(fd, F_GETFD);
  return flags >= 0 && ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) == 0;
}

inline bool set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

/// A pipe whose both ends are close-on-exec. Returns false and sets errno on failure.
inline bool make_cloexec_pipe(int fds[2]) {
  if (::pipe(fds) != 0) return false;
  if (!set_cloexec(fds[0]) || !set_cloexec(fds[1])) {
    int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    errno = e;
    return false;
  }
  return true;
}

inline void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

/// "SIGSEGV" for SIGSEGV; "signal 42" for signals without a portable name.
inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGCHLD:
      return "SIGCHLD";
    case SIGCONT:
      return "SIGCONT";
    case SIGSTOP:
      return "SIGSTOP";
    case SIGTSTP:
      return "SIGTSTP";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "signal " + std::to_string(sig);
  }
}

inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// Binds a TCP socket to ipv4_addr:port (a name or an unparsable address: any
// address) and closes it. Returns 0 or bind's errno; `port` 0 asks the kernel
// for one, and *bound gets the port bound.
inline int try_bind(const char* ipv4_addr, int port, int* bound, std::string& error) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    error = std::string("socket(): ") + std::strerror(errno);
    return errno ? errno : EINVAL;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, ipv4_addr, &addr.sin_addr) != 1) addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  int e = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    e = errno;
    error = std::string("bind(") + ipv4_addr + ":" + std::to_string(port) + "): " + std::strerror(e);
  } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    e = errno;
    error = std::string("getsockname(): ") + std::strerror(e);
  } else if (bound) {
    *bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return e;
}

/// A TCP port free on `ipv4_addr` now, for a listener that binds it later
/// (MASTER_PORT: rank 0's worker), or 0 with `error` set. Picked at random
/// outside the kernel's ephemeral range (net.ipv4.ip_local_port_range): a
/// port that bind(0) hands out is free again once released, and any
/// process's next outgoing connection may get it before the listener binds
/// (torchrun's start-up "address already in use"; this project's CI hit it).
/// Outside that range only another explicit bind competes. Falls back to the
/// kernel's choice when 200 random ports are all taken.
inline int find_free_port(const char* ipv4_addr, std::string& error) {
  int lo = 32768, hi = 60999;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
    std::fclose(f);
  }
  // Below the ephemeral range when there is room (above the well-known and
  // commonly registered ports), else above it.
  const int from = lo > 12000 ? 10000 : hi + 1, to = lo > 12000 ? lo - 1 : 65535;
  if (to > from) {
    std::minstd_rand rng(static_cast<unsigned>(::getpid()) ^
                         static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    for (int tries = 0; tries < 200; ++tries) {
      const int p = from + static_cast<int>(rng() % static_cast<unsigned>(to - from + 1));
      std::string ignored;
      if (try_bind(ipv4_addr, p, nullptr, ignored) == 0) return p;
    }
  }
  int port = 0;
  return try_bind(ipv4_addr, 0, &port, error) == 0 ? port : 0;
}

}  // namespace cclite::run
