// cclite::cuda::device_communicator on a GPU: 2 processes sharing the GPU
// (native engine: pinned host staging + shm, host reduction in CUDA host
// functions), then 1 process with the NCCL engine when built with NCCL.
//   - stream-ordered allreduce, every dtype x op, bit for bit, ragged chunks
//   - the stream-ordered call returns while the stream is still busy (a 300 ms
//     host function ahead of it on the stream), and the result is right after
//   - the blocking form routes by pointer: device -> staged, host -> CPU path,
//     one of each -> invalid_argument
//   - CCLITE_GPU_BACKEND=auto with 2 ranks on one GPU picks native
//   - 256 MiB float sum, stream-ordered, timed (busbw = algbw for 2 ranks)
// Run by tests/gpu/run.sh (and ctest -L gpu); exit 0 ok, 1 failure, 77 no CUDA device.
#include <cclite/cclite.hpp>
#include <cclite/cuda/device_communicator.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "processes.hpp"
#include "reference.hpp"

using namespace cclite;
namespace gt = cclite::gpu_test;
using device_comm = cuda::device_communicator<default_communicator>;

namespace {

#define GPU(expr) OR_DIE(cuda::cuda_status((expr), #expr))

void CUDART_CB sleep_300ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Every dtype x op through `dc` on `s`; returns the number of failed dtypes.
int check_all(device_comm& dc, cudaStream_t s, const char* engine, int rank, int size) {
  const std::size_t n = 700001;
  auto buf = cuda::device_buffer::allocate(n * 8);
  auto out = cuda::device_buffer::allocate(n * 8);
  OR_DIE(buf.ok() ? status() : buf.error());
  OR_DIE(out.ok() ? status() : out.error());
  int failed = 0;
  for (int ti = 0; ti < dtype_count; ++ti) {
    const auto t = static_cast<dtype>(ti);
    const std::size_t bytes = n * size_of(t);
    std::size_t wrong = 0;
    for (int oi = 0; oi < reduce_op_count; ++oi) {
      const auto op = static_cast<reduce_op>(oi);
      const auto in = gt::input(t, n, rank);
      GPU(cudaMemcpyAsync(buf.value().data(), in.data(), bytes, cudaMemcpyHostToDevice, s));
      // Alternate in place and out of place.
      void* dst = oi % 2 ? out.value().data() : buf.value().data();
      OR_DIE(dc.allreduce(buf.value().data(), dst, n, t, op, s));
      gt::bytes got(bytes);
      GPU(cudaMemcpyAsync(got.data(), dst, bytes, cudaMemcpyDeviceToHost, s));
      OR_DIE(dc.synchronize(s));
      wrong += gt::wrong_elements(got, gt::reduced(t, op, n, size), t);
    }
    failed += wrong != 0;
    if (rank == 0 || wrong) std::printf("RESULT devcomm %s_allreduce %s %s\n", engine, to_string(t), wrong ? "FAIL" : "ok");
  }
  return failed;
}

int native_rank(const char* dir, int rank, int size) {
  auto kv = file_store::open(dir);
  OR_DIE(kv.ok() ? status() : kv.error());
  auto comm = default_communicator::create(*kv.value(), rank, size);
  OR_DIE(comm.ok() ? status() : comm.error());
  int failed = 0;

  // auto: two ranks on one GPU cannot use NCCL, so native.
  {
    cuda::device_options o;
    o.backend = "auto";
    auto dc = device_comm::create(*comm.value(), o);
    OR_DIE(dc.ok() ? status() : dc.error());
    const bool native = dc.value()->engine() == cuda::gpu_backend::native;
    failed += !native;
    if (rank == 0) std::printf("RESULT devcomm auto_engine_2_ranks_1_gpu %s\n", native ? "ok" : "FAIL");
  }

  cuda::device_options o;
  o.backend = "native";
  o.chunk_bytes = 256u << 10;  // many ragged chunks
  o.slots = 3;
  auto made = device_comm::create(*comm.value(), o);
  OR_DIE(made.ok() ? status() : made.error());
  device_comm& dc = *made.value();
  auto stream = cuda::stream::create();
  OR_DIE(stream.ok() ? status() : stream.error());
  cudaStream_t s = stream.value().get();
  failed += check_all(dc, s, "native", rank, size);

  // Non-blocking: the stream is busy for 300 ms; the call must return long before.
  {
    const std::size_t n = 1u << 20;
    auto buf = cuda::device_buffer::allocate(n * 4);
    OR_DIE(buf.ok() ? status() : buf.error());
    const auto in = gt::input(dtype::float32, n, rank);
    GPU(cudaMemcpyAsync(buf.value().data(), in.data(), n * 4, cudaMemcpyHostToDevice, s));
    GPU(cudaLaunchHostFunc(s, &sleep_300ms, nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    OR_DIE(dc.allreduce(buf.value().data(), buf.value().data(), n, dtype::float32, reduce_op::sum, s));
    const double call_s = seconds_since(t0);
    gt::bytes got(n * 4);
    GPU(cudaMemcpyAsync(got.data(), buf.value().data(), n * 4, cudaMemcpyDeviceToHost, s));
    OR_DIE(dc.synchronize(s));
    const double total_s = seconds_since(t0);
    const bool ok = call_s < 0.1 && total_s >= 0.25 &&
                    gt::wrong_elements(got, gt::reduced(dtype::float32, reduce_op::sum, n, size), dtype::float32) == 0;
    failed += !ok;
    std::printf("RESULT devcomm stream_ordered_returns_early %s (rank %d: call %.1f ms, stream done after %.1f ms)\n",
                ok ? "ok" : "FAIL", rank, call_s * 1e3, total_s * 1e3);
  }

  // Blocking form: routed by where the buffers live.
  {
    const std::size_t n = 100003;
    std::vector<double> host(n);
    const auto in = gt::input(dtype::float64, n, rank);
    std::memcpy(host.data(), in.data(), n * 8);
    auto dev = cuda::device_buffer::allocate(n * 8);
    OR_DIE(dev.ok() ? status() : dev.error());
    GPU(cudaMemcpy(dev.value().data(), in.data(), n * 8, cudaMemcpyHostToDevice));
    bool ok = cuda::route_of(host.data(), host.data()) == cuda::buffer_route::host &&
              cuda::route_of(dev.value().data(), dev.value().data()) == cuda::buffer_route::device &&
              cuda::route_of(host.data(), dev.value().data()) == cuda::buffer_route::mixed;
    OR_DIE(dc.allreduce(host.data(), host.data(), n, dtype::float64, reduce_op::max));
    OR_DIE(dc.allreduce(dev.value().data(), dev.value().data(), n, dtype::float64, reduce_op::max));
    gt::bytes from_dev(n * 8), from_host(n * 8);
    GPU(cudaMemcpy(from_dev.data(), dev.value().data(), n * 8, cudaMemcpyDeviceToHost));
    std::memcpy(from_host.data(), host.data(), n * 8);
    const auto want = gt::reduced(dtype::float64, reduce_op::max, n, size);
    ok = ok && gt::wrong_elements(from_dev, want, dtype::float64) == 0 &&
         gt::wrong_elements(from_host, want, dtype::float64) == 0;
    const status mixed = dc.allreduce(host.data(), dev.value().data(), n, dtype::float64, reduce_op::sum);
    ok = ok && mixed.code() == errc::invalid_argument;
    failed += !ok;
    if (rank == 0 || !ok) std::printf("RESULT devcomm blocking_routes_by_pointer %s\n", ok ? "ok" : "FAIL");
  }

  // 256 MiB float sum, stream-ordered, default 4 x 4 MiB staging.
  {
    cuda::device_options big_o;
    big_o.backend = "native";
    auto big_dc = device_comm::create(*comm.value(), big_o);
    OR_DIE(big_dc.ok() ? status() : big_dc.error());
    const std::size_t big = 256u << 20;
    auto bigbuf = cuda::device_buffer::allocate(big);
    OR_DIE(bigbuf.ok() ? status() : bigbuf.error());
    GPU(cudaMemsetAsync(bigbuf.value().data(), 0, big, s));
    auto once = [&] {
      OR_DIE(big_dc.value()->allreduce(bigbuf.value().data(), bigbuf.value().data(), big / 4, dtype::float32,
                                       reduce_op::sum, s));
    };
    once();
    OR_DIE(big_dc.value()->synchronize(s));
    OR_DIE(comm.value()->barrier());
    const int iters = 5;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) once();
    OR_DIE(big_dc.value()->synchronize(s));
    const double sec = seconds_since(t0) / iters;
    if (rank == 0) {
      const double algbw = double(big) / sec / 1e9;
      std::printf("RESULT devcomm_allreduce_perf %zu %d %.1f %.1f %.1f\n", big, size, sec * 1e6, algbw,
                  algbw * 2.0 * (size - 1) / size);
    }
  }
  return failed;
}

#if defined(CCLITE_HAS_NCCL)
// One process, NCCL engine (NCCL allows one rank per GPU, and there is one GPU).
int nccl_rank(const char* dir) {
  auto kv = file_store::open(dir);
  OR_DIE(kv.ok() ? status() : kv.error());
  auto comm = default_communicator::create(*kv.value(), 0, 1);
  OR_DIE(comm.ok() ? status() : comm.error());
  cuda::device_options o;
  o.backend = "nccl";
  auto made = device_comm::create(*comm.value(), o);
  OR_DIE(made.ok() ? status() : made.error());
  device_comm& dc = *made.value();
  int failed = dc.engine() != cuda::gpu_backend::nccl;
  auto stream = cuda::stream::create();
  OR_DIE(stream.ok() ? status() : stream.error());
  failed += check_all(dc, stream.value().get(), "nccl", 0, 1);
  std::vector<float> host(1000, 2.0f);  // host pointers: the CPU path, even with the NCCL engine
  OR_DIE(dc.allreduce(host.data(), host.data(), host.size(), dtype::float32, reduce_op::sum));
  const bool host_ok = host[0] == 2.0f && host[999] == 2.0f;
  failed += !host_ok;
  std::printf("RESULT devcomm nccl_engine_host_pointer_cpu_path %s\n", host_ok ? "ok" : "FAIL");
  return failed;
}
#endif

}  // namespace

int main() {
  if (!gpu_test::have_device_or_skip("device_comm_gpu")) return 77;
  const int size = 2;
  int bad = gpu_test::in_processes("devcomm", size, [&](const char* dir, int rank) { return native_rank(dir, rank, size); });
  std::printf("RESULT devcomm native_check_ranks %d %s\n", size, bad ? "FAIL" : "ok");
#if defined(CCLITE_HAS_NCCL)
  const int nbad = gpu_test::in_processes("devcomm", 1, [](const char* dir, int) { return nccl_rank(dir); });
  std::printf("RESULT devcomm nccl_check_ranks 1 %s\n", nbad ? "FAIL" : "ok");
  bad += nbad;
#endif
  return bad ? 1 : 0;
}
