// <collective>_perf: nccl-tests' perf programs for the other collectives.
// One binary, coll_perf, reached under each name (bench/CMakeLists.txt links them):
//   allgather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf sendrecv_perf
//
//   build/bin/cclite-run --nproc-per-node 4 build/bin/allgather_perf -b 8 -e 64M -f 4
//
// Same flags and columns as allreduce_perf, plus -a ALGO (sets CCLITE_ALGO for
// this collective; sendrecv_perf -a group issues each ring shift as a group of
// a send and a recv, as nccl-tests does) and -r ROOT (broadcast, reduce). "size" and busbw follow
// nccl-tests: allgather size = the gathered output, reduce_scatter size = the
// input, alltoall size = one rank's send buffer, all with busbw = algbw (n-1)/n;
// broadcast, reduce and sendrecv use busbw = algbw.
#include <cclite/cclite.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/perf_args.hpp"
#include "common/perf_check.hpp"

using namespace bench;

// Which collective: from the program's name (argv[0] = "<collective>_perf",
// the links bench/CMakeLists.txt makes to one binary; one compile instead of
// six), or -C <collective>.
collective_kind kind = collective_kind::allgather;

namespace {

struct shape {
  std::size_t count;       // elements per call argument
  std::size_t send_elems;  // this rank's send buffer
  std::size_t recv_elems;  // this rank's recv buffer
};

shape shape_for(std::size_t bytes, std::size_t esz, std::size_t n) {
  std::size_t per_rank = bytes / esz / n;
  switch (kind) {
    case collective_kind::allgather: return {per_rank, per_rank, per_rank * n};
    case collective_kind::reduce_scatter: return {per_rank, per_rank * n, per_rank};
    case collective_kind::alltoall: return {per_rank, per_rank * n, per_rank * n};
    default: return {bytes / esz, bytes / esz, bytes / esz};
  }
}

// Expected recv element i on rank `me` of `n`, as a double (inputs: value(rank, i)).
double value(int rank, std::size_t i) { return input(rank, i); }
double want(int me, int n, std::size_t i, std::size_t count, int root, reduce_op op) {
  switch (kind) {
    case collective_kind::allgather: return value(static_cast<int>(i / count), i % count);
    case collective_kind::reduce_scatter: return expected(op, n, me * count + i);
    case collective_kind::alltoall: return value(static_cast<int>(i / count), me * count + i % count);
    case collective_kind::broadcast: return value(root, i);
    case collective_kind::reduce: return expected(op, n, i);
    default: return value((me + n - 1) % n, i);  // sendrecv from the previous rank
  }
}

template <class T>
std::size_t count_wrong(const std::vector<std::uint8_t>& buf, const shape& s, int me, int n, int root,
                        reduce_op op) {
  if (kind == collective_kind::reduce && me != root) return 0;
  const T* t = reinterpret_cast<const T*>(buf.data());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < s.recv_elems; ++i)
    if (to_double(t[i]) != to_double(from_double<T>(want(me, n, i, s.count, root, op)))) ++bad;
  return bad;
}


// The collective named by -C or by argv[0]'s "<collective>_perf" basename.
bool pick_collective(int& argc, char** argv) {
  std::string name = bench::take_flag(argc, argv, "-C");
  if (name.empty()) {
    std::string base = argv[0];
    if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, "_perf") == 0) name = base.substr(0, base.size() - 5);
  }
  for (collective_kind k : {collective_kind::allgather, collective_kind::reduce_scatter, collective_kind::broadcast,
                            collective_kind::reduce, collective_kind::alltoall, collective_kind::sendrecv}) {
    if (name == to_string(k)) {
      kind = k;
      return true;
    }
  }
  std::fprintf(stderr,
               "coll_perf: which collective? run it as allgather_perf, reduce_scatter_perf, broadcast_perf, "
               "reduce_perf, alltoall_perf or sendrecv_perf, or pass -C <collective> (got '%s')\n",
               name.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (!pick_collective(argc, argv)) return 2;
  const std::string algo = bench::take_flag(argc, argv, "-a");
  const std::string root_flag = bench::take_flag(argc, argv, "-r");
  // sendrecv_perf -a group: the ring shift as group_start(), send, recv,
  // group_end(), as nccl-tests' sendrecv_perf issues it (ncclGroupStart ..).
  const bool grouped = kind == collective_kind::sendrecv && algo == "group";
  if (!algo.empty() && !grouped) ::setenv("CCLITE_ALGO", (std::string(to_string(kind)) + ":" + algo).c_str(), 1);
  const std::string prog = std::string(to_string(kind)) + "_perf";
  auto args = parse_perf_args(argc, argv, prog.c_str());
  if (!args) {
    std::fprintf(stderr, "%s [-a ALGO (CCLITE_ALGO for this collective; sendrecv: -a group)] [-r ROOT]\n",
                 args.error().message().c_str());
    return 2;
  }
  const perf_args a = args.value();
  auto comm = cclite::init();
  if (!comm) {
    std::fprintf(stderr, "%s: %s\n", prog.c_str(), comm.error().to_string().c_str());
    return 1;
  }
  auto& c = *comm.value();
  const int n = c.size(), me = c.rank(), root = root_flag.empty() ? 0 : std::atoi(root_flag.c_str());
  const std::size_t esz = size_of(a.type), N = static_cast<std::size_t>(n);
  const shape most = shape_for(a.max_bytes, esz, N);
  std::vector<std::uint8_t> send(most.send_elems * esz + 64), recv(most.recv_elems * esz + 64);
  const bool spread = kind == collective_kind::allgather || kind == collective_kind::reduce_scatter ||
                      kind == collective_kind::alltoall;
  perf_table table(me == 0, a, to_string(kind), n, spread ? double(n - 1) / n : 1.0);
  table.header(c.transport_of(n > 1 ? c.topo().ring_next(me) : me));

  auto once = [&](const shape& s) -> status {
    void* sb = send.data();
    void* rb = recv.data();
    switch (kind) {
      case collective_kind::allgather: return c.allgather(sb, rb, s.count, a.type);
      case collective_kind::reduce_scatter: return c.reduce_scatter(sb, rb, s.count, a.type, a.op);
      case collective_kind::alltoall: return c.alltoall(sb, rb, s.count, a.type);
      case collective_kind::broadcast: return c.broadcast(rb, s.count, a.type, root);
      case collective_kind::reduce: return c.reduce(sb, rb, s.count, a.type, a.op, root);
      default:
        if (!grouped) return c.sendrecv(sb, s.count, (me + 1) % n, rb, s.count, (me + n - 1) % n, a.type);
        c.group_start();
        CCLITE_TRY(c.send(sb, s.count, a.type, (me + 1) % n));
        CCLITE_TRY(c.recv(rb, s.count, a.type, (me + n - 1) % n));
        return c.group_end();
    }
  };
  auto fill = [&](auto tag, const shape& s) {
    using T = decltype(tag);
    T* sb = reinterpret_cast<T*>(send.data());
    T* rb = reinterpret_cast<T*>(recv.data());
    for (std::size_t i = 0; i < s.send_elems; ++i) {
      sb[i] = from_double<T>(value(me, i));  // alltoall: block p holds p*count.. of value()
    }
    if (kind == collective_kind::broadcast)
      for (std::size_t i = 0; i < s.recv_elems; ++i) rb[i] = from_double<T>(me == root ? value(root, i) : -1.0);
  };

  std::size_t total_wrong = 0;
  for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes = next_size(bytes, a)) {
    const shape s = shape_for(bytes, esz, N);
    perf_row row{spread ? s.count * N * esz : s.count * esz, spread ? s.count * N : s.count};
    for (int i = 0; i < a.warmup; ++i) check(once(s));
    check(c.barrier());
    double t0 = now_seconds();
    for (int i = 0; i < a.iters; ++i) check(once(s));
    double us = (now_seconds() - t0) * 1e6 / a.iters;
    check(c.allreduce(&us, 1, reduce_op::max));
    std::size_t wrong = 0;
    if (a.check) {
      by_dtype(a.type, [&](auto tag) { fill(tag, s); });
      check(once(s));
      wrong = by_dtype(a.type, [&](auto tag) { return count_wrong<decltype(tag)>(recv, s, me, n, root, a.op); });
      std::uint64_t w = wrong;
      check(c.allreduce(&w, 1, reduce_op::sum));
      wrong = static_cast<std::size_t>(w);
    }
    total_wrong += wrong;
    row.set(0, us, wrong);
    row.set(1, us, wrong);  // no separate in-place run: both column groups show the same call
    table.print(row);
    if (bytes == a.max_bytes || next_size(bytes, a) <= bytes) break;
  }
  table.footer();
  return total_wrong == 0 ? 0 : 1;
}
