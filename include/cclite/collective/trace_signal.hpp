// cclite/collective/trace_signal.hpp - a flight recorder dump on request: with
// CCLITE_TRACE_BUFFER on, SIGUSR1 makes the process write its file
// (flight_recorder.hpp) and go on.
//
// A process writes its file by itself only when one of its calls fails. A
// rank that is merely slow, stuck in the program's own code, or waiting under
// a long timeout writes nothing, and cclite-trace can only say "no file" for
// it. `kill -USR1 <pid>` (or `scancel --signal=USR1`, `cclite-run` when a worker
// fails or --timeout expires) asks it for one: its last calls, the one in
// flight shown as running.
//
// How: the handler only writes a byte to a pipe (async-signal-safe); a thread
// of the process's own, blocked on the pipe, writes the file, since formatting
// and file I/O cannot run in a handler. The handler is installed when the
// first communicator with a recorder is created, and only if the signal still
// has its default action (which would end the process): a program that
// handles SIGUSR1 itself keeps its handler. CCLITE_TRACE_SIGNAL picks another
// signal (USR2) or none (0). SA_RESTART, and cclite's own waits retry on
// EINTR, so the signal does not disturb calls in flight (flight_recorder_test
// sends it during collectives and checks their results).
//
// After fork(), the child inherits the handler but not the thread: the handler
// does nothing in a process that has not made the pipe its own (a forked rank
// arms it again when it creates its communicator). A CCLITE_NO_THREADS build
// has no thread to write the file, so it installs nothing.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include <cclite/collective/flight_recorder.hpp>
#include <cclite/config.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>

namespace cclite {
namespace detail {

/// The process's dump-on-request state: which process owns the pipe (the
/// handler checks it, see fork above) and the pipe's write end.
struct trace_signal_state {
  std::atomic<int> owner{0};  ///< pid whose thread reads the pipe; 0: none
  std::atomic<int> write_fd{-1};
  int read_fd = -1;   ///< read by the dumper thread
  int signo = 0;      ///< the signal armed
  int rank = 0;       ///< labels the dumper's log lines
  std::mutex m;       ///< arm_trace_signal()
};
static_assert(std::atomic<int>::is_always_lock_free, "read in a signal handler");

inline trace_signal_state& trace_signal() {
  static trace_signal_state s;
  return s;
}

/// The handler: one byte into the pipe, nothing else (async-signal-safe).
inline void trace_signal_handler(int) {
  trace_signal_state& s = trace_signal();  // constructed before the handler was installed
  const int saved = errno;
  if (s.owner.load(std::memory_order_acquire) == static_cast<int>(::getpid())) {
    const char byte = 1;
    ssize_t n = ::write(s.write_fd.load(std::memory_order_relaxed), &byte, 1);  // full pipe: a dump is pending anyway
    (void)n;
  }
  errno = saved;
}

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

/// CCLITE_TRACE_SIGNAL: USR1 (default), USR2 (with or without "SIG"), or 0 /
/// none / off for no dump on request.
inline result<int> trace_signal_number() {
  const char* v = env::raw("TRACE_SIGNAL", false);
  if (!v) return SIGUSR1;
  const char* name = std::strncmp(v, "SIG", 3) == 0 ? v + 3 : v;
  if (std::strcmp(name, "USR1") == 0) return SIGUSR1;
  if (std::strcmp(name, "USR2") == 0) return SIGUSR2;
  if (!*name || !std::strcmp(name, "0") || !std::strcmp(name, "none") || !std::strcmp(name, "off")) return 0;
  return make_error(errc::invalid_argument, "CCLITE_TRACE_SIGNAL='%s' is not USR1, USR2 or 0 (the signal that asks a "
                    "process for its flight recorder file; 0: none)", v);
}

/// "USR1" / "USR2" (the only signals armed), for messages.
inline const char* trace_signal_name(int sig) { return sig == SIGUSR1 ? "USR1" : "USR2"; }

/// The contents of `path` into `out`; false if it cannot be read.
inline bool read_whole_file(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  bool ok = true;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      ok = false;
      break;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return ok;
}

/// The dumper thread: a file per wake-up of the pipe (several signals at
/// once: one file). A plain pthread (no std::thread state to compile).
inline void* trace_dumper(void*) {
  const trace_signal_state& s = trace_signal();  // set before the thread was made, not changed since
  const int fd = s.read_fd;
  char buf[64];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return nullptr;  // the pipe was closed (not in practice: the thread lives as long as the process)
    // Made per request, not when the thread starts: that start comes at any
    // moment of the program's steady state (late on a loaded machine), where
    // a logger's allocations would be the program's hot path's (alloc_test).
    logger lg(s.rank);
    // The file replaces the one a failure wrote, whose reason line would be
    // lost with it (the failed call itself stays in the file): it is kept.
    std::string why = std::string("SIG") + trace_signal_name(s.signo) + ": a dump on request (the process went on)";
    {
      trace_registry& r = trace_recorders();
      std::lock_guard<std::mutex> g(r.m);
      if (!r.last_reason.empty() && r.last_reason_pid == ::getpid()) why += "; the last dump before it: " + r.last_reason;
    }
    const std::string text = trace_text(why);
    if (text.find("\ncomm ") == std::string::npos) {
      // No communicator left (the process is ending, e.g. after a failure):
      // an empty file would replace the one its failure wrote. That one is
      // written again as it is, a new file, which tells a waiting cclite-run
      // the request was answered (trace_request.hpp: a new inode; a touch
      // could be missed where file times are coarse).
      CCLITE_INFO(lg, "flight recorder: asked for a file with no communicator alive; the last file stays");
      std::string kept;
      if (read_whole_file(trace_file_path(), kept)) (void)write_trace_file(kept);
      continue;
    }
    auto path = write_trace_file(text);
    if (path) CCLITE_WARN(lg, "flight recorder: last calls written to %s on request", path.value().c_str());
    else CCLITE_WARN(lg, "%s", path.error().to_string().c_str());
  }
}

/// Arms the dump on request for this process (once per process; again in a
/// forked child). `rank` labels the dumper's log lines. Returns an error only
/// for a bad CCLITE_TRACE_SIGNAL; a signal the program handles itself, or a
/// pipe or thread that cannot be made, leaves the dump on request off and says
/// so in the log.
inline status arm_trace_signal(int rank, const logger& log) {
  auto sig = trace_signal_number();
  if (!sig) return sig.error();
#ifdef CCLITE_NO_THREADS
  (void)rank;
  (void)log;
  return {};
#else
  if (sig.value() == 0) return {};
  trace_signal_state& s = trace_signal();
  std::lock_guard<std::mutex> g(s.m);
  const int pid = static_cast<int>(::getpid());
  if (s.owner.load() == pid) return {};  // armed already (by an earlier communicator)
  struct sigaction old {};
  ::sigaction(sig.value(), nullptr, &old);
  const bool ours = (old.sa_flags & SA_SIGINFO) == 0 && old.sa_handler == &trace_signal_handler;  // a forked child
  if (!ours && old.sa_handler != SIG_DFL) {
    CCLITE_INFO(log, "flight recorder: SIG%s has a handler of the program's; no dump on that signal (set "
                "CCLITE_TRACE_SIGNAL=USR2 for another, or call cclite::dump_traces() from the handler's thread)",
                trace_signal_name(sig.value()));
    return {};
  }
  // A forked child holds copies of its parent's pipe: not its own.
  if (s.read_fd >= 0) ::close(s.read_fd);
  if (int w = s.write_fd.exchange(-1); w >= 0) ::close(w);
  s.read_fd = -1;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    CCLITE_WARN(log, "flight recorder: no dump on request: pipe2() failed: %s", std::strerror(errno));
    return {};
  }
  ::fcntl(p[1], F_SETFL, O_NONBLOCK);  // the handler never blocks
  s.read_fd = p[0];
  s.signo = sig.value();
  s.rank = rank;
  pthread_t dumper;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  const int made = ::pthread_create(&dumper, &attr, &trace_dumper, nullptr);
  pthread_attr_destroy(&attr);
  if (made != 0) {
    CCLITE_WARN(log, "flight recorder: no dump on request: pthread_create() failed: %s", std::strerror(made));
    ::close(p[0]);
    ::close(p[1]);
    s.read_fd = -1;
    return {};
  }
  s.write_fd.store(p[1]);
  s.owner.store(pid, std::memory_order_release);
  if (!ours) {
    struct sigaction sa {};
    sa.sa_handler = &trace_signal_handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig.value(), &sa, nullptr);
  }
  CCLITE_INFO(log, "flight recorder: SIG%s writes this process's file on request (kill -%s %d)",
              trace_signal_name(sig.value()), trace_signal_name(sig.value()), pid);
  return {};
#endif
}

CCLITE_SETUP_CODE_END

}  // namespace detail
}  // namespace cclite
