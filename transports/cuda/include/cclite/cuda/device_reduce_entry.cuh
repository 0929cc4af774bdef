// cclite/cuda/device_reduce_entry.cuh - the definition behind cuda/device_reduce.hpp:
// the device reduction kernels (reduce_kernels.cuh) behind one C entry point.
//
// Include it from exactly one .cu file that nvcc compiles into the program (CMake's
// cclite::cuda does this for you: transports/cuda/src/device_reduce.cu). Every
// dtype x op is instantiated here. Weak, like its declaration: two objects of one
// program that both carry it link without a duplicate-symbol error.
#pragma once

#include <cclite/cuda/device_reduce.hpp>
#include <cclite/cuda/reduce_kernels.cuh>

extern "C" __attribute__((weak)) cudaError_t cclite_cuda_device_reduce(void* out, const void* a, const void* b,
                                                                       std::size_t count, int t, int op,
                                                                       int avg_divisor, cudaStream_t stream) {
  if (t < 0 || t >= cclite::dtype_count || op < 0 || op >= cclite::reduce_op_count) return cudaErrorInvalidValue;
  return cclite::cuda::reduce(out, a, b, count, static_cast<cclite::dtype>(t), static_cast<cclite::reduce_op>(op),
                              avg_divisor, stream);
}
