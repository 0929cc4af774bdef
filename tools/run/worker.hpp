// tools/run/worker.hpp - one worker process: fork, its own process group,
// stdout/stderr into pipes, stdin from /dev/null, exec.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/types.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "line_splitter.hpp"
#include "posix.hpp"
#include "signals.hpp"

extern char** environ;

namespace cclite::run {

struct worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;  ///< also its process group id
  bool running = false;
  int out_fd = -1;  ///< read end of its stdout pipe, non-blocking; -1 after EOF
  int err_fd = -1;  ///< read end of its stderr pipe
  line_splitter out_lines;
  line_splitter err_lines;
  int out_log = -1, err_log = -1;  ///< its log files (--redirects / --tee, logs.hpp), or -1
  bool out_console = true, err_console = true;  ///< relayed to our stdout / stderr
};

struct spawn_result {
  bool ok = false;
  int exec_errno = 0;  ///< set when the program itself could not be executed
  std::string error;   ///< one line for the user when !ok
};

namespace detail {

/// Everything between fork and exec: only async-signal-safe calls, and no
/// allocation (argv/envp were built by the parent).
[[noreturn]] inline void exec_child(char* const* argv, char** envp, int devnull, int out_w,
                                    int err_w, int status_w, const signal_events& signals,
                                    const sigset_t& old_mask, pid_t launcher, const cpu_set_t* bind) {
#ifdef __linux__
  // A launcher killed with SIGKILL cannot stop its workers; the kernel does it
  // for us, so no orphan keeps a device or a port, and the other nodes see
  // their peers go away instead of waiting for them. (Kept across exec.)
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl
#else
  (void)launcher;
#endif
  // Its own group, so that forwarding a signal to -pid reaches the worker's
  // children too, and a Ctrl-C in the terminal reaches only the launcher
  // (which then forwards it once, to everyone).
  ::setpgid(0, 0);
  signals.reset_in_child(old_mask);
  // stdin from /dev/null: N workers sharing a terminal would fight over it, and
  // a background process group reading the terminal gets stopped (SIGTTIN).
  ::dup2(devnull, STDIN_FILENO);
  ::dup2(out_w, STDOUT_FILENO);
  ::dup2(err_w, STDERR_FILENO);
  // --bind-to (cpu_bind.hpp): before exec, so every thread the program starts
  // inherits it. A failure goes back as a negative errno (exec failures are positive).
  if (bind && ::sched_setaffinity(0, sizeof(cpu_set_t), bind) != 0) {
    int e = -errno;
    ssize_t n = ::write(status_w, &e, sizeof(e));
    (void)n;
    ::_exit(126);
  }
  environ = envp;  // execvp searches PATH and passes environ; execvpe is not POSIX
  ::execvp(argv[0], argv);
  int e = errno;
  ssize_t n = ::write(status_w, &e, sizeof(e));  // status_w is close-on-exec: EOF means success
  (void)n;
  ::_exit(e == ENOENT ? 127 : 126);
}

/// Waits until the child has exec'd (EOF on the close-on-exec status pipe) or
/// failed to (its errno arrives; negative: binding it to its CPUs failed).
/// Returns that errno, 0 on success.
inline int read_exec_errno(int status_r) {
  int e = 0;
  ssize_t n;
  do {
    n = ::read(status_r, &e, sizeof(e));
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(sizeof(e)) ? e : 0;
}

}  // namespace detail

/// Starts `command` as worker `w` with environment `env`, bound to the CPUs in
/// `bind` unless it is null. On success `w.pid`, `w.out_fd`, `w.err_fd` are
/// set and `w.running` is true. On failure nothing is left running and the
/// result says why.
inline spawn_result spawn_worker(worker& w, const std::vector<std::string>& command,
                                 const std::vector<std::string>& env,
                                 const signal_events& signals, const cpu_set_t* bind = nullptr) {
  spawn_result res;
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  auto sys_fail = [&](const char* what) {
    int e = errno;
    res.error = std::string(what) + " for rank " + std::to_string(w.rank) +
                " failed: " + std::strerror(e) +
                (e == EMFILE || e == ENFILE ? " (raise the open-file limit: ulimit -n)" : "");
    return res;
  };

  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) return sys_fail("open(/dev/null)");
  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  auto close_all = [&] {
    for (int* fd : {&devnull, &out[0], &out[1], &err[0], &err[1], &status[0], &status[1]})
      close_fd(*fd);
  };
  if (!make_cloexec_pipe(out) || !make_cloexec_pipe(err) || !make_cloexec_pipe(status)) {
    sys_fail("pipe()");
    close_all();
    return res;
  }

  sigset_t old_mask = signals.block();
  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0)
    detail::exec_child(argv.data(), envp.data(), devnull, out[1], err[1], status[1], signals,
                       old_mask, launcher, bind);
  int fork_errno = errno;
  signal_events::unblock(old_mask);
  if (pid < 0) {
    errno = fork_errno;
    sys_fail("fork()");
    close_all();
    return res;
  }
  // Also from the parent: we may signal -pid before the child got to run.
  // EACCES (the child already exec'd) and ESRCH are fine.
  ::setpgid(pid, pid);

  close_fd(devnull);
  close_fd(out[1]);
  close_fd(err[1]);
  close_fd(status[1]);
  int exec_errno = detail::read_exec_errno(status[0]);
  close_fd(status[0]);
  if (exec_errno != 0) {
    ::waitpid(pid, nullptr, 0);  // it _exit()s right after telling us
    close_fd(out[0]);
    close_fd(err[0]);
    if (exec_errno < 0) {
      res.exec_errno = 0;  // the program was not the problem: a plain failure (exit 1)
      res.error = "cannot bind rank " + std::to_string(w.rank) + " to its CPUs (--bind-to): " +
                  std::strerror(-exec_errno);
      return res;
    }
    res.exec_errno = exec_errno;
    res.error = "cannot execute '" + command[0] + "': " + std::strerror(exec_errno);
    return res;
  }

  set_nonblocking(out[0]);
  set_nonblocking(err[0]);
  w.pid = pid;
  w.running = true;
  w.out_fd = out[0];
  w.err_fd = err[0];
  res.ok = true;
  return res;
}

}  // namespace cclite::run
