// tests/gpu/reference.hpp - inputs and host references for the GPU programs.
//
// Inputs are small integers (|v| <= 2, unsigned 0..4), so sums, products and
// averages over a few ranks are exact in every dtype and the reference does not
// depend on the order of the reduction (as in tests/allreduce_test.cpp).
#pragma once

#include <cclite/core/reduce.hpp>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// The GPU programs are plain executables (no doctest): a failed step prints
// where and why, and ends the program with exit code 1.
#define OR_DIE(expr)                                                                    \
  do {                                                                                  \
    ::cclite::status s_ = (expr);                                                       \
    if (!s_.ok()) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, s_.to_string().c_str()); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

namespace cclite::gpu_test {

using bytes = std::vector<unsigned char>;

/// n elements of t for input `seed` (a rank, or a rank and block).
inline bytes input(dtype t, std::size_t n, int seed) {
  const std::size_t es = size_of(t);
  bytes buf(n * es);
  for (std::size_t i = 0; i < n; ++i) {
    const int v = static_cast<int>((i * 7 + static_cast<std::size_t>(seed) * 3 + i / 13) % 5) - 2;
    unsigned char* p = buf.data() + i * es;
    auto put = [&](auto x) { std::memcpy(p, &x, es); };
    switch (t) {
      case dtype::int8: put(static_cast<std::int8_t>(v)); break;
      case dtype::uint8: put(static_cast<std::uint8_t>(v + 2)); break;
      case dtype::int32: put(static_cast<std::int32_t>(v)); break;
      case dtype::uint32: put(static_cast<std::uint32_t>(v + 2)); break;
      case dtype::int64: put(static_cast<std::int64_t>(v)); break;
      case dtype::uint64: put(static_cast<std::uint64_t>(v + 2)); break;
      case dtype::float16: put(to_half(static_cast<float>(v))); break;
      case dtype::bfloat16: put(to_bfloat16(static_cast<float>(v))); break;
      case dtype::float32: put(static_cast<float>(v)); break;
      case dtype::float64: put(static_cast<double>(v)); break;
    }
  }
  return buf;
}

/// op over seeds 0..nranks-1 of input(t, n, seed), avg divided by nranks.
inline bytes reduced(dtype t, reduce_op op, std::size_t n, int nranks) {
  bytes out = input(t, n, 0);
  const reduction red = reduction_for(t, op);
  for (int r = 1; r < nranks; ++r) {
    bytes in = input(t, n, r);
    red.inplace(out.data(), in.data(), n);
  }
  if (red.needs_divide) red.divide(out.data(), n, nranks);
  return out;
}

/// Elements of t that differ between a and b (bitwise).
inline std::size_t wrong_elements(const bytes& a, const bytes& b, dtype t) {
  const std::size_t es = size_of(t);
  if (a.size() != b.size()) return a.size() / es + 1;
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < a.size(); i += es) wrong += std::memcmp(&a[i], &b[i], es) != 0;
  return wrong;
}

/// For a failure line: how many elements of t differ, where the first and the
/// last one are, and the first one's bytes both ways (hex, lowest address first).
inline std::string describe_wrong(const bytes& got, const bytes& want, dtype t) {
  const std::size_t es = size_of(t);
  if (got.size() != want.size()) {
    return "got " + std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
  }
  std::size_t n = 0, first = 0, last = 0;
  for (std::size_t i = 0; i < got.size(); i += es) {
    if (std::memcmp(&got[i], &want[i], es) == 0) continue;
    if (n++ == 0) first = i / es;
    last = i / es;
  }
  if (n == 0) return "all right";
  auto hex = [&](const bytes& b) {
    std::string h;
    char two[3];
    for (std::size_t k = 0; k < es; ++k) {
      std::snprintf(two, sizeof two, "%02x", b[first * es + k]);
      h += two;
    }
    return h;
  };
  return std::to_string(n) + " of " + std::to_string(got.size() / es) + " wrong, elements " + std::to_string(first) +
         ".." + std::to_string(last) + "; first: got " + hex(got) + " want " + hex(want);
}

}  // namespace cclite::gpu_test
