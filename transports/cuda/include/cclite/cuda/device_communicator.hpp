// cclite/cuda/device_communicator.hpp - collectives on device buffers through one API.
//
//   auto env = cclite::init().value();                       // the CPU communicator
//   auto dc = cclite::cuda::device_communicator<cclite::default_communicator>::create(*env).value();
//   dc->allreduce(d_grad, d_grad, n, cclite::dtype::float32, cclite::reduce_op::avg, stream);  // returns at once
//   dc->broadcast(d_params, p, cclite::dtype::float32, 0, stream);
//   ...more work on `stream`, ordered after the collectives...
//   cclite::check(dc->synchronize(stream));                  // bounded wait, reports errors
//   dc->allreduce(h_sums, h_sums, 4, cclite::dtype::float64, cclite::reduce_op::sum);  // host: CPU path
//
// Wraps a CPU communicator (any cclite communicator<...>) and adds device
// pointers to allreduce, broadcast, reduce, allgather(v), reduce_scatter,
// gather, scatter and alltoall(v), with the CPU communicator's semantics and arguments
// (counts in elements, per rank for all but the first three; the same in-place
// forms, except alltoall's on NCCL; reduce's and gather's recv and scatter's
// send only on the root), allgatherv / alltoallv, and send / recv / sendrecv.
// Two engines, chosen once in create() (CCLITE_GPU_BACKEND, or
// device_options::backend):
//   nccl    cclite::nccl::backend (built with cclite::nccl); the unique id goes
//           out over the CPU communicator. NCCL allows one rank per GPU.
//   native  inside one node, CUDA IPC (ipc_engine.hpp): the ranks map each
//           other's device staging slots and reduce / copy from them with
//           device kernels, ordered by interprocess events; when every rank is
//           on one node, every peer's GPU is reachable (the same GPU, or peer
//           access over NVLink / PCIe), the kernels are linked
//           (device_reduce.hpp) and device_options::ipc / CCLITE_CUDA_IPC do
//           not turn it off. Otherwise host staging (staged_engine.hpp):
//           device -> pinned host chunk -> the CPU collective -> device, chunk
//           by chunk, with the copies of later chunks overlapping the host
//           collective of earlier ones. Any number of ranks per GPU either way.
//           send / recv always stage (point to point has no barrier to order
//           the IPC slots by), so the staged path's pinned slots exist on both.
//           path() says which; CCLITE_DEBUG=INFO logs it and why.
//   auto    (unset) nccl when this build has NCCL and every rank of every node
//           has a GPU of its own (all ranks agree through one allreduce), else
//           native, so two processes sharing one GPU work out of the box.
//
// Stream-ordered form, e.g. allreduce(..., cudaStream_t): enqueues and returns
// without waiting for the GPU (the CUDA IPC path waits for the peers to reach
// the same chunk: a host barrier per step). Work enqueued on `stream` before
// the call is read; work enqueued after it sees the result (and may overwrite
// the send buffer). CUDA IPC path: everything runs on `stream`. Staged path:
// the device -> host copies run on an internal copy stream that waits for
// `stream`; the host collective runs in a CUDA host function
// (cudaLaunchHostFunc) on an internal stream, calling the CPU
// collective on a communicator of its own (split from the one given, so it
// never interleaves with the caller's CPU collectives); the host -> device
// copies go on `stream` after it. At most `max_pending_chunks` chunks may be
// enqueued and not yet run; a call beyond that waits (bounded) for the oldest.
// A host function blocks in the CPU collective until the peers reach the same
// chunk. The CUDA runtime may run a process's host functions one at a time on
// one thread, so a host function of the caller's that waits for something
// enqueued later would wait forever; the engine's own only wait for the peers'
// matching chunks, which holds while every rank issues the same collectives in
// the same order (cclite's rule anyway).
//
// Blocking form, e.g. allreduce(send, recv, count, dtype, op): each pointer is
// classified with cudaPointerGetAttributes (query_pointer): host or pinned host
// memory takes the CPU communicator directly; device or managed memory takes
// the stream-ordered path on an internal stream and waits for it; a mix is
// invalid_argument (reduce looks at recv on the root only). Every rank must
// take the same route (a host rank and a device rank wait for each other until
// the timeout). The internal stream waits for the legacy default stream, so
// data written by cudaMemcpy or by kernels on the default stream is ready; as
// with CUDA-aware MPI, data produced on other streams must be synchronised by
// the caller before the blocking call. The stream-ordered forms order after
// earlier work on the stream they are given, and only that.
//
// Errors: create() is errc::unsupported "no CUDA device ..." on a machine
// without a usable GPU (the CPU communicator stays usable). A bad dtype, op,
// root, null buffer or byte-size overflow is invalid_argument on the calling
// rank before anything is enqueued, in the CPU communicator's words; the
// engine's errors otherwise. A failed collective in a host function is reported
// by the next call and by synchronize(); after it the object is unusable (as
// the communicator). Every wait is bounded by the CPU communicator's timeout
// as it is at create() (its timeout(): comm_options, CCLITE_TIMEOUT or
// set_timeout()). Thread safety: one thread at a time, like the communicator.
//
// Set-up members (create, init) are defined in device_communicator_setup.hpp;
// the blocking forms and the call path (enqueue, routed) in
// device_communicator_calls.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include <cclite/collective/op.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/device_call.hpp>
#include <cclite/cuda/gpu_backend.hpp>
#include <cclite/cuda/native_engine.hpp>
#include <cclite/cuda/nccl_calls.hpp>
#include <cclite/cuda/runtime.hpp>

namespace cclite::cuda {

template <class Comm>
class device_communicator {
 public:
  /// Collective over `host` (every rank calls it): picks the device and the
  /// engine, splits a communicator for the native engine's host functions or
  /// sets up NCCL. `host` must outlive the object.
  static result<std::unique_ptr<device_communicator>> create(Comm& host, device_options o = {});

  device_communicator(const device_communicator&) = delete;
  device_communicator& operator=(const device_communicator&) = delete;

  /// The staged path waits for its enqueued host functions (they use it),
  /// bounded by the timeout; past it its communicator is aborted so they return.
  /// The CUDA IPC path is collective here: every rank destroys its object, and
  /// each waits (bounded) until the peers have stopped reading its slots.
  ~device_communicator() = default;

  int rank() const noexcept { return host_->rank(); }
  int size() const noexcept { return host_->size(); }
  int device() const noexcept { return device_; }
  gpu_backend engine() const noexcept { return engine_; }
  /// How the collectives on device buffers run: "nccl", "ipc" (native, CUDA
  /// IPC) or "staged" (native, through pinned host memory).
  const char* path() const noexcept { return native_ ? native_->path() : "nccl"; }
  /// On the "ipc" path: collectives moving fewer bytes per rank than this
  /// stage through host memory instead (device_options::ipc_min_bytes); 0 when
  /// all of them take CUDA IPC, and on the other paths.
  std::int64_t ipc_min_bytes() const noexcept { return native_ ? native_->ipc_min_bytes() : 0; }
  Comm& host() const noexcept { return *host_; }
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
  /// The NCCL backend (engine() == nccl), else null.
  nccl::backend* nccl_backend() const noexcept { return nccl_.get(); }
#endif

  // ---- stream-ordered: device buffers, enqueue on `stream` and return ------------
  // See the file comment. Each rank's buffers must be device (or managed) memory.

  /// recv[i] = send[i] (op) over all ranks; send == recv is in place.
  status allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                   cudaStream_t stream) {
    return enqueue(collective_kind::allreduce, send, recv, count, t, op, 0, stream);
  }

  /// Copies root's `count` elements of `buf` to every rank's `buf`.
  status broadcast(void* buf, std::size_t count, dtype t, int root, cudaStream_t stream) {
    return enqueue(collective_kind::broadcast, buf, buf, count, t, reduce_op::sum, root, stream);
  }

  /// root's recv[i] = send[i] (op) over all ranks; other ranks' recv is not
  /// touched (may be null). send == recv on the root is in place.
  status reduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, int root,
                cudaStream_t stream) {
    return enqueue(collective_kind::reduce, send, recv, count, t, op, root, stream);
  }

  /// recv (size() * count elements) = every rank's send (count) in rank order.
  /// In place: send == recv + rank() * count.
  status allgather(const void* send, void* recv, std::size_t count, dtype t, cudaStream_t stream) {
    return enqueue(collective_kind::allgather, send, recv, count, t, reduce_op::sum, 0, stream);
  }

  /// recv (count) = block rank() of every rank's send (size() * count), reduced.
  /// In place: recv == send + rank() * count.
  status reduce_scatter(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                        cudaStream_t stream) {
    return enqueue(collective_kind::reduce_scatter, send, recv, count, t, op, 0, stream);
  }

  /// root's recv (size() * count) = every rank's send (count) in rank order; the
  /// other ranks' recv is not touched (may be null). In place on the root:
  /// send == recv + root * count.
  status gather(const void* send, void* recv, std::size_t count, dtype t, int root, cudaStream_t stream) {
    return enqueue(collective_kind::gather, send, recv, count, t, reduce_op::sum, root, stream);
  }

  /// Every rank's recv (count) = block rank() of root's send (size() * count);
  /// the other ranks' send is not read (may be null). In place on the root:
  /// recv == send + root * count.
  status scatter(const void* send, void* recv, std::size_t count, dtype t, int root, cudaStream_t stream) {
    return enqueue(collective_kind::scatter, send, recv, count, t, reduce_op::sum, root, stream);
  }

  /// Block r of send (count elements) goes to rank r, block r of recv comes from
  /// rank r. send == recv is in place on the native engine (NCCL: unsupported).
  status alltoall(const void* send, void* recv, std::size_t count, dtype t, cudaStream_t stream) {
    return enqueue(collective_kind::alltoall, send, recv, count, t, reduce_op::sum, 0, stream);
  }

  /// Rank r's send (counts[r] elements; send_count here) lands at recv +
  /// displs[r] on every rank; counts / displs: size() entries, equal on all
  /// ranks, read during the call only. In place: send == recv + displs[rank()].
  status allgatherv(const void* send, std::size_t send_count, void* recv, const std::size_t* counts,
                    const std::size_t* displs, dtype t, cudaStream_t stream) {
    detail::v_args va;
    va.counts = counts;
    va.displs = displs;
    return enqueue(collective_kind::allgatherv, send, recv, send_count, t, reduce_op::sum, 0, stream, va);
  }

  /// Block p of send (send_counts[p] elements at send_displs[p]) goes to rank p
  /// and arrives there at recv + recv_displs[rank()]; size() entries each, read
  /// during the call only. Every rank takes as many chunks as the largest block
  /// of any rank (the native engine agrees on it with one small CPU allreduce
  /// per call). In place (send == recv) on the native engine, with the recv
  /// arrays both ways (MPI_IN_PLACE); NCCL: unsupported.
  status alltoallv(const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
                   const std::size_t* recv_counts, const std::size_t* recv_displs, dtype t, cudaStream_t stream) {
    detail::v_args va;
    va.counts = send_counts;
    va.displs = send_displs;
    va.rcounts = recv_counts;
    va.rdispls = recv_displs;
    return enqueue(collective_kind::alltoallv, send, recv, 0, t, reduce_op::sum, 0, stream, va);
  }

  /// Point to point, as the CPU communicator's send / recv: `peer` makes the
  /// matching recv / send with the same count and dtype; calls to one peer match
  /// in issue order. Native engine: through pinned host memory (the staged
  /// path, also when the collectives take CUDA IPC), chunk by chunk, so a
  /// large send runs only as its receiver takes it, and two ranks that both
  /// send to each other first wait for each other (until the timeout), as
  /// with host buffers. NCCL: ncclSend / ncclRecv.
  status send(const void* buf, std::size_t count, dtype t, int peer, cudaStream_t stream) {
    return enqueue(collective_kind::send, buf, nullptr, count, t, reduce_op::sum, peer, stream);
  }
  status recv(void* buf, std::size_t count, dtype t, int peer, cudaStream_t stream) {
    return enqueue(collective_kind::recv, nullptr, buf, count, t, reduce_op::sum, peer, stream);
  }

  /// Sends `send_count` elements to `dst` and receives `recv_count` from `src`
  /// at the same time (a ring shift cannot deadlock), as the CPU communicator's
  /// sendrecv; dst == src == rank() is a copy. Native engine: the staged path,
  /// chunk by chunk. NCCL: one group of ncclSend / ncclRecv.
  status sendrecv(const void* send, std::size_t send_count, int dst, void* recv, std::size_t recv_count, int src,
                  dtype t, cudaStream_t stream) {
    detail::v_args va;
    va.count2 = recv_count;
    va.peer2 = src;
    return enqueue(collective_kind::sendrecv, send, recv, send_count, t, reduce_op::sum, dst, stream, va);
  }

  // ---- blocking: host or device buffers, routed by where they live --------------
  // Defined in device_communicator_calls.hpp.

  status allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op);
  template <class T>
  status allreduce(T* data, std::size_t count, reduce_op op = reduce_op::sum) {
    return allreduce(data, data, count, dtype_of_v<T>, op);
  }

  status broadcast(void* buf, std::size_t count, dtype t, int root);
  template <class T>
  status broadcast(T* buf, std::size_t count, int root) {
    return broadcast(buf, count, dtype_of_v<T>, root);
  }

  status reduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, int root);
  status allgather(const void* send, void* recv, std::size_t count, dtype t);
  status reduce_scatter(const void* send, void* recv, std::size_t count, dtype t, reduce_op op);
  status gather(const void* send, void* recv, std::size_t count, dtype t, int root);
  status scatter(const void* send, void* recv, std::size_t count, dtype t, int root);
  status alltoall(const void* send, void* recv, std::size_t count, dtype t);
  status allgatherv(const void* send, std::size_t send_count, void* recv, const std::size_t* counts,
                    const std::size_t* displs, dtype t);
  status alltoallv(const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
                   const std::size_t* recv_counts, const std::size_t* recv_displs, dtype t);
  status sendrecv(const void* send, std::size_t send_count, int dst, void* recv, std::size_t recv_count, int src,
                  dtype t);
  status send(const void* buf, std::size_t count, dtype t, int peer);
  status recv(void* buf, std::size_t count, dtype t, int peer);

  /// Waits until everything enqueued on `stream` has run (bounded by the
  /// timeout), then reports the first failure of an enqueued collective.
  status synchronize(cudaStream_t stream) {
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
    if (nccl_) return nccl_->synchronize(stream);
#endif
    return native_->synchronize(stream);
  }

  /// The first failure of the native engine seen, ok if none (the NCCL engine
  /// reports its failures from every later call and synchronize()).
  status failure() const { return native_ ? native_->failure() : status(); }

 private:
  device_communicator(Comm& host, int dev, gpu_backend engine, milliseconds timeout, const device_options& o)
      : host_(&host), device_(dev), engine_(engine), timeout_(timeout), opts_(o) {}

  // Defined in device_communicator_setup.hpp (init) and
  // device_communicator_calls.hpp (enqueue, routed).
  status init();
  status enqueue(collective_kind k, const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                 int root, cudaStream_t stream, detail::v_args va = {});
  template <class OnHost, class OnDevice>
  status routed(const char* what, const void* send, const void* recv, OnHost&& on_host, OnDevice&& on_device);

  Comm* host_;
  int device_;
  gpu_backend engine_;
  milliseconds timeout_;
  device_options opts_;
  stream own_stream_;
  std::unique_ptr<detail::native_engine<Comm>> native_;  // engine() == native
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
  std::unique_ptr<nccl::backend> nccl_;
#endif
};

}  // namespace cclite::cuda

// The member definitions (each includes this header: either may come first).
#include <cclite/cuda/device_communicator_calls.hpp>
#include <cclite/cuda/device_communicator_setup.hpp>
