// tests/gpu/processes.hpp - forked ranks for the GPU programs (host code only).
//
// The GPU programs are plain executables: the parent checks for a device in a
// child and forks the ranks before it touches CUDA itself, because a process
// that initialised CUDA must not fork (cclite/cuda/runtime.hpp).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cclite/cuda/runtime.hpp>

namespace cclite::gpu_test {

/// True when a CUDA device is usable, probed in a child process so that this
/// one stays CUDA-free; otherwise prints "SKIP <program>: no CUDA device".
inline bool have_device_or_skip(const char* program) {
  const pid_t probe = ::fork();
  if (probe == 0) ::_exit(cuda::available() ? 0 : 77);
  int st = 0;
  ::waitpid(probe, &st, 0);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return true;
  std::printf("SKIP %s: no CUDA device\n", program);
  return false;
}

/// Runs fn(dir, rank) in `size` forked processes that share a fresh
/// directory /tmp/cclite-<tag>-XXXXXX (for their file store); a rank fails
/// when fn returns non-zero or it dies. Returns how many failed, after
/// removing the directory.
template <class F>
int in_processes(const char* tag, int size, F fn) {
  std::string tmpl = std::string("/tmp/cclite-") + tag + "-XXXXXX";
  std::vector<char> path(tmpl.begin(), tmpl.end());
  path.push_back('\0');
  const char* dir = ::mkdtemp(path.data());
  if (!dir) return size;
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t p = ::fork();
    if (p == 0) {
      const int failed = fn(dir, r);
      std::fflush(stdout);
      ::_exit(failed ? 1 : 0);
    }
    if (p > 0) pids.push_back(p);
  }
  int bad = size - static_cast<int>(pids.size());  // ranks that could not be forked
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  const std::string rm = std::string("rm -rf '") + dir + "'";
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir);
  return bad;
}

}  // namespace cclite::gpu_test
