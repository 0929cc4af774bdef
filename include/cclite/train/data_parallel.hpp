// cclite/train/data_parallel.hpp - gradient averaging that overlaps backward (PyTorch DDP's core).
//
//   train::mlp net({784, 256, 128, 10}, local_batch, seed);
//   auto ddp = train::data_parallel<Comm>::create(comm, net.parameters()).value();
//   for (...) {
//     net.forward(x, b);  /* loss -> net.output_grad() */
//     net.backward(b, [&](train::parameter& p) { ddp.grad_ready(p); });
//     if (auto st = ddp.synchronize(); !st.ok()) { ... }   // grads now averaged
//     opt.step();
//     ddp.zero_grad();
//   }
//
// create() broadcasts rank 0's parameter values (so every replica starts
// equal), checks that every rank registered the same parameter shapes, and
// moves every gradient into a few contiguous *buckets*: the gradients are
// laid out in reverse registration order (the order backward produces them)
// and cut into buckets of at most bucket_cap_bytes, the first one capped at
// first_bucket_cap_bytes so that communication starts early (DDP's defaults:
// 25 MiB, first 1 MiB). A parameter is never split, nor are the parameters of
// one module (same name up to the last '.', e.g. fc1.weight and fc1.bias),
// since their gradients become final together.
//
// During backward, grad_ready(p) marks p's gradient final (grad_ready(p, begin,
// end): only elements [begin, end) of it, for parameters split over several
// buckets, see dp_options::split_bytes); when every gradient element
// of a bucket is final (and every earlier bucket was launched) the bucket's
// allreduce(avg) is issued asynchronously on the communicator, so it runs on
// the communicator's thread while backward continues on this one. The last
// bucket is the exception: it completes only as backward ends, so
// synchronize() runs it directly on the calling thread, saving two thread
// hand-offs per step. synchronize() also issues any bucket left behind (of
// parameters this step did not use: they hold their zero or accumulated
// gradient), waits for all, each wait bounded by the timeout, and leaves every
// rank with the same, bitwise identical, averaged gradient.
//
// Gradient accumulation: while sync is off (set_sync(false) or a no_sync()
// guard), grad_ready does nothing and synchronize() returns at once, so
// micro-batches only add into the local gradients; the first step with sync
// on communicates the accumulated sum (as DDP's no_sync()).
//
// Comm: any cclite communicator<...> (anything with rank(), size(),
// broadcast<T>(ptr, n, root) -> status, allreduce<T>(ptr, n, op) -> status and
// allreduce_async(ptr, n, op) -> a handle with wait(milliseconds) -> status and
// done()). Collectives are issued from the calling thread, in the same order
// on every rank (buckets in index order), as cclite requires.
//
// Where the gradients live (train/grad_storage.hpp): in the communicator's
// shared window when it offers one (dp_options::shared_gradients), else in
// ordinary memory; a Comm that declares `static constexpr bool device_memory =
// true` (cclite::cuda::device_comm_adapter, cuda/device_data_parallel.hpp)
// keeps the gradients *and the parameter values* in its own memory, each in
// one flat buffer laid out in bucket order. The parameters then give names,
// sizes and initial values (uploaded, then rank 0's broadcast there); the
// model reaches the memory through grad(p), value(p), flat_grad() and
// flat_values(), and p.grad() stays the parameter's own, unused. Its
// collectives say when results are visible (the adapter: in stream order).
// Other communicators compile none of this.
//
// Compression (dp_options::compression, train/grad_compression.hpp): each
// bucket is packed into 16-bit floats (divided by the rank count) as it is
// issued, allreduced with sum in that type, and unpacked into the fp32
// gradients by synchronize(): half the bytes on the wire, for links between
// nodes. Host gradients only.
//
// Uneven inputs (dp_options::uneven_inputs, PyTorch's Join context): ranks
// may run out of batches at different steps. Each synchronizing step then
// starts with a one-float allreduce saying which ranks still train; a rank
// with no batch left calls join(after_step), which takes part in the others'
// steps with zero gradients (and runs after_step, e.g. the optimiser, on the
// same averaged gradients, so it stays bitwise equal) until every rank has
// joined. Averages still divide by the world size, as DDP's default does.
//
// Errors: create() returns the first failed collective, or errc::mismatch
// when ranks registered different parameters. synchronize() returns the first
// failed allreduce or errc::timeout; after an error the wrapper stays broken
// (the communicator is unusable anyway, see communicator.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>
#include <cclite/train/bucket_plan.hpp>
#include <cclite/train/dp_core.hpp>
#include <cclite/train/dp_options.hpp>
#include <cclite/train/grad_compression.hpp>
#include <cclite/train/grad_storage.hpp>
#include <cclite/train/parameter.hpp>

namespace cclite::train {

template <class Comm>
class data_parallel : private detail::dp_core<Comm> {
  using core = detail::dp_core<Comm>;

 public:
  /// Wraps `params` (registration order, e.g. mlp::parameters()) for `comm`.
  /// Collective: every rank must call it with the same shapes. The parameters
  /// and `comm` must outlive the wrapper; parameter gradients are rebound to
  /// the wrapper's buckets (and back to their own storage by the destructor).
  static result<data_parallel> create(Comm& comm, parameter_list params, dp_options opts = {}) {
    // Unset, the timeout follows the communicator's (dp_core::wait_timeout);
    // a communicator type without one gets CCLITE_TIMEOUT now.
    if (opts.timeout.count() != -2 || !detail::has_timeout<Comm>::value) {
      auto t = env::timeout_option(opts.timeout);
      if (!t) return t.error();
      opts.timeout = t.value();
    }
    for (parameter* p : params)
      if (!p) return make_error(errc::invalid_argument, "data_parallel: null parameter");
    if (on_device && opts.compression != grad_compression::none)
      return make_error(errc::unsupported, "data_parallel: gradient compression (%s) works on host gradients only",
                        to_string(opts.compression));
    if (on_device && opts.uneven_inputs)
      return make_error(errc::unsupported, "data_parallel: uneven_inputs works on host gradients only");
    data_parallel dp(comm, std::move(params), opts);
    if (opts.uneven_inputs) dp.flag_ = std::make_unique<float>(0.0f);
    CCLITE_TRY(dp.check_shapes());
    // In device memory the values are broadcast where they live, once allocated.
    if (opts.broadcast_parameters && !on_device) CCLITE_TRY(dp.broadcast_values());
    CCLITE_TRY(dp.build_buckets());
    if (opts.broadcast_parameters && on_device) CCLITE_TRY(dp.broadcast_values());
    return {std::move(dp)};  // nvcc: no implicit move into result<T> (CWG1579)
  }

  data_parallel(data_parallel&& o) noexcept { *this = std::move(o); }
  data_parallel& operator=(data_parallel&& o) noexcept {
    if (this != &o) {
      core::operator=(std::move(o));  // drains, unbinds, takes o's buckets (dp_core.hpp)
      active_ranks_ = o.active_ranks_;
      sync_ = o.sync_;
      deferred_ = o.deferred_;
      broken_ = std::move(o.broken_);
      timeline_ = std::move(o.timeline_);
      backward_end_us_ = o.backward_end_us_;
      step_start_ = o.step_start_;
    }
    return *this;
  }
  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  /// Waits for allreduces still writing into the buckets (each is bounded by
  /// the communicator's own deadline), then gives the gradients back to the
  /// parameters.
  ~data_parallel() {
    drain();
    unbind();
  }

  /// Whether gradients and values live in Comm's memory (see the file comment).
  static constexpr bool on_device = grad_storage<Comm>::on_device;

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  const bucket_plan& buckets() const noexcept { return plan_; }
  const parameter_list& parameters() const noexcept { return params_; }

  /// All gradients, contiguous, in bucket order (reverse registration order).
  float* flat_grad() noexcept { return store_.grad(); }
  std::size_t flat_size() const noexcept { return store_.size(); }
  /// Whether the gradients live in the communicator's shared window
  /// (dp_options::shared_gradients).
  bool shared_gradients() const noexcept { return store_.shared(); }

  /// p's gradient and values (size() floats): on the host p.grad() and
  /// p.value(); in device memory the only way to them. Null if p is not ours.
  float* grad(const parameter& p) noexcept {
    auto it = index_.find(&p);
    return it == index_.end() ? nullptr : store_.grad() + plan_.param_offset[it->second];
  }
  float* value(const parameter& p) noexcept {
    auto it = index_.find(&p);
    if (it == index_.end()) return nullptr;
    if constexpr (on_device) return store_.values() + plan_.param_offset[it->second];
    else return params_[it->second]->value();
  }
  /// Device memory: all values, laid out as flat_grad(); null on the host
  /// (each parameter keeps its own).
  float* flat_values() noexcept { return store_.values(); }

  /// Zeroes every gradient (one memset over the buckets; Comm's zero() in device memory).
  void zero_grad() noexcept { store_.zero(); }

  /// Turns gradient communication on or off (off: accumulate locally).
  void set_sync(bool on) noexcept { sync_ = on; }
  bool sync_enabled() const noexcept { return sync_; }

  /// sharded_optimizer's switch: while on, grad_ready() and synchronize()
  /// leave the gradients alone, because its step reduces them itself.
  void defer_reduction(bool on) noexcept { deferred_ = on; }
  bool reduction_deferred() const noexcept { return deferred_; }
  /// The communicator and the options (after create(): the timeout resolved,
  /// or -2 while it follows the communicator's timeout()).
  Comm& communicator() const noexcept { return *comm_; }
  const dp_options& options() const noexcept { return opts_; }

  /// RAII form of set_sync(false): `{ auto g = ddp.no_sync(); ...backward... }`.
  class no_sync_guard {
   public:
    explicit no_sync_guard(data_parallel& d) noexcept : d_(&d), was_(d.sync_) { d.sync_ = false; }
    no_sync_guard(no_sync_guard&& o) noexcept : d_(o.d_), was_(o.was_) { o.d_ = nullptr; }
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    no_sync_guard& operator=(no_sync_guard&&) = delete;
    ~no_sync_guard() {
      if (d_) d_->sync_ = was_;
    }

   private:
    data_parallel* d_;
    bool was_;
  };
  no_sync_guard no_sync() noexcept { return no_sync_guard(*this); }

  /// Backward's hook: p's gradient is final for this step. Launches every
  /// bucket that became complete, in bucket order. Cheap when sync is off.
  void grad_ready(const parameter& p) { grad_ready(p, 0, p.size()); }

  /// Elements [begin, end) of p's gradient are final for this step. Blocks of
  /// one parameter are marked in ascending order; a part marked again counts
  /// once, and a block that leaves a gap after the part marked so far is
  /// ignored (its bucket then goes in synchronize(), still correct).
  void grad_ready(const parameter& p, std::size_t begin, std::size_t end) {
    if (!sync_ || deferred_ || size() == 1 || !broken_.ok()) return;
    auto it = index_.find(&p);
    if (it == index_.end()) return;  // not ours: nothing to communicate
    const std::size_t i = it->second;
    if (end > p.size()) end = p.size();
    if (begin < cursor_[i]) begin = cursor_[i];
    if (begin != cursor_[i] || begin >= end) return;  // a gap, or nothing new
    if (marked_++ == 0) {
      step_start_ = clock::now();
      issue_flag();
    }
    cursor_[i] = end;
    // The marked range, in the flat buffer, may cover several buckets.
    std::size_t at = plan_.param_offset[i] + begin;
    const std::size_t stop = plan_.param_offset[i] + end;
    bool completed = false;
    for (std::size_t b = plan_.param_bucket[i]; at < stop && b < plan_.buckets.size(); ++b) {
      const auto& bk = plan_.buckets[b];
      if (bk.offset + bk.count <= at) continue;
      const std::size_t n = std::min(stop, bk.offset + bk.count) - at;
      remaining_[b] -= n;
      completed |= remaining_[b] == 0;
      at += n;
    }
    if (completed) launch_ready();
    // With one core per rank, a woken communicator thread may wait for this
    // thread's time slice to end (EEVDF lets the running task finish its
    // slice); yielding here, between layers, lets an issued allreduce make
    // progress while backward continues.
    if (!poll_done()) std::this_thread::yield();
  }

  /// Completes the step's communication: issues every bucket not yet issued,
  /// waits for all, and leaves the averaged gradients in place. Returns ok at
  /// once on one rank or while sync is off.
  status synchronize() {
    if (!broken_.ok()) return broken_;
    if (!sync_ || deferred_ || size() == 1 || plan_.buckets.empty()) return {};
    const auto backward_end = clock::now();
    if (marked_ == 0) step_start_ = backward_end;  // nobody called grad_ready: nothing overlapped
    issue_flag();
    poll_done();
    timeline_.assign(plan_.buckets.size(), bucket_event{});
    for (std::size_t b = 0; b < next_launch_; ++b) {
      timeline_[b].launched_us = micros(slots_[b].launched - step_start_);
      timeline_[b].done_before_backward_end = slots_[b].seen_done != clock::time_point{};
      if (timeline_[b].done_before_backward_end) timeline_[b].finished_us = micros(slots_[b].seen_done - step_start_);
    }
    backward_end_us_ = micros(backward_end - step_start_);
    // Buckets not issued yet (the last one, and any whose parameters were not
    // all used this step) go now, in order, so every rank issues the same
    // sequence; the last runs blocking, inline when the queue is idle.
    status first;
    finish_buckets([&](std::size_t b) { timeline_[b].launched_us = micros(clock::now() - step_start_); },
                   [&](std::size_t b, const status& st) {
                     if (!timeline_[b].done_before_backward_end)
                       timeline_[b].finished_us = micros(clock::now() - step_start_);
                     if (!st.ok() && first.ok())
                       first = status(st.code(), "data_parallel: allreduce of bucket " + std::to_string(b) + ": " +
                                                     st.message());
                   });
    if (flag_issued_) {
      status st = flag_slot_.w.wait(wait_timeout());
      if (!st.ok() && first.ok())
        first = status(st.code(), "data_parallel: allreduce of the ranks still training: " + st.message());
      active_ranks_ = static_cast<int>(*flag_);
    }
    reset_step();
    if (!first.ok()) broken_ = first;
    return first;
  }

  /// What the last synchronize() saw, per bucket, in microseconds since the
  /// first grad_ready of that step (roughly the start of backward).
  struct bucket_event {
    double launched_us = 0;              ///< when the allreduce was issued
    double finished_us = 0;              ///< when it was first seen finished (an upper bound)
    bool done_before_backward_end = false;  ///< finished before synchronize() was called
  };
  const std::vector<bucket_event>& timeline() const noexcept { return timeline_; }
  /// When synchronize() was called (backward finished), same clock as timeline().
  double backward_end_us() const noexcept { return backward_end_us_; }

  /// dp_options::uneven_inputs: ranks that still had a batch at the last
  /// synchronize() (this one included).
  int active_ranks() const noexcept { return active_ranks_; }

  /// dp_options::uneven_inputs (PyTorch's Join): call once this rank has no
  /// batch left, with the sync on. Until every rank has called it, takes part
  /// in each step the others still synchronize: contributes zero gradients
  /// to their bucket allreduces, then calls after_step() with the averaged
  /// gradients in place (run the optimiser step there, as the others do, and
  /// this rank stays bitwise equal to them). Returns how many such steps it
  /// joined. Errors: errc::invalid_argument without uneven_inputs or with
  /// the sync off; a failed collective, as synchronize().
  template <class AfterStep>
  result<std::size_t> join(AfterStep&& after_step) {
    if (!flag_ || deferred_)
      return make_error(errc::invalid_argument, "data_parallel::join() needs dp_options::uneven_inputs%s",
                        deferred_ ? " and no sharded_optimizer" : "");
    if (!sync_) return make_error(errc::invalid_argument, "data_parallel::join() with the sync off (no_sync)");
    if (!broken_.ok()) return broken_;
    std::size_t joined = 0;
    if (size() == 1 || plan_.buckets.empty()) return joined;  // the others' steps communicate nothing
    for (;;) {
      float still = 0.0f;  // this rank no longer trains
      if (status st = comm_->allreduce(&still, 1, reduce_op::sum); !st.ok()) {
        broken_ = status(st.code(), "data_parallel::join(): allreduce of the ranks still training: " + st.message());
        return broken_;
      }
      if (still == 0.0f) return joined;  // every rank has joined
      // One step of the others': every bucket, in their order, from zeros.
      store_.zero();
      status first;
      finish_buckets([](std::size_t) {}, [&](std::size_t, const status& st) {
        if (!st.ok() && first.ok()) first = st;
      });
      reset_step();
      if (!first.ok()) {
        broken_ = status(first.code(), "data_parallel::join(): " + first.message());
        return broken_;
      }
      active_ranks_ = static_cast<int>(still);
      after_step();
      ++joined;
    }
  }

 private:
  using core::comm_; using core::params_; using core::index_; using core::plan_; using core::store_;
  using core::opts_; using core::slots_; using core::remaining_; using core::cursor_; using core::next_launch_;
  using core::marked_; using core::flag_; using core::flag_slot_; using core::flag_issued_;
  using core::check_shapes; using core::broadcast_values; using core::build_buckets; using core::unbind;
  using core::reset_step; using core::issue_flag; using core::launch_ready; using core::poll_done;
  using core::finish_buckets; using core::drain; using core::wait_timeout;

  data_parallel(Comm& comm, parameter_list params, dp_options opts) : core(comm, std::move(params), opts) {}

  static double micros(clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

  int active_ranks_ = 0;
  bool sync_ = true;
  bool deferred_ = false;  // defer_reduction()
  status broken_;
  std::vector<bucket_event> timeline_;
  double backward_end_us_ = 0;
  clock::time_point step_start_{};
};

}  // namespace cclite::train
