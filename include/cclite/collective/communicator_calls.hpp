// cclite/collective/communicator_calls.hpp - the path of a communicator's
// call: its op_desc, the checks made on the calling rank, then the work
// queue, the open group or the device hook.
//
// Definitions of communicator<Transports...>'s private call path and of
// its point-to-point calls, group_end() and the v-variants (allgatherv,
// alltoallv, gatherv, scatterv, reduce_scatterv); all the public calls are
// declared and documented in communicator.hpp, which includes this header
// at its end (including this one first works too). A call is checked here,
// then queued (work_queue.hpp); the queue's thread or the caller runs it
// through comm_dispatch.hpp's execute(). Inside a group it is recorded
// instead (call_group.hpp) and runs at group_end().
#pragma once

#include <cstddef>
#include <utility>

#include <cclite/collective/call_group.hpp>
#include <cclite/collective/communicator.hpp>
#include <cclite/collective/device_hook.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/collective/work_queue.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

template <class... Transports>
inline status communicator<Transports...>::group_end() {
  auto outermost = group_.end();
  if (!outermost) return outermost.error();
  if (!outermost.value()) return {};
  return group_.run_and_clear([this](const op_desc& d) { return queue_.run(d); },
                              [](std::size_t n, const p2p_transfer* t) {
                                op_desc d = rooted<collective_kind::group>(nullptr, nullptr, n, dtype::uint8,
                                                                           reduce_op::sum, 0);
                                d.transfers = t;
                                return d;
                              });
}

// ---- the v-variants and point to point ----------------------------------------------------

// allgatherv and alltoallv check their receive blocks first (op.hpp: validate_recv_blocks).
template <class... Transports>
inline status communicator<Transports...>::allgatherv(const void* send, std::size_t send_count, void* recv,
                                                      const std::size_t* counts, const std::size_t* displs, dtype t) {
  const op_desc d = vdesc<collective_kind::allgatherv>(send, send_count, recv, counts, displs, nullptr, nullptr, t);
  CCLITE_TRY(detail::validate_recv_blocks(d, size_));
  return run(d);
}
template <class... Transports>
inline work communicator<Transports...>::allgatherv_async(const void* send, std::size_t send_count, void* recv,
                                                          const std::size_t* counts, const std::size_t* displs,
                                                          dtype t) {
  const op_desc d = vdesc<collective_kind::allgatherv>(send, send_count, recv, counts, displs, nullptr, nullptr, t);
  status st = detail::validate_recv_blocks(d, size_);
  return st.ok() ? submit(d) : work::failed(std::move(st));
}

template <class... Transports>
inline status communicator<Transports...>::alltoallv(const void* send, const std::size_t* send_counts,
                                                     const std::size_t* send_displs, void* recv,
                                                     const std::size_t* recv_counts, const std::size_t* recv_displs,
                                                     dtype t) {
  const op_desc d = vdesc<collective_kind::alltoallv>(send, 0, recv, send_counts, send_displs, recv_counts,
                                                      recv_displs, t);
  CCLITE_TRY(detail::validate_recv_blocks(d, size_));
  return run(d);
}
template <class... Transports>
inline work communicator<Transports...>::alltoallv_async(const void* send, const std::size_t* send_counts,
                                                         const std::size_t* send_displs, void* recv,
                                                         const std::size_t* recv_counts,
                                                         const std::size_t* recv_displs, dtype t) {
  const op_desc d = vdesc<collective_kind::alltoallv>(send, 0, recv, send_counts, send_displs, recv_counts,
                                                      recv_displs, t);
  status st = detail::validate_recv_blocks(d, size_);
  return st.ok() ? submit(d) : work::failed(std::move(st));
}

// gatherv and scatterv check the root's arrays first (op.hpp: validate_root_of_v).
template <class... Transports>
inline status communicator<Transports...>::gatherv(const void* send, std::size_t send_count, void* recv,
                                                   const std::size_t* recv_counts, const std::size_t* recv_displs,
                                                   dtype t, int root) {
  const op_desc d = vdesc<collective_kind::gatherv>(send, send_count, recv, recv_counts, recv_displs, nullptr,
                                                    nullptr, t, root);
  CCLITE_TRY(detail::validate_root_of_v(d, rank_, size_));
  return run(d);
}
template <class... Transports>
inline work communicator<Transports...>::gatherv_async(const void* send, std::size_t send_count, void* recv,
                                                       const std::size_t* recv_counts,
                                                       const std::size_t* recv_displs, dtype t, int root) {
  const op_desc d = vdesc<collective_kind::gatherv>(send, send_count, recv, recv_counts, recv_displs, nullptr,
                                                    nullptr, t, root);
  status st = detail::validate_root_of_v(d, rank_, size_);
  return st.ok() ? submit(d) : work::failed(std::move(st));
}

template <class... Transports>
inline status communicator<Transports...>::scatterv(const void* send, const std::size_t* send_counts,
                                                    const std::size_t* send_displs, void* recv,
                                                    std::size_t recv_count, dtype t, int root) {
  const op_desc d = vdesc<collective_kind::scatterv>(send, recv_count, recv, send_counts, send_displs, nullptr,
                                                     nullptr, t, root);
  CCLITE_TRY(detail::validate_root_of_v(d, rank_, size_));
  return run(d);
}
template <class... Transports>
inline work communicator<Transports...>::scatterv_async(const void* send, const std::size_t* send_counts,
                                                        const std::size_t* send_displs, void* recv,
                                                        std::size_t recv_count, dtype t, int root) {
  const op_desc d = vdesc<collective_kind::scatterv>(send, recv_count, recv, send_counts, send_displs, nullptr,
                                                     nullptr, t, root);
  status st = detail::validate_root_of_v(d, rank_, size_);
  return st.ok() ? submit(d) : work::failed(std::move(st));
}

template <class... Transports>
inline status communicator<Transports...>::reduce_scatterv(const void* send, void* recv,
                                                           const std::size_t* recv_counts, dtype t, reduce_op op) {
  const op_desc d = rsv_desc(send, recv, recv_counts, t, op, &reduction_for);
  CCLITE_TRY(detail::validate_counts_of_rsv(d, rank_, size_));
  return run(d);
}
template <class... Transports>
inline work communicator<Transports...>::reduce_scatterv_async(const void* send, void* recv,
                                                               const std::size_t* recv_counts, dtype t,
                                                               reduce_op op) {
  const op_desc d = rsv_desc(send, recv, recv_counts, t, op, &reduction_for);
  status st = detail::validate_counts_of_rsv(d, rank_, size_);
  return st.ok() ? submit(d) : work::failed(std::move(st));
}

template <class... Transports>
inline status communicator<Transports...>::send(const void* buf, std::size_t count, dtype t, int peer) {
  return run(rooted<collective_kind::send>(buf, nullptr, count, t, reduce_op::sum, peer));
}
template <class... Transports>
inline work communicator<Transports...>::send_async(const void* buf, std::size_t count, dtype t, int peer) {
  return submit(rooted<collective_kind::send>(buf, nullptr, count, t, reduce_op::sum, peer));
}
template <class... Transports>
inline status communicator<Transports...>::recv(void* buf, std::size_t count, dtype t, int peer) {
  return run(rooted<collective_kind::recv>(nullptr, buf, count, t, reduce_op::sum, peer));
}
template <class... Transports>
inline work communicator<Transports...>::recv_async(void* buf, std::size_t count, dtype t, int peer) {
  return submit(rooted<collective_kind::recv>(nullptr, buf, count, t, reduce_op::sum, peer));
}
template <class... Transports>
inline status communicator<Transports...>::sendrecv(const void* send, std::size_t send_count, int dst, void* recv,
                                                    std::size_t recv_count, int src, dtype t) {
  return run(sendrecv_desc(send, send_count, dst, recv, recv_count, src, t));
}
template <class... Transports>
inline work communicator<Transports...>::sendrecv_async(const void* send, std::size_t send_count, int dst,
                                                        void* recv, std::size_t recv_count, int src, dtype t) {
  return submit(sendrecv_desc(send, send_count, dst, recv, recv_count, src, t));
}

// ---- op_desc of each call -----------------------------------------------------------------
// Each call names its kind at compile time: the op_desc carries the code
// for that kind (op_desc::runner), compiled only for kinds the program calls.
// A reducing call also carries its kernels (op_desc::kernels): those of the
// element type for typed calls, reduction_for's table for a run-time dtype.

template <class... Transports>
template <collective_kind K>
inline op_desc communicator<Transports...>::rooted(const void* send, void* recv, std::size_t count, dtype t,
                                                   reduce_op op, int root, detail::kernel_lookup kernels) {
  op_desc d = op_desc::of(K, send, recv, count, t, op, root);
  d.runner = &core::template run_kind<K>;
  d.kernels = kernels;
  return d;
}

template <class... Transports>
template <collective_kind K, class T>
inline op_desc communicator<Transports...>::typed(const T* send, T* recv, std::size_t count, reduce_op op,
                                                  int root) {
  return rooted<K>(send, recv, count, dtype_of_v<T>, op, root, &detail::kernels_of<T>);
}

// hier_allreduce's calls on its children pass on the parent call's kernels.
template <class... Transports>
template <collective_kind K>
inline status communicator<Transports...>::run_with(const void* send, void* recv, std::size_t count, dtype t,
                                                    reduce_op op, detail::kernel_lookup kernels) {
  return run(rooted<K>(send, recv, count, t, op, 0, kernels));
}

template <class... Transports>
inline op_desc communicator<Transports...>::sendrecv_desc(const void* send, std::size_t send_count, int dst,
                                                          void* recv, std::size_t recv_count, int src, dtype t) {
  op_desc d = rooted<collective_kind::sendrecv>(send, recv, send_count, t, reduce_op::sum, dst);
  d.peer2 = src;
  d.count2 = recv_count;
  return d;
}

template <class... Transports>
template <collective_kind K>
inline op_desc communicator<Transports...>::vdesc(const void* send, std::size_t send_count, void* recv,
                                                  const std::size_t* counts, const std::size_t* displs,
                                                  const std::size_t* rcounts, const std::size_t* rdispls, dtype t,
                                                  int root) {
  op_desc d = rooted<K>(send, recv, send_count, t, reduce_op::sum, root);
  d.counts = counts;
  d.displs = displs;
  d.rcounts = rcounts;
  d.rdispls = rdispls;
  return d;
}

// reduce_scatterv: its count is this rank's block (the INFO lines' and error
// messages' size), the counts array the block of every rank.
template <class... Transports>
inline op_desc communicator<Transports...>::rsv_desc(const void* send, void* recv, const std::size_t* recv_counts,
                                                     dtype t, reduce_op op, detail::kernel_lookup kernels) const {
  op_desc d = rooted<collective_kind::reduce_scatterv>(send, recv, recv_counts ? recv_counts[rank_] : 0, t, op, 0,
                                                       kernels);
  d.counts = recv_counts;
  return d;
}

// ---- from the caller to the queue ---------------------------------------------------------
// Argument errors are reported at once on the calling rank, without queuing.
// Device buffers go to the device hook, if one is installed, once what was
// issued before has finished (issue order, as for every call).

template <class... Transports>
inline status communicator<Transports...>::run(const op_desc& d) {
  CCLITE_TRY(detail::validate(d, rank_, size_));
  if (group_.open()) return record(d);
  if (device_ && device_->owns(d)) return run_on_device(d);
  return queue_.run(d);
}

template <class... Transports>
inline work communicator<Transports...>::submit(const op_desc& d) {
  if (group_.open()) {
    return work::failed(make_error(errc::invalid_argument, "%s_async inside group_start() .. group_end(): "
                                   "use %s, the group's status comes from group_end()", to_string(d.kind),
                                   to_string(d.kind)));
  }
  status st = detail::validate(d, rank_, size_);
  if (!st.ok()) return work::failed(std::move(st));
  if (device_ && device_->owns(d)) return work::completed(run_on_device(d));
  return queue_.submit(d);
}

// A call inside a group, checked, to run at group_end() (call_group.hpp).
template <class... Transports>
inline status communicator<Transports...>::record(const op_desc& d) {
  if (device_ && device_->owns(d))
    return make_error(errc::unsupported, "%s on device buffers cannot be grouped", to_string(d.kind));
  group_.record(d);
  return {};
}

template <class... Transports>
inline status communicator<Transports...>::run_on_device(const op_desc& d) {
  queue_.wait_idle();
  return device_->run(d);
}

}  // namespace cclite
