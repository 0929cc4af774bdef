// cclite/train/sampler.hpp - each rank's share of a shuffled epoch (PyTorch's DistributedSampler).
//
//   train::distributed_sampler s(60000, comm.rank(), comm.size(), /*seed=*/42);
//   for (epoch...) { s.set_epoch(epoch); for (auto i : s.indices()) ... }
//
// Every rank draws the same permutation of [0, dataset_size) from
// (seed, epoch), so the shards are disjoint and together cover the epoch.
// Like torch.utils.data.DistributedSampler:
//   - without drop_last the permutation is padded by repeating its start until
//     its length is a multiple of world_size (a few samples seen twice);
//   - with drop_last its tail is cut to a multiple of world_size;
//   - rank r takes positions r, r + world_size, r + 2 world_size, ...
// The strided split means global step s of a job with local batch b takes
// exactly the permutation positions [s*b*N, (s+1)*b*N) across the N ranks: the
// same samples a single process with batch b*N sees at step s.
//
// The state (seed, epoch, position reached in the epoch) goes into a
// checkpoint so that a resumed job continues with the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <cclite/core/status.hpp>
#include <cclite/train/checkpoint.hpp>
#include <cclite/train/random.hpp>

namespace cclite::train {

class distributed_sampler {
 public:
  /// Preconditions: 0 <= rank < world_size; dataset_size >= world_size when drop_last.
  distributed_sampler(std::size_t dataset_size, int rank, int world_size, std::uint64_t seed,
                      bool shuffle = true, bool drop_last = false)
      : n_(dataset_size), rank_(rank), world_(world_size < 1 ? 1 : world_size), seed_(seed),
        shuffle_(shuffle), drop_last_(drop_last) {
    const std::size_t w = static_cast<std::size_t>(world_);
    per_rank_ = drop_last_ ? n_ / w : (n_ + w - 1) / w;
    set_epoch(0);
  }

  /// Selects the epoch's permutation and restarts at its beginning.
  void set_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    position_ = 0;
    build();
  }
  std::uint64_t epoch() const noexcept { return epoch_; }

  /// This rank's indices for the current epoch, in order (num_samples() of them).
  const std::vector<std::size_t>& indices() const noexcept { return mine_; }
  std::size_t num_samples() const noexcept { return per_rank_; }
  /// Samples per epoch over all ranks (num_samples() * world_size).
  std::size_t total_size() const noexcept { return per_rank_ * static_cast<std::size_t>(world_); }

  /// How far this epoch has been consumed (in this rank's samples); saved in
  /// checkpoints so a resumed job can skip what was already seen.
  std::size_t position() const noexcept { return position_; }
  void set_position(std::size_t p) noexcept { position_ = p < per_rank_ ? p : per_rank_; }

  /// The whole padded or truncated permutation (identical on every rank).
  std::vector<std::size_t> global_order() const {
    std::vector<std::size_t> perm(n_);
    for (std::size_t i = 0; i < n_; ++i) perm[i] = i;
    if (shuffle_) {
      // Fisher-Yates driven by our portable generator: the same on every rank.
      std::uint64_t s = seed_ + epoch_;
      rng g(rng::splitmix64(s));
      for (std::size_t i = n_; i > 1; --i) std::swap(perm[i - 1], perm[static_cast<std::size_t>(g.below(i))]);
    }
    const std::size_t total = total_size();
    if (total <= n_) {
      perm.resize(total);
    } else {
      for (std::size_t i = 0; perm.size() < total; ++i) perm.push_back(perm[i % n_]);
    }
    return perm;
  }

  void save_state(checkpoint& ck, const std::string& prefix = "sampler.") const {
    ck.put_u64(prefix + "seed", seed_);
    ck.put_u64(prefix + "epoch", epoch_);
    ck.put_u64(prefix + "position", position_);
    ck.put_u64(prefix + "world_size", static_cast<std::uint64_t>(world_));
    ck.put_u64(prefix + "dataset_size", n_);
  }

  /// Restores seed, epoch and position. The world size may differ (a job
  /// resumed on another number of ranks); the position is then converted
  /// through the global sample count, rounded down.
  status load_state(const checkpoint& ck, const std::string& prefix = "sampler.") {
    auto seed = ck.get_u64(prefix + "seed");
    auto epoch = ck.get_u64(prefix + "epoch");
    auto pos = ck.get_u64(prefix + "position");
    auto world = ck.get_u64(prefix + "world_size");
    auto n = ck.get_u64(prefix + "dataset_size");
    if (!seed || !epoch || !pos || !world || !n) return make_error(errc::invalid_argument, "checkpoint holds no sampler state");
    if (n.value() != n_) {
      return make_error(errc::invalid_argument, "checkpoint's sampler was for %llu samples, this dataset has %zu",
                        static_cast<unsigned long long>(n.value()), n_);
    }
    seed_ = seed.value();
    set_epoch(epoch.value());
    set_position(static_cast<std::size_t>(pos.value() * world.value() / static_cast<std::uint64_t>(world_)));
    return {};
  }

 private:
  void build() {
    std::vector<std::size_t> all = global_order();
    mine_.clear();
    mine_.reserve(per_rank_);
    for (std::size_t i = static_cast<std::size_t>(rank_); i < all.size(); i += static_cast<std::size_t>(world_))
      mine_.push_back(all[i]);
  }

  std::size_t n_;
  int rank_, world_;
  std::uint64_t seed_;
  bool shuffle_, drop_last_;
  std::size_t per_rank_ = 0;
  std::uint64_t epoch_ = 0;
  std::size_t position_ = 0;
  std::vector<std::size_t> mine_;
};

}  // namespace cclite::train
