// bench/common/coll_sweep.hpp - the size sweep of the perf programs for the
// collectives other than allreduce: coll_perf (cclite) and its MPI twin
// (compare_mpi -C <collective>) run the same loop on the same buffer shapes and
// inputs, and check the results against the same expected values.
//
// nccl-tests' sizes: allgather and gather size = the gathered output,
// reduce_scatter and scatter size = the input, alltoall size = one rank's send
// buffer ("spread" collectives, busbw = algbw (n-1)/n); broadcast, reduce,
// sendrecv, scan and exscan: size = the buffer, busbw = algbw (nccl-tests has no
// scan; its chain carries the whole buffer over each link once, as broadcast's).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cclite/collective/op.hpp>
#include <cclite/core/clock.hpp>

#include "common/perf_args.hpp"
#include "common/perf_check.hpp"

namespace bench {

/// One call of a sweep: its element counts.
struct coll_shape {
  std::size_t count;       // elements per call argument
  std::size_t send_elems;  // this rank's send buffer
  std::size_t recv_elems;  // this rank's recv buffer
};

/// The collective being measured and this rank's place in it.
struct coll_case {
  collective_kind kind;
  int n, me, root;
};

/// Whether `k`'s size counts every rank's block (busbw factor (n-1)/n).
inline bool spread(collective_kind k) {
  return k == collective_kind::allgather || k == collective_kind::reduce_scatter || k == collective_kind::alltoall ||
         k == collective_kind::gather || k == collective_kind::scatter;
}

inline coll_shape shape_for(collective_kind k, std::size_t bytes, std::size_t esz, std::size_t n) {
  const std::size_t per_rank = bytes / esz / n;
  switch (k) {
    case collective_kind::allgather: case collective_kind::gather: return {per_rank, per_rank, per_rank * n};
    case collective_kind::reduce_scatter: case collective_kind::scatter: return {per_rank, per_rank * n, per_rank};
    case collective_kind::alltoall: return {per_rank, per_rank * n, per_rank * n};
    default: return {bytes / esz, bytes / esz, bytes / esz};
  }
}

/// Expected recv element i on rank c.me (inputs: input(rank, i), perf_check.hpp).
inline double coll_want(const coll_case& c, std::size_t i, std::size_t count, reduce_op op) {
  switch (c.kind) {
    case collective_kind::allgather: case collective_kind::gather: return input(static_cast<int>(i / count), i % count);
    case collective_kind::scatter: return input(c.root, c.me * count + i);
    case collective_kind::reduce_scatter: return expected(op, c.n, c.me * count + i);
    case collective_kind::alltoall: return input(static_cast<int>(i / count), c.me * count + i % count);
    case collective_kind::broadcast: return input(c.root, i);
    case collective_kind::reduce: return expected(op, c.n, i);
    case collective_kind::scan: return expected(op, c.me + 1, i);      // ranks 0..me
    case collective_kind::exscan: return expected(op, c.me, i);        // ranks 0..me-1
    default: return input((c.me + c.n - 1) % c.n, i);  // sendrecv: from the previous rank
  }
}

/// This rank's known inputs: send block p of alltoall holds p*count.. of input();
/// broadcast's buffer (recv) holds the root's data on the root, -1 elsewhere.
template <class T>
void coll_fill(const coll_case& c, const coll_shape& s, void* send, void* recv) {
  T* sb = static_cast<T*>(send);
  for (std::size_t i = 0; i < s.send_elems; ++i) sb[i] = from_double<T>(input(c.me, i));
  if (c.kind == collective_kind::broadcast) {
    T* rb = static_cast<T*>(recv);
    for (std::size_t i = 0; i < s.recv_elems; ++i) rb[i] = from_double<T>(c.me == c.root ? input(c.root, i) : -1.0);
  }
}

template <class T>
std::size_t coll_wrong(const coll_case& c, const coll_shape& s, const void* recv, reduce_op op) {
  if ((c.kind == collective_kind::reduce || c.kind == collective_kind::gather) && c.me != c.root) return 0;
  if (c.kind == collective_kind::exscan && c.me == 0) return 0;  // rank 0's output is undefined
  const T* t = static_cast<const T*>(recv);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < s.recv_elems; ++i)
    if (to_double(t[i]) != to_double(from_double<T>(coll_want(c, i, s.count, op)))) ++bad;
  return bad;
}

/// For every size of `a`: `warmup` calls, a barrier, `iters` timed calls (the
/// slowest rank's mean), and with -c 1 one more call on known inputs whose
/// wrong elements are summed over the ranks; one table row per size, out of
/// place only (both column groups show it). Returns the wrong elements of
/// every size. `ops`:
///   once(shape)                run one call (send -> recv; broadcast on recv)
///   barrier()
///   max_over_ranks(double&), sum_over_ranks(std::uint64_t&)
template <class Ops>
std::size_t coll_sweep(const perf_args& a, perf_table& table, const coll_case& c, void* send, void* recv,
                       Ops& ops) {
  const std::size_t esz = cclite::size_of(a.type), n = static_cast<std::size_t>(c.n);
  std::size_t total_wrong = 0;
  for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes = next_size(bytes, a)) {
    const coll_shape s = shape_for(c.kind, bytes, esz, n);
    const bool sp = spread(c.kind);
    perf_row row{sp ? s.count * n * esz : s.count * esz, sp ? s.count * n : s.count};
    for (int i = 0; i < a.warmup; ++i) ops.once(s);
    ops.barrier();
    const double t0 = cclite::now_seconds();
    for (int i = 0; i < a.iters; ++i) ops.once(s);
    double us = (cclite::now_seconds() - t0) * 1e6 / a.iters;
    ops.max_over_ranks(us);
    std::uint64_t wrong = 0;
    if (a.check) {
      by_dtype(a.type, [&](auto tag) { coll_fill<decltype(tag)>(c, s, send, recv); });
      ops.once(s);
      wrong = by_dtype(a.type, [&](auto tag) { return coll_wrong<decltype(tag)>(c, s, recv, a.op); });
      ops.sum_over_ranks(wrong);
    }
    total_wrong += static_cast<std::size_t>(wrong);
    row.set(0, us, static_cast<std::size_t>(wrong));
    row.set(1, us, static_cast<std::size_t>(wrong));  // no separate in-place run
    table.print(row);
    if (bytes == a.max_bytes || next_size(bytes, a) <= bytes) break;
  }
  table.footer();
  return total_wrong;
}

}  // namespace bench
