// bench/common/perf_sweep.hpp - the size sweep of the allreduce perf programs
// (allreduce_perf, allreduce_perf_mpi, device_allreduce_perf): one loop, each
// program supplies its calls.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>

#include "common/perf_args.hpp"
#include "common/perf_check.hpp"

namespace bench {

/// For every size of `a`, out of place then in place: `warmup` calls, a
/// barrier, `iters` timed calls (the slowest rank's mean), and with -c 1 one
/// more call on known inputs whose wrong elements are summed over the ranks;
/// one table row per size. Returns the wrong elements of every size. `ops`:
///   once(count, in_place)      enqueue or run one allreduce of `count` elements
///   drain()                    wait until the calls so far are complete
///   barrier()
///   max_over_ranks(double&), sum_over_ranks(std::uint64_t&)
///   fill(count)                this rank's known input (bench::fill) into send
///   wrong(count, in_place)     wrong elements of the result (bench::count_wrong)
template <class Ops>
std::size_t allreduce_sweep(const perf_args& a, perf_table& table, Ops& ops) {
  const std::size_t esz = cclite::size_of(a.type);
  std::size_t total_wrong = 0;
  for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes = next_size(bytes, a)) {
    const std::size_t count = bytes / esz;
    perf_row row{count * esz, count};
    for (int in_place = 0; in_place < 2; ++in_place) {
      for (int i = 0; i < a.warmup; ++i) ops.once(count, in_place);
      ops.drain();
      ops.barrier();
      const double t0 = cclite::now_seconds();
      for (int i = 0; i < a.iters; ++i) ops.once(count, in_place);
      ops.drain();
      double us = (cclite::now_seconds() - t0) * 1e6 / a.iters;
      ops.max_over_ranks(us);  // the slowest rank sets the time
      std::uint64_t wrong = 0;
      if (a.check) {
        ops.fill(count);
        ops.once(count, in_place);
        ops.drain();
        wrong = ops.wrong(count, in_place);
        ops.sum_over_ranks(wrong);
      }
      total_wrong += static_cast<std::size_t>(wrong);
      row.set(in_place, us, static_cast<std::size_t>(wrong));
    }
    table.print(row);
    if (bytes == a.max_bytes || next_size(bytes, a) <= bytes) break;
  }
  table.footer();
  return total_wrong;
}

}  // namespace bench
