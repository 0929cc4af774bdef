// cclite/collective/op.hpp - one collective call as data, and its argument checks.
//
// Every public call of the communicator becomes an op_desc, is checked here on
// the calling rank (errc::invalid_argument, the communicator stays usable),
// then queued and run in issue order (work_queue.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

enum class collective_kind : std::uint8_t {
  allreduce, broadcast, barrier, reduce, allgather, reduce_scatter, alltoall, gather, scatter,
  send, recv, sendrecv, allgatherv, alltoallv,
  group,  ///< the sends and receives of communicator::group_start() .. group_end()
  gatherv, scatterv, reduce_scatterv,  // after group: the kinds' numbers are on the wire (call headers) and in trace files
  scan, exscan,  ///< prefix reductions (MPI_Scan, MPI_Exscan)
};
inline constexpr int collective_kind_count = 20;

inline const char* to_string(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::allreduce: return "allreduce";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::barrier: return "barrier";
    case collective_kind::reduce: return "reduce";
    case collective_kind::allgather: return "allgather";
    case collective_kind::reduce_scatter: return "reduce_scatter";
    case collective_kind::alltoall: return "alltoall";
    case collective_kind::gather: return "gather";
    case collective_kind::scatter: return "scatter";
    case collective_kind::send: return "send";
    case collective_kind::recv: return "recv";
    case collective_kind::sendrecv: return "sendrecv";
    case collective_kind::allgatherv: return "allgatherv";
    case collective_kind::alltoallv: return "alltoallv";
    case collective_kind::group: return "group";
    case collective_kind::gatherv: return "gatherv";
    case collective_kind::scatterv: return "scatterv";
    case collective_kind::reduce_scatterv: return "reduce_scatterv";
    case collective_kind::scan: return "scan";
    case collective_kind::exscan: return "exscan";
  }
  return "?";
}

/// True for the collectives that reduce (their call takes a reduce_op).
inline constexpr bool reduces(collective_kind k) noexcept {
  return k == collective_kind::allreduce || k == collective_kind::reduce || k == collective_kind::reduce_scatter ||
         k == collective_kind::reduce_scatterv || k == collective_kind::scan || k == collective_kind::exscan;
}

/// True for the collectives, which every rank of the communicator calls (and
/// numbers alike: the call header's seq, the flight recorder's coll); false for
/// point-to-point calls and groups of them.
inline constexpr bool every_rank_calls(collective_kind k) noexcept {
  return k != collective_kind::send && k != collective_kind::recv && k != collective_kind::sendrecv &&
         k != collective_kind::group;
}

struct op_desc;

struct p2p_transfer;  // algorithm/p2p_group.hpp

namespace detail {
class op_executor;  // work_queue.hpp
/// The code that runs one kind of call on a communicator (`ex`). Each public
/// method of communicator sets the one for its kind, so a program compiles
/// the algorithms of the collectives it calls and not those of all 14
/// (hello_allreduce: 12 KiB and 0.6 s of compile time less, bench/footprint.sh).
using op_runner = status (*)(op_executor& ex, const op_desc& d, deadline until);

/// The reduction kernels of a reducing call, by the same reasoning: a typed
/// call (T* buffers) stores kernels_of<T>, so a program compiles the kernels
/// of the element types it reduces (hello_allreduce: float's 13 kernels of
/// 112, 20 KiB and ~0.3 s of compile time less); a call with a run-time dtype
/// stores reduction_for, which holds every dtype's.
using kernel_lookup = reduction (*)(dtype t, reduce_op op) noexcept;
template <class T>
reduction kernels_of(dtype, reduce_op op) noexcept {
  return make_reduction<T>(op);  // the caller set t = dtype_of_v<T>
}
}  // namespace detail

/// One call, as queued. Pointers are the caller's and must stay valid until
/// the call completed (for *_async: until work::wait() returned).
struct op_desc {
  collective_kind kind = collective_kind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  ///< elements (per rank for allgather/reduce_scatter/alltoall/gather/scatter)
  dtype type = dtype::uint8;
  reduce_op op = reduce_op::sum;
  int root = 0;  ///< root, or the peer of send/recv, or the destination of sendrecv
  // sendrecv: the source rank and the receive count
  int peer2 = 0;
  std::size_t count2 = 0;
  // v-variants: per-rank element counts and displacements (size() entries each)
  /// allgatherv, reduce_scatterv and gatherv (on the root): recv counts; alltoallv and scatterv (on the
  /// root): send counts
  const std::size_t* counts = nullptr;
  const std::size_t* displs = nullptr;   ///< the displacements that go with `counts`
  const std::size_t* rcounts = nullptr;  ///< alltoallv: recv counts
  const std::size_t* rdispls = nullptr;  ///< alltoallv: recv displs
  /// Set by communicator (the call's algorithms); null in a call built
  /// elsewhere, e.g. for a device hook, which runs it its own way.
  detail::op_runner runner = nullptr;
  /// Set by communicator for the kinds that reduce (reduces()); null for
  /// the other kinds, whose reduction is the empty table.
  detail::kernel_lookup kernels = nullptr;
  /// group: the `count` transfers, checked when they were issued.
  const p2p_transfer* transfers = nullptr;

  /// The common fields at once (the v-variants and sendrecv add theirs).
  static op_desc of(collective_kind k, const void* send, void* recv, std::size_t count, dtype t,
                    reduce_op op = reduce_op::sum, int root = 0) {
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
};

namespace detail {

inline bool overflows(std::size_t count, std::size_t times, dtype t) {
  const std::size_t limit = (SIZE_MAX >> 4) / size_of(t);
  return times != 0 && count > limit / times;
}

/// A call's send and recv bytes ([send, +sbytes), [recv, +rbytes)) either
/// do not overlap or are its in-place form, `send + s_off == recv + r_off`
/// (`in_place` says it in the caller's terms; null: the call has none). Any
/// other overlap would read bytes the call has already overwritten (MPI
/// forbids aliased buffers for the same reason): invalid_argument, never
/// wrong results.
CCLITE_NOINLINE inline status check_aliasing(const char* name, const void* send, std::size_t sbytes,
                                             std::size_t s_off, const void* recv, std::size_t rbytes,
                                             std::size_t r_off, const char* in_place) {
  const auto s = reinterpret_cast<std::uintptr_t>(send), r = reinterpret_cast<std::uintptr_t>(recv);
  if (!send || !recv || !sbytes || !rbytes || s >= r + rbytes || r >= s + sbytes) return {};
  if (in_place && s + s_off == r + r_off) return {};
  return make_error(errc::invalid_argument,
                    "%s: the send buffer (%p, %zu bytes) and the recv buffer (%p, %zu bytes) overlap; %s%s", name,
                    send, sbytes, recv, rbytes, in_place ? "they must be disjoint, or in place: " : "they must be disjoint",
                    in_place ? in_place : "");
}

/// Moves `end` to the end of a v-variant block (displacement + count, both
/// already checked against overflow) if it reaches further: the checks'
/// loops over the counts find the buffer's extent as they go.
inline void extend(std::size_t& end, std::size_t count, std::size_t displ) {
  if (count != 0) end = std::max(end, displ + count);
}

/// Receive blocks (`counts[r]` elements at `displs[r]`, r < n) that overlap
/// each other: two peers would write the same elements, which one lands last
/// depends on timing, and a ring that forwards out of the output passes the
/// mixture on (MPI calls such arguments erroneous and leaves them unchecked).
/// invalid_argument naming both ranks. One pass when the non-empty blocks
/// ascend with the rank (the usual layout); otherwise a sorted copy of their
/// order (allocated: only for such layouts). Null arrays and overflowing
/// blocks pass here: validate() reports them.
CCLITE_NOINLINE inline status check_blocks_disjoint(const char* name, const std::size_t* counts,
                                                    const std::size_t* displs, std::size_t n) {
  if (!counts || !displs) return {};
  for (std::size_t r = 0; r < n; ++r)
    if (counts[r] > SIZE_MAX - displs[r]) return {};
  std::size_t end = 0;  // the furthest element the blocks so far reach
  bool ascending = true;
  for (std::size_t r = 0; r < n && ascending; ++r) {
    if (counts[r] == 0) continue;
    ascending = displs[r] >= end;
    end = displs[r] + counts[r];
  }
  if (ascending) return {};
  std::vector<std::size_t> order;
  for (std::size_t r = 0; r < n; ++r)
    if (counts[r] != 0) order.push_back(r);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return displs[a] != displs[b] ? displs[a] < displs[b] : a < b;
  });
  std::size_t far = order.front();  // of the blocks so far, the one reaching furthest
  for (std::size_t i = 1; i < order.size(); ++i) {
    const std::size_t r = order[i];
    if (displs[r] < displs[far] + counts[far]) {
      const std::size_t a = std::min(r, far), b = std::max(r, far);
      return make_error(errc::invalid_argument,
                        "%s: the recv blocks of rank %zu (displacement %zu, count %zu) and rank %zu "
                        "(displacement %zu, count %zu) overlap: two peers would write the same elements",
                        name, a, displs[a], counts[a], b, displs[b], counts[b]);
    }
    if (displs[r] + counts[r] > displs[far] + counts[far]) far = r;
  }
  return {};
}

/// allgatherv's receive blocks (counts / displs) and alltoallv's (the recv
/// counts / displs) must not overlap (check_blocks_disjoint); gatherv's root
/// checks its own in validate_root_of_v. Called by those calls only, so that
/// other programs do not compile it.
inline status validate_recv_blocks(const op_desc& d, int size) {
  const bool all = d.kind == collective_kind::allgatherv;
  return check_blocks_disjoint(to_string(d.kind), all ? d.counts : d.rcounts, all ? d.displs : d.rdispls,
                               size > 0 ? static_cast<std::size_t>(size) : 0);
}

/// Checks gatherv's and scatterv's arrays on their root (`counts` and
/// `displs` matter there only, as in MPI): present, in range, a buffer for
/// any count > 0, and the root's own count equal to its send / recv count.
/// Called by those two calls only (not validate()), so that a program that
/// does not use them does not compile it. Nothing to check off the root.
inline status validate_root_of_v(const op_desc& d, int rank, int size) {
  if (rank != d.root || !is_valid(d.type)) return {};  // an invalid dtype: validate() says so
  const char* name = to_string(d.kind);
  const bool gather = d.kind == collective_kind::gatherv;
  if (!d.counts || !d.displs)
    return make_error(errc::invalid_argument, "%s: null %s_counts or displacements array on the root", name,
                      gather ? "recv" : "send");
  const void* all = gather ? static_cast<const void*>(d.recv) : d.send;
  std::size_t extent = 0;  // elements of `all` the blocks reach
  for (int r = 0; r < size; ++r) {
    if (overflows(d.counts[r], 1, d.type) || overflows(d.displs[r], 1, d.type))
      return make_error(errc::invalid_argument, "%s: count or displacement of rank %d overflows", name, r);
    if (d.counts[r] && !all)
      return make_error(errc::invalid_argument, "%s: null %s buffer on the root with %s_counts[%d] = %zu", name,
                        gather ? "recv" : "send", gather ? "recv" : "send", r, d.counts[r]);
    extend(extent, d.counts[r], d.displs[r]);
  }
  if (d.counts[d.root] != d.count)
    return make_error(errc::invalid_argument, "%s: the root's own %s_counts[%d] = %zu but its %s_count is %zu",
                      name, gather ? "recv" : "send", d.root, d.counts[d.root], gather ? "send" : "recv", d.count);
  const std::size_t elem = size_of(d.type), whole = extent * elem,
                    mine = d.displs[d.root] * elem, own = d.count * elem;
  if (gather) {
    CCLITE_TRY(check_blocks_disjoint(name, d.counts, d.displs, static_cast<std::size_t>(size)));
    return check_aliasing(name, d.send, own, 0, d.recv, whole, mine, "send == recv + recv_displs[root]");
  }
  return check_aliasing(name, d.send, whole, mine, d.recv, own, 0, "recv == send + send_displs[root]");
}

/// Checks reduce_scatterv's counts array (rank r's block: counts[r]
/// elements, back to back in send): present, the total in range, a send
/// buffer when it is not 0. Its count (this rank's block) and recv are
/// validate()'s. Called by reduce_scatterv only, as validate_root_of_v.
inline status validate_counts_of_rsv(const op_desc& d, int rank, int size) {
  if (!is_valid(d.type)) return {};  // validate() says so
  const char* name = to_string(d.kind);
  if (!d.counts) return make_error(errc::invalid_argument, "%s: null recv_counts array", name);
  std::size_t total = 0, before = 0;
  for (int r = 0; r < size; ++r) {
    if (overflows(d.counts[r], 1, d.type) || overflows(total + d.counts[r], 1, d.type))
      return make_error(errc::invalid_argument, "%s: the counts overflow the byte size at rank %d", name, r);
    if (r == rank) before = total;
    total += d.counts[r];
  }
  if (total && !d.send) return make_error(errc::invalid_argument, "%s: null send buffer with counts > 0", name);
  const std::size_t elem = size_of(d.type);
  return check_aliasing(name, d.send, total * elem, before * elem, d.recv, d.count * elem, 0,
                        "recv == send + (recv_counts[0] + ... + recv_counts[rank() - 1])");
}

/// Checks what one rank can check alone: `rank` of `size` ranks.
inline status validate(const op_desc& d, int rank, int size) {
  const char* name = to_string(d.kind);
  if (d.kind == collective_kind::barrier || d.kind == collective_kind::group) return {};
  if (!is_valid(d.type)) return make_error(errc::invalid_argument, "%s: invalid dtype %d", name, static_cast<int>(d.type));
  const bool reducing = reduces(d.kind);
  if (reducing && !is_valid(d.op))
    return make_error(errc::invalid_argument, "%s: invalid reduce_op %d", name, static_cast<int>(d.op));
  if (reducing && !applies_to(d.op, d.type))
    return make_error(errc::invalid_argument, "%s: %s takes integer dtypes, not %s", name, to_string(d.op),
                      to_string(d.type));
  const bool rooted = d.kind == collective_kind::broadcast || d.kind == collective_kind::reduce ||
                      d.kind == collective_kind::gather || d.kind == collective_kind::scatter ||
                      d.kind == collective_kind::gatherv || d.kind == collective_kind::scatterv;
  const bool p2p = d.kind == collective_kind::send || d.kind == collective_kind::recv ||
                   d.kind == collective_kind::sendrecv;
  if ((rooted || p2p) && (d.root < 0 || d.root >= size))
    return make_error(errc::invalid_argument, "%s: %s %d out of range [0, %d)", name, rooted ? "root" : "peer", d.root, size);
  if (d.kind == collective_kind::sendrecv && (d.peer2 < 0 || d.peer2 >= size))
    return make_error(errc::invalid_argument, "sendrecv: source %d out of range [0, %d)", d.peer2, size);
  const std::size_t n = static_cast<std::size_t>(size);
  const bool per_rank = d.kind == collective_kind::allgather || d.kind == collective_kind::reduce_scatter ||
                        d.kind == collective_kind::alltoall || d.kind == collective_kind::gather ||
                        d.kind == collective_kind::scatter;
  if (overflows(d.count, per_rank ? n : 1, d.type) || overflows(d.count2, 1, d.type))
    return make_error(errc::invalid_argument, "%s: count %zu overflows the byte size", name, d.count);
  if (d.kind == collective_kind::allgatherv || d.kind == collective_kind::alltoallv) {
    // In-place alltoallv (send == recv) uses the recv counts both ways (MPI_IN_PLACE).
    const bool in_place = d.kind == collective_kind::alltoallv && d.send && d.send == d.recv;
    if (((!d.counts || !d.displs) && !in_place) ||
        (d.kind == collective_kind::alltoallv && (!d.rcounts || !d.rdispls)))
      return make_error(errc::invalid_argument, "%s: null counts or displacements array", name);
    std::size_t extent = 0, r_extent = 0;  // elements the counts' / rcounts' blocks reach
    for (std::size_t r = 0; r < n; ++r) {
      if (in_place) {
        if (overflows(d.rcounts[r], 1, d.type) || overflows(d.rdispls[r], 1, d.type))
          return make_error(errc::invalid_argument, "%s: count or displacement of rank %zu overflows", name, r);
        continue;
      }
      if (overflows(d.counts[r], 1, d.type) || overflows(d.displs[r], 1, d.type) ||
          (d.rcounts && (overflows(d.rcounts[r], 1, d.type) || overflows(d.rdispls[r], 1, d.type))))
        return make_error(errc::invalid_argument, "%s: count or displacement of rank %zu overflows", name, r);
      if (d.rcounts && d.rcounts[r] && !d.recv)
        return make_error(errc::invalid_argument, "%s: null recv buffer with counts > 0", name);
      if (d.counts[r] && (d.kind == collective_kind::alltoallv ? !d.send : !d.recv))
        return make_error(errc::invalid_argument, "%s: null buffer with counts > 0", name);
      extend(extent, d.counts[r], d.displs[r]);
      if (d.rcounts) extend(r_extent, d.rcounts[r], d.rdispls[r]);
    }
    if (in_place) return {};
    const std::size_t elem = size_of(d.type);
    if (d.kind == collective_kind::allgatherv)
      return check_aliasing(name, d.send, d.count * elem, 0, d.recv, extent * elem, d.displs[rank] * elem,
                            "send == recv + displs[rank()]");
    return check_aliasing(name, d.send, extent * elem, 0, d.recv, r_extent * elem, 0, "send == recv");
  }
  if (d.count == 0 && d.count2 == 0) return {};
  switch (d.kind) {
    case collective_kind::send:
      if (!d.send) return make_error(errc::invalid_argument, "send: null buffer with count %zu", d.count);
      return {};
    case collective_kind::recv:
      if (!d.recv) return make_error(errc::invalid_argument, "recv: null buffer with count %zu", d.count);
      return {};
    case collective_kind::sendrecv:
      if ((d.count && !d.send) || (d.count2 && !d.recv))
        return make_error(errc::invalid_argument, "sendrecv: null buffer with a count > 0");
      return check_aliasing(name, d.send, d.count * size_of(d.type), 0, d.recv, d.count2 * size_of(d.type), 0, nullptr);
    case collective_kind::broadcast:
      if (!d.recv) return make_error(errc::invalid_argument, "broadcast: null buffer with count %zu", d.count);
      return {};
    case collective_kind::reduce: case collective_kind::gather: case collective_kind::scatter: {
      // Which buffers matter depends on root: null ones are checked when run.
      // Off the root only one of them is read or written.
      if (rank != d.root) return {};
      const std::size_t b = d.count * size_of(d.type), all = b * n, mine = b * static_cast<std::size_t>(rank);
      if (d.kind == collective_kind::reduce) return check_aliasing(name, d.send, b, 0, d.recv, b, 0, "send == recv");
      if (d.kind == collective_kind::gather)
        return check_aliasing(name, d.send, b, 0, d.recv, all, mine, "send == recv + root * count on the root");
      return check_aliasing(name, d.send, all, mine, d.recv, b, 0, "recv == send + root * count on the root");
    }
    case collective_kind::gatherv:  // the rank's own block; the root's arrays: validate_root_of_v
      if (!d.send) return make_error(errc::invalid_argument, "gatherv: null send buffer with send_count %zu", d.count);
      return {};
    case collective_kind::scatterv:
      if (!d.recv) return make_error(errc::invalid_argument, "scatterv: null recv buffer with recv_count %zu", d.count);
      return {};
    default: {
      if (!d.send || !d.recv)
        return make_error(errc::invalid_argument, "%s: null buffer with count %zu", name, d.count);
      if (d.kind == collective_kind::reduce_scatterv) return {};  // validate_counts_of_rsv()
      // allreduce, scan, exscan: count both ways; alltoall: count per rank
      // both ways; allgather: count in, count per rank out; reduce_scatter
      // the other way round.
      const std::size_t b = d.count * size_of(d.type), all = b * n, mine = b * static_cast<std::size_t>(rank);
      if (d.kind == collective_kind::allgather)
        return check_aliasing(name, d.send, b, 0, d.recv, all, mine, "send == recv + rank() * count");
      if (d.kind == collective_kind::reduce_scatter)
        return check_aliasing(name, d.send, all, mine, d.recv, b, 0, "recv == send + rank() * count");
      const std::size_t both = d.kind == collective_kind::alltoall ? all : b;
      return check_aliasing(name, d.send, both, 0, d.recv, both, 0, "send == recv");
    }
  }
}

}  // namespace detail
}  // namespace cclite
