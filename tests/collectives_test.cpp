// Multi-process tests of reduce, allgather(v), reduce_scatter(v), alltoall(v) (also in place),
// gather(v), scatter(v), send/recv and sendrecv over real shm and loopback TCP, on
// 1..5 ranks, with counts 0, 1, 7, a prime above the 4 KiB test chunk, and
// every dtype for the reducing ones. Each rank checks against a reference it
// computes itself; inputs are small integers so every result is exact.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
using cclite::test::net;

namespace {

// Element i of rank r's contribution (|v| <= 2, exact in every dtype).
double value(int rank, std::size_t i) { return static_cast<double>(static_cast<int>((i * 7 + rank * 3 + i / 11) % 5) - 2); }

template <class T>
T as(double v) {
  if constexpr (std::is_same_v<T, half>) return to_half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bfloat16>) return to_bfloat16(static_cast<float>(v));
  else if constexpr (std::is_unsigned_v<T>) return static_cast<T>(v + 2);
  else return static_cast<T>(v);
}

template <class T>
std::vector<T> contribution(int rank, std::size_t count, std::size_t shift = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = as<T>(value(rank, i + shift));
  return v;
}

// The reduction of all ranks' contributions, computed with the library's own
// kernel in rank order (exact inputs make the order irrelevant).
template <class T>
std::vector<T> reduced(int size, std::size_t count, reduce_op op, std::size_t shift = 0) {
  reduction red = reduction_for(dtype_of_v<T>, op);
  std::vector<T> acc = contribution<T>(0, count, shift);
  for (int r = 1; r < size; ++r) {
    std::vector<T> x = contribution<T>(r, count, shift);
    red.inplace(acc.data(), x.data(), count);
  }
  if (red.needs_divide) red.divide(acc.data(), count, size);
  return acc;
}

template <class T>
bool same(const T* a, const T* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(T)) == 0;
}

const std::size_t counts[] = {0, 1, 7, 1031};

template <class T>
int check_reductions(default_communicator& c) {
  const int n = c.size(), me = c.rank();
  const dtype t = dtype_of_v<T>;
  int bad = 0;
  for (std::size_t count : counts) {
    for (int o = 0; o < reduce_op_count; ++o) {
      const auto op = static_cast<reduce_op>(o);
      if (!applies_to(op, t)) {  // a bitwise op on a floating dtype: refused, the communicator goes on
        std::vector<T> x(n * (count + 1));
        bad += c.reduce(x.data(), x.data(), count, t, op, 0).code() != errc::invalid_argument;
        bad += c.reduce_scatter(x.data(), x.data(), count, t, op).code() != errc::invalid_argument;
        const std::vector<std::size_t> rc(static_cast<std::size_t>(n), count);
        bad += c.reduce_scatterv(x.data(), x.data(), rc.data(), t, op).code() != errc::invalid_argument;
        bad += c.scan(x.data(), x.data(), count, t, op).code() != errc::invalid_argument;
        bad += c.exscan_async(x.data(), x.data(), count, t, op).wait().code() != errc::invalid_argument;
        continue;
      }
      // reduce to every root; non-roots' recv must stay untouched
      for (int root = 0; root < n; ++root) {
        std::vector<T> send = contribution<T>(me, count), recv(count, as<T>(1));
        MP_REQUIRE_OK(c.reduce(send.data(), recv.data(), count, t, op, root));
        std::vector<T> want = me == root ? reduced<T>(n, count, op) : std::vector<T>(count, as<T>(1));
        if (!same(recv.data(), want.data(), count)) {
          std::fprintf(stderr, "rank %d: reduce %s %s count %zu root %d wrong\n", me, to_string(t), to_string(op), count, root);
          ++bad;
        }
      }
      // reduce_scatter, out of place and in place
      std::vector<T> send(count * static_cast<std::size_t>(n));
      for (int b = 0; b < n; ++b) {
        auto blk = contribution<T>(me, count, static_cast<std::size_t>(b) * 1000);
        std::copy(blk.begin(), blk.end(), send.begin() + static_cast<std::ptrdiff_t>(b * count));
      }
      std::vector<T> want = reduced<T>(n, count, op, static_cast<std::size_t>(me) * 1000);
      std::vector<T> recv(count);
      MP_REQUIRE_OK(c.reduce_scatter(send.data(), recv.data(), count, t, op));
      if (!same(recv.data(), want.data(), count)) {
        std::fprintf(stderr, "rank %d: reduce_scatter %s %s count %zu wrong\n", me, to_string(t), to_string(op), count);
        ++bad;
      }
      T* mine = send.data() + static_cast<std::size_t>(me) * count;
      MP_REQUIRE_OK(c.reduce_scatter(send.data(), mine, count, t, op));
      if (!same(mine, want.data(), count)) {
        std::fprintf(stderr, "rank %d: in-place reduce_scatter %s %s count %zu wrong\n", me, to_string(t), to_string(op), count);
        ++bad;
      }
      // reduce_scatterv: blocks of different lengths (one rank's empty when
      // n > 1), back to back; out of place (dtype form), then in place (typed).
      {
        std::vector<std::size_t> rc(static_cast<std::size_t>(n)), at(static_cast<std::size_t>(n) + 1);
        for (int b = 0; b < n; ++b) {
          const std::size_t ub = static_cast<std::size_t>(b);
          rc[ub] = b % 3 == 1 ? 0 : count + ub * 3;
          at[ub + 1] = at[ub] + rc[ub];
        }
        std::vector<T> vsend(at.back() + 1);
        for (int b = 0; b < n; ++b) {
          const std::size_t ub = static_cast<std::size_t>(b);
          auto blk = contribution<T>(me, rc[ub], ub * 1000);
          std::copy(blk.begin(), blk.end(), vsend.begin() + static_cast<std::ptrdiff_t>(at[ub]));
        }
        const std::size_t um = static_cast<std::size_t>(me);
        const std::vector<T> vwant = reduced<T>(n, rc[um], op, um * 1000);
        std::vector<T> vrecv(rc[um] + 1, as<T>(1));
        MP_REQUIRE_OK(c.reduce_scatterv(vsend.data(), vrecv.data(), rc.data(), t, op));
        MP_REQUIRE_OK(c.reduce_scatterv(static_cast<const T*>(vsend.data()), vsend.data() + at[um], rc.data(), op));
        if (!same(vrecv.data(), vwant.data(), rc[um]) || !same(vsend.data() + at[um], vwant.data(), rc[um]) ||
            !same(vrecv.data() + rc[um], std::vector<T>(1, as<T>(1)).data(), 1)) {
          std::fprintf(stderr, "rank %d: reduce_scatterv %s %s count %zu wrong\n", me, to_string(t), to_string(op),
                       count);
          ++bad;
        }
      }
      // scan and exscan: the reduction over ranks 0..me (exscan: 0..me-1; rank
      // 0's recv is not written), out of place (dtype form), in place (typed).
      {
        const std::vector<T> x = contribution<T>(me, count), untouched(count, as<T>(1));
        const std::vector<T> inc = reduced<T>(me + 1, count, op);
        const std::vector<T> exc = me ? reduced<T>(me, count, op) : untouched;
        std::vector<T> s = untouched, e = untouched, si = x, ei = x;
        MP_REQUIRE_OK(c.scan(x.data(), s.data(), count, t, op));
        MP_REQUIRE_OK(c.exscan(x.data(), e.data(), count, t, op));
        MP_REQUIRE_OK(c.scan(static_cast<const T*>(si.data()), si.data(), count, op));
        MP_REQUIRE_OK(c.exscan(static_cast<const T*>(ei.data()), ei.data(), count, op));
        if (!same(s.data(), inc.data(), count) || !same(e.data(), exc.data(), count) ||
            !same(si.data(), inc.data(), count) || !same(ei.data(), (me ? exc : x).data(), count)) {
          std::fprintf(stderr, "rank %d: scan / exscan %s %s count %zu wrong\n", me, to_string(t), to_string(op), count);
          ++bad;
        }
      }
      // The typed forms (T* buffers) carry T's kernels alone instead of
      // every dtype's (collective/op.hpp, kernel_lookup): the same bits.
      for (int b = 0; b < n; ++b) {  // the in-place call above overwrote block `me`
        auto blk = contribution<T>(me, count, static_cast<std::size_t>(b) * 1000);
        std::copy(blk.begin(), blk.end(), send.begin() + static_cast<std::ptrdiff_t>(b * count));
      }
      std::vector<T> typed_rs(count);
      MP_REQUIRE_OK(c.reduce_scatter(static_cast<const T*>(send.data()), typed_rs.data(), count, op));
      std::vector<T> all = contribution<T>(me, count), typed_ar(count, as<T>(1));
      const std::vector<T> want_all = reduced<T>(n, count, op);
      MP_REQUIRE_OK(c.allreduce(all.data(), typed_ar.data(), count, op));
      MP_REQUIRE_OK(c.allreduce(all.data(), count, op));
      std::vector<T> typed_red(count, as<T>(1));
      MP_REQUIRE_OK(c.reduce(contribution<T>(me, count).data(), typed_red.data(), count, op, n - 1));
      if (!same(typed_rs.data(), want.data(), count) || !same(typed_ar.data(), want_all.data(), count) ||
          !same(all.data(), want_all.data(), count) ||
          (me == n - 1 && !same(typed_red.data(), want_all.data(), count))) {
        std::fprintf(stderr, "rank %d: typed reduce_scatter / allreduce / reduce %s %s count %zu wrong\n", me,
                     to_string(t), to_string(op), count);
        ++bad;
      }
    }
  }
  return bad;
}

int check_data_movement(default_communicator& c) {
  const int n = c.size(), me = c.rank();
  const std::size_t N = static_cast<std::size_t>(n);
  int bad = 0;
  auto tagged = [](int rank, std::size_t i) { return static_cast<std::uint32_t>(rank * 1000003u + i); };
  for (std::size_t count : counts) {
    // broadcast from every root (the chain, or the tree rotated onto the root)
    for (int root = 0; root < n; ++root) {
      std::vector<std::uint32_t> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = me == root ? tagged(root, i) : 0;
      MP_REQUIRE_OK(c.broadcast(buf.data(), count, dtype::uint32, root));
      for (std::size_t i = 0; i < count; ++i) bad += buf[i] != tagged(root, i);
    }
    std::vector<std::uint32_t> mine(count), all(count * N), want(count * N);
    for (std::size_t i = 0; i < count; ++i) mine[i] = tagged(me, i);
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i) want[static_cast<std::size_t>(r) * count + i] = tagged(r, i);
    // allgather, out of place and in place
    MP_REQUIRE_OK(c.allgather(mine.data(), all.data(), count, dtype::uint32));
    bad += !same(all.data(), want.data(), all.size());
    std::vector<std::uint32_t> inplace(count * N, 0);
    std::copy(mine.begin(), mine.end(), inplace.begin() + static_cast<std::ptrdiff_t>(me * count));
    MP_REQUIRE_OK(c.allgather(inplace.data() + me * count, inplace.data(), count, dtype::uint32));
    bad += !same(inplace.data(), want.data(), inplace.size());
    // gather and scatter, every root
    for (int root = 0; root < n; ++root) {
      std::vector<std::uint32_t> g(count * N, 7);
      MP_REQUIRE_OK(c.gather(mine.data(), g.data(), count, dtype::uint32, root));
      if (me == root) bad += !same(g.data(), want.data(), g.size());
      std::vector<std::uint32_t> s(count, 0);
      MP_REQUIRE_OK(c.scatter(want.data(), s.data(), count, dtype::uint32, root));
      std::vector<std::uint32_t> expect(count);
      for (std::size_t i = 0; i < count; ++i) expect[i] = tagged(me, i);
      bad += !same(s.data(), expect.data(), count);
    }
    // alltoall: block r of rank me's send = (me, r, i)
    std::vector<std::uint32_t> a_send(count * N), a_recv(count * N), a_want(count * N);
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i) {
        a_send[static_cast<std::size_t>(r) * count + i] = tagged(me * 64 + r, i);
        a_want[static_cast<std::size_t>(r) * count + i] = tagged(r * 64 + me, i);
      }
    MP_REQUIRE_OK(c.alltoall(a_send.data(), a_recv.data(), count, dtype::uint32));
    bad += !same(a_recv.data(), a_want.data(), a_recv.size());
    // in place (MPI_IN_PLACE): the same blocks swapped inside one buffer
    MP_REQUIRE_OK(c.alltoall(a_send.data(), a_send.data(), count, dtype::uint32));
    bad += !same(a_send.data(), a_want.data(), a_send.size());
  }
  if (bad) std::fprintf(stderr, "rank %d: %d data-movement checks failed\n", me, bad);
  return bad;
}

int check_v_and_p2p(default_communicator& c) {
  const int n = c.size(), me = c.rank();
  const std::size_t N = static_cast<std::size_t>(n);
  int bad = 0;
  // allgatherv: rank r contributes 3r+1 elements (last one 5000: several rounds)
  std::vector<std::size_t> cnt(N), dsp(N);
  std::size_t total = 0;
  for (std::size_t r = 0; r < N; ++r) {
    cnt[r] = r + 1 == N ? 5000 : 3 * r + 1;
    dsp[r] = total + 2;  // gaps between blocks stay untouched
    total += cnt[r] + 2;
  }
  std::vector<std::int64_t> mine(cnt[static_cast<std::size_t>(me)]), out(total + 2, -1), want(total + 2, -1);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = me * 100000 + static_cast<std::int64_t>(i);
  for (std::size_t r = 0; r < N; ++r)
    for (std::size_t i = 0; i < cnt[r]; ++i) want[dsp[r] + i] = static_cast<std::int64_t>(r) * 100000 + static_cast<std::int64_t>(i);
  MP_REQUIRE_OK(c.allgatherv(mine.data(), mine.size(), out.data(), cnt.data(), dsp.data(), dtype::int64));
  bad += !same(out.data(), want.data(), out.size());
  // alltoallv: me sends (me + r) % 3 * 100 + 1 elements to r
  std::vector<std::size_t> sc(N), sd(N), rc(N), rd(N);
  std::size_t st = 0, rt = 0;
  for (std::size_t r = 0; r < N; ++r) {
    sc[r] = (static_cast<std::size_t>(me) + r) % 3 * 100 + 1;
    rc[r] = (r + static_cast<std::size_t>(me)) % 3 * 100 + 1;
    sd[r] = st;
    rd[r] = rt;
    st += sc[r];
    rt += rc[r];
  }
  std::vector<float> vs(st), vr(rt, -1), vw(rt);
  for (std::size_t r = 0; r < N; ++r) {
    for (std::size_t i = 0; i < sc[r]; ++i) vs[sd[r] + i] = static_cast<float>(me * 1000 + static_cast<int>(r) * 10) + static_cast<float>(i % 7);
    for (std::size_t i = 0; i < rc[r]; ++i) vw[rd[r] + i] = static_cast<float>(static_cast<int>(r) * 1000 + me * 10) + static_cast<float>(i % 7);
  }
  MP_REQUIRE_OK(c.alltoallv(vs.data(), sc.data(), sd.data(), vr.data(), rc.data(), rd.data(), dtype::float32));
  bad += !same(vr.data(), vw.data(), vr.size());
  // alltoallv in place: the recv counts (symmetric here) and displs both ways
  std::vector<float> vi(rt);
  for (std::size_t r = 0; r < N; ++r)
    for (std::size_t i = 0; i < rc[r]; ++i) vi[rd[r] + i] = static_cast<float>(me * 1000 + static_cast<int>(r) * 10) + static_cast<float>(i % 7);
  MP_REQUIRE_OK(c.alltoallv(vi.data(), nullptr, nullptr, vi.data(), rc.data(), rd.data(), dtype::float32));
  bad += !same(vi.data(), vw.data(), vi.size());
  // gatherv / scatterv, every root: counts that differ per rank and root (some 0, some several
  // 4 KiB chunks), blocks laid out in reverse rank order with gaps; the other ranks pass no
  // arrays and no root-side buffer, as MPI allows. The last root gathers in place, async.
  for (int root = 0; root < n; ++root) {
    const bool is_root = me == root, last = root == n - 1;
    std::vector<std::size_t> gc(N), gd(N);
    std::size_t gt = 3;
    for (std::size_t r = N; r-- > 0;) {
      gc[r] = (r * 37 + static_cast<std::size_t>(root)) % 4 * 1500 + r % 2;
      gd[r] = gt;
      gt += gc[r] + 3;
    }
    auto tag = [](std::size_t r, std::size_t i) { return static_cast<std::int32_t>(r * 1000003 + i); };
    const std::size_t mc = gc[static_cast<std::size_t>(me)];
    std::vector<std::int32_t> own(mc), got(gt, -7), expect(gt, -7);
    for (std::size_t i = 0; i < mc; ++i) own[i] = tag(static_cast<std::size_t>(me), i);
    for (std::size_t r = 0; r < N; ++r)
      for (std::size_t i = 0; i < gc[r]; ++i) expect[gd[r] + i] = tag(r, i);
    if (is_root && last) {  // in place: the root's block already sits at recv + displs[root]
      std::copy(own.begin(), own.end(), got.begin() + static_cast<std::ptrdiff_t>(gd[static_cast<std::size_t>(me)]));
      MP_REQUIRE_OK(c.gatherv_async(got.data() + gd[static_cast<std::size_t>(me)], mc, got.data(), gc.data(),
                                    gd.data(), dtype::int32, root).wait(std::chrono::seconds(60)));
    } else if (last) {
      MP_REQUIRE_OK(c.gatherv_async(own.data(), mc, nullptr, nullptr, nullptr, dtype::int32, root)
                        .wait(std::chrono::seconds(60)));
    } else {
      MP_REQUIRE_OK(c.gatherv(own.data(), mc, is_root ? got.data() : nullptr, is_root ? gc.data() : nullptr,
                              is_root ? gd.data() : nullptr, dtype::int32, root));
    }
    if (is_root) bad += !same(got.data(), expect.data(), gt);
    // scatterv: the root's laid-out blocks back to their ranks
    std::vector<std::int32_t> back(mc + 1, -9);
    MP_REQUIRE_OK(c.scatterv(is_root ? expect.data() : nullptr, is_root ? gc.data() : nullptr,
                             is_root ? gd.data() : nullptr, back.data(), mc, dtype::int32, root));
    bad += !same(back.data(), own.data(), mc) || back[mc] != -9;
  }
  // in-place alltoall of blocks larger than the communicator's scratch (moved in pieces)
  {
    const std::size_t count = 20011;
    std::vector<std::uint32_t> big(count * N);
    for (std::size_t r = 0; r < N; ++r)
      for (std::size_t i = 0; i < count; ++i) big[r * count + i] = static_cast<std::uint32_t>(me * 7000003 + r * 100003 + i);
    MP_REQUIRE_OK(c.alltoall(big.data(), big.data(), count, dtype::uint32));
    for (std::size_t r = 0; r < N; ++r)
      for (std::size_t i = 0; i < count; ++i)
        bad += big[r * count + i] != static_cast<std::uint32_t>(static_cast<std::size_t>(r) * 7000003 + static_cast<std::size_t>(me) * 100003 + i);
  }
  // sendrecv around the ring with 3 MiB (several FIFOs' worth), then send/recv pairs
  if (n > 1) {
    const std::size_t big = 3u << 20;
    std::vector<std::uint8_t> out8(big), in8(big);
    for (std::size_t i = 0; i < big; ++i) out8[i] = static_cast<std::uint8_t>(i * 31 + me);
    const int to = (me + 1) % n, from = (me + n - 1) % n;
    MP_REQUIRE_OK(c.sendrecv(out8.data(), big, to, in8.data(), big, from, dtype::uint8));
    for (std::size_t i = 0; i < big; i += 4099) bad += in8[i] != static_cast<std::uint8_t>(i * 31 + from);
    if (me % 2 == 0 && me + 1 < n) {
      MP_REQUIRE_OK(c.send(out8.data(), 1000, dtype::uint8, me + 1));
      MP_REQUIRE_OK(c.recv(in8.data(), 1000, dtype::uint8, me + 1));
      bad += in8[999] != static_cast<std::uint8_t>(999 * 31 + me + 1);
    } else if (me % 2 == 1) {
      MP_REQUIRE_OK(c.recv(in8.data(), 1000, dtype::uint8, me - 1));
      bad += in8[999] != static_cast<std::uint8_t>(999 * 31 + me - 1);
      MP_REQUIRE_OK(c.send(out8.data(), 1000, dtype::uint8, me - 1));
    }
  }
  if (bad) std::fprintf(stderr, "rank %d: %d v/p2p checks failed\n", me, bad);
  return bad;
}

void run(int size, net how, bool all_dtypes, const char* algo = "") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      size,
      [&](int rank, int sz) {
        auto kv = test::open_dir_store(dir.path);
        comm_options o;
        o.chunk_bytes = 4096;
        auto c = test::make_comm(*kv, rank, sz, o);
        int bad = check_data_movement(*c) + check_v_and_p2p(*c) + check_reductions<float>(*c) +
                  check_reductions<std::int32_t>(*c);
        if (all_dtypes) {
          bad += check_reductions<std::int8_t>(*c) + check_reductions<std::uint8_t>(*c) +
                 check_reductions<std::uint32_t>(*c) + check_reductions<std::int64_t>(*c) +
                 check_reductions<std::uint64_t>(*c) + check_reductions<half>(*c) +
                 check_reductions<bfloat16>(*c) + check_reductions<double>(*c);
        }
        MP_CHECK(bad == 0);
        MP_REQUIRE_OK(c->barrier());
        return 0;
      },
      std::chrono::seconds(240), [&](int rank) {
        test::set_net_env(how, rank, size);
        ::setenv("CCLITE_ALGO", algo, 1);
      });
  INFO("size ", size, " net ", test::to_string(how), " CCLITE_ALGO=", algo, ": ", r.describe());
  CHECK(r.all_ok());
}

}  // namespace

TEST_CASE("collectives: 1 rank") { run(1, net::shm_only, true); }
TEST_CASE("collectives: 2 ranks, shm, every dtype") { run(2, net::shm_only, true); }
TEST_CASE("collectives: 3 ranks, tcp") { run(3, net::tcp_only, false); }
TEST_CASE("collectives: 4 ranks, mixed (2 fake nodes), every dtype") { run(4, net::mixed, true); }
TEST_CASE("collectives: 5 ranks, shm") { run(5, net::shm_only, false); }

namespace {

// Whether this process maps the node-wide small group (shm-direct's "-small-"
// segments, built by the first call that takes the small path).
bool maps_small_group() {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) found = std::strstr(line, "/cclite-") && std::strstr(line, "-small-");
  std::fclose(f);
  return found;
}

// One rank's checks of every collective at the small path's limit (what one
// rank writes into its slot: 1024 bytes) and one element past it (the links),
// in place and out of place, every root. float: 256 elements fill the slot of
// allgather, broadcast, reduce and gather; reduce_scatter, alltoall and
// scatter write every rank's block, 1024 / (4 n) elements each.
int check_small_limits(default_communicator& c) {
  const int n = c.size(), me = c.rank();
  const std::size_t N = static_cast<std::size_t>(n);
  int bad = 0;
  auto fail = [&](const char* what, std::size_t count, int root) {
    std::fprintf(stderr, "rank %d of %d: small-path %s count %zu root %d wrong\n", me, n, what, count, root);
    ++bad;
  };
  auto tagged = [](int rank, std::size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i % 1000)); };
  for (std::size_t count : {std::size_t{256}, std::size_t{257}}) {
    // allgather, out of place and in place
    std::vector<float> mine(count), all(count * N), want(count * N);
    for (std::size_t i = 0; i < count; ++i) mine[i] = tagged(me, i);
    for (std::size_t i = 0; i < count * N; ++i) want[i] = tagged(static_cast<int>(i / count), i % count);
    MP_REQUIRE_OK(c.allgather(mine.data(), all.data(), count, dtype::float32));
    if (all != want) fail("allgather", count, -1);
    std::fill(all.begin(), all.end(), -1.0f);
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me) * count));
    MP_REQUIRE_OK(c.allgather(all.data() + static_cast<std::size_t>(me) * count, all.data(), count, dtype::float32));
    if (all != want) fail("in-place allgather", count, -1);
    for (int root = 0; root < n; ++root) {
      std::vector<float> buf(count, -1.0f), ref(count);
      for (std::size_t i = 0; i < count; ++i) ref[i] = tagged(root, i);
      if (me == root) buf = ref;
      MP_REQUIRE_OK(c.broadcast(buf.data(), count, dtype::float32, root));
      if (buf != ref) fail("broadcast", count, root);
      std::vector<float> red(count, -1.0f), sum(count);
      for (std::size_t i = 0; i < count; ++i) {
        sum[i] = 0;
        for (int r = 0; r < n; ++r) sum[i] += tagged(r, i);
      }
      MP_REQUIRE_OK(c.reduce(mine.data(), red.data(), count, dtype::float32, reduce_op::sum, root));
      if (red != (me == root ? sum : std::vector<float>(count, -1.0f))) fail("reduce", count, root);
      std::vector<float> got(count * N, -1.0f);
      MP_REQUIRE_OK(c.gather(mine.data(), got.data(), count, dtype::float32, root));
      if (me == root && got != want) fail("gather", count, root);
    }
  }
  // Blocks of every rank: the slot is count x n floats.
  const std::size_t fit = 1024 / (4 * N);
  for (std::size_t count : {fit, fit + 1}) {
    std::vector<float> send(count * N), recv(count * N, -1.0f), want(count * N);
    for (std::size_t i = 0; i < count * N; ++i) send[i] = tagged(me, i);
    // alltoall: block p of rank q lands as block q on rank p; in place too
    for (std::size_t i = 0; i < count * N; ++i) want[i] = tagged(static_cast<int>(i / count), me * count + i % count);
    MP_REQUIRE_OK(c.alltoall(send.data(), recv.data(), count, dtype::float32));
    if (recv != want) fail("alltoall", count, -1);
    std::vector<float> inplace = send;
    MP_REQUIRE_OK(c.alltoall(inplace.data(), inplace.data(), count, dtype::float32));
    if (inplace != want) fail("in-place alltoall", count, -1);
    // reduce_scatter: this rank's block of the sum, out of place and in place
    std::vector<float> rs(count, -1.0f), rs_want(count, 0.0f);
    for (std::size_t i = 0; i < count; ++i)
      for (int r = 0; r < n; ++r) rs_want[i] += tagged(r, me * count + i);
    MP_REQUIRE_OK(c.reduce_scatter(send.data(), rs.data(), count, dtype::float32, reduce_op::sum));
    if (rs != rs_want) fail("reduce_scatter", count, -1);
    inplace = send;
    float* block = inplace.data() + static_cast<std::size_t>(me) * count;
    MP_REQUIRE_OK(c.reduce_scatter(inplace.data(), block, count, dtype::float32, reduce_op::sum));
    if (!std::equal(rs_want.begin(), rs_want.end(), block)) fail("in-place reduce_scatter", count, -1);
    for (int root = 0; root < n; ++root) {  // scatter: the root's block `me`
      std::vector<float> part(count, -1.0f), part_want(count);
      for (std::size_t i = 0; i < count; ++i) part_want[i] = tagged(root, me * count + i);
      MP_REQUIRE_OK(c.scatter(me == root ? send.data() : nullptr, part.data(), count, dtype::float32, root));
      if (part != part_want) fail("scatter", count, root);
    }
  }
  return bad;
}

}  // namespace

// shm-direct's small path (shm/direct.hpp "Small calls") carries every
// collective whose slot fits 1 KiB on one node; past that the links do. The
// results must be the same either way, and the first call of a kind other than
// allreduce must be able to build the node-wide group.
TEST_CASE("collectives: shm-direct's small path for every collective, at its limit and past it, 2..4 ranks") {
  for (int size : {2, 3, 4}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        size,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          MP_CHECK(!maps_small_group());
          int bad = check_small_limits(*c);
          MP_CHECK(maps_small_group());  // built by the first allgather, no allreduce before
          MP_CHECK(bad == 0);
          MP_REQUIRE_OK(c->barrier());
          return 0;
        },
        std::chrono::seconds(120), [&](int rank) { test::set_net_env(net::shm_only, rank, size); });
    INFO(size, " ranks: ", r.describe());
    CHECK(r.all_ok());
  }
}

// The root of a small broadcast or scatter, the other ranks of a small
// reduce or gather, and rank 0 of a scan leave without waiting
// (shm/detail/direct_small.hpp, "Eager calls"), at most one call ahead: their
// next call waits until everyone has made this one, so that nobody rewrites a
// slot another rank has still to read. Runs of calls by the same early
// leaver, ranks that fall behind now and then, and data that changes every
// call show any slot rewritten too soon as a wrong value. The last call's
// root closes at once.
TEST_CASE("collectives: small rooted calls whose root leaves early, in runs, every value checked, 2..4 ranks") {
  for (int size : {2, 3, 4}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        size,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          const std::size_t N = static_cast<std::size_t>(sz), count = 8;
          auto value = [](int iter, int r, std::size_t i) {
            return static_cast<float>(iter * 64 + r * 8 + static_cast<int>(i));
          };
          int bad = 0;
          for (int iter = 0; iter < 4000; ++iter) {
            const int root = (iter / 8) % sz;  // runs of 8 calls with one root
            if (iter % 61 == rank) std::this_thread::sleep_for(std::chrono::microseconds(300));  // fall behind
            std::vector<float> mine(count), buf(count * N, -1.0f);
            for (std::size_t i = 0; i < count; ++i) mine[i] = value(iter, rank, i);
            switch ((iter / 4) % 5) {  // runs of 4 calls of one kind
              case 0: {  // broadcast: the root leaves early
                std::vector<float> b(count);
                for (std::size_t i = 0; i < count; ++i) b[i] = rank == root ? value(iter, root, i) : -1.0f;
                MP_REQUIRE_OK(c->broadcast(b.data(), count, dtype::float32, root));
                for (std::size_t i = 0; i < count; ++i) bad += b[i] != value(iter, root, i);
                break;
              }
              case 1: {  // reduce: the others leave early
                MP_REQUIRE_OK(c->reduce(mine.data(), buf.data(), count, dtype::float32, reduce_op::sum, root));
                for (std::size_t i = 0; rank == root && i < count; ++i) {
                  float want = 0;
                  for (int q = 0; q < sz; ++q) want += value(iter, q, i);
                  bad += buf[i] != want;
                }
                break;
              }
              case 2: {  // scatter: the root leaves early; block q of the root goes to rank q
                std::vector<float> all(count * N), part(count, -1.0f);
                for (std::size_t i = 0; i < count * N; ++i)
                  all[i] = value(iter, root, i) + 1000.0f * static_cast<float>(i / count);
                MP_REQUIRE_OK(c->scatter(rank == root ? all.data() : nullptr, part.data(), count, dtype::float32, root));
                for (std::size_t i = 0; i < count; ++i)
                  bad += part[i] != value(iter, root, rank * count + i) + 1000.0f * static_cast<float>(rank);
                break;
              }
              case 3: {  // gather: the others leave early
                MP_REQUIRE_OK(c->gather(mine.data(), buf.data(), count, dtype::float32, root));
                for (std::size_t i = 0; rank == root && i < count * N; ++i)
                  bad += buf[i] != value(iter, static_cast<int>(i / count), i % count);
                break;
              }
              default: {  // scan, exscan: rank 0 leaves early
                const bool ex = iter % 2;
                MP_REQUIRE_OK(ex ? c->exscan(mine.data(), buf.data(), count, dtype::float32, reduce_op::sum)
                                 : c->scan(mine.data(), buf.data(), count, dtype::float32, reduce_op::sum));
                for (std::size_t i = 0; i < count; ++i) {
                  float want = 0;
                  for (int q = 0; q < rank + !ex; ++q) want += value(iter, q, i);
                  bad += buf[i] != (ex && rank == 0 ? -1.0f : want);
                }
                break;
              }
            }
          }
          if (bad) std::fprintf(stderr, "rank %d of %d: %d wrong values\n", rank, sz, bad);
          MP_CHECK(bad == 0);
          // The last call: its root closes at once, the others still read its slot.
          float last[count];
          for (std::size_t i = 0; i < count; ++i) last[i] = rank == 0 ? value(9999, 0, i) : -1.0f;
          MP_REQUIRE_OK(c->broadcast(last, count, dtype::float32, 0));
          if (rank == 0) return 0;  // and the communicator with it
          for (std::size_t i = 0; i < count; ++i) MP_CHECK(last[i] == value(9999, 0, i));
          return 0;
        },
        std::chrono::seconds(120), [&](int rank) { test::set_net_env(net::shm_only, rank, size); });
    INFO(size, " ranks: ", r.describe());
    CHECK(r.all_ok());
  }
}

// Outputs of ring_stream_output_min_bytes (16 MiB) and more are written with
// non-temporal stores (primitives.hpp): allgather, allgatherv and the
// pairwise alltoall, out of place, just past the threshold; in place stays on
// ordinary stores. Every element is checked.
TEST_CASE("collectives: outputs past the streaming threshold, allgather(v) and alltoall, shm and tcp") {
  for (net how : {net::shm_only, net::tcp_only}) {
    const int size = how == net::shm_only ? 2 : 3;
    test::temp_dir dir;
    auto r = test::run_ranks(
        size,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          const std::size_t N = static_cast<std::size_t>(sz);
          const std::size_t count = ring_stream_output_min_bytes / 4 / N + 1001;  // output just past 16 MiB
          auto tagged = [](std::size_t r, std::size_t i) { return static_cast<std::uint32_t>(r * 100000007u + i * 3u); };
          std::vector<std::uint32_t> mine(count), all(count * N, 0), want(count * N);
          for (std::size_t i = 0; i < count; ++i) mine[i] = tagged(static_cast<std::size_t>(rank), i);
          for (std::size_t i = 0; i < count * N; ++i) want[i] = tagged(i / count, i % count);
          MP_REQUIRE_OK(c->allgather(mine.data(), all.data(), count, dtype::uint32));
          MP_CHECK(all == want);
          // allgatherv: the last rank gives 1000 fewer, one gap element between blocks
          std::vector<std::size_t> cnt(N, count), dsp(N);
          cnt[N - 1] -= 1000;
          for (std::size_t q = 0; q < N; ++q) dsp[q] = q * (count + 1);
          std::vector<std::uint32_t> v(N * (count + 1), 7), vwant(v.size(), 7);
          for (std::size_t q = 0; q < N; ++q)
            for (std::size_t i = 0; i < cnt[q]; ++i) vwant[dsp[q] + i] = tagged(q, i);
          MP_REQUIRE_OK(c->allgatherv(mine.data(), cnt[static_cast<std::size_t>(rank)], v.data(), cnt.data(), dsp.data(),
                                      dtype::uint32));
          MP_CHECK(v == vwant);
          // alltoall: block p of rank q lands as block q on rank p
          std::vector<std::uint32_t> send(count * N), recv(count * N, 0), a_want(count * N);
          for (std::size_t p = 0; p < N; ++p)
            for (std::size_t i = 0; i < count; ++i) {
              send[p * count + i] = tagged(static_cast<std::size_t>(rank) * 16 + p, i);
              a_want[p * count + i] = tagged(p * 16 + static_cast<std::size_t>(rank), i);
            }
          MP_REQUIRE_OK(c->alltoall(send.data(), recv.data(), count, dtype::uint32));
          MP_CHECK(recv == a_want);
          MP_REQUIRE_OK(c->barrier());
          return 0;
        },
        std::chrono::seconds(180), [&](int rank) { test::set_net_env(how, rank, size); });
    INFO(test::to_string(how), ", ", size, " ranks: ", r.describe());
    CHECK(r.all_ok());
  }
}

// Large rooted calls, point-to-point messages and pairwise exchanges over
// tcp, where the links' direct windows (transport/direct.hpp) carry them
// between the sockets and the caller's buffers: a 300 KiB threshold and 256 KiB rings, so windows are
// longer than the ring and begin after read-ahead staged part of them. 3 ranks
// make a chain with a middle rank forwarding out of its output; the tree's
// pieces (a chunk: a quarter of the ring) stay staged, its calls still mix
// both. Every root, odd counts, every value checked, then the same with
// windows off (CCLITE_TCP_DIRECT=0) as the reference path. Then 2 fake nodes
// (ranks 0, 1 | 2): sendrecv and alltoall pair a tcp window with an shm FIFO
// (rank 0 receives through a window, rank 1 sends through one), and the
// chain's middle rank, shm in and tcp out (root 0) or the reverse (root 2),
// stays staged beside windows elsewhere. A sendrecv whose directions differ in
// size pairs a window with a FIFO on tcp alone.
TEST_CASE("collectives: large broadcast, gather, scatter, reduce, send/recv, sendrecv and alltoall over tcp and mixed links, direct windows on and off") {
  struct layout {
    net how;
    const char* direct;
  };
  for (const layout lay : {layout{net::tcp_only, "300K"}, layout{net::tcp_only, "0"}, layout{net::mixed, "300K"}}) {
    const char* direct = lay.direct;
    for (const char* algo : {"ring", "broadcast:tree,reduce:tree"}) {
      test::temp_dir dir;
      auto r = test::run_ranks(
          3,
          [&](int rank, int sz) {
            auto kv = test::open_dir_store(dir.path);
            auto c = test::make_comm(*kv, rank, sz);
            const std::size_t N = static_cast<std::size_t>(sz), me = static_cast<std::size_t>(rank);
            const std::size_t count = (5u << 20) / 4 + 3;
            const std::size_t b = count / 2;  // gather / scatter / alltoall blocks (2.5 MiB)
            auto tagged = [](std::size_t q, std::size_t i) { return static_cast<std::uint32_t>(q * 2654435761u + i * 7u); };
            int bad = 0;
            for (int root = 0; root < sz; ++root) {
              const std::size_t R = static_cast<std::size_t>(root);
              std::vector<std::uint32_t> buf(count, 0);
              if (rank == root)
                for (std::size_t i = 0; i < count; ++i) buf[i] = tagged(R, i);
              MP_REQUIRE_OK(c->broadcast(buf.data(), count, dtype::uint32, root));
              for (std::size_t i = 0; i < count; ++i) bad += buf[i] != tagged(R, i);
              // gather / scatter: blocks of b elements
              std::vector<std::uint32_t> mine(b), all(b * N, 0), back(b, 0);
              for (std::size_t i = 0; i < b; ++i) mine[i] = tagged(me + 10, i);
              MP_REQUIRE_OK(c->gather(mine.data(), rank == root ? all.data() : nullptr, b, dtype::uint32, root));
              if (rank == root)
                for (std::size_t i = 0; i < b * N; ++i) bad += all[i] != tagged(i / b + 10, i % b);
              MP_REQUIRE_OK(c->scatter(rank == root ? all.data() : nullptr, back.data(), b, dtype::uint32, root));
              bad += back != mine;  // every block went to the root and back
              std::vector<std::uint32_t> red(count, 0);
              MP_REQUIRE_OK(c->reduce(buf.data(), red.data(), count, dtype::uint32, reduce_op::sum, root));
              if (rank == root)
                for (std::size_t i = 0; i < count; ++i) bad += red[i] != static_cast<std::uint32_t>(3 * tagged(R, i));
            }
            // send / recv around the ring, one way, then back
            std::vector<std::uint32_t> out(count), in(count, 0);
            for (std::size_t i = 0; i < count; ++i) out[i] = tagged(me + 20, i);
            const int next = (rank + 1) % sz, prev = (rank + sz - 1) % sz;
            if (rank == 0) {
              MP_REQUIRE_OK(c->send(out.data(), count, dtype::uint32, next));
              MP_REQUIRE_OK(c->recv(in.data(), count, dtype::uint32, prev));
            } else {
              MP_REQUIRE_OK(c->recv(in.data(), count, dtype::uint32, prev));
              MP_REQUIRE_OK(c->send(out.data(), count, dtype::uint32, next));
            }
            for (std::size_t i = 0; i < count; ++i) bad += in[i] != tagged(static_cast<std::size_t>(prev) + 20, i);
            // sendrecv: both directions' windows open at once, on two links
            std::fill(in.begin(), in.end(), 0u);
            MP_REQUIRE_OK(c->sendrecv(out.data(), count, next, in.data(), count, prev, dtype::uint32));
            for (std::size_t i = 0; i < count; ++i) bad += in[i] != tagged(static_cast<std::size_t>(prev) + 20, i);
            // sendrecv, one direction small: rank 1 sends 100 elements, the
            // others the whole buffer (rank 1 receives large and sends small,
            // rank 2 the reverse)
            auto shift_count = [&](int r) { return r == 1 ? std::size_t{100} : count; };
            std::fill(in.begin(), in.end(), 0u);
            MP_REQUIRE_OK(c->sendrecv(out.data(), shift_count(rank), next, in.data(), shift_count(prev), prev,
                                      dtype::uint32));
            for (std::size_t i = 0; i < count; ++i)
              bad += in[i] != (i < shift_count(prev) ? tagged(static_cast<std::size_t>(prev) + 20, i) : 0u);
            // alltoall: pairwise exchanges of 2.5 MiB blocks
            std::vector<std::uint32_t> a_out(b * N), a_in(b * N, 0);
            for (std::size_t q = 0; q < N; ++q)
              for (std::size_t i = 0; i < b; ++i) a_out[q * b + i] = tagged(me * 16 + q + 40, i);
            MP_REQUIRE_OK(c->alltoall(a_out.data(), a_in.data(), b, dtype::uint32));
            for (std::size_t q = 0; q < N; ++q)
              for (std::size_t i = 0; i < b; ++i) bad += a_in[q * b + i] != tagged(q * 16 + me + 40, i);
            if (bad) std::fprintf(stderr, "rank %d: %d values wrong\n", rank, bad);
            MP_CHECK(bad == 0);
            MP_REQUIRE_OK(c->barrier());
            return 0;
          },
          std::chrono::seconds(180), [&](int rank) {
            test::set_net_env(lay.how, rank, 3);
            ::setenv("CCLITE_TCP_DIRECT", direct, 1);
            ::setenv("CCLITE_TCP_BUFFSIZE", "256K", 1);
            ::setenv("CCLITE_ALGO", algo, 1);
          });
      INFO(test::to_string(lay.how), ", CCLITE_TCP_DIRECT=", std::string(direct), " CCLITE_ALGO=", std::string(algo),
           ": ", r.describe());
      CHECK(r.all_ok());
    }
  }
}

// Small scans on 3 or more ranks take recursive doubling (the runs above);
// the chain forced for them too.
TEST_CASE("collectives: the chain forced for small scans, 4 ranks, mixed (2 fake nodes)") {
  run(4, net::mixed, false, "scan:ring,exscan:ring");
}

TEST_CASE("collectives: binary tree forced for broadcast and reduce, 2..7 ranks") {
  run(2, net::tcp_only, false, "tree");
  run(4, net::mixed, true, "broadcast:tree,reduce:tree");
  run(7, net::shm_only, false, "tree");
}

// scan and exscan of 12 MiB per rank, past the links' 4 MiB buffers, so the
// chain pipelines; over shm, tcp, and two fake nodes holding the ranks
// alternately (the ring goes 0, 2, 1, 3: the chain connects links of its own).
// Values are small integers in float: every prefix is exact, and avg's
// quotient is the one the test computes.
// (Its name, and the forced chain's above, match collectives_verbs_emulated's
// filter in tests/verbs/verbs.cmake: both run over the emulated HCA too.)
TEST_CASE("collectives: scan and exscan past the link buffers over shm, tcp and mixed nodes (ranks interleaved)") {
  const std::size_t count = 3u << 20;
  for (net how : {net::shm_only, net::tcp_only, net::mixed}) {
    const int size = how == net::tcp_only ? 3 : 4;
    test::temp_dir dir;
    auto r = test::run_ranks(
        size,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          auto x_of = [](int q, std::size_t i) {
            return static_cast<float>((i * 13 + static_cast<std::size_t>(q) * 7) % 64);
          };
          std::vector<float> x(count), inc(count), exc(count), avg(count);
          for (std::size_t i = 0; i < count; ++i) {
            x[i] = x_of(rank, i);
            float s = 0;
            for (int q = 0; q < rank; ++q) s += x_of(q, i);
            exc[i] = s;
            inc[i] = s + x[i];
            avg[i] = inc[i] / static_cast<float>(rank + 1);
          }
          std::vector<float> s(count, -1.0f), e(count, -1.0f), a(count, -1.0f), ip = x;
          work ws = c->scan_async(x.data(), s.data(), count, dtype::float32, reduce_op::sum);
          work we = c->exscan_async(x.data(), e.data(), count, dtype::float32, reduce_op::sum);
          MP_REQUIRE_OK(ws.wait());
          MP_REQUIRE_OK(we.wait());
          MP_REQUIRE_OK(c->scan(x.data(), a.data(), count, dtype::float32, reduce_op::avg));
          MP_REQUIRE_OK(c->exscan(static_cast<const float*>(ip.data()), ip.data(), count));
          MP_CHECK(s == inc);
          MP_CHECK(rank == 0 ? e == std::vector<float>(count, -1.0f) : e == exc);
          MP_CHECK(a == avg);
          MP_CHECK(ip == (rank == 0 ? x : exc));
          MP_REQUIRE_OK(c->barrier());
          return 0;
        },
        std::chrono::seconds(180), [&](int rank) {
          test::set_net_env(how, rank, size);
          if (how == net::mixed) ::setenv("CCLITE_HOSTID", rank % 2 ? "fake-node-b" : "fake-node-a", 1);
        });
    INFO(test::to_string(how), ", ", size, " ranks: ", r.describe());
    CHECK(r.all_ok());
  }
}

// split(): even and odd ranks in reverse key order, one rank left out, then
// per-node and one-per-node communicators over two fake nodes; each child runs
// collectives of its own while the parent stays usable.
TEST_CASE("collectives: split by color and key") {
  const int size = 5;
  test::temp_dir dir;
  auto r = test::run_ranks(
      size,
      [&](int rank, int sz) {
        auto kv = test::open_dir_store(dir.path);
        auto c = test::make_comm(*kv, rank, sz);
        const int color = rank == 4 ? default_communicator::no_color : rank % 2;
        auto sub = c->split(color, -rank);
        MP_REQUIRE_OK(sub);
        if (rank == 4) {
          MP_CHECK(sub.value() == nullptr);
        } else {
          auto& s = *sub.value();
          const int members = 2;  // {0, 2} and {1, 3}
          MP_CHECK(s.size() == members);
          MP_CHECK(s.rank() == (rank < 2 ? 1 : 0));  // key = -rank: the higher rank comes first
          std::int64_t x = rank, sum = 0;
          MP_REQUIRE_OK(s.allreduce(&x, &sum, 1, reduce_op::sum));
          MP_CHECK(sum == (rank % 2 == 0 ? 0 + 2 : 1 + 3));
          std::int32_t b = s.rank() == 0 ? rank : -1;
          MP_REQUIRE_OK(s.broadcast(&b, 1, 0));
          MP_CHECK(b == (rank % 2 == 0 ? 2 : 3));
        }
        // Node-local and cross-node communicators (fake nodes: ranks 0-2, 3-4).
        auto node = c->split(c->node_index(), rank);
        auto cross = c->split(c->local_rank(), rank);
        MP_REQUIRE_OK(node);
        MP_REQUIRE_OK(cross);
        MP_CHECK(node.value()->size() == c->local_size());
        MP_CHECK(cross.value()->size() == (c->local_rank() < 2 ? 2 : 1));
        for (int p = 0; p < node.value()->size(); ++p)
          if (p != node.value()->rank()) MP_CHECK(std::string(node.value()->transport_of(p)) == "shm");
        std::int32_t one = 1, n_nodes = 0;
        MP_REQUIRE_OK(cross.value()->allreduce(&one, &n_nodes, 1, reduce_op::sum));
        MP_CHECK(n_nodes == cross.value()->size());
        std::int32_t all = 1, total = 0;
        MP_REQUIRE_OK(c->allreduce(&all, &total, 1, reduce_op::sum));  // the parent still works
        MP_CHECK(total == size);
        return 0;
      },
      std::chrono::seconds(120), [&](int rank) { test::set_net_env(net::mixed, rank, size); });
  INFO(r.describe());
  CHECK(r.all_ok());
}

// Overlapping send and recv buffers that are not a call's in-place form would
// read bytes the call already overwrote: refused on the calling rank, which
// stays usable. The in-place forms themselves run in the cases above. Every
// case here overlaps on every rank (an error on some ranks only would leave
// the others waiting in the call), except the rooted ones, which only the
// root checks (the others never read or write that buffer): those run on a
// communicator of one rank.
TEST_CASE("collectives: overlapping send and recv buffers are refused unless in place") {
  test::temp_dir dir;
  auto r = test::run_ranks(3, [&](int rank, int sz) {
    auto kv = test::open_dir_store(dir.path);
    auto c = test::make_comm(*kv, rank, sz);
    const std::size_t n = static_cast<std::size_t>(sz), me = static_cast<std::size_t>(rank), k = 4;
    std::vector<std::int32_t> buf(4 * n * k + 8, 7);
    std::int32_t* b = buf.data();
    auto refused = [&](const status& st, const char* in_place) {
      if (st.code() != errc::invalid_argument || st.message().find("overlap") == std::string::npos) return false;
      return in_place == nullptr || st.message().find(in_place) != std::string::npos;
    };
    MP_CHECK(refused(c->allreduce(b, b + 1, k, reduce_op::sum), "in place: send == recv"));
    MP_CHECK(refused(c->allreduce(b + 3, b, k, dtype::int32, reduce_op::max), "send == recv"));
    MP_CHECK(refused(c->allreduce_async(b, b + 1, k, dtype::int32, reduce_op::sum).wait(), nullptr));
    MP_CHECK(refused(c->scan(b, b + 2, k, reduce_op::sum), "send == recv"));
    MP_CHECK(refused(c->exscan(b + 1, b, k, reduce_op::sum), "send == recv"));
    MP_CHECK(refused(c->alltoall(b, b + n * k - 1, k, dtype::int32), "send == recv"));
    // allgather: only send == recv + rank() * count; one element off is refused
    MP_CHECK(refused(c->allgather(b + me * k + 1, b, k, dtype::int32), "send == recv + rank() * count"));
    MP_CHECK(refused(c->reduce_scatter(b, b + me * k + 1, k, reduce_op::sum), "recv == send + rank() * count"));
    // sendrecv has no in-place form: a ring shift within one buffer is refused
    MP_CHECK(refused(c->sendrecv(b, k, (rank + 1) % sz, b + 2, k, (rank + sz - 1) % sz, dtype::int32),
                     "must be disjoint"));
    MP_CHECK(refused(c->sendrecv(b, k, (rank + 1) % sz, b, k, (rank + sz - 1) % sz, dtype::int32), nullptr));
    // v-variants: the extent of the blocks counts, not only count
    std::vector<std::size_t> cnt(n, k), dsp(n);
    for (std::size_t i = 0; i < n; ++i) dsp[i] = i * k;
    MP_CHECK(refused(c->allgatherv(b + dsp[me] + 1, k, b, cnt.data(), dsp.data(), dtype::int32),
                     "send == recv + displs[rank()]"));
    MP_CHECK(refused(c->alltoallv(b, cnt.data(), dsp.data(), b + 1, cnt.data(), dsp.data(), dtype::int32),
                     "send == recv"));
    MP_CHECK(refused(c->reduce_scatterv(b, b + dsp[me] + 1, cnt.data(), reduce_op::sum), "recv == send + (recv_counts[0]"));
    // receive blocks overlapping each other: two peers would write the same
    // elements (rank 2's block starts at rank 1's last element)
    std::vector<std::int32_t> src(k, rank), dst(n * k + 8, 0);
    std::vector<std::size_t> over(dsp);
    over[2] = over[1] + k - 1;
    auto blocks_refused = [&](const status& st) {
      return st.code() == errc::invalid_argument &&
             st.message().find("recv blocks of rank 1 (displacement 4, count 4) and rank 2 (displacement 7") != std::string::npos;
    };
    MP_CHECK(blocks_refused(c->allgatherv(src.data(), k, dst.data(), cnt.data(), over.data(), dtype::int32)));
    MP_CHECK(blocks_refused(c->allgatherv_async(src.data(), k, dst.data(), cnt.data(), over.data(), dtype::int32).wait()));
    std::vector<std::int32_t> all_src(n * k, rank);
    MP_CHECK(blocks_refused(c->alltoallv(all_src.data(), cnt.data(), dsp.data(), dst.data(), cnt.data(), over.data(), dtype::int32)));
    MP_CHECK(blocks_refused(c->alltoallv_async(all_src.data(), cnt.data(), dsp.data(), dst.data(), cnt.data(), over.data(),
                                              dtype::int32).wait()));
    // the same blocks in reverse rank order are disjoint: accepted, every block where its displacement says
    std::vector<std::size_t> rev(n);
    for (std::size_t i = 0; i < n; ++i) rev[i] = (n - 1 - i) * k;
    MP_REQUIRE_OK(c->allgatherv(src.data(), k, dst.data(), cnt.data(), rev.data(), dtype::int32));
    for (std::size_t i = 0; i < n * k; ++i) MP_CHECK(dst[i] == static_cast<std::int32_t>(n - 1 - i / k));
    // disjoint buffers that merely touch are fine, and the communicator was left usable
    std::vector<std::int32_t> mine(k, rank + 1);
    MP_REQUIRE_OK(c->allreduce(mine.data(), b, k, reduce_op::sum));
    MP_REQUIRE_OK(c->allreduce(b + k, b + 2 * k, k, reduce_op::sum));  // adjacent, not overlapping
    for (std::size_t i = 0; i < k; ++i) MP_CHECK(b[i] == sz * (sz + 1) / 2 && b[2 * k + i] == sz * 7);
    for (std::size_t i = 0; i < k; ++i) b[me * k + i] = rank;
    MP_REQUIRE_OK(c->allgather(b + me * k, b, k, dtype::int32));  // the in-place form
    for (std::size_t i = 0; i < n * k; ++i) MP_CHECK(b[i] == static_cast<std::int32_t>(i / k));
    // gather and scatter in place on the root (rank 1): its own block already sits
    // at recv + root * count / is taken from send + root * count
    const int root = 1;
    std::vector<std::int32_t> out(k, -1);
    for (std::size_t i = 0; i < n * k; ++i) b[i] = rank == root && i / k != 1 ? -1 : static_cast<std::int32_t>(i / k + 1);
    MP_REQUIRE_OK(c->gather(rank == root ? b + k : mine.data(), rank == root ? b : nullptr, k, dtype::int32, root));
    if (rank == root)
      for (std::size_t i = 0; i < n * k; ++i) MP_CHECK(b[i] == static_cast<std::int32_t>(i / k + 1));
    for (std::size_t i = 0; i < n * k; ++i) b[i] = static_cast<std::int32_t>(100 + i / k);
    MP_REQUIRE_OK(c->scatter(rank == root ? b : nullptr, rank == root ? b + k : out.data(), k, dtype::int32, root));
    for (std::size_t i = 0; i < k; ++i) MP_CHECK((rank == root ? b[k + i] : out[i]) == 100 + rank);
    return 0;
  });
  CHECK(r.all_ok());

  // The rooted calls: only the root's buffers can overlap.
  test::temp_dir one;
  auto r1 = test::run_ranks(1, [&](int rank, int sz) {
    auto kv = test::open_dir_store(one.path);
    auto c = test::make_comm(*kv, rank, sz);
    std::int32_t b[16] = {0};
    auto refused = [&](const status& st, const char* in_place) {
      return st.code() == errc::invalid_argument && st.message().find(in_place) != std::string::npos;
    };
    MP_CHECK(refused(c->reduce(b, b + 1, 4, reduce_op::sum, 0), "in place: send == recv"));
    MP_CHECK(refused(c->gather(b + 1, b, 4, dtype::int32, 0), "send == recv + root * count on the root"));
    MP_CHECK(refused(c->scatter(b, b + 1, 4, dtype::int32, 0), "recv == send + root * count on the root"));
    const std::size_t cnt[1] = {4}, dsp[1] = {2};
    MP_CHECK(refused(c->gatherv(b + 1, 4, b, cnt, dsp, dtype::int32, 0), "send == recv + recv_displs[root]"));
    MP_CHECK(refused(c->scatterv(b, cnt, dsp, b + 3, 4, dtype::int32, 0), "recv == send + send_displs[root]"));
    for (int i = 0; i < 16; ++i) b[i] = i;
    MP_REQUIRE_OK(c->gatherv(b + 2, 4, b, cnt, dsp, dtype::int32, 0));  // in place on the root
    MP_REQUIRE_OK(c->reduce(b, b, 4, reduce_op::sum, 0));
    for (int i = 0; i < 16; ++i) MP_CHECK(b[i] == i);
    return 0;
  });
  CHECK(r1.all_ok());
}

TEST_CASE("collectives: argument errors on the calling rank") {
  test::temp_dir dir;
  auto r = test::run_ranks(2, [&](int rank, int sz) {
    auto kv = test::open_dir_store(dir.path);
    auto c = test::make_comm(*kv, rank, sz);
    int x[4] = {0, 0, 0, 0};
    MP_CHECK(c->reduce(x, x, 1, dtype::int32, reduce_op::sum, 2).code() == errc::invalid_argument);
    MP_CHECK(c->gather(x, x, 1, dtype::int32, -1).code() == errc::invalid_argument);
    MP_CHECK(c->send(x, 1, dtype::int32, 5).code() == errc::invalid_argument);
    MP_CHECK(c->alltoall(x, nullptr, 1, dtype::int32).code() == errc::invalid_argument);
    MP_CHECK(c->allgather(nullptr, x, 1, dtype::int32).code() == errc::invalid_argument);
    MP_CHECK(c->allgatherv(x, 1, x, nullptr, nullptr, dtype::int32).code() == errc::invalid_argument);
    MP_CHECK(c->reduce_scatter(x, x, SIZE_MAX / 4, dtype::int32, reduce_op::sum).code() == errc::invalid_argument);
    MP_CHECK(c->scan(x, nullptr, 1, dtype::int32, reduce_op::sum).code() == errc::invalid_argument);
    MP_CHECK(c->exscan(x, x, 1, dtype::float32, reduce_op::bxor).code() == errc::invalid_argument);
    // gatherv / scatterv: the root's arrays are checked on the root; the others' are not read
    const std::size_t cnt[2] = {1, 2}, dsp[2] = {0, 1}, cnt_wrong_own[2] = {3, 2};
    MP_CHECK(c->gatherv(x, 1, x, nullptr, dsp, dtype::int32, rank).code() == errc::invalid_argument);
    MP_CHECK(c->gatherv(x, 1, nullptr, cnt, dsp, dtype::int32, rank).code() == errc::invalid_argument);
    MP_CHECK(c->gatherv(x, 1, x, cnt_wrong_own, dsp, dtype::int32, rank).code() == errc::invalid_argument);
    MP_CHECK(c->scatterv(nullptr, cnt, dsp, x, cnt[rank], dtype::int32, rank).code() == errc::invalid_argument);
    MP_CHECK(c->scatterv(x, cnt, dsp, nullptr, 1, dtype::int32, 1 - rank).code() == errc::invalid_argument);
    MP_CHECK(c->gatherv(x, 1, x, cnt, dsp, dtype::int32, 2).code() == errc::invalid_argument);
    MP_CHECK(c->gatherv(x, 1, x, cnt, dsp, static_cast<dtype>(99), rank).code() == errc::invalid_argument);
    MP_CHECK(c->reduce_scatterv(x, x, nullptr, dtype::int32, reduce_op::sum).code() == errc::invalid_argument);
    MP_CHECK(c->reduce_scatterv(x, nullptr, cnt, dtype::int32, reduce_op::sum).code() == errc::invalid_argument);
    const std::size_t huge[2] = {SIZE_MAX / 8, SIZE_MAX / 8};
    MP_CHECK(c->reduce_scatterv(x, x, huge, dtype::int32, reduce_op::sum).code() == errc::invalid_argument);
    MP_CHECK(c->scatterv_async(nullptr, cnt, dsp, x, cnt[rank], dtype::int32, rank).wait().code() ==
             errc::invalid_argument);
    MP_REQUIRE_OK(c->barrier());  // still usable
    return 0;
  });
  CHECK(r.all_ok());
}
