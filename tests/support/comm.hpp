// tests/support/comm.hpp - building communicators inside forked test ranks.
#pragma once

#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <cclite/cclite.hpp>

#include "support/mp.hpp"

namespace cclite::test {

/// How the ranks of a test reach each other.
enum class net { shm_only, tcp_only, mixed };

inline const char* to_string(net n) {
  return n == net::shm_only ? "shm" : n == net::tcp_only ? "tcp" : "mixed";
}

/// Environment for rank `rank` of `size` under `n`: tcp_only disables shm; mixed
/// splits the ranks into two fake nodes with CCLITE_HOSTID (first half, second
/// half), so the ring crosses "nodes" over TCP and stays on shm inside them.
inline void set_net_env(net n, int rank, int size) {
  ::unsetenv("CCLITE_SHM_DISABLE");
  ::unsetenv("CCLITE_TCP_DISABLE");
  ::unsetenv("CCLITE_HOSTID");
  if (n == net::tcp_only) ::setenv("CCLITE_SHM_DISABLE", "1", 1);
  if (n == net::shm_only) ::setenv("CCLITE_TCP_DISABLE", "1", 1);
  if (n == net::mixed) ::setenv("CCLITE_HOSTID", rank < (size + 1) / 2 ? "fake-node-a" : "fake-node-b", 1);
}

/// Opens the file store in `dir` (every rank of a test shares it).
inline std::unique_ptr<store> open_dir_store(const std::string& dir) {
  auto s = file_store::open(dir);
  MP_REQUIRE_OK(s);
  return std::move(s.value());
}

/// A default_communicator for this rank over `kv`.
inline std::unique_ptr<default_communicator> make_comm(store& kv, int rank, int size,
                                                       comm_options opts = {}) {
  if (opts.timeout.count() == -2) opts.timeout = milliseconds(60000);
  auto c = default_communicator::create(kv, rank, size, opts);
  MP_REQUIRE_OK(c);
  return std::move(c.value());
}

/// Whether one process may read a sibling's memory with process_vm_readv
/// here (ptrace policy: Yama's ptrace_scope, seccomp, capabilities): what
/// shm-direct's single-copy probe finds out between test ranks, which are
/// siblings too. Forks two children; the second reads a word of the first.
inline bool cma_between_siblings() {
  static const std::uint64_t word = 0x5eed;
  int hold[2];
  if (::pipe(hold) != 0) return false;
  const pid_t target = ::fork();
  if (target == 0) {  // waits until the reader is done
    char c;
    ::close(hold[1]);
    while (::read(hold[0], &c, 1) < 0) {}
    ::_exit(0);
  }
  const pid_t reader = ::fork();
  if (reader == 0) {
    std::uint64_t got = 0;
    iovec local{&got, sizeof got}, remote{const_cast<std::uint64_t*>(&word), sizeof word};
    ::_exit(::process_vm_readv(target, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof got) && got == word ? 0 : 1);
  }
  int st = 0;
  if (reader > 0) ::waitpid(reader, &st, 0);
  ::close(hold[0]);
  ::close(hold[1]);  // the target's read returns 0: it exits
  if (target > 0) ::waitpid(target, nullptr, 0);
  return reader > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/// The whole of a text file, or "" when it cannot be read.
inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace cclite::test
