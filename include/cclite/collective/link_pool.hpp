// cclite/collective/link_pool.hpp - the connections a family of communicators shares.
//
// A communicator built by create() owns a link_pool: its transports (listen
// sockets, shm naming), one link per peer of that root communicator, the
// store prefix the transports hand-shake in, and the abort flag every link
// waits on. Children made by split() and the hierarchical algorithm's node and
// cross-node communicators hold the same pool (shared ownership) and a map
// from their ranks to the root's: a child reuses the root's link to a member
// already connected and, for one that is not, connects it through the root's
// transports and leaves it in the pool, where the root (and every other
// child) finds it later. No child opens a socket or shm segment of its own
// for a pair the family already connected (NCCL's ncclCommSplit with
// splitShare = 1; Gloo instead gives each context its own pairs).
//
// Separating the traffic: a link is one ordered byte stream, and every
// collective moves exactly the bytes both of its ends expect (padded and
// flushed at its end, algorithm/primitives.hpp). So collectives of the parent
// and of a child on one link never interleave as long as both ranks of the
// pair issue them in the same order, which callers must do anyway (as with
// any two NCCL communicators used from one thread). The call header of each
// collective (mismatch.hpp) carries the communicator's id, so calls issued in
// a different order on two ranks are reported as errc::mismatch instead of
// being read as each other's data.
//
// Concurrency: one collective at a time runs over a pool (`busy`, taken by
// communicator::execute), so the parent and a child used from two threads, or
// an async call on one and a blocking call on the other, never touch a link
// at the same time; their order across ranks must still agree (see above).
// Lifetime: the pool lives as long as its longest-lived member, so a child may
// outlive its parent (the user's store must outlive both). Failure: the pool
// has one abort flag (aborting any member aborts the family, since a link
// interrupted mid-collective is unusable for all) and records the first fatal
// error of any member; the others report it on their next call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cclite/bootstrap/store.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/topology/peer_info.hpp>
#include <cclite/transport/transport_set.hpp>
#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::detail {

template <class... Transports>
struct link_pool {
  using transports = transport_set<Transports...>;
  using link = typename transports::link;

  link_pool(store& base, int root_rank) : user_kv(base), log(root_rank) {}
  link_pool(const link_pool&) = delete;
  link_pool& operator=(const link_pool&) = delete;

  /// Records the first fatal error of any member (later ones are echoes).
  void fail(const status& st) {
    std::lock_guard<std::mutex> g(fault_mu);
    if (fault.ok()) fault = st;
    failed.store(true);
  }
  status first_fault() {
    std::lock_guard<std::mutex> g(fault_mu);
    return fault;
  }

  // Declaration order is destruction order reversed: links go before the
  // transports that made them, the transports before the store and peers
  // their context points to.
  store& user_kv;
  std::unique_ptr<prefix_store> kv;  ///< the root communicator's prefix: transport hand-shakes
  std::vector<peer_info> peers;      ///< by root rank
  logger log;                        ///< the root's, for the transports
  std::atomic<bool> aborted{false};
  std::atomic<bool> failed{false};
  /// A failing communicator of this family found the store silent for
  /// fault_store_budget (its host lost?) or unreachable (its host process
  /// gone): the others do not ask it again.
  std::atomic<bool> store_silent{false};
  transport_context ctx;
  std::unique_ptr<transports> set;
  std::vector<int> choice;  ///< transport index per root rank (-1: self)
  std::vector<link> links;  ///< per root rank; std::monostate = not connected
  std::mutex busy;          ///< held by the collective running over these links
  std::mutex fault_mu;
  status fault;
  /// Link figures measured at the root's creation (CCLITE_COST_MEASURE=1), for
  /// the children's cost models: "" = not measured.
  std::string measured_costs;
};

/// 24-bit id of a communicator for its call headers: FNV-1a of its store
/// prefix, equal on all its ranks, different for a parent and its children.
inline std::uint32_t comm_id_of(const std::string& prefix) {
  std::uint32_t x = 2166136261u;
  for (unsigned char c : prefix) x = (x ^ c) * 16777619u;
  return (x ^ (x >> 24)) & 0xffffffu;
}

}  // namespace cclite::detail
CCLITE_SETUP_CODE_END
