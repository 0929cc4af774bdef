// communicator::alloc_shared(): memory every rank of a node maps, and the
// in-place allreduce that reduces it where it lies (shm/direct.hpp, shared
// windows). Real processes and real POSIX shm: 2, 3 and 4 ranks, one dtype per
// element size and every op, ranges at offset 0 and mid-window of 0, 1, a
// prime and 64 Ki + 3 elements (several 64 KiB pieces per slice), blocking and
// async; bytes outside the range stay as they were; results equal a local
// reference bit for bit on every rank. Then the refusals: ranks passing
// different ranges (mismatch, with and without call headers), a job over two
// fake nodes (unsupported), free_shared of a foreign pointer.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
using cclite::test::net;

namespace {

// Small integers: sums, products and averages of up to 4 ranks are exact in
// every dtype, so the reference does not depend on the reduction order.
template <class T>
T input(int rank, std::size_t i) {
  const int v = static_cast<int>((i * 5 + static_cast<std::size_t>(rank) * 3 + i / 11) % 5) - 2;
  if constexpr (std::is_same_v<T, half>) return to_half(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <class T>
int check_range(default_communicator& c, std::uint8_t* win, std::size_t win_bytes, std::size_t offset,
                std::size_t count, reduce_op op, bool async) {
  // The whole window gets a pattern; only [offset, offset + count) may change.
  for (std::size_t b = 0; b < win_bytes; ++b) win[b] = static_cast<std::uint8_t>(b * 31 + 7);
  T* data = reinterpret_cast<T*>(win + offset);
  for (std::size_t i = 0; i < count; ++i) data[i] = input<T>(c.rank(), i);
  status st = async ? c.allreduce_async(data, count, op).wait() : c.allreduce(data, count, op);
  if (!st.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", c.rank(), st.to_string().c_str());
    return 1;
  }
  const reduction red = reduction_for(dtype_of_v<T>, op);
  std::vector<T> want(count), tmp(count);
  for (std::size_t i = 0; i < count; ++i) want[i] = input<T>(0, i);
  for (int r = 1; r < c.size(); ++r) {
    for (std::size_t i = 0; i < count; ++i) tmp[i] = input<T>(r, i);
    red.inplace(want.data(), tmp.data(), count);
  }
  if (red.needs_divide) red.divide(want.data(), count, c.size());
  int bad = 0;
  if (count && std::memcmp(data, want.data(), count * sizeof(T)) != 0) {
    std::fprintf(stderr, "rank %d: %s %s offset %zu count %zu: wrong result\n", c.rank(),
                 to_string(dtype_of_v<T>), to_string(op), offset, count);
    ++bad;
  }
  for (std::size_t b = 0; b < win_bytes; ++b) {
    if (b >= offset && b < offset + count * sizeof(T)) continue;
    if (win[b] != static_cast<std::uint8_t>(b * 31 + 7)) {
      std::fprintf(stderr, "rank %d: byte %zu outside the range changed\n", c.rank(), b);
      ++bad;
      break;
    }
  }
  return bad;
}

template <class T>
int check_dtype(default_communicator& c, std::uint8_t* win, std::size_t win_bytes) {
  int bad = 0;
  for (int op = 0; op < reduce_op_count; ++op)
    if (applies_to(static_cast<reduce_op>(op), dtype_of_v<T>))  // bitwise ops: integer dtypes only
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1031}, std::size_t{(64u << 10) + 3}})
      for (std::size_t offset : {std::size_t{0}, 40 * sizeof(T)})
        bad += check_range<T>(c, win, win_bytes, offset, count, static_cast<reduce_op>(op), op % 2 == 1);
  return bad;
}

}  // namespace

TEST_CASE("alloc_shared: in-place allreduce on the window, 2..4 ranks") {
  for (int size : {2, 3, 4}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        size,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          const std::size_t bytes = (1u << 20) + 4096;
          auto w = c->alloc_shared(bytes);
          MP_REQUIRE(w.ok());
          auto* win = static_cast<std::uint8_t*>(w.value());
          MP_CHECK(reinterpret_cast<std::uintptr_t>(win) % 4096 == 0);
          bool zero = true;
          for (std::size_t b = 0; b < bytes; ++b) zero = zero && win[b] == 0;
          MP_CHECK(zero);
          MP_CHECK(check_dtype<std::int8_t>(*c, win, bytes) == 0);
          MP_CHECK(check_dtype<half>(*c, win, bytes) == 0);
          MP_CHECK(check_dtype<float>(*c, win, bytes) == 0);
          MP_CHECK(check_dtype<std::int64_t>(*c, win, bytes) == 0);
          // Out of place from the window, and into it, take the ordinary path.
          std::vector<float> other(1000, 1.0f);
          MP_CHECK(c->allreduce(other.data(), reinterpret_cast<float*>(win), other.size()).ok());
          MP_CHECK(reinterpret_cast<float*>(win)[999] == static_cast<float>(sz));
          // Freed, and a second window (new segment names) works the same.
          MP_CHECK(c->free_shared(win).ok());
          MP_CHECK(c->free_shared(win).code() == errc::invalid_argument);
          auto w2 = c->alloc_shared(4096);
          MP_REQUIRE(w2.ok());
          MP_CHECK(check_range<double>(*c, static_cast<std::uint8_t*>(w2.value()), 4096, 8, 500, reduce_op::sum,
                                       false) == 0);
          return 0;
        },
        std::chrono::seconds(180), [&](int rank) { test::set_net_env(net::shm_only, rank, size); });
    INFO("size ", size, ": ", r.describe());
    CHECK(r.all_ok());
  }
}

// shared_peer() (MPI_Win_shared_query): each rank writes a pattern into its
// own copy, and after a barrier reads every other rank's copy through the
// returned address, at offset 0 and mid-window; then each rank writes into
// its ring successor's copy and reads what its predecessor wrote into its own.
// Bad ranks and foreign pointers are invalid_argument.
TEST_CASE("alloc_shared: shared_peer() reaches every rank's copy, 2..4 ranks") {
  for (int size : {2, 3, 4}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        size,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          const std::size_t n = 3000;  // ints: spans pages
          auto w = c->alloc_shared(n * sizeof(int));
          MP_REQUIRE(w.ok());
          int* mine = static_cast<int*>(w.value());
          for (std::size_t i = 0; i < n; ++i) mine[i] = rank * 100000 + static_cast<int>(i);
          MP_REQUIRE(c->barrier().ok());
          for (int p = 0; p < sz; ++p) {
            auto at0 = c->shared_peer(mine, p), mid = c->shared_peer(mine + 1234, p);
            MP_REQUIRE(at0.ok() && mid.ok());
            MP_CHECK((p == rank) == (at0.value() == static_cast<void*>(mine)));
            const int* theirs = static_cast<const int*>(at0.value());
            bool same = static_cast<const int*>(mid.value()) == theirs + 1234;
            for (std::size_t i = 0; i < n; ++i) same = same && theirs[i] == p * 100000 + static_cast<int>(i);
            MP_CHECK(same);
          }
          MP_REQUIRE(c->barrier().ok());  // everyone read before anyone writes again
          auto next = c->shared_peer(mine + 7, (rank + 1) % sz);
          MP_REQUIRE(next.ok());
          *static_cast<int*>(next.value()) = -1 - rank;
          MP_REQUIRE(c->barrier().ok());
          MP_CHECK(mine[7] == -1 - (rank + sz - 1) % sz);
          MP_CHECK(c->shared_peer(mine, sz).error().code() == errc::invalid_argument);
          MP_CHECK(c->shared_peer(mine, -1).error().code() == errc::invalid_argument);
          int local = 0;
          MP_CHECK(c->shared_peer(&local, 0).error().code() == errc::invalid_argument);
          MP_CHECK(c->shared_peer(mine + n + 4096, 0).error().code() == errc::invalid_argument);
          MP_REQUIRE(c->barrier().ok());
          return 0;
        },
        std::chrono::seconds(120), [&](int rank) { test::set_net_env(net::shm_only, rank, size); });
    INFO("size ", size, ": ", r.describe());
    CHECK(r.all_ok());
  }
}

// Every rank must pass the same range: a rank reducing another part of its
// window gets errc::mismatch everywhere instead of sums of unrelated data,
// also with the call headers off (the range is compared on its own).
TEST_CASE("alloc_shared: ranks passing different ranges get mismatch, not wrong sums") {
  for (const char* check : {"1", "0"}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        2,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          auto w = c->alloc_shared(1 << 16);
          MP_REQUIRE(w.ok());
          float* f = static_cast<float*>(w.value());
          const status st = c->allreduce(f + (rank == 1 ? 16 : 0), 1000);
          if (st.code() != errc::mismatch) std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
          MP_CHECK(st.code() == errc::mismatch);
          return 0;
        },
        std::chrono::seconds(60), [&](int rank) {
          test::set_net_env(net::shm_only, rank, 2);
          ::setenv("CCLITE_CHECK_MISMATCH", check, 1);
        });
    INFO("CCLITE_CHECK_MISMATCH=", check, ": ", r.describe());
    CHECK(r.all_ok());
  }
}

TEST_CASE("alloc_shared: a rank passing ordinary memory while the others pass the window gets mismatch at once") {
  // The window call takes a path of its own; the call header says so, so the
  // rank on the ordinary path sees it in its predecessor's header and every
  // rank reports the mismatch long before the deadline (10 minutes here; the
  // test's hang guard is 60 s).
  for (int size : {2, 3}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        size,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          auto w = c->alloc_shared(1 << 16);
          MP_REQUIRE(w.ok());
          std::vector<float> plain(1000, 1.0f);
          float* f = rank == sz - 1 ? plain.data() : static_cast<float*>(w.value());
          const status st = c->allreduce(f, 1000);
          if (st.code() != errc::mismatch) std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
          MP_CHECK(st.code() == errc::mismatch);
          MP_CHECK(st.message().find("alloc_shared() window") != std::string::npos);
          return 0;
        },
        std::chrono::seconds(60), [&](int rank) {
          test::set_net_env(net::shm_only, rank, size);
          ::setenv("CCLITE_TIMEOUT", "600", 1);
        });
    INFO(size, " ranks: ", r.describe());
    CHECK(r.all_ok());
  }
}

TEST_CASE("alloc_shared: unsupported across nodes; the job goes on with ordinary memory") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      4,
      [&](int rank, int sz) {
        auto kv = test::open_dir_store(dir.path);
        auto c = test::make_comm(*kv, rank, sz);
        auto w = c->alloc_shared(4096);
        MP_CHECK(!w.ok() && w.error().code() == errc::unsupported);
        int dummy = 0;
        MP_CHECK(c->free_shared(&dummy).code() == errc::invalid_argument);
        std::vector<int> v(100, 1);
        MP_CHECK(c->allreduce(v.data(), v.size()).ok());
        MP_CHECK(v[99] == sz);
        return 0;
      },
      std::chrono::seconds(60), [&](int rank) { test::set_net_env(net::mixed, rank, 4); });
  INFO(r.describe());
  CHECK(r.all_ok());
}
