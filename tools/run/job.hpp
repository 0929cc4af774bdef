// tools/run/job.hpp - where the job meets (rendezvous address) and what each
// worker's environment says about its place in the job.
//
// The workers' own store is hosted by rank 0's worker on MASTER_PORT and every
// worker connects to it (include/cclite/bootstrap). On one node, or with a
// static --node-rank, the launcher only decides that address and hands it
// down; with --rdzv-endpoint on several nodes the agents first meet
// (agent.hpp), which decides node ranks, rank offsets and the address.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
  // Set by the agents' rendezvous (agent.hpp); -1: derived from the options
  // (--node-rank, --nnodes x --nproc-per-node), as in a static launch.
  int node_rank = -1;
  int rank_offset = -1;  ///< RANK of this node's local rank 0
  int world_size = -1;
  int group_size = -1;     ///< nodes in the job (this round); -1: --nnodes
  int restart_count = 0;   ///< TORCHELASTIC_RESTART_COUNT
};

/// This node's index, its first global rank and the job's world size.
inline int node_rank_of(const options& o, const rendezvous& r) {
  return r.node_rank >= 0 ? r.node_rank : o.node_rank < 0 ? 0 : o.node_rank;
}
inline int first_rank_of(const options& o, const rendezvous& r) {
  return r.rank_offset >= 0 ? r.rank_offset : node_rank_of(o, r) * o.nproc_per_node;
}
inline int world_size_of(const options& o, const rendezvous& r) {
  return r.world_size >= 0 ? r.world_size : o.nnodes * o.nproc_per_node;
}

/// The job token the workers' store authenticates with (CCLITE_RDZV_TOKEN)
/// when the user set none: derived from the job id, so that every node
/// computes the same one without talking, and jobs with different ids cannot
/// talk to each other's store. It separates jobs; it is not a secret (set
/// CCLITE_RDZV_TOKEN yourself for that).
inline std::string derived_token(const std::string& rdzv_id) {
  std::uint64_t h1 = 1469598103934665603ULL, h2 = 1099511628211ULL * 31;
  for (unsigned char c : "cclite-run job token:" + rdzv_id) {
    h1 = (h1 ^ c) * 1099511628211ULL;  // FNV-1a
    h2 = (h2 ^ c) * 6364136223846793005ULL + 1442695040888963407ULL;
  }
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(h1),
                static_cast<unsigned long long>(h2));
  return buf;
}

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

/// Where the workers' flight recorder files go (CCLITE_TRACE_FILE's prefix,
/// include/cclite/collective/flight_recorder.hpp), or "" when the recorder is
/// off (CCLITE_TRACE_BUFFER unset or 0). The user's CCLITE_TRACE_FILE wins;
/// else this run's log directory when there is one (--log-dir with
/// --redirects / --tee), else the library's default.
inline std::string trace_prefix(const options& o) {
  const char* kept = std::getenv("CCLITE_TRACE_BUFFER");
  if (!kept || !*kept || std::strtol(kept, nullptr, 10) <= 0) return {};
  const char* user = std::getenv("CCLITE_TRACE_FILE");
  if (user && *user) return user;
  return o.log_run_dir.empty() ? "/tmp/cclite-trace." : o.log_run_dir + "/trace.";
}

/// The variables that place worker `local_rank` in the job (torchrun's set plus
/// cclite's CCLITE_RDZV_*).
inline env_list worker_variables(const options& o, const rendezvous& r, int local_rank) {
  const int n = o.nproc_per_node;
  const int node = node_rank_of(o, r);
  const std::string rank = std::to_string(first_rank_of(o, r) + local_rank);
  const std::string world = std::to_string(world_size_of(o, r));
  const char* user_token = std::getenv("CCLITE_RDZV_TOKEN");
  env_list vars = {
      {"RANK", rank},
      {"WORLD_SIZE", world},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(n)},
      {"GROUP_RANK", std::to_string(node)},
      {"GROUP_WORLD_SIZE", std::to_string(r.group_size > 0 ? r.group_size : o.nnodes)},
      {"NODE_RANK", std::to_string(node)},
      {"ROLE_RANK", rank},
      {"ROLE_WORLD_SIZE", world},
      {"MASTER_ADDR", r.master_addr},
      {"MASTER_PORT", std::to_string(r.master_port)},
      {"CCLITE_RDZV_ENDPOINT", r.endpoint},
      {"CCLITE_RDZV_ID", o.rdzv_id},
      {"TORCHELASTIC_RUN_ID", o.rdzv_id},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(r.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
  };
  if (!user_token || !*user_token) vars.push_back({"CCLITE_RDZV_TOKEN", derived_token(o.rdzv_id)});
  if (const std::string trace = trace_prefix(o); !trace.empty()) vars.push_back({"CCLITE_TRACE_FILE", trace});
  return vars;
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
