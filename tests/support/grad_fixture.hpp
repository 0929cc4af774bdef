// tests/support/grad_fixture.hpp - what the data_parallel tests that fill the
// gradients by hand share (grad_compression_test, uneven_inputs_test): a
// four-parameter model, values every rank can regenerate, and a bitwise
// comparison across ranks.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>

namespace cclite::test {

struct param_shape {
  const char* name;
  std::size_t size;
};

/// Registration order (forward's); backward produces them in reverse. No
/// module names ("fc1.weight"), so that the bucket caps alone decide: with a
/// first cap of 1 KiB and a cap of 8 KiB the buckets are [b2], [w2 b1] (both
/// issued asynchronously) and [w1] (the last, reduced inline).
inline constexpr param_shape toy_model[] = {{"w1", 6000}, {"b1", 60}, {"w2", 1200}, {"b2", 20}};

/// 64 well-mixed bits for element i of rank r's gradient at step s.
inline std::uint64_t grad_bits(int step, int rank, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(step) << 48) ^ (static_cast<std::uint64_t>(rank) << 32) ^ i;
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/// FNV-1a over the bytes of n floats, continuing from h.
inline std::uint64_t fnv_floats(const float* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/// Whether every rank of `c` passed the same h (min and max allreduces);
/// false also when either fails.
template <class Comm>
bool same_on_all_ranks(Comm& c, std::uint64_t h) {
  std::uint64_t lo = h, hi = h;
  return c.allreduce(&lo, 1, reduce_op::min).ok() && c.allreduce(&hi, 1, reduce_op::max).ok() && lo == hi;
}

}  // namespace cclite::test
