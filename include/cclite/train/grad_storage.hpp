// cclite/train/grad_storage.hpp - where data_parallel keeps the gradients:
// one flat buffer in bucket order (bucket_plan.hpp), in one of three places:
//
//  - the communicator's shared window (communicator::alloc_shared), when it
//    offers one, every rank shares one node and dp_options::shared_gradients
//    is on: backward then writes the gradients where the peers' allreduce
//    reads them, and no staging copy is made;
//  - ordinary memory otherwise (same results);
//  - device memory, for a Comm that declares `static constexpr bool
//    device_memory = true` (cclite::cuda::device_comm_adapter): the Comm
//    allocates it, and the parameter *values* move there too, in a second flat
//    buffer of the same layout (a `parameter` holds host memory only). Such a
//    Comm provides `buffer` (move-only owner, float* get()), alloc(n) ->
//    result<buffer> (n zeroed floats), zero(ptr, n) noexcept and copy(dst,
//    src, n) (host -> its memory, complete on return).
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include <cclite/core/status.hpp>
#include <cclite/train/bucket_plan.hpp>
#include <cclite/train/parameter.hpp>

namespace cclite::train {
namespace detail {
template <class C, class = void>
struct has_alloc_shared : std::false_type {};
template <class C>
struct has_alloc_shared<C, std::void_t<decltype(std::declval<C&>().alloc_shared(std::size_t{}))>> : std::true_type {};
/// True when C keeps data_parallel's memory itself (see the file comment).
template <class C, class = void>
struct device_memory : std::false_type {};
template <class C>
struct device_memory<C, std::enable_if_t<C::device_memory>> : std::true_type {};
// The owner of device-mode memory; an empty stand-in for host communicators.
struct no_buffer {};
template <class C, bool = device_memory<C>::value>
struct dp_buffer { using type = no_buffer; };
template <class C>
struct dp_buffer<C, true> { using type = typename C::buffer; };
}  // namespace detail

/// The flat gradient buffer (and, in device memory, the values) of one
/// data_parallel. Move-only; frees a shared window through its Comm.
template <class Comm>
class grad_storage {
 public:
  static constexpr bool on_device = detail::device_memory<Comm>::value;

  grad_storage() = default;
  grad_storage(grad_storage&& o) noexcept { *this = std::move(o); }
  grad_storage& operator=(grad_storage&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = o.comm_;
      grad_ = o.grad_;
      size_ = o.size_;
      shared_ = o.shared_;
      own_ = std::move(o.own_);
      dev_grad_ = std::move(o.dev_grad_);
      dev_values_ = std::move(o.dev_values_);
      o.grad_ = nullptr, o.size_ = 0, o.shared_ = false;
    }
    return *this;
  }
  grad_storage(const grad_storage&) = delete;
  grad_storage& operator=(const grad_storage&) = delete;
  ~grad_storage() { release(); }

  /// Zeroed gradients for `plan` (and in device memory the values of
  /// `params`, uploaded in one copy). Collective when a shared window is
  /// taken: every rank has the same size, options and plan.
  status allocate(Comm& comm, const parameter_list& params, const bucket_plan& plan, bool want_shared) {
    release();
    comm_ = &comm;
    size_ = plan.total;
    if constexpr (on_device) {
      auto g = comm.alloc(plan.total);
      if (!g) return g.error();
      auto v = comm.alloc(plan.total);
      if (!v) return v.error();
      dev_grad_ = std::move(g.value());
      dev_values_ = std::move(v.value());
      grad_ = dev_grad_.get();
      std::vector<float> packed(plan.total);
      for (std::size_t i = 0; i < params.size(); ++i) {
        std::copy(params[i]->value(), params[i]->value() + params[i]->size(),
                  packed.begin() + static_cast<std::ptrdiff_t>(plan.param_offset[i]));
      }
      return comm.copy(dev_values_.get(), packed.data(), packed.size());
    } else {
      if constexpr (detail::has_alloc_shared<Comm>::value) {
        if (want_shared && comm.size() > 1 && plan.total) {
          auto p = comm.alloc_shared(plan.total * sizeof(float));
          if (p) grad_ = static_cast<float*>(p.value()), shared_ = true;
          else if (p.error().code() != errc::unsupported) return p.error();
        }
      }
      if (!shared_) {
        own_.assign(plan.total, 0.0f);
        grad_ = own_.data();
      }
      return {};
    }
  }

  /// All gradients, in bucket order.
  float* grad() const noexcept { return grad_; }
  std::size_t size() const noexcept { return size_; }
  /// Whether the gradients live in the communicator's shared window.
  bool shared() const noexcept { return shared_; }
  /// Device memory: all values, laid out as grad(); null on the host.
  float* values() const noexcept {
    if constexpr (on_device) return dev_values_.get();
    else return nullptr;
  }

  /// Zeroes every gradient (Comm's zero() in device memory).
  void zero() noexcept {
    if constexpr (on_device) comm_->zero(grad_, size_);
    else std::fill(grad_, grad_ + size_, 0.0f);
  }

 private:
  void release() noexcept {
    if constexpr (detail::has_alloc_shared<Comm>::value) {
      if (shared_ && comm_) (void)comm_->free_shared(grad_);
    }
    shared_ = false;
    grad_ = nullptr;
  }

  Comm* comm_ = nullptr;
  float* grad_ = nullptr;  // own_, the shared window or dev_grad_
  std::size_t size_ = 0;
  bool shared_ = false;
  std::vector<float> own_;
  typename detail::dp_buffer<Comm>::type dev_grad_, dev_values_;  // device memory only
};

}  // namespace cclite::train
