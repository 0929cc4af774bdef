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
//                  collective on the slot (on the engine's own communicator,
//                  with connections of its own, so that it needs no order
//                  against the caller's CPU calls), records `reduced`
//   caller stream  waits for `reduced`, copies the result out of the slot (host ->
//                  device), records the slot's `up` ("slot free")
// The copy stream waits once per call for the work already on the caller's
// stream, so the data read is the data the caller enqueued; everything enqueued
// on the caller's stream afterwards runs after the chunks' `reduced` events, so
// it sees the result and may overwrite the send buffer. Later chunks' device ->
// host copies overlap the host collective of earlier ones (`slots` in flight).
//
// What each rank copies per chunk, which CPU call runs on the slot, and how a
// call is cut into chunks: staged_plan.hpp (type-free; tests/gpu/cuda_test.cpp
// runs it with memcpy on a real CPU communicator). Where a rank copies nothing
// out, its slot is free once the host function has run, so `up` is recorded on
// the host stream instead.
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
#include <cclite/cuda/native_config.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/cuda/staged_plan.hpp>
#include <cclite/cuda/staging.hpp>

namespace cclite::cuda::detail {

template <class Comm>
class staged_engine {
 public:
  /// Collective over `host`: makes the engine's communicators from it, then
  /// allocates the pinned slots, events and streams on the current device.
  static result<std::unique_ptr<staged_engine>> create(Comm& host, const native_config& c) {
    std::unique_ptr<staged_engine> e(new staged_engine(c));
    // The host functions' communicator runs on the CUDA runtime's thread, on
    // the stream's schedule: when one rank's host function runs before a call
    // of the calling thread and another rank's after it, communicators that
    // share links (split()) would see them in different orders (errc::mismatch;
    // link_pool.hpp). So it has connections of its own (dup()): the calling
    // thread's calls on `host`, its split() children (this engine's agree_,
    // the CUDA IPC engine's barriers) and the application's CPU collectives
    // need no order against it. Same ranks, same order: roots carry over.
    auto chan = host.dup();
    if (!chan) return chan.error();
    e->chan_ = std::move(chan.value());
    // A second one, used from the calling thread only: alltoallv's agreement on
    // its number of chunks.
    auto agree = host.split(0, host.rank());
    if (!agree) return agree.error();
    e->agree_ = std::move(agree.value());
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

  /// Enqueues collective `k` (any but barrier) or a send / recv / sendrecv on
  /// `stream`, chunk by chunk, and returns. The arguments must have been
  /// checked (device_communicator does). `root`: the rooted ones' root, the
  /// peer of send / recv, sendrecv's destination; `op`: the reducing ones only;
  /// send: `send` only, recv: `recv` only; `va`: the v-variants' arrays and
  /// sendrecv's receive side (alltoallv agrees on its chunk count with one
  /// CPU allreduce on the calling thread).
  status enqueue(collective_kind k, const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                 int root, cudaStream_t stream, const v_args& va = {}) {
    CCLITE_TRY(failure());
    auto per = staged_chunk_elems(k, t, size(), staging_.chunk_bytes());
    if (!per) return per.error();
    if (is_v(k)) {
      auto m = v_largest_block(k, va, size(), agree_.get());
      if (!m) return fail(m.error());
      count = m.value();
    }
    if (count == 0 && va.count2 == 0) return status();
    staged_call call;
    describe_call(call, k, rank(), size(), root, count, t, per.value(), va);
    const char* name = to_string(k);
    // Runs the plan's steps (staged_plan.hpp) for one slot; the first error is kept.
    struct runner {
      staged_engine& e;
      cudaStream_t stream;
      const char* name;
      const unsigned char* src;
      unsigned char* dst;
      const staged_call& call;
      dtype t;
      reduce_op op;
      std::size_t c = 0;      // the chunk
      std::size_t si = 0;     // the slot
      job* jb = nullptr;      // the chunk's job record
      bool copied_up = false;
      status st;
      bool check(cudaError_t err, const char* what) {
        if (err == cudaSuccess) return true;
        st = e.fail(cuda_status(err, (std::string("device ") + name + ": " + what).c_str()));
        return false;
      }
      unsigned char* slot() const { return static_cast<unsigned char*>(e.staging_.at(si).host); }
      void down(std::size_t slot_off, std::size_t src_off, std::size_t src_pitch, std::size_t width, std::size_t rows) {
        if (st.ok()) {
          check(e.copy_rows(slot() + slot_off, width, src + src_off, src_pitch, width, rows, cudaMemcpyDeviceToHost,
                            e.copy_stream_.get()),
                "cudaMemcpyAsync device -> host");
        }
      }
      void host(std::size_t n) {
        auto& hs = e.staging_.at(si);
        if (!st.ok() || !check(cudaEventRecord(hs.down, e.copy_stream_.get()), "cudaEventRecord") ||
            !check(cudaStreamWaitEvent(e.host_stream_.get(), hs.down, 0), "cudaStreamWaitEvent")) {
          return;
        }
        job& jb = *this->jb;
        if (counts_per_chunk(call.kind)) staged_v_counts(call, c, jb.v);
        jb.self = &e;
        jb.host = slot();
        jb.count = n;
        jb.kind = call.kind;
        jb.t = t;
        jb.op = op;
        jb.root = call.root;
        jb.busy.store(true, std::memory_order_release);
        const cudaError_t le = cudaLaunchHostFunc(e.host_stream_.get(), &run_job, &jb);
        if (le != cudaSuccess) {
          jb.busy.store(false, std::memory_order_release);
          check(le, "cudaLaunchHostFunc");
          return;
        }
        // Every chunk, copied out or not: later work on `stream` runs after the collective.
        if (check(cudaEventRecord(e.slots_[si].reduced, e.host_stream_.get()), "cudaEventRecord")) {
          check(cudaStreamWaitEvent(stream, e.slots_[si].reduced, 0), "cudaStreamWaitEvent");
        }
      }
      void up(std::size_t dst_off, std::size_t dst_pitch, std::size_t slot_off, std::size_t width, std::size_t rows) {
        if (!st.ok()) return;
        if (check(e.copy_rows(dst + dst_off, dst_pitch, slot() + slot_off, width, width, rows, cudaMemcpyHostToDevice,
                              stream),
                  "cudaMemcpyAsync host -> device")) {
          copied_up = check(cudaEventRecord(e.staging_.at(si).up, stream), "cudaEventRecord");
        }
      }
    } run{*this, stream, name, static_cast<const unsigned char*>(send), static_cast<unsigned char*>(recv), call, t, op,
          0, 0, nullptr, false, {}};

    if (!run.check(cudaEventRecord(start_, stream), "cudaEventRecord") ||
        !run.check(cudaStreamWaitEvent(copy_stream_.get(), start_, 0), "cudaStreamWaitEvent")) {
      return run.st;
    }
    for (std::size_t c = 0; c < call.chunks() && run.st.ok(); ++c) {
      // The job record first: its (bounded) wait comes before anything of this chunk is enqueued.
      auto j = take_job();
      if (!j) return j.error();
      run.jb = j.value();
      run.c = c;
      run.si = next_slot_++ % slots_.size();
      run.copied_up = false;
      auto& hs = staging_.at(run.si);
      // The slot's previous user (an H2D on some caller's stream, or a host
      // function) must be done with it before it is refilled.
      if (slots_[run.si].used && !run.check(cudaStreamWaitEvent(copy_stream_.get(), hs.up, 0), "cudaStreamWaitEvent")) break;
      slots_[run.si].used = true;
      staged_chunk_plan(call, c, run);
      // Nothing read the slot after the host function: free once it ran.
      if (run.st.ok() && !run.copied_up) run.check(cudaEventRecord(hs.up, host_stream_.get()), "cudaEventRecord");
    }
    return run.st;
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
    staged_v_chunk v;               ///< the v-variants' counts for this chunk (sized at init)
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
    staged_call sizing;  // sizes every job's count arrays once: no allocation per call
    sizing.size = size();
    std::vector<std::size_t> zeros(static_cast<std::size_t>(size()), 0);
    sizing.counts = sizing.rcounts = zeros.data();
    for (std::size_t i = 0; i < njobs_; ++i) staged_v_counts(sizing, 0, jobs_[i].v);
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

  // CUDA host function: no CUDA calls here (the runtime forbids them).
  static void CUDART_CB run_job(void* p) {
    job* j = static_cast<job*>(p);
    staged_engine* self = j->self;
    if (self->failure().ok()) {
      status s = staged_host_call(*self->chan_, j->kind, j->host, j->count, j->t, j->op, j->root, &j->v);
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
  std::unique_ptr<Comm> chan_;   ///< the host functions' CPU calls
  std::unique_ptr<Comm> agree_;  ///< the calling thread's: alltoallv's chunk count
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
