// cclite/cuda/nccl_calls.hpp - device_communicator's calls on the NCCL engine.
//
// Internal (cclite::cuda::detail); only with CCLITE_HAS_NCCL. Every call
// device_communicator offers, on cclite::nccl::backend: its collectives, and
// grouped ncclSend / ncclRecv for the ones NCCL lacks (gather, scatter, the
// alltoalls, allgatherv). In-place alltoall(v) is unsupported there: the group
// would overwrite blocks not yet sent.
#pragma once

#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL

#include <cuda_runtime_api.h>

#include <cstddef>

#include <cclite/collective/op.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/staged_plan.hpp>
#include <cclite/nccl/backend.hpp>

namespace cclite::cuda::detail {

/// Enqueues a checked call on `b` (`root`: the root, or the peer / destination;
/// `va`: the v-variants' arrays and sendrecv's receive side).
inline status enqueue_on_nccl(nccl::backend& b, int rank, collective_kind k, const void* send, void* recv,
                              std::size_t count, dtype t, reduce_op op, int root, cudaStream_t stream,
                              const v_args& va) {
  switch (k) {
    case collective_kind::allreduce: return b.allreduce(send, recv, count, t, op, stream);
    case collective_kind::broadcast: return b.broadcast(send, recv, count, t, root, stream);
    case collective_kind::reduce: return b.reduce(send, recv, count, t, op, root, stream);
    case collective_kind::allgather: return b.allgather(send, recv, count, t, stream);
    case collective_kind::reduce_scatter: return b.reduce_scatter(send, recv, count, t, op, stream);
    case collective_kind::gather: return b.gather(send, recv, count, t, root, stream);
    case collective_kind::scatter: return b.scatter(send, recv, count, t, root, stream);
    case collective_kind::alltoall:
      if (send == recv) {
        return make_error(errc::unsupported,
                          "device_communicator rank %d: in-place alltoall on the NCCL engine (NCCL's "
                          "grouped send / recv would overwrite blocks not yet sent); pass a separate "
                          "recv buffer, or use the native engine (CCLITE_GPU_BACKEND=native)",
                          rank);
      }
      return b.alltoall(send, recv, count, t, stream);
    case collective_kind::allgatherv:
      return b.allgatherv(send, count, recv, va.counts, va.displs, t, stream);
    case collective_kind::alltoallv:
      if (send == recv) {
        return make_error(errc::unsupported,
                          "device_communicator rank %d: in-place alltoallv on the NCCL engine; pass a "
                          "separate recv buffer, or use the native engine (CCLITE_GPU_BACKEND=native)",
                          rank);
      }
      return b.alltoallv(send, va.counts, va.displs, recv, va.rcounts, va.rdispls, t, stream);
    case collective_kind::sendrecv:
      return b.sendrecv(send, count, root, recv, va.count2, va.peer2, t, stream);
    case collective_kind::send: return b.send(send, count, t, root, stream);
    case collective_kind::recv: return b.recv(recv, count, t, root, stream);
    default: return make_error(errc::invalid_argument, "device %s: not offered", to_string(k));
  }
}

}  // namespace cclite::cuda::detail

#endif  // CCLITE_HAS_NCCL
