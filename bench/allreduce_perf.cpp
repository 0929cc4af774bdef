// allreduce_perf: nccl-tests' all_reduce_perf for cclite.
//
//   build/bin/cclite-run --nproc-per-node 2 build/bin/allreduce_perf -b 8 -e 64M -f 4
//
// Flags (as nccl-tests): -b min bytes, -e max bytes, -f size factor, -n iterations,
// -w warmup iterations, -c check (1 = count wrong elements, default 1),
// -d dtype (int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double),
// -o op (sum prod min max avg), -J file (append one JSON object per size);
// cclite only: -a ALGO forces the algorithm (ring tree rd rhd hier direct);
// -R 1 takes both buffers from communicator::alloc_shared() (one node over
// shm), as nccl-tests' -R registers them: in place then runs on the shared
// window, with no staging copies.
// Columns: size (B), count, type, redop, then out-of-place and in-place
// time (us), algbw (GB/s), busbw (GB/s), #wrong. busbw = algbw * 2(n-1)/n,
// comparable to one link's bandwidth (nccl-tests doc/PERFORMANCE.md).
#include <cclite/cclite.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/perf_args.hpp"
#include "common/perf_check.hpp"
#include "common/perf_sweep.hpp"

using namespace bench;

using namespace cclite;


int main(int argc, char** argv) {
  // -a ALGO forces the allreduce algorithm (CCLITE_ALGO=allreduce:ALGO).
  const std::string algo = bench::take_flag(argc, argv, "-a");
  const bool shared = bench::take_flag(argc, argv, "-R") == "1";
  if (!algo.empty()) ::setenv("CCLITE_ALGO", ("allreduce:" + algo).c_str(), 1);
  auto args = bench::parse_perf_args(argc, argv, "allreduce_perf");
  if (!args) {
    std::fprintf(stderr, "%s [-a ring|tree|rd|rhd|hier|direct] [-R 0|1]\n", args.error().message().c_str());
    return 2;
  }
  const bench::perf_args a = args.value();
  auto comm = cclite::init();
  if (!comm) {
    std::fprintf(stderr, "allreduce_perf: %s\n", comm.error().to_string().c_str());
    return 1;
  }
  auto& c = *comm.value();
  const std::size_t esz = size_of(a.type);
  const std::size_t max_count = a.max_bytes / esz;
  // Buffers allocated and touched once, outside the timed loop.
  std::vector<std::uint8_t> send_own, recv_own;
  std::uint8_t *send = nullptr, *recv = nullptr;
  if (shared) {
    auto s = c.alloc_shared(max_count * esz + 64);
    auto r = s ? c.alloc_shared(max_count * esz + 64) : s;
    if (!r) {
      std::fprintf(stderr, "allreduce_perf -R 1: %s\n", r.error().to_string().c_str());
      return 1;
    }
    send = static_cast<std::uint8_t*>(s.value());
    recv = static_cast<std::uint8_t*>(r.value());
  } else {
    send_own.resize(max_count * esz + 64);
    recv_own.resize(max_count * esz + 64);
    send = send_own.data();
    recv = recv_own.data();
  }

  bench::perf_table table(c.rank() == 0, a, "allreduce", c.size(), 2.0 * (c.size() - 1) / c.size());
  table.header(c.transport_of(c.size() > 1 ? c.topo().ring_next(c.rank()) : c.rank()));
  if (shared && c.rank() == 0) std::printf("# buffers from alloc_shared() (-R 1): in place runs on the shared window\n");
  // The calls of the sweep (common/perf_sweep.hpp): blocking, host memory.
  struct host_ops {
    default_communicator& c;
    const bench::perf_args& a;
    std::uint8_t *send, *recv;
    void* out(int in_place) const { return in_place ? send : recv; }
    void once(std::size_t count, int in_place) { check(c.allreduce(send, out(in_place), count, a.type, a.op)); }
    void drain() {}
    void barrier() { check(c.barrier()); }
    void max_over_ranks(double& v) { check(c.allreduce(&v, 1, reduce_op::max)); }
    void sum_over_ranks(std::uint64_t& v) { check(c.allreduce(&v, 1, reduce_op::sum)); }
    void fill(std::size_t count) { by_dtype(a.type, [&](auto tag) { bench::fill<decltype(tag)>(send, count, c.rank()); }); }
    std::uint64_t wrong(std::size_t count, int in_place) {
      return by_dtype(a.type, [&](auto tag) { return count_wrong<decltype(tag)>(out(in_place), count, a.op, c.size()); });
    }
  } ops{c, a, send, recv};
  const std::size_t total_wrong = bench::allreduce_sweep(a, table, ops);
  return total_wrong == 0 ? 0 : 1;
}
