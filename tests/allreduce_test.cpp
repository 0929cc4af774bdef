// Multi-process allreduce: real processes, real shared memory, real loopback
// sockets. Every dtype x op x count (0, 1, a prime, not a multiple of the
// chunk, 1 Mi + 3, 16 MiB) x in-place/out-of-place, on 1..6 ranks, shm-only,
// tcp-only and mixed (two fake nodes via CCLITE_HOSTID), with the automatic
// choice; then every algorithm forced on 2..8 ranks with one dtype per element
// size. Results must equal the locally computed reference bit for bit and be
// identical on every rank.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
using cclite::test::net;

namespace {

// Inputs are small integers (|v| <= 2), so sums, products and averages of up
// to 6 ranks are exact in every dtype (even int8, float16 and bfloat16) and
// the reference does not depend on the order of the reduction.
template <class T>
T input(int rank, std::size_t i) {
  int v = static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3 + i / 13) % 5);
  if constexpr (std::is_unsigned_v<T>) {
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, half>) {
    return to_half(static_cast<float>(v - 2));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return to_bfloat16(static_cast<float>(v - 2));
  } else {
    return static_cast<T>(v - 2);
  }
}

template <class T>
std::vector<T> reference(int size, std::size_t count, reduce_op op) {
  std::vector<T> out(count);
  const reduction red = reduction_for(dtype_of_v<T>, op);
  std::vector<T> tmp(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = input<T>(0, i);
  for (int r = 1; r < size; ++r) {
    for (std::size_t i = 0; i < count; ++i) tmp[i] = input<T>(r, i);
    red.inplace(out.data(), tmp.data(), count);
  }
  if (red.needs_divide) red.divide(out.data(), count, size);
  return out;
}

std::uint64_t fnv(const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// Runs one allreduce and checks it; returns the number of mismatching elements.
template <class T>
int check_one(default_communicator& c, std::size_t count, reduce_op op, bool in_place) {
  std::vector<T> send(count), recv(count);
  for (std::size_t i = 0; i < count; ++i) send[i] = input<T>(c.rank(), i);
  std::vector<T> send_copy = send;
  status st = in_place ? c.allreduce(send.data(), count, op)
                       : c.allreduce(send.data(), recv.data(), count, op);
  if (!st.ok()) {
    std::fprintf(stderr, "allreduce failed: %s\n", st.to_string().c_str());
    return -1;
  }
  const std::vector<T>& got = in_place ? send : recv;
  std::vector<T> want = reference<T>(c.size(), count, op);
  int bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ < 3) {
      std::fprintf(stderr, "rank %d %s %s count %zu %s: element %zu wrong\n", c.rank(),
                   to_string(dtype_of_v<T>), to_string(op), count, in_place ? "in-place" : "out-of-place", i);
    }
  }
  if (!in_place && count && std::memcmp(send.data(), send_copy.data(), count * sizeof(T)) != 0) {
    std::fprintf(stderr, "rank %d: out-of-place allreduce modified its send buffer\n", c.rank());
    ++bad;
  }
  // Bitwise identical on every rank: min and max of the result hash agree.
  std::uint64_t h[2] = {fnv(got.data(), count * sizeof(T)), 0};
  h[1] = h[0];
  if (!c.allreduce(&h[0], 1, reduce_op::min).ok() || !c.allreduce(&h[1], 1, reduce_op::max).ok() ||
      h[0] != h[1]) {
    std::fprintf(stderr, "rank %d: results differ between ranks\n", c.rank());
    ++bad;
  }
  return bad;
}

template <class T>
int check_dtype(default_communicator& c, const std::vector<std::size_t>& counts) {
  int bad = 0;
  for (int op = 0; op < reduce_op_count; ++op) {
    if (!applies_to(static_cast<reduce_op>(op), dtype_of_v<T>)) {
      // A bitwise op on a floating dtype: refused here, before anything is sent.
      T x{};
      bad += c.allreduce(&x, 1, static_cast<reduce_op>(op)).code() != errc::invalid_argument;
      continue;
    }
    for (std::size_t n : counts)
      for (bool in_place : {false, true}) bad += check_one<T>(c, n, static_cast<reduce_op>(op), in_place);
  }
  return bad;
}

// One dtype per element size (1, 2, 4, 8 bytes): the algorithms see only
// bytes and a reduction table, so this covers their paths at a third of the cost.
int check_sizes(default_communicator& c, const std::vector<std::size_t>& counts) {
  return check_dtype<std::int8_t>(c, counts) + check_dtype<half>(c, counts) + check_dtype<float>(c, counts) +
         check_dtype<std::int64_t>(c, counts);
}

int check_all_dtypes(default_communicator& c, const std::vector<std::size_t>& counts) {
  return check_dtype<std::int8_t>(c, counts) + check_dtype<std::uint8_t>(c, counts) +
         check_dtype<std::int32_t>(c, counts) + check_dtype<std::uint32_t>(c, counts) +
         check_dtype<std::int64_t>(c, counts) + check_dtype<std::uint64_t>(c, counts) +
         check_dtype<half>(c, counts) + check_dtype<bfloat16>(c, counts) +
         check_dtype<float>(c, counts) + check_dtype<double>(c, counts);
}

// The full matrix on `size` ranks under `n`, with CCLITE_ALGO = `algo` (empty:
// automatic, which picks recursive doubling for the small counts and the ring
// for 16 MiB). A 4 KiB chunk makes even the small counts take several ring
// rounds; 1031 (prime) and 3001 elements are not multiples of the chunk or of
// the rank count.
void run_matrix(int size, net n, const char* algo = "", bool every_dtype = true) {
  test::temp_dir dir;
  auto r = test::run_ranks(
      size,
      [&](int rank, int sz) {
        auto kv = test::open_dir_store(dir.path);
        comm_options o;
        o.chunk_bytes = 4096;
        auto c = test::make_comm(*kv, rank, sz, o);
        MP_CHECK((every_dtype ? check_all_dtypes(*c, {0, 1, 1031, 3001}) : check_sizes(*c, {0, 1, 1031, 3001})) == 0);
        // With the default chunk size: 2 Mi + 3 doubles out of place (>= 16
        // MiB: the ring's streamed output, every algorithm's pieces past the
        // link buffers, with a tail, and avg's divide); in the automatic
        // matrix also 16 MiB of floats (sum) and of int64 in place (max). The
        // forced algorithms see only bytes and the reduction table: the
        // doubles cover their large paths, at half the cost on 8 ranks.
        auto big = test::make_comm(*kv, rank, sz);
        if (every_dtype) {
          MP_CHECK(check_one<float>(*big, 4u << 20, reduce_op::sum, false) == 0);
          MP_CHECK(check_one<std::int64_t>(*big, 2u << 20, reduce_op::max, true) == 0);
        }
        MP_CHECK(check_one<double>(*big, (2u << 20) + 3, reduce_op::avg, false) == 0);
        return 0;
      },
      std::chrono::seconds(240), [&](int rank) {
        test::set_net_env(n, rank, size);
        ::setenv("CCLITE_ALGO", algo, 1);
      });
  INFO("size ", size, " net ", test::to_string(n), " CCLITE_ALGO=", algo, ": ", r.describe());
  CHECK(r.all_ok());
}

}  // namespace

TEST_CASE("allreduce: 1 rank") { run_matrix(1, net::shm_only); }
TEST_CASE("allreduce: 2 ranks, shm") { run_matrix(2, net::shm_only); }
TEST_CASE("allreduce: 2 ranks, tcp") { run_matrix(2, net::tcp_only); }
TEST_CASE("allreduce: 3 ranks, shm") { run_matrix(3, net::shm_only); }
TEST_CASE("allreduce: 3 ranks, tcp") { run_matrix(3, net::tcp_only); }
TEST_CASE("allreduce: 4 ranks, mixed (2 fake nodes)") { run_matrix(4, net::mixed); }
TEST_CASE("allreduce: 5 ranks, mixed (2 fake nodes)") { run_matrix(5, net::mixed); }
TEST_CASE("allreduce: 6 ranks, shm") { run_matrix(6, net::shm_only); }

// Each algorithm forced on sizes where it takes its special paths: the ring
// with several rounds per segment, recursive doubling with folded ranks (3, 5, 6).
TEST_CASE("allreduce: ring forced, 3 ranks shm, 5 ranks tcp") {
  run_matrix(3, net::shm_only, "allreduce:ring", false);
  run_matrix(5, net::tcp_only, "ring", false);
}
TEST_CASE("allreduce: recursive doubling forced, 2..6 ranks") {
  run_matrix(2, net::tcp_only, "allreduce:rd", false);
  run_matrix(3, net::mixed, "allreduce:rd", false);
  run_matrix(4, net::shm_only, "allreduce:rd", false);
  run_matrix(5, net::shm_only, "rd", false);
  run_matrix(6, net::mixed, "allreduce:rd", false);
}
// Rabenseifner: folded ranks (3, 5, 6, 7), power-of-two (2, 4, 8), blocks of
// unequal length (1031 and 3001 elements over 2..8 blocks).
TEST_CASE("allreduce: halving-doubling forced, 2..8 ranks") {
  run_matrix(2, net::tcp_only, "allreduce:rhd", false);
  run_matrix(3, net::mixed, "allreduce:rhd", false);
  run_matrix(4, net::shm_only, "rhd", false);
  run_matrix(7, net::shm_only, "allreduce:rhd", false);
  run_matrix(8, net::mixed, "allreduce:rhd", false);
}
// Double binary tree: the mirrored second tree (even n) and the shifted one
// (odd n), trees over fake nodes, several pieces per tree (4 KiB chunks).
TEST_CASE("allreduce: double binary tree forced, 2..8 ranks") {
  run_matrix(2, net::shm_only, "allreduce:tree", false);
  run_matrix(3, net::tcp_only, "allreduce:tree", false);
  run_matrix(5, net::mixed, "tree", false);
  run_matrix(6, net::shm_only, "allreduce:tree", false);
  run_matrix(8, net::shm_only, "allreduce:tree", false);
}
// Hierarchical: 2 fake nodes x 2 and x 3 ranks (shm inside, tcp across; the
// tail of count % local_size elements), and uneven nodes (3 + 2), where it
// falls back to the ring.
TEST_CASE("allreduce: hierarchical forced on two fake nodes") {
  run_matrix(4, net::mixed, "allreduce:hier", false);
  run_matrix(6, net::mixed, "allreduce:hier", false);
  run_matrix(5, net::mixed, "hier", false);
}
// shm-direct: 2..8 ranks on one node (pieces of 1 MiB for the 16 MiB cases,
// slices of unequal length), and the fallback to the ring when the job spans
// two fake nodes.
TEST_CASE("allreduce: shm-direct forced on one node") {
  run_matrix(2, net::shm_only, "allreduce:direct", false);
  run_matrix(3, net::shm_only, "allreduce:direct", false);
  run_matrix(8, net::shm_only, "direct", false);
  run_matrix(4, net::mixed, "allreduce:direct", false);
}

namespace {
// Resident KiB of this process's mappings of shm segments whose name holds
// `part` (smaps: "/dev/shm/cclite-<job>-<part>-<rank> (deleted)").
long shm_rss_kib(const char* part) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  bool in = false;
  long kib = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0;
    char perms[8];
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3)  // a mapping's first line
      in = std::strstr(line, "/cclite-") && std::strstr(line, part);
    else if (in && std::strncmp(line, "Rss:", 4) == 0)
      kib += std::atol(line + 4);
  }
  std::fclose(f);
  return kib;
}
}  // namespace

// Memory at rest (the embedded issue's budget: < 16 MiB per rank): small
// allreduces and barriers set up the shm-direct group's header pages only
// (one page per rank); its 2 x 1 MiB data areas per rank are mapped by the
// first allreduce that uses them, not before.
TEST_CASE("allreduce: small calls and barriers leave the shm-direct data areas unmapped") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        auto c = test::make_comm(*kv, rank, size);
        float x[4] = {1, 2, 3, 4};
        for (int i = 0; i < 10; ++i) MP_REQUIRE_OK(c->allreduce(x, 4));
        MP_REQUIRE_OK(c->barrier());
        const long small = shm_rss_kib("-small-"), areas = shm_rss_kib("-direct-");
        if (!(small > 0 && small <= 16)) std::fprintf(stderr, "rank %d: small group %ld KiB resident\n", rank, small);
        MP_CHECK(small > 0 && small <= 16);  // a 4 KiB page per rank, 2 ranks (some slack)
        MP_CHECK(areas == 0);
        std::vector<float> big(64 << 10, 1.0f);
        MP_REQUIRE_OK(c->allreduce(big.data(), big.size()));  // CCLITE_ALGO=direct below
        MP_CHECK(shm_rss_kib("-direct-") >= 256);
        MP_CHECK(big[123] == 2.0f);
        MP_REQUIRE_OK(c->barrier());
        return 0;
      },
      std::chrono::seconds(60), [&](int rank) {
        test::set_net_env(net::shm_only, rank, 2);
        ::setenv("CCLITE_ALGO", "allreduce:direct", 1);
      });
  INFO(r.describe());
  CHECK(r.all_ok());
}

// The automatic choice on one node of shm ranks, with the default figures,
// against docs/performance.md's per-algorithm table (2 ranks: the fastest at
// every size, never shm-direct; 4 ranks: shm-direct where the table has it
// fastest within one piece). Pure selector arithmetic: no processes, no timing.
TEST_CASE("allreduce: the selector's one-node picks follow the measured table") {
  for (const char* v : {"CCLITE_ALGO", "CCLITE_RD_MAX", "CCLITE_COST_SHM", "CCLITE_COST_TCP"}) ::unsetenv(v);
  logger log(0);
  auto picks = [&](int n) {
    algorithm_selector s;
    REQUIRE(s.init(log).ok());
    s.set_job("shm", 512 << 10);
    s.set_nodes(1, n);
    s.set_direct(true, 1 << 20);
    return s;
  };
  const algorithm_selector two = picks(2), four = picks(4);
  CHECK(two.choose(collective_kind::allreduce, 8, 2) == algorithm::rd);
  CHECK(two.choose(collective_kind::allreduce, 64 << 10, 2) == algorithm::ring);
  CHECK(two.choose(collective_kind::allreduce, 1 << 20, 2) == algorithm::ring);
  CHECK(two.choose(collective_kind::allreduce, 64 << 20, 2) == algorithm::ring);
  CHECK(four.choose(collective_kind::allreduce, 64 << 10, 4) == algorithm::direct);
  CHECK(four.choose(collective_kind::allreduce, 1 << 20, 4) == algorithm::direct);
  CHECK(four.choose(collective_kind::allreduce, 64 << 20, 4) == algorithm::ring);  // beyond one piece
}
