// allreduce_perf_mpi: allreduce_perf's twin on MPI_Allreduce, the peer that cclite's
// allreduce numbers are printed beside (bench/compare.sh runs both back to back).
//
//   mpirun -np 2 --mca pml ob1 --mca btl self,vader build/bin/allreduce_perf_mpi -b 8 -e 64M -f 4
//   mpirun -np 2 --mca pml ob1 --mca btl self,tcp   build/bin/allreduce_perf_mpi -b 8 -e 64M -f 4
//
// Same flags, loop, timing and columns as allreduce_perf (bench/common/perf_args.hpp):
// warmup, barrier, -n timed calls, time = the slowest rank's mean per call, then one
// checked call on fresh inputs for #wrong; out-of-place and in-place (MPI_IN_PLACE).
// JSON lines (-J) carry "impl":"mpi".
//
// -C sendrecv (or the name sendrecv_perf_mpi): sendrecv_perf's twin instead, the
// ring shift as MPI_Sendrecv (to the next rank, from the previous; in place:
// MPI_Sendrecv_replace), each rank checking that it got its predecessor's input.
// -C allgather | reduce_scatter | alltoall | broadcast | reduce | gather |
// scatter | scan | exscan [-r ROOT]: the twin of that coll_perf program
// (MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Bcast, MPI_Reduce,
// MPI_Gather, MPI_Scatter, MPI_Scan, MPI_Exscan): the same sweep, sizes, inputs and
// checks (common/coll_sweep.hpp), out of place.
//
// dtypes: those MPI has (int8 uint8 int32 uint32 int64 uint64 float double);
// half and bfloat16 are refused (MPI has no standard 16-bit float type).
// ops: sum prod min max; avg is MPI_SUM followed by a local divide by the rank count
// (MPI has no MPI_AVG), so the divide pass is inside the timed call, as it is in cclite.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <cclite/core/clock.hpp>

#include "common/coll_sweep.hpp"
#include "common/perf_args.hpp"
#include "common/perf_check.hpp"
#include "common/perf_sweep.hpp"

namespace {

bool mpi_type(cclite::dtype t, MPI_Datatype& out) {
  using cclite::dtype;
  switch (t) {
    case dtype::int8: out = MPI_INT8_T; return true;
    case dtype::uint8: out = MPI_UINT8_T; return true;
    case dtype::int32: out = MPI_INT32_T; return true;
    case dtype::uint32: out = MPI_UINT32_T; return true;
    case dtype::int64: out = MPI_INT64_T; return true;
    case dtype::uint64: out = MPI_UINT64_T; return true;
    case dtype::float32: out = MPI_FLOAT; return true;
    case dtype::float64: out = MPI_DOUBLE; return true;
    default: return false;  // float16, bfloat16
  }
}

MPI_Op mpi_op(cclite::reduce_op op) {
  using cclite::reduce_op;
  switch (op) {
    case reduce_op::prod: return MPI_PROD;
    case reduce_op::min: return MPI_MIN;
    case reduce_op::max: return MPI_MAX;
    case reduce_op::band: return MPI_BAND;
    case reduce_op::bor: return MPI_BOR;
    case reduce_op::bxor: return MPI_BXOR;
    default: return MPI_SUM;  // sum, and avg (divided afterwards)
  }
}

// avg: the local divide after MPI_SUM (integers truncate, like the expected values).
template <class T>
void divide(void* p, std::size_t count, int n) {
  if constexpr (std::is_arithmetic_v<T>) {  // half/bfloat16 never get here (refused above)
    T* t = static_cast<T*>(p);
    for (std::size_t i = 0; i < count; ++i) t[i] = static_cast<T>(t[i] / static_cast<T>(n));
  }
}

// "Open MPI v4.1.4, ..." -> first line only, and the btl/pml mpirun passed down.
std::string describe_mpi() {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::string s(lib, static_cast<std::size_t>(len));
  s = s.substr(0, s.find_first_of(",\n"));
  for (const char* var : {"OMPI_MCA_pml", "OMPI_MCA_btl"}) {
    if (const char* v = std::getenv(var)) s += std::string(" ") + (var + 9) + "=" + v;
  }
  return s;
}

// What both sweeps need besides their calls: a barrier and the reductions
// of the timing and of the #wrong counts over the ranks.
struct mpi_sweep_sync {
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  void max_over_ranks(double& v) { MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); }
  void sum_over_ranks(std::uint64_t& v) {
    unsigned long long w = v;
    MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    v = w;
  }
};

// The calls of coll_sweep (common/coll_sweep.hpp) on MPI: coll_perf's twin.
struct mpi_coll_ops : mpi_sweep_sync {
  cclite::collective_kind kind;
  MPI_Datatype type;
  MPI_Op op;
  bool avg;
  int root, rank, size;
  void *send, *recv;
  void once(const bench::coll_shape& s) {
    using cclite::collective_kind;
    const int n = static_cast<int>(s.count);
    switch (kind) {
      case collective_kind::allgather: MPI_Allgather(send, n, type, recv, n, type, MPI_COMM_WORLD); return;
      case collective_kind::alltoall: MPI_Alltoall(send, n, type, recv, n, type, MPI_COMM_WORLD); return;
      case collective_kind::broadcast: MPI_Bcast(recv, n, type, root, MPI_COMM_WORLD); return;
      case collective_kind::gather: MPI_Gather(send, n, type, recv, n, type, root, MPI_COMM_WORLD); return;
      case collective_kind::scatter: MPI_Scatter(send, n, type, recv, n, type, root, MPI_COMM_WORLD); return;
      case collective_kind::reduce_scatter: MPI_Reduce_scatter_block(send, recv, n, type, op, MPI_COMM_WORLD); break;
      case collective_kind::scan:  // avg: divided by the ranks in the prefix, as cclite does
        MPI_Scan(send, recv, n, type, op, MPI_COMM_WORLD);
        if (avg) bench::by_dtype(dtype_, [&](auto tag) { divide<decltype(tag)>(recv, s.count, rank + 1); });
        return;
      case collective_kind::exscan:
        MPI_Exscan(send, recv, n, type, op, MPI_COMM_WORLD);
        if (avg && rank > 0) bench::by_dtype(dtype_, [&](auto tag) { divide<decltype(tag)>(recv, s.count, rank); });
        return;
      default: MPI_Reduce(send, recv, n, type, op, root, MPI_COMM_WORLD); if (rank != root) return; break;
    }
    if (avg) bench::by_dtype(dtype_, [&](auto tag) { divide<decltype(tag)>(recv, s.count, size); });
  }
  cclite::dtype dtype_;
};

// -C's collective; false (and a message) for one that has no twin here.
bool pick_collective(const std::string& name, cclite::collective_kind& out) {
  using cclite::collective_kind;
  if (name.empty()) out = collective_kind::allreduce;
  else if (name == "sendrecv") out = collective_kind::sendrecv;
  else if (name == "allgather") out = collective_kind::allgather;
  else if (name == "reduce_scatter") out = collective_kind::reduce_scatter;
  else if (name == "alltoall") out = collective_kind::alltoall;
  else if (name == "broadcast") out = collective_kind::broadcast;
  else if (name == "reduce") out = collective_kind::reduce;
  else if (name == "gather") out = collective_kind::gather;
  else if (name == "scatter") out = collective_kind::scatter;
  else if (name == "scan") out = collective_kind::scan;
  else if (name == "exscan") out = collective_kind::exscan;
  else return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string coll = bench::take_flag(argc, argv, "-C");
  const std::string root_flag = bench::take_flag(argc, argv, "-r");
  if (std::strstr(argv[0], "sendrecv_perf_mpi")) coll = "sendrecv";
  cclite::collective_kind kind;
  if (!pick_collective(coll, kind)) {
    if (rank == 0)
      std::fprintf(stderr, "allreduce_perf_mpi: -C %s: one of sendrecv allgather reduce_scatter alltoall "
                   "broadcast reduce gather scatter scan exscan (or none: allreduce)\n", coll.c_str());
    MPI_Finalize();
    return 2;
  }
  const bool shift = kind == cclite::collective_kind::sendrecv;
  const bool other = kind != cclite::collective_kind::allreduce && !shift;  // coll_sweep's collectives
  const int root = root_flag.empty() ? 0 : std::atoi(root_flag.c_str());
  if (root < 0 || root >= size) {
    if (rank == 0) std::fprintf(stderr, "allreduce_perf_mpi: -r %d: the root must be a rank below %d\n", root, size);
    MPI_Finalize();
    return 2;
  }
  const std::string prog = std::string(cclite::to_string(kind)) + "_perf_mpi";
  auto args = bench::parse_perf_args(argc, argv, prog.c_str());
  if (!args) {
    if (rank == 0) std::fprintf(stderr, "%s\n", args.error().message().c_str());
    MPI_Finalize();
    return 2;
  }
  const bench::perf_args a = args.value();
  MPI_Datatype type;
  if (!mpi_type(a.type, type)) {
    if (rank == 0)
      std::fprintf(stderr,
                   "allreduce_perf_mpi: -d %s: MPI has no standard type for it; use one of int8 "
                   "uint8 int32 uint32 int64 uint64 float double\n",
                   cclite::to_string(a.type));
    MPI_Finalize();
    return 2;
  }
  const MPI_Op op = mpi_op(a.op);
  const bool avg = a.op == cclite::reduce_op::avg;
  const std::size_t esz = cclite::size_of(a.type);
  const std::size_t max_count = a.max_bytes / esz;
  if (max_count > static_cast<std::size_t>(INT32_MAX)) {
    if (rank == 0) std::fprintf(stderr, "allreduce_perf_mpi: -e exceeds MPI's int count\n");
    MPI_Finalize();
    return 2;
  }
  // Buffers allocated and touched once, outside the timed loop (as allreduce_perf).
  // Every collective's largest buffer is at most -e bytes (coll_sweep.hpp shapes).
  std::vector<std::uint8_t> send(max_count * esz + 64), recv(max_count * esz + 64);

  const double busbw_factor = shift || kind == cclite::collective_kind::broadcast ||
                                      kind == cclite::collective_kind::reduce
                                  ? 1.0
                                  : other ? double(size - 1) / size : 2.0 * (size - 1) / size;
  bench::perf_table table(rank == 0, a, cclite::to_string(kind), size, busbw_factor, "mpi");
  const std::string via = describe_mpi();
  table.header(via.c_str());
  if (other) {
    mpi_coll_ops ops{{}, kind, type, op, avg, root, rank, size, send.data(), recv.data(), a.type};
    const std::size_t wrong =
        bench::coll_sweep(a, table, bench::coll_case{kind, size, rank, root}, send.data(), recv.data(), ops);
    MPI_Finalize();
    return wrong == 0 ? 0 : 1;
  }
  // The calls of the sweep (common/perf_sweep.hpp), on MPI.
  struct mpi_ops : mpi_sweep_sync {
    const bench::perf_args& a;
    MPI_Datatype type;
    MPI_Op op;
    bool avg, shift;
    int rank, size;
    std::uint8_t *send, *recv;
    void* out(int in_place) const { return in_place ? send : recv; }
    void once(std::size_t count, int in_place) {
      void* rbuf = out(in_place);
      if (shift) {
        const int next = (rank + 1) % size, prev = (rank + size - 1) % size, n = static_cast<int>(count);
        if (in_place) MPI_Sendrecv_replace(rbuf, n, type, next, 0, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else MPI_Sendrecv(send, n, type, next, 0, rbuf, n, type, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return;
      }
      MPI_Allreduce(in_place ? MPI_IN_PLACE : send, rbuf, static_cast<int>(count), type, op, MPI_COMM_WORLD);
      if (avg) bench::by_dtype(a.type, [&](auto tag) { divide<decltype(tag)>(rbuf, count, size); });
    }
    void drain() {}
    void fill(std::size_t count) {
      bench::by_dtype(a.type, [&](auto tag) { bench::fill<decltype(tag)>(send, count, rank); });
    }
    std::uint64_t wrong(std::size_t count, int in_place) {
      if (shift) {  // the previous rank's input
        return bench::by_dtype(a.type, [&](auto tag) {
          using T = decltype(tag);
          const T* t = reinterpret_cast<const T*>(out(in_place));
          const int prev = (rank + size - 1) % size;
          std::uint64_t bad = 0;
          for (std::size_t i = 0; i < count; ++i)
            if (bench::to_double(t[i]) != bench::to_double(bench::from_double<T>(bench::input(prev, i)))) ++bad;
          return bad;
        });
      }
      return bench::by_dtype(a.type, [&](auto tag) {
        return bench::count_wrong<decltype(tag)>(out(in_place), count, a.op, size);
      });
    }
  } ops{{}, a, type, op, avg, shift, rank, size, send.data(), recv.data()};
  const std::size_t total_wrong = bench::allreduce_sweep(a, table, ops);
  MPI_Finalize();
  return total_wrong == 0 ? 0 : 1;
}
