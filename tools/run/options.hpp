// tools/run/options.hpp - cclite-run's command line: parsing and validation.
//
// torchrun spellings are accepted (--nproc_per_node as well as
// --nproc-per-node, --flag=value as well as --flag value) so that a torchrun
// command line works after replacing the program name. Options end at the
// first argument that is not an option, or at "--": everything after it is the
// worker's command line and is never interpreted.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>
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
  std::string log_run_dir;        ///< set at start (make_run_log_dir), not a flag
  std::vector<std::string> command;
};

/// True when the agents meet at --rdzv-endpoint to agree on node ranks
/// (torchrun's c10d rendezvous); false for one node or a static launch
/// (--rdzv-backend static, or --node-rank with --master-addr and no endpoint).
inline bool dynamic_rendezvous(const options& o) {
  return o.nnodes > 1 && !o.rdzv_endpoint.empty() && o.rdzv_backend != "static";
}

struct parse_result {
  enum class action { run, help, usage_error };
  action what = action::run;
  options opts;
  std::string error;  ///< for usage_error: one line, without the "cclite-run: " prefix
};

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

/// Checks that hold across flags (multi-node needs a node rank and an address).
/// Returns an empty string when the options are consistent.
inline std::string validate(const options& o) {
  if (o.command.empty()) return "no program given; the program to run comes after the options";
  for (const auto* spec : {&o.redirects, &o.tee})
    if (std_streams_for(*spec, 0) < 0)
      return std::string(spec == &o.redirects ? "--redirects" : "--tee") + " '" + *spec +
             "': give 0 (none), 1 (stdout), 2 (stderr) or 3 (both), for every worker or per local rank as 0:1,1:2";
  if (std::vector<int> ranks; !o.local_ranks_filter.empty() && !parse_local_ranks(o.local_ranks_filter, ranks))
    return "--local-ranks-filter '" + o.local_ranks_filter + "': give local ranks as 0 or 0,1,3";
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > (1LL << 30))
    return "--nnodes x --nproc-per-node is " +
           std::to_string(static_cast<long long>(o.nnodes) * o.nproc_per_node) +
           " workers, more than any job can have";
  if (o.nnodes > 1 && o.standalone)
    return "--standalone runs a single node but --nnodes is " + std::to_string(o.nnodes);
  if (o.node_rank >= o.nnodes)
    return "--node-rank " + std::to_string(o.node_rank) + " is out of range for --nnodes " +
           std::to_string(o.nnodes) + " (valid: 0.." + std::to_string(o.nnodes - 1) + ")";
  if (o.min_nnodes > 0 && o.min_nnodes < o.nnodes) {
    if (!dynamic_rendezvous(o))
      return "--nnodes " + std::to_string(o.min_nnodes) + ":" + std::to_string(o.nnodes) +
             " (elastic) needs --rdzv-endpoint host:port, where the nodes' agents meet";
    if (o.node_rank >= 0)
      return "--node-rank cannot be combined with an elastic --nnodes MIN:MAX: the rendezvous "
             "numbers the nodes that show up";
  }
  if (o.nnodes > 1 && !dynamic_rendezvous(o)) {
    bool has_rank = o.node_rank >= 0;
    bool has_addr = !o.rdzv_endpoint.empty() || !o.master_addr.empty();
    std::string n = std::to_string(o.nnodes);
    if (!has_addr)
      return "--nnodes " + n +
             " needs --rdzv-endpoint host:port: run the same command on every node; the "
             "agents meet there and number the nodes (or give a static --node-rank K and "
             "--master-addr of node 0)";
    if (!has_rank)
      return "--nnodes " + n + " with --rdzv-backend static or --master-addr needs --node-rank K (0.." +
             std::to_string(o.nnodes - 1) +
             ", unique per node); leave both out and give --rdzv-endpoint to have the nodes numbered";
  }
  return {};
}

/// Parses argv (argv[0] is the launcher's name and is skipped). `adjust`, when
/// given, completes the options from the environment before they are checked
/// (apply_srun, slurm.hpp); a non-empty return is a usage error.
inline parse_result parse_args(const std::vector<std::string>& args,
                               const std::function<std::string(options&)>& adjust = nullptr) {
  parse_result r;
  options& o = r.opts;
  auto fail = [&r](std::string msg) {
    r.what = parse_result::action::usage_error;
    r.error = std::move(msg);
    return r;
  };

  std::size_t i = 1;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    if (arg == "-h" || arg == "--help") {
      r.what = parse_result::action::help;
      return r;
    }
    std::string flag = arg == "-r" ? "--redirects" : arg == "-t" ? "--tee" : arg;  // torchrun's short forms
    if (flag.rfind("--", 0) != 0) return fail("unknown option '" + arg + "'");

    std::string value;
    bool has_inline_value = false;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_inline_value = true;
    }
    flag = detail::canonical_flag(flag);

    // Flags without a value.
    if (flag == "--no-prefix" || flag == "--tee-prefix" || flag == "--standalone" ||
        flag == "--no-python") {
      if (has_inline_value) return fail("option '" + flag + "' takes no value");
      if (flag == "--no-prefix") o.prefix = false;
      if (flag == "--tee-prefix") o.prefix = true;
      if (flag == "--standalone") o.standalone = true;
      continue;  // --no-python: workers are always exec'd directly
    }

    static const char* const valued[] = {
        "--nproc-per-node", "--nnodes",      "--node-rank", "--rdzv-endpoint", "--rdzv-id",
        "--master-addr",    "--master-port", "--timeout",   "--rdzv-backend",  "--max-restarts",
        "--rdzv-timeout",   "--node-timeout", "--rdzv-last-call", "--log-dir", "--redirects", "--tee",
        "--local-ranks-filter", "--rdzv-conf", "--monitor-interval"};
    bool known = false;
    for (const char* v : valued) known = known || flag == v;
    if (!known) return fail("unknown option '" + arg + "'");
    if (!has_inline_value) {
      if (i + 1 >= args.size()) return fail("option '" + flag + "' needs a value");
      value = args[++i];
    }

    if (flag == "--nproc-per-node") {
      o.nproc_spec.clear();
      if (value == "gpu" || value == "cpu" || value == "auto") o.nproc_spec = value;
      else if (!detail::parse_int(value, 1, 1 << 20, o.nproc_per_node))
        return fail("--nproc-per-node needs a positive integer, gpu, cpu or auto, got '" + value + "'");
    } else if (flag == "--nnodes") {
      o.nnodes_given = true;
      if (auto colon = value.find(':'); colon != std::string::npos) {
        if (!detail::parse_int(value.substr(0, colon), 1, 1 << 20, o.min_nnodes) ||
            !detail::parse_int(value.substr(colon + 1), 1, 1 << 20, o.nnodes) || o.min_nnodes > o.nnodes)
          return fail("--nnodes " + value + ": write MIN:MAX with 1 <= MIN <= MAX (e.g. 2:4)");
      } else if (!detail::parse_int(value, 1, 1 << 20, o.nnodes)) {
        return fail("--nnodes needs a positive integer or MIN:MAX, got '" + value + "'");
      }
    } else if (flag == "--node-rank") {
      if (!detail::parse_int(value, 0, 1 << 20, o.node_rank))
        return fail("--node-rank needs an integer >= 0, got '" + value + "'");
    } else if (flag == "--rdzv-endpoint") {
      if (value.empty()) return fail("--rdzv-endpoint needs host:port");
      o.rdzv_endpoint = value;
    } else if (flag == "--rdzv-id") {
      if (value.empty()) return fail("--rdzv-id needs a non-empty id");
      o.rdzv_id = value;
    } else if (flag == "--master-addr") {
      if (value.empty()) return fail("--master-addr needs a host name or address");
      o.master_addr = value;
    } else if (flag == "--master-port") {
      if (!detail::parse_int(value, 1, 65535, o.master_port))
        return fail("--master-port needs a port in 1..65535, got '" + value + "'");
    } else if (flag == "--timeout") {
      if (!detail::parse_seconds(value, o.timeout_s))
        return fail("--timeout needs a number of seconds > 0, got '" + value + "'");
    } else if (flag == "--rdzv-timeout") {
      if (!detail::parse_seconds(value, o.rdzv_timeout_s))
        return fail("--rdzv-timeout needs a number of seconds > 0, got '" + value + "'");
    } else if (flag == "--node-timeout") {
      if (!detail::parse_seconds(value, o.node_timeout_s))
        return fail("--node-timeout needs a number of seconds > 0, got '" + value + "'");
    } else if (flag == "--rdzv-backend") {
      o.rdzv_backend = value;  // c10d, etcd, ...: cclite has one dynamic rendezvous; "static" opts out
    } else if (flag == "--max-restarts") {
      if (!detail::parse_int(value, 0, 1 << 20, o.max_restarts))
        return fail("--max-restarts needs an integer >= 0, got '" + value + "'");
    } else if (flag == "--log-dir") {
      if (value.empty()) return fail("--log-dir needs a directory");
      o.log_dir = value;
    } else if (flag == "--redirects") {
      o.redirects = value;
    } else if (flag == "--tee") {
      o.tee = value;
    } else if (flag == "--monitor-interval") {
      double unused = 0;  // torchrun's health-check period: cclite-run sees a worker exit at once (SIGCHLD)
      if (!detail::parse_seconds(value, unused))
        return fail("--monitor-interval needs a number of seconds > 0, got '" + value + "'");
    } else if (flag == "--local-ranks-filter") {
      if (value.empty()) return fail("--local-ranks-filter needs local ranks, e.g. 0 or 0,1");
      o.local_ranks_filter = value;
    } else if (flag == "--rdzv-conf") {
      if (std::string err = apply_rdzv_conf(value, o); !err.empty()) return fail(err);
    } else if (flag == "--rdzv-last-call") {
      if (!detail::parse_seconds(value, o.rdzv_last_call_s))
        return fail("--rdzv-last-call needs a number of seconds > 0, got '" + value + "'");
    }
  }

  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())),
                   args.end());
  if (adjust) {
    if (std::string err = adjust(o); !err.empty()) return fail(err);
  }
  if (std::string err = validate(o); !err.empty()) return fail(err);
  return r;
}

inline const char* usage_text() {
  return R"(usage: cclite-run [options] program [args...]

Starts --nproc-per-node copies of program on this node (one per device) with
the torchrun environment, relays their output line by line with a "[rank R]: "
prefix, and stops the whole job as soon as one worker fails.

options (--name value or --name=value; '_' may replace '-' as in torchrun):
  --nproc-per-node N   workers on this node (default 1); gpu: one per GPU this
                       process may use (CUDA_VISIBLE_DEVICES), cpu: one per CPU
                       it may run on, auto: gpu if there are GPUs, else cpu
  --nnodes M           nodes in the job (default 1); M > 1 needs --rdzv-endpoint
                       (under srun: the step's node count)
  --rdzv-endpoint H:P  where the nodes' agents meet (default port 29400): the
                       agent on host H hosts the store (else the first to bind
                       the port), node ranks are handed out in joining order
                       (H's node is 0) and node 0's address becomes
                       MASTER_ADDR; the same command runs on every node
  --rdzv-id ID         job id, the same on every node (default "none"); an
                       agent of another id at the same endpoint is refused
  --node-rank K        this node's index, 0..M-1 (optional: fixes the order)
  --rdzv-backend static
                       no agents' rendezvous: every node needs --node-rank,
                       and rank 0 hosts the store at --rdzv-endpoint itself
  --rdzv-timeout SEC   how long to wait for every node to join (default 900)
  --node-timeout SEC   a node whose agent is silent this long is declared lost
                       and the job stops on every node (default 15)
  --nnodes MIN:MAX     elastic: start with MAX nodes, or with at least MIN once
                       --rdzv-last-call SEC (default 30) passed without a newcomer;
                       a node that arrives later, while there are fewer than
                       MAX, is taken in: every node restarts its workers (not
                       counted by --max-restarts)
  --max-restarts K     after a failure (a worker, or a lost node) restart every
                       node's workers, up to K times: the agents meet again
                       (without the lost nodes, if MIN allows) and the workers
                       start over (they resume from their own checkpoints);
                       TORCHELASTIC_RESTART_COUNT tells them which attempt
  --master-addr A      MASTER_ADDR (default: endpoint host, else 127.0.0.1)
  --master-port P      MASTER_PORT (default: endpoint port, else a free port
                       on one node, 29500 on several)
  --standalone         one node, rendezvous on a free local port (this is
                       also what a plain --nproc-per-node N does)
  --tee-prefix         prefix worker output with "[rank R]: " (default)
  --no-prefix          pass worker output through unchanged (still whole lines)
  --timeout SEC        stop the job and exit 124 after SEC seconds
  --log-dir DIR        where --redirects / --tee write: DIR/<rdzv-id>_XXXXXX/
                       attempt_<restart>/<local rank>/{stdout,stderr}.log (default:
                       a new directory in $TMPDIR)
  -r, --redirects N    a worker's streams into its log files instead of here: 0
                       none, 1 stdout, 2 stderr, 3 both; or per local rank: 0:1,1:2
  -t, --tee N          the same streams into the files and here as well
  --local-ranks-filter L
                       only these local ranks' output here (0 or 0,1); the
                       others' goes to their log files, as with --redirects 3
  --rdzv-conf K=V,...  torchrun's: join_timeout (= --rdzv-timeout),
                       last_call_timeout (= --rdzv-last-call), is_host (this
                       agent hosts the agents' store: true; never: false)
  --no-python, --monitor-interval SEC
                       accepted for torchrun command lines; no effect (worker
                       exits are seen at once)
  -h, --help           print this help

Each worker gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT, CCLITE_RDZV_ENDPOINT,
CCLITE_RDZV_ID, CCLITE_RDZV_TOKEN (derived from the id unless set),
TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT; its stdin is /dev/null and it runs in its own process
group. SIGINT/SIGTERM/SIGHUP/SIGQUIT are forwarded to every worker (SIGKILL
10 s later); when a worker fails the others get SIGTERM (SIGKILL 5 s later).

exit status: 0 when every worker exits 0; else the first failed worker's
status (128+N if it was killed by signal N), on every node of the job; 1
when the rendezvous fails or a node is lost; 124 after --timeout; 128+N when
cclite-run itself got signal N; 127 (126) when program is missing (not
executable); 2 for a usage error.

examples:
  cclite-run --nproc-per-node 4 ./train --epochs 3
  # the same command on node0 and node1:
  cclite-run --nnodes 2 --nproc-per-node 4 --rdzv-id 100 \
             --rdzv-endpoint node0:29400 ./train
  # elastic: 2 to 4 nodes, up to 3 restarts (the program resumes its checkpoint)
  cclite-run --nnodes 2:4 --max-restarts 3 --nproc-per-node 4 --rdzv-id 100 \
             --rdzv-endpoint node0:29400 ./train --resume
  cclite-run --nproc_per_node=2 --timeout 600 --no-prefix ./allreduce_perf
  # from a Slurm allocation, one cclite-run per node: the nodes meet on the
  # step's first node, at MASTER_PORT or a port from SLURM_JOB_ID.SLURM_STEP_ID
  srun --nodes 2 --ntasks-per-node 1 cclite-run --nproc-per-node 4 ./train
)";
}

}  // namespace cclite::run
