// cclite/cuda/device_call.hpp - a device collective before an engine takes it: the
// options of device_communicator, where a call's buffers live, and what one
// rank can check alone.
//
// device_communicator (device_communicator.hpp) routes its blocking calls with
// route_of() and checks every call with check_device_call() before anything
// is enqueued; device_buffers (device_buffers.hpp) routes the communicator's
// own calls with route_of() too.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cclite/collective/op.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/runtime.hpp>

namespace cclite::cuda {

/// How device_communicator::create() sets up (device_communicator.hpp).
struct device_options {
  /// CUDA device; -1: the CPU communicator's local rank modulo the device count.
  int device = -1;
  /// "nccl", "native" or "auto"; nullptr: CCLITE_GPU_BACKEND.
  const char* backend = nullptr;
  /// Native engine: pinned staging chunk size and number of chunks in flight.
  /// Every rank must use the same chunk_bytes (chunks are matched across ranks);
  /// the per-rank collectives need room for one element of each rank (alltoallv
  /// two). send / recv / sendrecv always use these slots, also beside CUDA IPC.
  std::size_t chunk_bytes = std::size_t{4} << 20;
  int slots = 4;
  /// Native engine: chunks enqueued and not yet run before a call waits.
  int max_pending_chunks = 256;
  /// Native engine: take the CUDA IPC path when it applies (native_engine.hpp);
  /// false, or CCLITE_CUDA_IPC=0, always stages through host memory.
  bool ipc = true;
  /// CUDA IPC path: the chunk (and device slot) size; it allocates `slots` of
  /// them per rank (64 MiB with the defaults). Larger than the staged path's
  /// because each chunk costs one or two host barriers and a few CUDA calls
  /// (tens of microseconds), which a device copies 16 MiB in. The same on
  /// every rank.
  std::size_t ipc_chunk_bytes = std::size_t{16} << 20;
  /// CUDA IPC path: collectives that move fewer bytes per rank than this take
  /// the staged path instead (the v-variants always take CUDA IPC). -1 (auto):
  /// 1 MiB when two ranks share a GPU and no MPS daemon serves them, else 0
  /// (ipc_engine.hpp's auto_ipc_min_bytes says why). CCLITE_CUDA_IPC_MIN_BYTES
  /// overrides it; the ranks agree on the largest value.
  std::int64_t ipc_min_bytes = -1;
};

/// Which path a pair of buffers takes in the blocking collectives.
enum class buffer_route { host, device, mixed };

inline const char* to_string(buffer_route r) noexcept {
  return r == buffer_route::host ? "host" : r == buffer_route::device ? "device" : "mixed";
}

/// host: both pointers are host memory (pageable or pinned); device: both are
/// device or managed memory; mixed otherwise. Null counts as host. Without a
/// GPU or driver everything is host (query_pointer), so this never fails.
inline buffer_route route_of(const void* send, const void* recv) noexcept {
  const bool ds = send != nullptr && is_device_pointer(send);
  const bool dr = recv != nullptr && is_device_pointer(recv);
  if (ds && dr) return buffer_route::device;
  if (!ds && !dr) return buffer_route::host;
  if (send == nullptr || recv == nullptr) return ds || dr ? buffer_route::device : buffer_route::host;
  return buffer_route::mixed;
}

namespace detail {

/// What one rank can check alone about a device collective, before anything is
/// enqueued: collective/op.hpp's checks of the CPU communicator (dtype, op of
/// the reducing ones, root, byte-size overflow, null buffers) plus reduce's
/// send buffer and the root's recv (gather's likewise; scatter's recv and the
/// root's send). invalid_argument
/// "device_communicator rank R: device <what>" naming the argument.
inline status check_device_call(const op_desc& d, int rank, int size) {
  status s = cclite::detail::validate(d, rank, size);
  // The rooted ones: which buffers a rank uses depends on whether it is the root.
  const bool rooted = d.kind == collective_kind::reduce || d.kind == collective_kind::gather ||
                      d.kind == collective_kind::scatter;
  if (s.ok() && rooted && d.count != 0) {
    const char* name = to_string(d.kind);
    const bool everyone_sends = d.kind != collective_kind::scatter;  // scatter: everyone receives
    if (everyone_sends ? !d.send : !d.recv) {
      s = make_error(errc::invalid_argument, "%s: null %s buffer with count %zu", name,
                     everyone_sends ? "send" : "recv", d.count);
    } else if (rank == d.root && (everyone_sends ? !d.recv : !d.send)) {
      s = make_error(errc::invalid_argument, "%s: null %s buffer on the root (rank %d) with count %zu", name,
                     everyone_sends ? "recv" : "send", rank, d.count);
    }
  }
  if (s.ok() && d.kind == collective_kind::sendrecv && (d.root == rank) != (d.peer2 == rank)) {
    s = make_error(errc::invalid_argument, "sendrecv: a rank cannot send to itself without receiving from itself "
                   "(dst %d, src %d)", d.root, d.peer2);
  }
  if (s.ok() && d.kind == collective_kind::allgatherv && d.counts[rank] != d.count) {
    s = make_error(errc::invalid_argument, "allgatherv: send count %zu differs from counts[%d] = %zu", d.count, rank,
                   d.counts[rank]);
  }
  if (s.ok() && d.kind == collective_kind::allgatherv && d.count && !d.send) {
    s = make_error(errc::invalid_argument, "allgatherv: null send buffer with count %zu", d.count);
  }
  if (s.ok()) return s;
  return make_error(s.code(), "device_communicator rank %d: device %s", rank, s.message().c_str());
}

}  // namespace detail

}  // namespace cclite::cuda
