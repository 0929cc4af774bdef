// cclite/collective/communicator.hpp - the public API: a group of ranks and their collectives.
//
//   auto comm = cclite::init().value();            // from cclite-run / torchrun / mpirun env
//   std::vector<float> g(n, 1.0f);
//   comm->allreduce(g.data(), g.size());           // in place, sum
//
// `communicator<Transports...>` compiles only the transports named; for each
// peer the first one both ranks enabled and that can reach the peer is used.
// All ranks must issue the same collectives in the same order with the same
// count, dtype, op and root (as in NCCL/MPI).
//
// Errors: every call returns a status. errc::invalid_argument (bad pointer,
// root, dtype) leaves the communicator usable; timeout / peer_lost / aborted /
// protocol_error make it unusable: later calls return the same error at once,
// and the application should destroy it and build a new one.
//
// Thread safety: calls may come from any thread; they run one at a time in
// issue order (see work_queue.hpp). abort() may be called from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cclite/algorithm/primitives.hpp>
#include <cclite/algorithm/ring_allreduce.hpp>
#include <cclite/algorithm/ring_broadcast.hpp>
#include <cclite/algorithm/ring_gather.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/collective/work_queue.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/reduce.hpp>
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

template <class... Transports>
class communicator final : private detail::op_executor {
 public:
  using transports = transport_set<Transports...>;
  using link = typename transports::link;

  /// Joins `size` ranks that share `kv`. Blocks until this rank is connected
  /// to the peers it needs (its ring neighbours), bounded by the timeout.
  /// `kv` must outlive the communicator.
  /// Errors: invalid_argument, bootstrap_error, no_transport, timeout, peer_lost.
  static result<std::unique_ptr<communicator>> create(store& kv, int rank, int size,
                                                      comm_options opts = {}) {
    if (size < 1 || rank < 0 || rank >= size) {
      return make_error(errc::invalid_argument, "communicator: rank %d / size %d is invalid", rank,
                        size);
    }
    std::unique_ptr<communicator> c(new communicator(kv, rank, size));
    CCLITE_TRY(c->init(std::move(opts)));
    return c;
  }

  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  /// Waits for queued collectives (each bounded by its deadline), then closes.
  ~communicator() { queue_.shutdown(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const { return topo_.local_rank(rank_); }
  int local_size() const { return topo_.local_size(rank_); }
  int node_count() const { return topo_.node_count(); }
  const topology& topo() const noexcept { return topo_; }
  const peer_info& peer(int r) const { return peers_[static_cast<std::size_t>(r)]; }
  /// Transport chosen for `peer` ("shm", "tcp", "self").
  const char* transport_of(int peer) const {
    return peer == rank_ ? "self" : transports::name(choice_[static_cast<std::size_t>(peer)]);
  }
  /// The logger carrying this rank's prefix (CCLITE_DEBUG).
  const logger& log() const noexcept { return log_; }

  // ---- collectives --------------------------------------------------------------
  //
  // Every collective has a blocking form returning `status` and an `_async`
  // form returning a `work` handle; both run in issue order. Counts are in
  // elements of `t`. Typed overloads take T* and deduce the dtype.

  /// recv[i] = send[i] (op) over all ranks. `send == recv` is the in-place form.
  status allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return run(rooted(collective_kind::allreduce, send, recv, count, t, op, 0));
  }
  work allreduce_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return submit(rooted(collective_kind::allreduce, send, recv, count, t, op, 0));
  }
  template <class T>
  status allreduce(const T* send, T* recv, std::size_t count, reduce_op op = reduce_op::sum) {
    return allreduce(send, recv, count, dtype_of_v<T>, op);
  }
  template <class T>
  status allreduce(T* data, std::size_t count, reduce_op op = reduce_op::sum) {
    return allreduce(data, data, count, dtype_of_v<T>, op);
  }
  template <class T>
  work allreduce_async(T* data, std::size_t count, reduce_op op = reduce_op::sum) {
    return allreduce_async(data, data, count, dtype_of_v<T>, op);
  }

  /// Copies root's `count` elements of `buf` to every rank's `buf`.
  status broadcast(void* buf, std::size_t count, dtype t, int root) {
    return run(rooted(collective_kind::broadcast, buf, buf, count, t, reduce_op::sum, root));
  }
  work broadcast_async(void* buf, std::size_t count, dtype t, int root) {
    return submit(rooted(collective_kind::broadcast, buf, buf, count, t, reduce_op::sum, root));
  }
  template <class T>
  status broadcast(T* buf, std::size_t count, int root) {
    return broadcast(buf, count, dtype_of_v<T>, root);
  }

  /// root's recv[i] = send[i] (op) over all ranks; other ranks' recv is not
  /// touched (may be null). `send == recv` on the root is in place.
  status reduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, int root) {
    return run(rooted(collective_kind::reduce, send, recv, count, t, op, root));
  }
  work reduce_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, int root) {
    return submit(rooted(collective_kind::reduce, send, recv, count, t, op, root));
  }

  /// recv (size() * count elements) = every rank's `send` (count) in rank order.
  /// In place: send == recv + rank() * count.
  status allgather(const void* send, void* recv, std::size_t count, dtype t) {
    return run(rooted(collective_kind::allgather, send, recv, count, t, reduce_op::sum, 0));
  }
  work allgather_async(const void* send, void* recv, std::size_t count, dtype t) {
    return submit(rooted(collective_kind::allgather, send, recv, count, t, reduce_op::sum, 0));
  }

  /// Allgather with per-rank counts: rank r's `send` (counts[r] elements) lands
  /// at recv + displs[r]. `counts`, `displs`: size() entries, equal on all ranks.
  status allgatherv(const void* send, std::size_t send_count, void* recv, const std::size_t* counts,
                    const std::size_t* displs, dtype t) {
    return run(vdesc(collective_kind::allgatherv, send, send_count, recv, counts, displs, nullptr, nullptr, t));
  }

  /// recv (count) = block rank() of every rank's send (size() * count), reduced.
  /// In place: recv == send + rank() * count.
  status reduce_scatter(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return run(rooted(collective_kind::reduce_scatter, send, recv, count, t, op, 0));
  }
  work reduce_scatter_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return submit(rooted(collective_kind::reduce_scatter, send, recv, count, t, op, 0));
  }

  /// Block r of `send` (count elements each) goes to rank r, block r of `recv`
  /// comes from rank r. send and recv must differ.
  status alltoall(const void* send, void* recv, std::size_t count, dtype t) {
    return run(rooted(collective_kind::alltoall, send, recv, count, t, reduce_op::sum, 0));
  }
  work alltoall_async(const void* send, void* recv, std::size_t count, dtype t) {
    return submit(rooted(collective_kind::alltoall, send, recv, count, t, reduce_op::sum, 0));
  }

  /// Alltoall with per-peer counts and displacements (size() entries each).
  status alltoallv(const void* send, const std::size_t* send_counts, const std::size_t* send_displs,
                   void* recv, const std::size_t* recv_counts, const std::size_t* recv_displs, dtype t) {
    return run(vdesc(collective_kind::alltoallv, send, 0, recv, send_counts, send_displs, recv_counts,
                     recv_displs, t));
  }

  /// root's recv (size() * count) = every rank's send (count) in rank order.
  status gather(const void* send, void* recv, std::size_t count, dtype t, int root) {
    return run(rooted(collective_kind::gather, send, recv, count, t, reduce_op::sum, root));
  }
  /// Every rank's recv (count) = block rank() of root's send (size() * count).
  status scatter(const void* send, void* recv, std::size_t count, dtype t, int root) {
    return run(rooted(collective_kind::scatter, send, recv, count, t, reduce_op::sum, root));
  }

  /// Point to point: `peer` must call recv (or sendrecv) with the same count
  /// and dtype. Calls to one peer match in issue order. A send larger than the
  /// link buffer completes only once the peer receives.
  status send(const void* buf, std::size_t count, dtype t, int peer) {
    return run(rooted(collective_kind::send, buf, nullptr, count, t, reduce_op::sum, peer));
  }
  status recv(void* buf, std::size_t count, dtype t, int peer) {
    return run(rooted(collective_kind::recv, nullptr, buf, count, t, reduce_op::sum, peer));
  }
  /// Sends to `dst` and receives from `src` at the same time (no deadlock
  /// when two ranks exchange large messages).
  status sendrecv(const void* send, std::size_t send_count, int dst, void* recv,
                  std::size_t recv_count, int src, dtype t) {
    op_desc d = rooted(collective_kind::sendrecv, send, recv, send_count, t, reduce_op::sum, dst);
    d.peer2 = src;
    d.count2 = recv_count;
    return run(d);
  }

  /// Returns once every rank called barrier().
  status barrier() { return run(op_desc{}); }
  work barrier_async() { return submit(op_desc{}); }

  /// Makes every running and future call on this communicator return
  /// errc::aborted (within ~50 ms). Safe from any thread, e.g. a watchdog.
  void abort() noexcept { aborted_.store(true); }

 private:
  communicator(store& kv, int rank, int size)
      : user_kv_(kv), rank_(rank), size_(size), log_(rank), queue_(*this) {}

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

    CCLITE_INFO(log_, "init: rank %d of %d, local rank %d of %d, %s", rank_, size_, local_rank(),
                local_size(), topo_.describe(peers_).c_str());
    CCLITE_TRY(choose_transports());
    links_.resize(static_cast<std::size_t>(size_));
    if (size_ > 1) CCLITE_TRY(connect_ring(until));
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

  status connect_peer(int p, deadline until) {
    auto l = transports_->connect(choice_[static_cast<std::size_t>(p)], p, until);
    if (!l) {
      return status(l.error().code(), "connecting to " + peer(p).describe() + " via " +
                                           transport_of(p) + ": " + l.error().message());
    }
    links_[static_cast<std::size_t>(p)] = std::move(l.value());
    return {};
  }

  // ---- execution ------------------------------------------------------------------------

  static op_desc rooted(collective_kind k, const void* send, void* recv, std::size_t count, dtype t,
                        reduce_op op, int root) {
    op_desc d;
    d.kind = k;
    d.send = send;
    d.recv = recv;
    d.count = count;
    d.type = t;
    d.op = op;
    d.root = root;
    return d;
  }
  static op_desc vdesc(collective_kind k, const void* send, std::size_t send_count, void* recv,
                       const std::size_t* counts, const std::size_t* displs, const std::size_t* rcounts,
                       const std::size_t* rdispls, dtype t) {
    op_desc d = rooted(k, send, recv, send_count, t, reduce_op::sum, 0);
    d.counts = counts;
    d.displs = displs;
    d.rcounts = rcounts;
    d.rdispls = rdispls;
    return d;
  }
  // Argument errors are reported at once on the calling rank, without queuing.
  status run(const op_desc& d) {
    CCLITE_TRY(detail::validate(d, size_));
    return queue_.run(d);
  }
  work submit(const op_desc& d) {
    status st = detail::validate(d, size_);
    if (!st.ok()) return work::failed(std::move(st));
    return queue_.submit(d);
  }

  status execute(const op_desc& d) override {
    const std::uint64_t seq = ++seq_;
    if (aborted_.load()) {
      broken_ = make_error(errc::aborted, "communicator aborted (rank %d)", rank_);
      return broken_;
    }
    if (!broken_.ok()) {
      return status(broken_.code(), "communicator unusable after an earlier error: " + broken_.message());
    }
    log_call(d);
    status st = dispatch(d);
    if (!st.ok()) {
      st = status(st.code(), describe_call(d, seq) + ": " + st.message());
      if (st.code() != errc::invalid_argument && st.code() != errc::unsupported) broken_ = st;
      CCLITE_WARN(log_, "%s", st.to_string().c_str());
    }
    return st;
  }

  // ---- algorithms per collective ------------------------------------------------------

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

  status dispatch(const op_desc& d) {
    const deadline until = deadline::after(timeout_);
    const std::size_t elem = d.kind == collective_kind::barrier ? 1 : size_of(d.type);
    const reduction red = reduction_for(d.type, d.op);
    const int n = size_, pos = topo_.ring_position(rank_);
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    const auto* send = static_cast<const std::uint8_t*>(d.send);
    auto* recv = static_cast<std::uint8_t*>(d.recv);
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes_ / elem);
    const std::size_t bytes = d.count * elem;
    const std::size_t me = static_cast<std::size_t>(rank_);
    auto ring = [&](auto&& fn) { return with_links(prev, next, elem, &red, until, fn); };
    switch (d.kind) {
      case collective_kind::allreduce:
        if (n == 1) return local_copy(send, recv, bytes);
        return ring([&](auto& pr) { return ring_allreduce(pr, send, recv, d.count, elem, red, n, pos, chunk); });
      case collective_kind::broadcast: {
        if (n == 1) return {};
        const int rel = (pos - topo_.ring_position(d.root) + n) % n;
        return ring([&](auto& pr) { return ring_broadcast(pr, recv, bytes, n, rel); });
      }
      case collective_kind::barrier:
        if (n == 1) return {};
        return ring([&](auto& pr) { return ring_barrier(pr, n, pos); });
      case collective_kind::reduce: {
        if (d.count && !send) return make_error(errc::invalid_argument, "reduce: null send buffer");
        if (d.count && rank_ == d.root && !recv)
          return make_error(errc::invalid_argument, "reduce: null recv buffer on the root");
        if (n == 1) return local_copy(send, recv, bytes);
        const int rel = (pos - topo_.ring_position(d.root) + n) % n;
        return ring([&](auto& pr) { return chain_reduce(pr, send, recv, d.count, elem, red, n, rel); });
      }
      case collective_kind::allgather:
      case collective_kind::allgatherv:
        return run_allgather(d, send, recv, elem, until);
      case collective_kind::reduce_scatter:
        if (n == 1) return local_copy(send, recv, bytes);
        return ring([&](auto& pr) {
          return ring_reduce_scatter(pr, send, recv, d.count, elem, red, n, pos, topo_.ring().data(), rank_, chunk);
        });
      case collective_kind::gather:
      case collective_kind::scatter:
        return run_rooted_direct(d, send, recv, bytes, elem, until);
      case collective_kind::alltoall:
      case collective_kind::alltoallv:
        return run_alltoall(d, send, recv, elem, until);
      case collective_kind::send:
      case collective_kind::recv:
      case collective_kind::sendrecv: {
        const int dst = d.kind == collective_kind::recv ? -1 : d.root;
        const int src = d.kind == collective_kind::send ? -1 : d.kind == collective_kind::recv ? d.root : d.peer2;
        const std::size_t sbytes = d.kind == collective_kind::recv ? 0 : bytes;
        const std::size_t rbytes = d.kind == collective_kind::send ? 0 : d.kind == collective_kind::recv ? bytes : d.count2 * elem;
        if (dst == rank_ || src == rank_) {  // to or from ourselves: a copy
          if (dst == rank_ && src == rank_) return local_copy(send, recv, std::min(sbytes, rbytes));
          return make_error(errc::invalid_argument, "%s: a rank cannot send to itself without receiving from itself", to_string(d.kind));
        }
        int peers[2] = {dst < 0 ? src : dst, src < 0 ? dst : src};
        CCLITE_TRY(ensure_links(peers, 2, until));
        return with_links(peers[1], peers[0], elem, nullptr, until, [&](auto& pr) -> status {
          CCLITE_TRY(pr.sendrecv(send, sbytes, recv, rbytes));
          return pr.finish();
        });
      }
    }
    (void)me;
    return make_error(errc::unsupported, "collective %d not implemented", static_cast<int>(d.kind));
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

  std::string describe_call(const op_desc& d, std::uint64_t seq) const {
    char buf[200];
    if (d.kind == collective_kind::barrier) {
      std::snprintf(buf, sizeof buf, "rank %d: barrier #%" PRIu64, rank_, seq);
    } else {
      std::snprintf(buf, sizeof buf, "rank %d: %s #%" PRIu64 " (%zu x %s%s%s)", rank_, to_string(d.kind), seq,
                    d.count, to_string(d.type), d.kind == collective_kind::allreduce ? ", " : "",
                    d.kind == collective_kind::allreduce ? to_string(d.op) : "");
    }
    return buf;
  }

  // INFO: the algorithm of each call, once per (collective, power-of-two size class).
  void log_call(const op_desc& d) {
    if (!log_.enabled(log_level::info)) return;
    std::size_t bytes = d.count * (d.kind == collective_kind::barrier ? 0 : size_of(d.type));
    int cls = 0;
    while (cls < 63 && (std::size_t(1) << cls) < bytes) ++cls;
    std::uint64_t bit = std::uint64_t(1) << cls;
    std::uint64_t& seen = logged_[static_cast<std::size_t>(d.kind)];
    if (!(seen & bit)) {
      seen |= bit;
      const char* algo = size_ == 1 ? "local copy" : algorithm_name(d.kind);
      CCLITE_INFO(log_, "%s: %zu bytes (class <= 2^%d): algorithm %s, chunk %zu bytes, ring %s/%s",
                  to_string(d.kind), bytes, cls, algo, chunk_bytes_,
                  size_ > 1 ? transport_of(topo_.ring_prev(rank_)) : "self",
                  size_ > 1 ? transport_of(topo_.ring_next(rank_)) : "self");
    }
    CCLITE_TRACE(log_, "%s #%" PRIu64 ": count %zu", to_string(d.kind), seq_, d.count);
  }

  static const char* algorithm_name(collective_kind k) {
    switch (k) {
      case collective_kind::broadcast: return "ring chain";
      case collective_kind::reduce: return "ring chain to the root";
      case collective_kind::gather: case collective_kind::scatter: return "direct to/from the root";
      case collective_kind::alltoall: case collective_kind::alltoallv: return "pairwise exchange";
      case collective_kind::send: case collective_kind::recv: case collective_kind::sendrecv: return "direct";
      default: return "ring";
    }
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
  std::uint64_t seq_ = 0;
  status broken_;
  std::uint64_t logged_[collective_kind_count] = {};
  // Reused between calls so that steady-state collectives do not allocate.
  std::vector<std::size_t> scratch_len_, scratch_off_;
  std::vector<int> scratch_peers_;
  detail::work_queue queue_;  // last: its thread must stop before the rest is destroyed
};

}  // namespace cclite
