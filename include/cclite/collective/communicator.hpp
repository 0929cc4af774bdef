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
// root, dtype) leaves the communicator usable; timeout / peer_lost / mismatch /
// aborted / protocol_error make it unusable: later calls return the same error
// at once, and the application should destroy it and build a new one. Such an
// error is spread to the other ranks, which report the job's first failure
// (README "Failure behaviour"; comm_core::spread_failure).
//
// Thread safety: calls may come from any thread; they run one at a time in
// issue order (see work_queue.hpp). abort() may be called from any thread.
// A communicator and the children split() made from it share connections
// (link_pool.hpp): their collectives run one at a time (a lock), and each
// pair of ranks must issue them in the same order, or the calls report
// errc::mismatch. Using them from two threads at once is allowed but only
// useful when that order is fixed by the application (as with NCCL).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <cclite/algorithm/ring_allreduce.hpp>
#include <cclite/algorithm/ring_broadcast.hpp>
#include <cclite/algorithm/ring_gather.hpp>
#include <cclite/collective/comm_algorithms.hpp>
#include <cclite/collective/comm_core.hpp>
#include <cclite/collective/comm_shared.hpp>
#include <cclite/collective/device_hook.hpp>
#include <cclite/collective/link_pool.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/collective/work_queue.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/reduce.hpp>

namespace cclite {

template <class... Transports>
class communicator final : private detail::comm_shared<Transports...>, private detail::op_executor {
  using core = detail::comm_shared<Transports...>;
  using core::rank_; using core::size_; using core::log_; using core::topo_; using core::peers_;
  using core::pool_; using core::root_of_; using core::prefix_; using core::tag_; using core::comm_id_;
  using core::timeout_; using core::chunk_bytes_; using core::aborted_;
  using core::with_links; using core::ensure_links; using core::run_allgather;
  using core::run_rooted_direct; using core::run_alltoall; using core::local_copy;
  using core::run_rd_allreduce; using core::select_;
  using core::check_mismatch_; using core::hdr_; using core::coll_seq_;
  using core::has_direct; using core::direct_bytes_; using core::hold_links; using core::windows_;
  using core::window_call; using core::run_window_allreduce;
  using core::run_direct_allreduce; using core::small_direct_max;

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
    CCLITE_TRY(c->finish_init());
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

  /// Hands calls on device buffers to `h` from now on (null: none); see
  /// collective/device_hook.hpp. Such a call first waits for the _async calls
  /// issued before it (issue order); the _async forms run it before they
  /// return, and their handle holds its status. Not thread-safe against calls
  /// in flight: install before, remove after. `h` must outlive its installation.
  void set_device_hook(device_hook* h) noexcept { device_ = h; }
  device_hook* get_device_hook() const noexcept { return device_; }

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
  /// comes from rank r. `send == recv` is the in-place form (MPI_IN_PLACE):
  /// each block is swapped with its rank through a bounded scratch buffer.
  status alltoall(const void* send, void* recv, std::size_t count, dtype t) {
    return run(rooted(collective_kind::alltoall, send, recv, count, t, reduce_op::sum, 0));
  }
  work alltoall_async(const void* send, void* recv, std::size_t count, dtype t) {
    return submit(rooted(collective_kind::alltoall, send, recv, count, t, reduce_op::sum, 0));
  }

  /// Alltoall with per-peer counts and displacements (size() entries each).
  /// In place (send == recv): the recv counts and displacements are used both
  /// ways (send ones may be null) and must be symmetric, as MPI_IN_PLACE says.
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
  /// Errors: those of allgather and create().
  result<std::unique_ptr<communicator>> split(int color, int key, comm_options opts = {}) {
    std::int64_t mine[2] = {color < 0 ? -1 : color, key};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size_));
    CCLITE_TRY(allgather(mine, all.data(), 2, dtype::int64));
    const int split_no = ++splits_;
    if (color < 0) return std::unique_ptr<communicator>();
    std::vector<std::pair<std::int64_t, int>> members;  // (key, parent rank)
    for (int r = 0; r < size_; ++r)
      if (all[2 * static_cast<std::size_t>(r)] == color) members.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
    std::sort(members.begin(), members.end());
    std::vector<int> ranks;
    for (const auto& m : members) ranks.push_back(m.second);
    const std::string where = "split" + std::to_string(split_no) + "/" + std::to_string(color);
    // The child connects through the shared links: not while another thread
    // runs a collective of this family over them.
    std::unique_lock<std::mutex> hold(pool_->busy, std::defer_lock);
    CCLITE_TRY(hold_links(hold, deadline::after(timeout_)));
    return make_child(ranks, where, std::move(opts), false);
  }
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

  /// Makes every running and future call on this communicator return
  /// errc::aborted (within ~50 ms), and on every communicator sharing its
  /// links (its split() parent and children: one abort flag, link_pool.hpp).
  /// Safe from any thread, e.g. a watchdog.
  void abort() noexcept {
    aborted_.store(true);
    for (auto& child : hier_raw_)
      if (communicator* c = child.load()) c->abort();
  }

 private:
  communicator(store& kv, int rank, int size) : core(kv, rank, size), queue_(*this) {}
  communicator(std::shared_ptr<typename core::pool_t> pool, std::vector<int> root_of, int rank)
      : core(std::move(pool), std::move(root_of), rank), queue_(*this) {}

CCLITE_SETUP_CODE_BEGIN
  status finish_init() {
    auto piece = env::get_int("SHM_DIRECT_BUFFSIZE", 1 << 20, false);
    if (!piece) return piece.error();
    direct_bytes_ = static_cast<std::size_t>(std::max<std::int64_t>(4096, piece.value()));
    auto small = env::get_int("SHM_SMALL_MAX", static_cast<std::int64_t>(small_direct_max), false);
    if (!small) return small.error();
    if (small.value() < 0 || small.value() > static_cast<std::int64_t>(small_direct_max))
      return make_error(errc::invalid_argument, "CCLITE_SHM_SMALL_MAX=%lld is out of range (0 .. %zu bytes; 0 turns "
                        "shm-direct's small allreduce off)", static_cast<long long>(small.value()), small_direct_max);
    select_.set_direct(has_direct, direct_bytes_, static_cast<std::size_t>(small.value()));
    return {};
  }

  // A child over this family's links: `ranks` = its members as ranks here,
  // in their new order; `where` names it under this communicator's prefix.
  // `nested`: used only from inside this communicator's own calls (the
  // hierarchical algorithm's children), which already hold the links.
  result<std::unique_ptr<communicator>> make_child(const std::vector<int>& ranks, const std::string& where,
                                                   comm_options opts, bool nested) {
    int new_rank = -1;
    std::vector<int> roots;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      roots.push_back(root_of_[static_cast<std::size_t>(ranks[i])]);
      if (ranks[i] == rank_) new_rank = static_cast<int>(i);
    }
    if (new_rank < 0) return make_error(errc::invalid_argument, "communicator: this rank is not a member of %s", where.c_str());
    if (opts.timeout.count() == -2) opts.timeout = timeout_;
    if (!opts.chunk_bytes) opts.chunk_bytes = chunk_bytes_;
    std::unique_ptr<communicator> c(new communicator(pool_, std::move(roots), new_rank));
    c->nested_ = nested;
    std::string tag = tag_ + "." + where;
    for (char& ch : tag)
      if (ch == '/') ch = '.';
    CCLITE_TRY(c->core::init_child(std::move(opts), prefix_ + where + "/", std::move(tag)));
    CCLITE_TRY(c->finish_init());
    return c;
  }
CCLITE_SETUP_CODE_END


  // ---- execution ------------------------------------------------------------------------

  static op_desc rooted(collective_kind k, const void* send, void* recv, std::size_t count, dtype t,
                        reduce_op op, int root) {
    return op_desc::of(k, send, recv, count, t, op, root);
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
  // Device buffers go to the device hook, if one is installed, once what was
  // issued before has finished (issue order, as for every call).
  status run(const op_desc& d) {
    CCLITE_TRY(detail::validate(d, size_));
    if (device_ && device_->owns(d)) return run_on_device(d);
    return queue_.run(d);
  }
  work submit(const op_desc& d) {
    status st = detail::validate(d, size_);
    if (!st.ok()) return work::failed(std::move(st));
    if (device_ && device_->owns(d)) return work::completed(run_on_device(d));
    return queue_.submit(d);
  }
  status run_on_device(const op_desc& d) {
    queue_.wait_idle();
    return device_->run(d);
  }

  status execute(const op_desc& d) override {
    const std::uint64_t seq = ++seq_;
    if (aborted_.load()) {
      if (broken_.code() != errc::aborted) {
        broken_ = make_error(errc::aborted, "communicator aborted (rank %d)", rank_);
        broken_ = this->spread_failure(broken_, describe_call(d, seq));  // wakes the other ranks
      }
      return broken_;
    }
    if (!broken_.ok()) {
      return status(broken_.code(), "communicator unusable after an earlier error: " + broken_.message());
    }
    if (pool_->failed.load()) {  // a communicator sharing our links failed: some are closed
      status first = pool_->first_fault();
      broken_ = status(first.code(), "a communicator sharing links with this one failed: " + first.message());
      broken_ = this->spread_failure(broken_, describe_call(d, seq));  // wakes our other peers too
      CCLITE_WARN(log_, "%s", broken_.to_string().c_str());
      return broken_;
    }
    // One deadline for the whole call (waiting for the family's links
    // included), read from the clock once: at 8 bytes a clock read is ~5% of
    // the call (kvm-clock, 26 ns).
    const deadline until = deadline::after(timeout_);
    std::unique_lock<std::mutex> hold(pool_->busy, std::defer_lock);
    if (!nested_) {
      status st = hold_links(hold, until);
      if (!st.ok()) return status(st.code(), describe_call(d, seq) + ": " + st.message());
    }
    log_call(d);
    bool started = false;
    status st = dispatch_checked(d, started, until);
    if (!st.ok()) {
      const std::string call = describe_call(d, seq);
      st = status(st.code(), call + ": " + st.message());
      // An argument error found once the other ranks are already in the call
      // (our header went out) would leave them waiting: fatal like the rest.
      if (started || (st.code() != errc::invalid_argument && st.code() != errc::unsupported)) {
        st = this->spread_failure(std::move(st), call);
        broken_ = st;
      }
      CCLITE_WARN(log_, "%s", st.to_string().c_str());
    }
    return st;
  }

  // dispatch() between the call-header exchange with the ring neighbours
  // (collective/mismatch.hpp); `started` = our header went out.
  status dispatch_checked(const op_desc& d, bool& started, deadline until) {
    if (this->small_direct_ready(d)) {  // no link traffic: the header rides with the data
      started = true;
      detail::call_header h;
      if (check_mismatch_) h = detail::make_call_header(d, size_, ++coll_seq_, comm_id_);
      return this->run_small_allreduce(d, check_mismatch_ ? &h : nullptr, true, until);
    }
    if (!check_mismatch_ || size_ < 2 || !detail::has_call_header(d.kind)) return dispatch(d, until);
    started = true;
    detail::call_header h = detail::make_call_header(d, size_, ++coll_seq_, comm_id_);
    if (this->window_call(d)) h.aux = detail::call_header::window_flag;  // a path of its own
    status st = this->begin_checks(h, until);
    if (st.ok()) st = dispatch(d, until);
    if (st.ok()) st = this->end_checks(until);
    if (st.code() == errc::timeout) st = this->explain_timeout(std::move(st));
    hdr_.active = false;
    return st;
  }

  // ---- algorithms per collective ------------------------------------------------------

  status dispatch(const op_desc& d, deadline until) {
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
        // The first small call builds the node-wide small group (later ones take
        // dispatch_checked's small path, ahead of the header exchange).
        if (this->small_direct(d)) return this->run_small_allreduce(d, hdr_.active ? &hdr_.out : nullptr, false, until);
        if (auto* w = this->window_call(d)) return run_window_allreduce(*w, recv, d.count, red, until);
        switch (select_.choose(d.kind, bytes, n)) {
          case algorithm::rd: return this->run_rd_allreduce(send, recv, d.count, red, until);
          case algorithm::rhd: return this->run_hd_allreduce(send, recv, d.count, red, until);
          case algorithm::tree: return this->run_tree_allreduce(send, recv, d.count, red, until);
          case algorithm::hier:
            if (select_.hier_possible()) return run_hier_allreduce(d, red, until);
            break;  // one node, or nodes of different sizes: the ring
          case algorithm::direct:
            if (select_.direct_possible()) return run_direct_allreduce(send, recv, d.count, red, until);
            break;  // several nodes or a non-shm link: the ring
          default: break;
        }
        return ring([&](auto& pr) { return ring_allreduce(pr, send, recv, d.count, elem, red, n, pos, chunk); });
      case collective_kind::broadcast: {
        if (n == 1) return {};
        if (select_.choose(d.kind, bytes, n) == algorithm::tree)
          return this->run_tree_broadcast(recv, bytes, d.root, elem, until);
        const int rel = (pos - topo_.ring_position(d.root) + n) % n;
        return ring([&](auto& pr) { return ring_broadcast(pr, recv, bytes, n, rel); });
      }
      case collective_kind::barrier:
        if (n == 1) return {};
        if (this->small_direct(d)) return this->run_small_allreduce(d, hdr_.active ? &hdr_.out : nullptr, false, until);
        return ring([&](auto& pr) { return ring_barrier(pr, n, pos); });
      case collective_kind::reduce: {
        if (d.count && !send) return make_error(errc::invalid_argument, "reduce: null send buffer");
        if (d.count && rank_ == d.root && !recv)
          return make_error(errc::invalid_argument, "reduce: null recv buffer on the root");
        if (n == 1) return local_copy(send, recv, bytes);
        if (select_.choose(d.kind, bytes, n) == algorithm::tree)
          return this->run_tree_reduce(send, recv, d.count, d.root, red, until);
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

CCLITE_SETUP_CODE_BEGIN  // error messages and the hierarchical set-up: compiled for size
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

CCLITE_SETUP_CODE_END

  // INFO: the algorithm of each call, once per (collective, power-of-two size class).
  // (Outside the region: every call runs its first line.)
  void log_call(const op_desc& d) {
    if (!log_.enabled(log_level::info)) return;
    std::size_t bytes = d.count * (d.kind == collective_kind::barrier ? 0 : size_of(d.type));
    int cls = 0;
    while (cls < 63 && (std::size_t(1) << cls) < bytes) ++cls;
    std::uint64_t bit = std::uint64_t(1) << cls;
    std::uint64_t& seen = logged_[static_cast<std::size_t>(d.kind)];
    if (!(seen & bit)) {
      seen |= bit;
      const algorithm a = select_.choose(d.kind, bytes, size_);
      const bool in_window = size_ > 1 && this->window_call(d) != nullptr;
      const char* algo = size_ == 1 ? "local copy"
                         : in_window ? "shared window (each rank reduces its slice in every rank's copy)"
                         : this->small_direct(d) ? "shm-direct small (one synchronisation, the header beside the data)"
                         : a == algorithm::rd ? "recursive doubling"
                         : a == algorithm::rhd ? "halving-doubling (Rabenseifner)"
                         : a == algorithm::tree ? (d.kind == collective_kind::allreduce ? "double binary tree" : "binary tree")
                         : a == algorithm::hier && select_.hier_possible() ? "hierarchical (node reduce-scatter, cross-node allreduce, node allgather)"
                         : a == algorithm::direct && select_.direct_possible() ? "shm-direct (each rank reduces its slice from the peers' buffers)"
                                                : algorithm_name(d.kind);
      CCLITE_INFO(log_, "%s: %zu bytes (class <= 2^%d): algorithm %s, chunk %zu bytes, ring %s/%s",
                  to_string(d.kind), bytes, cls, algo, chunk_bytes_,
                  size_ > 1 ? transport_of(topo_.ring_prev(rank_)) : "self",
                  size_ > 1 ? transport_of(topo_.ring_next(rank_)) : "self");
    }
    CCLITE_TRACE(log_, "%s #%" PRIu64 ": count %zu", to_string(d.kind), seq_, d.count);
  }

CCLITE_SETUP_CODE_BEGIN
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

  // ---- hierarchical allreduce ---------------------------------------------------------

  // The two child communicators, built on first use from the topology every
  // rank already knows (no extra agreement): the ranks of this node, and the
  // ranks with this local rank on every node (a node-leader per shard).
  // Both share this communicator's links (link_pool.hpp); they run only inside
  // its calls, which hold those links already.
  status make_hier_children() {
    const int node = topo_.node_of(rank_), lr = topo_.local_rank(rank_);
    comm_options o;
    o.timeout = timeout_;
    o.chunk_bytes = chunk_bytes_;
    std::vector<int> ranks = topo_.node_ranks(node);  // in local-rank order
    auto in_node = make_child(ranks, "hier/node" + std::to_string(node), o, true);
    if (!in_node) return status(in_node.error().code(), "building the node communicator: " + in_node.error().message());
    ranks.clear();
    for (int k = 0; k < topo_.node_count(); ++k) ranks.push_back(topo_.node_ranks(k)[static_cast<std::size_t>(lr)]);
    auto across = make_child(ranks, "hier/cross" + std::to_string(lr), o, true);
    if (!across) return status(across.error().code(), "building the cross-node communicator: " + across.error().message());
    hier_node_ = std::move(in_node.value());
    hier_cross_ = std::move(across.value());
    hier_raw_[0] = hier_node_.get();
    hier_raw_[1] = hier_cross_.get();
    if (aborted_.load()) abort();
    CCLITE_INFO(log_, "hierarchical allreduce: node %d (%d ranks over %s), shard %d across %d nodes over %s", node,
                hier_node_->size(), hier_node_->size() > 1 ? hier_node_->transport_of((hier_node_->rank() + 1) % hier_node_->size()) : "self",
                lr, hier_cross_->size(), hier_cross_->size() > 1 ? hier_cross_->transport_of((hier_cross_->rank() + 1) % hier_cross_->size()) : "self");
    return {};
  }

CCLITE_SETUP_CODE_END

  // Reduce-scatter inside the node (shard `local rank` of local_size shards
  // lands in place), allreduce of that shard across nodes, allgather inside
  // the node; the count % local_size tail elements are allreduced in the node,
  // then across. avg sums at both levels and divides once at the end, so the
  // result is the reference's (two integer divisions would truncate twice).
  status run_hier_allreduce(const op_desc& d, const reduction& red, deadline until) {
    // The children's calls share our links: our predecessor's header first.
    CCLITE_TRY(this->settle_checks(until));
    if (!hier_node_) CCLITE_TRY(make_hier_children());
    communicator& in_node = *hier_node_;
    communicator& across = *hier_cross_;
    const std::size_t elem = red.elem_size, L = static_cast<std::size_t>(in_node.size());
    const std::size_t q = d.count / L, tail = d.count - q * L;
    const reduce_op inner = red.needs_divide ? reduce_op::sum : d.op;
    const auto* send = static_cast<const std::uint8_t*>(d.send);
    auto* recv = static_cast<std::uint8_t*>(d.recv);
    std::uint8_t* shard = recv + static_cast<std::size_t>(in_node.rank()) * q * elem;
    auto step = [](const char* what, status st) {
      return st.ok() ? st : status(st.code(), std::string("hierarchical allreduce, ") + what + ": " + st.message());
    };
    if (q) {
      CCLITE_TRY(step("reduce-scatter in the node", in_node.reduce_scatter(send, shard, q, d.type, inner)));
      CCLITE_TRY(step("allreduce across nodes", across.allreduce(shard, shard, q, d.type, inner)));
      if (red.needs_divide) red.divide(shard, q, size_);
      CCLITE_TRY(step("allgather in the node", in_node.allgather(shard, recv, q, d.type)));
    }
    if (tail) {
      std::uint8_t* t = recv + q * L * elem;
      CCLITE_TRY(local_copy(send + q * L * elem, t, tail * elem));
      CCLITE_TRY(step("tail in the node", in_node.allreduce(t, t, tail, d.type, inner)));
      CCLITE_TRY(step("tail across nodes", across.allreduce(t, t, tail, d.type, inner)));
      if (red.needs_divide) red.divide(t, tail, size_);
    }
    return {};
  }

  std::unique_ptr<communicator> hier_node_, hier_cross_;
  std::atomic<communicator*> hier_raw_[2] = {};  // for abort() from another thread

  std::uint64_t seq_ = 0;
  int splits_ = 0;
  bool nested_ = false;  // a hierarchical child: runs inside the parent's calls
  device_hook* device_ = nullptr;  // set_device_hook()
  status broken_;
  std::uint64_t logged_[collective_kind_count] = {};
  // Reused between calls so that steady-state collectives do not allocate.
  detail::work_queue queue_;  // last: its thread must stop before the rest is destroyed
};

}  // namespace cclite
