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
#include <cclite/algorithm/recursive_doubling.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/collective/select.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/topology/topology.hpp>
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
    auto all = store_allgather(*kv_, "bufmin", rank_, size_, std::to_string(mine), until);
    if (!all) return all.error();
    std::size_t least = SIZE_MAX;
    for (const auto& v : all.value()) least = std::min<std::size_t>(least, std::strtoull(v.c_str(), nullptr, 10));
    if (least != SIZE_MAX && chunk_bytes_ > least / 4) {
      const std::size_t fitted = std::max<std::size_t>(4096, align_down(least / 4, 4096));
      CCLITE_INFO(log_, "chunk %zu bytes lowered to %zu: the smallest ring link buffer is %zu bytes",
                  chunk_bytes_, fitted, least);
      chunk_bytes_ = fitted;
    }
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
  // and `to` (data goes out). One std::visit per step: the byte loops inside
  // are compiled for the concrete link types.
  template <class F>
  status with_links(int from, int to, std::size_t elem, const reduction* red, deadline until, F&& fn) {
    return std::visit(
        [&](auto& p, auto& n) -> status {
          using P = std::decay_t<decltype(p)>;
          using N = std::decay_t<decltype(n)>;
          if constexpr (std::is_same_v<P, std::monostate> || std::is_same_v<N, std::monostate>) {
            return make_error(errc::no_transport, "link to rank %d or %d is not connected", from, to);
          } else {
            primitives<P, N> prims(p, n, elem, red, until);
            return fn(prims);
          }
        },
        links_[static_cast<std::size_t>(from)], links_[static_cast<std::size_t>(to)]);
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
};

}  // namespace detail
}  // namespace cclite
