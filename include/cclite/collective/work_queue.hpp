// cclite/collective/work_queue.hpp - ordered execution of collectives, blocking and async.
//
// Collectives must run in the order the caller issued them (every rank issues
// the same sequence; that order is what matches rank to rank). The queue
// gives each call a place in one FIFO and runs one call at a time:
//   - a blocking call finding the queue idle runs inline on the caller's thread
//     (no thread hop: an 8-byte allreduce stays a few microseconds);
//   - otherwise, and for every *_async call, the call is queued and a
//     background thread (started on first use) runs it; the caller gets a
//     `work` handle whose wait(timeout) returns the call's status.
// Slots are preallocated (max_outstanding): no heap allocation per call.
//
// With CCLITE_NO_THREADS (config.hpp) the queue never starts a thread: every
// blocking call runs inline on its caller's thread (a second caller thread
// waits for the first to finish), and submit() - every *_async call - returns
// a work handle already failed with errc::unsupported. For firmware and RTOS
// builds where the application owns every thread.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#if !defined(CCLITE_NO_THREADS)
#include <thread>
#endif

#include <cclite/collective/op.hpp>
#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

namespace detail {

/// What the queue runs: implemented by communicator.
class op_executor {
 public:
  virtual status execute(const op_desc& d) = 0;

 protected:
  ~op_executor() = default;
};

class work_queue;
}  // namespace detail

/// Handle of an asynchronous collective (like torch.distributed's Work).
/// Movable, not copyable. Destroying an unfinished handle is allowed: the
/// collective still runs; only its status is dropped.
class work {
 public:
  work() = default;
  work(work&& o) noexcept { *this = std::move(o); }
  work& operator=(work&& o) noexcept;
  work(const work&) = delete;
  work& operator=(const work&) = delete;
  ~work();

  /// Waits until the collective finished and returns its status, or
  /// errc::timeout if `timeout` passes first (the collective keeps running;
  /// wait again, or abort() the communicator). Negative timeout = wait forever.
  status wait(milliseconds timeout = milliseconds(-1));
  /// True once the collective finished (never blocks).
  bool done() const;
  /// A handle that is already complete with `s` (an argument error found
  /// before queuing).
  static work failed(status s) { return work(std::move(s)); }
  /// A handle whose collective already ran, with status `s` (ok or not): a
  /// call that could not be queued (device buffers, collective/device_hook.hpp).
  static work completed(status s) {
    work w(std::move(s));
    w.slot_ = ran_slot;
    return w;
  }
  /// True if this handle refers to a submitted collective.
  bool valid() const noexcept { return q_ != nullptr || !early_.ok() || slot_ == ran_slot; }

 private:
  friend class detail::work_queue;
  work(detail::work_queue* q, int slot, std::uint64_t gen) : q_(q), slot_(slot), gen_(gen) {}
  explicit work(status early) : early_(std::move(early)) {}
  static constexpr int ran_slot = -2;  // completed(): early_ is the collective's status
  detail::work_queue* q_ = nullptr;
  int slot_ = -1;
  std::uint64_t gen_ = 0;
  status early_;  // an error found before queuing (bad arguments)
};

namespace detail {

class work_queue {
 public:
  static constexpr int max_outstanding = 64;

  explicit work_queue(op_executor& ex) : ex_(ex) {}
  work_queue(const work_queue&) = delete;
  work_queue& operator=(const work_queue&) = delete;
  ~work_queue() { shutdown(); }

  /// Runs `d` in order; inline when nothing is queued or running.
  status run(const op_desc& d) {
    std::unique_lock<std::mutex> lk(mu_);
#if defined(CCLITE_NO_THREADS)
    // Nothing is ever queued (submit() refuses): wait for a concurrent caller.
    cv_.wait(lk, [&] { return !busy_; });
#endif
    if (count_ == 0 && !busy_) {
      busy_ = true;
      lk.unlock();
      status st = ex_.execute(d);
      lk.lock();
      busy_ = false;
      cv_.notify_all();
      return st;
    }
    lk.unlock();
    work w = submit(d);
    return w.wait();
  }

  /// Returns once nothing is queued or running: what was issued before has
  /// finished (each queued collective is bounded by its own deadline).
  void wait_idle() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return count_ == 0 && !busy_; });
  }

  /// Queues `d` for the background thread.
  work submit(const op_desc& d) {
#if defined(CCLITE_NO_THREADS)
    return work(make_error(errc::unsupported,
                           "%s_async: this build has CCLITE_NO_THREADS (no background thread); "
                           "use the blocking %s",
                           to_string(d.kind), to_string(d.kind)));
#endif
    std::unique_lock<std::mutex> lk(mu_);
    if (count_ == max_outstanding) {
      return work(make_error(errc::resource_exhausted,
                             "%d asynchronous collectives are outstanding; wait() on some before "
                             "issuing more",
                             max_outstanding));
    }
    int s = -1;
    for (int i = 0; i < max_outstanding; ++i)
      if (!slots_[static_cast<std::size_t>(i)].in_use) { s = i; break; }
    if (s < 0) {
      return work(make_error(errc::resource_exhausted,
                             "all %d work handles are alive; destroy or wait() old handles",
                             max_outstanding));
    }
    slot& sl = slots_[static_cast<std::size_t>(s)];
    sl.in_use = true;
    sl.done = false;
    sl.handle_alive = true;
    sl.desc = d;
    sl.queued_us = wall_us();  // for the flight recorder (for_each_queued)
    sl.result = status();
    const std::uint64_t gen = ++sl.gen;
    fifo_[(head_ + count_) % max_outstanding] = s;
    ++count_;
#if !defined(CCLITE_NO_THREADS)
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
#endif
    cv_.notify_all();
    return work(this, s, gen);
  }

  /// Calls f(desc, issued at: wall_us) for each call queued and not started
  /// yet, in the order they will run (the flight recorder's dumps).
  template <class F>
  void for_each_queued(F&& f) const {
    std::lock_guard<std::mutex> lk(mu_);
    for (int i = 0; i < count_; ++i) {
      const slot& sl = slots_[static_cast<std::size_t>(fifo_[(head_ + i) % max_outstanding])];
      f(sl.desc, sl.queued_us);
    }
  }

  /// Stops the background thread after the queued calls ran.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      cv_.notify_all();
    }
#if !defined(CCLITE_NO_THREADS)
    if (thread_.joinable()) thread_.join();
#endif
  }

 private:
  friend class cclite::work;
  struct slot {
    op_desc desc;
    status result;
    std::int64_t queued_us = 0;  ///< when submitted (wall clock)
    std::uint64_t gen = 0;
    bool in_use = false, done = false, handle_alive = false;
  };

  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return (count_ > 0 && !busy_) || (stop_ && count_ == 0); });
      if (count_ == 0) return;
      int s = fifo_[head_];
      head_ = (head_ + 1) % max_outstanding;
      --count_;
      busy_ = true;
      op_desc d = slots_[static_cast<std::size_t>(s)].desc;
      lk.unlock();
      status st = ex_.execute(d);
      lk.lock();
      slot& sl = slots_[static_cast<std::size_t>(s)];
      sl.result = std::move(st);
      sl.done = true;
      if (!sl.handle_alive) sl.in_use = false;
      busy_ = false;
      cv_.notify_all();
    }
  }

  status wait(int s, std::uint64_t gen, milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    slot& sl = slots_[static_cast<std::size_t>(s)];
    if (sl.gen != gen) return status();
    auto ready = [&] { return sl.done; };
    if (timeout.count() < 0) {
      cv_.wait(lk, ready);
    } else if (!cv_.wait_for(lk, timeout, ready)) {
      return make_error(errc::timeout, "%s still running after %lld ms (work.wait timeout)",
                        to_string(sl.desc.kind), static_cast<long long>(timeout.count()));
    }
    return sl.result;
  }

  bool done(int s, std::uint64_t gen) {
    std::lock_guard<std::mutex> lk(mu_);
    const slot& sl = slots_[static_cast<std::size_t>(s)];
    return sl.gen != gen || sl.done;
  }

  void release(int s, std::uint64_t gen) {
    std::lock_guard<std::mutex> lk(mu_);
    slot& sl = slots_[static_cast<std::size_t>(s)];
    if (sl.gen != gen) return;
    sl.handle_alive = false;
    if (sl.done) sl.in_use = false;
  }

  op_executor& ex_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::array<slot, max_outstanding> slots_{};
  std::array<int, max_outstanding> fifo_{};
  int head_ = 0, count_ = 0;
  bool busy_ = false, stop_ = false;
#if !defined(CCLITE_NO_THREADS)
  std::thread thread_;
#endif
};

}  // namespace detail

inline work& work::operator=(work&& o) noexcept {
  if (this != &o) {
    if (q_) q_->release(slot_, gen_);
    q_ = o.q_;
    slot_ = o.slot_;
    gen_ = o.gen_;
    early_ = std::move(o.early_);
    o.q_ = nullptr;
  }
  return *this;
}
inline work::~work() {
  if (q_) q_->release(slot_, gen_);
}
inline status work::wait(milliseconds timeout) {
  if (!q_) {
    if (slot_ == ran_slot || !early_.ok()) return early_;
    return make_error(errc::invalid_argument, "wait() on an empty work handle");
  }
  return q_->wait(slot_, gen_, timeout);
}
inline bool work::done() const { return q_ ? q_->done(slot_, gen_) : true; }

}  // namespace cclite
