// cclite/algorithm/ring_allreduce.hpp - pipelined, chunked ring allreduce.
//
// Reduce-scatter then allgather around the ring (n ranks, ring position p,
// buffer split into n segments). Per round of at most `chunk` elements per
// segment:
//   step 0          send segment p                           (send)
//   steps 1..n-2    receive segment p-k, add ours, forward   (recv_reduce_send)
//   step n-1        receive segment p+1, add ours -> final,  (recv_reduce_copy_send)
//                   keep it and forward it
//   steps n..2n-3   receive a final segment, keep, forward   (recv_copy_send)
//   step 2n-2       receive the last final segment           (recv)
// Cost: 2(n-1) alpha + 2 (n-1)/n * bytes * beta per rank, the bandwidth
// optimum. Every rank keeps exactly the bits the segment's owner computed, so
// results are bitwise identical on all ranks.
#pragma once

#include <cstring>

#include <cclite/algorithm/primitives.hpp>
#include <cclite/algorithm/schedule.hpp>

namespace cclite {

/// `send` may equal `recv` (in place). `pos` is this rank's ring position.
template <class Prims>
status ring_allreduce(Prims& prims, const std::uint8_t* send, std::uint8_t* recv,
                      std::size_t count, std::size_t elem, const reduction& red, int n, int pos,
                      std::size_t chunk_elems) {
  if (n == 1) {
    if (send != recv && count) std::memcpy(recv, send, count * elem);
    return {};
  }
  const segments segs{count, static_cast<std::size_t>(n)};
  const bool stream = send != recv && count * elem >= ring_stream_output_min_bytes;
  prims.stream_output(stream, stream);
  const int divide_by = red.needs_divide ? n : 0;
  auto seg_at = [&](int k) { return static_cast<std::size_t>(((pos - k) % n + n) % n); };
  const std::size_t rounds = rounds_for(segs, chunk_elems);
  for (std::size_t r = 0; r < rounds; ++r) {
    // step 0: push our contribution of segment p to the next rank
    round_part pt = part_of(segs, seg_at(0), r, chunk_elems);
    CCLITE_TRY(prims.send(send + pt.begin * elem, pt.size() * elem));
    // steps 1..n-2: reduce the incoming partial sum with ours and pass it on
    for (int k = 1; k < n - 1; ++k) {
      pt = part_of(segs, seg_at(k), r, chunk_elems);
      CCLITE_TRY(prims.recv_reduce_send(send + pt.begin * elem, pt.size() * elem));
    }
    // step n-1: the segment is complete here; keep it and start the allgather
    pt = part_of(segs, seg_at(n - 1), r, chunk_elems);
    CCLITE_TRY(prims.recv_reduce_copy_send(send + pt.begin * elem, recv + pt.begin * elem,
                                           pt.size() * elem, divide_by));
    // steps n..2n-3: keep and forward final segments
    for (int k = n; k < 2 * n - 2; ++k) {
      pt = part_of(segs, seg_at(k), r, chunk_elems);
      CCLITE_TRY(prims.recv_copy_send(recv + pt.begin * elem, pt.size() * elem));
    }
    // step 2n-2: the last final segment ends its trip here
    pt = part_of(segs, seg_at(2 * n - 2), r, chunk_elems);
    CCLITE_TRY(prims.recv(recv + pt.begin * elem, pt.size() * elem));
  }
  return prims.finish();
}

}  // namespace cclite
