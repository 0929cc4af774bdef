// cclite/cuda/staged_engine.hpp - device_communicator's native engine: stream-ordered
// collectives on device buffers through a CPU communicator, staged in pinned memory.
//
// Internal (cclite::cuda::detail): device_communicator checks the arguments and
// owns the engine; use device_communicator.
//
// Each call is cut into chunks of at most one staging slot (device_options::
// chunk_bytes). Per chunk, on three streams:
//   copy stream    waits until the slot's previous user is done with it, copies
//                  this rank's device data into the pinned slot (device -> host),
//                  records `down`
//   host stream    waits for `down`, runs a CUDA host function that calls the CPU
//                  collective on the slot (on a communicator split off for the
//                  engine, so it never interleaves with the caller's CPU calls),
//                  records `reduced`
//   caller stream  waits for `reduced`, copies the result out of the slot (host ->
//                  device), records the slot's `up` ("slot free")
// The copy stream waits once per call for the work already on the caller's
// stream, so the data read is the data the caller enqueued; everything enqueued
// on the caller's stream afterwards runs after the chunks' `reduced` events, so
// it sees the result and may overwrite the send buffer. Later chunks' device ->
// host copies overlap the host collective of earlier ones (`slots` in flight).
//
// What each rank copies (send / recv: the caller's device buffers; `count`
// elements, per rank for allgather and reduce_scatter):
//   allreduce       send chunk -> slot; allreduce in place; slot -> recv chunk
//   broadcast       root: buf chunk -> slot; the others: nothing. broadcast in
//                   place; the others: slot -> buf chunk, the root: nothing
//   reduce          send chunk -> slot; reduce (in place on the root); root only:
//                   slot -> recv chunk
//   allgather       this rank's send chunk -> its piece of the slot; allgather in
//                   place; every piece -> its rank's block of recv (one 2D copy)
//   reduce_scatter  the chunk of every rank's block of send -> the slot (one 2D
//                   copy); reduce_scatter in place; this rank's piece -> recv chunk
//   gather          as allgather, but only the root copies the slot out
//   scatter         root: as reduce_scatter's way in; the others: nothing. scatter
//                   in place; this rank's piece -> recv chunk
//   alltoall        as reduce_scatter's way in; alltoall in place (the CPU
//                   communicator's in-place form); every piece -> recv (2D copy)
//   send / recv     sender: send chunk -> slot, then the CPU send; receiver: the
//                   CPU recv, then slot -> recv chunk. Chunks match in order (both
//                   sides cut `count` alike), and the CPU send / recv rules hold:
//                   a chunk larger than the link buffer waits for its receiver,
//                   so two ranks sending to each other first deadlock (until the
//                   timeout) exactly as with host buffers
// Where a rank copies nothing out, its slot is free once the host function has
// run, so `up` is recorded on the host stream instead.
//
// Chunking: the chunks are separate CPU collectives matched in order across
// ranks, so every rank must cut a call the same way. allreduce, broadcast and
// reduce cut `count` into chunk_bytes / element-size pieces. allgather,
// reduce_scatter, gather, scatter and alltoall cut the per-rank count instead, chunk_bytes / (element size x
// ranks) elements of each rank's piece per chunk: a chunk then holds piece c of
// every rank side by side, so each chunk is one ordinary CPU allgather /
// reduce_scatter of n elements per rank on every rank (cutting the whole
// size x count buffer would give chunks that start in the middle of one rank's
// block on one rank and not on another, i.e. different calls). The result
// depends only on (count, dtype, ranks, chunk_bytes), which every rank shares.
//
// A host function blocks in the CPU collective until the peers reach the same
// chunk; the CUDA runtime may run a process's host functions one at a time on
// one thread, so this holds while every rank issues the same collectives in the
// same order (cclite's rule anyway). At most `max_pending_chunks` chunks may be
// enqueued and not yet run; a call beyond that waits (bounded) for the oldest.
// Every wait is bounded by the timeout; a failed host collective is kept and
// returned by every later call (the engine is then unusable).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cclite/collective/op.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/cuda/staging.hpp>

namespace cclite::cuda::detail {

/// allgather, reduce_scatter, gather, scatter, alltoall: buffers of one piece
/// per rank, chunked per piece.
inline bool per_rank_pieces(collective_kind k) noexcept {
  return k == collective_kind::allgather || k == collective_kind::reduce_scatter ||
         k == collective_kind::gather || k == collective_kind::scatter || k == collective_kind::alltoall;
}

/// Elements of each rank's piece in one staged chunk (of the whole buffer for
/// allreduce, broadcast, reduce); see the file comment. invalid_argument when
/// a `chunk_bytes` slot cannot hold one element of every rank.
inline result<std::size_t> staged_chunk_elems(collective_kind k, dtype t, int size, std::size_t chunk_bytes) {
  const std::size_t rows = per_rank_pieces(k) ? static_cast<std::size_t>(std::max(1, size)) : 1;
  const std::size_t row_bytes = size_of(t) * rows;
  const std::size_t per = chunk_bytes / row_bytes;
  if (per == 0) {
    return make_error(errc::invalid_argument,
                      "device %s: a staging chunk of %zu bytes cannot hold one %s element of each of %d "
                      "ranks; set device_options::chunk_bytes to at least %zu",
                      to_string(k), chunk_bytes, to_string(t), size, row_bytes);
  }
  return per;
}

/// Polls `stream` until its work has run, sleeping a little between polls after
/// the first ~200. Ends early with `failed()` when that is not ok (a failed
/// host collective), with the CUDA error, or with errc::timeout after `timeout`.
template <class Failed>
status wait_stream(cudaStream_t stream, milliseconds timeout, int rank, Failed&& failed) {
  const deadline until = deadline::after(timeout);
  for (int spins = 0;; ++spins) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return status();
    if (e != cudaErrorNotReady) return cuda_status(e, "device_communicator: cudaStreamQuery");
    CCLITE_TRY(failed());
    if (until.expired()) {
      return make_error(errc::timeout,
                        "device_communicator rank %d: the stream did not finish within %lld ms "
                        "(CCLITE_TIMEOUT); a rank that never made the same call is the usual cause",
                        rank, static_cast<long long>(timeout.count()));
    }
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

/// The native engine's settings (device_options'), for both its paths.
struct native_config {
  std::size_t chunk_bytes = std::size_t{4} << 20;
  int slots = 4;
  int max_pending_chunks = 256;  ///< staged path only
  milliseconds timeout{120000};
};

template <class Comm>
class staged_engine {
 public:
  /// Collective over `host`: splits the engine's communicator off it, then
  /// allocates the pinned slots, events and streams on the current device.
  static result<std::unique_ptr<staged_engine>> create(Comm& host, const native_config& c) {
    std::unique_ptr<staged_engine> e(new staged_engine(c));
    auto chan = host.split(0, host.rank());  // same ranks, same order: roots carry over
    if (!chan) return chan.error();
    e->chan_ = std::move(chan.value());
    CCLITE_TRY(e->init());
    return result<std::unique_ptr<staged_engine>>(std::move(e));
  }

  staged_engine(const staged_engine&) = delete;
  staged_engine& operator=(const staged_engine&) = delete;

  /// Waits for every enqueued host function (they use this object), bounded by
  /// the timeout; past it the engine's communicator is aborted so they return.
  ~staged_engine() {
    if (chan_) {
      const deadline until = deadline::after(cfg_.timeout);
      while (!idle()) {
        if (until.expired()) {
          chan_->abort();
          while (!idle()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    for (auto& s : slots_) {
      if (s.reduced) (void)cudaEventDestroy(s.reduced);
    }
    if (start_) (void)cudaEventDestroy(start_);
    // staging_ (pinned chunks) waits for each slot's last `up` itself.
  }

  int rank() const noexcept { return chan_->rank(); }
  int size() const noexcept { return chan_->size(); }

  /// Enqueues collective `k` (allreduce, broadcast, reduce, allgather,
  /// reduce_scatter, gather, scatter or alltoall) or a send / recv on `stream`,
  /// chunk by chunk, and returns. The arguments must have been checked
  /// (device_communicator does). `root`: the rooted ones' root, send's / recv's
  /// peer; `op`: the reducing ones only; send: `send` only, recv: `recv` only.
  status enqueue(collective_kind k, const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                 int root, cudaStream_t stream) {
    CCLITE_TRY(failure());
    auto per = staged_chunk_elems(k, t, size(), staging_.chunk_bytes());
    if (!per) return per.error();
    if (count == 0) return status();
    const std::size_t es = size_of(t);
    const std::size_t per_chunk = per.value();
    const std::size_t chunks = (count + per_chunk - 1) / per_chunk;
    const std::size_t rows = per_rank_pieces(k) ? static_cast<std::size_t>(size()) : 1;
    const std::size_t me = static_cast<std::size_t>(rank());
    const bool is_root = rank() == root;
    // The file comment's table: which copies this rank makes, and whether they
    // move every rank's row of the slot (rows) or this rank's piece only.
    // send / recv: `root` is the peer; the sender only copies down, the receiver only up.
    const bool down = !((k == collective_kind::broadcast || k == collective_kind::scatter) && !is_root) &&
                      k != collective_kind::recv;
    const bool up = !(k == collective_kind::broadcast && is_root) &&
                    !((k == collective_kind::reduce || k == collective_kind::gather) && !is_root) &&
                    k != collective_kind::send;
    const bool rows_down = k == collective_kind::reduce_scatter || k == collective_kind::alltoall ||
                           k == collective_kind::scatter;
    const bool rows_up = k == collective_kind::allgather || k == collective_kind::alltoall ||
                         k == collective_kind::gather;
    const auto* src = static_cast<const unsigned char*>(send);
    auto* dst = static_cast<unsigned char*>(recv);
    const std::size_t pitch = count * es;  // bytes between two ranks' blocks in send / recv
    const char* name = to_string(k);
    auto ok = [&](cudaError_t e, const char* what) -> status {
      if (e == cudaSuccess) return status();
      return fail(cuda_status(e, (std::string("device ") + name + ": " + what).c_str()));
    };
    CCLITE_TRY(ok(cudaEventRecord(start_, stream), "cudaEventRecord"));
    CCLITE_TRY(ok(cudaStreamWaitEvent(copy_stream_.get(), start_, 0), "cudaStreamWaitEvent"));
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t off = c * per_chunk * es;  // byte offset of the chunk in each rank's block
      const std::size_t n = std::min(per_chunk, count - c * per_chunk);
      const std::size_t w = n * es;
      // The job record first: its (bounded) wait comes before anything of this chunk is enqueued.
      auto j = take_job();
      if (!j) return j.error();
      const std::size_t si = next_slot_++ % slots_.size();
      auto& hs = staging_.at(si);
      auto& ev = slots_[si];
      // The slot's previous user (an H2D on some caller's stream, or a host
      // function) must be done with it before it is refilled.
      if (ev.used) CCLITE_TRY(ok(cudaStreamWaitEvent(copy_stream_.get(), hs.up, 0), "cudaStreamWaitEvent"));
      ev.used = true;
      auto* h = static_cast<unsigned char*>(hs.host);
      unsigned char* mine = h + (rows > 1 ? me * w : 0);  // this rank's piece of the slot
      if (down) {
        const cudaError_t e = rows_down
                                  ? copy_rows(h, w, src + off, pitch, w, rows, cudaMemcpyDeviceToHost,
                                              copy_stream_.get())
                                  : cudaMemcpyAsync(mine, src + off, w, cudaMemcpyDeviceToHost,
                                                    copy_stream_.get());
        CCLITE_TRY(ok(e, "cudaMemcpyAsync device -> host"));
      }
      CCLITE_TRY(ok(cudaEventRecord(hs.down, copy_stream_.get()), "cudaEventRecord"));
      CCLITE_TRY(ok(cudaStreamWaitEvent(host_stream_.get(), hs.down, 0), "cudaStreamWaitEvent"));
      job& jb = *j.value();
      jb.self = this;
      jb.host = h;
      jb.count = n;
      jb.kind = k;
      jb.t = t;
      jb.op = op;
      jb.root = root;
      jb.busy.store(true, std::memory_order_release);
      const cudaError_t le = cudaLaunchHostFunc(host_stream_.get(), &run_job, &jb);
      if (le != cudaSuccess) {
        jb.busy.store(false, std::memory_order_release);
        return ok(le, "cudaLaunchHostFunc");
      }
      CCLITE_TRY(ok(cudaEventRecord(ev.reduced, host_stream_.get()), "cudaEventRecord"));
      // Every chunk, copied out or not: later work on `stream` runs after the collective.
      CCLITE_TRY(ok(cudaStreamWaitEvent(stream, ev.reduced, 0), "cudaStreamWaitEvent"));
      if (up) {
        const cudaError_t e = rows_up
                                  ? copy_rows(dst + off, pitch, h, w, w, rows, cudaMemcpyHostToDevice, stream)
                                  : cudaMemcpyAsync(dst + off, mine, w, cudaMemcpyHostToDevice, stream);
        CCLITE_TRY(ok(e, "cudaMemcpyAsync host -> device"));
        CCLITE_TRY(ok(cudaEventRecord(hs.up, stream), "cudaEventRecord"));
      } else {
        // Nothing reads the slot after the host function: free once it ran.
        CCLITE_TRY(ok(cudaEventRecord(hs.up, host_stream_.get()), "cudaEventRecord"));
      }
    }
    return status();
  }

  /// Waits until everything enqueued on `stream` has run (bounded by the
  /// timeout), then reports the first failure of an enqueued collective.
  status synchronize(cudaStream_t stream) {
    CCLITE_TRY(failure());
    status s = wait_stream(stream, cfg_.timeout, rank(), [this] { return failure(); });
    return s.ok() ? failure() : fail(std::move(s));
  }

  /// The first failure seen, ok if none.
  status failure() const {
    std::lock_guard<std::mutex> g(mu_);
    return failed_;
  }

 private:
  // One chunk's host collective, run by a CUDA host function. A fixed ring of
  // these: no allocation per call.
  struct job {
    staged_engine* self = nullptr;
    unsigned char* host = nullptr;  ///< the pinned slot
    std::size_t count = 0;          ///< elements of each rank's piece in the slot
    collective_kind kind = collective_kind::allreduce;
    dtype t = dtype::float32;
    reduce_op op = reduce_op::sum;
    int root = 0;
    std::atomic<bool> busy{false};
  };
  struct slot_events {
    cudaEvent_t reduced = nullptr;  ///< recorded on host_stream_ after the chunk's host function
    bool used = false;
  };

  explicit staged_engine(const native_config& c) : cfg_(c) {}

  status init() {
    CCLITE_TRY(cuda_status(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming), "cudaEventCreate"));
    int dev = 0;
    CCLITE_TRY(cuda_status(cudaGetDevice(&dev), "cudaGetDevice"));
    int pitch = 0;
    CCLITE_TRY(cuda_status(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, dev), "cudaDeviceGetAttribute"));
    max_pitch_ = static_cast<std::size_t>(std::max(0, pitch));
    auto st = staging_buffers::create(cfg_.chunk_bytes, cfg_.slots);
    if (!st) return st.error();
    staging_ = std::move(st.value());
    slots_.resize(static_cast<std::size_t>(staging_.slots()));
    for (auto& e : slots_) {
      CCLITE_TRY(cuda_status(cudaEventCreateWithFlags(&e.reduced, cudaEventDisableTiming), "cudaEventCreate"));
    }
    njobs_ = static_cast<std::size_t>(std::max(1, cfg_.max_pending_chunks));
    jobs_.reset(new job[njobs_]);
    auto c1 = stream::create();
    if (!c1) return c1.error();
    copy_stream_ = std::move(c1.value());
    auto c2 = stream::create();
    if (!c2) return c2.error();
    host_stream_ = std::move(c2.value());
    return status();
  }

  bool idle() const {
    for (std::size_t i = 0; i < njobs_; ++i)
      if (jobs_[i].busy.load(std::memory_order_acquire)) return false;
    return true;
  }

  status fail(status s) {
    std::lock_guard<std::mutex> g(mu_);
    if (failed_.ok()) failed_ = s;
    return s;
  }

  // `rows` rows of `width` bytes, `spitch` / `dpitch` bytes apart: one 2D copy
  // where the pitches are within the device's limit (cudaDevAttrMaxPitch), else
  // one copy per row.
  cudaError_t copy_rows(unsigned char* dst, std::size_t dpitch, const unsigned char* src, std::size_t spitch,
                        std::size_t width, std::size_t rows, cudaMemcpyKind kind, cudaStream_t s) const {
    if (rows == 1) return cudaMemcpyAsync(dst, src, width, kind, s);
    if (dpitch <= max_pitch_ && spitch <= max_pitch_) {
      return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind, s);
    }
    for (std::size_t r = 0; r < rows; ++r) {
      const cudaError_t e = cudaMemcpyAsync(dst + r * dpitch, src + r * spitch, width, kind, s);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }

  // The CPU collective of one chunk, in place on the slot.
  status host_collective(const job& j) {
    Comm& c = *chan_;
    unsigned char* h = j.host;
    unsigned char* mine = h + static_cast<std::size_t>(c.rank()) * j.count * size_of(j.t);
    switch (j.kind) {
      case collective_kind::allreduce: return c.allreduce(h, h, j.count, j.t, j.op);
      case collective_kind::broadcast: return c.broadcast(h, j.count, j.t, j.root);
      case collective_kind::reduce: return c.reduce(h, c.rank() == j.root ? h : nullptr, j.count, j.t, j.op, j.root);
      case collective_kind::allgather: return c.allgather(mine, h, j.count, j.t);
      case collective_kind::reduce_scatter: return c.reduce_scatter(h, mine, j.count, j.t, j.op);
      case collective_kind::gather: return c.gather(mine, c.rank() == j.root ? h : nullptr, j.count, j.t, j.root);
      case collective_kind::scatter:
        return c.scatter(c.rank() == j.root ? h : nullptr, mine, j.count, j.t, j.root);
      case collective_kind::alltoall: return c.alltoall(h, h, j.count, j.t);  // in place
      case collective_kind::send: return c.send(h, j.count, j.t, j.root);
      case collective_kind::recv: return c.recv(h, j.count, j.t, j.root);
      default: return make_error(errc::invalid_argument, "%s is not a staged collective", to_string(j.kind));
    }
  }

  // CUDA host function: no CUDA calls here (the runtime forbids them).
  static void CUDART_CB run_job(void* p) {
    job* j = static_cast<job*>(p);
    staged_engine* self = j->self;
    if (self->failure().ok()) {
      status s = self->host_collective(*j);
      if (!s.ok()) {
        (void)self->fail(status(s.code(), "device_communicator rank " + std::to_string(self->rank()) + ": host " +
                                              to_string(j->kind) + " of a staged chunk: " + s.message()));
      }
    }
    j->busy.store(false, std::memory_order_release);
  }

  // The next free job record; waits (bounded) when every one is pending.
  result<job*> take_job() {
    job& j = jobs_[next_job_ % njobs_];
    if (j.busy.load(std::memory_order_acquire)) {
      const deadline until = deadline::after(cfg_.timeout);
      while (j.busy.load(std::memory_order_acquire)) {
        CCLITE_TRY(failure());
        if (until.expired()) {
          return fail(make_error(errc::timeout,
                                 "device_communicator rank %d: %zu staged chunks pending and the oldest "
                                 "not run within %lld ms (CCLITE_TIMEOUT)",
                                 rank(), njobs_, static_cast<long long>(cfg_.timeout.count())));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    ++next_job_;
    return &j;
  }

  native_config cfg_;
  std::unique_ptr<Comm> chan_;
  staging_buffers staging_;
  std::vector<slot_events> slots_;
  std::unique_ptr<job[]> jobs_;
  std::size_t njobs_ = 0;
  std::size_t next_job_ = 0;
  std::size_t next_slot_ = 0;
  std::size_t max_pitch_ = 0;
  cudaEvent_t start_ = nullptr;
  stream copy_stream_;
  stream host_stream_;
  mutable std::mutex mu_;
  status failed_;
};

}  // namespace cclite::cuda::detail
