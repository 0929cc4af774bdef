// cclite/cuda/device_buffers.hpp - device pointers straight into a CPU communicator.
//
//   auto env = cclite::init().value();
//   auto gpu = cclite::cuda::device_buffers<cclite::default_communicator>::enable(*env).value();
//   env->allreduce(d_grad, d_grad, n, cclite::dtype::float32, cclite::reduce_op::avg);  // device memory
//   env->allreduce(h_loss, h_loss, 1, cclite::dtype::float64, cclite::reduce_op::sum); // host memory, as before
//
// enable() builds a device_communicator over `comm` (every rank calls it: it
// is collective) and installs itself as the communicator's device hook
// (collective/device_hook.hpp); destroying the returned object removes it.
// From then on each call classifies its buffers with cudaPointerGetAttributes
// (route_of: a fraction of a microsecond per pointer): host memory takes the
// CPU path as before; device or managed memory runs on the device
// communicator's engine (NCCL, or native: CUDA IPC inside a node, host staging
// otherwise) and the call returns when it is done, like CUDA-aware MPI: the
// device data must be ready (its stream synchronised) before the call. Every
// rank must pass the same kind of memory to a call.
//
// Device buffers are taken by every collective and send / recv on the device
// communicator's engine (send / recv through pinned host memory on the native
// engine, as device_communicator says); sendrecv too. A host buffer and a device buffer in one call are invalid_argument. Blocking
// and _async alike (the _async forms run the call before they return).
// Stream-ordered work stays with `device()` (device_communicator's forms
// taking a cudaStream_t).
// Errors of enable(): device_communicator::create's (unsupported "no CUDA
// device" on a machine without a GPU; the communicator is left as it was).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <utility>

#include <cclite/collective/device_hook.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/device_communicator.hpp>

namespace cclite::cuda {

template <class Comm>
class device_buffers final : public device_hook {
 public:
  /// Collective over `comm`: see the file comment. `comm` must outlive the
  /// returned object; no other thread may call `comm` while the hook is
  /// installed (here) or removed (the destructor).
  static result<std::unique_ptr<device_buffers>> enable(Comm& comm, device_options o = {}) {
    auto dc = device_communicator<Comm>::create(comm, o);
    if (!dc) return dc.error();
    std::unique_ptr<device_buffers> b(new device_buffers(comm, std::move(dc.value())));
    comm.set_device_hook(b.get());
    return result<std::unique_ptr<device_buffers>>(std::move(b));
  }

  device_buffers(const device_buffers&) = delete;
  device_buffers& operator=(const device_buffers&) = delete;
  ~device_buffers() {
    if (comm_->get_device_hook() == this) comm_->set_device_hook(nullptr);
  }

  /// The device communicator behind the hook (its stream-ordered forms).
  device_communicator<Comm>& device() const noexcept { return *dc_; }

  bool owns(const op_desc& d) const noexcept override {
    // Off the root, reduce and gather write no recv and scatter reads no send:
    // those pointers do not decide.
    const bool root = d.root == comm_->rank();
    const bool no_recv = !root && (d.kind == collective_kind::reduce || d.kind == collective_kind::gather ||
                                   d.kind == collective_kind::gatherv);
    const bool no_send = !root && (d.kind == collective_kind::scatter || d.kind == collective_kind::scatterv);
    return route_of(no_send ? nullptr : d.send, no_recv ? nullptr : d.recv) != buffer_route::host;
  }

  status run(const op_desc& d) override {
    device_communicator<Comm>& dc = *dc_;
    switch (d.kind) {
      case collective_kind::allreduce: return dc.allreduce(d.send, d.recv, d.count, d.type, d.op);
      case collective_kind::broadcast: return dc.broadcast(d.recv, d.count, d.type, d.root);
      case collective_kind::reduce: return dc.reduce(d.send, d.recv, d.count, d.type, d.op, d.root);
      case collective_kind::allgather: return dc.allgather(d.send, d.recv, d.count, d.type);
      case collective_kind::reduce_scatter: return dc.reduce_scatter(d.send, d.recv, d.count, d.type, d.op);
      case collective_kind::gather: return dc.gather(d.send, d.recv, d.count, d.type, d.root);
      case collective_kind::scatter: return dc.scatter(d.send, d.recv, d.count, d.type, d.root);
      case collective_kind::alltoall: return dc.alltoall(d.send, d.recv, d.count, d.type);
      case collective_kind::allgatherv: return dc.allgatherv(d.send, d.count, d.recv, d.counts, d.displs, d.type);
      case collective_kind::alltoallv:
        return dc.alltoallv(d.send, d.counts, d.displs, d.recv, d.rcounts, d.rdispls, d.type);
      case collective_kind::sendrecv:
        return dc.sendrecv(d.send, d.count, d.root, d.recv, d.count2, d.peer2, d.type);
      case collective_kind::send: return dc.send(d.send, d.count, d.type, d.root);
      case collective_kind::recv: return dc.recv(d.recv, d.count, d.type, d.root);
      default:
        return make_error(errc::unsupported,
                          "rank %d: %s on device buffers is not offered (copy to host memory first)",
                          comm_->rank(), to_string(d.kind));
    }
  }

 private:
  device_buffers(Comm& comm, std::unique_ptr<device_communicator<Comm>> dc) : comm_(&comm), dc_(std::move(dc)) {}

  Comm* comm_;
  std::unique_ptr<device_communicator<Comm>> dc_;
};

}  // namespace cclite::cuda
