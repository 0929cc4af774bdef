// cclite/core/reduce_kernels.hpp - the portable reduction loops, one per
// (element type, op): inout op= in, out = a op b, out1 = out2 = a op b, and
// avg's final divide. Plain loops over restrict pointers that GCC and Clang
// vectorise at -O3 (checked with -fopt-info-vec). float16/bfloat16 are
// widened to float per element and rounded back (round to nearest even);
// reduce_x86.hpp has faster versions of those for CPUs with AVX2 and F16C.
// Signed integer arithmetic wraps (computed in the unsigned type), so an
// overflowing sum is well defined and identical on every rank.
//
// reduce.hpp puts them into type-erased tables (cclite::reduction); that is
// what algorithms use.
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
  } else if constexpr (Op == reduce_op::max) {
    return a < b ? b : a;
  } else {
    static_assert(std::is_integral_v<C>, "bitwise ops take integer dtypes");
    if constexpr (Op == reduce_op::band) return static_cast<C>(a & b);
    else if constexpr (Op == reduce_op::bor) return static_cast<C>(a | b);
    else return static_cast<C>(a ^ b);
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

}  // namespace cclite
