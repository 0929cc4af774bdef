// cclite/cuda/device_communicator_calls.hpp - the path of a device_communicator's
// call: the blocking forms' route by where the buffers live, then the checks
// made on the calling rank and the engine that takes the call.
//
// Definitions of device_communicator<Comm>'s blocking forms and of its private
// call path (enqueue(), routed()); the public calls are declared in
// device_communicator.hpp, which includes this header at its end (including
// this one first works too). A blocking call goes to the CPU communicator when
// its buffers are host memory, else to its stream-ordered twin on the
// internal stream and a bounded wait (route_of(), device_call.hpp). Every
// stream-ordered call is checked by check_device_call() (device_call.hpp),
// then enqueued on NCCL (nccl_calls.hpp) or the native engine
// (native_engine.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include <cclite/collective/op.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/device_call.hpp>
#include <cclite/cuda/device_communicator.hpp>
#include <cclite/cuda/native_engine.hpp>
#include <cclite/cuda/nccl_calls.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/cuda/staged_plan.hpp>

namespace cclite::cuda {

// ---- blocking: host or device buffers, routed by where they live --------------

template <class Comm>
inline status device_communicator<Comm>::allreduce(const void* send, void* recv, std::size_t count, dtype t,
                                                   reduce_op op) {
  return routed("allreduce", send, recv, [&] { return host_->allreduce(send, recv, count, t, op); },
                [&](cudaStream_t s) { return allreduce(send, recv, count, t, op, s); });
}

template <class Comm>
inline status device_communicator<Comm>::broadcast(void* buf, std::size_t count, dtype t, int root) {
  return routed("broadcast", buf, buf, [&] { return host_->broadcast(buf, count, t, root); },
                [&](cudaStream_t s) { return broadcast(buf, count, t, root, s); });
}

template <class Comm>
inline status device_communicator<Comm>::reduce(const void* send, void* recv, std::size_t count, dtype t,
                                                reduce_op op, int root) {
  // Only the root's recv is used, so only it takes part in the route.
  return routed("reduce", send, rank() == root ? recv : nullptr,
                [&] { return host_->reduce(send, recv, count, t, op, root); },
                [&](cudaStream_t s) { return reduce(send, recv, count, t, op, root, s); });
}

template <class Comm>
inline status device_communicator<Comm>::allgather(const void* send, void* recv, std::size_t count, dtype t) {
  return routed("allgather", send, recv, [&] { return host_->allgather(send, recv, count, t); },
                [&](cudaStream_t s) { return allgather(send, recv, count, t, s); });
}

template <class Comm>
inline status device_communicator<Comm>::reduce_scatter(const void* send, void* recv, std::size_t count, dtype t,
                                                        reduce_op op) {
  return routed("reduce_scatter", send, recv, [&] { return host_->reduce_scatter(send, recv, count, t, op); },
                [&](cudaStream_t s) { return reduce_scatter(send, recv, count, t, op, s); });
}

template <class Comm>
inline status device_communicator<Comm>::gather(const void* send, void* recv, std::size_t count, dtype t,
                                                int root) {
  // Only the root's recv is used, so only it takes part in the route.
  return routed("gather", send, rank() == root ? recv : nullptr,
                [&] { return host_->gather(send, recv, count, t, root); },
                [&](cudaStream_t s) { return gather(send, recv, count, t, root, s); });
}

template <class Comm>
inline status device_communicator<Comm>::scatter(const void* send, void* recv, std::size_t count, dtype t,
                                                 int root) {
  // Only the root's send is read.
  return routed("scatter", rank() == root ? send : nullptr, recv,
                [&] { return host_->scatter(send, recv, count, t, root); },
                [&](cudaStream_t s) { return scatter(send, recv, count, t, root, s); });
}

template <class Comm>
inline status device_communicator<Comm>::alltoall(const void* send, void* recv, std::size_t count, dtype t) {
  return routed("alltoall", send, recv, [&] { return host_->alltoall(send, recv, count, t); },
                [&](cudaStream_t s) { return alltoall(send, recv, count, t, s); });
}

template <class Comm>
inline status device_communicator<Comm>::allgatherv(const void* send, std::size_t send_count, void* recv,
                                                    const std::size_t* counts, const std::size_t* displs, dtype t) {
  return routed("allgatherv", send, recv,
                [&] { return host_->allgatherv(send, send_count, recv, counts, displs, t); },
                [&](cudaStream_t s) { return allgatherv(send, send_count, recv, counts, displs, t, s); });
}

template <class Comm>
inline status device_communicator<Comm>::alltoallv(const void* send, const std::size_t* send_counts,
                                                   const std::size_t* send_displs, void* recv,
                                                   const std::size_t* recv_counts, const std::size_t* recv_displs,
                                                   dtype t) {
  return routed("alltoallv", send, recv,
                [&] { return host_->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t); },
                [&](cudaStream_t s) {
                  return alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, t, s);
                });
}

template <class Comm>
inline status device_communicator<Comm>::sendrecv(const void* send, std::size_t send_count, int dst, void* recv,
                                                  std::size_t recv_count, int src, dtype t) {
  return routed("sendrecv", send_count ? send : nullptr, recv_count ? recv : nullptr,
                [&] { return host_->sendrecv(send, send_count, dst, recv, recv_count, src, t); },
                [&](cudaStream_t s) { return sendrecv(send, send_count, dst, recv, recv_count, src, t, s); });
}

template <class Comm>
inline status device_communicator<Comm>::send(const void* buf, std::size_t count, dtype t, int peer) {
  return routed("send", buf, nullptr, [&] { return host_->send(buf, count, t, peer); },
                [&](cudaStream_t s) { return send(buf, count, t, peer, s); });
}

template <class Comm>
inline status device_communicator<Comm>::recv(void* buf, std::size_t count, dtype t, int peer) {
  return routed("recv", nullptr, buf, [&] { return host_->recv(buf, count, t, peer); },
                [&](cudaStream_t s) { return recv(buf, count, t, peer, s); });
}

// ---- the call path ------------------------------------------------------------

// Checks the arguments, then hands the call to the engine.
template <class Comm>
inline status device_communicator<Comm>::enqueue(collective_kind k, const void* send, void* recv, std::size_t count,
                                                 dtype t, reduce_op op, int root, cudaStream_t stream,
                                                 detail::v_args va) {
  CCLITE_TRY(failure());
  op_desc d = op_desc::of(k, send, recv, count, t, op, root);
  va.apply(d);
  CCLITE_TRY(detail::check_device_call(d, rank(), size()));
  if (k == collective_kind::alltoallv && send == recv) {  // MPI_IN_PLACE: the recv arrays both ways
    va.counts = va.rcounts;
    va.displs = va.rdispls;
  }
  // The v-variants go on even with nothing here: the others may have blocks.
  if (count == 0 && va.count2 == 0 && !detail::is_v(k)) return status();
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
  if (nccl_) return detail::enqueue_on_nccl(*nccl_, rank(), k, send, recv, count, t, op, root, stream, va);
#endif
  return native_->enqueue(k, send, recv, count, t, op, root, stream, va);
}

// The blocking forms: host pointers to the CPU communicator, device pointers
// through the stream-ordered path on own_stream_ and a bounded wait.
template <class Comm>
template <class OnHost, class OnDevice>
inline status device_communicator<Comm>::routed(const char* what, const void* send, const void* recv,
                                                OnHost&& on_host, OnDevice&& on_device) {
  switch (route_of(send, recv)) {
    case buffer_route::host: return on_host();
    case buffer_route::mixed:
      return make_error(errc::invalid_argument,
                        "device %s: send %p is %s memory and recv %p is %s memory; both must be host or "
                        "both device",
                        what, send, to_string(query_pointer(send).kind), recv,
                        to_string(query_pointer(recv).kind));
    case buffer_route::device: break;
  }
  CCLITE_TRY(on_device(own_stream_.get()));
  return synchronize(own_stream_.get());
}

}  // namespace cclite::cuda
