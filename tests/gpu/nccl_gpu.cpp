// The NCCL backend (cclite::nccl::backend) on real GPUs; run by tests/gpu/run.sh.
//
//   nccl_gpu check [NRANKS]   every collective x dtype (x op) on device buffers,
//                             NRANKS processes (default 1; NCCL allows one rank per
//                             GPU, so more need more GPUs), met through a file store;
//                             also: a host pointer is invalid_argument
//   nccl_gpu perf [BYTES]     float sum allreduce of BYTES (default 256 MiB), 1 rank:
//                             time per call, algbw, busbw (nccl-tests' definitions)
//   nccl_gpu missing_rank     a 2-rank communicator whose rank 1 never comes: create()
//                             must return timeout after CCLITE_TIMEOUT (set to 5 s
//                             here), having aborted NCCL's init: nothing hangs
//
// Prints "RESULT ..." lines for run.sh's table. Exit codes: 0 ok, 1 failure,
// 77 no CUDA device (skip). Ranks are forked before any CUDA call.
#include <cclite/nccl/backend.hpp>

#include <cclite/bootstrap/file_store.hpp>
#include <cclite/bootstrap/memory_store.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "processes.hpp"
#include "reference.hpp"

using namespace cclite;
namespace gt = cclite::gpu_test;

namespace {


struct dev {
  cuda::device_buffer buf;
  explicit dev(std::size_t bytes) {
    auto b = cuda::device_buffer::allocate(bytes);
    OR_DIE(b.ok() ? status() : b.error());
    buf = std::move(b.value());
  }
  void* get() const { return buf.data(); }
};

void upload(const dev& d, const gt::bytes& h, cudaStream_t s) {
  OR_DIE(cuda::cuda_status(cudaMemcpyAsync(d.get(), h.data(), h.size(), cudaMemcpyHostToDevice, s), "H2D"));
}
gt::bytes download(const dev& d, std::size_t bytes, cudaStream_t s) {
  gt::bytes h(bytes);
  OR_DIE(cuda::cuda_status(cudaMemcpyAsync(h.data(), d.get(), bytes, cudaMemcpyDeviceToHost, s), "D2H"));
  OR_DIE(cuda::cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
  return h;
}
gt::bytes slice(const gt::bytes& b, std::size_t block, std::size_t block_bytes) {
  return gt::bytes(b.begin() + static_cast<std::ptrdiff_t>(block * block_bytes),
                   b.begin() + static_cast<std::ptrdiff_t>((block + 1) * block_bytes));
}

// One rank of `check`: returns the number of failed (collective, dtype) cases.
int check_rank(const std::string& dir, int rank, int size) {
  auto kv = file_store::open(dir);
  OR_DIE(kv.ok() ? status() : kv.error());
  nccl::options o;
  o.timeout = milliseconds(120000);
  auto b = nccl::backend::create(*kv.value(), rank, size, o);
  OR_DIE(b.ok() ? status() : b.error());
  nccl::backend& nc = *b.value();
  auto st = cuda::stream::create();
  OR_DIE(st.ok() ? status() : st.error());
  cudaStream_t s = st.value().get();
  const auto n = static_cast<std::size_t>((1 << 16) + 7);
  const auto un = static_cast<std::size_t>(size);
  int failed = 0;
  auto report = [&](const char* coll, dtype t, std::size_t wrong) {
    if (wrong) ++failed;
    if (rank == 0 || wrong) {
      std::printf("RESULT nccl %s %s %s", coll, to_string(t), wrong ? "FAIL" : "ok");
      if (wrong) std::printf(" (rank %d: %zu wrong)", rank, wrong);
      std::printf("\n");
    }
  };
  for (int ti = 0; ti < dtype_count; ++ti) {
    const auto t = static_cast<dtype>(ti);
    const std::size_t es = size_of(t), bytes = n * es;
    dev in(bytes * un), out(bytes * un);
    // allreduce, reduce, reduce_scatter: every op
    std::size_t w_ar = 0, w_red = 0, w_rs = 0;
    for (int oi = 0; oi < reduce_op_count; ++oi) {
      const auto op = static_cast<reduce_op>(oi);
      upload(in, gt::input(t, n, rank), s);
      OR_DIE(nc.allreduce(in.get(), out.get(), n, t, op, s));
      OR_DIE(nc.synchronize(s));
      w_ar += gt::wrong_elements(download(out, bytes, s), gt::reduced(t, op, n, size), t);
      OR_DIE(nc.reduce(in.get(), out.get(), n, t, op, 0, s));
      OR_DIE(nc.synchronize(s));
      if (rank == 0) w_red += gt::wrong_elements(download(out, bytes, s), gt::reduced(t, op, n, size), t);
      upload(in, gt::input(t, n * un, rank), s);
      OR_DIE(nc.reduce_scatter(in.get(), out.get(), n, t, op, s));
      OR_DIE(nc.synchronize(s));
      w_rs += gt::wrong_elements(download(out, bytes, s),
                                 slice(gt::reduced(t, op, n * un, size), static_cast<std::size_t>(rank), bytes), t);
    }
    report("allreduce", t, w_ar);
    report("reduce", t, w_red);
    report("reduce_scatter", t, w_rs);
    // broadcast from the last rank, in place
    upload(out, gt::input(t, n, rank), s);
    OR_DIE(nc.broadcast(out.get(), out.get(), n, t, size - 1, s));
    OR_DIE(nc.synchronize(s));
    report("broadcast", t, gt::wrong_elements(download(out, bytes, s), gt::input(t, n, size - 1), t));
    // allgather
    upload(in, gt::input(t, n, rank), s);
    OR_DIE(nc.allgather(in.get(), out.get(), n, t, s));
    OR_DIE(nc.synchronize(s));
    gt::bytes want;
    for (int p = 0; p < size; ++p) {
      auto x = gt::input(t, n, p);
      want.insert(want.end(), x.begin(), x.end());
    }
    report("allgather", t, gt::wrong_elements(download(out, bytes * un, s), want, t));
    // alltoall: block p of rank r's send is input(seed r * size + p)
    gt::bytes send, expect;
    for (int p = 0; p < size; ++p) {
      auto x = gt::input(t, n, rank * size + p);
      send.insert(send.end(), x.begin(), x.end());
      auto y = gt::input(t, n, p * size + rank);
      expect.insert(expect.end(), y.begin(), y.end());
    }
    upload(in, send, s);
    OR_DIE(nc.alltoall(in.get(), out.get(), n, t, s));
    OR_DIE(nc.synchronize(s));
    report("alltoall", t, gt::wrong_elements(download(out, bytes * un, s), expect, t));
    // send/recv: a ring shift (to oneself with one rank)
    upload(in, gt::input(t, n, rank), s);
    OR_DIE(nc.sendrecv(in.get(), n, (rank + 1) % size, out.get(), n, (rank + size - 1) % size, t, s));
    OR_DIE(nc.synchronize(s));
    report("sendrecv", t, gt::wrong_elements(download(out, bytes, s), gt::input(t, n, (rank + size - 1) % size), t));
  }
  // Host memory is refused with a clear status, and the backend stays usable.
  std::vector<float> host(16);
  status hs = nc.allreduce(host.data(), host.data(), host.size(), dtype::float32, reduce_op::sum, s);
  const bool host_ok = hs.code() == errc::invalid_argument && hs.message().find("host memory") != std::string::npos;
  if (rank == 0) std::printf("RESULT nccl host_pointer_rejected %s (%s)\n", host_ok ? "ok" : "FAIL", hs.to_string().c_str());
  failed += !host_ok;
  return failed;
}

int run_check(int size) {
  const int bad = gpu_test::in_processes("nccl", size, [&](const char* dir, int r) { return check_rank(dir, r, size); });
  std::printf("RESULT nccl check_ranks %d %s\n", size, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}

int run_perf(std::size_t bytes) {
  memory_store kv;
  auto b = nccl::backend::create(kv, 0, 1);
  OR_DIE(b.ok() ? status() : b.error());
  auto st = cuda::stream::create();
  OR_DIE(st.ok() ? status() : st.error());
  cudaStream_t s = st.value().get();
  dev in(bytes), out(bytes);
  const std::size_t n = bytes / 4;
  auto once = [&] { OR_DIE(b.value()->allreduce(in.get(), out.get(), n, dtype::float32, reduce_op::sum, s)); };
  for (int i = 0; i < 5; ++i) once();
  OR_DIE(b.value()->synchronize(s));
  const int iters = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) once();
  OR_DIE(b.value()->synchronize(s));
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  const int size = b.value()->size();
  const double algbw = double(bytes) / sec / 1e9;
  const double busbw = algbw * 2.0 * (size - 1) / size;
  std::printf("RESULT nccl_allreduce_perf %zu %d %.1f %.1f %.1f\n", bytes, size, sec * 1e6, algbw, busbw);
  return 0;
}

int run_missing_rank() {
  memory_store kv;  // rank 1 never comes: only rank 0 runs
  nccl::options o;
  o.timeout = milliseconds(5000);
  const auto t0 = std::chrono::steady_clock::now();
  auto b = nccl::backend::create(kv, 0, 2, o);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool ok = !b.ok() && b.error().code() == errc::timeout && sec < 30;
  std::printf("RESULT nccl missing_rank %s after %.1f s (%s)\n", ok ? "ok" : "FAIL", sec,
              b.ok() ? "created?!" : b.error().to_string().c_str());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (!gpu_test::have_device_or_skip("nccl_gpu")) return 77;
  std::printf("nccl_gpu: NCCL %s\n", nccl::version_string().c_str());
  if (mode == "check") return run_check(argc > 2 ? std::atoi(argv[2]) : 1);
  if (mode == "perf") return run_perf(argc > 2 ? std::stoull(argv[2]) : (256u << 20));
  if (mode == "missing_rank") return run_missing_rank();
  std::fprintf(stderr, "usage: nccl_gpu check [NRANKS] | perf [BYTES] | missing_rank\n");
  return 2;
}
