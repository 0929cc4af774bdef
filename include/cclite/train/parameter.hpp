// cclite/train/parameter.hpp - a trainable tensor: its values and where its gradient goes.
//
// A `parameter` owns its values. Its gradient is reached through `grad`, which
// points either into the parameter's own storage or, once a data_parallel
// wrapper adopted it, into that wrapper's communication buckets (the
// "gradient as bucket view" layout of PyTorch DDP): backward then writes the
// gradient straight into the memory the allreduce sends, with no copy.
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

class parameter {
 public:
  parameter() = default;
  parameter(std::string name, std::size_t count) : name_(std::move(name)), value_(count, 0.0f) {
    use_own_grad();
  }
  parameter(parameter&&) noexcept = default;  // vectors keep their buffers: grad stays valid
  parameter& operator=(parameter&&) noexcept = default;
  parameter(const parameter&) = delete;
  parameter& operator=(const parameter&) = delete;

  const std::string& name() const noexcept { return name_; }
  std::size_t size() const noexcept { return value_.size(); }
  std::size_t bytes() const noexcept { return value_.size() * sizeof(float); }

  float* value() noexcept { return value_.data(); }
  const float* value() const noexcept { return value_.data(); }
  std::vector<float>& values() noexcept { return value_; }
  const std::vector<float>& values() const noexcept { return value_; }

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
  std::vector<float> value_;
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
