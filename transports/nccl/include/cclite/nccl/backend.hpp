// cclite/nccl/backend.hpp - whole collectives on device buffers, run by NCCL.
//
//   auto kv = cclite::file_store::open("/shared/rdzv/job42").value();
//   auto nccl = cclite::nccl::backend::create(*kv, rank, size).value();
//   nccl->allreduce(d_grad, d_grad, n, cclite::dtype::bfloat16, cclite::reduce_op::avg, stream);
//   cclite::check(nccl->synchronize(stream));   // bounded by CCLITE_TIMEOUT
//
// Set-up goes through cclite's own store (types.hpp: rank 0's ncclUniqueId is
// shared as a store value), so a job started by cclite-run, torchrun, mpirun or
// srun gets an NCCL communicator without MPI. The communicator is created
// non-blocking (ncclConfig_t::blocking = 0): every NCCL call returns at once
// and cclite polls ncclCommGetAsyncError against a deadline, aborting the
// communicator (ncclCommAbort) when it passes, so a missing or dead rank gives
// errc::timeout on the ranks that wait, never a hang.
//
// Calls are stream-ordered: they enqueue on `stream` and return without waiting
// for the GPU. `synchronize(stream)` waits with the deadline. All ranks must make
// the same calls in the same order (NCCL's rule; mismatches are not detected
// here: they hang until the deadline). After a timeout, peer loss or abort the
// backend is unusable: every later call returns that error.
//
// Buffers must be device (or managed) memory; a host pointer is
// errc::invalid_argument naming the argument (options::check_pointers = false
// skips the check, ~1 us a pointer). Thread safety: one thread at a time, except
// request_abort(), which any thread may call.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <cclite/bootstrap/store.hpp>
#include <cclite/core/env.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/nccl/driver.hpp>
#include <cclite/nccl/types.hpp>

namespace cclite::nccl {

struct options {
  /// CUDA device of this rank; -1: LOCAL_RANK (CCLITE_LOCAL_RANK first) modulo the
  /// device count, else device 0.
  int device = -1;
  /// Bound on init and on every wait; -2: CCLITE_TIMEOUT; zero or negative: none.
  milliseconds timeout{-2};
  /// Store key of this communicator's unique id; one per communicator on a store.
  std::string key = "cclite/nccl/unique_id";
  /// Reject host pointers with invalid_argument (one cudaPointerGetAttributes each).
  bool check_pointers = true;
};

class backend : detail::driver {
 public:
  /// Joins the NCCL communicator of `size` ranks met through `kv`. Errors:
  /// unsupported (no CUDA device: checked before touching the store, so every
  /// rank of a GPU-less job fails at once), invalid_argument (rank, size,
  /// device), timeout (a rank never came), system_error (NCCL / CUDA failure).
  static result<std::unique_ptr<backend>> create(store& kv, int rank, int size, options opts = {}) {
    milliseconds to{0};
    int dev = -1;
    CCLITE_TRY(prepare(rank, size, opts, to, dev));
    const deadline until = deadline::after(to);
    auto id = exchange_unique_id(kv, opts.key, rank, until);
    if (!id) return id.error();
    return join(id.value(), rank, size, dev, to, until, opts.check_pointers);
  }

  /// Joins the NCCL communicator of `size` ranks that share `id` (made by one
  /// rank with ncclGetUniqueId and sent to the others by any means, e.g.
  /// types.hpp's broadcast_unique_id over a CPU communicator). Same errors as
  /// create(); the device is chosen the same way.
  static result<std::unique_ptr<backend>> create_with_id(const ncclUniqueId& id, int rank, int size,
                                                         options opts = {}) {
    milliseconds to{0};
    int dev = -1;
    CCLITE_TRY(prepare(rank, size, opts, to, dev));
    const deadline until = deadline::after(to);
    return join(id, rank, size, dev, to, until, opts.check_pointers);
  }

 private:
  // Checks rank and size, resolves the timeout, finds a device (unsupported
  // "no CUDA device" first of all) and makes it current.
  static status prepare(int rank, int size, const options& opts, milliseconds& to, int& dev) {
    if (size < 1 || rank < 0 || rank >= size) {
      return make_error(errc::invalid_argument, "nccl::backend: rank %d of size %d", rank, size);
    }
    auto t = env::timeout_option(opts.timeout);
    if (!t) return t.error();
    to = t.value();
    auto count = cuda::device_count();
    if (!count) {
      return make_error(count.error().code(), "nccl::backend rank %d: %s", rank,
                        count.error().message().c_str());
    }
    dev = opts.device;
    if (dev < 0) {
      const char* lr = env::raw("LOCAL_RANK", false);
      if (!lr) lr = std::getenv("LOCAL_RANK");
      dev = lr ? std::atoi(lr) % count.value() : 0;
    }
    return cuda::set_device(dev);
  }

  static result<std::unique_ptr<backend>> join(const ncclUniqueId& id, int rank, int size, int dev,
                                               milliseconds to, deadline until, bool check_pointers) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns; we poll with a deadline (file comment)
    ncclComm_t comm = nullptr;
    ncclUniqueId copy = id;  // ncclCommInitRankConfig takes it by value
    ncclResult_t r = ncclCommInitRankConfig(&comm, size, copy, rank, &config);
    std::unique_ptr<backend> b(new backend(comm, rank, size, dev, to, check_pointers));
    if (r != ncclSuccess && r != ncclInProgress) {
      status s = nccl_status(r, "ncclCommInitRankConfig", comm);  // before abort frees comm
      b->abort();
      return s;
    }
    CCLITE_TRY(b->wait_async("ncclCommInitRankConfig (did every rank call create()?)", until));
    // Spelled out: nvcc's C++17 front end does not move into result's constructor.
    return result<std::unique_ptr<backend>>(std::move(b));
  }

 public:
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;

  /// Flushes and frees the communicator (ncclCommFinalize, bounded by the
  /// timeout; aborts it when that passes).
  ~backend() {
    if (!comm_) return;
    if (failed_.ok() && !abort_requested_.load()) {
      const ncclResult_t r = ncclCommFinalize(comm_);
      if ((r == ncclSuccess || r == ncclInProgress) &&
          wait_async("ncclCommFinalize", deadline::after(timeout_)).ok()) {
        (void)ncclCommDestroy(comm_);
        return;
      }
    }
    if (comm_) (void)ncclCommAbort(comm_);  // wait_async's failure may have done it already
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  ncclComm_t native_handle() const noexcept { return comm_; }

  /// recv[i] = op over ranks of send[i]; send == recv is in place.
  status allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                   cudaStream_t stream) {
    CCLITE_TRY(check_buffers("allreduce", send, recv, count));
    auto dt = to_nccl(t);
    auto o = nccl_op(op);
    if (!dt) return dt.error();
    if (!o) return o.error();
    return run("ncclAllReduce", [&] {
      return ncclAllReduce(send, recv, count, dt.value(), o.value(), comm_, stream);
    });
  }

  /// recv = root's send on every rank (send is read on the root only).
  status broadcast(const void* send, void* recv, std::size_t count, dtype t, int root,
                   cudaStream_t stream) {
    CCLITE_TRY(check_root("broadcast", root));
    CCLITE_TRY(check_buffers("broadcast", rank_ == root ? send : recv, recv, count));
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    return run("ncclBroadcast", [&] {
      return ncclBroadcast(send, recv, count, dt.value(), root, comm_, stream);
    });
  }

  /// recv on `root` = op over ranks of send (recv is written on the root only).
  status reduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, int root,
                cudaStream_t stream) {
    CCLITE_TRY(check_root("reduce", root));
    CCLITE_TRY(check_buffers("reduce", send, rank_ == root ? recv : send, count));
    auto dt = to_nccl(t);
    auto o = nccl_op(op);
    if (!dt) return dt.error();
    if (!o) return o.error();
    return run("ncclReduce", [&] {
      return ncclReduce(send, recv, count, dt.value(), o.value(), root, comm_, stream);
    });
  }

  /// recv (size * count elements) = every rank's send (count elements), in rank order.
  status allgather(const void* send, void* recv, std::size_t count, dtype t, cudaStream_t stream) {
    CCLITE_TRY(check_buffers("allgather", send, recv, count));
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    return run("ncclAllGather", [&] {
      return ncclAllGather(send, recv, count, dt.value(), comm_, stream);
    });
  }

  /// recv (count elements) = op over ranks of this rank's slice of send (size * count).
  status reduce_scatter(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                        cudaStream_t stream) {
    CCLITE_TRY(check_buffers("reduce_scatter", send, recv, count));
    auto dt = to_nccl(t);
    auto o = nccl_op(op);
    if (!dt) return dt.error();
    if (!o) return o.error();
    return run("ncclReduceScatter", [&] {
      return ncclReduceScatter(send, recv, count, dt.value(), o.value(), comm_, stream);
    });
  }

  /// Block p of send (count elements) goes to rank p, arriving as block `rank` of
  /// its recv. NCCL has no alltoall: grouped ncclSend/ncclRecv, as nccl-tests does.
  status alltoall(const void* send, void* recv, std::size_t count, dtype t, cudaStream_t stream) {
    CCLITE_TRY(check_buffers("alltoall", send, recv, count));
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    const std::size_t block = count * size_of(t);
    return run("ncclGroupEnd (alltoall)", [&] {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size_ && (r == ncclSuccess || r == ncclInProgress); ++p) {
        r = ncclSend(static_cast<const char*>(send) + block * static_cast<std::size_t>(p), count,
                     dt.value(), p, comm_, stream);
        if (r == ncclSuccess || r == ncclInProgress) {
          r = ncclRecv(static_cast<char*>(recv) + block * static_cast<std::size_t>(p), count,
                       dt.value(), p, comm_, stream);
        }
      }
      ncclResult_t e = ncclGroupEnd();  // always closes the group, even after an error
      return r == ncclSuccess || r == ncclInProgress ? e : r;
    });
  }

  /// root's recv (size * count elements) = every rank's send (count), in rank
  /// order; the other ranks' recv is not used. NCCL has no gather: grouped
  /// ncclSend / ncclRecv (nccl-tests' gather). In place on the root: send ==
  /// recv + root * count (the root's own block is then not copied).
  status gather(const void* send, void* recv, std::size_t count, dtype t, int root, cudaStream_t stream) {
    CCLITE_TRY(check_root("gather", root));
    CCLITE_TRY(check_buffers("gather", send, rank_ == root ? recv : send, count));
    return rooted_group(true, send, recv, count, t, root, stream);
  }

  /// Every rank's recv (count elements) = block `rank` of root's send (size *
  /// count); the other ranks' send is not read. Grouped ncclSend / ncclRecv.
  /// In place on the root: recv == send + root * count.
  status scatter(const void* send, void* recv, std::size_t count, dtype t, int root, cudaStream_t stream) {
    CCLITE_TRY(check_root("scatter", root));
    CCLITE_TRY(check_buffers("scatter", rank_ == root ? send : recv, recv, count));
    return rooted_group(false, send, recv, count, t, root, stream);
  }

  /// Rank r's send (counts[r] elements; `send_count` here) lands at recv +
  /// displs[r] on every rank (size entries each, equal on all ranks). Grouped
  /// ncclSend / ncclRecv. In place: send == recv + displs[rank].
  status allgatherv(const void* send, std::size_t send_count, void* recv, const std::size_t* counts,
                    const std::size_t* displs, dtype t, cudaStream_t stream) {
    if (!counts || !displs) return make_error(errc::invalid_argument, "allgatherv: null counts or displacements");
    CCLITE_TRY(check_buffers("allgatherv", send ? send : recv, recv, recv ? 1 : 0));
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    const std::size_t es = size_of(t);
    const bool in_place = send == static_cast<const char*>(recv) + displs[rank_] * es;
    return run("ncclGroupEnd (allgatherv)", [&] {
      auto fine = [](ncclResult_t x) { return x == ncclSuccess || x == ncclInProgress; };
      ncclResult_t e = ncclGroupStart();
      for (int p = 0; p < size_ && fine(e); ++p) {
        if (p == rank_ && in_place) continue;
        if (send_count) e = ncclSend(send, send_count, dt.value(), p, comm_, stream);
        if (fine(e) && counts[p]) e = ncclRecv(static_cast<char*>(recv) + displs[p] * es, counts[p], dt.value(), p, comm_, stream);
      }
      const ncclResult_t end = ncclGroupEnd();
      return fine(e) ? end : e;
    });
  }

  /// Block p of send (send_counts[p] elements at send_displs[p]) goes to rank p,
  /// arriving at its recv + recv_displs[rank]. Grouped ncclSend / ncclRecv; not
  /// in place (send == recv is invalid_argument: the group would overwrite
  /// blocks not yet sent).
  status alltoallv(const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
                   const std::size_t* recv_counts, const std::size_t* recv_displs, dtype t, cudaStream_t stream) {
    if (!send_counts || !send_displs || !recv_counts || !recv_displs) {
      return make_error(errc::invalid_argument, "alltoallv: null counts or displacements");
    }
    if (send == recv) return make_error(errc::invalid_argument, "alltoallv: in place is not offered on NCCL");
    // A rank with nothing to send or receive may pass null there.
    CCLITE_TRY(check_buffers("alltoallv", send ? send : recv, recv ? recv : send, send || recv ? 1 : 0));
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    const std::size_t es = size_of(t);
    return run("ncclGroupEnd (alltoallv)", [&] {
      auto fine = [](ncclResult_t x) { return x == ncclSuccess || x == ncclInProgress; };
      ncclResult_t e = ncclGroupStart();
      for (int p = 0; p < size_ && fine(e); ++p) {
        if (send_counts[p]) {
          e = ncclSend(static_cast<const char*>(send) + send_displs[p] * es, send_counts[p], dt.value(), p, comm_, stream);
        }
        if (fine(e) && recv_counts[p]) {
          e = ncclRecv(static_cast<char*>(recv) + recv_displs[p] * es, recv_counts[p], dt.value(), p, comm_, stream);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return fine(e) ? end : e;
    });
  }

  /// Point to point; the peer must make the matching recv / send.
  status send(const void* buf, std::size_t count, dtype t, int peer, cudaStream_t stream) {
    CCLITE_TRY(check_root("send", peer));
    CCLITE_TRY(check_buffers("send", buf, buf, count));
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    return run("ncclSend", [&] { return ncclSend(buf, count, dt.value(), peer, comm_, stream); });
  }
  status recv(void* buf, std::size_t count, dtype t, int peer, cudaStream_t stream) {
    CCLITE_TRY(check_root("recv", peer));
    CCLITE_TRY(check_buffers("recv", buf, buf, count));
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    return run("ncclRecv", [&] { return ncclRecv(buf, count, dt.value(), peer, comm_, stream); });
  }

  /// Sends `sendcount` elements to `dst` and receives `recvcount` from `src` in one
  /// NCCL group (so a ring shift, or a send to oneself, cannot deadlock).
  status sendrecv(const void* sendbuf, std::size_t sendcount, int dst, void* recvbuf,
                  std::size_t recvcount, int src, dtype t, cudaStream_t stream) {
    CCLITE_TRY(check_root("sendrecv", dst));
    CCLITE_TRY(check_root("sendrecv", src));
    CCLITE_TRY(check_buffers("sendrecv", sendbuf, sendbuf, sendcount));
    CCLITE_TRY(check_buffers("sendrecv", recvbuf, recvbuf, recvcount));
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    return run("ncclGroupEnd (sendrecv)", [&] {
      ncclResult_t r = ncclGroupStart();
      if (r == ncclSuccess || r == ncclInProgress) r = ncclSend(sendbuf, sendcount, dt.value(), dst, comm_, stream);
      if (r == ncclSuccess || r == ncclInProgress) r = ncclRecv(recvbuf, recvcount, dt.value(), src, comm_, stream);
      ncclResult_t e = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? e : r;
    });
  }

  /// Waits until all work on `stream` has finished, or the timeout passes
  /// (then the communicator is aborted and every rank waiting on this one gets
  /// its own timeout or peer_lost). Polls NCCL's asynchronous error meanwhile, so a
  /// failed peer ends the wait at once.
  status synchronize(cudaStream_t stream) {
    CCLITE_TRY(failed_);
    const deadline until = deadline::after(timeout_);
    for (int spins = 0;; ++spins) {
      cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return status();
      if (e != cudaErrorNotReady) return fail(cuda::cuda_status(e, "cudaStreamQuery"));
      ncclResult_t async = ncclSuccess;
      (void)ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        return fail(nccl_status(async, "NCCL asynchronous error", comm_));
      }
      CCLITE_TRY(check_wait("synchronize", until));
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  /// Aborts the NCCL communicator now (ncclCommAbort); later calls return aborted.
  void abort() noexcept {
    abort_requested_.store(true);
    if (failed_.ok()) failed_ = status(errc::aborted, "nccl::backend: abort() was called");
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  /// From any thread: makes the current or next wait of the owning thread abort
  /// the communicator and return aborted within about a millisecond.
  void request_abort() noexcept { abort_requested_.store(true); }

 private:
  backend(ncclComm_t comm, int rank, int size, int device, milliseconds timeout, bool check)
      : detail::driver(comm, rank, size, device, timeout, check) {}
};

}  // namespace cclite::nccl
