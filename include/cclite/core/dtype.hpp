// cclite/core/dtype.hpp - element types and reduction operations.
//
// The ten dtypes of NCCL minus fp8: int8, uint8, int32, uint32, int64, uint64,
// float16, bfloat16, float32, float64. float16 and bfloat16 are stored as their
// IEEE / brain-float bit patterns (`cclite::half`, `cclite::bfloat16`) and reduced
// in float, rounding to nearest-even on the way back (as NCCL does on the host).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cclite/config.hpp>

namespace cclite {

enum class dtype : std::uint8_t {
  int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64,
};
inline constexpr int dtype_count = 10;

enum class reduce_op : std::uint8_t {
  sum,
  prod,
  min,
  max,
  avg,   ///< sum divided by the number of ranks (integers: truncating division)
  band,  ///< bitwise and: integer dtypes only (MPI_BAND, torch's ReduceOp.BAND)
  bor,   ///< bitwise or: integer dtypes only
  bxor,  ///< bitwise exclusive or: integer dtypes only
};
inline constexpr int reduce_op_count = 8;

inline constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::int8: case dtype::uint8: return 1;
    case dtype::float16: case dtype::bfloat16: return 2;
    case dtype::int32: case dtype::uint32: case dtype::float32: return 4;
    case dtype::int64: case dtype::uint64: case dtype::float64: return 8;
  }
  return 0;
}

inline constexpr const char* to_string(dtype t) noexcept {
  switch (t) {
    case dtype::int8: return "int8";
    case dtype::uint8: return "uint8";
    case dtype::int32: return "int32";
    case dtype::uint32: return "uint32";
    case dtype::int64: return "int64";
    case dtype::uint64: return "uint64";
    case dtype::float16: return "half";
    case dtype::bfloat16: return "bfloat16";
    case dtype::float32: return "float";
    case dtype::float64: return "double";
  }
  return "?";
}

inline constexpr const char* to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::prod: return "prod";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::avg: return "avg";
    case reduce_op::band: return "band";
    case reduce_op::bor: return "bor";
    case reduce_op::bxor: return "bxor";
  }
  return "?";
}

inline constexpr bool is_valid(dtype t) noexcept { return static_cast<int>(t) < dtype_count; }
inline constexpr bool is_valid(reduce_op op) noexcept {
  return static_cast<int>(op) < reduce_op_count;
}
inline constexpr bool is_bitwise(reduce_op op) noexcept {
  return op == reduce_op::band || op == reduce_op::bor || op == reduce_op::bxor;
}
inline constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::float16 || t == dtype::bfloat16 || t == dtype::float32 || t == dtype::float64;
}
/// Whether `op` reduces `t`: the bitwise ops take integer dtypes only.
inline constexpr bool applies_to(reduce_op op, dtype t) noexcept {
  return is_valid(op) && is_valid(t) && !(is_bitwise(op) && is_floating(t));
}

/// IEEE 754 binary16, stored as bits.
struct half {
  std::uint16_t bits = 0;
};
/// bfloat16 (the top half of a float32), stored as bits.
struct bfloat16 {
  std::uint16_t bits = 0;
};

CCLITE_FP_KERNELS_BEGIN

namespace detail {
inline float bits_to_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_to_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace detail

// The conversions are branch-light so that loops over them vectorise at -O3.

inline float to_float(half h) noexcept {
  // Scale trick: shift exponent/mantissa into float position, multiply by 2^112
  // to re-bias (also handles subnormals), then patch infinities and NaNs.
  // Written as selects, not branches, so loops over it vectorise.
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t em = static_cast<std::uint32_t>(h.bits & 0x7fffu);
  const float scaled = detail::bits_to_float(em << 13) * detail::bits_to_float(0x77800000u);  // 2^112
  const std::uint32_t finite = detail::float_to_bits(scaled);
  const std::uint32_t special = 0x7f800000u | (em << 13);  // inf / nan
  return detail::bits_to_float((em >= 0x7c00u ? special : finite) | sign);
}

inline half to_half(float f) noexcept {
  // Round to nearest even (F. Giesen's float_to_half_fast3_rtne), with all three
  // cases computed and selected so that loops over it vectorise.
  std::uint32_t x = detail::float_to_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  const std::uint32_t special = x > 0x7f800000u ? 0x7e00u : 0x7c00u;  // nan / overflow, inf
  // Subnormal results: adding 0.5 lines the 10 mantissa bits up at the bottom and
  // lets the FPU round.
  const std::uint32_t sub =
      detail::float_to_bits(detail::bits_to_float(x) + 0.5f) - 0x3f000000u;
  // Normal results: rebias the exponent (-112 << 23) and round to nearest even.
  const std::uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  const std::uint32_t out = x >= 0x47800000u ? special : x < 0x38800000u ? sub : normal;
  return half{static_cast<std::uint16_t>(out | sign)};
}

inline float to_float(bfloat16 b) noexcept {
  return detail::bits_to_float(static_cast<std::uint32_t>(b.bits) << 16);
}

inline bfloat16 to_bfloat16(float f) noexcept {
  std::uint32_t u = detail::float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bfloat16{static_cast<std::uint16_t>(u >> 16)};
}

CCLITE_FP_KERNELS_END

/// dtype_of<T>: the dtype tag of a C++ element type.
template <class T>
struct dtype_of;
template <> struct dtype_of<std::int8_t> : std::integral_constant<dtype, dtype::int8> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::uint8> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::int32> {};
template <> struct dtype_of<std::uint32_t> : std::integral_constant<dtype, dtype::uint32> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::int64> {};
template <> struct dtype_of<std::uint64_t> : std::integral_constant<dtype, dtype::uint64> {};
template <> struct dtype_of<half> : std::integral_constant<dtype, dtype::float16> {};
template <> struct dtype_of<bfloat16> : std::integral_constant<dtype, dtype::bfloat16> {};
template <> struct dtype_of<float> : std::integral_constant<dtype, dtype::float32> {};
template <> struct dtype_of<double> : std::integral_constant<dtype, dtype::float64> {};

template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>::value;

}  // namespace cclite
