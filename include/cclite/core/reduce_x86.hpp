// cclite/core/reduce_x86.hpp - float16 and bfloat16 reduction kernels for x86
// CPUs with AVX2 and F16C, chosen at run time by make_reduction (reduce.hpp).
//
// Why: the portable kernels (reduce_kernels.hpp) widen each 16-bit value to
// float and round it back element by element; built for the x86-64 baseline
// (SSE2), as a program is unless it asks for more, a bfloat16 sum ran at a
// sixth and a float16 sum at a twentieth of a float sum's speed, and bf16 /
// fp16 allreduces at half and a sixth of float's bus bandwidth
// (docs/performance.md, Session 19). These take 16 elements per step, 8 per
// instruction: F16C's vcvtph2ps / vcvtps2ph for float16; for bfloat16 an
// interleave with zeros, the rounding add and one pack (lanes<bfloat16>); AVX
// for the arithmetic. They are compiled with target attributes, so a program
// needs no -mavx2 and still runs on any x86-64 CPU: the CPU is asked once
// (cpu_has_avx2_f16c).
//
// Same bits: each element gets the same float operation and the same
// round-to-nearest-even as in the portable kernels, whatever its position, so
// results do not depend on which kernel ran, on chunking or alignment, nor on
// the CPU of the rank that computed them (NaN payloads aside: F16C keeps a
// NaN's payload bits, the portable float16 code makes it 0x7e00).
//
// Written with GCC/Clang vector extensions and the F16C builtins instead of
// <immintrin.h>: that header is 47k lines (0.5 s of compile time in every
// translation unit that includes cclite). CCLITE_NO_X86_KERNELS turns this off
// (define it for the whole program, or translation units disagree on what
// reduction_for hands out; both answers give the same bits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cclite/config.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/reduce_kernels.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(CCLITE_NO_X86_KERNELS)
#define CCLITE_HAS_X86_KERNELS 1
#else
#define CCLITE_HAS_X86_KERNELS 0
#endif

#if CCLITE_HAS_X86_KERNELS

#include <cpuid.h>

namespace cclite {
namespace detail {
namespace x86 {

/// Whether this CPU runs the kernels below, checked once: AVX2 as the
/// compiler's runtime reports it (which includes the OS saving the AVX
/// registers), F16C from cpuid leaf 1 (ECX bit 29; Clang's
/// __builtin_cpu_supports does not know "f16c").
inline bool cpu_has_avx2_f16c() noexcept {
  static const bool ok = [] {
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return ok;
}

#define CCLITE_X86_TARGET __attribute__((target("avx2,f16c")))
#define CCLITE_X86_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

typedef float v8sf __attribute__((vector_size(32)));
typedef std::int32_t v8si __attribute__((vector_size(32)));
typedef std::uint32_t v8su __attribute__((vector_size(32)));
typedef std::int16_t v8hi __attribute__((vector_size(16)));
typedef std::uint16_t v8hu __attribute__((vector_size(16)));
typedef std::uint16_t v16hu __attribute__((vector_size(32)));
typedef long long v4di __attribute__((vector_size(32)));

CCLITE_FP_KERNELS_BEGIN

/// The same 32 bytes as another vector type.
template <class To, class From>
CCLITE_X86_INLINE To bits_as(From f) noexcept {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To t;
  std::memcpy(&t, &f, sizeof t);
  return t;
}

/// 8 elements of T <-> 8 floats (load, store), and 16 elements <-> two
/// vectors of 8 floats (load16, store16) in an order of the type's choosing:
/// the same for every operand, and store16 puts the elements back in place.
template <class T>
struct lanes;

template <>
struct lanes<half> {
  static CCLITE_X86_INLINE v8sf load(const half* p) noexcept {
    v8hi h;
    std::memcpy(&h, p, sizeof h);
    return __builtin_ia32_vcvtph2ps256(h);
  }
  static CCLITE_X86_INLINE void store(half* p, v8sf v) noexcept {
    const v8hi h = __builtin_ia32_vcvtps2ph256(v, 0);  // 0: round to nearest even
    std::memcpy(static_cast<void*>(p), &h, sizeof h);
  }
  static CCLITE_X86_INLINE void load16(const half* p, v8sf& x0, v8sf& x1) noexcept {
    x0 = load(p);
    x1 = load(p + 8);
  }
  static CCLITE_X86_INLINE void store16(half* p, v8sf x0, v8sf x1) noexcept {
    store(p, x0);
    store(p + 8, x1);
  }
};

template <>
struct lanes<bfloat16> {
  static CCLITE_X86_INLINE v8sf load(const bfloat16* p) noexcept {
    v8hi h;
    std::memcpy(&h, p, sizeof h);
    // Widen (vpmovzxwd; GCC lowers a converting widen into four instructions)
    // and shift into the upper half: bfloat16 is a float's top 16 bits.
#if defined(__clang__)
    const v8su wide = __builtin_convertvector(bits_as<v8hu>(h), v8su);
#else
    const v8su wide = bits_as<v8su>(__builtin_ia32_pmovzxwd256(h));
#endif
    return bits_as<v8sf>(wide << 16);
  }
  // to_bfloat16 (dtype.hpp) on 8 lanes: round to nearest even; NaN -> quiet
  // NaN. The 16-bit results, in 32-bit lanes.
  static CCLITE_X86_INLINE v8si round(v8sf v) noexcept {
    const v8su u = bits_as<v8su>(v);
    const v8su rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const v8su quiet_nan = (u >> 16) | 0x40u;
    // In range of int32 after the mask, so a signed compare; all ones where NaN.
    const v8su nan = bits_as<v8su>(bits_as<v8si>(u & 0x7fffffffu) > 0x7f800000);
    return bits_as<v8si>((quiet_nan & nan) | (rounded & ~nan));
  }
  static CCLITE_X86_INLINE void store(bfloat16* p, v8sf v) noexcept {
    // Narrow to 16 bits (every lane fits): vpackusdw packs within each 128-bit
    // half, vpermq brings the two 64-bit results together. A converting
    // narrow (__builtin_convertvector) became 8 scalar stores.
    const v8si r = round(v);
    const v4di packed = bits_as<v4di>(__builtin_ia32_packusdw256(r, r));
    const v4di low = __builtin_ia32_permdi256(packed, 0x08);  // qwords 0, 2 -> 0, 1
    std::memcpy(static_cast<void*>(p), &low, 16);
  }
  // 16 at once without widening or lane crossing: interleaving zeros below
  // each element (vpunpcklwd / vpunpckhwd) makes x0 = elements 0-3 and 8-11
  // as floats, x1 = 4-7 and 12-15; vpackusdw of the two results restores the
  // order. A third fewer instructions than two 8-element steps.
  static CCLITE_X86_INLINE void load16(const bfloat16* p, v8sf& x0, v8sf& x1) noexcept {
    v16hu w;
    std::memcpy(&w, p, sizeof w);
    const v16hu z = {};
    x0 = bits_as<v8sf>(__builtin_shufflevector(z, w, 0, 16, 1, 17, 2, 18, 3, 19, 8, 24, 9, 25, 10, 26, 11, 27));
    x1 = bits_as<v8sf>(__builtin_shufflevector(z, w, 4, 20, 5, 21, 6, 22, 7, 23, 12, 28, 13, 29, 14, 30, 15, 31));
  }
  static CCLITE_X86_INLINE void store16(bfloat16* p, v8sf x0, v8sf x1) noexcept {
    const v16hu packed = bits_as<v16hu>(__builtin_ia32_packusdw256(round(x0), round(x1)));
    std::memcpy(static_cast<void*>(p), &packed, sizeof packed);
  }
};

/// apply() (reduce_kernels.hpp) on 8 lanes, with the same operand order, so
/// NaNs and signed zeros come out as they do there.
template <reduce_op Op>
CCLITE_X86_INLINE v8sf apply8(v8sf a, v8sf b) noexcept {
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
    return a + b;
  } else if constexpr (Op == reduce_op::prod) {
    return a * b;
  } else {
    const v8si take_b = Op == reduce_op::min ? (b < a) : (a < b);  // all ones where true
    return bits_as<v8sf>((bits_as<v8si>(b) & take_b) | (bits_as<v8si>(a) & ~take_b));
  }
}

// The kernels: 16 elements at a time, the rest by the portable kernel.

template <class T, reduce_op Op>
CCLITE_X86_TARGET void reduce_inplace(void* inout_v, const void* in_v, std::size_t n) noexcept {
  T* CCLITE_RESTRICT inout = static_cast<T*>(inout_v);
  const T* CCLITE_RESTRICT in = static_cast<const T*>(in_v);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8sf a0, a1, b0, b1;
    lanes<T>::load16(inout + i, a0, a1);
    lanes<T>::load16(in + i, b0, b1);
    lanes<T>::store16(inout + i, apply8<Op>(a0, b0), apply8<Op>(a1, b1));
  }
  detail::reduce_inplace<T, Op>(inout + i, in + i, n - i);
}

template <class T, reduce_op Op>
CCLITE_X86_TARGET void reduce_copy(void* out_v, const void* a_v, const void* b_v, std::size_t n) noexcept {
  T* CCLITE_RESTRICT out = static_cast<T*>(out_v);
  const T* CCLITE_RESTRICT a = static_cast<const T*>(a_v);
  const T* CCLITE_RESTRICT b = static_cast<const T*>(b_v);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8sf a0, a1, b0, b1;
    lanes<T>::load16(a + i, a0, a1);
    lanes<T>::load16(b + i, b0, b1);
    lanes<T>::store16(out + i, apply8<Op>(a0, b0), apply8<Op>(a1, b1));
  }
  detail::reduce_copy<T, Op>(out + i, a + i, b + i, n - i);
}

template <class T, reduce_op Op>
CCLITE_X86_TARGET void reduce_copy2(void* out1_v, void* out2_v, const void* a_v, const void* b_v,
                                    std::size_t n) noexcept {
  T* CCLITE_RESTRICT out1 = static_cast<T*>(out1_v);
  T* CCLITE_RESTRICT out2 = static_cast<T*>(out2_v);
  const T* CCLITE_RESTRICT a = static_cast<const T*>(a_v);
  const T* CCLITE_RESTRICT b = static_cast<const T*>(b_v);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8sf a0, a1, b0, b1;
    lanes<T>::load16(a + i, a0, a1);
    lanes<T>::load16(b + i, b0, b1);
    const v8sf r0 = apply8<Op>(a0, b0), r1 = apply8<Op>(a1, b1);
    lanes<T>::store16(out1 + i, r0, r1);
    lanes<T>::store16(out2 + i, r0, r1);
  }
  detail::reduce_copy2<T, Op>(out1 + i, out2 + i, a + i, b + i, n - i);
}

template <class T>
CCLITE_X86_TARGET void divide(void* p_v, std::size_t n, int divisor) noexcept {
  T* CCLITE_RESTRICT p = static_cast<T*>(p_v);
  const float inv = 1.0f / static_cast<float>(divisor);  // as detail::divide
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v8sf x0, x1;
    lanes<T>::load16(p + i, x0, x1);
    lanes<T>::store16(p + i, x0 * inv, x1 * inv);
  }
  detail::divide<T>(p + i, n - i, divisor);
}

/// out[i] = in[i] / divisor rounded to T (to_half / to_bfloat16 of the
/// quotient): packing fp32 values, e.g. gradients (train/grad_compression.hpp).
template <class T>
CCLITE_X86_TARGET void narrow(const float* in_p, T* out_p, std::size_t n, float divisor) noexcept {
  const float* CCLITE_RESTRICT in = in_p;
  T* CCLITE_RESTRICT out = out_p;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8sf v;
    std::memcpy(&v, in + i, sizeof v);
    lanes<T>::store(out + i, v / divisor);
  }
  for (; i < n; ++i) out[i] = compute<T>::store(in[i] / divisor);
}

/// out[i] = in[i] as float (exact).
template <class T>
CCLITE_X86_TARGET void widen(const T* in_p, float* out_p, std::size_t n) noexcept {
  const T* CCLITE_RESTRICT in = in_p;
  float* CCLITE_RESTRICT out = out_p;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8sf v = lanes<T>::load(in + i);
    std::memcpy(out + i, &v, sizeof v);
  }
  for (; i < n; ++i) out[i] = compute<T>::load(in[i]);
}

CCLITE_FP_KERNELS_END

#undef CCLITE_X86_TARGET
#undef CCLITE_X86_INLINE

}  // namespace x86
}  // namespace detail
}  // namespace cclite

#endif  // CCLITE_HAS_X86_KERNELS
