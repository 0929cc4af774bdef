// cclite/cuda/staging.hpp - device buffers through a CPU communicator, staged in
// pinned host memory with copy / reduce overlap.
//
// For ranks whose GPUs cannot reach each other directly (other nodes, no peer
// access) or when CCLITE_GPU_BACKEND=native without IPC: the data goes
// device -> pinned host chunk -> the CPU communicator's collective (shm, tcp,
// verbs) -> device, chunk by chunk, with `slots` chunks in flight, so while the
// host reduces chunk c the copy engine is already bringing chunk c+1 up and
// taking chunk c-1 down. Not one big synchronous copy.
//
//   auto st = cclite::cuda::staging_buffers::create().value();   // 4 x 4 MiB pinned
//   cclite::check(cclite::cuda::staged_allreduce(*comm, d_grad, d_grad, n,
//                  cclite::dtype::float32, cclite::reduce_op::sum, stream, st));
//
// Blocks the calling host thread until every chunk has been reduced and copied
// back (each wait bounded by CCLITE_TIMEOUT): the host does the reduction, so
// it cannot be purely stream-ordered. Work already on `stream` before the call
// is ordered before the first copy. One stream carries both copy directions
// (H2D of chunk c-1 and D2H of chunk c+1 serialise on the copy engine, and
// stream order keeps a slot from being refilled before its H2D finished).
// The staging_buffers object may be reused by later calls; not by two at once.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <thread>
#include <utility>
#include <vector>

#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/runtime.hpp>

namespace cclite::cuda {

/// Waits for `ev` until `until`; polls (cudaEventQuery) so the wait is bounded.
inline status wait_event(cudaEvent_t ev, deadline until, const char* what) {
  for (int spins = 0;; ++spins) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return status();
    if (e != cudaErrorNotReady) return cuda_status(e, what);
    if (until.expired()) {
      return make_error(errc::timeout, "%s: the GPU did not finish within the deadline (CCLITE_TIMEOUT)",
                        what);
    }
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

/// Pinned host chunks and their events, allocated once and reused.
class staging_buffers {
 public:
  staging_buffers() = default;
  staging_buffers(staging_buffers&& o) noexcept { swap(o); }
  staging_buffers& operator=(staging_buffers&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  staging_buffers(const staging_buffers&) = delete;
  staging_buffers& operator=(const staging_buffers&) = delete;
  ~staging_buffers() { release(); }

  /// `slots` chunks of `chunk_bytes` pinned memory (cudaMallocHost), at least 2
  /// slots so copies overlap the host's work. unsupported without a device.
  static result<staging_buffers> create(std::size_t chunk_bytes = 4u << 20, int slots = 4) {
    if (chunk_bytes < 64 || slots < 2) {
      return make_error(errc::invalid_argument, "staging_buffers: chunk %zu bytes x %d slots (need >= 64 bytes, >= 2 slots)",
                        chunk_bytes, slots);
    }
    staging_buffers b;
    b.chunk_ = chunk_bytes;
    b.slots_.resize(static_cast<std::size_t>(slots));
    for (auto& s : b.slots_) {
      CCLITE_TRY(cuda_status(cudaMallocHost(&s.host, chunk_bytes), "cudaMallocHost (staging)"));
      CCLITE_TRY(cuda_status(cudaEventCreateWithFlags(&s.down, cudaEventDisableTiming), "cudaEventCreate"));
      CCLITE_TRY(cuda_status(cudaEventCreateWithFlags(&s.up, cudaEventDisableTiming), "cudaEventCreate"));
    }
    return result<staging_buffers>(std::move(b));
  }

  std::size_t chunk_bytes() const noexcept { return chunk_; }
  int slots() const noexcept { return static_cast<int>(slots_.size()); }

  struct slot {
    void* host = nullptr;
    cudaEvent_t down = nullptr;  ///< recorded after the device -> host copy into `host`
    cudaEvent_t up = nullptr;    ///< recorded after the host -> device copy out of `host`
  };
  slot& at(std::size_t i) noexcept { return slots_[i % slots_.size()]; }

 private:
  void swap(staging_buffers& o) noexcept {
    std::swap(chunk_, o.chunk_);
    std::swap(slots_, o.slots_);
  }
  void release() noexcept {
    for (auto& s : slots_) {
      if (s.up) (void)cudaEventSynchronize(s.up);  // an H2D may still read the chunk
      if (s.host) (void)cudaFreeHost(s.host);
      if (s.down) (void)cudaEventDestroy(s.down);
      if (s.up) (void)cudaEventDestroy(s.up);
    }
    slots_.clear();
  }

  std::size_t chunk_ = 0;
  std::vector<slot> slots_;
};

/// recv = op over ranks of send, for device buffers, through `comm` (any
/// cclite communicator: `comm.allreduce(void*, void*, count, dtype, reduce_op)`
/// on host memory). send == recv is in place. Every rank must call it with the
/// same count, dtype, op and the same staging chunk size (the chunks are
/// separate host collectives, matched in order).
template <class Comm>
status staged_allreduce(Comm& comm, const void* send, void* recv, std::size_t count, dtype t,
                        reduce_op op, cudaStream_t stream, staging_buffers& st) {
  if (!is_valid(t) || !is_valid(op)) {
    return make_error(errc::invalid_argument, "staged_allreduce: bad dtype or op");
  }
  if (count == 0) return status();
  if (!send || !recv) return make_error(errc::invalid_argument, "staged_allreduce: null buffer");
  if (st.slots() < 2) return make_error(errc::invalid_argument, "staged_allreduce: no staging buffers");
  auto to = env::timeout();
  if (!to) return to.error();
  const std::size_t es = size_of(t);
  // Whole elements per chunk, so no element straddles two host collectives.
  const std::size_t per_chunk = std::max<std::size_t>(1, st.chunk_bytes() / es);
  const std::size_t chunks = (count + per_chunk - 1) / per_chunk;
  const auto* src = static_cast<const unsigned char*>(send);
  auto* dst = static_cast<unsigned char*>(recv);
  auto elems = [&](std::size_t c) { return std::min(per_chunk, count - c * per_chunk); };
  auto down = [&](std::size_t c) -> status {
    auto& s = st.at(c);
    CCLITE_TRY(cuda_status(cudaMemcpyAsync(s.host, src + c * per_chunk * es, elems(c) * es,
                                           cudaMemcpyDeviceToHost, stream),
                           "staged_allreduce: cudaMemcpyAsync device -> host"));
    return cuda_status(cudaEventRecord(s.down, stream), "cudaEventRecord");
  };
  const std::size_t ahead = std::min<std::size_t>(chunks, static_cast<std::size_t>(st.slots()));
  for (std::size_t c = 0; c < ahead; ++c) CCLITE_TRY(down(c));
  for (std::size_t c = 0; c < chunks; ++c) {
    auto& s = st.at(c);
    CCLITE_TRY(wait_event(s.down, deadline::after(to.value()), "staged_allreduce: device -> host copy"));
    CCLITE_TRY(comm.allreduce(s.host, s.host, elems(c), t, op));
    CCLITE_TRY(cuda_status(cudaMemcpyAsync(dst + c * per_chunk * es, s.host, elems(c) * es,
                                           cudaMemcpyHostToDevice, stream),
                           "staged_allreduce: cudaMemcpyAsync host -> device"));
    CCLITE_TRY(cuda_status(cudaEventRecord(s.up, stream), "cudaEventRecord"));
    // Same slot, later on the same stream: runs after this H2D has read it.
    if (c + ahead < chunks) CCLITE_TRY(down(c + ahead));
  }
  // The last H2D copies must finish before the caller may reuse `st` or free recv's source.
  for (std::size_t c = chunks > ahead ? chunks - ahead : 0; c < chunks; ++c) {
    CCLITE_TRY(wait_event(st.at(c).up, deadline::after(to.value()), "staged_allreduce: host -> device copy"));
  }
  return status();
}

}  // namespace cclite::cuda
