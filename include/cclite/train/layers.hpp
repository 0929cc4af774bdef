// cclite/train/layers.hpp - what an MLP needs: linear, ReLU, softmax cross-entropy.
//
// Activations are row-major [batch][features] float arrays owned by the
// caller (see mlp.hpp). Every backward *adds* to the parameter gradients, so
// micro-batches accumulate until the gradients are zeroed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <cclite/train/gemm.hpp>
#include <cclite/train/parameter.hpp>
#include <cclite/train/random.hpp>

namespace cclite::train {

/// y = x W^T + b, with W [out][in] and b [out] (PyTorch's nn.Linear layout).
class linear {
 public:
  linear(int in, int out, const std::string& name)
      : in_(in), out_(out),
        weight_(name + ".weight", static_cast<std::size_t>(in) * static_cast<std::size_t>(out)),
        bias_(name + ".bias", static_cast<std::size_t>(out)) {}

  int in_features() const noexcept { return in_; }
  int out_features() const noexcept { return out_; }
  parameter& weight() noexcept { return weight_; }
  parameter& bias() noexcept { return bias_; }

  /// PyTorch's default initialisation: W and b uniform in +-1/sqrt(in).
  void init(rng& g) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
    for (float& w : weight_.values()) w = g.uniform(-bound, bound);
    for (float& b : bias_.values()) b = g.uniform(-bound, bound);
  }

  /// y[batch][out] = x[batch][in] W^T + b.
  void forward(const float* x, float* y, int batch) const {
    const float* b = bias_.value();
    for (int i = 0; i < batch; ++i) std::copy(b, b + out_, y + static_cast<std::ptrdiff_t>(i) * out_);
    gemm(false, true, batch, out_, in_, 1.0f, x, in_, weight_.value(), in_, 1.0f, y, out_);
  }

  /// Parameter gradients from the layer's input x and output gradient dy:
  /// dW += dy^T x, db += column sums of dy (accumulate = false: dW = ..., db =
  /// ..., overwriting instead of adding, which spares zeroing the gradients
  /// and reading them back; 0 + v == v, so the bits are the same). Computed
  /// before backward_input so that their allreduce can start while the layers
  /// below still run.
  void backward_params(const float* x, const float* dy, int batch, bool accumulate = true) {
    backward_weight_rows(x, dy, batch, 0, out_, accumulate);
    backward_bias(dy, batch, accumulate);
  }

  /// Rows [row_begin, row_end) of dW only (the outputs of that range): lets a
  /// caller hand a finished block of a large gradient to the communication
  /// while it computes the next.
  void backward_weight_rows(const float* x, const float* dy, int batch, int row_begin, int row_end,
                            bool accumulate = true) {
    if (row_end <= row_begin) return;
    gemm(true, false, row_end - row_begin, in_, batch, 1.0f, dy + row_begin, out_, x, in_, accumulate ? 1.0f : 0.0f,
         weight_.grad() + static_cast<std::ptrdiff_t>(row_begin) * in_, in_);
  }

  /// db (+)= column sums of dy.
  void backward_bias(const float* dy, int batch, bool accumulate = true) {
    float* db = bias_.grad();
    int i = 0;
    if (!accumulate) {
      if (batch > 0) std::copy(dy, dy + out_, db), i = 1;
      else std::fill(db, db + out_, 0.0f);
    }
    for (; i < batch; ++i) {
      const float* row = dy + static_cast<std::ptrdiff_t>(i) * out_;
      for (int j = 0; j < out_; ++j) db[j] += row[j];
    }
  }

  /// dx[batch][in] = dy[batch][out] W.
  void backward_input(const float* dy, float* dx, int batch) const {
    gemm(false, false, batch, in_, out_, 1.0f, dy, out_, weight_.value(), in_, 0.0f, dx, in_);
  }

 private:
  int in_, out_;
  parameter weight_, bias_;
};

/// In-place ReLU over n values.
inline void relu_forward(float* x, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/// dx = dy where the ReLU output y was positive, else 0 (in place on dy).
inline void relu_backward(const float* y, float* dy, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

/// What softmax_cross_entropy returns for a batch.
struct loss_result {
  double loss_sum = 0.0;  ///< sum over the batch of -log p(label)
  int correct = 0;        ///< rows whose arg-max logit is the label
};

/// Softmax cross-entropy over `batch` rows of `classes` logits.
/// If `dlogits` is not null it receives d(loss)/d(logits) * grad_scale, i.e.
/// (softmax - onehot) * grad_scale; grad_scale = 1/batch gives the gradient of
/// the batch mean (PyTorch's reduction='mean').
/// Precondition: 0 <= labels[i] < classes.
inline loss_result softmax_cross_entropy(const float* logits, const std::uint8_t* labels, int batch,
                                         int classes, float* dlogits, float grad_scale) {
  loss_result r;
  for (int i = 0; i < batch; ++i) {
    const float* z = logits + static_cast<std::ptrdiff_t>(i) * classes;
    const int label = labels[i];
    int arg = 0;
    float mx = z[0];
    for (int j = 1; j < classes; ++j)
      if (z[j] > mx) mx = z[j], arg = j;
    // Subtracting the max keeps exp() finite; the sum is small (classes terms).
    float sum = 0.0f;
    for (int j = 0; j < classes; ++j) sum += std::exp(z[j] - mx);
    const float log_sum = std::log(sum);
    r.loss_sum += static_cast<double>(log_sum - (z[label] - mx));
    r.correct += arg == label;
    if (dlogits) {
      float* d = dlogits + static_cast<std::ptrdiff_t>(i) * classes;
      const float inv = 1.0f / sum;
      for (int j = 0; j < classes; ++j) d[j] = std::exp(z[j] - mx) * inv * grad_scale;
      d[label] -= grad_scale;
    }
  }
  return r;
}

}  // namespace cclite::train
