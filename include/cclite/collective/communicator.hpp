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

#include <cclite/algorithm/ring_allreduce.hpp>
#include <cclite/algorithm/ring_broadcast.hpp>
#include <cclite/algorithm/ring_gather.hpp>
#include <cclite/collective/comm_core.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/collective/work_queue.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/reduce.hpp>

namespace cclite {

template <class... Transports>
class communicator final : private detail::comm_core<Transports...>, private detail::op_executor {
  using core = detail::comm_core<Transports...>;
  using core::rank_; using core::size_; using core::log_; using core::topo_; using core::peers_;
  using core::links_; using core::timeout_; using core::chunk_bytes_; using core::aborted_;
  using core::with_links; using core::ensure_links; using core::run_allgather;
  using core::run_rooted_direct; using core::run_alltoall; using core::local_copy;
  using core::run_rd_allreduce; using core::select_;

 public:

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
    CCLITE_TRY(c->core::init(std::move(opts)));
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
  const char* transport_of(int peer) const { return core::transport_of(peer); }
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
  communicator(store& kv, int rank, int size) : core(kv, rank, size), queue_(*this) {}

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
    auto ring = [&](auto&& fn) { return this->with_links(prev, next, elem, &red, until, fn); };
    switch (d.kind) {
      case collective_kind::allreduce:
        if (n == 1) return local_copy(send, recv, bytes);
        if (select_.choose(d.kind, bytes, n) == algorithm::rd)
          return this->run_rd_allreduce(send, recv, d.count, red, until);
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
        return this->with_links(peers[1], peers[0], elem, nullptr, until, [&](auto& pr) -> status {
          CCLITE_TRY(pr.sendrecv(send, sbytes, recv, rbytes));
          return pr.finish();
        });
      }
    }
    return make_error(errc::unsupported, "collective %d not implemented", static_cast<int>(d.kind));
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
      const char* algo = size_ == 1 ? "local copy"
                         : select_.choose(d.kind, bytes, size_) == algorithm::rd ? "recursive doubling"
                                                                                  : algorithm_name(d.kind);
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

  std::uint64_t seq_ = 0;
  status broken_;
  std::uint64_t logged_[collective_kind_count] = {};
  // Reused between calls so that steady-state collectives do not allocate.
  detail::work_queue queue_;  // last: its thread must stop before the rest is destroyed
};

}  // namespace cclite
