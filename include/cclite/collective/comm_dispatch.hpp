// cclite/collective/comm_dispatch.hpp - one call, from the work queue to an
// algorithm: the communicator's failure state (a broken communicator answers
// at once; a new failure is spread to the other ranks), the call-header
// exchange that catches mismatched calls (mismatch.hpp), the algorithm for
// each collective (the selector's choice, select.hpp) and the INFO log of it.
// communicator<...> (communicator.hpp, the public API) derives from this and
// hands its calls here through the work queue (work_queue.hpp).
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <cclite/algorithm/ring_allreduce.hpp>
#include <cclite/algorithm/p2p_envelope.hpp>
#include <cclite/algorithm/ring_broadcast.hpp>
#include <cclite/algorithm/ring_gather.hpp>
#include <cclite/collective/call_log.hpp>
#include <cclite/collective/comm_shared.hpp>
#include <cclite/collective/flight_recorder.hpp>
#include <cclite/collective/hier_allreduce.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/collective/work_queue.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/reduce.hpp>

namespace cclite::detail {

/// `Comm`: the communicator type deriving from this (its make_child() builds
/// the hierarchical algorithm's children).
template <class Comm, class... Transports>
class comm_dispatch : public comm_shared<Transports...>, public op_executor {
  using core = comm_shared<Transports...>;

 protected:
  using core::rank_; using core::size_; using core::log_; using core::topo_;
  using core::pool_; using core::comm_id_; using core::timeout; using core::chunk_bytes_; using core::aborted_;
  using core::with_links; using core::ensure_links; using core::run_allgather;
  using core::run_rooted_direct; using core::run_alltoall; using core::local_copy;
  using core::select_; using core::check_mismatch_; using core::hdr_; using core::coll_seq_;
  using core::hold_links; using core::run_window_allreduce; using core::run_direct_allreduce;
  using core::transport_of;

  using core::core;

  /// At close, an eager last small call is checked as a next call would
  /// (comm_shared.hpp, settle_small), so that a job whose last call was
  /// mismatched there (every rank passed itself as the broadcast's root)
  /// still hears of it: logged, since a destructor returns nothing. The same
  /// for a last call on the links that this rank left without its ring
  /// predecessor's header (comm_checks::probe_unchecked), as far as the
  /// peer's bytes have come by then: nothing may come, so it cannot wait.
  void settle_before_close() {
    if (!check_mismatch_ || !broken_.ok() || aborted_.load()) return;
    if (!this->small_unsettled() && hdr_.unchecked_peer < 0) return;
    const deadline until = deadline::after(timeout());
    std::unique_lock<std::mutex> hold(pool_->busy, std::defer_lock);
    if (!nested_ && !hold_links(hold, until).ok()) return;
    status st = this->small_unsettled() ? this->settle_small(until) : status();
    if (st.ok()) st = this->probe_unchecked();  // what has come by now (it cannot wait: nothing may come)
    if (!st.ok()) CCLITE_WARN(log_, "rank %d: closing the communicator: %s", rank_, st.to_string().c_str());
  }

  /// Aborts the hierarchical children too (their own flag: they may outlive us).
  void abort_children() noexcept { hier_.abort(); }
  /// Gives the hierarchical children this communicator's deadline (set_timeout()).
  void timeout_children(milliseconds t) noexcept { hier_.set_timeout(t); }

  status execute(const op_desc& d) override {
    const std::uint64_t seq = ++seq_;
    const bool traced = trace_.on(), was_usable = broken_.ok();
    const std::size_t slot = CCLITE_UNLIKELY(traced) ? trace_.begin(d, seq, algorithm_of(d)) : 0;
    status st = run_call(d, seq);
    if (CCLITE_UNLIKELY(traced)) traced_call_ended(slot, seq, st, was_usable);
    return st;
  }

  // One call, `seq`-th on this communicator.
  status run_call(const op_desc& d, std::uint64_t seq) {
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
      log_failure(broken_);
      return broken_;
    }
    // One deadline for the whole call (waiting for the family's links
    // included), read from the clock once: at 8 bytes a clock read is ~5% of
    // the call (kvm-clock, 26 ns).
    const deadline until = deadline::after(timeout());
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
      log_failure(st);
    }
    return st;
  }

  // dispatch() between the call-header exchange with the ring neighbours
  // (collective/mismatch.hpp); `started` = our header went out.
  status dispatch_checked(const op_desc& d, bool& started, deadline until) {
    if (CCLITE_UNLIKELY(hdr_.unchecked_peer >= 0) && check_mismatch_) {
      started = true;  // a mismatch of an earlier call: fatal, spread like the rest
      CCLITE_TRY(this->probe_unchecked());
      started = false;
    }
    if (this->small_direct_ready(d)) {  // no link traffic: the header rides with the data
      started = true;
      detail::call_header h;
      if (check_mismatch_) h = detail::make_call_header(d, size_, ++coll_seq_, comm_id_);
      linkless_ = {check_mismatch_ ? &h : nullptr, true};  // for run_small, through the call's runner
      status st = dispatch(d, until);
      linkless_ = {};
      return st;
    }
    // A call that leaves the small path after an eager small call checks that
    // call first (comm_shared.hpp, settle_small): nothing else would.
    if (check_mismatch_ && every_rank_calls(d.kind) && this->small_unsettled()) {
      started = true;
      CCLITE_TRY(this->settle_small(until));
    }
    if (!check_mismatch_ || size_ < 2 || !every_rank_calls(d.kind)) return dispatch(d, until);
    started = true;
    detail::call_header h = detail::make_call_header(d, size_, ++coll_seq_, comm_id_);
    if (this->window_call(d)) h.aux = detail::call_header::window_flag;  // a path of its own
    const bool riding = detail::headers_ride_with_data(d.kind);
    status st = this->begin_checks(h, riding, until);
    if (st.ok()) st = dispatch(d, until);
    if (st.ok()) st = this->end_checks(riding, until);
    if (st.code() == errc::timeout) st = this->explain_timeout(std::move(st));
    hdr_.active = false;
    return st;
  }

  // ---- algorithms per collective ------------------------------------------------------

  // shm-direct's small path for a call of kind K (comm_shared.hpp). Once the
  // node-wide small group exists, dispatch_checked sends small calls here
  // ahead of the header exchange (linkless_ holds their header); the first
  // small call of a job comes through the links and builds the group.
  template <collective_kind K>
  status run_small(const op_desc& d, deadline until) {
    if (linkless_.on) return this->template run_small_call<K>(d, linkless_.h, true, until);
    return this->template run_small_call<K>(d, hdr_.active ? &hdr_.out : nullptr, false, until);
  }
  struct {
    const detail::call_header* h = nullptr;
    bool on = false;
  } linkless_;

  // The call's own code: d.runner, which communicator sets to run_kind<K>.
  status dispatch(const op_desc& d, deadline until) {
    if (!d.runner)
      return make_error(errc::unsupported, "%s: a call built outside communicator has no algorithm", to_string(d.kind));
    return d.runner(*this, d, until);
  }

 public:
  /// What communicator stores in op_desc::runner for a call of kind K
  /// (static: a plain function pointer, no member-pointer thunks).
  template <collective_kind K>
  static status run_kind(op_executor& ex, const op_desc& d, deadline until) {
    return static_cast<comm_dispatch&>(ex).template dispatch_kind<K>(d, until);
  }

 protected:
  template <collective_kind K>
  status dispatch_kind(const op_desc& d, deadline until) {
    using ck = collective_kind;
    const std::size_t elem = K == ck::barrier ? 1 : size_of(d.type);
    const reduction red = d.kernels ? d.kernels(d.type, d.op) : reduction{};  // op.hpp: kernel_lookup
    const int n = size_, pos = topo_.ring_position(rank_);
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    const auto* send = static_cast<const std::uint8_t*>(d.send);
    auto* recv = static_cast<std::uint8_t*>(d.recv);
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes_ / elem);
    const std::size_t bytes = d.count * elem;
    auto ring = [&](auto&& fn) { return this->with_links(prev, next, elem, &red, until, fn); };
    if constexpr (detail::headers_ride_with_data(K)) this->set_overdue_hook();
    if constexpr (K == ck::allreduce) {
      if (n == 1) return local_copy(send, recv, bytes);
      if (this->small_direct(d)) return run_small<K>(d, until);
      if (auto* w = this->window_call(d)) return run_window_allreduce(*w, recv, d.count, red, until);
      switch (select_.choose(K, bytes, n)) {
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
    } else if constexpr (K == ck::broadcast) {
      if (n == 1) return {};
      if (this->small_direct(d)) return run_small<K>(d, until);
      if (select_.choose(K, bytes, n) == algorithm::tree) return this->run_tree_broadcast(recv, bytes, d.root, elem, until);
      const int rel = (pos - topo_.ring_position(d.root) + n) % n;
      return ring([&](auto& pr) { return ring_broadcast(pr, recv, bytes, n, rel); });
    } else if constexpr (K == ck::barrier) {
      if (n == 1) return {};
      if (this->small_direct(d)) return run_small<K>(d, until);
      return ring([&](auto& pr) { return ring_barrier(pr, n, pos); });
    } else if constexpr (K == ck::reduce) {
      if (d.count && !send) return make_error(errc::invalid_argument, "reduce: null send buffer");
      if (d.count && rank_ == d.root && !recv) return make_error(errc::invalid_argument, "reduce: null recv buffer on the root");
      if (n == 1) return local_copy(send, recv, bytes);
      if (this->small_direct(d)) return run_small<K>(d, until);
      if (select_.choose(K, bytes, n) == algorithm::tree)
        return this->run_tree_reduce(send, recv, d.count, d.root, red, until);
      const int rel = (pos - topo_.ring_position(d.root) + n) % n;
      return ring([&](auto& pr) { return chain_reduce(pr, send, recv, d.count, elem, red, n, rel); });
    } else if constexpr (K == ck::allgather || K == ck::allgatherv) {
      if constexpr (K == ck::allgather)
        if (n > 1 && this->small_direct(d)) return run_small<K>(d, until);
      return run_allgather(d, send, recv, elem, until);
    } else if constexpr (K == ck::reduce_scatter) {
      if (n == 1) return local_copy(send, recv, bytes);
      if (this->small_direct(d)) return run_small<K>(d, until);
      const ring_blocks b{topo_.ring().data(), nullptr, nullptr, d.count};  // equal blocks
      return ring([&](auto& pr) { return ring_reduce_scatter(pr, send, recv, b, elem, red, n, pos, rank_, chunk); });
    } else if constexpr (K == ck::reduce_scatterv) {
      return this->run_reduce_scatterv(d, send, recv, elem, red, until);
    } else if constexpr (K == ck::scan || K == ck::exscan) {
      if (n == 1) return K == ck::scan ? local_copy(send, recv, bytes) : status();
      if (this->small_direct(d)) return run_small<K>(d, until);
      return this->run_scan(K == ck::exscan, select_.choose(K, bytes, n) == algorithm::rd, send, recv, d.count, red,
                            until);
    } else if constexpr (K == ck::gather || K == ck::scatter || K == ck::gatherv || K == ck::scatterv) {
      if constexpr (K == ck::gather || K == ck::scatter)
        if (n > 1 && this->small_direct(d)) return run_small<K>(d, until);
      return run_rooted_direct(d, send, recv, bytes, elem, until);
    } else if constexpr (K == ck::alltoall || K == ck::alltoallv) {
      if constexpr (K == ck::alltoall)
        if (n > 1 && this->small_direct(d)) return run_small<K>(d, until);
      return run_alltoall(d, send, recv, elem, until);
    } else if constexpr (K == ck::group) {
      return this->run_group(d, until);
    } else {
      static_assert(K == ck::send || K == ck::recv || K == ck::sendrecv, "a collective_kind without an algorithm");
      const int dst = K == ck::recv ? -1 : d.root;
      const int src = K == ck::send ? -1 : K == ck::recv ? d.root : d.peer2;
      const std::size_t sbytes = K == ck::recv ? 0 : bytes;
      const std::size_t rbytes = K == ck::send ? 0 : K == ck::recv ? bytes : d.count2 * elem;
      if (dst == rank_ || src == rank_) {  // to or from ourselves: a copy
        if (dst == rank_ && src == rank_) return local_copy(send, recv, std::min(sbytes, rbytes));
        return make_error(errc::invalid_argument, "%s: a rank cannot send to itself without receiving from itself", to_string(K));
      }
      int peers[2] = {dst < 0 ? src : dst, src < 0 ? dst : src};
      CCLITE_TRY(ensure_links(peers, 2, until));
      return this->with_links(peers[1], peers[0], elem, nullptr, until, [&](auto& pr) {
        return point_to_point(pr, d.type, send, sbytes, dst, recv, rbytes, src);
      });
    }
  }

  // send / recv / sendrecv over primitives `pr` (prev = src, next = dst;
  // -1: that direction is absent). Each direction's data goes behind an
  // envelope (p2p_envelope.hpp), checked before the first byte of data is
  // taken, unless CCLITE_CHECK_MISMATCH=0.
  template <class Prims>
  status point_to_point(Prims& pr, dtype t, const std::uint8_t* send, std::size_t sbytes, int dst,
                        std::uint8_t* recv, std::size_t rbytes, int src) {
    // Each direction's last send carries the stream's end pad (will_finish,
    // primitives.hpp): a 4-byte message costs one trip, not two.
    if (!check_mismatch_) {
      pr.will_finish();
      CCLITE_TRY(pr.sendrecv(send, sbytes, recv, rbytes));
      return pr.finish();
    }
    using envelope = detail::p2p_envelope;
    const std::size_t elem = size_of(t);
    std::uint8_t out_env[envelope::wire_bytes], in_env[envelope::wire_bytes];
    const std::size_t ob = dst >= 0 ? envelope::wire_bytes : 0, ib = src >= 0 ? envelope::wire_bytes : 0;
    if (ob) envelope::encode(out_env, t, sbytes / elem);
    if (!ib || ob + sbytes <= chunk_bytes_) {
      // Our message fits the link buffer (or we only send): out at once,
      // envelope and data as one stream, then the peer's, so a small exchange
      // costs one trip.
      pr.will_finish();
      CCLITE_TRY(pr.send_prefixed(out_env, ob, send, sbytes));
      if (ib) {
        CCLITE_TRY(pr.recv(in_env, ib));
        CCLITE_TRY(envelope::check(in_env, t, rbytes / elem, src));
        CCLITE_TRY(pr.recv(recv, rbytes));
      }
    } else {  // both directions at once, envelopes first (no deadlock past the buffer)
      CCLITE_TRY(pr.sendrecv(out_env, ob, in_env, ib));
      CCLITE_TRY(envelope::check(in_env, t, rbytes / elem, src));
      pr.will_finish();
      CCLITE_TRY(pr.sendrecv(send, sbytes, recv, rbytes));
    }
    return pr.finish();
  }

  // "rank 3: allreduce #12 (...)". A hierarchical child's calls are steps of
  // its parent's, which names the rank and the call around them: "rank 3:
  // allreduce #12 (...): hierarchical allreduce, in the node: allgather
  // (...): <cause>". Its own numbers (rank 1 of a cross-node communicator
  // the user never made, its 24th allgather) would read as another process
  // and another call.
  std::string describe_call(const op_desc& d, std::uint64_t seq) const {
    return detail::describe_call(d, seq, nested_ ? -1 : rank_);
  }
  // A failed call at WARN; a hierarchical child's at INFO, since the parent's
  // call fails with it and logs the whole message (this one inside).
  void log_failure(const status& st) const {
    if (nested_) CCLITE_INFO(log_, "%s", st.to_string().c_str());
    else CCLITE_WARN(log_, "%s", st.to_string().c_str());
  }

  // What runs call `d` of `bytes` (the same choice dispatch() makes), in
  // words: the INFO line's and the flight recorder's.
  const char* algorithm_of(const op_desc& d, std::size_t bytes) const {
    detail::call_route r;
    r.local = size_ == 1;
    r.in_window = size_ > 1 && this->window_call(d) != nullptr;
    r.small_direct = this->small_direct(d);
    r.algo = select_.choose(d.kind, bytes, size_);
    r.hier_possible = select_.hier_possible();
    r.direct_possible = select_.direct_possible();
    return detail::describe_algorithm(d.kind, r);
  }
  const char* algorithm_of(const op_desc& d) const { return algorithm_of(d, detail::call_bytes(d)); }

  // INFO: the algorithm of each call, once per (collective, power-of-two size class).
  void log_call(const op_desc& d) {
    if (!log_.enabled(log_level::info)) return;
    std::size_t bytes = 0;
    int cls = 0;
    if (logged_.first(d, bytes, cls)) {
      CCLITE_INFO(log_, "%s: %zu bytes (class <= 2^%d): algorithm %s, chunk %zu bytes, ring %s/%s",
                  to_string(d.kind), bytes, cls, algorithm_of(d, bytes), chunk_bytes_,
                  size_ > 1 ? transport_of(topo_.ring_prev(rank_)) : "self",
                  size_ > 1 ? transport_of(topo_.ring_next(rank_)) : "self");
    }
    CCLITE_TRACE(log_, "%s #%" PRIu64 ": count %zu", to_string(d.kind), seq_, d.count);
  }

  // The hierarchical allreduce (hier_allreduce.hpp) on this communicator's
  // two children, built on the first call that picks it.
  status run_hier_allreduce(const op_desc& d, const reduction& red, deadline until) {
    // The children's calls share our links: our predecessor's header first.
    // Their set-up waits for every rank through the store and connects
    // links, so the first time every rank also agrees that all are here
    // and alive (agree_before_connecting).
    CCLITE_TRY(hier_.built() ? this->settle_checks(until) : this->agree_on_call(until));
    if (!hier_.built()) {
      comm_options o;
      o.timeout = timeout();
      o.chunk_bytes = chunk_bytes_;
      CCLITE_TRY(hier_.build(topo_, rank_, log_, [&](const std::vector<int>& ranks, const std::string& where) {
        return static_cast<Comm*>(this)->make_child(ranks, where, o, true);
      }));
      if (aborted_.load()) hier_.abort();
    }
    return hier_.run(d, red, size_);
  }


CCLITE_SETUP_CODE_BEGIN
  // The flight recorder's end of call `seq`; if it made this communicator
  // unusable, the recorder's file, for cclite-trace (flight_recorder.hpp),
  // with every live communicator of the process in it.
  CCLITE_NOINLINE void traced_call_ended(std::size_t slot, std::uint64_t seq, const status& st, bool was_usable) {
    trace_.end(slot, seq, st);
    if (!was_usable || broken_.ok()) return;
    auto path = dump_traces(broken_.to_string());
    if (path) CCLITE_WARN(log_, "flight recorder: last calls written to %s (read with cclite-trace)", path.value().c_str());
    else CCLITE_WARN(log_, "%s", path.error().to_string().c_str());
  }
CCLITE_SETUP_CODE_END

  hier_allreduce<Comm> hier_;
  flight_recorder trace_;  // on when CCLITE_TRACE_BUFFER > 0 (communicator::finish_init)
  std::uint64_t seq_ = 0;  // calls executed, for error messages
  bool nested_ = false;  // a hierarchical child: runs inside the parent's calls
  status broken_;  // the error that made this communicator unusable
  call_log logged_;
};

}  // namespace cclite::detail
