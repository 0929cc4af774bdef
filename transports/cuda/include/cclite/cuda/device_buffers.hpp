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
// Device buffers are taken by allreduce, broadcast, reduce, allgather and
// reduce_scatter on the device communicator's engine, and by gather, scatter,
// alltoall, send and recv through host memory: the device data is copied to a
// host buffer of the object's (grown to the largest call, kept), the CPU
// collective runs on it, the result is copied back - correct, not fast (a
// GPU-to-GPU path for these is still to come). The v-variants and sendrecv on
// device buffers are unsupported, with a message naming what offers them; a
// host buffer and a device buffer in one call are invalid_argument. Blocking
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
#include <vector>

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
    // reduce: only the root's recv is written, so only it decides.
    const void* recv = d.kind == collective_kind::reduce && d.root != comm_->rank() ? nullptr : d.recv;
    return route_of(d.send, recv) != buffer_route::host;
  }

  status run(const op_desc& d) override {
    device_communicator<Comm>& dc = *dc_;
    switch (d.kind) {
      case collective_kind::allreduce: return dc.allreduce(d.send, d.recv, d.count, d.type, d.op);
      case collective_kind::broadcast: return dc.broadcast(d.recv, d.count, d.type, d.root);
      case collective_kind::reduce: return dc.reduce(d.send, d.recv, d.count, d.type, d.op, d.root);
      case collective_kind::allgather: return dc.allgather(d.send, d.recv, d.count, d.type);
      case collective_kind::reduce_scatter: return dc.reduce_scatter(d.send, d.recv, d.count, d.type, d.op);
      case collective_kind::gather:
      case collective_kind::scatter:
      case collective_kind::alltoall:
      case collective_kind::send:
      case collective_kind::recv: return through_host(d);
      default:
        return make_error(errc::unsupported,
                          "rank %d: %s on device buffers is not offered yet (cclite::nccl::backend has "
                          "alltoall and send/recv on device buffers; or copy to host memory first)",
                          comm_->rank(), to_string(d.kind));
    }
  }

 private:
  device_buffers(Comm& comm, std::unique_ptr<device_communicator<Comm>> dc) : comm_(&comm), dc_(std::move(dc)) {}

  // gather, scatter, alltoall, send, recv: device -> host_, the CPU call on
  // host_, host_ -> device (see the file comment). cudaMemcpy from device
  // memory waits for the legacy default stream only, hence the rule that the
  // data be ready before the call.
  status through_host(const op_desc& d) {
    const std::size_t es = size_of(d.type), n = static_cast<std::size_t>(comm_->size());
    const bool root = comm_->rank() == d.root;
    std::size_t sb = 0, rb = 0;  // bytes of send and recv this rank uses
    switch (d.kind) {
      case collective_kind::gather: sb = d.count * es; rb = root ? n * d.count * es : 0; break;
      case collective_kind::scatter: sb = root ? n * d.count * es : 0; rb = d.count * es; break;
      case collective_kind::alltoall: sb = rb = n * d.count * es; break;
      case collective_kind::send: sb = d.count * es; break;
      default: rb = d.count * es; break;  // recv
    }
    if ((sb && !is_device_pointer(d.send)) || (rb && !is_device_pointer(d.recv))) {
      return make_error(errc::invalid_argument, "device %s: send %p and recv %p must both be device memory",
                        to_string(d.kind), d.send, static_cast<const void*>(d.recv));
    }
    if (host_.size() < sb + rb) host_.resize(sb + rb);
    unsigned char* hs = sb ? host_.data() : nullptr;
    unsigned char* hr = rb ? host_.data() + sb : nullptr;
    if (sb) CCLITE_TRY(cuda_status(cudaMemcpy(hs, d.send, sb, cudaMemcpyDeviceToHost), "cudaMemcpy device -> host"));
    status s;
    switch (d.kind) {
      case collective_kind::gather: s = comm_->gather(hs, hr, d.count, d.type, d.root); break;
      case collective_kind::scatter: s = comm_->scatter(hs, hr, d.count, d.type, d.root); break;
      case collective_kind::alltoall: s = comm_->alltoall(hs, hr, d.count, d.type); break;
      case collective_kind::send: s = comm_->send(hs, d.count, d.type, d.root); break;
      default: s = comm_->recv(hr, d.count, d.type, d.root); break;
    }
    if (!s.ok() || !rb) return s;
    return cuda_status(cudaMemcpy(d.recv, hr, rb, cudaMemcpyHostToDevice), "cudaMemcpy host -> device");
  }

  Comm* comm_;
  std::unique_ptr<device_communicator<Comm>> dc_;
  std::vector<unsigned char> host_;  ///< through_host()'s staging, grown to the largest call
};

}  // namespace cclite::cuda
