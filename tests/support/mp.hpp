// tests/support/mp.hpp - run a function as N real processes (fork), with a watchdog.
//
//   auto r = cclite::test::run_ranks(4, [](int rank, int size) { ...; return 0; });
//   CHECK(r.all_ok());
//
// Each child runs `fn(rank, size)` and exits with its return value. Inside a
// child, use MP_CHECK / MP_REQUIRE (they print file:line and make the child
// fail); doctest's own CHECK does not report from a forked child. The parent
// kills every child still running after `timeout` and reports it as failed,
// because a hung collective must fail the test, not hang ctest.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace cclite::test {

inline int& child_failures() {
  static int n = 0;
  return n;
}

struct run_result {
  std::vector<int> exit_codes;  // -signal if killed by a signal, 124 if the watchdog fired
  bool timed_out = false;
  std::vector<pid_t> pids;  // of the ranks, by rank (dead by now)
  bool all_ok() const {
    for (int c : exit_codes)
      if (c != 0) return false;
    return !exit_codes.empty();
  }
  std::string describe() const {
    std::string s;
    for (std::size_t i = 0; i < exit_codes.size(); ++i)
      s += "rank " + std::to_string(i) + ": " + std::to_string(exit_codes[i]) + "; ";
    if (timed_out) s += "(watchdog fired)";
    return s;
  }
};

/// Forks `size` children running fn(rank, size). `setup(rank)` runs in the child
/// first (set env vars there). Waits at most `timeout`.
inline run_result run_ranks(int size, const std::function<int(int, int)>& fn,
                            std::chrono::seconds timeout = std::chrono::seconds(120),
                            const std::function<void(int)>& setup = {}) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      child_failures() = 0;
      if (setup) setup(r);
      int rc = fn(r, size);
      if (rc == 0 && child_failures() > 0) rc = 1;
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  run_result res;
  res.pids = pids;
  res.exit_codes.assign(static_cast<std::size_t>(size), -1000);
  auto until = std::chrono::steady_clock::now() + timeout;
  int left = size;
  while (left > 0) {
    bool progressed = false;
    for (int r = 0; r < size; ++r) {
      if (res.exit_codes[static_cast<std::size_t>(r)] != -1000) continue;
      int st = 0;
      pid_t w = ::waitpid(pids[static_cast<std::size_t>(r)], &st, WNOHANG);
      if (w == pids[static_cast<std::size_t>(r)]) {
        res.exit_codes[static_cast<std::size_t>(r)] =
            WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        --left;
        progressed = true;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > until) {
      res.timed_out = true;
      for (int r = 0; r < size; ++r) {
        if (res.exit_codes[static_cast<std::size_t>(r)] != -1000) continue;
        ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
        ::waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
        res.exit_codes[static_cast<std::size_t>(r)] = 124;
      }
      break;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return res;
}

/// A fresh temporary directory (mkdtemp), removed by the destructor.
struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/cclite-test-XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    path = p ? p : "";
  }
  ~temp_dir() {
    if (!path.empty()) {
      std::string cmd = "rm -rf '" + path + "'";
      int rc = std::system(cmd.c_str());
      (void)rc;
    }
  }
};

}  // namespace cclite::test

#define MP_CHECK(cond)                                                                        \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: MP_CHECK(%s) failed (pid %d)\n", __FILE__, __LINE__, #cond, \
                   static_cast<int>(::getpid()));                                             \
      ++::cclite::test::child_failures();                                                     \
    }                                                                                         \
  } while (0)

#define MP_REQUIRE(cond)                                                                        \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "%s:%d: MP_REQUIRE(%s) failed (pid %d)\n", __FILE__, __LINE__, #cond, \
                   static_cast<int>(::getpid()));                                               \
      std::fflush(stderr);                                                                      \
      ::_exit(1);                                                                               \
    }                                                                                           \
  } while (0)

/// MP_REQUIRE for a cclite::status / result: prints its message on failure.
#define MP_REQUIRE_OK(expr)                                                                  \
  do {                                                                                       \
    const auto& mp_s_ = (expr);                                                              \
    if (!mp_s_.ok()) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s failed: %s (pid %d)\n", __FILE__, __LINE__, #expr,     \
                   ::cclite::test::detail_status_text(mp_s_).c_str(), (int)::getpid());       \
      std::fflush(stderr);                                                                   \
      ::_exit(1);                                                                            \
    }                                                                                        \
  } while (0)

namespace cclite::test {
template <class S>
std::string detail_status_text(const S& s) {
  if constexpr (std::is_same_v<S, ::cclite::status>) {
    return s.to_string();
  } else {
    return s.error().to_string();
  }
}
}  // namespace cclite::test
