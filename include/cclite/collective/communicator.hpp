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
// root, dtype; send and recv buffers that overlap without being the call's
// in-place form, as MPI forbids aliased buffers) leaves the communicator
// usable; timeout / peer_lost / mismatch /
// aborted / protocol_error make it unusable: later calls return the same error
// at once, and the application should destroy it and build a new one. Such an
// error is spread to the other ranks, which report the job's first failure
// (README "Failure behaviour"; comm_checks::spread_failure).
//
// Thread safety: calls may come from any thread; they run one at a time in
// issue order (see work_queue.hpp). abort() may be called from any thread.
// A group (group_start() .. group_end(), point-to-point calls and collectives) is the
// exception: one thread issues it, with no other calls in between.
// A communicator and the children split() made from it share connections
// (link_pool.hpp): their collectives run one at a time (a lock), and each
// pair of ranks must issue them in the same order, or the calls report
// errc::mismatch. Using them from two threads at once is allowed but only
// useful when that order is fixed by the application (as with NCCL); for a
// communicator that another thread drives on its own schedule, dup() makes
// one with connections of its own.
//
// Set-up members (create, split, dup, shrink) are defined in
// communicator_setup.hpp; the call path, with the point-to-point and
// v-variant calls, in communicator_calls.hpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cclite/collective/call_group.hpp>
#include <cclite/collective/comm_dispatch.hpp>
#include <cclite/collective/device_hook.hpp>
#include <cclite/collective/link_pool.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/collective/work_queue.hpp>
#include <cclite/core/dtype.hpp>

namespace cclite {

template <class... Transports>
class communicator final : private detail::comm_dispatch<communicator<Transports...>, Transports...> {
  using core = detail::comm_dispatch<communicator, Transports...>;
  friend core;  // builds the hierarchical children through make_child()
  using core::rank_; using core::size_; using core::log_; using core::topo_; using core::peers_;
  using core::pool_; using core::root_of_; using core::prefix_; using core::tag_;
  using core::timeout_ms_; using core::chunk_bytes_; using core::aborted_;
  using core::select_; using core::has_direct; using core::direct_bytes_; using core::hold_links;
  using core::small_direct_max; using core::nested_;

 public:

  /// Joins `size` ranks that share `kv`. Blocks until this rank is connected
  /// to the peers it needs (its ring neighbours), bounded by the timeout.
  /// `kv` must outlive the communicator.
  /// Errors: invalid_argument, bootstrap_error, no_transport, timeout, peer_lost.
  static result<std::unique_ptr<communicator>> create(store& kv, int rank, int size,
                                                      comm_options opts = {});

  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  /// Waits for queued collectives (each bounded by its deadline), then closes.
  /// A last small call this rank left early is checked first (see
  /// settle_before_close: a mismatch there is logged).
  ~communicator() {
    queue_.shutdown();
    this->settle_before_close();
    this->trace_.watch_queue(nullptr);  // before queue_ goes (a dump may run on another thread)
  }

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

  /// Hands calls on device buffers to `h` from now on (null: none); see
  /// collective/device_hook.hpp. Such a call first waits for the _async calls
  /// issued before it (issue order); the _async forms run it before they
  /// return, and their handle holds its status. Not thread-safe against calls
  /// in flight: install before, remove after. `h` must outlive its installation.
  void set_device_hook(device_hook* h) noexcept { device_ = h; }
  device_hook* get_device_hook() const noexcept { return device_; }

  // ---- collectives --------------------------------------------------------------
  //
  // Every call has a blocking form returning `status` and an `_async` form
  // returning a `work` handle; both run in issue order. Counts are in
  // elements of `t`. Typed overloads take T* and deduce the dtype. An async
  // call reads its buffers, and the count / displacement arrays of the
  // v-variants, while it runs: keep them alive and unchanged until its
  // work::wait() returns (MPI's rule for nonblocking collectives).

  /// recv[i] = send[i] (op) over all ranks. `send == recv` is the in-place form.
  status allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return run(rooted<collective_kind::allreduce>(send, recv, count, t, op, 0, &reduction_for));
  }
  work allreduce_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return submit(rooted<collective_kind::allreduce>(send, recv, count, t, op, 0, &reduction_for));
  }
  template <class T>
  status allreduce(const T* send, T* recv, std::size_t count, reduce_op op = reduce_op::sum) {
    return run(typed<collective_kind::allreduce>(send, recv, count, op, 0));
  }
  template <class T>
  status allreduce(T* data, std::size_t count, reduce_op op = reduce_op::sum) {
    return run(typed<collective_kind::allreduce>(data, data, count, op, 0));
  }
  template <class T>
  work allreduce_async(T* data, std::size_t count, reduce_op op = reduce_op::sum) {
    return submit(typed<collective_kind::allreduce>(data, data, count, op, 0));
  }

  /// Copies root's `count` elements of `buf` to every rank's `buf`.
  /// As with MPI_Bcast, returning says only that this rank's part is done:
  /// the root may return before the others have their copy (small calls on
  /// one node always do; so do reduce's non-roots and scatter's root, gather's
  /// non-roots), and then learns of a mismatch in this call from its next one.
  status broadcast(void* buf, std::size_t count, dtype t, int root) {
    return run(rooted<collective_kind::broadcast>(buf, buf, count, t, reduce_op::sum, root));
  }
  work broadcast_async(void* buf, std::size_t count, dtype t, int root) {
    return submit(rooted<collective_kind::broadcast>(buf, buf, count, t, reduce_op::sum, root));
  }
  template <class T>
  status broadcast(T* buf, std::size_t count, int root) {
    return broadcast(buf, count, dtype_of_v<T>, root);
  }

  /// root's recv[i] = send[i] (op) over all ranks; other ranks' recv is not
  /// touched (may be null). `send == recv` on the root is in place.
  status reduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, int root) {
    return run(rooted<collective_kind::reduce>(send, recv, count, t, op, root, &reduction_for));
  }
  work reduce_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, int root) {
    return submit(rooted<collective_kind::reduce>(send, recv, count, t, op, root, &reduction_for));
  }
  template <class T>
  status reduce(const T* send, T* recv, std::size_t count, reduce_op op, int root) {
    return run(typed<collective_kind::reduce>(send, recv, count, op, root));
  }

  /// recv (size() * count elements) = every rank's `send` (count) in rank order.
  /// In place: send == recv + rank() * count.
  status allgather(const void* send, void* recv, std::size_t count, dtype t) {
    return run(rooted<collective_kind::allgather>(send, recv, count, t, reduce_op::sum, 0));
  }
  work allgather_async(const void* send, void* recv, std::size_t count, dtype t) {
    return submit(rooted<collective_kind::allgather>(send, recv, count, t, reduce_op::sum, 0));
  }

  /// Allgather with per-rank counts: rank r's `send` (counts[r] elements) lands
  /// at recv + displs[r]. `counts`, `displs`: size() entries, equal on all ranks.
  /// Blocks that overlap each other are refused (invalid_argument), in any
  /// rank order; in place: send == recv + displs[rank()].
  status allgatherv(const void* send, std::size_t send_count, void* recv, const std::size_t* counts,
                    const std::size_t* displs, dtype t);
  work allgatherv_async(const void* send, std::size_t send_count, void* recv, const std::size_t* counts,
                        const std::size_t* displs, dtype t);

  /// recv (count) = block rank() of every rank's send (size() * count), reduced.
  /// In place: recv == send + rank() * count.
  status reduce_scatter(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return run(rooted<collective_kind::reduce_scatter>(send, recv, count, t, op, 0, &reduction_for));
  }
  work reduce_scatter_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return submit(rooted<collective_kind::reduce_scatter>(send, recv, count, t, op, 0, &reduction_for));
  }
  template <class T>
  status reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op = reduce_op::sum) {
    return run(typed<collective_kind::reduce_scatter>(send, recv, count, op, 0));
  }

  /// Reduce-scatter with per-rank counts (MPI_Reduce_scatter): `send` holds
  /// every rank's block back to back (rank r's: recv_counts[r] elements, after
  /// those of ranks 0..r-1); `recv` (recv_counts[rank()] elements) receives
  /// this rank's block reduced over all ranks. `recv_counts`: size() entries,
  /// equal on all ranks (a rank whose array differs gets errc::mismatch). In
  /// place: recv == send + (recv_counts[0] + ... + recv_counts[rank() - 1]).
  status reduce_scatterv(const void* send, void* recv, const std::size_t* recv_counts, dtype t, reduce_op op);
  work reduce_scatterv_async(const void* send, void* recv, const std::size_t* recv_counts, dtype t, reduce_op op);
  template <class T>
  status reduce_scatterv(const T* send, T* recv, const std::size_t* recv_counts, reduce_op op = reduce_op::sum) {
    const op_desc d = rsv_desc(send, recv, recv_counts, dtype_of_v<T>, op, &detail::kernels_of<T>);
    CCLITE_TRY(detail::validate_counts_of_rsv(d, rank_, size_));
    return run(d);
  }

  /// Inclusive prefix reduction (MPI_Scan): rank r's recv[i] = send[i] (op)
  /// over ranks 0..r, in rank order (reduce_op::avg: divided by r + 1).
  /// `send == recv` is in place. A chain in rank order, or recursive doubling
  /// for small calls on 3 or more ranks (algorithm/scan.hpp).
  status scan(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return run(rooted<collective_kind::scan>(send, recv, count, t, op, 0, &reduction_for));
  }
  work scan_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return submit(rooted<collective_kind::scan>(send, recv, count, t, op, 0, &reduction_for));
  }
  template <class T>
  status scan(const T* send, T* recv, std::size_t count, reduce_op op = reduce_op::sum) {
    return run(typed<collective_kind::scan>(send, recv, count, op, 0));
  }

  /// Exclusive prefix reduction (MPI_Exscan): rank r's recv[i] = send[i] (op)
  /// over ranks 0..r-1 (avg: divided by r). Rank 0's recv is not written
  /// (MPI leaves it undefined). `send == recv` is in place.
  status exscan(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return run(rooted<collective_kind::exscan>(send, recv, count, t, op, 0, &reduction_for));
  }
  work exscan_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return submit(rooted<collective_kind::exscan>(send, recv, count, t, op, 0, &reduction_for));
  }
  template <class T>
  status exscan(const T* send, T* recv, std::size_t count, reduce_op op = reduce_op::sum) {
    return run(typed<collective_kind::exscan>(send, recv, count, op, 0));
  }

  /// Block r of `send` (count elements each) goes to rank r, block r of `recv`
  /// comes from rank r. `send == recv` is the in-place form (MPI_IN_PLACE):
  /// each block is swapped with its rank through a bounded scratch buffer.
  status alltoall(const void* send, void* recv, std::size_t count, dtype t) {
    return run(rooted<collective_kind::alltoall>(send, recv, count, t, reduce_op::sum, 0));
  }
  work alltoall_async(const void* send, void* recv, std::size_t count, dtype t) {
    return submit(rooted<collective_kind::alltoall>(send, recv, count, t, reduce_op::sum, 0));
  }

  /// Alltoall with per-peer counts and displacements (size() entries each);
  /// receive blocks that overlap each other are refused (invalid_argument).
  /// In place (send == recv): the recv counts and displacements are used both
  /// ways (send ones may be null) and must be symmetric, as MPI_IN_PLACE says.
  status alltoallv(const void* send, const std::size_t* send_counts, const std::size_t* send_displs,
                   void* recv, const std::size_t* recv_counts, const std::size_t* recv_displs, dtype t);
  work alltoallv_async(const void* send, const std::size_t* send_counts, const std::size_t* send_displs,
                       void* recv, const std::size_t* recv_counts, const std::size_t* recv_displs, dtype t);

  /// root's recv (size() * count) = every rank's send (count) in rank order.
  /// In place on the root: send == recv + root * count.
  status gather(const void* send, void* recv, std::size_t count, dtype t, int root) {
    return run(rooted<collective_kind::gather>(send, recv, count, t, reduce_op::sum, root));
  }
  work gather_async(const void* send, void* recv, std::size_t count, dtype t, int root) {
    return submit(rooted<collective_kind::gather>(send, recv, count, t, reduce_op::sum, root));
  }
  /// Every rank's recv (count) = block rank() of root's send (size() * count).
  /// In place on the root: recv == send + root * count.
  status scatter(const void* send, void* recv, std::size_t count, dtype t, int root) {
    return run(rooted<collective_kind::scatter>(send, recv, count, t, reduce_op::sum, root));
  }
  work scatter_async(const void* send, void* recv, std::size_t count, dtype t, int root) {
    return submit(rooted<collective_kind::scatter>(send, recv, count, t, reduce_op::sum, root));
  }

  /// Gather with per-rank counts (MPI_Gatherv): rank r's `send` (send_count
  /// elements) lands at root's recv + recv_displs[r]. `recv_counts` and
  /// `recv_displs` (size() entries) are read on the root only and may be null
  /// elsewhere, as is `recv`; recv_counts[r] must equal rank r's send_count
  /// (checked on every message: errc::mismatch naming the rank); blocks that
  /// overlap each other are refused on the root (invalid_argument). In place
  /// on the root: send == recv + recv_displs[root].
  status gatherv(const void* send, std::size_t send_count, void* recv, const std::size_t* recv_counts,
                 const std::size_t* recv_displs, dtype t, int root);
  work gatherv_async(const void* send, std::size_t send_count, void* recv, const std::size_t* recv_counts,
                     const std::size_t* recv_displs, dtype t, int root);
  /// Scatter with per-rank counts (MPI_Scatterv): rank r's `recv` (recv_count
  /// elements) = send_counts[r] elements of root's send at send + send_displs[r].
  /// `send`, `send_counts` and `send_displs` are read on the root only.
  status scatterv(const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
                  std::size_t recv_count, dtype t, int root);
  work scatterv_async(const void* send, const std::size_t* send_counts, const std::size_t* send_displs,
                      void* recv, std::size_t recv_count, dtype t, int root);

  /// Point to point: `peer` must call recv (or sendrecv) with the same count
  /// and dtype. Calls to one peer match in issue order. A send larger than the
  /// link buffer completes only once the peer receives. A receive that meets
  /// a send of another size fails with errc::mismatch naming both sides (each
  /// message carries a 16-byte envelope, algorithm/p2p_envelope.hpp), and the
  /// communicator is unusable after it, as after a mismatched collective.
  ///
  /// The async forms queue behind every earlier call and run one at a time,
  /// like NCCL's ncclSend / ncclRecv outside a group, not like MPI_Isend: two
  /// ranks that each issue send_async then recv_async to the other deadlock
  /// (until the deadline) once the message exceeds the link buffer. Exchange
  /// with sendrecv / sendrecv_async, which moves both directions at once, or
  /// issue the calls in a group (group_start(), below).
  status send(const void* buf, std::size_t count, dtype t, int peer);
  work send_async(const void* buf, std::size_t count, dtype t, int peer);
  status recv(void* buf, std::size_t count, dtype t, int peer);
  work recv_async(void* buf, std::size_t count, dtype t, int peer);
  /// Sends to `dst` and receives from `src` at the same time (no deadlock
  /// when two ranks exchange large messages).
  status sendrecv(const void* send, std::size_t send_count, int dst, void* recv,
                  std::size_t recv_count, int src, dtype t);
  work sendrecv_async(const void* send, std::size_t send_count, int dst, void* recv, std::size_t recv_count,
                      int src, dtype t);

  /// Returns once every rank called barrier().
  status barrier() { return run(rooted<collective_kind::barrier>(nullptr, nullptr, 0, dtype::uint8, reduce_op::sum, 0)); }
  work barrier_async() {
    return submit(rooted<collective_kind::barrier>(nullptr, nullptr, 0, dtype::uint8, reduce_op::sum, 0));
  }

  // ---- groups of point-to-point calls ---------------------------------------------
  //
  // Like ncclGroupStart / ncclGroupEnd (torch.distributed.batch_isend_irecv):
  // send(), recv() and sendrecv() issued between group_start() and group_end()
  // are checked and recorded, return at once, and run together in group_end(),
  // every peer's transfers progressing side by side. Any pattern in which each
  // send meets its receive in the peer's group completes whatever the sizes (a
  // ring shift, a halo exchange, a hand-written all-to-all), where the same
  // calls one by one would wait on each other past the link buffer. Transfers
  // to one peer keep their issue order; a grouped send matches a lone recv.
  //
  // Collectives (barrier included) may be grouped too, as with NCCL: they are
  // recorded and run in group_end(), in their issue order and before the
  // group's point-to-point calls, so every rank must group the same
  // collectives in the same order (a grouped allreduce matches a lone one on
  // another rank only if nothing else comes between them there). Unlike NCCL
  // they are not fused into one launch: grouping them saves nothing, it only
  // lets NCCL code keep its shape.
  //
  // Groups nest: the outermost group_end() runs the calls. Buffers (and the
  // v-variants' count and displacement arrays) must stay valid until it
  // returns. A group belongs to the communicator, not to a thread: issue it
  // from one thread, no other thread calling this communicator meanwhile.
  // Inside a group the _async forms fail with invalid_argument and calls on
  // device buffers with unsupported; neither is recorded.

  /// Opens a group (above).
  void group_start() noexcept { group_.start(); }
  /// Closes a group. The outermost runs the recorded calls, in issue order with
  /// this communicator's other calls: the collectives one by one, then the
  /// point-to-point calls together. Returns the first error; the calls after
  /// a failed one do not run (the communicator is unusable then anyway).
  /// Errors: invalid_argument (no group open; a receive whose buffer
  /// overlaps another send's or receive's in the group: then nothing runs),
  /// those of the recorded calls.
  status group_end();

  /// Color that leaves a rank out of every sub-communicator of split().
  static constexpr int no_color = -1;

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  /// Splits the ranks like MPI_Comm_split / ncclCommSplit: ranks passing the
  /// same `color` (>= 0) form a new communicator, ordered by (`key`, rank
  /// here); a rank passing no_color gets a null pointer. Collective: every
  /// rank of this communicator must call it, in the same order as its other
  /// calls. Typical uses: `split(c.node_index(), c.rank())` for the ranks of
  /// one node, `split(c.local_rank(), c.rank())` for one rank per node.
  /// The child shares this communicator's connections (NCCL's splitShare):
  /// it reuses the link to each member already connected and opens the
  /// others through this communicator's transports, which keep them for
  /// later (see link_pool.hpp for how the traffic stays apart). Parent and
  /// child calls must come in the same order on every rank; abort() on one
  /// aborts both; the child may outlive this communicator (the store must
  /// outlive both). opts.store_prefix is ignored.
  /// Errors: invalid_argument inside a group; those of allgather and create().
  result<std::unique_ptr<communicator>> split(int color, int key, comm_options opts = {});

  /// A new communicator of the same ranks, numbered alike, with connections
  /// of its own (MPI_Comm_dup; ncclCommSplit with splitShare = 0): unlike a
  /// split() child, its calls need no order against this communicator's
  /// family, so another thread may drive it (a progress thread, CUDA host
  /// functions) while this one is used. It meets the others through the store
  /// and connects afresh, as create() does: a full set-up, not a cheap call.
  /// opts as for split(): the timeout and chunk size left unset are this
  /// communicator's; opts.store_prefix is ignored. Every rank must call it,
  /// as often as the others. Errors: those of create().
  result<std::unique_ptr<communicator>> dup(comm_options opts = {});

  /// A new communicator of the ranks not in `exclude`, numbered in their
  /// order here (NCCL's ncclCommShrink, MPI's MPI_Comm_shrink): after a
  /// peer_lost naming rank 3, the others call shrink({3}) and go on without
  /// it. Works on a failed communicator: it meets the others through the
  /// store, not through this communicator's links, and connects afresh
  /// (opts as for create(); opts.store_prefix is ignored). Every remaining
  /// rank must pass the same list; a rank that disagrees waits for a
  /// different group until the timeout. The store must still be up: a TCP
  /// store hosted by an excluded rank (rank 0 under cclite-run, torchrun
  /// and mpirun) is gone with it, and the call fails with its error.
  /// Errors: invalid_argument (this rank excluded, a rank out of range);
  /// those of create().
  result<std::unique_ptr<communicator>> shrink(std::vector<int> exclude, comm_options opts = {});
CCLITE_SETUP_CODE_END

  /// Memory every local rank maps, a peer's copy of it, and its release: see comm_shared.hpp.
  using core::alloc_shared;
  using core::shared_peer;
  using core::free_shared;

  /// Index of this rank's node (0 .. node_count()-1), for split().
  int node_index() const { return topo_.node_of(rank_); }

  /// The cost model the selector uses (defaults, CCLITE_COST_MEASURE=1
  /// figures or CCLITE_COST_<KIND>; `costs().source("tcp")` says which).
  const cost_model& costs() const noexcept { return select_.costs(); }
  /// The algorithm the selector picks for `k` moving `bytes` per rank (hier
  /// and direct still fall back to ring where they do not apply).
  algorithm choose_algorithm(collective_kind k, std::size_t bytes) const noexcept {
    return select_.choose(k, bytes, size_);
  }

  /// Whether a call of this communicator, or of one sharing its links (split()
  /// parent or children), failed fatally; every later call reports it.
  bool failed() const noexcept { return pool_->failed.load(); }

  /// The deadline of each call (comm_options::timeout or CCLITE_TIMEOUT at
  /// creation, or what set_timeout() gave; negative: none).
  using core::timeout;
  /// Changes the deadline of this communicator's later calls; zero or
  /// negative: none. As PyTorch's _set_pg_timeout: a long deadline for the
  /// set-up and the first steps (slow starts, data loading, sanitizer builds),
  /// a short one once the job runs, so a lost or stuck rank is reported in
  /// seconds. Safe from any thread; a call already running keeps the deadline
  /// it started with. The hierarchical allreduce's children follow it; dup()
  /// and split() results made later start with it, those made before keep theirs.
  void set_timeout(milliseconds t) noexcept {
    timeout_ms_.store(t.count() > 0 ? t.count() : -1, std::memory_order_relaxed);
    this->timeout_children(timeout());
  }

  /// Makes every running and future call on this communicator return
  /// errc::aborted (within ~50 ms), and on every communicator sharing its
  /// links (its split() parent and children: one abort flag, link_pool.hpp).
  /// Safe from any thread, e.g. a watchdog.
  void abort() noexcept {
    aborted_.store(true);
    this->abort_children();
  }

 private:
  communicator(store& kv, int rank, int size) : core(kv, rank, size), queue_(*this) {}
  communicator(std::shared_ptr<typename core::pool_t> pool, std::vector<int> root_of, int rank)
      : core(std::move(pool), std::move(root_of), rank), queue_(*this) {}

CCLITE_SETUP_CODE_BEGIN  // defined in communicator_setup.hpp
  status finish_init();  // the end of create() and make_child(): shm-direct's settings
  result<std::unique_ptr<communicator>> make_child(const std::vector<int>& ranks, const std::string& where,
                                                   comm_options opts, bool nested);
CCLITE_SETUP_CODE_END

  // ---- execution (defined in communicator_calls.hpp) --------------------------------------
  // A call is checked here, then queued (work_queue.hpp); the queue's thread
  // or the caller runs it through comm_dispatch.hpp's execute().
  template <collective_kind K>  // the op_desc of a call of kind K: its code, its kernels
  static op_desc rooted(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, int root,
                        detail::kernel_lookup kernels = nullptr);
  template <collective_kind K, class T>
  static op_desc typed(const T* send, T* recv, std::size_t count, reduce_op op, int root);
  template <class> friend class detail::hier_allreduce;  // run_with(): its children's calls
  template <collective_kind K>
  status run_with(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                  detail::kernel_lookup kernels);
  static op_desc sendrecv_desc(const void* send, std::size_t send_count, int dst, void* recv,
                               std::size_t recv_count, int src, dtype t);
  template <collective_kind K>
  static op_desc vdesc(const void* send, std::size_t send_count, void* recv, const std::size_t* counts,
                       const std::size_t* displs, const std::size_t* rcounts, const std::size_t* rdispls, dtype t,
                       int root = 0);
  op_desc rsv_desc(const void* send, void* recv, const std::size_t* recv_counts, dtype t, reduce_op op,
                   detail::kernel_lookup kernels) const;
  status run(const op_desc& d);     // blocking forms
  work submit(const op_desc& d);    // _async forms
  status record(const op_desc& d);  // inside a group
  status run_on_device(const op_desc& d);

  int splits_ = 0;
  int shrinks_ = 0;
  int dups_ = 0;
  detail::call_group group_;  // the open group's calls
  device_hook* device_ = nullptr;  // set_device_hook()
  // Reused between calls so that steady-state collectives do not allocate.
  detail::work_queue queue_;  // last: its thread must stop before the rest is destroyed
};

}  // namespace cclite

// The member definitions (each includes this header: either may come first).
#include <cclite/collective/communicator_calls.hpp>
#include <cclite/collective/communicator_setup.hpp>
