// cclite/core/reduce.hpp - the reduction leaf: the only code templated on element type and op.
//
// Algorithms never see T: they ask `reduction_for(dtype, op)` once per
// collective for a table of three type-erased kernels and call them on byte
// ranges. Each kernel is a plain loop over restrict pointers that GCC and
// Clang vectorise at -O3 (checked with -fopt-info-vec; bench/reduce_perf measures
// it). float16/bfloat16 are widened to float per element and rounded back.
// Signed integer arithmetic wraps (computed in the unsigned type), so an
// overflowing sum is well defined and identical on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cclite/config.hpp>
#include <cclite/core/dtype.hpp>

namespace cclite {

CCLITE_FP_KERNELS_BEGIN

namespace detail {

/// How an element is loaded into the type arithmetic happens in, and stored back.
template <class T>
struct compute {
  using type = T;
  static T load(T v) noexcept { return v; }
  static T store(T v) noexcept { return v; }
};
template <>
struct compute<half> {
  using type = float;
  static float load(half v) noexcept { return to_float(v); }
  static half store(float v) noexcept { return to_half(v); }
};
template <>
struct compute<bfloat16> {
  using type = float;
  static float load(bfloat16 v) noexcept { return to_float(v); }
  static bfloat16 store(float v) noexcept { return to_bfloat16(v); }
};

template <class C, reduce_op Op>
inline C apply(C a, C b) noexcept {
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg || Op == reduce_op::prod) {
    if constexpr (std::is_integral_v<C>) {
      // Wrap instead of overflowing into UB; unsigned promotion of small types is safe.
      using U = std::make_unsigned_t<C>;
      U r = Op == reduce_op::prod ? static_cast<U>(static_cast<U>(a) * static_cast<U>(b))
                                  : static_cast<U>(static_cast<U>(a) + static_cast<U>(b));
      return static_cast<C>(r);
    } else {
      return Op == reduce_op::prod ? a * b : a + b;
    }
  } else if constexpr (Op == reduce_op::min) {
    return b < a ? b : a;
  } else {
    return a < b ? b : a;
  }
}

/// inout[i] = inout[i] op in[i]
template <class T, reduce_op Op>
void reduce_inplace(void* inout_v, const void* in_v, std::size_t n) noexcept {
  T* CCLITE_RESTRICT inout = static_cast<T*>(inout_v);
  const T* CCLITE_RESTRICT in = static_cast<const T*>(in_v);
  using K = compute<T>;
  for (std::size_t i = 0; i < n; ++i) inout[i] = K::store(apply<typename K::type, Op>(K::load(inout[i]), K::load(in[i])));
}

/// out[i] = a[i] op b[i]; out overlaps neither input.
template <class T, reduce_op Op>
void reduce_copy(void* out_v, const void* a_v, const void* b_v, std::size_t n) noexcept {
  T* CCLITE_RESTRICT out = static_cast<T*>(out_v);
  const T* CCLITE_RESTRICT a = static_cast<const T*>(a_v);
  const T* CCLITE_RESTRICT b = static_cast<const T*>(b_v);
  using K = compute<T>;
  for (std::size_t i = 0; i < n; ++i) out[i] = K::store(apply<typename K::type, Op>(K::load(a[i]), K::load(b[i])));
}

/// out1[i] = out2[i] = a[i] op b[i] (the last reduce step of a ring: keep the
/// result and forward it in one pass over memory).
template <class T, reduce_op Op>
void reduce_copy2(void* out1_v, void* out2_v, const void* a_v, const void* b_v,
                  std::size_t n) noexcept {
  T* CCLITE_RESTRICT out1 = static_cast<T*>(out1_v);
  T* CCLITE_RESTRICT out2 = static_cast<T*>(out2_v);
  const T* CCLITE_RESTRICT a = static_cast<const T*>(a_v);
  const T* CCLITE_RESTRICT b = static_cast<const T*>(b_v);
  using K = compute<T>;
  for (std::size_t i = 0; i < n; ++i) {
    T r = K::store(apply<typename K::type, Op>(K::load(a[i]), K::load(b[i])));
    out1[i] = r;
    out2[i] = r;
  }
}

/// p[i] /= divisor (the finishing step of reduce_op::avg).
template <class T>
void divide(void* p_v, std::size_t n, int divisor) noexcept {
  T* CCLITE_RESTRICT p = static_cast<T*>(p_v);
  using K = compute<T>;
  using C = typename K::type;
  if constexpr (std::is_integral_v<C>) {
    const C d = static_cast<C>(divisor);
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
  } else {
    const C inv = C(1) / static_cast<C>(divisor);
    for (std::size_t i = 0; i < n; ++i) p[i] = K::store(K::load(p[i]) * inv);
  }
}

}  // namespace detail

CCLITE_FP_KERNELS_END

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
  }
  return {};
}
}  // namespace detail

/// The kernels for (t, op). Returns an empty table (inplace == nullptr) for an
/// invalid dtype or op; callers turn that into errc::invalid_argument.
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
