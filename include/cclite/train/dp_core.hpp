// cclite/train/dp_core.hpp - the machinery behind train::data_parallel: its
// gradient buckets and the collectives on them.
//
// data_parallel<Comm> (data_parallel.hpp, the public API) derives from this.
// Here are create()'s collective steps (the shape check, the broadcast of
// rank 0's parameter values, the bucket layout and the gradient storage) and
// each step's bucket allreduces: issued in bucket order as buckets complete,
// the last one run on the calling thread, the uneven-inputs flag, compressed
// buckets unpacked, outstanding allreduces drained before the buffers go.
// What a step means (sync on or off, deferred, broken, its timeline) stays
// with data_parallel.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>
#include <cclite/train/bucket_plan.hpp>
#include <cclite/train/dp_options.hpp>
#include <cclite/train/grad_compression.hpp>
#include <cclite/train/grad_storage.hpp>
#include <cclite/train/parameter.hpp>

namespace cclite::train::detail {

// Whether a communicator type has a deadline of its own (communicator<...>::timeout()).
template <class C, class = void>
struct has_timeout : std::false_type {};
template <class C>
struct has_timeout<C, std::void_t<decltype(std::declval<const C&>().timeout())>> : std::true_type {};

template <class Comm>
class dp_core {
 protected:
  static constexpr bool on_device = grad_storage<Comm>::on_device;

  struct slot {
    decltype(std::declval<Comm&>().allreduce_async(static_cast<float*>(nullptr), std::size_t{0},
                                                   reduce_op::avg)) w;
    clock::time_point launched{};
    clock::time_point seen_done{};  // first time done() was seen true this step
  };

  dp_core() = default;
  dp_core(Comm& comm, parameter_list params, dp_options opts)
      : comm_(&comm), params_(std::move(params)), opts_(opts) {}
  dp_core(const dp_core&) = delete;
  dp_core& operator=(const dp_core&) = delete;
  // data_parallel's move assignment: finishes this one's allreduces and takes
  // o's buckets. The owner drains and unbinds in its own destructor.
  dp_core& operator=(dp_core&& o) noexcept {
    if (this != &o) {
      drain();
      unbind();  // the gradient buffer is about to go
      comm_ = o.comm_;
      params_ = std::move(o.params_);
      index_ = std::move(o.index_);
      plan_ = std::move(o.plan_);
      store_ = std::move(o.store_);
      wire_ = std::move(o.wire_);
      opts_ = o.opts_;
      slots_ = std::move(o.slots_);
      remaining_ = std::move(o.remaining_);
      cursor_ = std::move(o.cursor_);
      next_launch_ = o.next_launch_;
      marked_ = o.marked_;
      o.next_launch_ = 0;
      flag_ = std::move(o.flag_);
      flag_slot_ = std::move(o.flag_slot_);
      flag_issued_ = o.flag_issued_;
      o.flag_issued_ = false;
      o.params_.clear();  // the moved-from wrapper no longer owns the bindings
    }
    return *this;
  }
  ~dp_core() = default;

  // The bound of a wait on a bucket: the communicator's deadline as it is now
  // (so comm.set_timeout() after create() applies) while the option is unset.
  milliseconds wait_timeout() const noexcept {
    if constexpr (has_timeout<Comm>::value)
      if (opts_.timeout.count() == -2) return comm_->timeout();
    return opts_.timeout;
  }

  // Notes which issued buckets have finished; true if all of them have.
  bool poll_done() {
    bool all = true;
    for (std::size_t b = 0; b < next_launch_; ++b) {
      if (slots_[b].seen_done != clock::time_point{}) continue;
      if (slots_[b].w.done()) slots_[b].seen_done = clock::now();
      else all = false;
    }
    return all;
  }

  // Every rank must register the same shapes, or buckets would not line up
  // and the allreduces would mix unrelated gradients: compare a hash of the
  // shapes through min and max allreduces.
  status check_shapes() {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(params_.size());
    for (parameter* p : params_) mix(p->size());
    mix(opts_.bucket_cap_bytes);
    mix(opts_.first_bucket_cap_bytes);
    mix(opts_.split_bytes);
    mix(static_cast<std::uint64_t>(opts_.compression));
    mix(opts_.uneven_inputs ? 1 : 0);
    if (comm_->size() == 1) return {};
    std::uint64_t lo = h, hi = h;
    CCLITE_TRY(comm_->allreduce(&lo, 1, reduce_op::min));
    CCLITE_TRY(comm_->allreduce(&hi, 1, reduce_op::max));
    if (lo != hi) {
      return make_error(errc::mismatch,
                        "data_parallel: rank %d registered %zu parameters (%zu values) with bucket caps "
                        "%zu/%zu bytes, compression %s and uneven_inputs %s, and some other rank registered "
                        "different ones; every rank must build the same model with the same options",
                        comm_->rank(), params_.size(), total_values(), opts_.first_bucket_cap_bytes,
                        opts_.bucket_cap_bytes, to_string(opts_.compression), opts_.uneven_inputs ? "on" : "off");
    }
    return {};
  }

  std::size_t total_values() const {
    std::size_t n = 0;
    for (parameter* p : params_) n += p->size();
    return n;
  }

  // One broadcast of all values packed together: one collective instead of
  // one per parameter.
  status broadcast_values() {
    if (comm_->size() == 1) return {};
    if constexpr (on_device) return comm_->broadcast(store_.values(), store_.size(), 0);  // after build_buckets
    std::vector<float> packed(total_values());
    std::size_t off = 0;
    for (parameter* p : params_) {
      std::copy(p->value(), p->value() + p->size(), packed.begin() + static_cast<std::ptrdiff_t>(off));
      off += p->size();
    }
    CCLITE_TRY(comm_->broadcast(packed.data(), packed.size(), 0));
    off = 0;
    for (parameter* p : params_) {
      std::copy(packed.begin() + static_cast<std::ptrdiff_t>(off),
                packed.begin() + static_cast<std::ptrdiff_t>(off + p->size()), p->value());
      off += p->size();
    }
    return {};
  }

  status build_buckets() {
    // Parameters of one module ("fc1.weight", "fc1.bias": the name up to its
    // last '.') get their gradients at the same moment of backward, so they
    // share a bucket: a small bias must not hold a bucket back until its
    // layer, processed last, is done.
    std::vector<std::size_t> sizes, groups;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      sizes.push_back(params_[i]->size());
      const std::string& n = params_[i]->name();
      const auto dot = n.rfind('.');
      const bool same = i > 0 && dot != std::string::npos && dot > 0 &&
                        params_[i - 1]->name().compare(0, dot + 1, n, 0, dot + 1) == 0 &&
                        params_[i - 1]->name().find('.', dot + 1) == std::string::npos;
      groups.push_back(same ? groups.back() : i);
    }
    plan_ = bucket_plan::make(sizes, sizeof(float), opts_.first_bucket_cap_bytes, opts_.bucket_cap_bytes, groups,
                              opts_.split_bytes);
    const bool compressed = opts_.compression != grad_compression::none;
    CCLITE_TRY(store_.allocate(*comm_, params_, plan_, opts_.shared_gradients && !compressed));
    if (comm_->size() > 1) wire_.allocate(opts_.compression, store_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      index_[params_[i]] = i;
      if constexpr (!on_device) params_[i]->bind_grad(store_.grad() + plan_.param_offset[i]);
    }
    slots_.clear();
    slots_.resize(plan_.buckets.size());
    cursor_.assign(params_.size(), 0);
    reset_step();
    return {};
  }

  void unbind() {
    if constexpr (!on_device)
      for (parameter* p : params_) p->use_own_grad();
  }

  void reset_step() {
    remaining_.resize(plan_.buckets.size());
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) remaining_[b] = plan_.buckets[b].count;
    std::fill(cursor_.begin(), cursor_.end(), std::size_t{0});
    next_launch_ = 0;
    marked_ = 0;
    flag_issued_ = false;
  }

  // dp_options::uneven_inputs: the step's first collective says this rank
  // still trains (join() sends 0 in its place).
  void issue_flag() {
    if (!flag_ || flag_issued_) return;
    *flag_ = 1.0f;
    flag_slot_.w = comm_->allreduce_async(flag_.get(), 1, reduce_op::sum);
    flag_issued_ = true;
  }

  // The last bucket is left to synchronize(): it completes when backward
  // ends, so nothing is left to overlap it with, and synchronize() can run it
  // on the calling thread (no hand-off to and from the communicator's thread).
  void launch_ready() {
    while (next_launch_ + 1 < plan_.buckets.size() && remaining_[next_launch_] == 0) launch(next_launch_++);
  }

  void launch(std::size_t b) {
    const auto& bk = plan_.buckets[b];
    slots_[b].launched = clock::now();
    slots_[b].seen_done = clock::time_point{};
    if constexpr (!on_device) {
      if (wire_.on()) {
        slots_[b].w = wire_.allreduce_async(*comm_, store_.grad(), bk.offset, bk.count);
        return;
      }
    }
    slots_[b].w = comm_->allreduce_async(store_.grad() + bk.offset, bk.count, reduce_op::avg);
  }

  // The step's end: issues the buckets not issued yet, in order (on_launch(b)
  // first), all but the last asynchronously; runs the last on the calling
  // thread (inline when the queue is idle); waits for the others and unpacks
  // them; outcome(b, status) for each bucket.
  template <class OnLaunch, class Outcome>
  void finish_buckets(OnLaunch&& on_launch, Outcome&& outcome) {
    const std::size_t last = plan_.buckets.size() - 1;
    for (; next_launch_ < last; ++next_launch_) {
      on_launch(next_launch_);
      launch(next_launch_);
    }
    on_launch(last);
    outcome(last, reduce_inline(last));
    // Issue order is completion order (one queue), so these are done or nearly.
    for (std::size_t b = 0; b < last; ++b) {
      status st = slots_[b].w.wait(wait_timeout());
      if (st.ok()) unpack(b);
      outcome(b, st);
    }
  }

  // Bucket b reduced on the calling thread (synchronize()'s last one).
  status reduce_inline(std::size_t b) {
    const auto& bk = plan_.buckets[b];
    if constexpr (!on_device) {
      if (wire_.on()) return wire_.allreduce(*comm_, store_.grad(), bk.offset, bk.count);
    }
    return comm_->allreduce(store_.grad() + bk.offset, bk.count, reduce_op::avg);
  }

  // A compressed bucket's reduced values back into its fp32 gradients.
  void unpack(std::size_t b) {
    if constexpr (!on_device) {
      if (wire_.on()) wire_.unpack(store_.grad(), plan_.buckets[b].offset, plan_.buckets[b].count);
    }
  }

  // Outstanding allreduces write into the gradients: they must finish before they go.
  void drain() noexcept {
    for (std::size_t b = 0; b < next_launch_ && b < slots_.size(); ++b) (void)slots_[b].w.wait(milliseconds(-1));
    if (flag_issued_) (void)flag_slot_.w.wait(milliseconds(-1));
    next_launch_ = 0;
    flag_issued_ = false;
  }

  Comm* comm_ = nullptr;
  parameter_list params_;
  std::unordered_map<const parameter*, std::size_t> index_;
  bucket_plan plan_;
  grad_storage<Comm> store_;  // all gradients, bucket order
  grad_wire wire_;             // dp_options::compression: the gradients in 16 bits
  dp_options opts_;
  std::vector<slot> slots_;
  std::vector<std::size_t> remaining_;  // per bucket: gradient elements not yet final this step
  std::vector<std::size_t> cursor_;     // per parameter: elements [0, cursor) marked this step
  std::size_t next_launch_ = 0;  // buckets [0, next_launch_) are issued this step
  std::size_t marked_ = 0;       // grad_ready calls that counted this step
  std::unique_ptr<float> flag_;  // uneven_inputs: 1 while training (stable address for the async allreduce)
  slot flag_slot_;
  bool flag_issued_ = false;
};

}  // namespace cclite::train::detail
