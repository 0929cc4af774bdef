// tools/run/options.hpp - cclite-run's command line: parsing and validation.
//
// torchrun spellings are accepted (--nproc_per_node as well as
// --nproc-per-node, --flag=value as well as --flag value) so that a torchrun
// command line works after replacing the program name. Options end at the
// first argument that is not an option, or at "--": everything after it is the
// worker's command line and is never interpreted.
//
// The pieces: option_values.hpp (struct options and the parsers of one
// value), usage.hpp (the --help text), and here the parser itself: parse_args
// and the checks across flags (validate).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "option_values.hpp"
#include "usage.hpp"

namespace cclite::run {

struct parse_result {
  enum class action { run, help, usage_error };
  action what = action::run;
  options opts;
  std::string error;  ///< for usage_error: one line, without the "cclite-run: " prefix
};

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
        "--local-ranks-filter", "--rdzv-conf", "--monitor-interval", "--bind-to"};
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
    } else if (flag == "--bind-to") {
      if (value != "none" && value != "core" && value != "numa")
        return fail("--bind-to needs none, core or numa, got '" + value + "'");
      o.bind_to = value;
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

}  // namespace cclite::run
