// cclite/tcp/rendezvous.hpp - the store every rank of a job meets at.
//
// open_store() turns a launch_info (bootstrap/launch_env.hpp) into a store:
//   - a job of one process: an in-process memory_store (nothing to meet);
//   - no endpoint but a directory (CCLITE_RDZV_DIR, or mpirun's session
//     directory for a one-node Open MPI job: launch_env.hpp): a file_store in
//     <dir>/<job id>;
//   - torchrun's own store, when its agent hosts one at MASTER_ADDR:MASTER_PORT
//     (TORCHELASTIC_USE_AGENT_STORE=True, launch_env.hpp): every rank connects a
//     torch_store_client (torch_store.hpp) and no rank hosts a store;
//   - otherwise TCP: rank 0 starts a store_server on the endpoint's port, and
//     every rank, rank 0 included, connects a store_client to host:port. An
//     endpoint no variable named (an srun job's first node and derived port,
//     launch_env.hpp) is named in every error about it, with how to choose one.
//
// Where rank 0 listens (never on every address unless asked):
//   - the endpoint's address when the host is a loopback name or address (the
//     job is single-node by construction), or is / resolves to an address of
//     this machine (listen only where asked);
//   - otherwise (a name that resolves only to loopback here, like Debian's
//     127.0.1.1 hostname entry; an address behind NAT; a name that does not
//     resolve) on the address of the interface the data path picks
//     (CCLITE_SOCKET_IFNAME rules, ifname.hpp), plus the loopback addresses
//     the name resolved to, so both local and remote ranks reach it;
//   - on every address (0.0.0.0 / ::) only with CCLITE_STORE_BIND_ANY=1.
//
// Every connection must prove the job token (CCLITE_RDZV_TOKEN, see
// store_auth.hpp) before the server answers anything.
//
// After connecting, ranks compare job ids through the store, so a rank that
// reached another job's store (a port reused by a concurrent job) fails with a
// message instead of mixing two jobs.
//
// Under CCLITE_NO_THREADS no process of the job runs a second thread: rank 0
// forks one helper process that runs the store server's poll loop, because
// the store must answer while rank 0 itself waits on links (ranks meet
// through it during init, split() and failure spreading). The helper ends
// with rank 0's store, or drains it first after a failure
// (serve_in_child_process). A program that cannot fork hosts a store_server with
// background_thread = false itself and drives it with progress() / hook().
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cclite/config.hpp>
#include <cclite/bootstrap/file_store.hpp>
#include <cclite/bootstrap/launch_env.hpp>
#include <cclite/bootstrap/memory_store.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/tcp/ifname.hpp>
#include <cclite/tcp/store_auth.hpp>
#include <cclite/tcp/store_client.hpp>
#include <cclite/tcp/store_server.hpp>
#include <cclite/tcp/torch_store.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

namespace detail {

// A store that owns the server rank 0 hosts, next to its client: the server
// lives exactly as long as the store handed to the caller.
class hosting_store final : public cclite::store {
 public:
  hosting_store(std::unique_ptr<store_server> server, std::unique_ptr<cclite::store> client)
      : server_(std::move(server)), client_(std::move(client)) {}
  status set(const std::string& k, const std::string& v) override { return client_->set(k, v); }
  result<std::string> get(const std::string& k, deadline d) override { return client_->get(k, d); }
  result<std::int64_t> add(const std::string& k, std::int64_t x) override { return client_->add(k, x); }
  status wait(const std::vector<std::string>& ks, deadline d) override { return client_->wait(ks, d); }
  result<bool> check(const std::string& k) override { return client_->check(k); }
  status set_within(const std::string& k, const std::string& v, deadline r) override {
    return client_->set_within(k, v, r);
  }
  result<std::int64_t> add_within(const std::string& k, std::int64_t x, deadline r) override {
    return client_->add_within(k, x, r);
  }
  result<std::string> get_within(const std::string& k, deadline d, deadline r) override {
    return client_->get_within(k, d, r);
  }

 private:
  std::unique_ptr<store_server> server_;  // destroyed after client_
  std::unique_ptr<cclite::store> client_;
};

// An IPv4 or IPv6 address (port 0), parsed from text or from a resolver.
struct ip_address {
  sockaddr_storage ss{};
  bool is_v6() const { return ss.ss_family == AF_INET6; }
  const in6_addr& v6() const { return reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr; }
  std::uint32_t v4_host_order() const { return ntohl(reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr); }
  bool is_loopback() const { return is_v6() ? IN6_IS_ADDR_LOOPBACK(&v6()) : (v4_host_order() >> 24) == 127; }
  socklen_t size() const { return is_v6() ? sizeof(sockaddr_in6) : sizeof(sockaddr_in); }
  std::string to_string() const {
    char buf[INET6_ADDRSTRLEN] = "";
    if (is_v6())
      ::inet_ntop(AF_INET6, &v6(), buf, sizeof buf);
    else
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof buf);
    return buf;
  }
  /// Parses a literal address; false for anything else (a name).
  static bool parse(const std::string& text, ip_address& out) {
    out = ip_address{};
    if (::inet_pton(AF_INET, text.c_str(), &reinterpret_cast<sockaddr_in&>(out.ss).sin_addr) == 1) {
      out.ss.ss_family = AF_INET;
      return true;
    }
    if (::inet_pton(AF_INET6, text.c_str(), &reinterpret_cast<sockaddr_in6&>(out.ss).sin6_addr) == 1) {
      out.ss.ss_family = AF_INET6;
      return true;
    }
    return false;
  }
};

// True if `addr` belongs to this machine: binding a socket to it succeeds.
inline bool is_local_address(const ip_address& addr) {
  int fd = ::socket(addr.ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr.ss), addr.size()) == 0;
  ::close(fd);
  return ok;
}

/// Where rank 0's server listens, and why (for the INFO line).
struct bind_choice {
  std::vector<std::string> hosts;
  std::string why;
};

/// The addresses rank 0's server binds for endpoint host `host` (see the top).
/// `bind_any`: CCLITE_STORE_BIND_ANY. `iface`: the data path's interface
/// choice (a parameter so that tests can stand in for the machine).
/// Errors: bootstrap_error when no address fits (the message names the fixes).
template <class ChooseInterface>
result<bind_choice> bind_addresses_for(const std::string& host, bool bind_any, ChooseInterface iface) {
  ip_address literal;
  const bool is_literal = ip_address::parse(host, literal);
  if (bind_any)
    return bind_choice{{is_literal && literal.is_v6() ? "::" : "0.0.0.0"}, "every address (CCLITE_STORE_BIND_ANY=1)"};
  std::vector<std::string> loopbacks;  // what `host` resolves to here, if loopback
  if (is_literal) {
    if (literal.is_loopback() || is_local_address(literal)) return bind_choice{{host}, "the endpoint's address"};
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) == 0) {
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
        ip_address a;
        std::memcpy(&a.ss, ai->ai_addr, ai->ai_addrlen);
        if (a.is_loopback()) {
          if (std::find(loopbacks.begin(), loopbacks.end(), a.to_string()) == loopbacks.end())
            loopbacks.push_back(a.to_string());
        } else if (is_local_address(a)) {
          ::freeaddrinfo(res);
          return bind_choice{{a.to_string()}, "the address '" + host + "' resolves to"};
        }
      }
      ::freeaddrinfo(res);
      if (host == "localhost" && !loopbacks.empty())
        return bind_choice{{loopbacks.front()}, "localhost: a single-node job"};
    }
  }
  result<chosen_interface> ci = iface();
  if (!ci) {
    if (!loopbacks.empty())
      return bind_choice{loopbacks, "the loopback address '" + host + "' resolves to (no interface: " +
                                        ci.error().message() + ")"};
    return make_error(errc::bootstrap_error,
                      "cclite: cannot choose where to host the rendezvous store for endpoint '%s': it is not an "
                      "address of this machine and %s; set CCLITE_SOCKET_IFNAME, point CCLITE_RDZV_ENDPOINT at "
                      "this machine, or set CCLITE_STORE_BIND_ANY=1 to listen on every address",
                      host.c_str(), ci.error().message().c_str());
  }
  bind_choice c;
  c.hosts.push_back(address_text(ci.value().iface.addr));
  for (const auto& l : loopbacks)
    if (l != c.hosts.front()) c.hosts.push_back(l);
  c.why = "'" + host + "' is not an address of this machine here; interface " + ci.value().reason +
          (loopbacks.size() ? " and the loopback address it resolves to" : "");
  return c;
}

// An error about the store's endpoint, plus where a derived endpoint came
// from and how to choose another: "bind(...) failed: Address already in use"
// alone would not tell an srun user which port was tried or why.
inline status explain_endpoint(const launch_info& li, status s) {
  if (s.ok() || li.rdzv_endpoint_from.empty()) return s;
  return make_error(s.code(),
                    "%s [endpoint %s:%u chosen for %s; to choose another, export MASTER_PORT or "
                    "CCLITE_RDZV_ENDPOINT=host:port before srun]",
                    s.message().c_str(), li.rdzv_host.c_str(), unsigned(li.rdzv_port),
                    li.rdzv_endpoint_from.c_str());
}

// Ranks compare job ids through the store (see the top): rank 0 writes its
// own, the others wait for it and compare.
inline status check_job_id(const launch_info& li, cclite::store& client, deadline until) {
  const std::string job_key = "cclite/rdzv/job_id";
  if (li.rank == 0) return client.set(job_key, li.job_id);
  auto theirs = client.get(job_key, until);
  if (!theirs) return theirs.error();
  if (theirs.value() != li.job_id)
    return make_error(errc::bootstrap_error,
                      "cclite: the rendezvous store at %s:%u belongs to job '%s' but this rank is in job '%s'; "
                      "is another job using that port? use the same CCLITE_RDZV_ID on every rank, or set "
                      "CCLITE_RDZV_ENDPOINT / MASTER_PORT to a free port",
                      li.rdzv_host.c_str(), unsigned(li.rdzv_port), proto::printable(theirs.value()).c_str(),
                      li.job_id.c_str());
  return {};
}

// torchrun's own store (launch_info::launcher_store): every rank a client,
// keys under cclite/<job id>/attempt_<restart count>/. CCLITE_TORCH_STORE_PROTOCOL
// (1: torch 1.x, 2: torch 2.x) names the dialect instead of probing for it.
inline result<std::unique_ptr<torch_store_client>> open_launcher_store(const launch_info& li, deadline until,
                                                                       milliseconds op_timeout) {
  auto d = torch_store_client::dialect::unknown;
  if (const char* v = std::getenv("CCLITE_TORCH_STORE_PROTOCOL"); v && *v) {
    if (std::strcmp(v, "1") == 0)
      d = torch_store_client::dialect::torch1;
    else if (std::strcmp(v, "2") == 0)
      d = torch_store_client::dialect::torch2;
    else
      return make_error(errc::invalid_argument,
                        "CCLITE_TORCH_STORE_PROTOCOL='%s': 1 (torch 1.x's TCPStore) or 2 (torch 2.x's)", v);
  }
  auto c = torch_store_client::connect(li.rdzv_host, li.rdzv_port, until, op_timeout,
                                       "cclite/" + li.job_id + "/attempt_" + std::to_string(li.restart_count) + "/",
                                       d);
  if (!c) return c.error();
  logger lg(li.rank);
  CCLITE_INFO(lg, "rendezvous through torchrun's store at %s (TORCHELASTIC_USE_AGENT_STORE=True, torch %d.x protocol)",
              c.value()->endpoint().c_str(), static_cast<int>(c.value()->protocol()));
  return c;
}

#if defined(CCLITE_NO_THREADS)
// Forks the process that serves `s` from now on (see the top); this process
// keeps its client, and `s` becomes its handle on the helper
// (store_server::hand_over): one end of a socket pair. The helper serves
// until that end closes (the handle destroyed, or rank 0 gone, killed or
// not), or, after a drain request over it (drain_clients(): rank 0's
// job failed), until the other ranks have disconnected, so they can still read
// the failure record when rank 0 has left at once. Errors: bootstrap_error
// when socketpair or fork fails.
inline status serve_in_child_process(store_server& s) {
  const pid_t parent = ::getpid();
  int p[2];  // a socket pair, not a pipe: sends to a helper that died raise no SIGPIPE
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0)
    return make_error(errc::bootstrap_error, "cannot create the rendezvous store process's channel: %s",
                      std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(p[0]);
    ::close(p[1]);
    return make_error(errc::bootstrap_error, "cannot fork the rendezvous store process (CCLITE_NO_THREADS): %s",
                      std::strerror(e));
  }
  if (pid > 0) {
    ::close(p[0]);
    s.hand_over(p[1]);
    return {};
  }
  ::close(p[1]);
  // Serves a drain request if one is waiting, then ends this process.
  auto finish = [&] {
    unsigned char msg[5];
    if (::recv(p[0], msg, sizeof msg, MSG_DONTWAIT) == static_cast<ssize_t>(sizeof msg) && msg[0] == 'D') {
      std::uint32_t ms = 0;
      std::memcpy(&ms, msg + 1, sizeof ms);
      s.drain_clients(deadline::after(milliseconds(ms)));
    }
    ::_exit(0);  // drained, or rank 0's end closed
  };
  for (;;) {
    if (s.progress(200, p[0], POLLIN) != 0) finish();
    // Rank 0 is gone but its end stayed open (a later fork of rank 0 holds
    // it), or it left right after asking for a drain that this round of
    // progress() did not see: finish() still reads that request.
    if (::getppid() != parent) finish();
  }
}
#endif

}  // namespace detail

/// Opens this rank's store for the job described by `li`; see the top of the
/// file for which store. Blocks until the store is reachable or `until`.
/// `hosted`: when non-null and this rank hosts the TCP server, the server is
/// moved there (keep it alive as long as any rank uses the store); when null,
/// the returned store owns it. `op_timeout` bounds each later set/add/check.
/// Errors: errc::invalid_argument for a launch_info without a valid rank and
/// size; errc::bootstrap_error when there is no way to meet, the port cannot
/// be bound, the directory is unusable or the store belongs to another job;
/// errc::timeout when the store is not reachable by `until`.
inline result<std::unique_ptr<cclite::store>> open_store(const launch_info& li, deadline until,
                                                         std::unique_ptr<store_server>* hosted,
                                                         milliseconds op_timeout = default_store_op_timeout) {
  if (li.size < 1 || li.rank < 0 || li.rank >= li.size)
    return make_error(errc::invalid_argument, "open_store: rank %d of size %d; run detect_launch() first",
                      li.rank, li.size);
  if (li.size == 1) return std::unique_ptr<cclite::store>(new memory_store());

  if (li.rdzv_host.empty()) {
    if (li.rdzv_dir.empty())
      return make_error(errc::bootstrap_error,
                        "cclite: rank %d of %d has no rendezvous: set CCLITE_RDZV_ENDPOINT=host:port (rank 0 "
                        "hosts the store) or CCLITE_RDZV_DIR=/shared/dir",
                        li.rank, li.size);
    auto fs = file_store::open(rdzv_store_dir(li), op_timeout);
    if (!fs) return fs.error();
    return std::unique_ptr<cclite::store>(std::move(fs.value()));
  }

  if (li.launcher_store) {
    auto c = detail::open_launcher_store(li, until, op_timeout);
    if (!c) return c.error();
    std::unique_ptr<cclite::store> client = std::move(c.value());
    CCLITE_TRY(detail::check_job_id(li, *client, until));
    return {std::move(client)};
  }

  const std::string token = rdzv_token_from_env();
  std::unique_ptr<store_server> server;
  if (li.rank == 0) {
    auto any = env::get_bool("STORE_BIND_ANY", false, false);
    if (!any) return any.error();
    auto where = detail::bind_addresses_for(li.rdzv_host, any.value(), [] { return choose_interface(); });
    if (!where) return detail::explain_endpoint(li, where.error());
    server_options so;
    so.token = token;
    auto s = store_server::start(where.value().hosts, li.rdzv_port, so);  // no thread under CCLITE_NO_THREADS
    if (!s) return detail::explain_endpoint(li, s.error());
    server = std::move(s.value());
    const unsigned bound_port = server->port();
#if defined(CCLITE_NO_THREADS)
    CCLITE_TRY(detail::serve_in_child_process(*server));  // `server` is now the helper's handle
    const char* served_by = ", served by a helper process: CCLITE_NO_THREADS";
#else
    const char* served_by = "";
#endif
    logger lg(li.rank);
    std::string list;
    for (const auto& h : where.value().hosts) list += (list.empty() ? "" : ", ") + h;
    CCLITE_INFO(lg, "rendezvous store listening on %s port %u (%s%s%s%s); job token %s", list.c_str(),
                bound_port, where.value().why.c_str(), served_by, li.rdzv_endpoint_from.empty() ? "" : "; ",
                li.rdzv_endpoint_from.c_str(),
                token.empty() ? "unset (CCLITE_RDZV_TOKEN empty: any cclite process without a token may join)"
                              : "set (CCLITE_RDZV_TOKEN)");
  }
  auto c = store_client::connect(li.rdzv_host, li.rdzv_port, until, op_timeout, token);
  if (!c) return detail::explain_endpoint(li, c.error());
  std::unique_ptr<cclite::store> client = std::move(c.value());

  CCLITE_TRY(detail::check_job_id(li, *client, until));
  if (!server) return {std::move(client)};
  if (hosted) {
    *hosted = std::move(server);
    return {std::move(client)};
  }
  return std::unique_ptr<cclite::store>(new detail::hosting_store(std::move(server), std::move(client)));
}

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
