// cclite/nccl/driver.hpp - what every nccl::backend call shares: the NCCL
// communicator and its failure state, the deadline-bounded wait that a
// non-blocking communicator needs (backend.hpp's file comment says why), the
// argument checks, and gather / scatter as grouped point-to-point calls.
// nccl::backend (backend.hpp, the public API) derives from it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/nccl/types.hpp>

namespace cclite::nccl::detail {

class driver {
 protected:
  driver(ncclComm_t comm, int rank, int size, int device, milliseconds timeout, bool check)
      : comm_(comm), rank_(rank), size_(size), device_(device), timeout_(timeout),
        check_pointers_(check) {}
  ~driver() = default;
  driver(const driver&) = delete;
  driver& operator=(const driver&) = delete;

  status fail(status s) {
    if (failed_.ok()) failed_ = s;
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    return s;
  }

  status check_wait(const char* what, deadline until) {
    if (abort_requested_.load()) {
      return fail(status(errc::aborted, std::string("nccl::backend: ") + what +
                                            ": aborted by request_abort()"));
    }
    if (until.expired()) {
      return fail(make_error(errc::timeout,
                             "nccl::backend rank %d: %s did not finish within %lld ms "
                             "(CCLITE_TIMEOUT); NCCL communicator aborted. A rank that never "
                             "made the same call, or died, is the usual cause",
                             rank_, what, static_cast<long long>(timeout_.count())));
    }
    return status();
  }

  // Non-blocking communicators report ncclInProgress until an operation has been
  // fully enqueued (or init has finished); this waits for the final result.
  status wait_async(const char* what, deadline until) {
    for (int spins = 0;; ++spins) {
      ncclResult_t async = ncclInProgress;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) return fail(nccl_status(r, "ncclCommGetAsyncError", comm_));
      if (async == ncclSuccess) return status();
      if (async != ncclInProgress) return fail(nccl_status(async, what, comm_));
      CCLITE_TRY(check_wait(what, until));
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  template <class F>
  status run(const char* what, F&& call) {
    ncclResult_t r = call();
    if (r == ncclInProgress) return wait_async(what, deadline::after(timeout_));
    if (r != ncclSuccess) return fail(nccl_status(r, what, comm_));
    return status();
  }

  // NCCL's reduction for `op` on this communicator. One rank: avg is the
  // identity, so it goes as ncclSum. NCCL 2.28.3 on an H200 left the last
  // count % 16 elements of an out-of-place ncclAvg reduce / reduce_scatter of
  // float and double unwritten on a 1-rank communicator (tests/gpu/run.sh,
  // device_comm_gpu's nccl rows); the sum gives the same bits and is right.
  result<ncclRedOp_t> nccl_op(reduce_op op) const {
    return to_nccl(size_ == 1 && op == reduce_op::avg ? reduce_op::sum : op);
  }

  status check_root(const char* what, int root) const {
    if (root < 0 || root >= size_) {
      return make_error(errc::invalid_argument, "%s: rank %d out of range [0, %d)", what, root, size_);
    }
    return status();
  }

  // gather / scatter as one NCCL group: the root sends or receives a block per
  // rank (its own block too, unless it is already in place), each other rank
  // one block. The group always closes, even after an error.
  status rooted_group(bool gather, const void* send, void* recv, std::size_t count, dtype t, int root,
                      cudaStream_t stream) {
    if (count == 0) return status();
    auto dt = to_nccl(t);
    if (!dt) return dt.error();
    const std::size_t block = count * size_of(t);
    const auto* s = static_cast<const char*>(send);
    auto* r = static_cast<char*>(recv);
    const std::size_t mine = block * static_cast<std::size_t>(rank_);
    const bool own_in_place = rank_ == root && (gather ? s == r + mine : r == s + mine);
    return run(gather ? "ncclGroupEnd (gather)" : "ncclGroupEnd (scatter)", [&] {
      auto fine = [](ncclResult_t x) { return x == ncclSuccess || x == ncclInProgress; };
      ncclResult_t e = ncclGroupStart();
      if (rank_ == root) {
        for (int p = 0; p < size_ && fine(e); ++p) {
          if (p == rank_ && own_in_place) continue;
          const std::size_t at = block * static_cast<std::size_t>(p);
          e = gather ? ncclRecv(r + at, count, dt.value(), p, comm_, stream)
                     : ncclSend(s + at, count, dt.value(), p, comm_, stream);
        }
      }
      if (fine(e) && !(rank_ == root && own_in_place)) {
        e = gather ? ncclSend(send, count, dt.value(), root, comm_, stream)
                   : ncclRecv(recv, count, dt.value(), root, comm_, stream);
      }
      const ncclResult_t end = ncclGroupEnd();
      return fine(e) ? end : e;
    });
  }

  status check_buffers(const char* what, const void* send, const void* recv, std::size_t count) {
    CCLITE_TRY(failed_);
    if (!comm_) return status(errc::aborted, "nccl::backend: communicator already aborted");
    if (count == 0) return status();
    if (!send || !recv) {
      return make_error(errc::invalid_argument, "%s: null buffer with count %zu", what, count);
    }
    if (check_pointers_) {
      for (const void* p : {send, recv}) {
        const auto info = cuda::query_pointer(p);
        if (info.kind == cuda::memory_kind::host || info.kind == cuda::memory_kind::pinned_host) {
          return make_error(errc::invalid_argument,
                            "%s: buffer %p is %s memory; NCCL needs device (cudaMalloc) or "
                            "managed memory: copy it to the device first, or use the CPU "
                            "communicator for host buffers",
                            what, p, cuda::to_string(info.kind));
        }
      }
    }
    return status();
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  milliseconds timeout_;
  bool check_pointers_ = true;
  status failed_;
  std::atomic<bool> abort_requested_{false};
};

}  // namespace cclite::nccl::detail
