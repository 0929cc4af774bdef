// cclite/train/mlp.hpp - a multi-layer perceptron: linear layers with ReLU between them.
//
//   train::mlp net({784, 256, 128, 10}, /*max_batch=*/64, /*seed=*/1);
//   const float* logits = net.forward(x, batch);
//   auto r = train::softmax_cross_entropy(logits, y, batch, 10, net.output_grad(), 1.0f / batch);
//   net.backward(batch, [&](train::parameter& p) { ddp.grad_ready(p); });
//
// The network keeps the activations of the last forward (what backward needs)
// in buffers sized for `max_batch` rows, so a training step allocates nothing.
// backward() walks the layers from the output down and, for each layer,
// finishes its weight and bias gradients *before* computing the gradient of
// its input, calling `on_ready` for each parameter as soon as its gradient is
// final: a data_parallel wrapper starts allreducing those buckets while the
// lower layers are still being differentiated.
//
// data_parallel and the optimisers keep pointers to the parameters, so an mlp
// must not be moved once they are built (construct it where it will live).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <cclite/train/layers.hpp>
#include <cclite/train/parameter.hpp>
#include <cclite/train/random.hpp>

namespace cclite::train {

class mlp {
 public:
  /// `sizes` = {inputs, hidden..., outputs}, at least two entries, all positive.
  /// Weights are drawn from rng(seed) (PyTorch's default initialisation);
  /// data_parallel overwrites them with rank 0's anyway.
  mlp(const std::vector<int>& sizes, int max_batch, std::uint64_t seed) : sizes_(sizes), max_batch_(max_batch) {
    rng g(seed);
    for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
      layers_.emplace_back(sizes[l], sizes[l + 1], "fc" + std::to_string(l + 1));
      layers_.back().init(g);
    }
    acts_.resize(layers_.size());
    for (std::size_t l = 0; l < layers_.size(); ++l)
      acts_[l].assign(static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(sizes[l + 1]), 0.0f);
    int widest = 0;
    for (int s : sizes) widest = s > widest ? s : widest;
    grad_a_.assign(static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(widest), 0.0f);
    grad_b_.assign(grad_a_.size(), 0.0f);
  }

  mlp(const mlp&) = delete;
  mlp& operator=(const mlp&) = delete;

  int inputs() const noexcept { return sizes_.front(); }
  int outputs() const noexcept { return sizes_.back(); }
  int max_batch() const noexcept { return max_batch_; }
  const std::vector<int>& sizes() const noexcept { return sizes_; }

  /// Every parameter in registration (forward) order: fc1.weight, fc1.bias, fc2.weight, ...
  parameter_list parameters() {
    parameter_list out;
    for (auto& l : layers_) {
      out.push_back(&l.weight());
      out.push_back(&l.bias());
    }
    return out;
  }

  std::size_t parameter_count() const noexcept {
    std::size_t n = 0;
    for (std::size_t l = 0; l + 1 < sizes_.size(); ++l)
      n += static_cast<std::size_t>(sizes_[l]) * static_cast<std::size_t>(sizes_[l + 1]) +
           static_cast<std::size_t>(sizes_[l + 1]);
    return n;
  }

  /// Runs `batch` rows of x ([batch][inputs]) through the network; returns the
  /// logits ([batch][outputs]), valid until the next forward. x must stay
  /// unchanged until backward. Precondition: 0 < batch <= max_batch().
  const float* forward(const float* x, int batch) {
    x_ = x;
    const float* in = x;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      float* out = acts_[l].data();
      layers_[l].forward(in, out, batch);
      if (l + 1 < layers_.size())
        relu_forward(out, static_cast<std::size_t>(batch) * static_cast<std::size_t>(sizes_[l + 1]));
      in = out;
    }
    return in;
  }

  /// Where the loss writes d(loss)/d(logits) before backward() ([max_batch][outputs]).
  float* output_grad() noexcept { return grad_a_.data(); }

  /// Computes every parameter gradient for the last forward's batch, given
  /// output_grad(), adding to the gradients (accumulate = true) or
  /// overwriting them (false: no zero_grad needed before, and the same bits as
  /// zeroing then adding). Calls on_ready(parameter&) for each parameter once
  /// its gradient is final, in reverse registration order (bias before
  /// weight). If on_ready also accepts (parameter&, begin, end) and
  /// set_grad_blocks(k > 1) was called, the first layer's weight gradient
  /// (the last one backward finishes, with nothing left to overlap its
  /// communication with) is computed in k row blocks, and on_ready(p, begin,
  /// end) reports each block's elements [begin, end) as soon as it is final.
  template <class OnReady>
  void backward(int batch, OnReady&& on_ready, bool accumulate = true) {
    float* dy = grad_a_.data();
    float* dx = grad_b_.data();
    for (std::size_t l = layers_.size(); l-- > 0;) {
      const float* in = l == 0 ? x_ : acts_[l - 1].data();
      linear& ly = layers_[l];
      if constexpr (std::is_invocable_v<OnReady&, parameter&, std::size_t, std::size_t>) {
        if (l == 0 && grad_blocks_ > 1) {
          ly.backward_bias(dy, batch, accumulate);
          on_ready(ly.bias());
          const int rows = ly.out_features(), blocks = grad_blocks_ < rows ? grad_blocks_ : rows;
          const std::size_t in_n = static_cast<std::size_t>(ly.in_features());
          for (int k = 0; k < blocks; ++k) {
            const int r0 = rows * k / blocks, r1 = rows * (k + 1) / blocks;
            ly.backward_weight_rows(in, dy, batch, r0, r1, accumulate);
            on_ready(ly.weight(), static_cast<std::size_t>(r0) * in_n, static_cast<std::size_t>(r1) * in_n);
          }
          on_ready(ly.weight());
          break;
        }
      }
      ly.backward_params(in, dy, batch, accumulate);
      on_ready(ly.bias());
      on_ready(ly.weight());
      if (l == 0) break;  // nobody needs the gradient of the input
      ly.backward_input(dy, dx, batch);
      relu_backward(acts_[l - 1].data(), dx, static_cast<std::size_t>(batch) * static_cast<std::size_t>(sizes_[l]));
      std::swap(dx, dy);
    }
  }
  void backward(int batch, bool accumulate = true) {
    backward(batch, [](parameter&) {}, accumulate);
  }

  /// Row blocks of the first layer's weight gradient reported separately by
  /// backward() (1 = whole, the default). A block may be computed by other
  /// BLAS kernels than the whole matrix, so results can differ in the last
  /// bits from k = 1: every rank of a job must use the same k.
  void set_grad_blocks(int k) noexcept { grad_blocks_ = k < 1 ? 1 : k; }
  int grad_blocks() const noexcept { return grad_blocks_; }

 private:
  std::vector<int> sizes_;
  int max_batch_;
  std::vector<linear> layers_;
  std::vector<std::vector<float>> acts_;  // post-ReLU outputs of each layer (logits last)
  std::vector<float> grad_a_, grad_b_;    // ping-pong activation gradients
  const float* x_ = nullptr;
  int grad_blocks_ = 1;
};

}  // namespace cclite::train
