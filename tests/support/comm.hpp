// tests/support/comm.hpp - building communicators inside forked test ranks.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include <cclite/cclite.hpp>

#include "support/mp.hpp"

namespace cclite::test {

/// How the ranks of a test reach each other.
enum class net { shm_only, tcp_only, mixed };

/// (A std::string: doctest's INFO prints a `const char*` as a pointer.)
inline std::string to_string(net n) {
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

#if defined(CCLITE_HAS_TCP)
/// A loopback port that was free a moment ago (bound, then released): a
/// MASTER_PORT for ranks that meet through cclite::init()'s TCP rendezvous,
/// which rank 0 hosts. 0 if none could be bound.
inline std::uint16_t free_port() {
  auto probe = tcp::store_server::start("127.0.0.1", 0);
  return probe ? probe.value()->port() : 0;
}
#endif

/// What a launcher gives rank `rank` of `size` for cclite::init(): rank 0
/// hosts the TCP rendezvous store on 127.0.0.1:`port` (free_port()).
inline void set_launch_env(int rank, int size, const std::string& port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", port.c_str(), 1);
}

}  // namespace cclite::test
