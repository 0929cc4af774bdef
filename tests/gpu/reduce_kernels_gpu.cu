// Device reduction kernels (cclite/cuda/reduce_kernels.cuh) on a real GPU:
//   1. correctness: every dtype x op, aligned (vector path) and misaligned
//      (element path) pointers, in place and out of place, an odd count (tail),
//      bit for bit against core/reduce.hpp on the host;
//   2. bandwidth: out = a + b over 256 MiB buffers (float32 and bfloat16), as a
//      percentage of a device-to-device cudaMemcpyAsync measured in the same run
//      (bytes moved: reduce reads 2 and writes 1, copy reads 1 and writes 1).
// Prints "RESULT ..." lines that tests/gpu/run.sh turns into its table. Exit
// codes: 0 all correct, 1 a wrong result or CUDA error, 77 no CUDA device (skip).
// Built by nvcc whenever the toolkit is found, so CI compiles the kernels.
#include <cclite/core/reduce.hpp>
#include <cclite/cuda/reduce_kernels.cuh>
#include <cclite/cuda/runtime.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "reference.hpp"

namespace cc = cclite;

namespace {

#define GPU_CHECK(expr)                                                              \
  do {                                                                               \
    cc::status s_ = cc::cuda::cuda_status((expr), #expr);                            \
    if (!s_.ok()) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, s_.to_string().c_str()); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

// Returns the number of wrong elements of one (dtype, op, alignment, in-place) case.
std::size_t check_case(cc::dtype t, cc::reduce_op op, std::size_t n, std::size_t offset_elems,
                       bool in_place, unsigned char* d_a, unsigned char* d_b, unsigned char* d_o,
                       cudaStream_t s) {
  const std::size_t es = cc::size_of(t);
  const auto a = cc::gpu_test::input(t, n, 0);
  const auto b = cc::gpu_test::input(t, n, 1);
  const auto want = cc::gpu_test::reduced(t, op, n, 2);  // a op b (avg: / 2)
  cc::gpu_test::bytes got(n * es);
  unsigned char* pa = d_a + offset_elems * es;
  unsigned char* pb = d_b + offset_elems * es;
  unsigned char* po = in_place ? pa : d_o + offset_elems * es;
  GPU_CHECK(cudaMemcpyAsync(pa, a.data(), n * es, cudaMemcpyHostToDevice, s));
  GPU_CHECK(cudaMemcpyAsync(pb, b.data(), n * es, cudaMemcpyHostToDevice, s));
  GPU_CHECK(cc::cuda::reduce(po, pa, pb, n, t, op, 2, s));
  GPU_CHECK(cudaMemcpyAsync(got.data(), po, n * es, cudaMemcpyDeviceToHost, s));
  GPU_CHECK(cudaStreamSynchronize(s));
  return cc::gpu_test::wrong_elements(got, want, t);
}

// Average milliseconds of `iters` runs of `fn` on `s`, after two warm-up runs.
template <class F>
float time_ms(cudaStream_t s, int iters, F&& fn) {
  cudaEvent_t e0, e1;
  GPU_CHECK(cudaEventCreate(&e0));
  GPU_CHECK(cudaEventCreate(&e1));
  fn();
  fn();
  GPU_CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < iters; ++i) fn();
  GPU_CHECK(cudaEventRecord(e1, s));
  GPU_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  GPU_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  GPU_CHECK(cudaEventDestroy(e0));
  GPU_CHECK(cudaEventDestroy(e1));
  return ms / static_cast<float>(iters);
}

}  // namespace

int main() {
  auto count = cc::cuda::device_count();
  if (!count) {
    std::printf("SKIP reduce_kernels_gpu: %s\n", count.error().to_string().c_str());
    return 77;
  }
  GPU_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("reduce_kernels_gpu: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t s;
  GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // 1. correctness
  const std::size_t n = (1u << 20) + 13;  // odd: vector part plus a tail
  const std::size_t bytes = (n + 16) * 8;
  unsigned char *d_a, *d_b, *d_o;
  GPU_CHECK(cudaMalloc(&d_a, bytes));
  GPU_CHECK(cudaMalloc(&d_b, bytes));
  GPU_CHECK(cudaMalloc(&d_o, bytes));
  int failures = 0;
  for (int ti = 0; ti < cc::dtype_count; ++ti) {
    const auto t = static_cast<cc::dtype>(ti);
    std::string line;
    bool ok = true;
    for (int oi = 0; oi < cc::reduce_op_count; ++oi) {
      const auto op = static_cast<cc::reduce_op>(oi);
      if (!cc::applies_to(op, t)) {  // a bitwise op on a floating dtype: refused, nothing launched
        if (cc::cuda::reduce(d_o, d_a, d_b, n, t, op, 0, s) != cudaErrorInvalidValue) {
          ok = false;
          line += std::string(" ") + cc::to_string(op) + ":not refused";
        }
        continue;
      }
      std::size_t wrong = 0;
      for (std::size_t offset : {std::size_t(0), std::size_t(1)}) {
        for (bool in_place : {false, true}) wrong += check_case(t, op, n, offset, in_place, d_a, d_b, d_o, s);
      }
      if (wrong) {
        ok = false;
        line += std::string(" ") + cc::to_string(op) + ":" + std::to_string(wrong) + "wrong";
      }
    }
    failures += !ok;
    std::printf("RESULT kernel %s %s%s\n", cc::to_string(t), ok ? "ok" : "FAIL", line.c_str());
  }
  GPU_CHECK(cudaFree(d_a));
  GPU_CHECK(cudaFree(d_b));
  GPU_CHECK(cudaFree(d_o));

  // 2. bandwidth against a device-to-device copy of the same size
  const std::size_t big = 256u << 20;
  GPU_CHECK(cudaMalloc(&d_a, big));
  GPU_CHECK(cudaMalloc(&d_b, big));
  GPU_CHECK(cudaMalloc(&d_o, big));
  GPU_CHECK(cudaMemsetAsync(d_a, 0, big, s));
  GPU_CHECK(cudaMemsetAsync(d_b, 0, big, s));
  const int iters = 20;
  const float copy_ms = time_ms(s, iters, [&] { GPU_CHECK(cudaMemcpyAsync(d_o, d_a, big, cudaMemcpyDeviceToDevice, s)); });
  const double copy_gbs = 2.0 * double(big) / (copy_ms * 1e6);
  std::printf("RESULT copy_bw %.1f\n", copy_gbs);
  for (cc::dtype t : {cc::dtype::float32, cc::dtype::bfloat16}) {
    const std::size_t elems = big / cc::size_of(t);
    const float ms = time_ms(s, iters, [&] {
      GPU_CHECK(cc::cuda::reduce(d_o, d_a, d_b, elems, t, cc::reduce_op::sum, 0, s));
    });
    const double gbs = 3.0 * double(big) / (ms * 1e6);
    std::printf("RESULT kernel_bw %s sum %.1f %.1f %.1f\n", cc::to_string(t), gbs, copy_gbs,
                100.0 * gbs / copy_gbs);
  }
  GPU_CHECK(cudaFree(d_a));
  GPU_CHECK(cudaFree(d_b));
  GPU_CHECK(cudaFree(d_o));
  GPU_CHECK(cudaStreamDestroy(s));
  return failures ? 1 : 0;
}
