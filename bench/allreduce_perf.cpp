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
  std::size_t total_wrong = 0;
  for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes = bench::next_size(bytes, a)) {
    const std::size_t count = bytes / esz;
    bench::perf_row row{count * esz, count};
    for (int in_place = 0; in_place < 2; ++in_place) {
      void* sbuf = send;
      void* rbuf = in_place ? send : recv;
      auto once = [&] { return c.allreduce(sbuf, rbuf, count, a.type, a.op); };
      for (int i = 0; i < a.warmup; ++i) check(once());
      check(c.barrier());
      double t0 = now_seconds();
      for (int i = 0; i < a.iters; ++i) check(once());
      double us = (now_seconds() - t0) * 1e6 / a.iters;
      check(c.allreduce(&us, 1, reduce_op::max));  // the slowest rank sets the time
      std::size_t wrong = 0;
      if (a.check) {
        by_dtype(a.type, [&](auto tag) { fill<decltype(tag)>(sbuf, count, c.rank()); });
        check(once());
        wrong = by_dtype(a.type, [&](auto tag) {
          return count_wrong<decltype(tag)>(rbuf, count, a.op, c.size());
        });
        std::uint64_t w = wrong;
        check(c.allreduce(&w, 1, reduce_op::sum));
        wrong = static_cast<std::size_t>(w);
      }
      total_wrong += wrong;
      row.set(in_place, us, wrong);
    }
    table.print(row);
    if (bytes == a.max_bytes || bench::next_size(bytes, a) <= bytes) break;
  }
  table.footer();
  return total_wrong == 0 ? 0 : 1;
}
