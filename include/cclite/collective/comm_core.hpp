// cclite/collective/comm_core.hpp - what a communicator is made of: its ranks,
// topology, transports and links, and the set-up that builds them.
//
// Private base of communicator<...> (collective/communicator.hpp, the public
// API). Set-up: join a generation of the store, exchange peer_info, build the
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
#include <cclite/algorithm/ring_gather.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/algorithm/halving_doubling.hpp>
#include <cclite/algorithm/recursive_doubling.hpp>
#include <cclite/algorithm/tree.hpp>
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

  comm_core(store& kv, int rank, int size) : user_kv_(kv), rank_(rank), size_(size), log_(rank) {}

  const char* transport_of(int peer) const {
    return peer == rank_ ? "self" : transports::name(choice_[static_cast<std::size_t>(peer)]);
  }

  // ---- set-up ------------------------------------------------------------------------

  status init(comm_options opts) {
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
    const deadline until = deadline::after(timeout_);

    // A generation number per communicator built on this store: ranks of the
    // g-th communicator draw counter values in (g*size, (g+1)*size], because
    // nobody can start the next join before this one's allgather completed.
    auto joined = user_kv_.add(opts.store_prefix + "/join", 1);
    if (!joined) return joined.error();
    const std::int64_t gen = (joined.value() - 1) / size_;
    kv_ = std::make_unique<prefix_store>(user_kv_, opts.store_prefix + "/" + std::to_string(gen) + "/");

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

    ctx_.rank = rank_;
    ctx_.size = size_;
    ctx_.peers = &peers_;
    ctx_.kv = kv_.get();
    ctx_.log = &log_;
    ctx_.aborted = &aborted_;
    ctx_.job_tag = tag.value();
    transports_ = std::make_unique<transports>(ctx_);
    CCLITE_TRY(transports_->publish(peers_[static_cast<std::size_t>(rank_)]));

    CCLITE_INFO(log_, "init: rank %d of %d, local rank %d of %d, %s", rank_, size_, topo_.local_rank(rank_),
                topo_.local_size(rank_), topo_.describe(peers_).c_str());
    CCLITE_TRY(choose_transports());
    links_.resize(static_cast<std::size_t>(size_));
    if (size_ > 1) {
      CCLITE_TRY(connect_ring(until));
      CCLITE_TRY(fit_chunk_to_buffers(until));
    }
    return {};
  }

  status choose_transports() {
    choice_.assign(static_cast<std::size_t>(size_), -1);
    const peer_info& me = peers_[static_cast<std::size_t>(rank_)];
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const peer_info& p = peers_[static_cast<std::size_t>(r)];
      int c = transports_->choose(me, p);
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
    int a = topo_.ring_prev(rank_), b = topo_.ring_next(rank_);
    auto key = [&](int p) { return std::min(rank_, p) * size_ + std::max(rank_, p); };
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
      }, links_[static_cast<std::size_t>(p)]);
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
  template <class L, class = void>
  struct has_capacity : std::false_type {};
  template <class L>
  struct has_capacity<L, std::void_t<decltype(std::declval<const L&>().capacity())>> : std::true_type {};

  status connect_peer(int p, deadline until) {
    auto l = transports_->connect(choice_[static_cast<std::size_t>(p)], p, until);
    if (!l) {
      return status(l.error().code(), "connecting to " + peers_[static_cast<std::size_t>(p)].describe() + " via " +
                                           transport_of(p) + ": " + l.error().message());
    }
    links_[static_cast<std::size_t>(p)] = std::move(l.value());
    return {};
  }

  // Runs `fn(prims)` with primitives over the links to `from` (data comes in)
  // and `to` (data goes out).
  template <class F>
  status with_links(int from, int to, std::size_t elem, const reduction* red, deadline until, F&& fn) {
    link& p = links_[static_cast<std::size_t>(from)];
    link& n = links_[static_cast<std::size_t>(to)];
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
      if (peers[i] != rank_ && links_[static_cast<std::size_t>(peers[i])].index() == 0) o[m++] = peers[i];
    // Ascending peer order is (min, max) pair order seen from this rank: pairs
    // (p, rank) with p < rank sort before every (rank, q).
    std::sort(o, o + m);
    for (int i = 0; i < m; ++i) CCLITE_TRY(connect_peer(o[i], until));
    return {};
  }

  static status local_copy(const std::uint8_t* from, std::uint8_t* to, std::size_t bytes) {
    if (bytes && from != to) std::memcpy(to, from, bytes);
    return {};
  }

  // Allgather and allgatherv: own block into place, then the ring moves the rest.
  status run_allgather(const op_desc& d, const std::uint8_t* send, std::uint8_t* recv, std::size_t elem,
                       deadline until) {
    const int n = size_;
    std::vector<std::size_t>& len = scratch_len_;
    std::vector<std::size_t>& off = scratch_off_;
    len.resize(static_cast<std::size_t>(n));  // no allocation after the first call
    off.resize(static_cast<std::size_t>(n));
    std::size_t max_len = 0;
    for (int r = 0; r < n; ++r) {
      const std::size_t i = static_cast<std::size_t>(r);
      len[i] = d.counts ? d.counts[i] : d.count;
      off[i] = d.displs ? d.displs[i] : i * d.count;
      max_len = std::max(max_len, len[i]);
    }
    const std::size_t me = static_cast<std::size_t>(rank_);
    if (d.counts && d.count != len[me]) {
      return make_error(errc::invalid_argument, "allgatherv: send count %zu differs from counts[%d] = %zu",
                        d.count, rank_, len[me]);
    }
    CCLITE_TRY(local_copy(send, recv + off[me] * elem, len[me] * elem));
    if (n == 1) return {};
    const ring_blocks b{topo_.ring().data(), len.data(), off.data(), max_len};
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes_ / elem);
    return with_links(topo_.ring_prev(rank_), topo_.ring_next(rank_), elem, nullptr, until, [&](auto& pr) {
      return ring_allgather(pr, recv, elem, n, topo_.ring_position(rank_), b, chunk);
    });
  }

  // Recursive doubling on `recv` (send copied in first), exchanging with each
  // partner over a direct link.
  status run_rd_allreduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                          const reduction& red, deadline until) {
    const std::size_t bytes = count * red.elem_size;
    CCLITE_TRY(local_copy(send, recv, bytes));
    if (scratch_.size() < bytes) scratch_.resize(bytes);  // only when rd is forced on large data
    int peers[64];
    const int m = recursive_doubling_peers(rank_, size_, peers);
    CCLITE_TRY(ensure_links(peers, m, until));
    auto exchange = [&](int peer, const std::uint8_t* out, std::size_t ob, std::uint8_t* in, std::size_t ib) {
      return with_links(peer, peer, red.elem_size, nullptr, until, [&](auto& pr) -> status {
        CCLITE_TRY(pr.sendrecv(out, ob, in, ib));
        return pr.finish();
      });
    };
    return recursive_doubling_allreduce(recv, scratch_.data(), count, red, rank_, size_, exchange);
  }

  // One framed point-to-point transfer with a peer: the building block of the
  // tree and halving-doubling schedules (each call pads and flushes, so both
  // sides must split their transfers alike).
  status exchange_with(int peer, const std::uint8_t* out, std::size_t ob, std::uint8_t* in, std::size_t ib,
                       std::size_t elem, deadline until) {
    return with_links(peer, peer, elem, nullptr, until, [&](auto& pr) -> status {
      CCLITE_TRY(pr.sendrecv(out, ob, in, ib));
      return pr.finish();
    });
  }

  // Rabenseifner's reduce-scatter + allgather on `recv` (send copied in first).
  status run_hd_allreduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                          const reduction& red, deadline until) {
    CCLITE_TRY(local_copy(send, recv, count * red.elem_size));
    const std::size_t need = halving_doubling_scratch(count, size_) * red.elem_size;
    if (scratch_.size() < need) scratch_.resize(need);  // sized at init for the automatic range
    int peers[64];
    const int m = halving_doubling_peers(rank_, size_, peers);
    CCLITE_TRY(ensure_links(peers, m, until));
    auto exchange = [&](int peer, const std::uint8_t* out, std::size_t ob, std::uint8_t* in, std::size_t ib) {
      return exchange_with(peer, out, ob, in, ib, red.elem_size, until);
    };
    return halving_doubling_allreduce(recv, scratch_.data(), count, red, rank_, size_, exchange);
  }

  // The tree algorithms work on ring positions (node by node), so most tree
  // edges stay inside a node; `root_pos` rotates a rooted tree onto the root.
  template <class F>
  status with_tree_peers(int root_pos, std::size_t elem, deadline until, bool both_trees, F&& fn) {
    const int n = size_;
    const int me = (topo_.ring_position(rank_) - root_pos + n) % n;
    auto rank_at = [&](int tpos) { return topo_.ring()[static_cast<std::size_t>((tpos + root_pos) % n)]; };
    int tp[6], peers[6];
    int m = 0;
    if (both_trees) {
      m = double_tree_peers(me, n, tp);
    } else {
      tree_node t = bit_tree(me, n);
      for (int p : {t.parent, t.child[0], t.child[1]})
        if (p >= 0) tp[m++] = p;
    }
    for (int i = 0; i < m; ++i) peers[i] = rank_at(tp[i]);
    CCLITE_TRY(ensure_links(peers, m, until));
    auto send = [&](int tpos, const std::uint8_t* src, std::size_t b) {
      return exchange_with(rank_at(tpos), src, b, nullptr, 0, elem, until);
    };
    auto recv = [&](int tpos, std::uint8_t* dst, std::size_t b) {
      return exchange_with(rank_at(tpos), nullptr, 0, dst, b, elem, until);
    };
    return fn(me, send, recv);
  }

  // Tree pieces stay well inside a link buffer (see fit_chunk_to_buffers).
  std::size_t tree_chunk_elems(std::size_t elem) const { return std::max<std::size_t>(1, chunk_bytes_ / elem); }

  status run_tree_allreduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                            const reduction& red, deadline until) {
    CCLITE_TRY(local_copy(send, recv, count * red.elem_size));
    const std::size_t chunk = tree_chunk_elems(red.elem_size);
    if (scratch_.size() < chunk * red.elem_size) scratch_.resize(chunk * red.elem_size);
    return with_tree_peers(0, red.elem_size, until, true, [&](int me, auto& snd, auto& rcv) {
      return double_tree_allreduce(recv, scratch_.data(), count, red, me, size_, chunk, snd, rcv);
    });
  }

  status run_tree_broadcast(std::uint8_t* data, std::size_t bytes, int root, std::size_t elem, deadline until) {
    const std::size_t chunk = tree_chunk_elems(elem) * elem;
    return with_tree_peers(topo_.ring_position(root), elem, until, false, [&](int me, auto& snd, auto& rcv) {
      return tree_broadcast(data, bytes, me, size_, chunk, snd, rcv);
    });
  }

  status run_tree_reduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count, int root,
                         const reduction& red, deadline until) {
    const std::size_t chunk = tree_chunk_elems(red.elem_size);
    if (scratch_.size() < 2 * chunk * red.elem_size) scratch_.resize(2 * chunk * red.elem_size);
    return with_tree_peers(topo_.ring_position(root), red.elem_size, until, false, [&](int me, auto& snd, auto& rcv) {
      return tree_reduce(send, recv, scratch_.data(), count, red, me, size_, chunk, snd, rcv);
    });
  }

  // Gather / scatter straight between the root and each rank, in rank order.
  status run_rooted_direct(const op_desc& d, const std::uint8_t* send, std::uint8_t* recv, std::size_t bytes,
                           std::size_t elem, deadline until) {
    const bool gather = d.kind == collective_kind::gather;
    const std::size_t me = static_cast<std::size_t>(rank_);
    if (bytes && (gather ? !send : !recv)) return make_error(errc::invalid_argument, "%s: null buffer", to_string(d.kind));
    if (bytes && rank_ == d.root && (gather ? !recv : !send))
      return make_error(errc::invalid_argument, "%s: null buffer on the root", to_string(d.kind));
    if (rank_ != d.root) {
      CCLITE_TRY(ensure_links(&d.root, 1, until));
      return with_links(d.root, d.root, elem, nullptr, until, [&](auto& pr) -> status {
        CCLITE_TRY(gather ? pr.send(send, bytes) : pr.recv(recv, bytes));
        return pr.finish();
      });
    }
    if (gather) CCLITE_TRY(local_copy(send, recv + me * bytes, bytes));
    else CCLITE_TRY(local_copy(send + me * bytes, recv, bytes));
    std::vector<int>& all = scratch_peers_;
    all.resize(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) all[static_cast<std::size_t>(r)] = r;
    CCLITE_TRY(ensure_links(all.data(), size_, until));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::size_t at = static_cast<std::size_t>(r) * bytes;
      CCLITE_TRY(with_links(r, r, elem, nullptr, until, [&](auto& pr) -> status {
        CCLITE_TRY(gather ? pr.recv(recv + at, bytes) : pr.send(send + at, bytes));
        return pr.finish();
      }));
    }
    return {};
  }

  // Pairwise exchange: in step k send to rank+k and receive from rank-k, both
  // at once; n-1 steps, each rank sends (n-1)/n of its buffer.
  status run_alltoall(const op_desc& d, const std::uint8_t* send, std::uint8_t* recv, std::size_t elem,
                      deadline until) {
    const int n = size_;
    auto scount = [&](int r) { return d.counts ? d.counts[r] : d.count; };
    auto sdispl = [&](int r) { return d.displs ? d.displs[r] : static_cast<std::size_t>(r) * d.count; };
    auto rcount = [&](int r) { return d.rcounts ? d.rcounts[r] : d.count; };
    auto rdispl = [&](int r) { return d.rdispls ? d.rdispls[r] : static_cast<std::size_t>(r) * d.count; };
    if (scount(rank_) != rcount(rank_)) {
      return make_error(errc::invalid_argument, "alltoallv: send_counts[%d] = %zu but recv_counts[%d] = %zu",
                        rank_, scount(rank_), rank_, rcount(rank_));
    }
    CCLITE_TRY(local_copy(send + sdispl(rank_) * elem, recv + rdispl(rank_) * elem, scount(rank_) * elem));
    if (n == 1) return {};
    std::vector<int>& all = scratch_peers_;
    all.resize(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
    CCLITE_TRY(ensure_links(all.data(), n, until));
    for (int k = 1; k < n; ++k) {
      const int to = (rank_ + k) % n, from = (rank_ - k + n) % n;
      CCLITE_TRY(with_links(from, to, elem, nullptr, until, [&](auto& pr) -> status {
        CCLITE_TRY(pr.sendrecv(send + sdispl(to) * elem, scount(to) * elem, recv + rdispl(from) * elem,
                               rcount(from) * elem));
        return pr.finish();
      }));
    }
    return {};
  }

  // ---- cross-rank checks and failure spreading -----------------------------------

  // Starts the header exchange of collective `h` (mismatch.hpp): our header
  // goes to the ring successor now, whatever the algorithm.
  status begin_checks(const call_header& h, deadline until) {
    hdr_.out = hdr_.expect = h;
    hdr_.active = true;
    hdr_.knows_culprit = false;
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    return with_links(prev, next, 1, nullptr, until, [&](auto& pr) { return pr.send_header(); });
  }

  // Ends it: the ring predecessor's header must have come (an algorithm that
  // never read from it, e.g. the root of a broadcast, checks it here), and
  // whatever we queued on the ring successor is flushed.
  status end_checks(deadline until) {
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    status st = with_links(prev, next, 1, nullptr, until, [&](auto& pr) -> status {
      CCLITE_TRY(pr.check_prev());
      return pr.finish();
    });
    hdr_.active = false;
    return st;
  }

  // Before a set-up that waits for every rank through the store (shm-direct's
  // first use): makes sure every rank is in this same call. Check the ring
  // predecessor's header, then pass a token around the ring n-1 times; a rank
  // that found a mismatch passes none and closes its links, so no rank waits
  // out its deadline for store keys of a rank that called something else.
  status agree_on_call(deadline until) {
    if (!hdr_.active || size_ < 2) return {};
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    return with_links(prev, next, 1, nullptr, until, [&](auto& pr) -> status {
      CCLITE_TRY(pr.check_prev());
      std::uint8_t token[max_dtype_size] = {};
      for (int lap = 0; lap < size_ - 1; ++lap) {
        CCLITE_TRY(pr.send(token, sizeof token));
        CCLITE_TRY(pr.recv(token, sizeof token));
      }
      return pr.finish();
    });
  }

  // After a timeout: if the ring predecessor's header has not arrived, that
  // rank never entered this collective, the most useful thing to report. If
  // it has arrived, check it (a mismatch explains the hang too). Never blocks.
  status explain_timeout(status st) {
    if (!hdr_.active || size_ < 2) return st;
    const int prev = topo_.ring_prev(rank_);
    if (hdr_seen_[static_cast<std::size_t>(prev)] == hdr_.expect.seq) return st;
    const std::string who = peers_[static_cast<std::size_t>(prev)].describe();
    const char* kind = to_string(static_cast<collective_kind>(hdr_.expect.kind));
    return std::visit([&](auto& l) -> status {
      if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) {
        return st;
      } else {
        (void)l.poll();
        const_bytes b = l.recv_peek();
        if (b.size >= call_header::wire_bytes) {
          const call_header theirs = call_header::decode(b.data);
          if (theirs != hdr_.expect) return mismatch_error(hdr_.expect, rank_, theirs, prev);
          return st;  // it is in this collective, stuck on something else
        }
        if (b.size != 0) return st;  // a header split by the ring's wrap: say nothing more
        hdr_.knows_culprit = true;
        return make_error(errc::timeout, "%s did not call %s #%llu (its call header never came; it is "
                          "still alive but busy elsewhere or waiting in another call): %s", who.c_str(), kind,
                          static_cast<unsigned long long>(hdr_.expect.seq), st.message().c_str());
      }
    }, links_[static_cast<std::size_t>(prev)]);
  }

  // A fatal error on this rank (`st`, already prefixed with `call`): makes
  // every rank report the job's first failure rather than its own echo of it.
  // The first rank to fail records its error in the store; later ones (ranks
  // whose link to a failed rank broke, after that rank recorded) report the
  // record. Then every link is closed, so ranks blocked on this one wake up at
  // once (peer_lost) and read the record too, instead of waiting for their
  // deadline. Store calls are bounded; if the store is gone, `st` stands.
  status spread_failure(status st, const std::string& call) {
    if (fault_spread_) return st;
    fault_spread_ = true;
    const bool weak = st.code() == errc::timeout && !hdr_.knows_culprit;
    std::string rec;
    // A plain timeout blames whatever this rank waited on, often a victim of
    // the real culprit: give a rank that knows better a moment to record it.
    auto found = kv_->get("fault", deadline::after(milliseconds(weak ? 2000 : 0)));
    if (found) {
      rec = found.value();
    } else {
      auto n = kv_->add("fault/n", 1);
      if (n && n.value() == 1) {
        errc c = st.code() == errc::aborted ? errc::peer_lost : st.code();
        std::string msg = st.code() == errc::aborted
                              ? peers_[static_cast<std::size_t>(rank_)].describe() + " aborted its communicator: " +
                                    st.message()
                              : st.message();
        (void)kv_->set("fault", std::to_string(static_cast<int>(c)) + "\n" + msg);
      } else if (n) {
        auto got = kv_->get("fault", deadline::after(milliseconds(5000)));
        if (got) rec = got.value();
      }
    }
    close_links();
    if (rec.empty()) return st;
    const auto nl = rec.find('\n');
    const int code = std::atoi(rec.c_str());
    if (nl == std::string::npos || code <= 0 || code > static_cast<int>(errc::resource_exhausted)) return st;
    if (st.code() == errc::aborted) return st;  // our own abort() stays "aborted" here
    return status(static_cast<errc>(code), call + ": the job's first failure: " + rec.substr(nl + 1));
  }

  void close_links() {
    for (auto& l : links_) l = link{};
  }

  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  }

  store& user_kv_;
  std::unique_ptr<prefix_store> kv_;
  int rank_, size_;
  logger log_;
  std::vector<peer_info> peers_;
  topology topo_;
  transport_context ctx_;
  std::unique_ptr<transports> transports_;
  std::vector<int> choice_;
  std::vector<link> links_;
  milliseconds timeout_{0};
  std::size_t chunk_bytes_ = 512 << 10;
  std::atomic<bool> aborted_{false};
  // Reused between calls so that steady-state collectives do not allocate.
  std::vector<std::size_t> scratch_len_, scratch_off_;
  std::vector<int> scratch_peers_;
  std::vector<std::uint8_t> scratch_;
  algorithm_selector select_;
  // Mismatch check (mismatch.hpp), on unless CCLITE_CHECK_MISMATCH=0.
  bool check_mismatch_ = true, fault_spread_ = false;
  header_state hdr_;
  std::vector<std::uint64_t> hdr_sent_, hdr_seen_;
  std::uint64_t coll_seq_ = 0;
};

}  // namespace detail
}  // namespace cclite
