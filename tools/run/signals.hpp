// tools/run/signals.hpp - signals as events in cclite-run's poll() loop.
//
// The handlers only write the signal number into a pipe (the self-pipe trick);
// the supervisor's poll() wakes on it and does the real work outside signal
// context. SIGCHLD goes through the same pipe, so a worker exiting wakes the
// loop at once and there is no race between "check children" and "sleep".
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "posix.hpp"

namespace cclite::run {

namespace detail {
// The one piece of global state: a signal handler can reach nothing else.
inline volatile sig_atomic_t signal_pipe_fd = -1;

extern "C" inline void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (signal_pipe_fd >= 0) {
    ssize_t n = ::write(signal_pipe_fd, &b, 1);  // a full pipe already wakes poll()
    (void)n;
  }
  errno = saved;
}
}  // namespace detail

/// Signals the launcher forwards to every worker.
inline const std::vector<int>& forwarded_signals() {
  static const std::vector<int> s = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  return s;
}

class signal_events {
 public:
  signal_events() = default;
  signal_events(const signal_events&) = delete;
  signal_events& operator=(const signal_events&) = delete;
  ~signal_events() {
    detail::signal_pipe_fd = -1;
    close_fd(fds_[0]);
    close_fd(fds_[1]);
  }

  /// Installs the handlers. A forwarded signal that was ignored when we started
  /// (nohup, a background job of a non-interactive shell) stays ignored, for us
  /// and for the workers, as every well-behaved program does; SIGTERM is always
  /// handled because it is how schedulers stop jobs. SIGPIPE is ignored so that
  /// a closed stdout is an EPIPE we can live with, not our death.
  std::string install() {
    if (!make_cloexec_pipe(fds_) || !set_nonblocking(fds_[0]) || !set_nonblocking(fds_[1]))
      return std::string("cannot create the signal pipe: ") + std::strerror(errno);
    detail::signal_pipe_fd = fds_[1];
    std::vector<int> sigs = forwarded_signals();
    sigs.push_back(SIGCHLD);
    for (int sig : sigs) {
      struct sigaction old {};
      ::sigaction(sig, nullptr, &old);
      bool keep_ignored = sig != SIGTERM && sig != SIGCHLD;  // SIGCHLD: we must see exits
      if (old.sa_handler == SIG_IGN && keep_ignored) continue;
      struct sigaction sa {};
      sa.sa_handler = detail::on_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
      if (::sigaction(sig, &sa, nullptr) != 0)
        return "cannot install a handler for " + signal_name(sig) + ": " + std::strerror(errno);
      handled_.push_back(sig);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &sigpipe_);
    return {};
  }

  int fd() const { return fds_[0]; }

  /// Signals received since the last call, in arrival order.
  std::vector<int> take() {
    std::vector<int> out;
    unsigned char buf[64];
    for (;;) {
      ssize_t n = ::read(fds_[0], buf, sizeof(buf));
      if (n > 0) {
        out.insert(out.end(), buf, buf + n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        break;
      }
    }
    return out;
  }

  /// Blocks our handled signals around fork(), so that a signal arriving in a
  /// freshly forked child cannot run our handler there (it would write into
  /// the parent's pipe and fake an event).
  sigset_t block() const {
    sigset_t set, old;
    sigemptyset(&set);
    for (int sig : handled_) sigaddset(&set, sig);
    ::sigprocmask(SIG_BLOCK, &set, &old);
    return old;
  }
  static void unblock(const sigset_t& old) { ::sigprocmask(SIG_SETMASK, &old, nullptr); }

  /// In the child between fork and exec (async-signal-safe calls only):
  /// default dispositions, SIGPIPE as we found it, then the caller's mask.
  void reset_in_child(const sigset_t& old_mask) const {
    for (int sig : handled_) ::signal(sig, SIG_DFL);
    ::sigaction(SIGPIPE, &sigpipe_, nullptr);  // our SIG_IGN would survive exec
    ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  }

 private:
  int fds_[2] = {-1, -1};
  std::vector<int> handled_;
  struct sigaction sigpipe_ {};  // SIGPIPE as we found it, for the workers
};

}  // namespace cclite::run
