// bench/common/perf_check.hpp - expected values for the #wrong column of the perf programs.
//
// Inputs are small integers (rank + i % 3), so every reduction is exact in
// every dtype and a result either matches bit for bit or is wrong.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include <cclite/core/dtype.hpp>

namespace bench {

using namespace cclite;


// Expected element value: inputs are rank + i % 3, so the reduction is exact.
inline double input(int rank, std::size_t i) { return static_cast<double>(rank + static_cast<int>(i % 3)); }

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, cclite::half>) return to_half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, cclite::bfloat16>) return to_bfloat16(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, cclite::half> || std::is_same_v<T, cclite::bfloat16>) return to_float(v);
  else return static_cast<double>(v);
}

inline double expected(reduce_op op, int n, std::size_t i) {
  if (is_bitwise(op)) {  // integer dtypes only (perf_args refuses the others)
    long long bits = static_cast<long long>(input(0, i));
    for (int r = 1; r < n; ++r) {
      const long long x = static_cast<long long>(input(r, i));
      bits = op == reduce_op::band ? bits & x : op == reduce_op::bor ? bits | x : bits ^ x;
    }
    return static_cast<double>(bits);
  }
  double acc = input(0, i);
  for (int r = 1; r < n; ++r) {
    double x = input(r, i);
    switch (op) {
      case reduce_op::sum: case reduce_op::avg: acc += x; break;
      case reduce_op::prod: acc *= x; break;
      case reduce_op::min: acc = std::min(acc, x); break;
      case reduce_op::max: acc = std::max(acc, x); break;
      default: break;  // bitwise: above
    }
  }
  return op == reduce_op::avg ? acc / n : acc;
}

template <class T>
void fill(void* p, std::size_t count, int rank) {
  T* t = static_cast<T*>(p);
  for (std::size_t i = 0; i < count; ++i) t[i] = from_double<T>(input(rank, i));
}

template <class T>
std::size_t count_wrong(const void* p, std::size_t count, reduce_op op, int n) {
  const T* t = static_cast<const T*>(p);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double want = to_double(from_double<T>(expected(op, n, i)));
    if (to_double(t[i]) != want) ++bad;
  }
  return bad;
}

template <class F>
auto by_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::int8: return f(std::int8_t{});
    case dtype::uint8: return f(std::uint8_t{});
    case dtype::int32: return f(std::int32_t{});
    case dtype::uint32: return f(std::uint32_t{});
    case dtype::int64: return f(std::int64_t{});
    case dtype::uint64: return f(std::uint64_t{});
    case dtype::float16: return f(cclite::half{});
    case dtype::bfloat16: return f(cclite::bfloat16{});
    case dtype::float32: return f(float{});
    case dtype::float64: return f(double{});
  }
  return f(float{});
}


}  // namespace bench
