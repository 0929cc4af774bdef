// cclite/tcp/ifname.hpp - which network interface the TCP transport listens on.
//
// CCLITE_SOCKET_IFNAME (fallback NCCL_SOCKET_IFNAME) uses NCCL's syntax:
//
//   eth,ib        interfaces whose name starts with "eth" or "ib"
//   ^docker,lo    every interface except those starting with "docker" or "lo"
//   =eth0         exactly eth0 (not eth01)
//   ^=eth0        every interface except exactly eth0
//
// CCLITE_SOCKET_FAMILY=AF_INET|AF_INET6 (fallback NCCL_SOCKET_FAMILY) restricts
// the address family. Without it IPv4 addresses are preferred over IPv6 on any
// matching interface; IPv6 link-local addresses (fe80::/10) are never used
// because they need a scope id to be reachable from another host (NCCL skips
// them too). An interface must be UP.
//
// Without CCLITE_SOCKET_IFNAME: the interface that routes to the rendezvous
// host (CCLITE_RDZV_ENDPOINT, else MASTER_ADDR), when that is not loopback:
// every node reaches that host, so this is the network the nodes share (NCCL
// matches the subnet of NCCL_COMM_ID the same way). Otherwise the first
// interface that is not lo, docker*, veth*, virbr* or br-* (container and
// bridge plumbing that other hosts cannot reach); if there is none, lo, so
// that a single-machine job still works. The INFO line says which rule chose.
//
// The parsing and matching functions are pure (no system calls) so they can be
// unit-tested against invented interface lists; choose_interface() is the one
// entry point that reads the environment and calls getifaddrs().
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>
#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::tcp {

/// A parsed interface specification (the value of CCLITE_SOCKET_IFNAME).
struct ifname_spec {
  bool exclude = false;              ///< leading '^': the names are a deny list
  bool exact = false;                ///< leading '=' (after '^'): whole names, not prefixes
  std::vector<std::string> names;    ///< empty items and surrounding spaces dropped
};

/// Parses "eth,ib", "^docker,lo", "=eth0", "^=eth0". Never fails: an empty
/// string gives an empty allow list (which matches nothing).
inline ifname_spec parse_ifname_spec(const std::string& text) {
  ifname_spec spec;
  std::size_t i = 0;
  auto skip_spaces = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  };
  skip_spaces();
  if (i < text.size() && text[i] == '^') {
    spec.exclude = true;
    ++i;
  }
  skip_spaces();
  if (i < text.size() && text[i] == '=') {
    spec.exact = true;
    ++i;
  }
  std::string item;
  for (; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',') {
      std::size_t b = item.find_first_not_of(" \t");
      std::size_t e = item.find_last_not_of(" \t");
      if (b != std::string::npos) spec.names.push_back(item.substr(b, e - b + 1));
      item.clear();
    } else {
      item += text[i];
    }
  }
  return spec;
}

/// True if interface `name` is selected by `spec`.
inline bool ifname_matches(const ifname_spec& spec, const std::string& name) {
  bool listed = false;
  for (const auto& n : spec.names) {
    if (spec.exact ? name == n : name.compare(0, n.size(), n) == 0) {
      listed = true;
      break;
    }
  }
  return listed != spec.exclude;
}

/// One address of one interface, as getifaddrs() reports it.
struct net_interface {
  std::string name;
  int family = AF_UNSPEC;         ///< AF_INET or AF_INET6
  sockaddr_storage addr{};        ///< port 0
  bool up = false;                ///< IFF_UP
  bool loopback = false;          ///< IFF_LOOPBACK
};

/// Numeric text of an IPv4/IPv6 address ("192.0.2.2", "fd00::2"), port ignored.
inline std::string address_text(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  } else if (a.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  } else {
    return "?";
  }
  return buf;
}

/// Builds a net_interface from numeric text (tests, and parsing endpoints).
/// Returns an entry with family AF_UNSPEC if `address` is not an IP address.
inline net_interface make_interface(const std::string& name, const std::string& address,
                                    bool up = true, bool loopback = false) {
  net_interface i;
  i.name = name;
  i.up = up;
  i.loopback = loopback;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&i.addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&i.addr);
  if (::inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    i.family = AF_INET;
  } else if (::inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    i.family = AF_INET6;
  }
  return i;
}

/// Every IPv4/IPv6 address of every interface (up or not), in getifaddrs order.
inline result<std::vector<net_interface>> list_interfaces() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) {
    return make_error(errc::system_error, "getifaddrs() failed: %s", std::strerror(errno));
  }
  std::vector<net_interface> out;
  for (ifaddrs* p = all; p; p = p->ifa_next) {
    if (!p->ifa_addr || !p->ifa_name) continue;
    int fam = p->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    net_interface i;
    i.name = p->ifa_name;
    i.family = fam;
    std::memcpy(&i.addr, p->ifa_addr, fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    i.up = (p->ifa_flags & IFF_UP) != 0;
    i.loopback = (p->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(std::move(i));
  }
  ::freeifaddrs(all);
  return out;
}

/// The interface the transport will use, and why (for the INFO log line).
struct chosen_interface {
  net_interface iface;
  std::string reason;  ///< "CCLITE_SOCKET_IFNAME='=eth0' selects eth0 192.0.2.2"
};

namespace detail {
inline bool usable(const net_interface& i, int family) {
  if (!i.up || i.family != family) return false;
  if (family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(i.addr).sin6_addr;
    if (IN6_IS_ADDR_LINKLOCAL(&a6)) return false;
  }
  return true;
}

// The families to try, in order: AF_INET then AF_INET6, or just the forced one.
inline int families(int forced, int out[2]) {
  if (forced == AF_INET || forced == AF_INET6) {
    out[0] = forced;
    return 1;
  }
  out[0] = AF_INET;
  out[1] = AF_INET6;
  return 2;
}

template <class Pred>
const net_interface* first_match(const std::vector<net_interface>& ifs, int forced, Pred pred) {
  int fams[2];
  int nf = families(forced, fams);
  for (int f = 0; f < nf; ++f)
    for (const auto& i : ifs)
      if (usable(i, fams[f]) && pred(i)) return &i;
  return nullptr;
}

inline std::string describe_all(const std::vector<net_interface>& ifs) {
  std::string s;
  for (const auto& i : ifs) {
    if (!s.empty()) s += ", ";
    s += i.name + " " + address_text(i.addr) + (i.up ? "" : " (down)");
  }
  return s.empty() ? std::string("none") : s;
}
}  // namespace detail

/// Interface name prefixes skipped when CCLITE_SOCKET_IFNAME is unset.
inline const char* const default_excluded_prefixes = "lo,docker,veth,virbr,br-";

/// Picks the interface from `ifs` (pure). `spec_text` is the value of the
/// variable named `spec_source` (nullptr: unset); `family` is AF_INET,
/// AF_INET6 or AF_UNSPEC (prefer IPv4). Errors: invalid_argument when the
/// variable selects nothing (the message lists the interfaces that exist),
/// unsupported when the machine has no usable address at all.
/// `route_src`: this machine's address on the route to the rendezvous host
/// `route_dst` (route_source_to()); empty when unknown. Used only when the
/// variable is unset, and only when it is not a loopback interface's.
inline result<chosen_interface> select_interface(const std::vector<net_interface>& ifs,
                                                 const char* spec_text,
                                                 const char* spec_source = "CCLITE_SOCKET_IFNAME",
                                                 int family = AF_UNSPEC,
                                                 const std::string& route_src = {},
                                                 const std::string& route_dst = {}) {
  chosen_interface c;
  if (spec_text && *spec_text) {
    ifname_spec spec = parse_ifname_spec(spec_text);
    const net_interface* m =
        detail::first_match(ifs, family, [&](const net_interface& i) { return ifname_matches(spec, i.name); });
    if (!m) {
      return make_error(errc::invalid_argument,
                        "%s='%s' selects no interface that is up with a usable %s address; "
                        "interfaces here: %s (syntax: 'eth,ib' prefixes, '^docker,lo' excludes, "
                        "'=eth0' exact name)",
                        spec_source, spec_text,
                        family == AF_INET ? "IPv4" : family == AF_INET6 ? "IPv6" : "IPv4/IPv6",
                        detail::describe_all(ifs).c_str());
    }
    c.iface = *m;
    c.reason = std::string(spec_source) + "='" + spec_text + "' selects " + m->name + " " +
               address_text(m->addr);
    return c;
  }
  if (!route_src.empty()) {
    if (const net_interface* m = detail::first_match(ifs, family, [&](const net_interface& i) {
          return !i.loopback && address_text(i.addr) == route_src;
        })) {
      c.iface = *m;
      c.reason = m->name + " " + route_src +
                 " (CCLITE_SOCKET_IFNAME unset: the interface that routes to the rendezvous host " + route_dst +
                 ", which every node reaches)";
      return c;
    }
  }
  ifname_spec skip = parse_ifname_spec(std::string("^") + default_excluded_prefixes);
  if (const net_interface* m = detail::first_match(
          ifs, family, [&](const net_interface& i) { return !i.loopback && ifname_matches(skip, i.name); })) {
    c.iface = *m;
    c.reason = m->name + " " + address_text(m->addr) +
               " (CCLITE_SOCKET_IFNAME unset: first interface that is up and not lo, docker*, "
               "veth*, virbr*, br-*)";
    return c;
  }
  if (const net_interface* m = detail::first_match(
          ifs, family, [](const net_interface& i) { return i.loopback || i.name.compare(0, 2, "lo") == 0; })) {
    c.iface = *m;
    c.reason = m->name + " " + address_text(m->addr) +
               " (CCLITE_SOCKET_IFNAME unset and no other interface is up: single-machine only)";
    return c;
  }
  if (const net_interface* m = detail::first_match(ifs, family, [](const net_interface&) { return true; })) {
    c.iface = *m;
    c.reason = m->name + " " + address_text(m->addr) +
               " (CCLITE_SOCKET_IFNAME unset; only container/bridge interfaces are up)";
    return c;
  }
  return make_error(errc::unsupported,
                    "no network interface is up with a usable IP address (interfaces: %s); "
                    "the tcp transport cannot listen",
                    detail::describe_all(ifs).c_str());
}

/// Parses CCLITE_SOCKET_FAMILY: "AF_INET"/"4"/"ipv4", "AF_INET6"/"6"/"ipv6", or unset.
inline result<int> parse_socket_family(const std::string& v) {
  if (v.empty()) return AF_UNSPEC;
  std::string s = v;
  for (auto& ch : s)
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  if (s == "af_inet" || s == "4" || s == "ipv4" || s == "inet") return AF_INET;
  if (s == "af_inet6" || s == "6" || s == "ipv6" || s == "inet6") return AF_INET6;
  return make_error(errc::invalid_argument,
                    "CCLITE_SOCKET_FAMILY='%s' is not an address family (use AF_INET or AF_INET6)",
                    v.c_str());
}

/// The source address the kernel would use to reach `host` ("" when it does
/// not resolve or there is no route). A UDP connect() sends nothing.
inline std::string route_source_to(const std::string& host, int family = AF_UNSPEC) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (host.empty() || ::getaddrinfo(host.c_str(), "9", &hints, &res) != 0) return {};
  std::string out;
  for (addrinfo* p = res; p && out.empty(); p = p->ai_next) {
    int fd = ::socket(p->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage me{};
    socklen_t len = sizeof me;
    if (::connect(fd, p->ai_addr, p->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0)
      out = address_text(me);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

/// The rendezvous host the launcher gave (CCLITE_RDZV_ENDPOINT's host, else
/// MASTER_ADDR), without brackets; "" when neither is set.
inline std::string rendezvous_host_from_env() {
  std::string ep = env::get_string("RDZV_ENDPOINT", {}, false);
  if (ep.empty()) {
    const char* m = std::getenv("MASTER_ADDR");
    ep = m ? m : "";
    if (ep.size() > 2 && ep.front() == '[' && ep.back() == ']') ep = ep.substr(1, ep.size() - 2);
    return ep;
  }
  if (ep[0] == '[') {
    auto close = ep.find(']');
    return close == std::string::npos ? std::string() : ep.substr(1, close - 1);
  }
  auto colon = ep.rfind(':');
  return colon == std::string::npos ? ep : ep.substr(0, colon);
}

/// Reads CCLITE_SOCKET_IFNAME / NCCL_SOCKET_IFNAME and CCLITE_SOCKET_FAMILY /
/// NCCL_SOCKET_FAMILY, enumerates the interfaces and selects one.
inline result<chosen_interface> choose_interface() {
  const char* source = "CCLITE_SOCKET_IFNAME";
  const char* spec = env::raw("SOCKET_IFNAME", false);
  if (!spec || !*spec) {
    spec = env::raw("SOCKET_IFNAME", true);
    source = "NCCL_SOCKET_IFNAME";
  }
  auto fam = parse_socket_family(env::get_string("SOCKET_FAMILY"));
  if (!fam) return fam.error();
  auto ifs = list_interfaces();
  if (!ifs) return ifs.error();
  std::string dst, src;
  if (!spec || !*spec) {
    dst = rendezvous_host_from_env();
    src = route_source_to(dst, fam.value());
  }
  return select_interface(ifs.value(), spec, source, fam.value(), src, dst);
}

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
