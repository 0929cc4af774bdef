// split() and the hierarchical algorithm's children share the parent's
// connections (collective/link_pool.hpp): no new socket or shm segment for a
// pair the family already connected, a pair a child connects is reused by the
// parent, parent and child calls alternate correctly on one link, a child
// outlives its parent, calls issued in different orders are reported as a
// mismatch, abort() reaches the whole family. Also CCLITE_COST_MEASURE=1:
// every rank (and every child) charges the same measured figures. And dup():
// a communicator of the same ranks with connections of its own.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
using cclite::test::net;

namespace {

// The connections this process holds: sockets among its fds, and shared
// memory mappings (an shm link keeps its segment mapped, not open). The
// shm-direct algorithm's buffers ("-direct-") and its small calls' header
// pages ("-small-") are per communicator, not links.
struct conns {
  int sockets = 0, shm_maps = 0;
  bool operator==(const conns& o) const { return sockets == o.sockets && shm_maps == o.shm_maps; }
  bool operator!=(const conns& o) const { return !(*this == o); }
};

conns count_conns() {
  conns c;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      char path[300], target[256];
      std::snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
      const ssize_t n = ::readlink(path, target, sizeof target - 1);
      if (n > 0 && std::strncmp(target, "socket:", 7) == 0) ++c.sockets;
    }
    ::closedir(d);
  }
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("/dev/shm/") != std::string::npos && line.find("-direct-") == std::string::npos &&
        line.find("-small-") == std::string::npos)
      ++c.shm_maps;
  return c;
}

void report(const char* what, int rank, conns before, conns after) {
  if (before != after)
    std::fprintf(stderr, "rank %d: %s: sockets %d -> %d, shm mappings %d -> %d\n", rank, what, before.sockets,
                 after.sockets, before.shm_maps, after.shm_maps);
}

// Sum of `x` over the ranks of `c`, checked against `want`.
int check_sum(default_communicator& c, std::int64_t x, std::int64_t want) {
  std::int64_t sum = 0;
  status st = c.allreduce(&x, &sum, 1, reduce_op::sum);
  MP_REQUIRE_OK(st);
  return sum == want ? 0 : 1;
}

// In-place alltoall on `c`: block r of rank me holds (me, r, i).
int check_alltoall_in_place(default_communicator& c, std::size_t count) {
  const int n = c.size(), me = c.rank();
  auto tag = [](int from, int to, std::size_t i) { return static_cast<std::uint32_t>(from * 7919 + to * 131 + i); };
  std::vector<std::uint32_t> buf(count * static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) buf[static_cast<std::size_t>(r) * count + i] = tag(me, r, i);
  MP_REQUIRE_OK(c.alltoall(buf.data(), buf.data(), count, dtype::uint32));
  int bad = 0;
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) bad += buf[static_cast<std::size_t>(r) * count + i] != tag(r, me, i);
  return bad;
}

std::int64_t tri(int n) { return static_cast<std::int64_t>(n) * (n - 1) / 2; }

void run(int size, net how, const char* algo, const std::function<int(int, int)>& fn, int seconds = 60) {
  auto r = test::run_ranks(size, fn, std::chrono::seconds(seconds), [&](int rank) {
    test::set_net_env(how, rank, size);
    ::setenv("CCLITE_ALGO", algo, 1);
  });
  INFO("size ", size, " net ", test::to_string(how), " CCLITE_ALGO=", algo, ": ", r.describe());
  CHECK(r.all_ok());
}

// Parent fully connected first: split() and the child's collectives open
// nothing; parent and child calls alternate on the same links.
void shares_links(int size, net how) {
  test::temp_dir dir;
  run(size, how, "", [&](int rank, int n) {
    auto kv = test::open_dir_store(dir.path);
    auto c = test::make_comm(*kv, rank, n);
    // Connects every pair: over the links, not shm-direct's small path (its
    // slot is at most 1 KiB: 100 x n ints are more).
    int bad = check_alltoall_in_place(*c, 100);
    const conns before = count_conns();
    auto sub = c->split(rank % 2, -rank);
    MP_REQUIRE_OK(sub);
    default_communicator& s = *sub.value();
    const int members = (n - rank % 2 + 1) / 2;
    MP_CHECK(s.size() == members);
    for (int round = 0; round < 3; ++round) {
      bad += check_sum(s, rank, rank % 2 == 0 ? 2 * tri(members) : 2 * tri(members) + members);
      bad += check_sum(*c, rank + round, tri(n) + n * round);
      bad += check_alltoall_in_place(s, 1031);
      std::int32_t b = s.rank() == 0 ? rank : -1;
      MP_REQUIRE_OK(s.broadcast(&b, 1, 0));
      bad += b != s.size() * 2 - 2 + rank % 2;  // key -rank: the highest rank of the colour is rank 0
      bad += check_alltoall_in_place(*c, 1031);
    }
    const conns after = count_conns();
    report("split and its calls", rank, before, after);
    MP_CHECK(before == after);
    MP_CHECK(bad == 0);
    return 0;
  });
}

}  // namespace

TEST_CASE("split: no new connections for connected members; parent and child alternate") {
  shares_links(4, net::mixed);
  shares_links(3, net::tcp_only);
  shares_links(5, net::shm_only);
}

// A child connects a pair the parent never used (0-2: not ring neighbours);
// the parent's later alltoall reuses it instead of connecting again.
TEST_CASE("split: a pair a child connects is the parent's too") {
  for (net how : {net::shm_only, net::tcp_only}) {
    test::temp_dir dir;
    run(4, how, "", [&](int rank, int n) {
      auto kv = test::open_dir_store(dir.path);
      auto c = test::make_comm(*kv, rank, n);
      const conns ring = count_conns();  // the two ring neighbours
      auto sub = c->split(rank % 2, rank);
      MP_REQUIRE_OK(sub);
      int bad = check_sum(*sub.value(), 1, 2);
      const conns child = count_conns();
      // One new link per rank (to the other member of its colour).
      MP_CHECK((child.sockets > ring.sockets) + (child.shm_maps > ring.shm_maps) == 1);
      bad += check_alltoall_in_place(*c, 5);  // needs 0-1, 0-2, 0-3: all there now
      const conns all = count_conns();
      report("parent alltoall after the child connected", rank, child, all);
      MP_CHECK(all == child);
      MP_CHECK(bad == 0);
      return 0;
    });
  }
}

TEST_CASE("split: hierarchical children open nothing either") {
  test::temp_dir dir;
  run(4, net::mixed, "allreduce:hier", [&](int rank, int n) {
    auto kv = test::open_dir_store(dir.path);
    auto c = test::make_comm(*kv, rank, n);
    int bad = check_alltoall_in_place(*c, 2);
    const conns before = count_conns();
    std::vector<std::int64_t> v(1000, rank), want(1000, tri(n));
    MP_REQUIRE_OK(c->allreduce(v.data(), v.size()));  // builds the node and cross-node children
    bad += v != want;
    bad += check_alltoall_in_place(*c, 1);
    const conns after = count_conns();
    report("hierarchical allreduce", rank, before, after);
    MP_CHECK(before == after);
    MP_CHECK(bad == 0);
    return 0;
  });
}

TEST_CASE("split: the child outlives its parent") {
  test::temp_dir dir;
  run(3, net::mixed, "", [&](int rank, int n) {
    auto kv = test::open_dir_store(dir.path);
    auto c = test::make_comm(*kv, rank, n);
    auto sub = c->split(0, rank);
    MP_REQUIRE_OK(sub);
    c.reset();  // the links stay: the child holds the pool
    int bad = check_sum(*sub.value(), rank, tri(n));
    bad += check_alltoall_in_place(*sub.value(), 100);
    MP_REQUIRE_OK(sub.value()->barrier());
    MP_CHECK(bad == 0);
    return 0;
  });
}

// Rank 0 calls parent then child, rank 1 child then parent: with shared links
// the call headers name the communicator, so both get errc::mismatch (never
// each other's data); the other communicator of the family then reports it.
TEST_CASE("split: parent and child in different orders on two ranks is a mismatch") {
  test::temp_dir dir;
  run(2, net::shm_only, "", [&](int rank, int n) {
    auto kv = test::open_dir_store(dir.path);
    comm_options o;
    o.timeout = milliseconds(15000);
    auto c = test::make_comm(*kv, rank, n, o);
    auto sub = c->split(0, rank, o);
    MP_REQUIRE_OK(sub);
    std::int32_t x = 1, y = 0;
    default_communicator& first = rank == 0 ? *c : *sub.value();
    default_communicator& second = rank == 0 ? *sub.value() : *c;
    status st = first.allreduce(&x, &y, 1, reduce_op::sum);
    MP_CHECK(!st.ok());
    std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
    if (st.code() == errc::mismatch) MP_CHECK(st.message().find("another communicator") != std::string::npos);
    status st2 = second.allreduce(&x, &y, 1, reduce_op::sum);
    MP_CHECK(!st2.ok());
    return 0;
  });
}

// dup(): the same ranks over connections of its own. Each rank drives the
// parent and its dup from two threads, started in opposite orders on
// neighbouring ranks and jittered per call, so the two communicators' calls
// interleave differently on every rank: with split() that is the mismatch
// above; with dup() every result is right. The dup opened connections, and
// aborting it leaves the parent working.
void dup_from_two_threads(int size, net how) {
  test::temp_dir dir;
  run(size, how, "", [&](int rank, int n) {
    auto kv = test::open_dir_store(dir.path);
    auto c = test::make_comm(*kv, rank, n);
    int bad = check_alltoall_in_place(*c, 100);  // every pair connected
    const conns before = count_conns();
    auto d = c->dup();
    MP_REQUIRE_OK(d);
    MP_CHECK(d.value()->rank() == rank && d.value()->size() == n);
    bad += check_alltoall_in_place(*d.value(), 100);
    const conns after = count_conns();
    MP_CHECK(after.sockets + after.shm_maps > before.sockets + before.shm_maps);
    constexpr int rounds = 200;
    std::atomic<int> wrong{0}, failed{0};
    auto drive = [&](default_communicator& comm, std::int64_t base, unsigned seed) {
      for (int i = 0; i < rounds; ++i) {
        if ((seed = seed * 1103515245u + 12345u) >> 30 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
        std::int64_t x = base + rank + i, sum = 0;
        status st = comm.allreduce(&x, &sum, 1, reduce_op::sum);
        if (!st.ok()) {
          if (failed++ == 0) std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
          return;
        }
        wrong += sum != n * (base + i) + tri(n);
      }
    };
    {
      std::thread first, second;
      if (rank % 2 == 0) {
        first = std::thread(drive, std::ref(*c), 0, 17u * rank + 1);
        second = std::thread(drive, std::ref(*d.value()), 1000000, 31u * rank + 7);
      } else {
        first = std::thread(drive, std::ref(*d.value()), 1000000, 31u * rank + 7);
        second = std::thread(drive, std::ref(*c), 0, 17u * rank + 1);
      }
      first.join();
      second.join();
    }
    MP_CHECK(failed == 0);
    MP_CHECK(wrong == 0);
    d.value()->abort();  // a family of its own: the parent goes on
    MP_CHECK(d.value()->barrier().code() == errc::aborted);
    bad += check_sum(*c, rank, tri(n));
    MP_CHECK(bad == 0);
    return 0;
  });
}

TEST_CASE("dup: connections of its own; parent and dup driven from two threads in any order") {
  dup_from_two_threads(2, net::shm_only);
  dup_from_two_threads(3, net::tcp_only);
  dup_from_two_threads(4, net::mixed);
}

// dup() under cclite::init(): every communicator of the job reaches the same
// store client (TCP, hosted by rank 0). Parent and dup make their first calls
// from two threads at once: gathers to each root and an alltoall (links
// connected on first use) and an allreduce whose first call meets the other
// ranks in the store (shm-direct's segments; mixed: the hierarchical
// algorithm's sub-communicators). Before the client served several threads,
// the two threads' requests interleaved on its one socket: "bad reply from the
// rendezvous store ... unknown reply status", or ranks hung.
void dup_first_connections_from_two_threads(net how) {
  const std::string port = std::to_string(test::free_port());
  REQUIRE(port != "0");
  constexpr int size = 4;
  auto r = test::run_ranks(
      size,
      [&](int rank, int n) {
        auto comm = cclite::init();
        MP_REQUIRE_OK(comm);
        auto& c = *comm.value();
        auto d = c.dup();
        MP_REQUIRE_OK(d);
        std::atomic<int> bad{0};
        auto drive = [&](default_communicator& x, std::int64_t base) {
          for (int root = 0; root < n; ++root) {
            std::int64_t mine = base + rank;
            std::vector<std::int64_t> all(static_cast<std::size_t>(n), -1);
            status st = x.gather(&mine, all.data(), 1, dtype::int64, root);
            if (!st.ok()) {
              std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
              ++bad;
              return;
            }
            if (rank == root)
              for (int p = 0; p < n; ++p) bad += all[static_cast<std::size_t>(p)] != base + p;
          }
          std::vector<std::int64_t> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n));
          for (int p = 0; p < n; ++p) out[static_cast<std::size_t>(p)] = base + rank * 100 + p;
          status st = x.alltoall(out.data(), in.data(), 1, dtype::int64);
          if (!st.ok()) {
            std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
            ++bad;
            return;
          }
          for (int p = 0; p < n; ++p) bad += in[static_cast<std::size_t>(p)] != base + p * 100 + rank;
          // The hierarchical allreduce builds its sub-communicators through the
          // store (mixed: CCLITE_ALGO below), shm-direct meets there too.
          std::vector<std::int64_t> v(4096, base + rank);
          st = x.allreduce(v.data(), v.size(), reduce_op::sum);
          if (!st.ok()) {
            std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
            ++bad;
            return;
          }
          bad += v[0] != n * base + tri(n) || v.back() != n * base + tri(n);
        };
        std::thread a(drive, std::ref(c), 0), b(drive, std::ref(*d.value()), 1000000);
        a.join();
        b.join();
        MP_CHECK(bad == 0);
        return bad == 0 ? 0 : 1;
      },
      std::chrono::seconds(60), [&](int rank) {
        test::set_net_env(how, rank, size);
        test::set_launch_env(rank, size, port);
        ::setenv("CCLITE_TIMEOUT", "30", 1);
        ::setenv("CCLITE_ALGO", how == net::mixed ? "allreduce:hier" : "", 1);
      });
  INFO("net ", test::to_string(how), ": ", r.describe());
  CHECK(r.all_ok());
}

TEST_CASE("dup: parent and dup connect on first use from two threads at once (one TCP store client)") {
  for (int round = 0; round < 3; ++round) {
    dup_first_connections_from_two_threads(net::tcp_only);
    dup_first_connections_from_two_threads(net::mixed);
  }
}

// Move-assigning an env_communicator over a live one (a program that re-inits)
// ends the old communicator, then its store and rank 0's store server, before
// it takes the new one; member by member, the store went first, under the
// communicator still using it. Three ranks over tcp: the second init() meets at
// another port; after the assignment the first store's port is closed on rank
// 0, and the assigned communicator reduces correctly.
TEST_CASE("init: an env_communicator assigned over a live one ends the old one, then takes the new") {
  const std::string port1 = std::to_string(test::free_port()), port2 = std::to_string(test::free_port());
  REQUIRE(port1 != "0");
  REQUIRE(port2 != "0");
  REQUIRE(port1 != port2);
  auto r = test::run_ranks(
      3,
      [&](int rank, int n) {
        auto comm = cclite::init();
        MP_REQUIRE_OK(comm);
        std::int64_t x = rank + 1;
        MP_REQUIRE_OK(comm.value()->allreduce(&x, 1));
        MP_CHECK(x == 6);
        ::setenv("MASTER_PORT", port2.c_str(), 1);
        auto again = cclite::init();
        MP_REQUIRE_OK(again);
        comm.value() = std::move(again.value());
        if (rank == 0) {  // the first store's server is gone with it
          const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(port1)));
          a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
          const int err = errno;
          ::close(fd);
          MP_CHECK(rc != 0);
          MP_CHECK(err == ECONNREFUSED);
        }
        std::vector<std::int64_t> v(1000, 10 * rank);
        MP_REQUIRE_OK(comm.value()->allreduce(v.data(), v.size()));
        MP_CHECK(comm.value()->size() == n);
        MP_CHECK(v[0] == 30 && v.back() == 30);
        return 0;
      },
      std::chrono::seconds(60), [&](int rank) {
        test::set_net_env(net::tcp_only, rank, 3);
        test::set_launch_env(rank, 3, port1);
        ::setenv("CCLITE_TIMEOUT", "30", 1);
      });
  INFO(r.describe());
  CHECK(r.all_ok());
}

// A dup() takes the parent's timeout, as set_timeout() left it: rank 1 never
// calls, so rank 0's call on the dup ends in errc::timeout after 5 s (with
// make_comm's 60 s it would end in peer_lost when rank 1 gives up waiting for
// rank 0's answer, after 50 s). The parent's set-up keeps make_comm's 60 s
// (slow under TSan on a loaded machine); the dup's own set-up gets the 5 s.
TEST_CASE("dup: the parent's timeout carries over") {
  test::temp_dir dir;
  run(2, net::shm_only, "", [&](int rank, int n) {
    auto kv = test::open_dir_store(dir.path);
    auto c = test::make_comm(*kv, rank, n);
    c->set_timeout(milliseconds(5000));
    auto d = c->dup();
    MP_REQUIRE_OK(d);
    MP_CHECK(d.value()->timeout() == milliseconds(5000));
    if (rank == 1) {
      (void)kv->get("test/answered", deadline::after(milliseconds(50000)));
      return 0;
    }
    std::int32_t x = 1, y = 0;
    status st = d.value()->allreduce(&x, &y, 1, reduce_op::sum);
    MP_REQUIRE_OK(kv->set("test/answered", "1"));
    std::fprintf(stderr, "rank 0: %s\n", st.to_string().c_str());
    MP_CHECK(st.code() == errc::timeout);
    return 0;
  });
}

TEST_CASE("split: abort() on a child aborts the family") {
  test::temp_dir dir;
  run(2, net::tcp_only, "", [&](int rank, int n) {
    auto kv = test::open_dir_store(dir.path);
    auto c = test::make_comm(*kv, rank, n);
    auto sub = c->split(0, rank);
    MP_REQUIRE_OK(sub);
    MP_REQUIRE_OK(c->barrier());
    sub.value()->abort();
    MP_CHECK(sub.value()->barrier().code() == errc::aborted);
    MP_CHECK(c->barrier().code() == errc::aborted);
    return 0;
  });
}

// CCLITE_COST_MEASURE=1 with CCLITE_COST_SHM set: tcp figures measured, shm
// from the environment, identical on every rank and in the children.
TEST_CASE("cost model: measured at creation, agreed by all ranks") {
  for (int size : {2, 3, 4}) {
    test::temp_dir dir;
    const net how = size == 3 ? net::tcp_only : net::mixed;
    auto r = test::run_ranks(
        size,
        [&](int rank, int n) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, n);
          const cost_model& m = c->costs();
          MP_CHECK(std::string(m.source("tcp")) == "measured");
          MP_CHECK(std::string(m.source("shm")) == "env");
          MP_CHECK(m.of("shm").alpha_us == 0.5);
          const link_cost tcp = m.of("tcp");
          MP_CHECK(tcp.alpha_us > 0);
          MP_CHECK(tcp.beta_us_per_byte > 0);
          // The charged link is the job's slowest kind: tcp in all these jobs.
          MP_CHECK(m.link().alpha_us == tcp.alpha_us);
          // Every rank holds the same figures, bit for bit.
          double mine[2] = {tcp.alpha_us, tcp.beta_us_per_byte};
          std::vector<double> all(2 * static_cast<std::size_t>(n));
          MP_REQUIRE_OK(c->allgather(mine, all.data(), 2, dtype::float64));
          for (int q = 0; q < n; ++q) {
            MP_CHECK(all[2 * static_cast<std::size_t>(q)] == mine[0]);
            MP_CHECK(all[2 * static_cast<std::size_t>(q) + 1] == mine[1]);
          }
          // and so the same algorithm for every size
          for (std::size_t b = 8; b <= (64u << 20); b *= 8) {
            std::int32_t a = static_cast<std::int32_t>(c->choose_algorithm(collective_kind::allreduce, b)), lo = a, hi = a;
            MP_REQUIRE_OK(c->allreduce(&lo, 1, reduce_op::min));
            MP_REQUIRE_OK(c->allreduce(&hi, 1, reduce_op::max));
            MP_CHECK(lo == hi);
          }
          auto sub = c->split(0, rank);  // children inherit the agreed figures
          MP_REQUIRE_OK(sub);
          MP_CHECK(sub.value()->costs().of("tcp").alpha_us == tcp.alpha_us);
          MP_CHECK(sub.value()->costs().of("tcp").beta_us_per_byte == tcp.beta_us_per_byte);
          return 0;
        },
        std::chrono::seconds(60), [&](int rank) {
          test::set_net_env(how, rank, size);
          ::setenv("CCLITE_COST_MEASURE", "1", 1);
          ::setenv("CCLITE_COST_SHM", "0.5,4", 1);
        });
    INFO("size ", size, ": ", r.describe());
    CHECK(r.all_ok());
  }
}
