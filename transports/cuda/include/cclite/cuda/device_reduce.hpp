// cclite/cuda/device_reduce.hpp - the device reduction kernels, callable from host code
// that g++ compiles.
//
// The kernels (reduce_kernels.cuh) need nvcc, while cclite's host code, and the
// programs using it, are usually compiled by g++. So the kernels are compiled
// once, by nvcc, in transports/cuda/src/device_reduce.cu, behind one C entry
// point, and host code reaches them through this header. The entry point is
// declared weak: a program that was not linked with it still builds and runs,
// `device_reduce_linked()` is false, and what needs device kernels (the CUDA IPC
// path of device_communicator) says so and steps aside (the host-staged path
// needs no kernels).
//
// Who links it: every target linking CMake's cclite::cuda in this build tree
// gets transports/cuda/src/device_reduce.cu's object (when nvcc was found:
// CCLITE_CUDA_LANGUAGE). Without cclite's CMake (or from an installed copy),
// add one .cu file to the program that includes <cclite/cuda/device_reduce_entry.cuh>.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include <cclite/core/dtype.hpp>

/// out[i] = a[i] op b[i] for `count` elements of dtype `t` (cclite::dtype as int,
/// op as int: cclite::reduce_op), enqueued on `stream`; avg divides by
/// `avg_divisor` when it is > 0. Defined in cclite/cuda/device_reduce_entry.cuh.
extern "C" cudaError_t cclite_cuda_device_reduce(void* out, const void* a, const void* b, std::size_t count,
                                                 int t, int op, int avg_divisor, cudaStream_t stream)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((weak))
#endif
    ;

namespace cclite::cuda {

/// Whether this program was linked with the device kernels (see the file comment).
inline bool device_reduce_linked() noexcept { return &cclite_cuda_device_reduce != nullptr; }

/// Enqueues out[i] = a[i] op b[i] on `stream` (reduce_kernels.cuh's `reduce`):
/// `avg_divisor` > 0 on the last step of an avg divides the result. out may equal
/// a or b. cudaErrorNotSupported when the kernels are not linked; the launch's
/// error otherwise (cudaErrorInvalidValue for a bad dtype or op).
inline cudaError_t device_reduce(void* out, const void* a, const void* b, std::size_t count, dtype t,
                                 reduce_op op, int avg_divisor, cudaStream_t stream) noexcept {
  if (!device_reduce_linked()) return cudaErrorNotSupported;
  return cclite_cuda_device_reduce(out, a, b, count, static_cast<int>(t), static_cast<int>(op), avg_divisor,
                                   stream);
}

}  // namespace cclite::cuda
