// cclite/train/sharded_optimizer.hpp - the optimiser step sharded over the
// ranks of a node and fused with the gradient reduction (ZeRO-1 on shared
// memory; Apex's DistributedFusedAdam idea).
//
//   auto ddp = train::data_parallel<Comm>::create(comm, net.parameters()).value();
//   train::sgd opt(net.parameters(), {0.05f, 0.9f});
//   train::sharded_optimizer<Comm, train::sgd> zo(ddp, opt);
//   for (...) {
//     net.forward(x, b);  /* loss -> net.output_grad() */
//     net.backward(b, [&](train::parameter& p) { ddp.grad_ready(p); });
//     if (auto st = zo.step(); !st.ok()) { ... }   // instead of ddp.synchronize(); opt.step();
//   }
//
// step() has the effect of ddp.synchronize() followed by opt.step(), and gives
// the same bits. When the gradients live in a shared window (data_parallel's
// shared_gradients: every rank on one node over shm) it does neither. Each
// rank owns a 1/N slice of the flat gradient layout (bucket order, cut at
// 64-byte lines so that no two ranks write one cache line); after a barrier
// (every rank's backward is done) it averages its slice across every rank's
// gradient window, in pieces that stay in cache, and hands each piece to
// opt.update() for the parameters it covers, which updates the values in
// this rank's values window and the optimiser state there; after a second
// barrier each rank copies the other slices from their owners' values
// windows into its own. The optimiser state exists once per node (in rank
// 0's state window, each rank updating its slice of it): ZeRO-1's memory
// saving, N - 1 copies fewer. Per rank the optimiser computes S/N instead of
// S, and no reduced gradient is written back.
//
// Speed, measured (docs/trainer.md, Performance): on the 2-vCPU development
// machine this is *slower* than synchronize() + step() for the Fashion-MNIST
// MLP (SGD 0.57-0.65 s per epoch against 0.50; AdamW the same, 0.59-0.62):
// every line of a rank's slice was read by the other rank since its last
// write (the copy), and turning a shared line back into a modified one costs
// ~7.5 ns a line there (55 us per step for 460 KiB), more than the half of
// the SGD step saved. It is for the memory, for heavier optimisers and for
// nodes with more ranks, where the step's share shrinks to 1/N.
//
// Otherwise (ranks on several nodes, no shm, one rank, device memory) step()
// is literally ddp.synchronize(); opt.step(), with the buckets overlapping
// backward as usual. In the fused mode grad_ready() does nothing (the
// reduction waits for the step: no overlap with backward, which on a machine
// with one core per rank costs less than it saves; docs/trainer.md).
//
// Set-up is lazy: the first step() allocates the two windows (collective:
// every rank calls step() in the same order, as any collective), moves each
// rank's parameter values into its values window and rank 0's optimiser state
// into rank 0's state window (every rank holds the same ones after create()'s
// broadcast, or after loading one checkpoint), and rebinds the parameters and
// the optimiser state there. Until then, and after the destructor (which
// copies everything back into each rank's own storage), parameters and state
// are ordinary per-rank memory. So load checkpoints before the first step
// (or on every rank: they write the same bytes); rank 0's save_parameters /
// save_state see the whole node's state, any rank's the values.
//
// Requirements: Opt has parameters(), update(k, begin, end, g), end_step(),
// state_per_param, state(k, j), bind_state(k, j, p, copy), use_own_state()
// (train::sgd, train::adamw); every parameter of opt is one of ddp's. ddp,
// opt and the parameters must outlive this object. Not copyable or movable.
//
// Errors: step() returns errc::invalid_argument when ddp's sync is off
// (accumulating micro-batches: step only after the last one), or the first
// failed collective (barrier, allocation), prefixed "sharded_optimizer"; the
// object then stays broken, as data_parallel does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <cclite/core/dtype.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>
#include <cclite/train/data_parallel.hpp>
#include <cclite/train/parameter.hpp>

namespace cclite::train {

namespace detail {
template <class C, class = void>
struct has_shared_peer : std::false_type {};
template <class C>
struct has_shared_peer<C, std::void_t<decltype(std::declval<C&>().shared_peer(static_cast<const void*>(nullptr), 0)),
                                      decltype(std::declval<C&>().barrier())>> : std::true_type {};
}  // namespace detail

template <class Comm, class Opt>
class sharded_optimizer {
 public:
  /// Local: nothing is communicated before the first step().
  sharded_optimizer(data_parallel<Comm>& ddp, Opt& opt) : ddp_(&ddp), opt_(&opt) {
    if constexpr (detail::has_shared_peer<Comm>::value && !data_parallel<Comm>::on_device) {
      fused_ = ddp.shared_gradients() && ddp.size() > 1 && ddp.flat_size() > 0;
      if (fused_) ddp.defer_reduction(true);
    }
  }
  sharded_optimizer(const sharded_optimizer&) = delete;
  sharded_optimizer& operator=(const sharded_optimizer&) = delete;

  /// Gives every rank its own copy of the values and state back (copies of
  /// the node's shared ones) and the gradient reduction back to data_parallel.
  ~sharded_optimizer() {
    if (!fused_) return;
    ddp_->defer_reduction(false);
    if (bound_) {
      for (parameter* p : ddp_->parameters()) p->use_own_value();
      opt_->use_own_state();
    }
    if constexpr (detail::has_shared_peer<Comm>::value) {  // also after a set-up that failed half-way
      if (values_win_) (void)ddp_->communicator().free_shared(values_win_);
      if (state_win_) (void)ddp_->communicator().free_shared(state_win_);
    }
  }

  /// Whether step() runs the fused, sharded step (else synchronize + step).
  bool fused() const noexcept { return fused_; }
  /// This rank's slice of the flat layout, [first, first + count) (fused only).
  std::size_t slice_first() const noexcept { return first_; }
  std::size_t slice_count() const noexcept { return last_ - first_; }

  /// The gradients averaged over every rank and the optimiser step taken:
  /// see the file comment.
  status step() {
    if (!broken_.ok()) return broken_;
    if (!ddp_->sync_enabled()) {
      return make_error(errc::invalid_argument,
                        "sharded_optimizer::step() while data_parallel's sync is off: the gradients are not averaged "
                        "yet (turn sync on for the last micro-batch and step after it)");
    }
    if (!fused_) {
      CCLITE_TRY(ddp_->synchronize());
      opt_->step();
      return {};
    }
    status st = bound_ ? status{} : bind();
    if (st.ok()) st = fused_step();
    if (!st.ok()) broken_ = status(st.code(), "sharded_optimizer: " + st.message());
    return broken_;
  }

 private:
  // One run of elements of this rank's slice that belongs to one parameter.
  struct run {
    std::size_t k;      // the optimiser's index of the parameter
    std::size_t flat;   // first element in the flat layout
    std::size_t begin;  // ... and in the parameter
    std::size_t count;
  };

  status bind() {
    if constexpr (detail::has_shared_peer<Comm>::value) {
      Comm& c = ddp_->communicator();
      const auto& params = ddp_->parameters();
      const auto& plan = ddp_->buckets();
      const std::size_t n = ddp_->flat_size();
      const int S = Opt::state_per_param, N = c.size(), me = c.rank();
      // Every optimiser parameter must be one of ddp's (its place in the layout).
      const parameter_list& mine = opt_->parameters();
      std::vector<std::size_t> where(mine.size());
      for (std::size_t k = 0; k < mine.size(); ++k) {
        auto it = std::find(params.begin(), params.end(), mine[k]);
        if (it == params.end())
          return make_error(errc::invalid_argument, "parameter '%s' of the optimiser is not one of data_parallel's",
                            mine[k]->name().c_str());
        where[k] = plan.param_offset[static_cast<std::size_t>(it - params.begin())];
      }
      auto v = c.alloc_shared(n * sizeof(float));
      if (!v) return v.error();
      values_win_ = static_cast<float*>(v.value());
      // State slot j at j x stride: slices cut at 16 floats stay on their own lines.
      const std::size_t stride = (n + 15) & ~std::size_t{15};
      auto s = c.alloc_shared(stride * sizeof(float) * static_cast<std::size_t>(S));
      if (!s) return s.error();
      state_win_ = static_cast<float*>(s.value());
      if (me == 0) {
        for (std::size_t k = 0; k < mine.size(); ++k)
          for (int j = 0; j < S; ++j)
            std::copy(opt_->state(k, j), opt_->state(k, j) + mine[k]->size(),
                      state_win_ + static_cast<std::size_t>(j) * stride + where[k]);
      }
      CCLITE_TRY(c.barrier());  // rank 0's state is in place
      auto s0 = c.shared_peer(state_win_, 0);
      if (!s0) return s0.error();
      auto* state = static_cast<float*>(s0.value());
      for (std::size_t i = 0; i < params.size(); ++i)
        params[i]->bind_value(values_win_ + plan.param_offset[i]);  // copies this rank's values
      for (std::size_t k = 0; k < mine.size(); ++k)
        for (int j = 0; j < S; ++j)
          opt_->bind_state(k, j, state + static_cast<std::size_t>(j) * stride + where[k], /*copy=*/false);
      bound_ = true;
      // Every rank's gradient and values windows, and the slices (cut at 16 floats).
      grads_.clear();
      values_.clear();
      cuts_.clear();
      for (int r = 0; r < N; ++r) {
        auto g = c.shared_peer(ddp_->flat_grad(), r);
        if (!g) return g.error();
        grads_.push_back(static_cast<const float*>(g.value()));
        auto w = c.shared_peer(values_win_, r);
        if (!w) return w.error();
        values_.push_back(static_cast<const float*>(w.value()));
        cuts_.push_back(std::min(n, (n * static_cast<std::size_t>(r) / static_cast<std::size_t>(N)) & ~std::size_t{15}));
      }
      cuts_.push_back(n);
      first_ = cuts_[static_cast<std::size_t>(me)], last_ = cuts_[static_cast<std::size_t>(me) + 1];
      runs_.clear();
      for (std::size_t k = 0; k < mine.size(); ++k) {
        const std::size_t lo = std::max(first_, where[k]), hi = std::min(last_, where[k] + mine[k]->size());
        if (lo < hi) runs_.push_back({k, lo, lo - where[k], hi - lo});
      }
      std::sort(runs_.begin(), runs_.end(), [](const run& a, const run& b) { return a.flat < b.flat; });
      scratch_.resize(piece);
      red_ = reduction_for(dtype::float32, reduce_op::avg);
      return {};
    } else {
      return make_error(errc::unsupported, "no shared windows in this communicator");
    }
  }

  status fused_step() {
    if constexpr (detail::has_shared_peer<Comm>::value) {
      Comm& c = ddp_->communicator();
      CCLITE_TRY(c.barrier());  // every rank's gradients are final; nobody reads the values now
      const std::size_t N = grads_.size();
      float* out = scratch_.data();
      for (const run& r : runs_) {
        for (std::size_t done = 0; done < r.count; done += piece) {
          const std::size_t at = r.flat + done, len = std::min(piece, r.count - done);
          // The order of data_parallel's window allreduce: ((g0 + g1) + g2) ...
          red_.copy(out, grads_[0] + at, grads_[1] + at, len);
          for (std::size_t m = 2; m < N; ++m) red_.inplace(out, grads_[m] + at, len);
          if (red_.needs_divide) red_.divide(out, len, static_cast<int>(N));
          opt_->update(r.k, r.begin + done, r.begin + done + len, out);
        }
      }
      opt_->end_step();
      CCLITE_TRY(c.barrier());  // every slice is updated
      // The others' slices into this rank's copy: sequential reads, where the
      // next forward reading them from the other ranks' caches would not be.
      // A rank writes its slice again only after the next step's first
      // barrier, which this rank reaches after copying.
      for (std::size_t r = 0; r + 1 < cuts_.size(); ++r) {
        if (values_[r] == values_win_) continue;
        std::copy(values_[r] + cuts_[r], values_[r] + cuts_[r + 1], values_win_ + cuts_[r]);
      }
      return {};
    } else {
      return make_error(errc::unsupported, "no shared windows in this communicator");
    }
  }

  // Floats per piece: the N gradient pieces and the result stay in cache
  // between the reduction and the update.
  static constexpr std::size_t piece = 4096;

  data_parallel<Comm>* ddp_;
  Opt* opt_;
  bool fused_ = false, bound_ = false;
  status broken_;
  float* values_win_ = nullptr;  // this rank's windows: its copy of the values, and
  float* state_win_ = nullptr;   // the optimiser state (only rank 0's is used: one copy for the node)
  std::vector<const float*> grads_, values_;  // every rank's gradient and values windows
  std::vector<std::size_t> cuts_;             // rank r's slice: [cuts_[r], cuts_[r + 1])
  std::size_t first_ = 0, last_ = 0;
  std::vector<run> runs_;
  std::vector<float> scratch_;
  reduction red_{};
};

}  // namespace cclite::train
