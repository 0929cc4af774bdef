// cclite/train/optim.hpp - SGD with momentum and AdamW, with checkpointable state.
//
//   train::sgd opt(net.parameters(), {/*lr=*/0.05f, /*momentum=*/0.9f});
//   ... backward, ddp.synchronize() ...
//   opt.step();          // reads parameter::grad(), updates the values
//
// Both follow PyTorch's update rules exactly (torch.optim.SGD with dampening
// 0, torch.optim.AdamW), so hyper-parameters carry over. step() does not zero
// the gradients (data_parallel::zero_grad or train::zero_grads does). Every
// rank applies the same update to the same averaged gradient, so replicas
// stay bitwise identical without any communication here.
//
// save_state / load_state put the per-parameter buffers and counters into a
// checkpoint under "<prefix>..." section names; load_state refuses a state
// saved for different parameter shapes or a different optimiser.
//
// For a sharded step (train::sharded_optimizer) a step can also be taken in
// parts: update(k, begin, end, g) updates elements [begin, end) of parameter
// k from the gradient g, then end_step() once; step() is exactly that over
// every parameter, so both give the same bits. The state buffers (state(k,
// j), state_per_param of them per parameter) can be bound to memory the
// caller owns, as parameter values can.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include <cclite/config.hpp>
#include <cclite/core/status.hpp>
#include <cclite/train/checkpoint.hpp>
#include <cclite/train/parameter.hpp>

namespace cclite::train {

namespace detail {

// An optimiser's per-parameter state (momentum, Adam's moments): `slots`
// buffers of each parameter's size, owned here or bound to the caller's
// storage (sharded_optimizer), zero-initialised.
class state_buffers {
 public:
  state_buffers(const parameter_list& params, int slots) : slots_(static_cast<std::size_t>(slots)) {
    for (const parameter* p : params)
      for (std::size_t j = 0; j < slots_; ++j) {
        own_.emplace_back(p->size(), 0.0f);
        sizes_.push_back(p->size());
      }
    for (auto& v : own_) ptr_.push_back(v.data());
  }
  // A copy owns copies of the owned buffers and shares the bound ones.
  state_buffers(const state_buffers& o) : slots_(o.slots_), own_(o.own_), sizes_(o.sizes_), ptr_(o.ptr_) {
    for (std::size_t i = 0; i < ptr_.size(); ++i)
      if (o.owned(i)) ptr_[i] = own_[i].data();
  }
  state_buffers& operator=(const state_buffers& o) {
    if (this != &o) *this = state_buffers(o);
    return *this;
  }
  state_buffers(state_buffers&&) noexcept = default;  // vectors keep their buffers
  state_buffers& operator=(state_buffers&&) noexcept = default;

  float* get(std::size_t k, int j) noexcept { return ptr_[k * slots_ + static_cast<std::size_t>(j)]; }
  const float* get(std::size_t k, int j) const noexcept { return ptr_[k * slots_ + static_cast<std::size_t>(j)]; }

  void bind(std::size_t k, int j, float* storage, bool copy) noexcept {
    const std::size_t i = k * slots_ + static_cast<std::size_t>(j);
    if (copy) std::copy(ptr_[i], ptr_[i] + sizes_[i], storage);
    ptr_[i] = storage;
    own_[i].clear();
    own_[i].shrink_to_fit();
  }
  void use_own() {
    for (std::size_t i = 0; i < ptr_.size(); ++i) {
      if (owned(i)) continue;
      own_[i].assign(ptr_[i], ptr_[i] + sizes_[i]);
      ptr_[i] = own_[i].data();
    }
  }

 private:
  bool owned(std::size_t i) const noexcept { return ptr_[i] == own_[i].data() && own_[i].size() == sizes_[i]; }

  std::size_t slots_;
  std::vector<std::vector<float>> own_;
  std::vector<std::size_t> sizes_;
  std::vector<float*> ptr_;  // own_[i].data() or bound storage
};

}  // namespace detail

/// torch.optim.SGD: g += wd * p; buf = momentum * buf + g (buf = g on the first
/// step); p -= lr * (nesterov ? g + momentum * buf : buf).
class sgd {
 public:
  struct options {
    float lr = 0.01f;
    float momentum = 0.0f;
    float weight_decay = 0.0f;
    bool nesterov = false;
  };

  sgd(parameter_list params, options o) : params_(std::move(params)), o_(o), state_(params_, state_per_param) {}

  float lr() const noexcept { return o_.lr; }
  void set_lr(float lr) noexcept { o_.lr = lr; }
  std::uint64_t steps() const noexcept { return steps_; }
  const parameter_list& parameters() const noexcept { return params_; }

  /// One step over every parameter, from parameter::grad().
  void step() {
    for (std::size_t k = 0; k < params_.size(); ++k) update(k, 0, params_[k]->size(), params_[k]->grad());
    end_step();
  }

  /// Part of a step: elements [begin, end) of parameter k, from their
  /// gradient g[0, end - begin). end_step() after the last part.
  void update(std::size_t k, std::size_t begin, std::size_t end, const float* g) noexcept {
    // Options in locals and one branch-free loop per case, with restrict
    // pointers: otherwise the compiler must assume the stores through w may
    // change o_ and reloads it per element, and the loop stays scalar.
    const float lr = o_.lr, wd = o_.weight_decay, mu = o_.momentum;
    const bool first = steps_ == 0, nesterov = o_.nesterov;
    float* CCLITE_RESTRICT w = params_[k]->value() + begin;
    float* CCLITE_RESTRICT b = state_.get(k, 0) + begin;
    const std::size_t n = end - begin;
    if (mu == 0.0f) {
      for (std::size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    } else if (first) {
      for (std::size_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        b[i] = d;
        w[i] -= lr * (nesterov ? d + mu * d : d);
      }
    } else if (!nesterov) {
      for (std::size_t i = 0; i < n; ++i) {
        const float v = mu * b[i] + (g[i] + wd * w[i]);
        b[i] = v;
        w[i] -= lr * v;
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        const float v = mu * b[i] + d;
        b[i] = v;
        w[i] -= lr * (d + mu * v);
      }
    }
  }
  void end_step() noexcept { ++steps_; }

  /// State per parameter: the momentum buffer (j = 0).
  static constexpr int state_per_param = 1;
  float* state(std::size_t k, int j) noexcept { return state_.get(k, j); }
  /// Moves state buffer (k, j) to `storage` (the parameter's size in floats,
  /// alive while bound), copying the current values unless `copy` is false.
  void bind_state(std::size_t k, int j, float* storage, bool copy = true) noexcept { state_.bind(k, j, storage, copy); }
  /// Back to state owned by the optimiser (copying the current values).
  void use_own_state() { state_.use_own(); }

  void save_state(checkpoint& ck, const std::string& prefix = "optim.") const {
    ck.put_u64(prefix + "kind.sgd", steps_);
    for (std::size_t k = 0; k < params_.size(); ++k)
      ck.put_floats(prefix + params_[k]->name() + ".momentum", state_.get(k, 0), params_[k]->size());
  }
  status load_state(const checkpoint& ck, const std::string& prefix = "optim.") {
    auto s = ck.get_u64(prefix + "kind.sgd");
    if (!s) return make_error(errc::invalid_argument, "checkpoint holds no SGD state (saved by another optimiser?)");
    for (std::size_t k = 0; k < params_.size(); ++k)
      CCLITE_TRY(ck.get_floats(prefix + params_[k]->name() + ".momentum", state_.get(k, 0), params_[k]->size()));
    steps_ = s.value();
    return {};
  }

 private:
  parameter_list params_;
  options o_;
  detail::state_buffers state_;
  std::uint64_t steps_ = 0;
};

namespace detail {

// One AdamW update over n elements. std::sqrt may set errno, which keeps
// compilers from vectorising the loop (5x slower here, and the optimiser step
// runs on every rank, undivided by data parallelism), so the bulk runs on
// SSE2 / NEON vectors. IEEE sqrt and division are correctly rounded in both
// forms and the operations are the same, in the same order, so the vector
// and scalar paths give identical bits.
inline void adamw_update(float* w, const float* g, float* m, float* v, std::size_t n, float decay, float b1, float b2,
                         float eps, float step_size, float bc2_sqrt) noexcept {
  std::size_t i = 0;
#if defined(__SSE2__)
  const __m128 vdecay = _mm_set1_ps(decay), vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2), v1b1 = _mm_set1_ps(1.0f - b1),
               v1b2 = _mm_set1_ps(1.0f - b2), veps = _mm_set1_ps(eps), vstep = _mm_set1_ps(step_size),
               vbc2 = _mm_set1_ps(bc2_sqrt);
  for (; i + 4 <= n; i += 4) {
    const __m128 gi = _mm_loadu_ps(g + i);
    const __m128 wi = _mm_mul_ps(_mm_loadu_ps(w + i), vdecay);
    const __m128 mi = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(m + i)), _mm_mul_ps(v1b1, gi));
    const __m128 vi = _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(v1b2, gi), gi));
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), vbc2), veps);
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    _mm_storeu_ps(w + i, _mm_sub_ps(wi, _mm_div_ps(_mm_mul_ps(vstep, mi), denom)));
  }
#elif defined(__aarch64__) && defined(__ARM_NEON)
  const float32x4_t vdecay = vdupq_n_f32(decay), vb1 = vdupq_n_f32(b1), vb2 = vdupq_n_f32(b2),
                    v1b1 = vdupq_n_f32(1.0f - b1), v1b2 = vdupq_n_f32(1.0f - b2), veps = vdupq_n_f32(eps),
                    vstep = vdupq_n_f32(step_size), vbc2 = vdupq_n_f32(bc2_sqrt);
  for (; i + 4 <= n; i += 4) {
    // vmulq/vaddq, not vfmaq: separate roundings, as in the scalar loop.
    const float32x4_t gi = vld1q_f32(g + i);
    const float32x4_t wi = vmulq_f32(vld1q_f32(w + i), vdecay);
    const float32x4_t mi = vaddq_f32(vmulq_f32(vb1, vld1q_f32(m + i)), vmulq_f32(v1b1, gi));
    const float32x4_t vi = vaddq_f32(vmulq_f32(vb2, vld1q_f32(v + i)), vmulq_f32(vmulq_f32(v1b2, gi), gi));
    const float32x4_t denom = vaddq_f32(vdivq_f32(vsqrtq_f32(vi), vbc2), veps);
    vst1q_f32(m + i, mi);
    vst1q_f32(v + i, vi);
    vst1q_f32(w + i, vsubq_f32(wi, vdivq_f32(vmulq_f32(vstep, mi), denom)));
  }
#endif
  for (; i < n; ++i) {
    const float wi = w[i] * decay;
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    w[i] = wi - step_size * m[i] / denom;
  }
}

}  // namespace detail

/// torch.optim.AdamW: p *= 1 - lr * wd; m = b1 m + (1 - b1) g;
/// v = b2 v + (1 - b2) g^2; p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
class adamw {
 public:
  struct options {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 1e-2f;
  };

  adamw(parameter_list params, options o) : params_(std::move(params)), o_(o), state_(params_, state_per_param) {}

  float lr() const noexcept { return o_.lr; }
  void set_lr(float lr) noexcept { o_.lr = lr; }
  std::uint64_t steps() const noexcept { return steps_; }
  const parameter_list& parameters() const noexcept { return params_; }

  /// One step over every parameter, from parameter::grad().
  void step() {
    for (std::size_t k = 0; k < params_.size(); ++k) update(k, 0, params_[k]->size(), params_[k]->grad());
    end_step();
  }

  /// Part of a step: elements [begin, end) of parameter k, from their
  /// gradient g[0, end - begin). end_step() after the last part.
  void update(std::size_t k, std::size_t begin, std::size_t end, const float* g) noexcept {
    const std::uint64_t t = steps_ + 1;
    if (coef_.t != t || coef_.lr != o_.lr) {
      // Bias corrections in double, as PyTorch computes them in Python floats.
      const double bc1 = 1.0 - std::pow(static_cast<double>(o_.beta1), static_cast<double>(t));
      const double bc2 = 1.0 - std::pow(static_cast<double>(o_.beta2), static_cast<double>(t));
      coef_ = {t, o_.lr, static_cast<float>(o_.lr / bc1), static_cast<float>(std::sqrt(bc2))};
    }
    const float decay = 1.0f - o_.lr * o_.weight_decay;
    detail::adamw_update(params_[k]->value() + begin, g, state_.get(k, 0) + begin, state_.get(k, 1) + begin,
                         end - begin, decay, o_.beta1, o_.beta2, o_.eps, coef_.step_size, coef_.bc2_sqrt);
  }
  void end_step() noexcept { ++steps_; }

  /// State per parameter: exp_avg (j = 0) and exp_avg_sq (j = 1).
  static constexpr int state_per_param = 2;
  float* state(std::size_t k, int j) noexcept { return state_.get(k, j); }
  /// As sgd::bind_state.
  void bind_state(std::size_t k, int j, float* storage, bool copy = true) noexcept { state_.bind(k, j, storage, copy); }
  void use_own_state() { state_.use_own(); }

  void save_state(checkpoint& ck, const std::string& prefix = "optim.") const {
    ck.put_u64(prefix + "kind.adamw", steps_);
    for (std::size_t k = 0; k < params_.size(); ++k) {
      ck.put_floats(prefix + params_[k]->name() + ".exp_avg", state_.get(k, 0), params_[k]->size());
      ck.put_floats(prefix + params_[k]->name() + ".exp_avg_sq", state_.get(k, 1), params_[k]->size());
    }
  }
  status load_state(const checkpoint& ck, const std::string& prefix = "optim.") {
    auto s = ck.get_u64(prefix + "kind.adamw");
    if (!s) return make_error(errc::invalid_argument, "checkpoint holds no AdamW state (saved by another optimiser?)");
    for (std::size_t k = 0; k < params_.size(); ++k) {
      CCLITE_TRY(ck.get_floats(prefix + params_[k]->name() + ".exp_avg", state_.get(k, 0), params_[k]->size()));
      CCLITE_TRY(ck.get_floats(prefix + params_[k]->name() + ".exp_avg_sq", state_.get(k, 1), params_[k]->size()));
    }
    steps_ = s.value();
    return {};
  }

 private:
  struct coefficients {
    std::uint64_t t = 0;  // the step they are for (0: none yet)
    float lr = 0, step_size = 0, bc2_sqrt = 0;
  };
  parameter_list params_;
  options o_;
  detail::state_buffers state_;
  std::uint64_t steps_ = 0;
  coefficients coef_;
};

/// Parameter values into / out of a checkpoint, as "<prefix><name>" sections.
inline void save_parameters(checkpoint& ck, const parameter_list& params, const std::string& prefix = "param.") {
  for (const parameter* p : params) ck.put_floats(prefix + p->name(), p->value(), p->size());
}
/// Checks every section before copying any, so a checkpoint of another model
/// leaves the parameters untouched.
inline status load_parameters(const checkpoint& ck, const parameter_list& params, const std::string& prefix = "param.") {
  for (const parameter* p : params) {
    if (ck.section_bytes(prefix + p->name()) != p->bytes()) {
      return make_error(errc::invalid_argument,
                        "checkpoint does not match the model: parameter '%s' (%zu values) is %s",
                        p->name().c_str(), p->size(), ck.has(prefix + p->name()) ? "a different size there" : "missing");
    }
  }
  for (parameter* p : params) CCLITE_TRY(ck.get_floats(prefix + p->name(), p->value(), p->size()));
  return {};
}

}  // namespace cclite::train
