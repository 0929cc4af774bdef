// cclite/cuda/device_communicator.hpp - collectives on device buffers through one API.
//
//   auto env = cclite::init().value();                       // the CPU communicator
//   auto dc = cclite::cuda::device_communicator<cclite::default_communicator>::create(*env).value();
//   dc->allreduce(d_grad, d_grad, n, cclite::dtype::float32, cclite::reduce_op::avg, stream);  // returns at once
//   ...more work on `stream`, ordered after the allreduce...
//   cclite::check(dc->synchronize(stream));                  // bounded wait, reports errors
//   dc->allreduce(h_sums, h_sums, 4, cclite::dtype::float64, cclite::reduce_op::sum);  // host: CPU path
//
// Wraps a CPU communicator (any cclite communicator<...>) and adds device
// pointers. Two engines, chosen once in create() (CCLITE_GPU_BACKEND, or
// device_options::backend):
//   nccl    cclite::nccl::backend (built with cclite::nccl); the unique id goes
//           out over the CPU communicator. NCCL allows one rank per GPU.
//   native  host staging: device -> pinned host chunk -> the CPU collective ->
//           device, chunk by chunk, with the copies of later chunks overlapping
//           the host reduction of earlier ones. Any number of ranks per GPU.
//   auto    (unset) nccl when this build has NCCL and every rank of every node
//           has a GPU of its own (all ranks agree through one allreduce), else
//           native, so two processes sharing one GPU work out of the box.
//
// Stream-ordered form, allreduce(..., cudaStream_t): enqueues and returns
// without waiting for the GPU or the peers. Work enqueued on `stream` before
// the call is read; work enqueued after it sees the result. Native engine: the
// device -> host copies run on an internal copy stream that waits for
// `stream`; the host reduction runs in a CUDA host function
// (cudaLaunchHostFunc) on an internal stream, calling the CPU collective on a
// communicator of its own (split from the one given, so it never interleaves
// with the caller's CPU collectives); the host -> device copies go on `stream`
// after it. At most `max_pending_chunks` chunks may be enqueued and not yet
// reduced; a call beyond that waits (bounded) for the oldest.
// A host function blocks in the CPU collective until the peers reach the same
// chunk. The CUDA runtime may run a process's host functions one at a time on
// one thread, so a host function of the caller's that waits for something
// enqueued later would wait forever; the engine's own only wait for the peers'
// matching chunks, which holds while every rank issues the same collectives in
// the same order (cclite's rule anyway).
//
// Blocking form, allreduce(send, recv, count, dtype, op): each pointer is
// classified with cudaPointerGetAttributes (query_pointer): host or pinned host
// memory takes the CPU communicator directly; device or managed memory takes
// the stream-ordered path on an internal stream and waits for it; a mix is
// invalid_argument. As with CUDA-aware MPI, device data must be ready (its
// producing stream synchronised) before the blocking call.
//
// Errors: create() is errc::unsupported "no CUDA device ..." on a machine
// without a usable GPU (the CPU communicator stays usable), the engine's
// errors otherwise. A failed collective in a host function is reported by the
// next call and by synchronize(); after it the object is unusable (as the
// communicator). Every wait is bounded by the CPU communicator's timeout
// (CCLITE_TIMEOUT). Thread safety: one thread at a time, like the communicator.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/gpu_backend.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/cuda/staging.hpp>

#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
#include <cclite/nccl/backend.hpp>
#endif

namespace cclite::cuda {

/// Which path a pair of buffers takes in the blocking allreduce.
enum class buffer_route { host, device, mixed };

inline const char* to_string(buffer_route r) noexcept {
  return r == buffer_route::host ? "host" : r == buffer_route::device ? "device" : "mixed";
}

/// host: both pointers are host memory (pageable or pinned); device: both are
/// device or managed memory; mixed otherwise. Null counts as host. Without a
/// GPU or driver everything is host (query_pointer), so this never fails.
inline buffer_route route_of(const void* send, const void* recv) noexcept {
  const bool ds = send != nullptr && is_device_pointer(send);
  const bool dr = recv != nullptr && is_device_pointer(recv);
  if (ds && dr) return buffer_route::device;
  if (!ds && !dr) return buffer_route::host;
  if (send == nullptr || recv == nullptr) return ds || dr ? buffer_route::device : buffer_route::host;
  return buffer_route::mixed;
}

struct device_options {
  /// CUDA device; -1: the CPU communicator's local rank modulo the device count.
  int device = -1;
  /// "nccl", "native" or "auto"; nullptr: CCLITE_GPU_BACKEND.
  const char* backend = nullptr;
  /// Native engine: pinned staging chunk size and number of chunks in flight.
  std::size_t chunk_bytes = std::size_t{4} << 20;
  int slots = 4;
  /// Native engine: chunks enqueued and not yet reduced before a call waits.
  int max_pending_chunks = 256;
};

template <class Comm>
class device_communicator {
 public:
  /// Collective over `host` (every rank calls it): picks the device and the
  /// engine, splits a communicator for the native engine's host functions or
  /// sets up NCCL. `host` must outlive the object.
  static result<std::unique_ptr<device_communicator>> create(Comm& host, device_options o = {}) {
    // No device: every rank answers at once, before any collective.
    auto count = device_count();
    if (!count) {
      return make_error(count.error().code(), "device_communicator rank %d: %s", host.rank(),
                        count.error().message().c_str());
    }
    int dev = o.device >= 0 ? o.device : host.local_rank() % count.value();
    CCLITE_TRY(set_device(dev));
    auto to = env::timeout();
    if (!to) return to.error();
    const char* choice = o.backend ? o.backend : env::raw("GPU_BACKEND", false);
    std::string c = choice ? choice : "";
    for (auto& ch : c) ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch | 0x20 : ch);
    const bool is_auto = c.empty() || c == "auto";
    auto parsed = parse_gpu_backend(choice);
    if (!parsed) return parsed.error();
    gpu_backend engine = parsed.value();
    if (is_auto && engine == gpu_backend::nccl) {
      // NCCL wants one rank per GPU: only when every node has a device per local rank.
      std::int64_t own = host.local_size() <= count.value() ? 1 : 0;
      CCLITE_TRY(host.allreduce(&own, &own, 1, dtype::int64, reduce_op::min));
      if (own == 0) engine = gpu_backend::native;
    }
    std::unique_ptr<device_communicator> d(new device_communicator(host, dev, engine, to.value(), o));
    CCLITE_TRY(d->init());
    return result<std::unique_ptr<device_communicator>>(std::move(d));
  }

  device_communicator(const device_communicator&) = delete;
  device_communicator& operator=(const device_communicator&) = delete;

  /// Waits for every enqueued host function (they use this object), bounded by
  /// the timeout; past it the internal communicator is aborted so they return.
  ~device_communicator() {
    if (chan_) {
      const deadline until = deadline::after(timeout_);
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
    (void)cudaEventDestroy(start_);
    // staging_ (pinned chunks) waits for the last host -> device copies itself.
  }

  int rank() const noexcept { return host_->rank(); }
  int size() const noexcept { return host_->size(); }
  int device() const noexcept { return device_; }
  gpu_backend engine() const noexcept { return engine_; }
  Comm& host() const noexcept { return *host_; }
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
  /// The NCCL backend (engine() == nccl), else null.
  nccl::backend* nccl_backend() const noexcept { return nccl_.get(); }
#endif

  /// Stream-ordered allreduce of device buffers (send == recv: in place).
  /// Returns once enqueued; see the file comment.
  status allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                   cudaStream_t stream) {
    CCLITE_TRY(failure());
    if (!is_valid(t) || !is_valid(op)) return make_error(errc::invalid_argument, "device allreduce: bad dtype or op");
    if (count == 0) return status();
    if (!send || !recv) return make_error(errc::invalid_argument, "device allreduce: null buffer with count %zu", count);
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
    if (nccl_) return nccl_->allreduce(send, recv, count, t, op, stream);
#endif
    return enqueue_staged(send, recv, count, t, op, stream);
  }

  /// Blocking allreduce of host or device buffers, routed by where they live.
  status allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    switch (route_of(send, recv)) {
      case buffer_route::host: return host_->allreduce(send, recv, count, t, op);
      case buffer_route::mixed:
        return make_error(errc::invalid_argument,
                          "device allreduce: send %p is %s memory and recv %p is %s memory; both "
                          "must be host or both device",
                          send, to_string(query_pointer(send).kind), static_cast<const void*>(recv),
                          to_string(query_pointer(recv).kind));
      case buffer_route::device: break;
    }
    CCLITE_TRY(allreduce(send, recv, count, t, op, own_stream_.get()));
    return synchronize(own_stream_.get());
  }

  template <class T>
  status allreduce(T* data, std::size_t count, reduce_op op = reduce_op::sum) {
    return allreduce(data, data, count, dtype_of_v<T>, op);
  }

  /// Waits until everything enqueued on `stream` has run (bounded by the
  /// timeout), then reports the first failure of an enqueued collective.
  status synchronize(cudaStream_t stream) {
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
    if (nccl_) return nccl_->synchronize(stream);
#endif
    CCLITE_TRY(failure());
    const deadline until = deadline::after(timeout_);
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return fail(cuda_status(e, "device_communicator: cudaStreamQuery"));
      CCLITE_TRY(failure());  // a failed host collective ends the wait at once
      if (until.expired()) {
        return fail(make_error(errc::timeout,
                               "device_communicator rank %d: the stream did not finish within %lld ms "
                               "(CCLITE_TIMEOUT); a rank that never made the same call is the usual cause",
                               rank(), static_cast<long long>(timeout_.count())));
      }
      if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return failure();
  }

  /// The first failure seen, ok if none.
  status failure() const {
    std::lock_guard<std::mutex> g(mu_);
    return failed_;
  }

 private:
  // One chunk's host reduction, run by a CUDA host function. A fixed ring of
  // these: no allocation per call.
  struct job {
    device_communicator* self = nullptr;
    void* host = nullptr;
    std::size_t count = 0;
    dtype t = dtype::float32;
    reduce_op op = reduce_op::sum;
    std::atomic<bool> busy{false};
  };
  struct slot_events {
    cudaEvent_t reduced = nullptr;  ///< recorded on host_stream_ after the chunk's host function
    bool used = false;
  };

  device_communicator(Comm& host, int dev, gpu_backend engine, milliseconds timeout, const device_options& o)
      : host_(&host), device_(dev), engine_(engine), timeout_(timeout), opts_(o) {}

  status init() {
    CCLITE_TRY(cuda_status(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming), "cudaEventCreate"));
    auto s = stream::create();
    if (!s) return s.error();
    own_stream_ = std::move(s.value());
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
    if (engine_ == gpu_backend::nccl) {
      auto id = nccl::broadcast_unique_id(*host_);
      if (!id) return id.error();
      nccl::options no;
      no.device = device_;
      no.timeout = timeout_;
      auto b = nccl::backend::create_with_id(id.value(), rank(), size(), no);
      if (!b) return b.error();
      nccl_ = std::move(b.value());
      return status();
    }
#endif
    // The native engine's host functions get a communicator of their own.
    auto chan = host_->split(0, host_->rank());
    if (!chan) return chan.error();
    chan_ = std::move(chan.value());
    auto st = staging_buffers::create(opts_.chunk_bytes, opts_.slots);
    if (!st) return st.error();
    staging_ = std::move(st.value());
    slots_.resize(static_cast<std::size_t>(staging_.slots()));
    for (auto& e : slots_) {
      CCLITE_TRY(cuda_status(cudaEventCreateWithFlags(&e.reduced, cudaEventDisableTiming), "cudaEventCreate"));
    }
    jobs_.reset(new job[static_cast<std::size_t>(std::max(1, opts_.max_pending_chunks))]);
    njobs_ = static_cast<std::size_t>(std::max(1, opts_.max_pending_chunks));
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

  // CUDA host function: no CUDA calls here (the runtime forbids them).
  static void CUDART_CB run_job(void* p) {
    job* j = static_cast<job*>(p);
    device_communicator* self = j->self;
    if (self->failure().ok()) {
      status s = self->chan_->allreduce(j->host, j->host, j->count, j->t, j->op);
      if (!s.ok()) {
        (void)self->fail(status(s.code(), "device_communicator rank " + std::to_string(self->rank()) +
                                              ": host allreduce of a staged chunk: " + s.message()));
      }
    }
    j->busy.store(false, std::memory_order_release);
  }

  // The next free job record; waits (bounded) when every one is pending.
  result<job*> take_job() {
    job& j = jobs_[next_job_ % njobs_];
    if (j.busy.load(std::memory_order_acquire)) {
      const deadline until = deadline::after(timeout_);
      while (j.busy.load(std::memory_order_acquire)) {
        CCLITE_TRY(failure());
        if (until.expired()) {
          return fail(make_error(errc::timeout,
                                 "device_communicator rank %d: %zu staged chunks pending and the oldest "
                                 "not reduced within %lld ms (CCLITE_TIMEOUT)",
                                 rank(), njobs_, static_cast<long long>(timeout_.count())));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    ++next_job_;
    return &j;
  }

  status enqueue_staged(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                        cudaStream_t stream) {
    const std::size_t es = size_of(t);
    const std::size_t per_chunk = std::max<std::size_t>(1, staging_.chunk_bytes() / es);
    const std::size_t chunks = (count + per_chunk - 1) / per_chunk;
    const auto* src = static_cast<const unsigned char*>(send);
    auto* dst = static_cast<unsigned char*>(recv);
    auto ok = [&](cudaError_t e, const char* what) { return e == cudaSuccess ? status() : fail(cuda_status(e, what)); };
    // The copy stream starts after the work the caller enqueued on `stream`.
    CCLITE_TRY(ok(cudaEventRecord(start_, stream), "device allreduce: cudaEventRecord"));
    CCLITE_TRY(ok(cudaStreamWaitEvent(copy_stream_.get(), start_, 0), "device allreduce: cudaStreamWaitEvent"));
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t n = std::min(per_chunk, count - c * per_chunk);
      const std::size_t si = next_slot_++ % slots_.size();
      auto& hs = staging_.at(si);
      auto& ev = slots_[si];
      // The slot's previous host -> device copy (maybe another call's, on
      // another stream) must be done before it is refilled.
      if (ev.used) CCLITE_TRY(ok(cudaStreamWaitEvent(copy_stream_.get(), hs.up, 0), "cudaStreamWaitEvent"));
      ev.used = true;
      CCLITE_TRY(ok(cudaMemcpyAsync(hs.host, src + c * per_chunk * es, n * es, cudaMemcpyDeviceToHost,
                                    copy_stream_.get()),
                    "device allreduce: cudaMemcpyAsync device -> host"));
      CCLITE_TRY(ok(cudaEventRecord(hs.down, copy_stream_.get()), "cudaEventRecord"));
      CCLITE_TRY(ok(cudaStreamWaitEvent(host_stream_.get(), hs.down, 0), "cudaStreamWaitEvent"));
      auto j = take_job();
      if (!j) return j.error();
      job& jb = *j.value();
      jb.self = this;
      jb.host = hs.host;
      jb.count = n;
      jb.t = t;
      jb.op = op;
      jb.busy.store(true, std::memory_order_release);
      const cudaError_t le = cudaLaunchHostFunc(host_stream_.get(), &run_job, &jb);
      if (le != cudaSuccess) {
        jb.busy.store(false, std::memory_order_release);
        return fail(cuda_status(le, "device allreduce: cudaLaunchHostFunc"));
      }
      CCLITE_TRY(ok(cudaEventRecord(ev.reduced, host_stream_.get()), "cudaEventRecord"));
      CCLITE_TRY(ok(cudaStreamWaitEvent(stream, ev.reduced, 0), "cudaStreamWaitEvent"));
      CCLITE_TRY(ok(cudaMemcpyAsync(dst + c * per_chunk * es, hs.host, n * es, cudaMemcpyHostToDevice, stream),
                    "device allreduce: cudaMemcpyAsync host -> device"));
      CCLITE_TRY(ok(cudaEventRecord(hs.up, stream), "cudaEventRecord"));
    }
    return status();
  }

  Comm* host_;
  int device_;
  gpu_backend engine_;
  milliseconds timeout_;
  device_options opts_;
  stream own_stream_;
  cudaEvent_t start_ = nullptr;
  // native engine
  std::unique_ptr<Comm> chan_;
  staging_buffers staging_;
  std::vector<slot_events> slots_;
  std::unique_ptr<job[]> jobs_;
  std::size_t njobs_ = 0;
  std::size_t next_job_ = 0;
  std::size_t next_slot_ = 0;
  stream copy_stream_;
  stream host_stream_;
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
  std::unique_ptr<nccl::backend> nccl_;
#endif
  mutable std::mutex mu_;
  status failed_;
};

}  // namespace cclite::cuda
