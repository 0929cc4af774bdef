// Randomised property test of every collective under every algorithm.
//
// Each batch draws a world size (1..8) and a network (shm, tcp, two fake
// nodes), forks that many real processes, and in each of them builds one
// communicator per algorithm setting (automatic, then ring, tree, rd, rhd,
// hier and direct
// each forced for every collective that has it) and runs a sequence of random
// calls: collective, dtype, op, count (0, 1, 7, around the 4 KiB test chunk,
// up to ~40 K elements), root, in place or not. All ranks draw the same
// sequence from the same seed. Every rank checks its result against a
// reference it computes itself; inputs are small integers so every result is
// exact whatever the reduction order, and must match bit for bit.
//
// The seed is printed with every failure; CCLITE_TEST_SEED=<n> replays it.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
using cclite::test::net;

namespace {

// Element `i` of rank `r`'s contribution: |v| <= 2, so sums and products of up
// to 8 ranks are exact in every dtype (integers wrap deterministically).
void put(dtype t, std::uint8_t* at, int r, std::size_t i) {
  const int v = static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3 + i / 11) % 5) - 2;
  switch (t) {
    case dtype::int8: { std::int8_t x = static_cast<std::int8_t>(v); std::memcpy(at, &x, 1); break; }
    case dtype::uint8: { std::uint8_t x = static_cast<std::uint8_t>(v + 2); std::memcpy(at, &x, 1); break; }
    case dtype::int32: { std::int32_t x = v; std::memcpy(at, &x, 4); break; }
    case dtype::uint32: { std::uint32_t x = static_cast<std::uint32_t>(v + 2); std::memcpy(at, &x, 4); break; }
    case dtype::int64: { std::int64_t x = v; std::memcpy(at, &x, 8); break; }
    case dtype::uint64: { std::uint64_t x = static_cast<std::uint64_t>(v + 2); std::memcpy(at, &x, 8); break; }
    case dtype::float16: { half x = to_half(static_cast<float>(v)); std::memcpy(at, &x, 2); break; }
    case dtype::bfloat16: { bfloat16 x = to_bfloat16(static_cast<float>(v)); std::memcpy(at, &x, 2); break; }
    case dtype::float32: { float x = static_cast<float>(v); std::memcpy(at, &x, 4); break; }
    case dtype::float64: { double x = v; std::memcpy(at, &x, 8); break; }
  }
}

using bytes_t = std::vector<std::uint8_t>;

// Rank r's contribution of `count` elements, element i drawn as i + shift.
bytes_t contribution(dtype t, int r, std::size_t count, std::size_t shift = 0) {
  const std::size_t s = size_of(t);
  bytes_t b(count * s);
  for (std::size_t i = 0; i < count; ++i) put(t, b.data() + i * s, r, i + shift);
  return b;
}

bytes_t reduced(dtype t, reduce_op op, int n, std::size_t count, std::size_t shift = 0) {
  const reduction red = reduction_for(t, op);
  bytes_t acc = contribution(t, 0, count, shift);
  for (int r = 1; r < n; ++r) {
    bytes_t x = contribution(t, r, count, shift);
    red.inplace(acc.data(), x.data(), count);
  }
  if (red.needs_divide) red.divide(acc.data(), count, n);
  return acc;
}

enum class coll { allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall, gather, scatter, barrier, count_ };
const char* name(coll c) {
  static const char* n[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                            "alltoall", "gather", "scatter", "barrier"};
  return n[static_cast<int>(c)];
}

struct call {
  coll what;
  dtype t;
  reduce_op op;
  std::size_t count;
  int root;
  bool in_place;
};

call draw(std::mt19937_64& g, int n) {
  call c;
  c.what = static_cast<coll>(g() % static_cast<unsigned>(coll::count_));
  c.t = static_cast<dtype>(g() % dtype_count);
  do c.op = static_cast<reduce_op>(g() % reduce_op_count);
  while (!applies_to(c.op, c.t));  // bitwise ops: integer dtypes only
  static const std::size_t fixed[] = {0, 1, 7, 1023, 1024, 1025, 4099, 40009};
  c.count = g() % 3 == 0 ? g() % 20000 : fixed[g() % 8];
  c.root = static_cast<int>(g() % static_cast<unsigned>(n));
  c.in_place = g() % 2 == 0;
  return c;
}

// Runs one call on communicator `c` and checks it; returns 0 or prints why not.
int run_one(default_communicator& c, const call& k) {
  const int n = c.size(), me = c.rank();
  const std::size_t N = static_cast<std::size_t>(n), s = size_of(k.t), cnt = k.count;
  status st;
  bytes_t got, want;
  switch (k.what) {
    case coll::allreduce: {
      bytes_t in = contribution(k.t, me, cnt), out(cnt * s, 0xee);
      st = k.in_place ? c.allreduce(in.data(), in.data(), cnt, k.t, k.op) : c.allreduce(in.data(), out.data(), cnt, k.t, k.op);
      got = k.in_place ? in : out;
      want = reduced(k.t, k.op, n, cnt);
      break;
    }
    case coll::broadcast: {
      got = me == k.root ? contribution(k.t, k.root, cnt) : bytes_t(cnt * s, 0xee);
      st = c.broadcast(got.data(), cnt, k.t, k.root);
      want = contribution(k.t, k.root, cnt);
      break;
    }
    case coll::reduce: {
      bytes_t in = contribution(k.t, me, cnt), out(cnt * s, 0xee);
      const bool inpl = k.in_place && me == k.root;
      st = c.reduce(in.data(), inpl ? in.data() : out.data(), cnt, k.t, k.op, k.root);
      got = inpl ? in : out;
      want = me == k.root ? reduced(k.t, k.op, n, cnt) : bytes_t(cnt * s, 0xee);
      break;
    }
    case coll::allgather: {
      got.assign(cnt * s * N, 0xee);
      bytes_t in = contribution(k.t, me, cnt, 0);
      if (k.in_place && cnt) std::memcpy(got.data() + static_cast<std::size_t>(me) * cnt * s, in.data(), in.size());
      st = c.allgather(k.in_place ? got.data() + static_cast<std::size_t>(me) * cnt * s : in.data(), got.data(), cnt, k.t);
      for (int r = 0; r < n; ++r) {
        bytes_t b = contribution(k.t, r, cnt);
        want.insert(want.end(), b.begin(), b.end());
      }
      break;
    }
    case coll::reduce_scatter: {
      bytes_t in;
      for (int b = 0; b < n; ++b) {
        bytes_t blk = contribution(k.t, me, cnt, static_cast<std::size_t>(b) * 100000);
        in.insert(in.end(), blk.begin(), blk.end());
      }
      bytes_t out(cnt * s, 0xee);
      std::uint8_t* dst = k.in_place ? in.data() + static_cast<std::size_t>(me) * cnt * s : out.data();
      st = c.reduce_scatter(in.data(), dst, cnt, k.t, k.op);
      got.assign(dst, dst + cnt * s);
      want = reduced(k.t, k.op, n, cnt, static_cast<std::size_t>(me) * 100000);
      break;
    }
    case coll::alltoall: {  // block b of rank r = contribution(r, shift b)
      bytes_t in, out(cnt * s * N, 0xee);
      for (int b = 0; b < n; ++b) {
        bytes_t blk = contribution(k.t, me, cnt, static_cast<std::size_t>(b) * 100000);
        in.insert(in.end(), blk.begin(), blk.end());
        bytes_t w = contribution(k.t, b, cnt, static_cast<std::size_t>(me) * 100000);
        want.insert(want.end(), w.begin(), w.end());
      }
      st = c.alltoall(in.data(), out.data(), cnt, k.t);
      got = out;
      break;
    }
    case coll::gather: {
      bytes_t in = contribution(k.t, me, cnt), out(me == k.root ? cnt * s * N : 0, 0xee);
      st = c.gather(in.data(), out.data(), cnt, k.t, k.root);
      got = out;
      if (me == k.root)
        for (int r = 0; r < n; ++r) {
          bytes_t b = contribution(k.t, r, cnt);
          want.insert(want.end(), b.begin(), b.end());
        }
      break;
    }
    case coll::scatter: {
      bytes_t in;
      if (me == k.root)
        for (int r = 0; r < n; ++r) {
          bytes_t b = contribution(k.t, k.root, cnt, static_cast<std::size_t>(r) * 100000);
          in.insert(in.end(), b.begin(), b.end());
        }
      got.assign(cnt * s, 0xee);
      st = c.scatter(in.data(), got.data(), cnt, k.t, k.root);
      want = contribution(k.t, k.root, cnt, static_cast<std::size_t>(me) * 100000);
      break;
    }
    case coll::barrier:
    case coll::count_: st = c.barrier(); break;
  }
  const bool ok = st.ok() && got.size() == want.size() && (got.empty() || std::memcmp(got.data(), want.data(), got.size()) == 0);
  if (!ok) {
    std::fprintf(stderr, "rank %d of %d: %s(%zu x %s, %s, root %d, %s) %s\n", me, n, name(k.what), cnt,
                 to_string(k.t), to_string(k.op), k.root, k.in_place ? "in place" : "out of place",
                 st.ok() ? "gave a wrong result" : st.to_string().c_str());
  }
  return ok ? 0 : 1;
}

std::uint64_t seed_from_env() {
  if (const char* s = std::getenv("CCLITE_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

}  // namespace

TEST_CASE("algorithms: random collectives x algorithms x world sizes (seeded)") {
  const std::uint64_t seed = seed_from_env();
  std::mt19937_64 top(seed);
  const char* algos[] = {"", "ring", "tree", "rd", "rhd", "hier", "direct"};
  const int batches = 6, calls_per_algo = 10;
  int total = 0;
  for (int b = 0; b < batches; ++b) {
    const int n = 1 + static_cast<int>(top() % 8);
    const net how = n == 1 ? net::shm_only : static_cast<net>(top() % 3);
    const std::uint64_t batch_seed = top();
    test::temp_dir dir;
    auto r = test::run_ranks(
        n,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          std::mt19937_64 g(batch_seed);  // the same calls on every rank
          int bad = 0;
          for (const char* algo : algos) {
            ::setenv("CCLITE_ALGO", algo, 1);
            comm_options o;
            o.chunk_bytes = 4096;  // several pieces per call even at small counts
            o.store_prefix = std::string("algo-") + (*algo ? algo : "auto");
            auto c = test::make_comm(*kv, rank, sz, o);
            for (int i = 0; i < calls_per_algo; ++i) {
              const call k = draw(g, sz);
              if (run_one(*c, k)) {
                std::fprintf(stderr, "  (CCLITE_ALGO='%s', call %d, seed %llu)\n", algo, i,
                             static_cast<unsigned long long>(seed));
                ++bad;
                break;  // the communicator may be broken now; the next algorithm starts afresh
              }
            }
          }
          MP_CHECK(bad == 0);
          return 0;
        },
        std::chrono::seconds(240), [&](int rank) { test::set_net_env(how, rank, n); });
    total += 7 * calls_per_algo;
    INFO("seed ", seed, " (replay: CCLITE_TEST_SEED=", seed, "), batch ", b, ": ", n, " ranks over ",
         test::to_string(how), ": ", r.describe());
    CHECK(r.all_ok());
  }
  MESSAGE("seed ", seed, ": ", total, " random calls on every rank of ", batches, " jobs");
}
