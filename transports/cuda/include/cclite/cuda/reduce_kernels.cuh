// cclite/cuda/reduce_kernels.cuh - the reduction leaf on the GPU: out = a op b.
//
// Device counterpart of core/reduce.hpp, with the same results bit for bit:
// every dtype (float16 / bfloat16 widened to float per element and rounded to
// nearest-even on the way back), every op (sum, prod, min, max; avg is sum with
// the division by the rank count fused into the last step), integer sum / prod
// wrapping in the unsigned type.
//
// Device code: include it from a .cu file compiled by nvcc (CMake: a CUDA
// source of a target linking cclite::cuda). Host code calls `reduce(...)`, which
// enqueues one kernel on a stream and returns at once (cudaError_t of the launch;
// turn it into a status with cuda::cuda_status).
//
// Kernel shape (why): a grid-stride loop of 256-thread blocks,
// `__launch_bounds__(reduce_block_threads, reduce_blocks_per_sm)`: the compiler
// keeps each thread at or under 64 registers (sm_90: 65536 / (256 * 4)), so 4
// blocks = 1024 threads stay resident per SM, and the grid is capped at 4 blocks
// per SM: no more blocks than can be resident, each looping. When out, a and b
// are all 16-byte aligned, each thread moves whole 16-byte vectors (uint4: one
// 128-bit load per input), `reduce_unroll` of them per iteration with all loads
// issued before any arithmetic, i.e. 8 loads of 16 bytes in flight per thread:
// far more than HBM's bandwidth-delay product, which is what a streaming kernel
// needs to run at copy speed (ptxas -v, sm_90: 48-64 registers, no spills). The
// remainder (< 16 bytes, and everything when a pointer is misaligned) goes
// element by element. out may equal a or b (in place), not partially overlap.
#pragma once

#if !defined(__CUDACC__)
#error "cclite/cuda/reduce_kernels.cuh holds device code: include it from a .cu file compiled by nvcc"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cclite/core/dtype.hpp>

namespace cclite::cuda {

inline constexpr int reduce_block_threads = 256;
inline constexpr int reduce_blocks_per_sm = 4;
inline constexpr int reduce_unroll = 4;

namespace detail {

template <class T>
struct dev_compute {
  using type = T;
  __device__ static T load(T v) { return v; }
  __device__ static T store(T v) { return v; }
};
template <>
struct dev_compute<::cclite::half> {
  using type = float;
  __device__ static float load(::cclite::half v) { return __half2float(__ushort_as_half(v.bits)); }
  __device__ static ::cclite::half store(float f) {
    return ::cclite::half{__half_as_ushort(__float2half_rn(f))};
  }
};
template <>
struct dev_compute<::cclite::bfloat16> {
  using type = float;
  __device__ static float load(::cclite::bfloat16 v) {
    return __bfloat162float(__ushort_as_bfloat16(v.bits));
  }
  __device__ static ::cclite::bfloat16 store(float f) {
    return ::cclite::bfloat16{__bfloat16_as_ushort(__float2bfloat16_rn(f))};
  }
};

// Same semantics as core/reduce.hpp's apply(): wrapping integer sum / prod,
// min / max by operator< (so a NaN in `a` is kept, as on the host).
template <class C, reduce_op Op>
__device__ __forceinline__ C apply(C a, C b) {
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg || Op == reduce_op::prod) {
    if constexpr (std::is_integral_v<C>) {
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
  } else if constexpr (std::is_integral_v<C>) {  // bitwise: integer dtypes only
    if constexpr (Op == reduce_op::band) return static_cast<C>(a & b);
    else if constexpr (Op == reduce_op::bor) return static_cast<C>(a | b);
    else return static_cast<C>(a ^ b);
  } else {
    return a;  // not launched: reduce() refuses bitwise ops on floating dtypes
  }
}

// One element: op, then (avg's last step) the division, rounding to T after
// each as the host does, so results match core/reduce.hpp bit for bit.
template <class T, reduce_op Op>
__device__ __forceinline__ T combine(T a, T b, int divisor) {
  using K = dev_compute<T>;
  using C = typename K::type;
  T r = K::store(apply<C, Op>(K::load(a), K::load(b)));
  if (divisor > 0) {
    if constexpr (std::is_integral_v<C>) {
      r = static_cast<T>(r / static_cast<C>(divisor));
    } else {
      r = K::store(K::load(r) * (C(1) / static_cast<C>(divisor)));
    }
  }
  return r;
}

// 16 bytes as one uint4 (one 128-bit load / store) seen as elements. Not a
// union: cclite::half / bfloat16 have default member initializers.
template <class T>
struct vec16 {
  uint4 raw;
  __device__ T* elems() { return reinterpret_cast<T*>(&raw); }
};

}  // namespace detail

/// out[i] = a[i] op b[i] for i < n; `divisor` > 0 divides the result (avg's last
/// step); `vectorised` is true only when out, a and b are 16-byte aligned.
template <class T, reduce_op Op>
__global__ void __launch_bounds__(reduce_block_threads, reduce_blocks_per_sm)
    reduce_kernel(T* out, const T* a, const T* b, std::size_t n, int divisor, bool vectorised) {
  constexpr std::size_t per_vec = 16 / sizeof(T);
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t done = 0;
  if (vectorised) {
    const std::size_t nvec = n / per_vec;
    const uint4* va = reinterpret_cast<const uint4*>(a);
    const uint4* vb = reinterpret_cast<const uint4*>(b);
    uint4* vo = reinterpret_cast<uint4*>(out);
    std::size_t i = tid;
    for (; i + (reduce_unroll - 1) * stride < nvec; i += reduce_unroll * stride) {
      detail::vec16<T> x[reduce_unroll], y[reduce_unroll];
#pragma unroll
      for (int u = 0; u < reduce_unroll; ++u) {
        x[u].raw = va[i + u * stride];
        y[u].raw = vb[i + u * stride];
      }
#pragma unroll
      for (int u = 0; u < reduce_unroll; ++u) {
#pragma unroll
        for (std::size_t e = 0; e < per_vec; ++e) {
          x[u].elems()[e] = detail::combine<T, Op>(x[u].elems()[e], y[u].elems()[e], divisor);
        }
        vo[i + u * stride] = x[u].raw;
      }
    }
    for (; i < nvec; i += stride) {
      detail::vec16<T> x, y;
      x.raw = va[i];
      y.raw = vb[i];
#pragma unroll
      for (std::size_t e = 0; e < per_vec; ++e) {
        x.elems()[e] = detail::combine<T, Op>(x.elems()[e], y.elems()[e], divisor);
      }
      vo[i] = x.raw;
    }
    done = nvec * per_vec;
  }
  for (std::size_t i = done + tid; i < n; i += stride) {
    out[i] = detail::combine<T, Op>(a[i], b[i], divisor);
  }
}

namespace detail {

// Unsigned sum / prod run the signed kernels (same bits, see apply()), which
// keeps the kernel count per TU down, as core/reduce.hpp does on the host.
template <class T> struct same_bits_signed_dev { using type = T; };
template <> struct same_bits_signed_dev<std::uint8_t> { using type = std::int8_t; };
template <> struct same_bits_signed_dev<std::uint32_t> { using type = std::int32_t; };
template <> struct same_bits_signed_dev<std::uint64_t> { using type = std::int64_t; };

template <class T, reduce_op Op>
cudaError_t launch(void* out, const void* a, const void* b, std::size_t n, int divisor,
                   cudaStream_t stream) {
  using K = std::conditional_t<Op == reduce_op::min || Op == reduce_op::max, T,
                               typename same_bits_signed_dev<T>::type>;
  // Integer avg divides with the signedness of T itself: only sum's combine
  // step may borrow the signed kernel, so avg of unsigned types keeps T.
  using KD = std::conditional_t<std::is_unsigned_v<T>, T, K>;
  const bool vec = ((reinterpret_cast<std::uintptr_t>(out) | reinterpret_cast<std::uintptr_t>(a) |
                     reinterpret_cast<std::uintptr_t>(b)) & 15u) == 0;
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  const std::size_t units = vec ? n / (16 / sizeof(T)) + 16 : n;
  std::size_t blocks = (units + reduce_block_threads - 1) / reduce_block_threads;
  const std::size_t cap = static_cast<std::size_t>(sms) * reduce_blocks_per_sm;
  if (blocks > cap) blocks = cap;
  if (blocks == 0) blocks = 1;
  if (divisor > 0) {
    reduce_kernel<KD, Op><<<static_cast<unsigned>(blocks), reduce_block_threads, 0, stream>>>(
        static_cast<KD*>(out), static_cast<const KD*>(a), static_cast<const KD*>(b), n, divisor, vec);
  } else {
    reduce_kernel<K, Op><<<static_cast<unsigned>(blocks), reduce_block_threads, 0, stream>>>(
        static_cast<K*>(out), static_cast<const K*>(a), static_cast<const K*>(b), n, 0, vec);
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t launch(reduce_op op, void* out, const void* a, const void* b, std::size_t n,
                   int divisor, cudaStream_t stream) {
  switch (op) {
    case reduce_op::sum: return launch<T, reduce_op::sum>(out, a, b, n, 0, stream);
    case reduce_op::avg: return launch<T, reduce_op::sum>(out, a, b, n, divisor, stream);
    case reduce_op::prod: return launch<T, reduce_op::prod>(out, a, b, n, 0, stream);
    case reduce_op::min: return launch<T, reduce_op::min>(out, a, b, n, 0, stream);
    case reduce_op::max: return launch<T, reduce_op::max>(out, a, b, n, 0, stream);
    case reduce_op::band:
    case reduce_op::bor:
    case reduce_op::bxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == reduce_op::band) return launch<T, reduce_op::band>(out, a, b, n, 0, stream);
        if (op == reduce_op::bor) return launch<T, reduce_op::bor>(out, a, b, n, 0, stream);
        return launch<T, reduce_op::bxor>(out, a, b, n, 0, stream);
      }
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

}  // namespace detail

/// Enqueues out[i] = a[i] op b[i] (count elements of t) on `stream`. For
/// reduce_op::avg pass `avg_divisor` = the rank count on the last step of the
/// reduction (the result is divided), 0 on the steps before; other ops ignore it.
/// Pointers must be device (or managed) memory on the current device.
/// Returns the launch's error: cudaErrorInvalidValue for a bad dtype or op.
inline cudaError_t reduce(void* out, const void* a, const void* b, std::size_t count, dtype t,
                          reduce_op op, int avg_divisor, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!out || !a || !b || !applies_to(op, t)) return cudaErrorInvalidValue;
  const int div = op == reduce_op::avg ? avg_divisor : 0;
  switch (t) {
    case dtype::int8: return detail::launch<std::int8_t>(op, out, a, b, count, div, stream);
    case dtype::uint8: return detail::launch<std::uint8_t>(op, out, a, b, count, div, stream);
    case dtype::int32: return detail::launch<std::int32_t>(op, out, a, b, count, div, stream);
    case dtype::uint32: return detail::launch<std::uint32_t>(op, out, a, b, count, div, stream);
    case dtype::int64: return detail::launch<std::int64_t>(op, out, a, b, count, div, stream);
    case dtype::uint64: return detail::launch<std::uint64_t>(op, out, a, b, count, div, stream);
    case dtype::float16: return detail::launch<::cclite::half>(op, out, a, b, count, div, stream);
    case dtype::bfloat16: return detail::launch<::cclite::bfloat16>(op, out, a, b, count, div, stream);
    case dtype::float32: return detail::launch<float>(op, out, a, b, count, div, stream);
    case dtype::float64: return detail::launch<double>(op, out, a, b, count, div, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cclite::cuda
