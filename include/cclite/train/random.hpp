// cclite/train/random.hpp - a small, portable, seeded random generator.
//
// The standard distributions (std::uniform_real_distribution, std::shuffle's
// use of them) are implementation-defined, so two ranks built by different
// standard libraries could draw different permutations from the same seed.
// Everything in cclite::train that must agree across ranks (the sampler's
// permutation, initial weights in tests) draws from this generator instead:
// xoshiro256** seeded through splitmix64, with exactly specified conversions.
#pragma once

#include <cstdint>

namespace cclite::train {

/// xoshiro256** (Blackman and Vigna): fast, 256-bit state, passes BigCrush.
/// The same seed gives the same sequence on every platform and compiler.
class rng {
 public:
  explicit rng(std::uint64_t seed = 0) noexcept { reseed(seed); }

  void reseed(std::uint64_t seed) noexcept {
    for (auto& w : s_) w = splitmix64(seed);
  }

  /// 64 uniformly distributed bits.
  std::uint64_t next() noexcept {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform integer in [0, bound), without modulo bias: draws below
  /// 2^64 mod bound are rejected, so every residue is equally likely.
  /// Precondition: bound > 0.
  std::uint64_t below(std::uint64_t bound) noexcept {
    const std::uint64_t threshold = (0 - bound) % bound;
    std::uint64_t r = next();
    while (r < threshold) r = next();
    return r % bound;
  }

  /// Uniform float in [0, 1) with 24 random bits (every value exactly representable).
  float uniform() noexcept { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

  /// Uniform float in [lo, hi).
  float uniform(float lo, float hi) noexcept { return lo + (hi - lo) * uniform(); }

  /// Seed mixing: a well-spread 64-bit value from any input, e.g. seed + epoch.
  static std::uint64_t splitmix64(std::uint64_t& x) noexcept {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace cclite::train
