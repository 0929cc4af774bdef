// cclite/core/reduce.hpp - the reduction leaf: the only code templated on element type and op.
//
// Algorithms never see T: they ask `reduction_for(dtype, op)` once per
// collective for a table of type-erased kernels (reduce_kernels.hpp; for
// float16 and bfloat16 on x86 CPUs with AVX2 and F16C, reduce_x86.hpp's,
// chosen at run time) and call them on byte ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cclite/config.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/reduce_kernels.hpp>
#include <cclite/core/reduce_x86.hpp>

namespace cclite {

/// Type-erased kernels for one (dtype, op); counts are in elements.
struct reduction {
  void (*inplace)(void* inout, const void* in, std::size_t n) noexcept = nullptr;
  void (*copy)(void* out, const void* a, const void* b, std::size_t n) noexcept = nullptr;
  void (*copy2)(void* out1, void* out2, const void* a, const void* b, std::size_t n) noexcept =
      nullptr;
  void (*divide)(void* p, std::size_t n, int divisor) noexcept = nullptr;
  std::size_t elem_size = 0;
  bool needs_divide = false;  ///< op is avg: divide by the rank count at the end
};

namespace detail {
// Kernel sharing keeps the number of kernels every TU compiles down (there
// are 10 dtypes x 5 ops): avg runs sum's kernels and divides at the end, and
// the unsigned integers run the signed ones' sum and prod, which wrap to the
// same bits (see apply()). Only min, max and divide depend on signedness.
template <class T> struct same_bits_signed { using type = T; };
template <> struct same_bits_signed<std::uint8_t> { using type = std::int8_t; };
template <> struct same_bits_signed<std::uint32_t> { using type = std::int32_t; };
template <> struct same_bits_signed<std::uint64_t> { using type = std::int64_t; };

template <class T, reduce_op Op>
reduction make_reduction() noexcept {
  static_assert(Op != reduce_op::avg, "avg uses sum's kernels");
  using K = std::conditional_t<Op == reduce_op::min || Op == reduce_op::max, T,
                               typename same_bits_signed<T>::type>;
  reduction r;
  r.inplace = &reduce_inplace<K, Op>;
  r.copy = &reduce_copy<K, Op>;
  r.copy2 = &reduce_copy2<K, Op>;
  r.divide = &detail::divide<T>;
  r.elem_size = sizeof(T);
#if CCLITE_HAS_X86_KERNELS
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    if (x86::cpu_has_avx2_f16c()) {  // the same bits, 8 elements at a time
      r.inplace = &x86::reduce_inplace<T, Op>;
      r.copy = &x86::reduce_copy<T, Op>;
      r.copy2 = &x86::reduce_copy2<T, Op>;
      r.divide = &x86::divide<T>;
    }
  }
#endif
  return r;
}
template <class T>
reduction make_reduction(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return make_reduction<T, reduce_op::sum>();
    case reduce_op::prod: return make_reduction<T, reduce_op::prod>();
    case reduce_op::min: return make_reduction<T, reduce_op::min>();
    case reduce_op::max: return make_reduction<T, reduce_op::max>();
    case reduce_op::avg: {
      reduction r = make_reduction<T, reduce_op::sum>();
      r.needs_divide = true;
      return r;
    }
    case reduce_op::band:
    case reduce_op::bor:
    case reduce_op::bxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == reduce_op::band) return make_reduction<T, reduce_op::band>();
        if (op == reduce_op::bor) return make_reduction<T, reduce_op::bor>();
        return make_reduction<T, reduce_op::bxor>();
      }
      return {};  // floating dtypes: no bits to combine (validate() says so)
  }
  return {};
}
}  // namespace detail

/// The kernels for (t, op). Returns an empty table (inplace == nullptr) for an
/// invalid dtype or op, or a bitwise op on a floating dtype; callers turn that
/// into errc::invalid_argument.
inline reduction reduction_for(dtype t, reduce_op op) noexcept {
  if (!is_valid(op)) return {};
  switch (t) {
    case dtype::int8: return detail::make_reduction<std::int8_t>(op);
    case dtype::uint8: return detail::make_reduction<std::uint8_t>(op);
    case dtype::int32: return detail::make_reduction<std::int32_t>(op);
    case dtype::uint32: return detail::make_reduction<std::uint32_t>(op);
    case dtype::int64: return detail::make_reduction<std::int64_t>(op);
    case dtype::uint64: return detail::make_reduction<std::uint64_t>(op);
    case dtype::float16: return detail::make_reduction<half>(op);
    case dtype::bfloat16: return detail::make_reduction<bfloat16>(op);
    case dtype::float32: return detail::make_reduction<float>(op);
    case dtype::float64: return detail::make_reduction<double>(op);
  }
  return {};
}

}  // namespace cclite
