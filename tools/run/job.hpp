// tools/run/job.hpp - where the job meets (rendezvous address) and what each
// worker's environment says about its place in the job.
//
// cclite-run does not rendezvous itself: rank 0's worker hosts the store on
// MASTER_PORT and every worker connects to it (include/cclite/bootstrap). The
// launcher only decides the address and hands it down, torchrun style.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "options.hpp"
#include "posix.hpp"

namespace cclite::run {

constexpr int default_rdzv_port = 29400;    // torchrun's c10d rendezvous default
constexpr int default_master_port = 29500;  // torchrun's MASTER_PORT default

struct host_port {
  std::string host;
  int port = 0;
};

/// "[::1]:29400" for IPv6 literals, "node0:29400" otherwise.
inline std::string format_host_port(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

/// Parses "host:port", "[v6addr]:port" or "host" (then `default_port`).
/// Returns an empty string on success, else what is wrong.
inline std::string parse_host_port(const std::string& s, int default_port, host_port& out) {
  std::string host = s;
  std::string port;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string::npos) return "'" + s + "' has '[' without ']'";
    host = s.substr(1, close - 1);
    if (close + 1 < s.size()) {
      if (s[close + 1] != ':') return "'" + s + "': expected ':' after ']'";
      port = s.substr(close + 2);
    }
  } else if (auto colon = s.rfind(':'); colon != std::string::npos) {
    if (s.find(':') != colon) return "'" + s + "': write IPv6 addresses as [addr]:port";
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  if (host.empty()) return "'" + s + "' has no host";
  out.host = host;
  out.port = default_port;
  if (!port.empty() && !detail::parse_int(port, 1, 65535, out.port))
    return "'" + s + "': port must be in 1..65535";
  return {};
}

struct rendezvous {
  std::string master_addr;
  int master_port = 0;   ///< 0 until chosen: a single node picks a free port at launch
  std::string endpoint;  ///< CCLITE_RDZV_ENDPOINT, host:port
};

/// Decides MASTER_ADDR/MASTER_PORT and the rendezvous endpoint from the flags.
/// An explicit --master-addr/--master-port wins; otherwise the endpoint gives
/// both; otherwise one node uses 127.0.0.1 and a free port (picked later by
/// choose_free_port). Returns an empty string on success.
inline std::string plan_rendezvous(const options& o, rendezvous& out) {
  host_port ep;
  bool has_ep = !o.rdzv_endpoint.empty();
  if (has_ep) {
    if (std::string err = parse_host_port(o.rdzv_endpoint, default_rdzv_port, ep); !err.empty())
      return "--rdzv-endpoint " + err;
  }
  out.master_addr = !o.master_addr.empty() ? o.master_addr : has_ep ? ep.host : "127.0.0.1";
  out.master_port = o.master_port > 0 ? o.master_port
                    : has_ep          ? ep.port
                    : o.nnodes > 1    ? default_master_port
                                      : 0;
  if (has_ep) out.endpoint = format_host_port(ep.host, ep.port);
  if (!has_ep && out.master_port > 0)
    out.endpoint = format_host_port(out.master_addr, out.master_port);
  return {};
}

/// Fills in a free port for a single-node job that was given none.
inline std::string choose_free_port(rendezvous& r) {
  if (r.master_port > 0) return {};
  std::string err;
  // Bind where rank 0 will listen; a host name (not an IPv4 literal) binds all interfaces.
  r.master_port = find_free_port(r.master_addr.c_str(), err);
  if (r.master_port == 0) return "cannot find a free TCP port for the rendezvous: " + err;
  r.endpoint = format_host_port(r.master_addr, r.master_port);
  return {};
}

using env_list = std::vector<std::pair<std::string, std::string>>;

/// The variables that place worker `local_rank` in the job (torchrun's set plus
/// cclite's CCLITE_RDZV_*).
inline env_list worker_variables(const options& o, const rendezvous& r, int local_rank) {
  const int n = o.nproc_per_node;
  const int node = o.node_rank < 0 ? 0 : o.node_rank;
  const std::string rank = std::to_string(node * n + local_rank);
  const std::string world = std::to_string(o.nnodes * n);
  return {
      {"RANK", rank},
      {"WORLD_SIZE", world},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(n)},
      {"GROUP_RANK", std::to_string(node)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"NODE_RANK", std::to_string(node)},
      {"ROLE_RANK", rank},
      {"ROLE_WORLD_SIZE", world},
      {"MASTER_ADDR", r.master_addr},
      {"MASTER_PORT", std::to_string(r.master_port)},
      {"CCLITE_RDZV_ENDPOINT", r.endpoint},
      {"CCLITE_RDZV_ID", o.rdzv_id},
      {"TORCHELASTIC_RUN_ID", o.rdzv_id},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},
  };
}

/// `base` (a NULL-terminated environ) with `vars` set, replacing old values:
/// a RANK left over from an outer launcher must not leak into the workers.
inline std::vector<std::string> merge_environment(char* const* base, const env_list& vars) {
  std::vector<std::string> env;
  for (char* const* e = base; e && *e; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& v : vars) replaced = replaced || v.first == name;
    if (!replaced) env.push_back(std::move(entry));
  }
  for (const auto& v : vars) env.push_back(v.first + "=" + v.second);
  return env;
}

}  // namespace cclite::run
