// device_allreduce_perf: nccl-tests' all_reduce_perf on device buffers, through
// cclite::cuda::device_communicator: the NCCL engine beside cclite's native one,
// in the same program, so a GPU run reads the two side by side.
//
//   build/bin/cclite-run --nproc-per-node 2 build/bin/device_allreduce_perf -b 8 -e 256M -f 4 -g native
//   build/bin/cclite-run --nproc-per-node 1 build/bin/device_allreduce_perf -b 8 -e 256M -f 4 -g nccl
//
// Flags as allreduce_perf (-b -e -f -i -n -w -c -d -o -J), plus -g nccl|native|auto
// (the engine; default CCLITE_GPU_BACKEND, else auto), -I 0 (native engine:
// stage through pinned host memory instead of CUDA IPC) and -I 1 (CUDA IPC at
// every size; by default ranks sharing a GPU without MPS stage calls under
// 1 MiB, device_options::ipc_min_bytes). Each rank uses the GPU
// device_communicator picks (local rank modulo the device count: two ranks may
// share one GPU on the native engine; NCCL wants one GPU per rank).
// Time: `iters` calls enqueued back to back on one stream, then synchronize(), by
// the wall clock, the slowest rank's (nccl-tests likewise times its launches and
// a stream synchronize). The header names the engine and path ("ipc",
// "staged", "nccl"). #wrong: the result copied back and checked as allreduce_perf
// does (inputs rank + i % 3, exact in every dtype).
// Without a GPU: the "no CUDA device" status on stderr and exit code 77 (skip).
#include <cclite/cclite.hpp>
#include <cclite/cuda/device_communicator.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "common/perf_args.hpp"
#include "common/perf_check.hpp"
#include "common/perf_sweep.hpp"

using namespace cclite;
using device_comm = cuda::device_communicator<default_communicator>;

int main(int argc, char** argv) {
  const std::string engine = bench::take_flag(argc, argv, "-g");
  const std::string ipc = bench::take_flag(argc, argv, "-I");
  auto args = bench::parse_perf_args(argc, argv, "device_allreduce_perf");
  if (!args) {
    std::fprintf(stderr, "%s [-g nccl|native|auto] [-I 0|1]\n", args.error().message().c_str());
    return 2;
  }
  const bench::perf_args a = args.value();
  auto env = cclite::init();
  if (!env) {
    std::fprintf(stderr, "device_allreduce_perf: %s\n", env.error().to_string().c_str());
    return 1;
  }
  default_communicator& c = *env.value();
  cuda::device_options o;
  if (!engine.empty()) o.backend = engine.c_str();
  o.ipc = ipc != "0";
  if (ipc == "1") o.ipc_min_bytes = 0;
  auto made = device_comm::create(c, o);
  if (!made) {  // every rank answers the same, before any collective
    std::fprintf(stderr, "device_allreduce_perf rank %d: %s\n", c.rank(), made.error().to_string().c_str());
    return made.error().code() == errc::unsupported ? 77 : 1;
  }
  device_comm& dc = *made.value();
  auto s = cuda::stream::create();
  const std::size_t esz = size_of(a.type);
  const std::size_t max_count = a.max_bytes / esz;
  auto send = cuda::device_buffer::allocate(max_count * esz + 64);
  auto recv = cuda::device_buffer::allocate(max_count * esz + 64);
  for (const status& st : {s ? status() : s.error(), send ? status() : send.error(), recv ? status() : recv.error()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "device_allreduce_perf rank %d: %s\n", c.rank(), st.to_string().c_str());
      return 1;
    }
  }
  const cudaStream_t stream = s.value().get();
  std::vector<unsigned char> host(max_count * esz + 64);

  // "impl" in the header and the JSON lines: nccl, or cclite-ipc / cclite-staged.
  const std::string impl = std::string(dc.path()) == "nccl" ? "nccl" : std::string("cclite-") + dc.path();
  const std::string what = std::string(dc.path()) + " path, GPU " + std::to_string(dc.device());
  bench::perf_table table(c.rank() == 0, a, "device_allreduce", c.size(), 2.0 * (c.size() - 1) / c.size(),
                          impl.c_str());
  table.header(what.c_str());
  // The calls of the sweep (common/perf_sweep.hpp): enqueued on one stream,
  // drained by synchronize(); the check's data goes through `host`.
  struct device_ops {
    device_comm& dc;
    default_communicator& c;
    const bench::perf_args& a;
    cudaStream_t stream;
    void *send, *recv;
    std::vector<unsigned char>& host;
    void* out(int in_place) const { return in_place ? send : recv; }
    void once(std::size_t count, int in_place) { check(dc.allreduce(send, out(in_place), count, a.type, a.op, stream)); }
    void drain() { check(dc.synchronize(stream)); }
    void barrier() { check(c.barrier()); }
    void max_over_ranks(double& v) { check(c.allreduce(&v, 1, reduce_op::max)); }
    void sum_over_ranks(std::uint64_t& v) { check(c.allreduce(&v, 1, reduce_op::sum)); }
    // The copies go on `stream` and are waited for: a cudaMemcpy from pageable
    // memory may return before its DMA lands, and `stream` is non-blocking, so
    // the next call could read the previous contents (seen on an H200).
    void copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind) {
      check(cuda::cuda_status(cudaMemcpyAsync(to, from, bytes, kind, stream), "cudaMemcpyAsync"));
      check(cuda::cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    }
    void fill(std::size_t count) {
      bench::by_dtype(a.type, [&](auto tag) { bench::fill<decltype(tag)>(host.data(), count, c.rank()); });
      copy(send, host.data(), count * size_of(a.type), cudaMemcpyHostToDevice);
    }
    std::uint64_t wrong(std::size_t count, int in_place) {
      copy(host.data(), out(in_place), count * size_of(a.type), cudaMemcpyDeviceToHost);
      return bench::by_dtype(a.type, [&](auto tag) {
        return bench::count_wrong<decltype(tag)>(host.data(), count, a.op, c.size());
      });
    }
  } ops{dc, c, a, stream, send.value().data(), recv.value().data(), host};
  const std::size_t total_wrong = bench::allreduce_sweep(a, table, ops);
  return total_wrong == 0 ? 0 : 1;
}
