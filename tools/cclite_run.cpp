// cclite-run: starts the workers of a cclite job on this node, torchrun style.
//
//   cclite-run --nproc-per-node 4 ./train
//   cclite-run --nnodes 2 --node-rank K --nproc-per-node 4 --rdzv-endpoint node0:29400 ./train
//
// See tools/README.md and `cclite-run --help`. The pieces live in tools/run/:
// options.hpp (command line), job.hpp (rendezvous address, worker environment),
// worker.hpp (fork/exec), line_splitter.hpp (output prefixing), signals.hpp
// (self-pipe) and supervisor.hpp (the poll loop that runs the job).
#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "run/job.hpp"
#include "run/options.hpp"
#include "run/posix.hpp"
#include "run/signals.hpp"
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

  parse_result parsed = parse_args(std::vector<std::string>(argv, argv + argc));
  if (parsed.what == parse_result::action::help) {
    write_all(STDOUT_FILENO, usage_text());
    return 0;
  }
  if (parsed.what == parse_result::action::usage_error) return usage_error(parsed.error);

  rendezvous rdzv;
  if (std::string err = plan_rendezvous(parsed.opts, rdzv); !err.empty()) return usage_error(err);
  if (std::string err = choose_free_port(rdzv); !err.empty()) return internal_error(err);

  signal_events signals;
  if (std::string err = signals.install(); !err.empty()) return internal_error(err);

  supervisor job(std::move(parsed.opts), std::move(rdzv), signals);
  return job.run();
}
