// tools/run/option_values.hpp - what cclite-run's options hold (struct
// options) and how a single value is read: whole integers, seconds, the
// --redirects / --tee stream specs, --local-ranks-filter and --rdzv-conf.
//
// Apart from the parser (options.hpp) because the launcher reads these values
// again after parsing: the supervisor asks which streams a rank's output goes
// to, job.hpp, devices.hpp and slurm.hpp read ports, device lists and node
// counts with detail::parse_int.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace cclite::run {

struct options {
  int nproc_per_node = 1;
  std::string nproc_spec;  ///< --nproc-per-node gpu|cpu|auto, resolved by resolve_nproc (devices.hpp); "" for a number
  int nnodes = 1;      ///< the most nodes (MAX of --nnodes MIN:MAX)
  bool nnodes_given = false;  ///< --nnodes was on the command line (srun fills it in otherwise)
  int min_nnodes = 0;  ///< MIN of --nnodes MIN:MAX; 0: same as nnodes
  int max_restarts = 0;
  int node_rank = -1;         ///< -1: not given
  std::string rdzv_endpoint;  ///< host[:port]; empty: not given
  std::string rdzv_id = "none";
  std::string master_addr;  ///< empty: not given
  int master_port = -1;     ///< -1: not given
  bool standalone = false;
  bool prefix = true;    ///< "[rank R]: " before each line of worker output
  double timeout_s = 0;  ///< 0: no limit
  std::string rdzv_backend;       ///< "static": no agents' rendezvous even with --rdzv-endpoint
  double rdzv_timeout_s = 900;    ///< how long agents wait for every node to join
  double node_timeout_s = 15;     ///< a node whose agent is silent this long is lost
  double rdzv_last_call_s = 30;   ///< elastic: close a round this long after the last newcomer
  std::string log_dir;            ///< --log-dir; "" = $TMPDIR when output goes to files
  std::string redirects, tee;     ///< --redirects / --tee: "N" or "LOCAL:N,..." (logs.hpp); "": none
  std::string local_ranks_filter; ///< --local-ranks-filter "0,2": only these reach the console; "": all
  int rdzv_is_host = -1;          ///< --rdzv-conf is_host: 1 host the agents' store, 0 never, -1 decide
  std::string bind_to = "none";   ///< --bind-to none|core|numa: each worker's CPUs (cpu_bind.hpp)
  std::string log_run_dir;        ///< set at start (make_run_log_dir), not a flag
  std::vector<std::string> command;
};

/// True when the agents meet at --rdzv-endpoint to agree on node ranks
/// (torchrun's c10d rendezvous); false for one node or a static launch
/// (--rdzv-backend static, or --node-rank with --master-addr and no endpoint).
inline bool dynamic_rendezvous(const options& o) {
  return o.nnodes > 1 && !o.rdzv_endpoint.empty() && o.rdzv_backend != "static";
}

namespace detail {

/// "--nproc_per_node" -> "--nproc-per-node": torchrun accepts both spellings.
inline std::string canonical_flag(std::string flag) {
  for (std::size_t i = 2; i < flag.size(); ++i)
    if (flag[i] == '_') flag[i] = '-';
  return flag;
}

/// Parses a whole decimal integer in [lo, hi]; false for "", "4x", overflow.
inline bool parse_int(const std::string& s, long lo, long hi, int& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  out = static_cast<int>(v);
  return true;
}

inline bool parse_seconds(const std::string& s, double& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !(v > 0) || v > 1e9) return false;
  out = v;
  return true;
}

}  // namespace detail

/// The streams (bit 1 stdout, bit 2 stderr) that `spec` names for local rank
/// `local`; -1 when `spec` is malformed ("" names none). --redirects and
/// --tee take "N" (0 none, 1 stdout, 2 stderr, 3 both) or "LOCAL:N,...".
inline int std_streams_for(const std::string& spec, int local) {
  if (spec.empty()) return 0;
  int n = 0;
  if (spec.find(':') == std::string::npos) return detail::parse_int(spec, 0, 3, n) ? n : -1;
  int found = 0;
  for (std::size_t at = 0; at <= spec.size();) {
    std::size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(at, end - at);
    const std::size_t colon = item.find(':');
    int rank = 0;
    if (colon == std::string::npos || !detail::parse_int(item.substr(0, colon), 0, 1 << 20, rank) ||
        !detail::parse_int(item.substr(colon + 1), 0, 3, n))
      return -1;
    if (rank == local) found = n;
    at = end + 1;
  }
  return found;
}

/// --local-ranks-filter "0,1,3" -> {0, 1, 3}; false when malformed.
inline bool parse_local_ranks(const std::string& spec, std::vector<int>& out) {
  out.clear();
  for (std::size_t at = 0; at <= spec.size();) {
    std::size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    int rank = 0;
    if (!detail::parse_int(spec.substr(at, end - at), 0, 1 << 20, rank)) return false;
    out.push_back(rank);
    at = end + 1;
  }
  return true;
}

/// Whether local rank `local`'s output reaches the console under
/// --local-ranks-filter `spec` (every rank's does when `spec` is "").
inline bool shown_on_console(const std::string& spec, int local) {
  std::vector<int> ranks;
  return spec.empty() ||
         (parse_local_ranks(spec, ranks) && std::find(ranks.begin(), ranks.end(), local) != ranks.end());
}

/// Applies torchrun's --rdzv-conf "key=value,...": join_timeout (as
/// --rdzv-timeout), last_call_timeout (--rdzv-last-call) and is_host (this
/// agent hosts the agents' store: 1/true, never: 0/false). "" or the error.
inline std::string apply_rdzv_conf(const std::string& conf, options& o) {
  for (std::size_t at = 0; at < conf.size();) {
    std::size_t end = conf.find(',', at);
    if (end == std::string::npos) end = conf.size();
    const std::string item = conf.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos) return "--rdzv-conf '" + item + "': write key=value";
    if (key == "join_timeout" || key == "last_call_timeout") {
      double& target = key == "join_timeout" ? o.rdzv_timeout_s : o.rdzv_last_call_s;
      if (!detail::parse_seconds(value, target))
        return "--rdzv-conf " + key + " needs a number of seconds > 0, got '" + value + "'";
    } else if (key == "is_host") {
      if (value == "1" || value == "true" || value == "True") o.rdzv_is_host = 1;
      else if (value == "0" || value == "false" || value == "False") o.rdzv_is_host = 0;
      else return "--rdzv-conf is_host needs true or false, got '" + value + "'";
    } else {
      return "--rdzv-conf key '" + key +
             "' is not supported; cclite-run takes join_timeout, last_call_timeout and is_host "
             "(liveness: --node-timeout)";
    }
  }
  return {};
}

}  // namespace cclite::run
