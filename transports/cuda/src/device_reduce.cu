// transports/cuda/src/device_reduce.cu - the one nvcc translation unit of cclite::cuda:
// the device reduction kernels for host code compiled by g++ (cuda/device_reduce.hpp).
#include <cclite/cuda/device_reduce_entry.cuh>
