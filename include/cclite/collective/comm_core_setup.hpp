// cclite/collective/comm_core_setup.hpp - how a communicator's core is set
// up: join a generation of the store, exchange peer_info, build the topology,
// choose a transport per peer, connect the ring, fit the chunk to the link
// buffers and, on request, measure the links' costs.
//
// Definitions of comm_core<Transports...>'s set-up members, declared in
// comm_core.hpp, which includes this header at its end (including this one
// first works too). They are defined in the order they had inside the class:
// that order decides the layout of the emitted code. The per-call link
// handling (with_links, ensure_links, exchange_with) stays in comm_core.hpp.
//
// All of it is set-up code, compiled for size (config.hpp): the
// CCLITE_SETUP_CODE region around the declarations in comm_core.hpp makes it
// so, as it did when the bodies were in the class. The definitions here are
// deliberately outside any region: the lambdas in the bodies were compiled
// for speed in the class, and a region here would compile them for size too,
// which changes the code.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <cclite/bootstrap/store.hpp>
#include <cclite/collective/comm_core.hpp>
#include <cclite/collective/cost_measure.hpp>
#include <cclite/collective/link_pool.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/topology/peer_info.hpp>
#include <cclite/topology/topology.hpp>

namespace cclite {
namespace detail {

// ---- set-up ------------------------------------------------------------------------

// What roots and children set up alike.
template <class... Transports>
inline status comm_core<Transports...>::init_common(comm_options& opts) {
  auto t = env::timeout_option(opts.timeout);
  if (!t) return t.error();
  opts.timeout = t.value();
  timeout_ms_.store(opts.timeout.count(), std::memory_order_relaxed);
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

template <class... Transports>
inline status comm_core<Transports...>::init(comm_options opts) {
  CCLITE_TRY(init_common(opts));
  const deadline until = deadline::after(timeout());

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
template <class... Transports>
inline status comm_core<Transports...>::init_child(comm_options opts, std::string prefix, std::string tag) {
  CCLITE_TRY(init_common(opts));
  const deadline until = deadline::after(timeout());
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

template <class... Transports>
inline status comm_core<Transports...>::choose_transports() {
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
template <class... Transports>
inline status comm_core<Transports...>::connect_ring(deadline until) {
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

// The settings that choose a call's algorithm or protocol, one "NAME=value"
// per line. Ranks that differ in one run different algorithms for the same
// call and wait for each other until the deadline (CCLITE_ALGO set on one
// node only), so set-up compares them. The chunk is the one configured
// (comm_options or CCLITE_CHUNKSIZE), before fit_chunk_to_buffers lowers it
// alike everywhere.
template <class... Transports>
inline std::string comm_core<Transports...>::shared_settings() const {
  std::string s = "CCLITE_CHUNKSIZE=" + std::to_string(chunk_bytes_);
  for (const char* name : {"ALGO", "RD_MAX", "COST_SHM", "COST_TCP", "COST_MEASURE", "CHECK_MISMATCH",
                           "SHM_SMALL_MAX", "SHM_DIRECT_BUFFSIZE"}) {
    const char* v = env::raw(name, false);
    s += "\nCCLITE_";
    s += name;
    s += v && *v ? "=" : " unset";  // empty is unset, as for every reader of these
    if (v) s += v;
  }
  return s;
}

// Every rank's shared_settings(), compared with rank 0's: all ranks fail
// alike, naming the first setting that differs.
template <class... Transports>
inline status comm_core<Transports...>::check_shared_settings(const std::vector<std::string>& all) const {
  for (int r = 1; r < size_; ++r) {
    const std::string& a = all[0];
    const std::string& b = all[static_cast<std::size_t>(r)];
    if (a == b) continue;
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    const auto line_of = [i](const std::string& t) {  // the line holding the first difference
      std::size_t begin = i == 0 ? std::string::npos : t.rfind('\n', i - 1);
      begin = begin == std::string::npos ? 0 : begin + 1;
      return t.substr(begin, t.find('\n', begin) - begin);
    };
    return make_error(errc::invalid_argument,
                      "%s has %s, %s has %s: the settings that choose algorithms must be the same on every "
                      "rank (CCLITE_ALGO, CCLITE_RD_MAX, CCLITE_CHUNKSIZE or comm_options::chunk_bytes, "
                      "CCLITE_COST_*, CCLITE_CHECK_MISMATCH, CCLITE_SHM_SMALL_MAX, CCLITE_SHM_DIRECT_BUFFSIZE), "
                      "or ranks run different algorithms for one call and wait for each other until the "
                      "deadline; give every rank the same environment (mpirun -x, srun --export)",
                      peers_[0].describe().c_str(), line_of(a).c_str(), peers_[static_cast<std::size_t>(r)].describe().c_str(),
                      line_of(b).c_str());
  }
  return {};
}

// A ring round must fit in every link's buffer, or ranks that all send
// before they receive deadlock. Links differ per rank (shm inside a node,
// tcp across), and all ranks must use the same rounds, so the chunk is a
// quarter of the smallest ring link buffer anywhere.
template <class... Transports>
inline status comm_core<Transports...>::fit_chunk_to_buffers(deadline until) {
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
  // And on the settings that choose algorithms: "buffer,kind,settings".
  // Every member waits here for every other: watched (watch_members), so
  // that a member lost since the set-up began ends the wait, not the deadline.
  store_wait_watch members;
  members.check = [](void* self) { return static_cast<comm_core*>(self)->watch_members(); };
  members.arg = this;
  auto all = store_allgather(*kv_, "bufmin", rank_, size_,
                             std::to_string(mine) + "," + kind + "," + shared_settings(), until, members);
  if (!all) return all.error();
  std::size_t least = SIZE_MAX;
  std::string slowest = "shm";
  std::vector<std::string> settings;
  for (const auto& v : all.value()) {
    least = std::min<std::size_t>(least, std::strtoull(v.c_str(), nullptr, 10));
    const auto comma = v.find(',');
    const auto comma2 = comma == std::string::npos ? comma : v.find(',', comma + 1);
    if (comma2 == std::string::npos) return make_error(errc::protocol_error, "set-up record '%s' is not this version's", v.c_str());
    if (v.compare(comma + 1, comma2 - comma - 1, "shm") != 0) slowest = v.substr(comma + 1, comma2 - comma - 1);
    settings.push_back(v.substr(comma2 + 1));
  }
  CCLITE_TRY(check_shared_settings(settings));
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

template <class... Transports>
inline status comm_core<Transports...>::watch_members() {
  if (aborted_.load()) return make_error(errc::aborted, "communicator aborted during its set-up");
  if (pool_->failed.load()) return pool_->first_fault();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    status st;
    std::visit([&](auto& l) {
      if constexpr (can_probe<std::decay_t<decltype(l)>>::value) st = l.probe_peer();
    }, link_at(r));
    if (!st.ok()) return st;
  }
  // A link that cannot tell (verbs: RDMA sees a lost peer only when a write
  // to it fails), or a member lost where only others saw it: their record.
  return pool_->ctx.recorded_failure();
}

// CCLITE_COST_MEASURE=1: times every ring link, agrees on the slowest figure
// per link kind through the store, and charges it (cost_measure.hpp). The
// agreed figures stay in the pool for the children.
template <class... Transports>
inline status comm_core<Transports...>::measure_costs(deadline until) {
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

template <class... Transports>
inline void comm_core<Transports...>::apply_costs() {
  if (pool_->measured_costs.empty()) return;
  apply_measured(select_.costs(), pool_->measured_costs);
  select_.set_job(select_.link_kind(), chunk_bytes_);
  for (const char* k : {"shm", "tcp"})
    CCLITE_INFO(log_, "cost model: %s alpha %.2f us, %.2f GB/s (%s)", k, select_.costs().of(k).alpha_us,
                1e-3 / select_.costs().of(k).beta_us_per_byte, select_.costs().source(k));
  CCLITE_INFO(log_, "cost model: links now charged as %s (alpha %.2f us, %.2f GB/s)", select_.link_kind().c_str(),
              select_.costs().link().alpha_us, 1e-3 / select_.costs().link().beta_us_per_byte);
}

// Connects rank p unless the family already has a link to it.
template <class... Transports>
inline status comm_core<Transports...>::connect_peer(int p, deadline until) {
  if (link_at(p).index() != 0) return {};
  status st = pool_->set->connect(pool_->choice[root(p)], static_cast<int>(root(p)), until, link_at(p));
  if (!st.ok()) {
    // Named by its rank in the family's root, as the transport's own text
    // names it: a child's numbering here would call one process by two ranks.
    return status(st.code(), "connecting to " + pool_->peers[root(p)].describe() + " via " +
                                 transport_of(p) + ": " + st.message());
  }
  return {};
}

}  // namespace detail
}  // namespace cclite
