// No heap allocation inside a collective once the communicator is set up
// (DESIGN.md, "Embedded-friendly"; issue 5 item 4).
//
// This program replaces malloc, calloc, realloc, free, the aligned allocators
// and every form of global operator new/delete, forwarding to glibc's
// __libc_* entry points, and counts calls while "armed". In real forked ranks,
// over shm and over tcp (CCLITE_SHM_DISABLE=1), with each allreduce algorithm
// forced in turn (CCLITE_ALGO) and the automatic choice, it sets up a
// communicator, warms up with every call of the mix once, then arms the
// counter and runs the mix again: 1,000 allreduces per transport, sizes from
// 1 element to 4 MiB, four dtypes, all five ops, in place and out of place.
// Any allocation fails the test, naming the call, with the allocating stack
// (backtrace_symbols_fd, which does not allocate).
//
// Under a sanitizer (which owns malloc) the replacement is compiled out and
// the test only reports that it did not run.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <execinfo.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(__SANITIZE_MEMORY__)
#define CCLITE_ALLOC_TEST_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define CCLITE_ALLOC_TEST_OFF 1
#endif
#endif
#if !defined(__GLIBC__)
#define CCLITE_ALLOC_TEST_OFF 1  // the forwarding below needs glibc's __libc_* entry points
#endif

#ifndef CCLITE_ALLOC_TEST_OFF

// ---- counting allocator ---------------------------------------------------------------

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void __libc_free(void*);
void* __libc_memalign(std::size_t, std::size_t);
}

namespace {

std::atomic<bool> g_armed{false};
std::atomic<long> g_count{0};
std::atomic<bool> g_have_trace{false};
void* g_trace[40];
int g_trace_depth = 0;
std::size_t g_trace_bytes = 0;
const char* g_trace_kind = "";
thread_local bool t_inside = false;  // static TLS in the executable: no allocation

// Counts one allocation; remembers the stack of the first one while armed.
inline void note(std::size_t bytes, const char* kind) noexcept {
  if (!g_armed.load(std::memory_order_relaxed) || t_inside) return;
  t_inside = true;
  if (g_count.fetch_add(1, std::memory_order_relaxed) == 0 && !g_have_trace.load()) {
    g_trace_depth = ::backtrace(g_trace, 40);  // loaded before arming: no allocation now
    g_trace_bytes = bytes;
    g_trace_kind = kind;
    g_have_trace.store(true);
  }
  t_inside = false;
}

void* aligned(std::size_t align, std::size_t n) noexcept {
  if (align < sizeof(void*)) align = sizeof(void*);
  return __libc_memalign(align, n ? n : 1);
}

void* new_or_throw(std::size_t n, const char* kind) {
  note(n, kind);
  void* p = __libc_malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

void* aligned_new_or_throw(std::size_t n, std::align_val_t a, const char* kind) {
  note(n, kind);
  void* p = aligned(static_cast<std::size_t>(a), n);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

extern "C" {

void* malloc(std::size_t n) noexcept {
  note(n, "malloc");
  return __libc_malloc(n);
}
void* calloc(std::size_t k, std::size_t n) noexcept {
  note(k * n, "calloc");
  return __libc_calloc(k, n);
}
void* realloc(void* p, std::size_t n) noexcept {
  note(n, "realloc");
  return __libc_realloc(p, n);
}
void free(void* p) noexcept { __libc_free(p); }
void* memalign(std::size_t a, std::size_t n) noexcept {
  note(n, "memalign");
  return __libc_memalign(a, n);
}
void* aligned_alloc(std::size_t a, std::size_t n) noexcept {
  note(n, "aligned_alloc");
  return __libc_memalign(a, n);
}
int posix_memalign(void** out, std::size_t a, std::size_t n) noexcept {
  if (a < sizeof(void*) || (a & (a - 1)) != 0) return EINVAL;
  note(n, "posix_memalign");
  void* p = __libc_memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(std::size_t n) noexcept {
  note(n, "valloc");
  return __libc_memalign(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)), n);
}
}  // extern "C"

void* operator new(std::size_t n) { return new_or_throw(n, "operator new"); }
void* operator new[](std::size_t n) { return new_or_throw(n, "operator new[]"); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  note(n, "operator new(nothrow)");
  return __libc_malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  note(n, "operator new[](nothrow)");
  return __libc_malloc(n ? n : 1);
}
void* operator new(std::size_t n, std::align_val_t a) { return aligned_new_or_throw(n, a, "operator new(align)"); }
void* operator new[](std::size_t n, std::align_val_t a) { return aligned_new_or_throw(n, a, "operator new[](align)"); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  note(n, "operator new(align, nothrow)");
  return aligned(static_cast<std::size_t>(a), n);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  note(n, "operator new[](align, nothrow)");
  return aligned(static_cast<std::size_t>(a), n);
}
void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, std::size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::size_t) noexcept { __libc_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { __libc_free(p); }

// ---- the test ---------------------------------------------------------------------------

using namespace cclite;
using cclite::test::net;

namespace {

struct call {
  dtype type;
  reduce_op op;
  std::size_t count;
  bool in_place;
};

// Element counts from 1 to 4 MiB of float, odd ones included (not a multiple
// of the chunk, the piece or the rank count); the large ones are rarer so a
// run stays short over tcp.
const std::size_t small_counts[] = {1, 2, 3, 7, 8, 13, 64, 255, 256, 1000, 1024, 4099, 8192, 16384};
const std::size_t large_counts[] = {65536 + 5, 131072, 262144 + 3, 1 << 20};
const dtype types[] = {dtype::float32, dtype::int32, dtype::float64, dtype::uint8};
const reduce_op ops[] = {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::prod, reduce_op::avg};
constexpr std::size_t max_bytes = (std::size_t(1) << 20) * 8;

// `total` calls, cycling through dtypes, ops, in/out of place and sizes; every
// eighth call takes a large size.
std::vector<call> make_mix(int total) {
  std::vector<call> mix;
  const std::size_t ns = sizeof small_counts / sizeof *small_counts, nl = sizeof large_counts / sizeof *large_counts;
  for (int i = 0; i < total; ++i) {
    const std::size_t u = static_cast<std::size_t>(i);
    const std::size_t count = i % 8 == 7 ? large_counts[(u / 8) % nl] : small_counts[(u * 5) % ns];
    const dtype t = types[u % 4];
    // 4 MiB of float is the largest: the 8-byte type gets half the count.
    mix.push_back({t, ops[(u / 4) % 5], size_of(t) == 8 && count > 4096 ? count / 2 : count, (u / 3) % 2 == 1});
  }
  return mix;
}

// "window": the automatic choice, receiving into an alloc_shared() window
// (the in-place calls take the shared-window path).
const char* algos_shm[] = {"", "ring", "rd", "rhd", "tree", "direct", "window"};
const char* algos_tcp[] = {"", "ring", "rd", "rhd", "tree"};

std::string describe(const call& c, const char* algo, net n) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "allreduce of %zu x %s (%zu bytes), %s, %s, CCLITE_ALGO=%s, over %s", c.count,
                to_string(c.type), c.count * size_of(c.type), to_string(c.op), c.in_place ? "in place" : "out of place",
                *algo ? algo : "(automatic)", test::to_string(n).c_str());
  return buf;
}

// One rank: for each algorithm a communicator, a warm-up pass, a counted pass.
int rank_main(int rank, int size, net n, const std::string& dir, const char* const* algos, int n_algos) {
  {
    void* warm[4];
    (void)::backtrace(warm, 4);  // loads the unwinder now, not inside a counted call
  }
  auto kv = test::open_dir_store(dir);
  std::vector<std::uint8_t> send(max_bytes), recv(max_bytes);
  for (std::size_t i = 0; i < max_bytes; ++i) send[i] = static_cast<std::uint8_t>(i * 7 + static_cast<std::size_t>(rank));
  const std::vector<call> mix = make_mix(1000 / n_algos + 1);
  int failed = 0;
  for (int a = 0; a < n_algos && failed == 0; ++a) {
    const bool window = std::strcmp(algos[a], "window") == 0;
    ::setenv("CCLITE_ALGO", *algos[a] && !window ? (std::string("allreduce:") + algos[a]).c_str() : "", 1);
    comm_options o;
    o.store_prefix = "alloc" + std::to_string(a);
    auto c = test::make_comm(*kv, rank, size, o);
    std::uint8_t* out = recv.data();
    if (window) {
      auto w = c->alloc_shared(max_bytes);
      MP_REQUIRE_OK(w.ok() ? status() : w.error());
      out = static_cast<std::uint8_t*>(w.value());
    }
    auto run = [&](const call& k) {
      // Small-integer inputs keep prod and avg finite: this test is about
      // allocation, allreduce_test checks values.
      if (k.in_place) std::memcpy(out, send.data(), k.count * size_of(k.type));
      return k.in_place ? c->allreduce(out, out, k.count, k.type, k.op)
                        : c->allreduce(send.data(), out, k.count, k.type, k.op);
    };
    for (const call& k : mix) MP_REQUIRE_OK(run(k));  // warm-up: lazy set-up happens here
    for (const call& k : mix) {
      g_count.store(0);
      g_armed.store(true);
      status st = run(k);
      g_armed.store(false);
      const long allocs = g_count.load();
      MP_REQUIRE_OK(st);
      if (allocs != 0) {
        std::fprintf(stderr, "rank %d: %ld heap allocation(s) inside %s; the first, %s(%zu), from:\n", rank, allocs,
                     describe(k, algos[a], n).c_str(), g_trace_kind, g_trace_bytes);
        if (g_have_trace.load()) ::backtrace_symbols_fd(g_trace, g_trace_depth, 2);
        MP_CHECK(allocs == 0);
        ++failed;
        break;  // one report per rank and transport is enough
      }
    }
    // No rank may close its links while another is still in a counted call:
    // polling a link its peer closed builds an error message (an allocation
    // that belongs to the peer's exit, not to the steady state).
    MP_REQUIRE_OK(c->barrier());
  }
  ::unsetenv("CCLITE_ALGO");
  return failed ? 1 : 0;
}

void run_net(net n) {
  test::temp_dir dir;
  const char* const* algos = n == net::tcp_only ? algos_tcp : algos_shm;
  const int n_algos = static_cast<int>(n == net::tcp_only ? sizeof algos_tcp / sizeof *algos_tcp : sizeof algos_shm / sizeof *algos_shm);
  auto r = test::run_ranks(
      2, [&](int rank, int size) { return rank_main(rank, size, n, dir.path, algos, n_algos); }, std::chrono::seconds(120),
      [&](int rank) { test::set_net_env(n, rank, 2); });
  const std::string what = std::string("net ") + test::to_string(n) + ": " + r.describe();
  INFO(what);
  CHECK(r.all_ok());
}

// A group of sends and receives (group_start / group_end): its transfer list
// and the engine's steps keep their capacity, so repeating a group of the
// same shape allocates nothing.
int group_main(int rank, int size, const std::string& dir) {
  auto kv = test::open_dir_store(dir);
  auto c = test::make_comm(*kv, rank, size);
  const int peer = 1 - rank;
  std::vector<std::uint8_t> out(3u << 20, static_cast<std::uint8_t>(rank)), in(out.size());
  auto group = [&](std::size_t bytes) {
    c->group_start();
    status st = c->send(out.data(), bytes, dtype::uint8, peer);
    if (st.ok()) st = c->recv(in.data(), bytes, dtype::uint8, peer);
    if (st.ok()) st = c->send(out.data(), 100, dtype::uint8, rank);  // and one to itself
    if (st.ok()) st = c->recv(in.data() + bytes, 100, dtype::uint8, rank);
    status end = c->group_end();
    return st.ok() ? end : st;
  };
  MP_REQUIRE_OK(group(out.size() - 100));  // warm-up: links, capacities
  for (std::size_t bytes : {std::size_t(8), std::size_t(4097), out.size() - 100}) {
    g_count.store(0);
    g_armed.store(true);
    status st = group(bytes);
    g_armed.store(false);
    MP_REQUIRE_OK(st);
    if (g_count.load() != 0) {
      std::fprintf(stderr, "rank %d: %ld heap allocation(s) inside a group of %zu bytes each way, the first %s(%zu)\n",
                   rank, g_count.load(), bytes, g_trace_kind, g_trace_bytes);
      if (g_have_trace.load()) ::backtrace_symbols_fd(g_trace, g_trace_depth, 2);
      return 1;
    }
  }
  MP_CHECK(in[0] == peer);
  MP_REQUIRE_OK(c->barrier());
  return 0;
}

}  // namespace

TEST_CASE("allreduce allocates nothing once set up: shm, every algorithm and a shared window") { run_net(net::shm_only); }

TEST_CASE("allreduce allocates nothing once set up: tcp, every algorithm") { run_net(net::tcp_only); }

// Waiting for a late rank allocates nothing either: with 3 or more ranks a
// ring rank waits in 2 ms slices (primitives::stall), and an expired slice
// must not build the timeout message the call's real deadline would get.
// Rank 2 sleeps 15 ms before each counted call; ranks 0 and 1 wait for it.
// Run again with the flight recorder on (CCLITE_TRACE_BUFFER=4: its ring
// wraps), whose records must not allocate either.
TEST_CASE("waiting for a late rank allocates nothing (3 ranks, ring, 2 ms wait slices), flight recorder off and on") {
  for (const char* trace : {"0", "4"}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        3,
        [&](int rank, int size) {
          {
            void* warm[4];
            (void)::backtrace(warm, 4);
          }
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, size);
          std::vector<float> v(16384, 1.0f);
          for (int i = 0; i < 3; ++i) MP_REQUIRE_OK(c->allreduce(v.data(), v.size()));
          long total = 0;
          for (int i = 0; i < 8; ++i) {
            if (rank == 2) ::usleep(15000);
            g_count.store(0);
            g_armed.store(true);
            status st = c->allreduce(v.data(), v.size());
            g_armed.store(false);
            MP_REQUIRE_OK(st);
            total += g_count.load();
            if (g_count.load() && g_have_trace.load()) {
              std::fprintf(stderr, "rank %d: heap allocation while waiting, the first %s(%zu), from:\n", rank,
                           g_trace_kind, g_trace_bytes);
              ::backtrace_symbols_fd(g_trace, g_trace_depth, 2);
            }
          }
          MP_CHECK(total == 0);
          MP_REQUIRE_OK(c->barrier());  // no link closes while a peer is in a counted call
          return 0;
        },
        std::chrono::seconds(60), [&](int rank) {
          test::set_net_env(net::shm_only, rank, 3);
          ::setenv("CCLITE_ALGO", "allreduce:ring", 1);
          ::setenv("CCLITE_TRACE_BUFFER", trace, 1);
        });
    INFO("CCLITE_TRACE_BUFFER=", trace, ": ", r.describe());
    CHECK(r.all_ok());
  }
}

TEST_CASE("the allocation counter sees operator new and malloc") {
  g_count.store(0);
  g_armed.store(true);
  int* p = new int(3);
  void* q = std::malloc(10);
  std::vector<char> v(100);
  g_armed.store(false);
  const long seen = g_count.load();
  delete p;
  std::free(q);
  CHECK(seen == 3);
}

TEST_CASE("a repeated group of sends and receives allocates nothing: shm, tcp") {
  for (net n : {net::shm_only, net::tcp_only}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        2, [&](int rank, int size) { return group_main(rank, size, dir.path); }, std::chrono::seconds(120),
        [&](int rank) { test::set_net_env(n, rank, 2); });
    INFO("net ", test::to_string(n), ": ", r.describe());
    CHECK(r.all_ok());
  }
}

#else  // CCLITE_ALLOC_TEST_OFF

TEST_CASE("allocation test (skipped: a sanitizer or a non-glibc C library owns malloc)") {
  MESSAGE("alloc_test does not run under sanitizers or without glibc");
}

#endif
