// Two processes sharing one GPU through CUDA IPC's building blocks (cclite/cuda/ipc.hpp)
// alone, without the engine; run by tests/gpu/run.sh. The native engine's IPC path
// (cuda/ipc_engine.hpp) is checked by device_comm_gpu; this stays as the baseline
// that tells a broken building block from a broken engine.
//
// Each rank cudaMallocs its input, exports the handle through a file store,
// maps the peer's input and runs a direct allreduce: out = mine op peer's with
// the device kernels (cclite/cuda/reduce_kernels.cuh) reading the peer's memory
// in place. Checked bit for bit for every dtype x op; then timed at 256 MiB
// float sum (busbw = algbw for 2 ranks). The ranks synchronise through an atomic
// counter in shared memory (mapped before fork), so the timing is not the store's.
// Exit codes: 0 ok, 1 failure, 77 no CUDA device (skip).
#include <cclite/bootstrap/file_store.hpp>
#include <cclite/cuda/ipc.hpp>
#include <cclite/cuda/reduce_kernels.cuh>
#include <cclite/cuda/runtime.hpp>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "reference.hpp"

namespace cc = cclite;
namespace gt = cclite::gpu_test;

namespace {

#define GPU(expr) OR_DIE(cc::cuda::cuda_status((expr), #expr))

std::atomic<long>* g_counter = nullptr;

// Both ranks arrive; bounded so a dead peer fails the run instead of hanging it.
void barrier(long& generation) {
  generation += 2;
  g_counter->fetch_add(1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (g_counter->load() < generation) {
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "ipc_gpu: peer did not reach the barrier within 30 s\n");
      std::exit(1);
    }
  }
}

int rank_main(const char* dir, int rank) {
  auto kv = cc::file_store::open(dir);
  OR_DIE(kv.ok() ? cc::status() : kv.error());
  GPU(cudaSetDevice(0));
  cudaStream_t s;
  GPU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::size_t big = 256u << 20;
  void *mine = nullptr, *out = nullptr;
  GPU(cudaMalloc(&mine, big));
  GPU(cudaMalloc(&out, big));
  auto h = cc::cuda::export_memory(mine);
  OR_DIE(h.ok() ? cc::status() : h.error());
  auto all = cc::cuda::exchange_handles(*kv.value(), "ipc/input", rank, 2, h.value(),
                                        cc::deadline::after(cc::milliseconds(60000)));
  OR_DIE(all.ok() ? cc::status() : all.error());
  auto peer = cc::cuda::ipc_mapping::open(all.value()[static_cast<std::size_t>(1 - rank)]);
  OR_DIE(peer.ok() ? cc::status() : peer.error());
  const void* theirs = peer.value().data();
  long gen = 0;
  int failed = 0;

  const std::size_t n = (1u << 18) + 5;
  for (int ti = 0; ti < cc::dtype_count; ++ti) {
    const auto t = static_cast<cc::dtype>(ti);
    const std::size_t bytes = n * cc::size_of(t);
    std::size_t wrong = 0;
    for (int oi = 0; oi < cc::reduce_op_count; ++oi) {
      const auto op = static_cast<cc::reduce_op>(oi);
      const auto in = gt::input(t, n, rank);
      GPU(cudaMemcpyAsync(mine, in.data(), bytes, cudaMemcpyHostToDevice, s));
      GPU(cudaStreamSynchronize(s));
      barrier(gen);  // both inputs written
      // Same order on both ranks (rank 0's input first), so both get the same bits.
      const void* a = rank == 0 ? mine : theirs;
      const void* b = rank == 0 ? theirs : mine;
      GPU(cc::cuda::reduce(out, a, b, n, t, op, 2, s));
      gt::bytes got(bytes);
      GPU(cudaMemcpyAsync(got.data(), out, bytes, cudaMemcpyDeviceToHost, s));
      GPU(cudaStreamSynchronize(s));
      barrier(gen);  // both done reading before either overwrites its input
      wrong += gt::wrong_elements(got, gt::reduced(t, op, n, 2), t);
    }
    failed += wrong != 0;
    if (rank == 0 || wrong) {
      std::printf("RESULT ipc allreduce %s %s\n", cc::to_string(t), wrong ? "FAIL" : "ok");
    }
  }

  // 256 MiB float sum: each iteration = barrier, kernel, stream sync.
  GPU(cudaMemsetAsync(mine, 0, big, s));
  GPU(cudaStreamSynchronize(s));
  const std::size_t elems = big / 4;
  const void* a = rank == 0 ? mine : theirs;
  const void* b = rank == 0 ? theirs : mine;
  auto once = [&] {
    barrier(gen);
    GPU(cc::cuda::reduce(out, a, b, elems, cc::dtype::float32, cc::reduce_op::sum, 0, s));
    GPU(cudaStreamSynchronize(s));
  };
  for (int i = 0; i < 3; ++i) once();
  const int iters = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) once();
  barrier(gen);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  if (rank == 0) {
    const double algbw = double(big) / sec / 1e9;
    std::printf("RESULT ipc_allreduce_perf %zu 2 %.1f %.1f %.1f\n", big, sec * 1e6, algbw, algbw);
  }
  peer.value().reset();
  GPU(cudaFree(mine));
  GPU(cudaFree(out));
  GPU(cudaStreamDestroy(s));
  return failed;
}

}  // namespace

int main() {
  // Probe in a child so the parent stays CUDA-free for fork() (runtime.hpp).
  pid_t probe = ::fork();
  if (probe == 0) ::_exit(cc::cuda::available() ? 0 : 77);
  int st = 0;
  ::waitpid(probe, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::printf("SKIP ipc_gpu: no CUDA device\n");
    return 77;
  }
  void* shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return 1;
  g_counter = new (shared) std::atomic<long>(0);
  char tmpl[] = "/tmp/cclite-ipc-XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  if (!dir) return 1;
  std::fflush(stdout);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = ::fork();
    if (pids[r] == 0) {
      int failed = rank_main(dir, r);
      std::fflush(stdout);
      ::_exit(failed ? 1 : 0);
    }
  }
  int bad = 0;
  for (pid_t p : pids) {
    ::waitpid(p, &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  std::string rm = std::string("rm -rf '") + dir + "'";
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir);
  std::printf("RESULT ipc check_ranks 2 %s\n", bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}
