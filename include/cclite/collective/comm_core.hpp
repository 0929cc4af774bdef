// cclite/collective/comm_core.hpp - what a communicator is made of: its ranks,
// topology, transports and links, and the set-up that builds them.
//
// Private base of communicator<...> (collective/communicator.hpp, the public
// API), through comm_checks (collective/comm_checks.hpp: the cross-rank
// checks and failure spreading) and comm_algorithms (the algorithm runners). Set-up: join a generation of the store, exchange peer_info, build the
// topology, choose a transport per peer, connect the ring neighbours. Other
// links are connected on first use, always in (min, max) pair order so that
// the blocking pairwise handshakes cannot deadlock.
//
// The set-up members (init() and what it calls) are defined in
// comm_core_setup.hpp, included at the end of this header; the per-call link
// handling (with_links, ensure_links, exchange_with) is defined here.
#pragma once

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cclite/algorithm/primitives.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/collective/cost_measure.hpp>
#include <cclite/collective/link_pool.hpp>
#include <cclite/collective/mismatch.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/collective/select.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/topology/topology.hpp>
#include <cclite/transport/any_link.hpp>
#include <cclite/transport/transport_set.hpp>

namespace cclite {

/// Knobs of a communicator; defaults come from the environment.
struct comm_options {
  /// Bounds every wait (bootstrap, connect, each collective). Default
  /// CCLITE_TIMEOUT, 30 minutes. Zero or negative = no deadline. A communicator's
  /// set_timeout() changes it for the calls after set-up.
  milliseconds timeout{-2};  // -2: take CCLITE_TIMEOUT
  /// Elements a ring round moves per segment = chunk_bytes / element size.
  /// Default CCLITE_CHUNKSIZE or 512 KiB; must stay at most a quarter of the
  /// transports' buffer size so a ring round always fits in the FIFOs.
  std::size_t chunk_bytes = 0;
  /// Key prefix in the store, so several communicators can share one store.
  std::string store_prefix = "cclite";
};

namespace detail {

template <class... Transports>
class comm_core {
 protected:
  using transports = transport_set<Transports...>;
  using link = typename transports::link;
  using pool_t = link_pool<Transports...>;

  // A root communicator (create()): a pool of its own.
  comm_core(store& kv, int rank, int size)
      : pool_(std::make_shared<pool_t>(kv, rank)), aborted_(pool_->aborted), user_kv_(kv), rank_(rank),
        size_(size), log_(rank) {}
  // A child (split(), hierarchical): the family's pool; root_of[r] = root rank of rank r.
  comm_core(std::shared_ptr<pool_t> pool, std::vector<int> root_of, int rank)
      : pool_(std::move(pool)), aborted_(pool_->aborted), user_kv_(pool_->user_kv), rank_(rank),
        size_(static_cast<int>(root_of.size())), log_(rank), root_of_(std::move(root_of)) {}

  const char* transport_of(int peer) const {
    return peer == rank_ ? "self" : transports::name(pool_->choice[root(peer)]);
  }
  std::size_t root(int r) const { return static_cast<std::size_t>(root_of_[static_cast<std::size_t>(r)]); }
  milliseconds timeout() const noexcept { return milliseconds(timeout_ms_.load(std::memory_order_relaxed)); }
  link& link_at(int r) { return pool_->links[root(r)]; }

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  // ---- set-up (defined in comm_core_setup.hpp) --------------------------------------------

  status init_common(comm_options& opts);  // what roots and children set up alike
  status init(comm_options opts);          // a root communicator (create())
  status init_child(comm_options opts, std::string prefix, std::string tag);  // a child, over the family's pool
  status choose_transports();
  status connect_ring(deadline until);  // the ring neighbours, eagerly
  status fit_chunk_to_buffers(deadline until);
  std::string shared_settings() const;  // what every rank must set alike
  status check_shared_settings(const std::vector<std::string>& all) const;
  status measure_costs(deadline until);  // CCLITE_COST_MEASURE=1
  void apply_costs();

  template <class L, class = void>
  struct has_capacity : std::false_type {};
  template <class L>
  struct has_capacity<L, std::void_t<decltype(std::declval<const L&>().capacity())>> : std::true_type {};

  // Between slices of a set-up wait in the store for the other members: an
  // abort, a failed communicator sharing our links, a member lost (asked of
  // the links this rank already holds to members: link::probe_peer()), or
  // the job's first failure recorded in the store by the ranks that saw it.
  // The ring's token (agree_before_connecting) saw every rank alive before
  // the set-up began; this sees one lost during it, and a member woken so
  // closes its links, which wakes the next (errors spread along the ring).
  status watch_members();
  template <class L, class = void>
  struct can_probe : std::false_type {};
  template <class L>
  struct can_probe<L, std::void_t<decltype(std::declval<L&>().probe_peer())>> : std::true_type {};

  status connect_peer(int p, deadline until);  // unless the family already has a link to it

CCLITE_SETUP_CODE_END

  // Runs `fn(prims)` with primitives over the links to `from` (data comes in)
  // and `to` (data goes out).
  template <class F>
  status with_links(int from, int to, std::size_t elem, const reduction* red, deadline until, F&& fn) {
    link& p = link_at(from);
    link& n = link_at(to);
    if (p.index() == 0 || n.index() == 0)
      return make_error(errc::no_transport, "link to rank %d or %d is not connected", from, to);
    // One primitives type per transport set, not per link pair (any_link.hpp);
    // one adapter when from == to: primitives compare addresses to spot a single link.
    using L = any_link<link>;
    L pl(p), nl(n);
    primitives<L, L> raw(pl, from == to ? pl : nl, elem, red, until);
    // Call headers ride ahead of the data on every link (mismatch.hpp).
    checked_primitives<primitives<L, L>> prims(raw, &hdr_, rank_, from, to, chunk_bytes_);
    return fn(prims);
  }

  // Connects, in (min, max) pair order, whichever of `peers` is not yet
  // connected. Every rank of a collective asks for a set consistent with the
  // others' (all pairs, or all pairs with the root, or one pair), so the
  // blocking pairwise handshakes cannot deadlock.
  status ensure_links(const int* peers, int count, deadline until) {
    int order[64];
    std::vector<int> big;
    int* o = order;
    if (count > 64) {
      big.resize(static_cast<std::size_t>(count));
      o = big.data();
    }
    int m = 0;
    for (int i = 0; i < count; ++i)
      if (peers[i] != rank_ && link_at(peers[i]).index() == 0) o[m++] = peers[i];
    // Ascending peer order is (min, max) pair order seen from this rank: pairs
    // (p, rank) with p < rank sort before every (rank, q). Root ranks, so that
    // a child's connects keep the family's global pair order.
    std::sort(o, o + m, [&](int x, int y) { return root(x) < root(y); });
    for (int i = 0; i < m; ++i) CCLITE_TRY(connect_peer(o[i], until));
    return {};
  }

  static status local_copy(const std::uint8_t* from, std::uint8_t* to, std::size_t bytes) {
    if (bytes && from != to) std::memcpy(to, from, bytes);
    return {};
  }

  // One framed point-to-point transfer with a peer: the building block of the
  // tree and halving-doubling schedules (each call pads and flushes, so both
  // sides must split their transfers alike).
  status exchange_with(int peer, const std::uint8_t* out, std::size_t ob, std::uint8_t* in, std::size_t ib,
                       std::size_t elem, deadline until) {
    return with_links(peer, peer, elem, nullptr, until, [&](auto& pr) -> status {
      pr.will_finish();  // the end pad leaves with the data (primitives.hpp)
      CCLITE_TRY(pr.sendrecv(out, ob, in, ib));
      return pr.finish();
    });
  }

CCLITE_SETUP_CODE_BEGIN
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  }

CCLITE_SETUP_CODE_END

  std::shared_ptr<pool_t> pool_;  // first: aborted_ refers into it
  std::atomic<bool>& aborted_;    // the family's abort flag (link_pool.hpp)
  store& user_kv_;
  std::unique_ptr<prefix_store> kv_;
  std::string prefix_, tag_;  // full store prefix of this communicator; unique tag (shm names)
  std::uint32_t comm_id_ = 0;  // in every call header (mismatch.hpp)
  int rank_, size_;
  logger log_;
  std::vector<peer_info> peers_;
  topology topo_;
  std::vector<int> root_of_;  // rank here -> rank of the root communicator (pool index)
  // Each call's deadline (negative: none); communicator::set_timeout() may
  // change it from another thread while calls run, hence an atomic.
  std::atomic<std::int64_t> timeout_ms_{0};
  std::size_t chunk_bytes_ = 512 << 10;
  // Reused between calls so that steady-state collectives do not allocate.
  std::vector<std::size_t> scratch_len_, scratch_off_;
  std::vector<int> scratch_peers_;
  std::vector<std::uint8_t> scratch_;
  algorithm_selector select_;
  // Mismatch check (mismatch.hpp), on unless CCLITE_CHECK_MISMATCH=0.
  bool check_mismatch_ = true;
  header_state hdr_;
  std::vector<std::uint64_t> hdr_sent_, hdr_seen_;
  std::uint64_t coll_seq_ = 0;
};

}  // namespace detail
}  // namespace cclite

// The set-up members' definitions, in the order they had inside the class:
// that order decides the layout of the emitted code, which stays as it was.
#include <cclite/collective/comm_core_setup.hpp>
