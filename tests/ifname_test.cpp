// Interface selection (CCLITE_SOCKET_IFNAME / NCCL_SOCKET_IFNAME syntax): the
// parsing and matching are tested on invented interface lists; one case uses
// the machine's real interfaces (lo always exists).
#include <cclite/tcp/ifname.hpp>

#include <doctest/doctest.h>
#include <stdlib.h>

#include <string>
#include <vector>

using cclite::errc;
using cclite::tcp::address_text;
using cclite::tcp::ifname_matches;
using cclite::tcp::make_interface;
using cclite::tcp::net_interface;
using cclite::tcp::parse_ifname_spec;
using cclite::tcp::select_interface;

namespace {
std::vector<net_interface> machine(std::initializer_list<net_interface> l) { return l; }
net_interface lo() { return make_interface("lo", "127.0.0.1", true, true); }

// Restores an environment variable on scope exit.
struct env_guard {
  std::string name;
  std::string old;
  bool had;
  env_guard(const char* n, const char* value) : name(n) {
    const char* o = ::getenv(n);
    had = o != nullptr;
    if (o) old = o;
    if (value) ::setenv(n, value, 1);
    else ::unsetenv(n);
  }
  ~env_guard() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};
}  // namespace

TEST_CASE("ifname: spec parsing") {
  auto s = parse_ifname_spec("eth,ib");
  CHECK_FALSE(s.exclude);
  CHECK_FALSE(s.exact);
  REQUIRE(s.names.size() == 2);
  CHECK(s.names[0] == "eth");
  CHECK(s.names[1] == "ib");

  s = parse_ifname_spec("^docker,lo");
  CHECK(s.exclude);
  CHECK_FALSE(s.exact);
  CHECK(s.names == std::vector<std::string>{"docker", "lo"});

  s = parse_ifname_spec("=eth0");
  CHECK_FALSE(s.exclude);
  CHECK(s.exact);
  CHECK(s.names == std::vector<std::string>{"eth0"});

  s = parse_ifname_spec("^=eth0,eth1");
  CHECK(s.exclude);
  CHECK(s.exact);
  CHECK(s.names == std::vector<std::string>{"eth0", "eth1"});

  s = parse_ifname_spec(" eth , ,ib ");  // spaces and empty items are dropped
  CHECK(s.names == std::vector<std::string>{"eth", "ib"});

  CHECK(parse_ifname_spec("").names.empty());
}

TEST_CASE("ifname: matching") {
  auto prefix = parse_ifname_spec("eth,ib");
  CHECK(ifname_matches(prefix, "eth0"));
  CHECK(ifname_matches(prefix, "eth10"));
  CHECK(ifname_matches(prefix, "ib0"));
  CHECK_FALSE(ifname_matches(prefix, "lo"));
  CHECK_FALSE(ifname_matches(prefix, "enp1s0"));

  auto not_docker = parse_ifname_spec("^docker,lo");
  CHECK(ifname_matches(not_docker, "eth0"));
  CHECK_FALSE(ifname_matches(not_docker, "docker0"));
  CHECK_FALSE(ifname_matches(not_docker, "lo"));

  auto exact = parse_ifname_spec("=eth0");
  CHECK(ifname_matches(exact, "eth0"));
  CHECK_FALSE(ifname_matches(exact, "eth01"));
  CHECK_FALSE(ifname_matches(exact, "eth"));

  auto not_exact = parse_ifname_spec("^=eth0");
  CHECK_FALSE(ifname_matches(not_exact, "eth0"));
  CHECK(ifname_matches(not_exact, "eth01"));

  CHECK(ifname_matches(parse_ifname_spec("^"), "anything"));  // empty deny list
  CHECK_FALSE(ifname_matches(parse_ifname_spec(""), "eth0"));  // empty allow list
}

TEST_CASE("ifname: default choice skips loopback and container plumbing") {
  auto ifs = machine({lo(), make_interface("docker0", "172.17.0.1"),
                      make_interface("veth12ab", "169.254.3.1"), make_interface("virbr0", "192.168.122.1"),
                      make_interface("br-5f3a", "172.18.0.1"), make_interface("eth0", "10.1.2.3")});
  auto c = select_interface(ifs, nullptr);
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth0");
  CHECK(address_text(c->iface.addr) == "10.1.2.3");
  CHECK(c->reason.find("eth0") != std::string::npos);
  CHECK(c->reason.find("unset") != std::string::npos);

  // Empty value = unset.
  c = select_interface(ifs, "");
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth0");

  // The first non-virtual interface, in enumeration order.
  c = select_interface(machine({lo(), make_interface("ens5", "10.0.0.5"), make_interface("eth0", "10.1.2.3")}),
                       nullptr);
  REQUIRE(c.ok());
  CHECK(c->iface.name == "ens5");
}

TEST_CASE("ifname: default prefers the interface that routes to the rendezvous host") {
  // A management network first in the list, the network the nodes share second.
  auto ifs = machine({lo(), make_interface("eth0", "192.168.1.7"), make_interface("ib0", "10.5.0.7")});
  auto c = select_interface(ifs, nullptr, "CCLITE_SOCKET_IFNAME", AF_UNSPEC, "10.5.0.7", "node0");
  REQUIRE(c.ok());
  CHECK(c->iface.name == "ib0");
  CHECK(c->reason.find("routes to the rendezvous host node0") != std::string::npos);

  // Loopback routes (a single-machine job) and unknown addresses leave the usual rule.
  c = select_interface(ifs, nullptr, "CCLITE_SOCKET_IFNAME", AF_UNSPEC, "127.0.0.1", "127.0.0.1");
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth0");
  c = select_interface(ifs, nullptr, "CCLITE_SOCKET_IFNAME", AF_UNSPEC, "172.31.9.9", "x");
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth0");

  // The variable, when set, still wins.
  c = select_interface(ifs, "=eth0", "CCLITE_SOCKET_IFNAME", AF_UNSPEC, "10.5.0.7", "node0");
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth0");
}

TEST_CASE("ifname: the rendezvous host comes from the launcher's variables") {
  env_guard a("CCLITE_RDZV_ENDPOINT", "[fd00::1]:29400"), b("MASTER_ADDR", "10.0.0.9");
  CHECK(cclite::tcp::rendezvous_host_from_env() == "fd00::1");
  {
    env_guard c("CCLITE_RDZV_ENDPOINT", "node0:29400");
    CHECK(cclite::tcp::rendezvous_host_from_env() == "node0");
  }
  {
    env_guard c("CCLITE_RDZV_ENDPOINT", nullptr);
    CHECK(cclite::tcp::rendezvous_host_from_env() == "10.0.0.9");
  }
  // The route to loopback leaves from loopback; an unresolvable host has none.
  CHECK(cclite::tcp::route_source_to("127.0.0.1") == "127.0.0.1");
  CHECK(cclite::tcp::route_source_to("").empty());
}

TEST_CASE("ifname: default falls back to lo on a single machine") {
  auto c = select_interface(machine({make_interface("docker0", "172.17.0.1"), lo(),
                                     make_interface("eth0", "10.1.2.3", /*up=*/false)}),
                            nullptr);
  REQUIRE(c.ok());
  CHECK(c->iface.name == "lo");
  CHECK(address_text(c->iface.addr) == "127.0.0.1");
  CHECK(c->reason.find("single-machine") != std::string::npos);

  // No lo either: a container interface is still better than nothing.
  c = select_interface(machine({make_interface("docker0", "172.17.0.1")}), nullptr);
  REQUIRE(c.ok());
  CHECK(c->iface.name == "docker0");
}

TEST_CASE("ifname: interfaces that are down are never chosen") {
  auto ifs = machine({make_interface("eth0", "10.0.0.1", false), make_interface("eth1", "10.0.0.2"), lo()});
  auto c = select_interface(ifs, "eth");
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth1");
  c = select_interface(ifs, "=eth0");
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().code() == errc::invalid_argument);
  CHECK(c.error().message().find("eth0 10.0.0.1 (down)") != std::string::npos);
}

TEST_CASE("ifname: user specification") {
  auto ifs = machine({lo(), make_interface("eth0", "10.0.0.1"), make_interface("eth01", "10.0.0.2"),
                      make_interface("ib0", "10.9.0.1"), make_interface("docker0", "172.17.0.1")});
  auto pick = [&](const char* spec) {
    auto c = select_interface(ifs, spec, "CCLITE_SOCKET_IFNAME");
    REQUIRE(c.ok());
    return c->iface.name;
  };
  CHECK(pick("ib") == "ib0");
  CHECK(pick("ib,eth") == "eth0");  // enumeration order, not list order (as NCCL)
  CHECK(pick("=eth01") == "eth01");
  CHECK(pick("^=eth0,lo") == "eth01");
  CHECK(pick("^lo,eth") == "ib0");
  CHECK(pick("lo") == "lo");  // explicitly asked for: allowed
  CHECK(pick("docker") == "docker0");

  auto c = select_interface(ifs, "=eth0", "NCCL_SOCKET_IFNAME");
  REQUIRE(c.ok());
  CHECK(c->reason.find("NCCL_SOCKET_IFNAME='=eth0'") != std::string::npos);
  CHECK(c->reason.find("10.0.0.1") != std::string::npos);

  c = select_interface(ifs, "enp", "CCLITE_SOCKET_IFNAME");
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().code() == errc::invalid_argument);
  const std::string& m = c.error().message();
  CHECK(m.find("CCLITE_SOCKET_IFNAME='enp'") != std::string::npos);
  CHECK(m.find("eth01 10.0.0.2") != std::string::npos);  // lists what exists
}

TEST_CASE("ifname: IPv4 first, IPv6 allowed, link-local IPv6 never") {
  auto ifs = machine({make_interface("eth0", "fd00::2"), make_interface("eth0", "fe80::1"),
                      make_interface("eth1", "10.0.0.3"), lo()});
  auto c = select_interface(ifs, "eth");
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth1");
  CHECK(c->iface.family == AF_INET);

  c = select_interface(ifs, "eth", "CCLITE_SOCKET_IFNAME", AF_INET6);
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth0");
  CHECK(address_text(c->iface.addr) == "fd00::2");

  // Only a link-local address: not usable.
  c = select_interface(machine({make_interface("eth0", "fe80::1")}), "=eth0");
  CHECK_FALSE(c.ok());

  // IPv6-only host.
  c = select_interface(machine({make_interface("eth0", "2001:db8::7"), make_interface("lo", "::1", true, true)}),
                       nullptr);
  REQUIRE(c.ok());
  CHECK(c->iface.name == "eth0");
  CHECK(c->iface.family == AF_INET6);
}

TEST_CASE("ifname: no usable interface at all") {
  auto c = select_interface({}, nullptr);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().code() == errc::unsupported);
  c = select_interface(machine({make_interface("eth0", "10.0.0.1", false)}), nullptr);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().code() == errc::unsupported);
}

TEST_CASE("ifname: socket family") {
  using cclite::tcp::parse_socket_family;
  CHECK(parse_socket_family("").value() == AF_UNSPEC);
  CHECK(parse_socket_family("AF_INET").value() == AF_INET);
  CHECK(parse_socket_family("af_inet6").value() == AF_INET6);
  CHECK(parse_socket_family("6").value() == AF_INET6);
  auto bad = parse_socket_family("AF_UNIX");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code() == errc::invalid_argument);
}

TEST_CASE("ifname: the machine's real interfaces") {
  auto all = cclite::tcp::list_interfaces();
  REQUIRE(all.ok());
  bool has_lo = false;
  for (const auto& i : all.value())
    if (i.loopback && i.family == AF_INET) has_lo = true;
  CHECK(has_lo);

  {
    env_guard a("CCLITE_SOCKET_IFNAME", "=lo");
    env_guard b("NCCL_SOCKET_IFNAME", "=nonexistent0");
    env_guard f("CCLITE_SOCKET_FAMILY", nullptr);
    env_guard g("NCCL_SOCKET_FAMILY", nullptr);
    auto c = cclite::tcp::choose_interface();
    REQUIRE(c.ok());
    CHECK(c->iface.name == "lo");
    CHECK(address_text(c->iface.addr) == "127.0.0.1");
    CHECK(c->reason.find("CCLITE_SOCKET_IFNAME") != std::string::npos);
  }
  {
    env_guard a("CCLITE_SOCKET_IFNAME", nullptr);
    env_guard b("NCCL_SOCKET_IFNAME", "=nonexistent0");
    auto c = cclite::tcp::choose_interface();
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().message().find("NCCL_SOCKET_IFNAME='=nonexistent0'") != std::string::npos);
  }
  {
    env_guard a("CCLITE_SOCKET_IFNAME", nullptr);
    env_guard b("NCCL_SOCKET_IFNAME", nullptr);
    auto c = cclite::tcp::choose_interface();
    REQUIRE(c.ok());  // some interface, at worst lo
    MESSAGE("default interface here: " << c->reason);
  }
}
