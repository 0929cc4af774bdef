// tools/run/net.hpp - name resolution and addresses for the agents'
// rendezvous: is a host this machine, which local address routes to it.
#pragma once

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

namespace cclite::run {

/// Numeric addresses `host` resolves to.
inline std::vector<std::string> resolve_all(const std::string& host) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* p = res; p; p = p->ai_next) {
    char buf[NI_MAXHOST];
    if (::getnameinfo(p->ai_addr, p->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0)
      out.push_back(buf);
  }
  ::freeaddrinfo(res);
  return out;
}

/// The address of this machine that `host` names, or "" when it names
/// another machine: binding a socket to it succeeds only if it is ours.
inline std::string local_address_of(const std::string& host) {
  for (const std::string& a : resolve_all(host)) {
    addrinfo hints{};
    hints.ai_flags = AI_NUMERICHOST;
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(a.c_str(), "0", &hints, &res) != 0) continue;
    int fd = ::socket(res->ai_family, SOCK_DGRAM, 0);
    bool ours = fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0;
    if (fd >= 0) ::close(fd);
    ::freeaddrinfo(res);
    if (ours) return a;
  }
  return {};
}

/// The source address the kernel would use to reach host:port (a UDP
/// connect() sends nothing): the address of the interface that routes there.
inline std::string route_address_to(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return {};
  std::string out;
  for (addrinfo* p = res; p && out.empty(); p = p->ai_next) {
    int fd = ::socket(p->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage me{};
    socklen_t len = sizeof me;
    if (::connect(fd, p->ai_addr, p->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
      char buf[NI_MAXHOST];
      if (::getnameinfo(reinterpret_cast<sockaddr*>(&me), len, buf, sizeof buf, nullptr, 0,
                        NI_NUMERICHOST) == 0)
        out = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

/// A loopback address literal (a name is not one, whatever it resolves to).
inline bool is_loopback(const std::string& a) {
  return a.rfind("127.", 0) == 0 || a == "::1" || a.rfind("::ffff:127.", 0) == 0;
}

/// CCLITE_DEBUG (or NCCL_DEBUG) is INFO or TRACE.
inline bool debug_on() {
  const char* d = std::getenv("CCLITE_DEBUG");
  if (!d) d = std::getenv("NCCL_DEBUG");
  if (!d) return false;
  std::string v(d);
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return v == "INFO" || v == "TRACE";
}


}  // namespace cclite::run
