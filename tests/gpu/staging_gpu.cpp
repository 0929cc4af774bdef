// Device buffers through the CPU communicator, staged in pinned host memory
// (cclite/cuda/staging.hpp): 2 processes sharing one GPU, default_communicator
// (shared memory) between them. Every dtype x op bit for bit with ragged chunks,
// then a 256 MiB float sum timed (busbw = algbw for 2 ranks). Run by
// tests/gpu/run.sh; exit codes: 0 ok, 1 failure, 77 no CUDA device (skip).
#include <cclite/cclite.hpp>
#include <cclite/cuda/staging.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "processes.hpp"
#include "reference.hpp"

using namespace cclite;
namespace gt = cclite::gpu_test;

namespace {

#define GPU(expr) OR_DIE(cuda::cuda_status((expr), #expr))

int rank_main(const char* dir, int rank, int size) {
  auto kv = file_store::open(dir);
  OR_DIE(kv.ok() ? status() : kv.error());
  auto comm = default_communicator::create(*kv.value(), rank, size);
  OR_DIE(comm.ok() ? status() : comm.error());
  GPU(cudaSetDevice(0));
  auto stream = cuda::stream::create();
  OR_DIE(stream.ok() ? status() : stream.error());
  cudaStream_t s = stream.value().get();
  auto small = cuda::staging_buffers::create(256u << 10, 3);  // many ragged chunks
  OR_DIE(small.ok() ? status() : small.error());
  const std::size_t n = 700001;
  auto buf = cuda::device_buffer::allocate(n * 8);
  OR_DIE(buf.ok() ? status() : buf.error());
  void* d = buf.value().data();
  int failed = 0;
  for (int ti = 0; ti < dtype_count; ++ti) {
    const auto t = static_cast<dtype>(ti);
    const std::size_t bytes = n * size_of(t);
    std::size_t wrong = 0;
    for (int oi = 0; oi < reduce_op_count; ++oi) {
      const auto op = static_cast<reduce_op>(oi);
      const auto in = gt::input(t, n, rank);
      GPU(cudaMemcpyAsync(d, in.data(), bytes, cudaMemcpyHostToDevice, s));
      OR_DIE(cuda::staged_allreduce(*comm.value(), d, d, n, t, op, s, small.value()));
      gt::bytes got(bytes);
      GPU(cudaMemcpyAsync(got.data(), d, bytes, cudaMemcpyDeviceToHost, s));
      GPU(cudaStreamSynchronize(s));
      wrong += gt::wrong_elements(got, gt::reduced(t, op, n, size), t);
    }
    failed += wrong != 0;
    if (rank == 0 || wrong) std::printf("RESULT staged allreduce %s %s\n", to_string(t), wrong ? "FAIL" : "ok");
  }
  // 256 MiB float sum with the default 4 x 4 MiB staging.
  auto st = cuda::staging_buffers::create();
  OR_DIE(st.ok() ? status() : st.error());
  const std::size_t big = 256u << 20;
  auto bigbuf = cuda::device_buffer::allocate(big);
  OR_DIE(bigbuf.ok() ? status() : bigbuf.error());
  GPU(cudaMemsetAsync(bigbuf.value().data(), 0, big, s));
  auto once = [&] {
    OR_DIE(cuda::staged_allreduce(*comm.value(), bigbuf.value().data(), bigbuf.value().data(), big / 4,
                                  dtype::float32, reduce_op::sum, s, st.value()));
  };
  once();
  OR_DIE(comm.value()->barrier());
  const int iters = 5;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) once();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  if (rank == 0) {
    const double algbw = double(big) / sec / 1e9;
    std::printf("RESULT staged_allreduce_perf %zu %d %.1f %.1f %.1f\n", big, size, sec * 1e6, algbw,
                algbw * 2.0 * (size - 1) / size);
  }
  return failed;
}

}  // namespace

int main() {
  if (!gpu_test::have_device_or_skip("staging_gpu")) return 77;
  const int size = 2;
  const int bad = gpu_test::in_processes("staging", size, [&](const char* dir, int r) { return rank_main(dir, r, size); });
  std::printf("RESULT staged check_ranks %d %s\n", size, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}
