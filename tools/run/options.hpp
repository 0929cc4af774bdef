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
#include <string>
#include <vector>

namespace cclite::run {

struct options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = -1;         ///< -1: not given
  std::string rdzv_endpoint;  ///< host[:port]; empty: not given
  std::string rdzv_id = "none";
  std::string master_addr;  ///< empty: not given
  int master_port = -1;     ///< -1: not given
  bool standalone = false;
  bool prefix = true;    ///< "[rank R]: " before each line of worker output
  double timeout_s = 0;  ///< 0: no limit
  std::vector<std::string> command;
};

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

/// Checks that hold across flags (multi-node needs a node rank and an address).
/// Returns an empty string when the options are consistent.
inline std::string validate(const options& o) {
  if (o.command.empty()) return "no program given; the program to run comes after the options";
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > (1LL << 30))
    return "--nnodes x --nproc-per-node is " +
           std::to_string(static_cast<long long>(o.nnodes) * o.nproc_per_node) +
           " workers, more than any job can have";
  if (o.nnodes > 1 && o.standalone)
    return "--standalone runs a single node but --nnodes is " + std::to_string(o.nnodes);
  if (o.node_rank >= o.nnodes)
    return "--node-rank " + std::to_string(o.node_rank) + " is out of range for --nnodes " +
           std::to_string(o.nnodes) + " (valid: 0.." + std::to_string(o.nnodes - 1) + ")";
  if (o.nnodes > 1) {
    bool has_rank = o.node_rank >= 0;
    bool has_addr = !o.rdzv_endpoint.empty() || !o.master_addr.empty();
    if (!has_rank || !has_addr) {
      std::string n = std::to_string(o.nnodes);
      std::string missing = !has_rank && !has_addr ? "--node-rank and --rdzv-endpoint"
                            : !has_rank            ? "--node-rank"
                                                   : "--rdzv-endpoint";
      return "--nnodes " + n + " needs " + missing +
             ": run the same command on every node with --node-rank K (0.." +
             std::to_string(o.nnodes - 1) +
             ", unique per node) and --rdzv-endpoint host:port of node 0 (or "
             "--master-addr/--master-port)";
    }
  }
  return {};
}

/// Parses argv (argv[0] is the launcher's name and is skipped).
inline parse_result parse_args(const std::vector<std::string>& args) {
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
    if (arg.rfind("--", 0) != 0) return fail("unknown option '" + arg + "'");

    std::string flag = arg;
    std::string value;
    bool has_inline_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
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
        "--master-addr",    "--master-port", "--timeout",   "--rdzv-backend",  "--max-restarts"};
    bool known = false;
    for (const char* v : valued) known = known || flag == v;
    if (!known) return fail("unknown option '" + arg + "'");
    if (!has_inline_value) {
      if (i + 1 >= args.size()) return fail("option '" + flag + "' needs a value");
      value = args[++i];
    }

    if (flag == "--nproc-per-node") {
      if (!detail::parse_int(value, 1, 1 << 20, o.nproc_per_node))
        return fail("--nproc-per-node needs a positive integer, got '" + value + "'");
    } else if (flag == "--nnodes") {
      if (value.find(':') != std::string::npos)
        return fail("--nnodes " + value +
                    ": elastic MIN:MAX ranges are not supported yet; give the node count");
      if (!detail::parse_int(value, 1, 1 << 20, o.nnodes))
        return fail("--nnodes needs a positive integer, got '" + value + "'");
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
    } else if (flag == "--max-restarts") {
      int n = 0;
      if (!detail::parse_int(value, 0, 1 << 20, n) || n != 0)
        return fail("--max-restarts " + value +
                    ": restarting failed workers is not supported yet; use 0");
    }
    // --rdzv-backend: accepted for torchrun command lines; cclite has one rendezvous.
  }

  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())),
                   args.end());
  if (std::string err = validate(o); !err.empty()) return fail(err);
  return r;
}

inline const char* usage_text() {
  return R"(usage: cclite-run [options] program [args...]

Starts --nproc-per-node copies of program on this node (one per device) with
the torchrun environment, relays their output line by line with a "[rank R]: "
prefix, and stops the whole job as soon as one worker fails.

options (--name value or --name=value; '_' may replace '-' as in torchrun):
  --nproc-per-node N   workers on this node (default 1)
  --nnodes M           nodes in the job (default 1); M > 1 needs --node-rank
                       and --rdzv-endpoint (or --master-addr)
  --node-rank K        this node's index, 0..M-1, unique per node
  --rdzv-endpoint H:P  where rank 0 hosts the rendezvous store (default port
                       29400); sets CCLITE_RDZV_ENDPOINT, MASTER_ADDR/PORT
  --rdzv-id ID         job id, the same on every node (default "none")
  --master-addr A      MASTER_ADDR (default: endpoint host, else 127.0.0.1)
  --master-port P      MASTER_PORT (default: endpoint port, else a free port
                       on one node, 29500 on several)
  --standalone         one node, rendezvous on a free local port (this is
                       also what a plain --nproc-per-node N does)
  --tee-prefix         prefix worker output with "[rank R]: " (default)
  --no-prefix          pass worker output through unchanged (still whole lines)
  --timeout SEC        stop the job and exit 124 after SEC seconds
  --no-python, --rdzv-backend X, --max-restarts 0
                       accepted for torchrun command lines; no effect
  -h, --help           print this help

Each worker gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
NODE_RANK, MASTER_ADDR, MASTER_PORT, CCLITE_RDZV_ENDPOINT, CCLITE_RDZV_ID and
TORCHELASTIC_RUN_ID; its stdin is /dev/null and it runs in its own process
group. SIGINT/SIGTERM/SIGHUP/SIGQUIT are forwarded to every worker (SIGKILL
10 s later); when a worker fails the others get SIGTERM (SIGKILL 5 s later).

exit status: 0 when every worker exits 0; else the first failed worker's
status (128+N if it was killed by signal N); 124 after --timeout; 128+N when
cclite-run itself got signal N; 127 (126) when program is missing (not
executable); 2 for a usage error.

examples:
  cclite-run --nproc-per-node 4 ./train --epochs 3
  # the same command on node0 and node1, with --node-rank 0 and 1:
  cclite-run --nnodes 2 --node-rank 0 --nproc-per-node 4 --rdzv-id 100 \
             --rdzv-endpoint node0:29400 ./train
  cclite-run --nproc_per_node=2 --timeout 600 --no-prefix ./allreduce_perf
)";
}

}  // namespace cclite::run
