// cclite-run: starts the workers of a cclite job on this node, torchrun style.
//
//   cclite-run --nproc-per-node 4 ./train
//   cclite-run --nnodes 2 --nproc-per-node 4 --rdzv-endpoint node0:29400 ./train   (every node)
//
// See tools/README.md and `cclite-run --help`. The pieces live in tools/run/:
// options.hpp (command line; option_values.hpp what the options hold and the
// parsers of one value, usage.hpp the --help text), job.hpp (rendezvous
// address, worker environment), agent.hpp (the nodes' agents meet, round
// after round; agent_round.hpp one round, agent_state.hpp what they share),
// placement.hpp (what a round decides: ranks, MASTER_ADDR), node_watch.hpp
// (heartbeats, failures, newcomers), logs.hpp (--log-dir), devices.hpp
// (--nproc-per-node gpu|cpu), slurm.hpp (under srun), worker.hpp (fork/exec),
// line_splitter.hpp (output prefixing), signals.hpp (self-pipe) and
// supervisor.hpp (the poll loop that runs the job; output_relay.hpp the
// workers' output and log files, stop_policy.hpp why and how the job stops).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "run/agent.hpp"
#include "run/devices.hpp"
#include "run/job.hpp"
#include "run/logs.hpp"
#include "run/options.hpp"
#include "run/posix.hpp"
#include "run/signals.hpp"
#include "run/slurm.hpp"
#include "run/supervisor.hpp"

namespace {

constexpr int exit_usage = 2;
constexpr int exit_internal = 1;

/// If we were started with fd 0, 1 or 2 closed, a pipe we create could land
/// there and be clobbered by the child's dup2(); park /dev/null on them first.
void ensure_standard_fds_open() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    int null_fd = ::open("/dev/null", O_RDWR);
    if (null_fd >= 0 && null_fd != fd) {
      ::dup2(null_fd, fd);
      ::close(null_fd);
    }
  }
}

int usage_error(const std::string& message) {
  cclite::run::write_all(STDERR_FILENO, "cclite-run: " + message +
                                            "\nTry 'cclite-run --help' for usage and examples.\n");
  return exit_usage;
}

int internal_error(const std::string& message) {
  cclite::run::write_all(STDERR_FILENO, "cclite-run: " + message + "\n");
  return exit_internal;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cclite::run;
  ensure_standard_fds_open();

  // --nproc-per-node gpu|cpu|auto counted here; under srun (one cclite-run
  // per node) the node count and the agents' meeting point from the step,
  // unless the command line gives them.
  std::string srun_note;
  auto env = [](const char* v) { return static_cast<const char*>(std::getenv(v)); };
  parse_result parsed = parse_args(std::vector<std::string>(argv, argv + argc), [&](options& o) {
    std::string err = resolve_nproc(o, env);
    return err.empty() ? apply_srun(o, env, srun_note) : err;
  });
  if (parsed.what == parse_result::action::help) {
    write_all(STDOUT_FILENO, usage_text());
    return 0;
  }
  if (parsed.what == parse_result::action::usage_error) return usage_error(parsed.error);
  if (!srun_note.empty() && debug_on()) write_all(STDERR_FILENO, "cclite-run: INFO " + srun_note + "\n");
  if (std::string err = make_run_log_dir(parsed.opts); !err.empty()) return internal_error(err);
  if (!parsed.opts.log_run_dir.empty())
    write_all(STDERR_FILENO, "cclite-run: worker logs in " + parsed.opts.log_run_dir + "\n");

  rendezvous rdzv;
  if (std::string err = plan_rendezvous(parsed.opts, rdzv); !err.empty()) return usage_error(err);
  // Before the signal handlers: a Ctrl-C while waiting for the other nodes
  // simply ends cclite-run (no worker exists yet).
  std::unique_ptr<agent> peers;
  if (dynamic_rendezvous(parsed.opts)) {
    peers.reset(new agent());
    if (std::string err = peers->join(parsed.opts, rdzv); !err.empty())
      return internal_error(srun_note.empty() ? err : err + " [" + srun_note + "]");
  }
  if (std::string err = choose_free_port(rdzv); !err.empty()) return internal_error(err);

  signal_events signals;
  if (std::string err = signals.install(); !err.empty()) return internal_error(err);

  // Each attempt runs every worker afresh; after a restartable failure (and
  // with --max-restarts left) the nodes meet again and start over, as
  // torchrun's elastic agent does. The workers resume from their checkpoints.
  const options& o = parsed.opts;
  if (peers)
    peers->set_interrupt([&signals] {
      for (int sig : signals.take())
        if (sig != SIGCHLD) return sig;
      return 0;
    });
  // A membership change (a node waiting to join, --nnodes MIN:MAX) restarts
  // the workers too, without counting against --max-restarts (torchrun).
  for (int restarts = 0;;) {
    rdzv.restart_count = restarts;
    supervisor job(o, rdzv, signals, timings{}, peers.get());
    int code = job.run();
    const bool rescale = peers && job.rescaling();
    if (!rescale && (code == 0 || !job.restartable() || restarts >= o.max_restarts)) {
      if (peers) peers->leave(code);
      return code;
    }
    if (rescale) {
      write_all(STDERR_FILENO, "cclite-run: restarting the workers to take in a joining node "
                               "(a membership change, not counted as a restart)\n");
    } else {
      ++restarts;
      write_all(STDERR_FILENO, "cclite-run: restarting the workers (restart " + std::to_string(restarts) +
                                   " of " + std::to_string(o.max_restarts) + ")\n");
    }
    // One node keeps its port: rank 0's store binds it again (SO_REUSEADDR).
    if (peers) {
      if (std::string err = peers->next_round(rdzv); !err.empty()) {
        const int status = peers->interrupt_signal() ? 128 + peers->interrupt_signal() : 1;
        peers->leave(status);
        internal_error(err);
        return status;
      }
    }
  }
}
