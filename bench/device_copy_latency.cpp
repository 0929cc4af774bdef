// device_copy_latency: what a staged chunk's copies cost when the ranks of a
// job time-share one GPU (no MPS), the physical floor of the native engine's
// staged path (cuda/staged_engine.hpp: device -> host, host collective, host
// -> device) for small calls.
//
//   build/bin/cclite-run --nproc-per-node 2 build/bin/device_copy_latency
//
// Each rank, in lockstep with the others (a CPU barrier per iteration, as the
// host collective of a staged call makes them): cudaMemcpyAsync between a
// device buffer and pinned host memory on a non-blocking stream, then
// cudaStreamSynchronize. Prints the median, p10 and p90 per iteration (rank 0)
// for device -> host, host -> device, and both, by size.
//
// H200, CUDA 13.0, 2 ranks sharing it without MPS (2026-12-04, two runs;
// docs/performance.md "Session 15"): device -> host 9-10 us up to 16 KiB; host ->
// device 169-185 us below 64 KiB (p10 143 us, p90 270 us) and 14-17 us at 64 KiB;
// both on one stream 168-198 us at 8-512 B, 13-16 us from 4 KiB. One rank alone:
// 7-12 us for all of them. Staged small calls pay for their small host ->
// device copy, which waits for this process's turn on the time-sliced GPU.
// Without a GPU: a message and exit code 77.
#include <cclite/cclite.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "device_copy_latency: no CUDA device\n");
    return 77;
  }
  auto comm = cclite::init();
  if (!comm) {
    std::fprintf(stderr, "%s\n", comm.error().to_string().c_str());
    return 1;
  }
  auto& c = *comm.value();
  constexpr std::size_t max_bytes = 1 << 20;
  void* dev = nullptr;
  void* pinned = nullptr;
  cudaStream_t s = nullptr;
  if (cudaSetDevice(c.local_rank() % devices) != cudaSuccess || cudaMalloc(&dev, max_bytes) != cudaSuccess ||
      cudaMallocHost(&pinned, max_bytes) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    std::fprintf(stderr, "rank %d: CUDA set-up failed\n", c.rank());
    return 1;
  }
  if (c.rank() == 0)
    std::printf("# %d ranks, %d GPU(s); us per iteration (copy, stream sync, CPU barrier)\n", c.size(), devices);
  const char* names[] = {"device -> host", "host -> device", "both"};
  for (int mode = 0; mode < 3; ++mode) {
    for (std::size_t n : {8ul, 512ul, 4096ul, 16384ul, 65536ul, 262144ul}) {
      std::vector<double> us;
      for (int i = 0; i < 220; ++i) {
        const double t0 = cclite::now_seconds();
        if (mode != 1) (void)cudaMemcpyAsync(pinned, dev, n, cudaMemcpyDeviceToHost, s);
        if (mode != 0) (void)cudaMemcpyAsync(dev, pinned, n, cudaMemcpyHostToDevice, s);
        if (cudaStreamSynchronize(s) != cudaSuccess || !c.barrier().ok()) return 1;
        if (i >= 20) us.push_back((cclite::now_seconds() - t0) * 1e6);  // 20 warm-up rounds
      }
      std::sort(us.begin(), us.end());
      if (c.rank() == 0)
        std::printf("%-15s %7zu B: median %7.1f  p10 %7.1f  p90 %7.1f\n", names[mode], n, us[us.size() / 2],
                    us[us.size() / 10], us[us.size() * 9 / 10]);
    }
  }
  return 0;
}
