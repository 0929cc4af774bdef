// cclite/train/parameter.hpp - a trainable tensor: its values and where its gradient goes.
//
// A `parameter` owns its values. Its gradient is reached through `grad`, which
// points either into the parameter's own storage or, once a data_parallel
// wrapper adopted it, into that wrapper's communication buckets (the
// "gradient as bucket view" layout of PyTorch DDP): backward then writes the
// gradient straight into the memory the allreduce sends, with no copy. The
// values can move the same way (bind_value): a sharded_optimizer keeps them
// in memory every rank of the node maps.
//
// Backward *accumulates* into `grad` (+=), so several micro-batches add up
// until someone zeroes it (gradient accumulation). Parameters are movable but
// not copyable, because a copy would share `grad` with the original.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace cclite::train {

/// A view of n floats (what values() returns; C++17 has no std::span).
template <class T>
struct float_view {
  T* ptr = nullptr;
  std::size_t n = 0;
  T* begin() const noexcept { return ptr; }
  T* end() const noexcept { return ptr + n; }
  T* data() const noexcept { return ptr; }
  std::size_t size() const noexcept { return n; }
  T& operator[](std::size_t i) const noexcept { return ptr[i]; }
};

class parameter {
 public:
  parameter() = default;
  parameter(std::string name, std::size_t count) : name_(std::move(name)), size_(count), own_value_(count, 0.0f) {
    value_ = own_value_.data();
    use_own_grad();
  }
  parameter(parameter&&) noexcept = default;  // vectors keep their buffers: value and grad stay valid
  parameter& operator=(parameter&&) noexcept = default;
  parameter(const parameter&) = delete;
  parameter& operator=(const parameter&) = delete;

  const std::string& name() const noexcept { return name_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(float); }

  float* value() noexcept { return value_; }
  const float* value() const noexcept { return value_; }
  float_view<float> values() noexcept { return {value_, size_}; }
  float_view<const float> values() const noexcept { return {value_, size_}; }

  /// Moves the values to `storage` (size() floats, owned by the caller, who
  /// must keep it alive while it is bound), copying the current ones there
  /// unless `copy` is false (storage already holds them).
  void bind_value(float* storage, bool copy = true) noexcept {
    if (copy) std::copy(value_, value_ + size_, storage);
    value_ = storage;
    own_value_.clear();
    own_value_.shrink_to_fit();
  }
  /// Back to values owned by the parameter (copying the current ones).
  void use_own_value() {
    if (owns_value()) return;
    std::vector<float> v(value_, value_ + size_);
    own_value_ = std::move(v);
    value_ = own_value_.data();
  }
  bool owns_value() const noexcept { return value_ == own_value_.data() && own_value_.size() == size_; }

  /// Where backward accumulates this parameter's gradient (size() floats).
  float* grad() noexcept { return grad_; }
  const float* grad() const noexcept { return grad_; }

  /// Sets the gradient to zero.
  void zero_grad() noexcept { std::fill(grad_, grad_ + size(), 0.0f); }

  /// Redirects the gradient to `storage` (size() floats, owned by the caller,
  /// who must keep it alive while it is bound). Copies the current gradient.
  void bind_grad(float* storage) noexcept {
    std::copy(grad_, grad_ + size(), storage);
    grad_ = storage;
    own_grad_.clear();
    own_grad_.shrink_to_fit();
  }

  /// Back to a gradient owned by the parameter (copying the current one).
  void use_own_grad() {
    std::vector<float> g(size(), 0.0f);
    if (grad_) std::copy(grad_, grad_ + size(), g.begin());
    own_grad_ = std::move(g);
    grad_ = own_grad_.data();
  }

 private:
  std::string name_;
  std::size_t size_ = 0;
  std::vector<float> own_value_;
  float* value_ = nullptr;  // own_value_ or bound storage
  std::vector<float> own_grad_;
  float* grad_ = nullptr;
};

/// Non-owning list of parameters in registration (forward) order.
using parameter_list = std::vector<parameter*>;

/// Zeroes every gradient in `params`.
inline void zero_grads(const parameter_list& params) noexcept {
  for (parameter* p : params) p->zero_grad();
}

}  // namespace cclite::train
