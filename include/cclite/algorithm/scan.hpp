// cclite/algorithm/scan.hpp - prefix reductions (MPI_Scan, MPI_Exscan):
// a chain of ranks in rank order, and recursive doubling for small calls.
//
// Rank r's result is x_0 (op) x_1 (op) ... (op) x_r (scan, inclusive) or
// x_0 (op) ... (op) x_{r-1} (exscan, exclusive; rank 0's output is not
// written, which MPI leaves undefined). Rank r receives the prefix of ranks
// 0..r-1 from rank r - 1 and passes the prefix of 0..r on to rank r + 1,
// piece by piece through the links, so a large vector pipelines: about
// (p - 1) alpha + n beta, where a recursive-doubling scan moves
// log2(p) whole vectors. Each rank combines its own value with the prefix
// that arrives (primitives::recv_reduce_copy_send: own (op) prefix); every
// reduce_op is commutative, so rank r ends with the bits of
// ((x_0 op x_1) op x_2) ... op x_r, as shm-direct's small path computes
// them from the ranks' slots in rank order (comm_shared.hpp).
//
// Small calls on several ranks take recursive doubling instead (MPICH's
// MPIR_Scan_intra_recursive_doubling): ceil(log2 p) rounds of whole-vector
// exchanges with rank ^ 2^k, ~log2(p) (alpha + n beta), where the chain pays
// (p - 1) alpha. Its sums are grouped differently ((x_0 op x_1) op (x_2 op
// x_3)), so floating-point results may differ in the last bits between the
// two, as between MPI implementations; every rank of one call runs the same one
// (the selector decides by size and rank count alone).
//
// reduce_op::avg: both carry sums and the caller divides its own result by
// the number of ranks in its prefix (comm_algorithms::run_scan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

/// One rank's part of a chain scan over `bytes` bytes of `send` into `recv`
/// (`send == recv`: in place). `p`: primitives whose prev link is rank - 1
/// and next link rank + 1 (rank 0: any prev; the last rank: any next: neither
/// is used). The caller copies send to recv on rank 0 of an inclusive scan.
template <class Prims>
status chain_scan(Prims& p, const std::uint8_t* send, std::uint8_t* recv, std::size_t bytes, int rank, int n,
                  bool exclusive) {
  const bool last = rank == n - 1;
  p.will_finish();  // each rank's one verb is its last (primitives.hpp)
  if (rank == 0) {
    CCLITE_TRY(p.send(send, bytes));
  } else if (exclusive) {
    // Our result is the arriving prefix; the next rank's is that (op) ours.
    CCLITE_TRY(last ? p.recv(recv, bytes) : p.recv_copy_reduce_send(send, recv, bytes));
  } else {
    CCLITE_TRY(last ? p.recv_reduce_copy(send, recv, bytes) : p.recv_reduce_copy_send(send, recv, bytes));
  }
  return p.finish();
}

/// Peers of `rank` in recursive_doubling_scan (rank ^ 2^k below n), into `out`; returns their number.
inline int recursive_doubling_scan_peers(int rank, int n, int* out) {
  int m = 0;
  for (int mask = 1; mask < n; mask <<= 1)
    if ((rank ^ mask) < n) out[m++] = rank ^ mask;
  return m;
}

/// One rank's recursive-doubling scan of `count` elements. On entry `total`
/// holds this rank's own values and, for an inclusive scan, so does `recv`;
/// `incoming`: scratch of the same size. `exchange(peer, out, bytes, in,
/// bytes)` swaps two buffers with `peer`. In round k `total` becomes the
/// reduction of this rank's aligned block of 2^(k+1) ranks, and a block
/// below ours adds into `recv` (exscan: the first one is copied: rank 0's
/// recv is never written).
template <class Exchange>
status recursive_doubling_scan(std::uint8_t* recv, std::uint8_t* total, std::uint8_t* incoming, std::size_t count,
                               const reduction& red, int rank, int n, bool exclusive, Exchange&& exchange) {
  const std::size_t bytes = count * red.elem_size;
  bool have = !exclusive;
  for (int mask = 1; mask < n; mask <<= 1) {
    const int peer = rank ^ mask;
    if (peer >= n) continue;
    CCLITE_TRY(exchange(peer, total, bytes, incoming, bytes));
    if (peer < rank) {
      if (have) red.inplace(recv, incoming, count);
      else if (bytes) std::memcpy(recv, incoming, bytes);
      have = true;
    }
    red.inplace(total, incoming, count);
  }
  return {};
}

}  // namespace cclite
