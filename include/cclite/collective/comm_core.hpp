// cclite/collective/comm_core.hpp - what a communicator is made of: its ranks,
// topology, transports and links, and the set-up that builds them.
//
// Private base of communicator<...> (collective/communicator.hpp, the public
// API), through comm_checks (collective/comm_checks.hpp: the cross-rank
// checks and failure spreading) and comm_algorithms (the algorithm runners). Set-up: join a generation of the store, exchange peer_info, build the
// topology, choose a transport per peer, connect the ring neighbours. Other
// links are connected on first use, always in (min, max) pair order so that
// the blocking pairwise handshakes cannot deadlock.
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
  /// CCLITE_TIMEOUT, 30 minutes. Negative = no deadline.
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
  link& link_at(int r) { return pool_->links[root(r)]; }

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  // ---- set-up ------------------------------------------------------------------------

  // What roots and children set up alike.
  status init_common(comm_options& opts) {
    if (opts.timeout.count() == -2) {
      auto t = env::timeout();
      if (!t) return t.error();
      opts.timeout = t.value();
    }
    timeout_ = opts.timeout;
    auto chunk = env::get_int("CHUNKSIZE", 512 << 10, false);
    if (!chunk) return chunk.error();
    chunk_bytes_ = opts.chunk_bytes ? opts.chunk_bytes : static_cast<std::size_t>(chunk.value());
    if (chunk_bytes_ < 4096) chunk_bytes_ = 4096;
    auto check = env::get_bool("CHECK_MISMATCH", true, false);
    if (!check) return check.error();
    check_mismatch_ = check.value();
    hdr_sent_.assign(static_cast<std::size_t>(size_), 0);
    hdr_seen_.assign(static_cast<std::size_t>(size_), 0);
    hdr_.sent = hdr_sent_.data();
    hdr_.seen = hdr_seen_.data();
    CCLITE_TRY(select_.init(log_));
    scratch_.resize(32 << 10);  // recursive doubling's receive buffer; grows only if forced larger
    return {};
  }

  status init(comm_options opts) {
    CCLITE_TRY(init_common(opts));
    const deadline until = deadline::after(timeout_);

    // A generation number per communicator built on this store: ranks of the
    // g-th communicator draw counter values in (g*size, (g+1)*size], because
    // nobody can start the next join before this one's allgather completed.
    auto joined = user_kv_.add(opts.store_prefix + "/join", 1);
    if (!joined) return joined.error();
    const std::int64_t gen = (joined.value() - 1) / size_;
    prefix_ = opts.store_prefix + "/" + std::to_string(gen) + "/";
    kv_ = std::make_unique<prefix_store>(user_kv_, prefix_);
    pool_->kv = std::make_unique<prefix_store>(user_kv_, prefix_);
    comm_id_ = comm_id_of(prefix_);
    root_of_.resize(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) root_of_[static_cast<std::size_t>(r)] = r;

    peer_info self = local_peer_info(rank_);
    auto names = transports::enabled_names();
    if (!names) return names.error();
    self.transports = names.value();
    if (rank_ == 0) {
      char tag[64];
      std::snprintf(tag, sizeof tag, "%x-%" PRId64 "-%x", static_cast<unsigned>(self.pid), gen,
                    static_cast<unsigned>(clock::now().time_since_epoch().count() & 0xfffff));
      CCLITE_TRY(kv_->set("tag", tag));
    }
    auto all = store_allgather(*kv_, "peer", rank_, size_, self.serialize(), until);
    if (!all) return all.error();
    for (int r = 0; r < size_; ++r) {
      auto p = peer_info::parse(all.value()[static_cast<std::size_t>(r)]);
      if (!p) return p.error();
      peers_.push_back(std::move(p.value()));
    }
    auto t = topology::build(peers_);
    if (!t) return t.error();
    topo_ = std::move(t.value());
    auto tag = kv_->get("tag", until);
    if (!tag) return tag.error();

    tag_ = tag.value();
    pool_->peers = peers_;
    transport_context& ctx = pool_->ctx;
    ctx.rank = rank_;
    ctx.size = size_;
    ctx.peers = &pool_->peers;
    ctx.kv = pool_->kv.get();
    ctx.log = &pool_->log;
    ctx.aborted = &pool_->aborted;
    ctx.job_tag = tag_;
    pool_->set = std::make_unique<transports>(ctx);
    CCLITE_TRY(pool_->set->publish(peers_[static_cast<std::size_t>(rank_)]));

    CCLITE_INFO(log_, "init: rank %d of %d, local rank %d of %d, %s", rank_, size_, topo_.local_rank(rank_),
                topo_.local_size(rank_), topo_.describe(peers_).c_str());
    CCLITE_TRY(choose_transports());
    pool_->links = std::vector<link>(static_cast<std::size_t>(size_));  // built in place, never moved
    if (size_ > 1) {
      CCLITE_TRY(connect_ring(until));
      CCLITE_TRY(fit_chunk_to_buffers(until));
      CCLITE_TRY(measure_costs(until));
    }
    return {};
  }

  // A child over the family's pool: its peers are the root's, renumbered; no
  // transport of its own, links come from the pool (link_pool.hpp).
  status init_child(comm_options opts, std::string prefix, std::string tag) {
    CCLITE_TRY(init_common(opts));
    const deadline until = deadline::after(timeout_);
    prefix_ = std::move(prefix);
    tag_ = std::move(tag);
    kv_ = std::make_unique<prefix_store>(user_kv_, prefix_);
    comm_id_ = comm_id_of(prefix_);
    for (int r = 0; r < size_; ++r) {
      peers_.push_back(pool_->peers[root(r)]);
      peers_.back().rank = r;
    }
    auto t = topology::build(peers_);
    if (!t) return t.error();
    topo_ = std::move(t.value());
    // What the transports published for this rank at the root's creation,
    // under this rank's number here: shm-direct reads the pid namespace.
    const std::string ns_key = "shm/pidns/" + std::to_string(root(rank_));
    auto has_ns = pool_->kv->check(ns_key);
    if (has_ns && has_ns.value()) {
      auto ns = pool_->kv->get(ns_key, until);
      if (!ns) return ns.error();
      CCLITE_TRY(kv_->set("shm/pidns/" + std::to_string(rank_), ns.value()));
    }
    CCLITE_INFO(log_, "init: rank %d of %d (rank %d of the communicator it was split from), sharing its links, %s",
                rank_, size_, root_of_[static_cast<std::size_t>(rank_)], topo_.describe(peers_).c_str());
    if (size_ > 1) {
      CCLITE_TRY(connect_ring(until));
      CCLITE_TRY(fit_chunk_to_buffers(until));
      apply_costs();
    }
    return {};
  }

  status choose_transports() {
    std::vector<int>& choice_ = pool_->choice;
    choice_.assign(static_cast<std::size_t>(size_), -1);
    const peer_info& me = peers_[static_cast<std::size_t>(rank_)];
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const peer_info& p = peers_[static_cast<std::size_t>(r)];
      int c = pool_->set->choose(me, p);
      if (c < 0) {
        return make_error(errc::no_transport,
                          "no transport can reach %s from %s: this rank enabled [%s], the peer "
                          "enabled [%s]; compile a common transport into communicator<...> or "
                          "unset CCLITE_*_DISABLE",
                          p.describe().c_str(), me.describe().c_str(), join(me.transports).c_str(),
                          join(p.transports).c_str());
      }
      choice_[static_cast<std::size_t>(r)] = c;
      CCLITE_INFO(log_, "peer %s: via %s", p.describe().c_str(), transports::name(c));
    }
    return {};
  }

  // Ring neighbours are connected eagerly, in (min, max) pair order on every
  // rank: a global order of pairs, so blocking pairwise handshakes cannot deadlock.
  status connect_ring(deadline until) {
    // Pair order by root ranks: a child connects in the order its family does.
    int a = topo_.ring_prev(rank_), b = topo_.ring_next(rank_);
    const std::int64_t me = static_cast<std::int64_t>(root(rank_)), n = static_cast<std::int64_t>(pool_->links.size());
    auto key = [&](int p) {
      const std::int64_t q = static_cast<std::int64_t>(root(p));
      return std::min(me, q) * n + std::max(me, q);
    };
    if (key(b) < key(a)) std::swap(a, b);
    CCLITE_TRY(connect_peer(a, until));
    if (b != a) CCLITE_TRY(connect_peer(b, until));
    CCLITE_INFO(log_, "ring: %d -> %d -> %d (%s, %s)", topo_.ring_prev(rank_), rank_,
                topo_.ring_next(rank_), transport_of(topo_.ring_prev(rank_)),
                transport_of(topo_.ring_next(rank_)));
    return {};
  }

  // A ring round must fit in every link's buffer, or ranks that all send
  // before they receive deadlock. Links differ per rank (shm inside a node,
  // tcp across), and all ranks must use the same rounds, so the chunk is a
  // quarter of the smallest ring link buffer anywhere.
  status fit_chunk_to_buffers(deadline until) {
    std::size_t mine = SIZE_MAX;
    for (int p : {topo_.ring_prev(rank_), topo_.ring_next(rank_)}) {
      std::visit([&](const auto& l) {
        if constexpr (has_capacity<std::decay_t<decltype(l)>>::value) mine = std::min(mine, l.capacity());
      }, link_at(p));
    }
    // The same exchange agrees on the job's slowest link kind, which the cost
    // model charges (every rank must choose the same algorithms): shm only if
    // every pair of the job uses shm.
    std::string kind = "shm";
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && std::strcmp(transport_of(r), "shm") != 0) kind = transport_of(r);
    auto all = store_allgather(*kv_, "bufmin", rank_, size_, std::to_string(mine) + "," + kind, until);
    if (!all) return all.error();
    std::size_t least = SIZE_MAX;
    std::string slowest = "shm";
    for (const auto& v : all.value()) {
      least = std::min<std::size_t>(least, std::strtoull(v.c_str(), nullptr, 10));
      const auto comma = v.find(',');
      if (comma != std::string::npos && v.compare(comma + 1, std::string::npos, "shm") != 0) slowest = v.substr(comma + 1);
    }
    if (least != SIZE_MAX && chunk_bytes_ > least / 4) {
      const std::size_t fitted = std::max<std::size_t>(4096, align_down(least / 4, 4096));
      CCLITE_INFO(log_, "chunk %zu bytes lowered to %zu: the smallest ring link buffer is %zu bytes",
                  chunk_bytes_, fitted, least);
      chunk_bytes_ = fitted;
    }
    select_.set_job(slowest, chunk_bytes_);
    int local = topo_.local_size(0);
    for (int r = 0; r < size_; ++r)
      if (topo_.local_size(r) != local) local = 0;  // uneven nodes: no hierarchical shards
    select_.set_nodes(topo_.node_count(), local);
    CCLITE_INFO(log_, "cost model: links charged as %s (alpha %.1f us, %.2f GB/s)", slowest.c_str(),
                select_.costs().link().alpha_us, 1e-3 / select_.costs().link().beta_us_per_byte);
    // Scratch for rd (its automatic range), tree pieces, and a medium rhd
    // message, so automatic choices do not allocate after init.
    scratch_.resize(std::max<std::size_t>(scratch_.size(), 2 * chunk_bytes_));
    return {};
  }
  // CCLITE_COST_MEASURE=1: times every ring link, agrees on the slowest figure
  // per link kind through the store, and charges it (cost_measure.hpp). The
  // agreed figures stay in the pool for the children.
  status measure_costs(deadline until) {
    auto on = env::get_bool("COST_MEASURE", false, false);
    if (!on) return on.error();
    if (!on.value()) return {};
    const int n = size_, pos = topo_.ring_position(rank_);
    std::vector<std::uint8_t> buf(cost_probe::large_bytes);
    std::string mine;
    for (int phase = 0; phase < 3; ++phase) {
      bool initiator = false;
      const int at = probe_partner(pos, n, phase, initiator);
      if (at < 0) continue;
      const int peer = topo_.ring()[static_cast<std::size_t>(at)];
      link_cost c;
      CCLITE_TRY(ping_pong([&](const std::uint8_t* o, std::size_t ob, std::uint8_t* i, std::size_t ib) {
        return exchange_with(peer, o, ob, i, ib, 1, until);
      }, initiator, buf.data(), c));
      if (initiator) append_measured(mine, transport_of(peer), c);
    }
    auto all = store_allgather(*kv_, "costm", rank_, size_, mine.empty() ? "-" : mine, until);
    if (!all) return all.error();
    pool_->measured_costs = agree_measured(all.value());
    apply_costs();
    return {};
  }
  void apply_costs() {
    if (pool_->measured_costs.empty()) return;
    apply_measured(select_.costs(), pool_->measured_costs);
    select_.set_job(select_.link_kind(), chunk_bytes_);
    for (const char* k : {"shm", "tcp"})
      CCLITE_INFO(log_, "cost model: %s alpha %.2f us, %.2f GB/s (%s)", k, select_.costs().of(k).alpha_us,
                  1e-3 / select_.costs().of(k).beta_us_per_byte, select_.costs().source(k));
    CCLITE_INFO(log_, "cost model: links now charged as %s (alpha %.2f us, %.2f GB/s)", select_.link_kind().c_str(),
                select_.costs().link().alpha_us, 1e-3 / select_.costs().link().beta_us_per_byte);
  }

  template <class L, class = void>
  struct has_capacity : std::false_type {};
  template <class L>
  struct has_capacity<L, std::void_t<decltype(std::declval<const L&>().capacity())>> : std::true_type {};

  // Connects rank p unless the family already has a link to it.
  status connect_peer(int p, deadline until) {
    if (link_at(p).index() != 0) return {};
    status st = pool_->set->connect(pool_->choice[root(p)], static_cast<int>(root(p)), until, link_at(p));
    if (!st.ok()) {
      return status(st.code(), "connecting to " + peers_[static_cast<std::size_t>(p)].describe() + " via " +
                                   transport_of(p) + ": " + st.message());
    }
    return {};
  }

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
  milliseconds timeout_{0};
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
