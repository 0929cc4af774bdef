// <collective>_perf: nccl-tests' perf programs for the other collectives.
// One binary, coll_perf, reached under each name (bench/CMakeLists.txt links them):
//   allgather_perf reduce_scatter_perf broadcast_perf reduce_perf alltoall_perf sendrecv_perf
//   gather_perf scatter_perf
//
//   build/bin/cclite-run --nproc-per-node 4 build/bin/allgather_perf -b 8 -e 64M -f 4
//
// Same flags and columns as allreduce_perf, plus -a ALGO (sets CCLITE_ALGO for
// this collective; sendrecv_perf -a group issues each ring shift as a group of
// a send and a recv, as nccl-tests does) and -r ROOT (broadcast, reduce, gather,
// scatter). Sizes,
// busbw, inputs and checks: common/coll_sweep.hpp, shared with the MPI twin
// (allreduce_perf_mpi -C <collective>, bench/compare.sh -C).
#include <cclite/cclite.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/coll_sweep.hpp"
#include "common/perf_args.hpp"
#include "common/perf_check.hpp"

using namespace bench;

// Which collective: from the program's name (argv[0] = "<collective>_perf",
// the links bench/CMakeLists.txt makes to one binary; one compile instead of
// six), or -C <collective>.
collective_kind kind = collective_kind::allgather;

namespace {

// The collective named by -C or by argv[0]'s "<collective>_perf" basename.
bool pick_collective(int& argc, char** argv) {
  std::string name = bench::take_flag(argc, argv, "-C");
  if (name.empty()) {
    std::string base = argv[0];
    if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, "_perf") == 0) name = base.substr(0, base.size() - 5);
  }
  for (collective_kind k : {collective_kind::allgather, collective_kind::reduce_scatter, collective_kind::broadcast,
                            collective_kind::reduce, collective_kind::alltoall, collective_kind::sendrecv,
                            collective_kind::gather, collective_kind::scatter, collective_kind::scan,
                            collective_kind::exscan}) {
    if (name == to_string(k)) {
      kind = k;
      return true;
    }
  }
  std::fprintf(stderr,
               "coll_perf: which collective? run it as allgather_perf, reduce_scatter_perf, broadcast_perf, "
               "reduce_perf, alltoall_perf, sendrecv_perf, gather_perf, scatter_perf, scan_perf or exscan_perf, or "
               "pass -C <collective> "
               "(got '%s')\n",
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
  const coll_shape most = shape_for(kind, a.max_bytes, esz, N);
  std::vector<std::uint8_t> send(most.send_elems * esz + 64), recv(most.recv_elems * esz + 64);
  perf_table table(me == 0, a, to_string(kind), n, spread(kind) ? double(n - 1) / n : 1.0);
  table.header(c.transport_of(n > 1 ? c.topo().ring_next(me) : me));

  // The calls of the sweep (common/coll_sweep.hpp), on the communicator.
  struct cclite_ops {
    decltype(c)& comm;
    const perf_args& a;
    int n, me, root;
    bool grouped;
    void *sb, *rb;
    void once(const coll_shape& s) { check(call(s)); }
    status call(const coll_shape& s) {
      switch (kind) {
        case collective_kind::allgather: return comm.allgather(sb, rb, s.count, a.type);
        case collective_kind::reduce_scatter: return comm.reduce_scatter(sb, rb, s.count, a.type, a.op);
        case collective_kind::alltoall: return comm.alltoall(sb, rb, s.count, a.type);
        case collective_kind::broadcast: return comm.broadcast(rb, s.count, a.type, root);
        case collective_kind::reduce: return comm.reduce(sb, rb, s.count, a.type, a.op, root);
        case collective_kind::gather: return comm.gather(sb, rb, s.count, a.type, root);
        case collective_kind::scatter: return comm.scatter(sb, rb, s.count, a.type, root);
        case collective_kind::scan: return comm.scan(sb, rb, s.count, a.type, a.op);
        case collective_kind::exscan: return comm.exscan(sb, rb, s.count, a.type, a.op);
        default:
          if (!grouped) return comm.sendrecv(sb, s.count, (me + 1) % n, rb, s.count, (me + n - 1) % n, a.type);
          comm.group_start();
          CCLITE_TRY(comm.send(sb, s.count, a.type, (me + 1) % n));
          CCLITE_TRY(comm.recv(rb, s.count, a.type, (me + n - 1) % n));
          return comm.group_end();
      }
    }
    void barrier() { check(comm.barrier()); }
    void max_over_ranks(double& v) { check(comm.allreduce(&v, 1, reduce_op::max)); }
    void sum_over_ranks(std::uint64_t& v) { check(comm.allreduce(&v, 1, reduce_op::sum)); }
  } ops{c, a, n, me, root, grouped, send.data(), recv.data()};
  const std::size_t total_wrong = coll_sweep(a, table, coll_case{kind, n, me, root}, send.data(), recv.data(), ops);
  return total_wrong == 0 ? 0 : 1;
}
