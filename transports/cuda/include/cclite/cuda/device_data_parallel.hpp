// cclite/cuda/device_data_parallel.hpp - train::data_parallel on device gradients (PyTorch DDP on GPUs).
//
//   auto dc = cuda::device_communicator<Comm>::create(comm).value();  // NCCL or host staging
//   auto ad = cuda::device_comm_adapter<Comm>::create(*dc, compute_stream).value();
//   auto ddp = cuda::device_data_parallel<Comm>::create(*ad, params, opts).value();
//   for (...) {
//     ...forward kernels on compute_stream read ddp.value(p)...
//     ...p's gradient kernels on compute_stream write ddp.grad(p); then ddp.grad_ready(p)...
//     cclite::check(ddp.synchronize());       // enqueued: the stream waits, not the host
//     ...optimiser kernel on compute_stream over ddp.flat_values(), ddp.flat_grad()...
//   }
//   cclite::check(ad->synchronize());         // bounded host wait, reports errors
//
// device_comm_adapter<Comm> presents a device_communicator to train::data_parallel
// (data_parallel.hpp, "Device memory"): it declares device_memory, so the
// wrapper keeps its gradients and parameter values in device memory the adapter
// allocates (two flat buffers laid out in bucket order, never a shared window),
// zeroes and uploads them on the compute stream, and every collective is ordered
// by the stream, not by the host:
//   allreduce_async(ptr, n, op)  (a bucket, when backward marks it ready) records
//       an event on the compute stream, so the bucket's gradient kernels enqueued
//       so far come first, makes the adapter's communication stream wait for it,
//       enqueues the device_communicator's allreduce there and records a `done`
//       event after it. Backward goes on while the bucket is reduced.
//   handle::wait(ms)  makes the compute stream wait for `done` and returns the
//       engine's failure so far, at once (torch's Work::wait on NCCL); with
//       adapter_options::host_wait it instead blocks the calling thread until
//       `done` (bounded by ms, or CCLITE_TIMEOUT when ms < 0: errc::timeout, the
//       collective keeps running). done() never blocks.
//   allreduce / broadcast on device pointers: the same, waited at once
//       (data_parallel's last bucket and its initial parameter broadcast). On
//       host pointers (its shape check): the CPU communicator, blocking.
// One communication stream, so collectives run in issue order on every rank (the
// order data_parallel issues them). data_parallel::synchronize() thus returns once
// everything is enqueued; the averaged gradients are there for work enqueued on
// the compute stream afterwards. The host sees them after ad->synchronize() (or
// dc's synchronize(compute_stream)), which also reports a failed collective.
//
// Errors: create() fails with the CUDA error of a stream or event; a CUDA error
// of a later call is kept and returned by every call after it (the object is then
// unusable, as the device_communicator after a failed collective), a failed
// collective comes back from the next call, wait() or synchronize(). Every host
// wait is bounded by CCLITE_TIMEOUT. Lifetime: the device_communicator outlives
// the adapter, which outlives the data_parallel, its buffers and handles; a
// buffer's destructor first lets both streams drain (bounded; past the deadline
// the memory is leaked rather than freed under a running copy). One thread at a
// time, like the communicator.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/device_communicator.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/train/data_parallel.hpp>

namespace cclite::cuda {

struct adapter_options {
  /// handle::wait blocks the host until the bucket is reduced (bounded), as
  /// with a CPU communicator, instead of ordering the compute stream after it.
  bool host_wait = false;
};

template <class Comm>
class device_comm_adapter {
 public:
  /// data_parallel keeps its gradients and values in alloc()'s memory.
  static constexpr bool device_memory = true;

  /// Device memory for n floats, owned; see the file comment for its destructor.
  class buffer {
   public:
    buffer() = default;
    buffer(buffer&& o) noexcept : a_(std::exchange(o.a_, nullptr)), p_(std::exchange(o.p_, nullptr)),
                                  n_(std::exchange(o.n_, 0)) {}
    buffer& operator=(buffer&& o) noexcept {
      if (this != &o) {
        reset();
        a_ = std::exchange(o.a_, nullptr);
        p_ = std::exchange(o.p_, nullptr);
        n_ = std::exchange(o.n_, 0);
      }
      return *this;
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() { reset(); }
    float* get() const noexcept { return p_; }
    std::size_t size() const noexcept { return n_; }
    void reset() noexcept {
      // Collectives or kernels may still write here: free only once both streams drained.
      if (p_ && a_->drained()) (void)cudaFree(p_);
      a_ = nullptr, p_ = nullptr, n_ = 0;
    }

   private:
    friend class device_comm_adapter;
    device_comm_adapter* a_ = nullptr;
    float* p_ = nullptr;
    std::size_t n_ = 0;
  };

  /// An enqueued collective (data_parallel's per-bucket handle). Move-only.
  class handle {
   public:
    handle() = default;
    handle(handle&& o) noexcept : a_(std::exchange(o.a_, nullptr)), done_(std::exchange(o.done_, nullptr)),
                                  early_(std::move(o.early_)) {}
    handle& operator=(handle&& o) noexcept {
      if (this != &o) {
        release();
        a_ = std::exchange(o.a_, nullptr);
        done_ = std::exchange(o.done_, nullptr);
        early_ = std::move(o.early_);
      }
      return *this;
    }
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    ~handle() { release(); }

    /// Stream-ordered (default): the compute stream waits for the collective;
    /// returns the engine's failure so far. host_wait: waits on the host, at most
    /// `timeout` (negative: CCLITE_TIMEOUT), errc::timeout past it.
    status wait(milliseconds timeout = milliseconds(-1)) {
      if (!early_.ok() || !done_) return early_;
      if (!a_->opts_.host_wait) {
        CCLITE_TRY(a_->check(cudaStreamWaitEvent(a_->compute_, done_, 0), "cudaStreamWaitEvent"));
        return a_->failure();
      }
      return a_->wait_event(done_, timeout.count() < 0 ? a_->timeout_ : timeout);
    }
    /// True once the collective ran on the device (or failed). Never blocks.
    bool done() const noexcept { return !done_ || cudaEventQuery(done_) != cudaErrorNotReady; }

   private:
    friend class device_comm_adapter;
    void release() noexcept {
      if (done_) a_->events_.push_back(done_);  // reusable: a later record does not disturb enqueued waits
      done_ = nullptr;
    }
    device_comm_adapter* a_ = nullptr;
    cudaEvent_t done_ = nullptr;
    status early_;
  };

  /// An adapter over `dc` for work on `compute` (the stream backward and the
  /// optimiser run on; may be the legacy default stream 0). Not collective.
  static result<std::unique_ptr<device_comm_adapter>> create(device_communicator<Comm>& dc, cudaStream_t compute,
                                                             adapter_options o = {}) {
    auto to = env::timeout();
    if (!to) return to.error();
    CCLITE_TRY(set_device(dc.device()));
    std::unique_ptr<device_comm_adapter> a(new device_comm_adapter(dc, compute, to.value(), o));
    auto s = stream::create();
    if (!s) return s.error();
    a->comm_ = std::move(s.value());
    CCLITE_TRY(a->check(cudaEventCreateWithFlags(&a->ready_, cudaEventDisableTiming), "cudaEventCreate"));
    return result<std::unique_ptr<device_comm_adapter>>(std::move(a));
  }

  device_comm_adapter(const device_comm_adapter&) = delete;
  device_comm_adapter& operator=(const device_comm_adapter&) = delete;
  /// Lets both streams drain (bounded) before its events go.
  ~device_comm_adapter() {
    (void)drained();
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    if (ready_) (void)cudaEventDestroy(ready_);
  }

  int rank() const noexcept { return dc_->rank(); }
  int size() const noexcept { return dc_->size(); }
  device_communicator<Comm>& device() const noexcept { return *dc_; }
  cudaStream_t compute_stream() const noexcept { return compute_; }
  cudaStream_t comm_stream() const noexcept { return comm_.get(); }

  /// Device `data`: enqueued on the communication stream after the compute
  /// stream's work so far (see the file comment). Host `data`: the CPU
  /// communicator, done on return. Errors are in the handle.
  template <class T>
  handle allreduce_async(T* data, std::size_t count, reduce_op op) {
    handle h;
    if (!is_device_pointer(data)) {
      h.early_ = dc_->allreduce(data, data, count, dtype_of_v<T>, op);
      return h;
    }
    h.early_ = enqueue([&] { return dc_->allreduce(data, data, count, dtype_of_v<T>, op, comm_.get()); }, h);
    return h;
  }

  /// allreduce_async(...).wait(): device data is stream-ordered (host_wait: waited).
  template <class T>
  status allreduce(T* data, std::size_t count, reduce_op op) {
    return allreduce_async(data, count, op).wait();
  }

  /// root's `count` elements to every rank: device data on the communication
  /// stream, the compute stream ordered before and after it; host data blocking.
  template <class T>
  status broadcast(T* data, std::size_t count, int root) {
    if (!is_device_pointer(data)) return dc_->broadcast(data, count, dtype_of_v<T>, root);
    handle h;
    CCLITE_TRY(enqueue([&] { return dc_->broadcast(data, count, dtype_of_v<T>, root, comm_.get()); }, h));
    return h.wait();
  }

  /// `count` zeroed floats of device memory (the memset is on the compute stream).
  result<buffer> alloc(std::size_t count) {
    CCLITE_TRY(failure());
    buffer b;
    if (count == 0) return result<buffer>(std::move(b));
    void* p = nullptr;
    CCLITE_TRY(check(cudaMalloc(&p, count * sizeof(float)), "cudaMalloc"));
    b.a_ = this, b.p_ = static_cast<float*>(p), b.n_ = count;
    CCLITE_TRY(check(cudaMemsetAsync(p, 0, count * sizeof(float), compute_), "cudaMemsetAsync"));
    return result<buffer>(std::move(b));
  }

  /// Zeroes `count` floats at `p` on the compute stream; a failure is reported by the next call.
  void zero(float* p, std::size_t count) noexcept {
    if (count) (void)check(cudaMemsetAsync(p, 0, count * sizeof(float), compute_), "cudaMemsetAsync");
  }

  /// Copies `count` floats between host and device memory (either way) on the
  /// compute stream, and waits for it (bounded).
  status copy(float* dst, const float* src, std::size_t count) {
    CCLITE_TRY(failure());
    if (count == 0) return status();
    CCLITE_TRY(check(cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDefault, compute_), "cudaMemcpyAsync"));
    return dc_->synchronize(compute_);
  }

  /// Waits (bounded) until both streams ran everything enqueued so far; the
  /// first failure of any call or collective.
  status synchronize() {
    CCLITE_TRY(failure());
    CCLITE_TRY(dc_->synchronize(comm_.get()));
    CCLITE_TRY(dc_->synchronize(compute_));
    return failure();
  }

  /// The first failure seen (the adapter's own CUDA calls, then the engine's).
  status failure() const { return error_.ok() ? dc_->failure() : error_; }

 private:
  device_comm_adapter(device_communicator<Comm>& dc, cudaStream_t compute, milliseconds timeout, adapter_options o)
      : dc_(&dc), compute_(compute), timeout_(timeout), opts_(o) {}

  // A CUDA error is kept: the streams' order can no longer be trusted.
  status check(cudaError_t e, const char* what) noexcept {
    if (e == cudaSuccess) return status();
    status s = cuda_status(e, what);
    s = make_error(s.code(), "device_comm_adapter rank %d: %s", rank(), s.message().c_str());
    if (error_.ok()) error_ = s;
    return s;
  }

  // compute stream -> ready_ -> comm stream, `call` there, then `done` for h.
  template <class Call>
  status enqueue(Call&& call, handle& h) {
    CCLITE_TRY(failure());
    CCLITE_TRY(check(cudaEventRecord(ready_, compute_), "cudaEventRecord"));
    CCLITE_TRY(check(cudaStreamWaitEvent(comm_.get(), ready_, 0), "cudaStreamWaitEvent"));
    CCLITE_TRY(call());
    cudaEvent_t done = nullptr;
    if (!events_.empty()) {
      done = events_.back();
      events_.pop_back();
    } else {
      CCLITE_TRY(check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate"));
    }
    h.a_ = this, h.done_ = done;
    return check(cudaEventRecord(done, comm_.get()), "cudaEventRecord");
  }

  status wait_event(cudaEvent_t e, milliseconds timeout) {
    const deadline until = deadline::after(timeout);
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(e);
      if (q == cudaSuccess) return failure();
      if (q != cudaErrorNotReady) return check(q, "cudaEventQuery");
      CCLITE_TRY(failure());  // a failed collective ends the wait at once
      if (until.expired()) {
        return make_error(errc::timeout,
                          "device_comm_adapter rank %d: a collective did not finish within %lld ms "
                          "(CCLITE_TIMEOUT); a rank that never made the same call is the usual cause",
                          rank(), static_cast<long long>(timeout.count()));
      }
      if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // True once both streams are idle, false past the timeout (or on a CUDA error).
  bool drained() noexcept {
    if (!comm_.get()) return true;  // create() failed before anything was enqueued
    const deadline until = deadline::after(timeout_);
    for (cudaStream_t s : {comm_.get(), compute_}) {
      for (;;) {
        const cudaError_t q = cudaStreamQuery(s);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady || until.expired()) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    return true;
  }

  device_communicator<Comm>* dc_;
  cudaStream_t compute_;
  milliseconds timeout_;
  adapter_options opts_;
  stream comm_;
  cudaEvent_t ready_ = nullptr;
  std::vector<cudaEvent_t> events_;  // `done` events free for reuse
  status error_;
};

/// data_parallel with its gradients and values on the device.
template <class Comm>
using device_data_parallel = train::data_parallel<device_comm_adapter<Comm>>;

}  // namespace cclite::cuda
