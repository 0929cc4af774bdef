// cclite/algorithm/ring_broadcast.hpp - pipelined chain broadcast along the ring.
//
// The root streams the buffer to the next rank in pieces; every rank keeps
// and forwards each piece as it arrives; the rank before the root only keeps
// it. Cost: (n-1) alpha + bytes * beta once the pipeline is full, the
// bandwidth optimum for large buffers (NCCL's ring broadcast).
#pragma once

#include <cclite/algorithm/primitives.hpp>

namespace cclite {

/// `rel` = (ring position - root's ring position) mod n.
template <class Prims>
status ring_broadcast(Prims& prims, std::uint8_t* buf, std::size_t bytes, int n, int rel) {
  if (n == 1) return {};
  prims.will_finish();  // one verb each: it carries the end pad
  if (rel == 0) CCLITE_TRY(prims.send(buf, bytes));
  else if (rel == n - 1) CCLITE_TRY(prims.recv(buf, bytes));
  else CCLITE_TRY(prims.recv_copy_send(buf, bytes));
  return prims.finish();
}

/// Barrier: a token goes around the ring twice. After the first lap ring
/// position 0 knows everyone arrived; the second lap tells everyone.
template <class Prims>
status ring_barrier(Prims& prims, int n, int pos) {
  if (n == 1) return {};
  std::uint8_t token[8] = {0};
  for (int lap = 0; lap < 2; ++lap) {
    if (pos == 0) {
      CCLITE_TRY(prims.send(token, sizeof token));
      CCLITE_TRY(prims.recv(token, sizeof token));
    } else {
      CCLITE_TRY(prims.recv(token, sizeof token));
      CCLITE_TRY(prims.send(token, sizeof token));
    }
  }
  return prims.finish();
}

}  // namespace cclite
