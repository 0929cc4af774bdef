// cclite/verbs/fork.hpp - ibv_fork_init(), once per process, before the first
// memory registration.
//
// cclite processes fork: the cclite-run launcher, the store helper of
// CCLITE_NO_THREADS, tests. Registered (pinned) pages shared copy-on-write with
// a child break RDMA in the parent once either side writes them, unless
// libibverbs marked them MADV_DONTFORK, which it does only after
// ibv_fork_init() (or with RDMAV_FORK_SAFE / IBV_FORK_SAFE set in the
// environment, where libibverbs calls it itself). It must come before any
// ibv_reg_mr: called later it fails (EINVAL) and changes nothing. On kernels
// with copy-on-fork for pinned pages (Linux 5.13+) rdma-core makes it a no-op.
//
// verbs::transport::publish() calls ensure_fork_init() after it picked a port
// and before it opens the device (so before any registration); with zero
// devices it is never called. CCLITE_IB_FORK_SAFE=0 skips it. A failure is a
// WARN line, not an error: the job still runs, but a child must not touch
// memory registered by its parent.
//
// Thread safety: ensure() may be called from any thread; the function runs once.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

namespace cclite::verbs {

/// What ensure() did.
struct fork_init_outcome {
  bool called = false;  ///< ibv_fork_init() (or the stand-in) was called
  int rc = 0;           ///< its return value: 0 or an errno value
  std::string warning;  ///< set when rc != 0: the line to log at WARN (not fatal)
};

/// Calls an ibv_fork_init-like function at most once over its lifetime. The
/// function is a parameter so tests can count calls; the process uses
/// process_fork_initializer(), which calls the real one.
class fork_initializer {
 public:
  using init_fn = int (*)();

  explicit fork_initializer(init_fn fn = &::ibv_fork_init) noexcept : fn_(fn) {}
  fork_initializer(const fork_initializer&) = delete;
  fork_initializer& operator=(const fork_initializer&) = delete;

  /// `wanted` false (CCLITE_IB_FORK_SAFE=0): does nothing and returns a
  /// "not called" outcome, without using up the one call. `wanted` true: the
  /// first such call runs the function, every later one returns that outcome.
  const fork_init_outcome& ensure(bool wanted) {
    if (!wanted) return skipped_;
    std::call_once(once_, [this] {
      out_.called = true;
      out_.rc = fn_ ? fn_() : 0;
      if (out_.rc != 0) out_.warning = describe_failure(out_.rc);
    });
    return out_;
  }

  /// The WARN line for a failed ibv_fork_init() returning `rc`.
  static std::string describe_failure(int rc) {
    std::string s = "verbs: ibv_fork_init() failed: ";
    s += std::strerror(rc);
    if (rc == EINVAL) s += " (memory was registered before it was called)";
    s += "; continuing without fork protection: a child process (cclite-run, the CCLITE_NO_THREADS store "
         "helper) must not touch memory registered by its parent. Set RDMAV_FORK_SAFE=1 so libibverbs does it "
         "when it loads, or CCLITE_IB_FORK_SAFE=0 to skip it";
    return s;
  }

 private:
  init_fn fn_;
  std::once_flag once_;
  fork_init_outcome out_;
  const fork_init_outcome skipped_{};
};

/// The process's initializer: fork protection is process-wide state in
/// libibverbs, so this is the one function-local static of the transport.
inline fork_initializer& process_fork_initializer() {
  static fork_initializer f;
  return f;
}

/// ibv_fork_init() once per process when `wanted` (ib_config::fork_safe).
inline const fork_init_outcome& ensure_fork_init(bool wanted) { return process_fork_initializer().ensure(wanted); }

}  // namespace cclite::verbs
