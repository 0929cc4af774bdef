// tests/shm_transport_test.cpp - cclite::shm over real POSIX shared memory between
// real processes (fork), with a file store in a temporary directory.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <cclite/bootstrap/file_store.hpp>
#include <cclite/shm/transport.hpp>
#include <support/mp.hpp>

static_assert(cclite::is_transport_v<cclite::shm::transport>);
static_assert(cclite::is_link_v<cclite::shm::link>);
static_assert(!std::is_copy_constructible_v<cclite::shm::link>);
static_assert(std::is_nothrow_move_constructible_v<cclite::shm::link>);

namespace {

using namespace std::chrono_literals;
using cclite::deadline;
using cclite::errc;
using cclite::wait_for;

/// A unique job tag per test case, so segment names of concurrent runs never clash.
std::string new_tag() {
  static int n = 0;
  return "t" + std::to_string(::getpid()) + "x" + std::to_string(++n);
}

/// Names in /dev/shm that start with "cclite-<tag>".
std::vector<std::string> shm_leftovers(const std::string& tag) {
  std::vector<std::string> out;
  std::string prefix = "cclite-" + tag;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

/// One rank's world: file store, everybody's peer_info, abort flag, context.
struct rank_env {
  std::unique_ptr<cclite::store> kv;
  std::vector<cclite::peer_info> peers;
  cclite::logger log;
  std::atomic<bool> aborted{false};
  cclite::transport_context ctx;
};

std::unique_ptr<rank_env> make_env(const std::string& dir, const std::string& tag, int rank,
                                   int size) {
  auto env = std::make_unique<rank_env>();
  auto fs = cclite::file_store::open(dir);
  MP_REQUIRE_OK(fs);
  env->kv = std::move(fs.value());
  cclite::peer_info me = cclite::local_peer_info(rank);
  me.transports = {"shm"};
  auto all =
      cclite::store_allgather(*env->kv, "peers", rank, size, me.serialize(), deadline::after(30s));
  MP_REQUIRE_OK(all);
  for (const auto& s : all.value()) {
    auto p = cclite::peer_info::parse(s);
    MP_REQUIRE_OK(p);
    env->peers.push_back(p.value());
  }
  env->log.set_rank(rank);
  env->ctx.rank = rank;
  env->ctx.size = size;
  env->ctx.peers = &env->peers;
  env->ctx.kv = env->kv.get();
  env->ctx.log = &env->log;
  env->ctx.aborted = &env->aborted;
  env->ctx.job_tag = tag;
  return env;
}

/// Byte `i` of the stream sent by `rank`.
inline std::uint8_t pattern(std::uint64_t i, int rank) {
  std::uint64_t x = (i >> 8) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(rank) * 77;
  return static_cast<std::uint8_t>(i ^ (x >> 56));
}

/// Streams `total` bytes each way at once through `l`, committing/consuming
/// pseudo-random (often odd) amounts up to `max_chunk`, and checks every byte.
/// Returns the number of wrong bytes.
std::uint64_t stream_both_ways(cclite::shm::link& l, int rank, int peer, std::uint64_t total,
                               std::size_t max_chunk) {
  std::uint64_t sent = 0, rcvd = 0, wrong = 0;
  std::uint64_t rng = 0x1234567ull + static_cast<std::uint64_t>(rank);
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return static_cast<std::size_t>(rng % max_chunk) + 1;
  };
  while (sent < total || rcvd < total) {
    bool progress = false;
    if (sent < total) {
      std::size_t want = next();
      if (want > total - sent) want = static_cast<std::size_t>(total - sent);
      auto r = l.send_reserve(want);
      if (!r.empty()) {
        for (std::size_t k = 0; k < r.size; ++k) r.data[k] = pattern(sent + k, rank);
        l.send_commit(r.size);
        sent += r.size;
        progress = true;
      }
    }
    if (rcvd < total) {
      auto p = l.recv_peek();
      if (!p.empty()) {
        std::size_t n = next();
        if (n > p.size) n = p.size;
        if (n > total - rcvd) n = static_cast<std::size_t>(total - rcvd);
        for (std::size_t k = 0; k < n; ++k) {
          if (p.data[k] != pattern(rcvd + k, peer)) {
            if (wrong == 0)
              std::fprintf(stderr, "rank %d: first wrong byte at offset %llu\n", rank,
                           static_cast<unsigned long long>(rcvd + k));
            ++wrong;
          }
        }
        l.recv_consume(n);
        rcvd += n;
        progress = true;
      }
    }
    if (!progress) {
      unsigned w = (sent < total ? 2u : 0u) | (rcvd < total ? 1u : 0u);
      MP_REQUIRE_OK(l.wait(static_cast<wait_for>(w), deadline::after(60s)));
    }
  }
  return wrong;
}

/// Sets `key` to "1" (test choreography between ranks).
void signal_key(rank_env& e, const std::string& key) { MP_REQUIRE_OK(e.kv->set(key, "1")); }
void wait_key(rank_env& e, const std::string& key) {
  MP_REQUIRE_OK(e.kv->get(key, deadline::after(60s)));
}

/// Sets or clears an environment variable for the scope of one test.
struct scoped_env {
  std::string name;
  scoped_env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~scoped_env() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("shm: enabled() follows CCLITE_SHM_DISABLE and NCCL_SHM_DISABLE") {
  ::unsetenv("CCLITE_SHM_DISABLE");
  ::unsetenv("NCCL_SHM_DISABLE");
  CHECK(cclite::shm::transport::enabled().value());
  {
    scoped_env e("CCLITE_SHM_DISABLE", "1");
    CHECK_FALSE(cclite::shm::transport::enabled().value());
  }
  {
    scoped_env e("NCCL_SHM_DISABLE", "1");
    CHECK_FALSE(cclite::shm::transport::enabled().value());
  }
  {
    scoped_env e("CCLITE_SHM_DISABLE", "maybe");
    auto r = cclite::shm::transport::enabled();
    CHECK_FALSE(r.ok());
    CHECK(r.error().code() == errc::invalid_argument);
  }
  CHECK(std::string(cclite::shm::transport::name) == "shm");
}

TEST_CASE("shm: can_connect needs the same host_id and another rank") {
  cclite::transport_context ctx;
  cclite::shm::transport t(ctx);
  cclite::peer_info a, b;
  a.rank = 0;
  b.rank = 1;
  a.host_id = b.host_id = "nodeA:boot1";
  CHECK(t.can_connect(a, b));
  CHECK(t.can_connect(b, a));
  b.host_id = "nodeB:boot2";
  CHECK_FALSE(t.can_connect(a, b));
  CHECK_FALSE(t.can_connect(b, a));
  CHECK_FALSE(t.can_connect(a, a));
}

TEST_CASE("shm: options from CCLITE_SHM_BUFFSIZE and CCLITE_SHM_SPIN_US") {
  CHECK(cclite::shm::fifo_capacity(4 << 20).value() == (4u << 20));
  CHECK(cclite::shm::fifo_capacity(1).value() == (64u << 10));
  CHECK(cclite::shm::fifo_capacity((1 << 20) + 1).value() == (1u << 20) + 4096);
  CHECK_FALSE(cclite::shm::fifo_capacity(0).ok());
  CHECK_FALSE(cclite::shm::fifo_capacity(-5).ok());
  {
    scoped_env e("CCLITE_SHM_BUFFSIZE", "100K");
    CHECK(cclite::shm::options::from_env().value().buffer_bytes == 102400);
  }
  {
    scoped_env e("CCLITE_SHM_BUFFSIZE", "100001");
    CHECK(cclite::shm::options::from_env().value().buffer_bytes == 102400);
  }
  {  // the generic per-peer size (NCCL_BUFFSIZE's meaning) when the shm one is unset
    scoped_env e("CCLITE_BUFFSIZE", "256K");
    CHECK(cclite::shm::options::from_env().value().buffer_bytes == (256u << 10));
    scoped_env f("CCLITE_SHM_BUFFSIZE", "128K");  // the transport's own wins
    CHECK(cclite::shm::options::from_env().value().buffer_bytes == (128u << 10));
  }
  {
    scoped_env e("NCCL_BUFFSIZE", "1M");
    CHECK(cclite::shm::options::from_env().value().buffer_bytes == (1u << 20));
  }
  {
    scoped_env e("CCLITE_BUFFSIZE", "2G");  // out of range: the error names where it came from
    auto o = cclite::shm::options::from_env();
    REQUIRE_FALSE(o.ok());
    CHECK(o.error().code() == errc::invalid_argument);
    CHECK(o.error().message().find("CCLITE_BUFFSIZE") != std::string::npos);
  }
  {
    scoped_env e("CCLITE_SHM_SPIN_US", "0");
    CHECK(cclite::shm::options::from_env().value().wait.spin.count() == 0);
  }
  {
    scoped_env e("CCLITE_SHM_SPIN_US", "-3");
    CHECK(cclite::shm::options::from_env().error().code() == errc::invalid_argument);
  }
  {
    scoped_env e("CCLITE_SHM_BUFFSIZE", "lots");
    cclite::transport_context ctx;
    cclite::shm::transport t(ctx);
    auto s = t.publish();
    CHECK(s.code() == errc::invalid_argument);
    CHECK(s.message().find("CCLITE_SHM_BUFFSIZE") != std::string::npos);
  }
}

TEST_CASE("shm: 64 MiB each way at once, every byte checked, nothing left in /dev/shm") {
  cclite::test::temp_dir dir;
  const std::string tag = new_tag();
  auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
    auto e = make_env(dir.path, tag, rank, size);
    cclite::shm::transport t(e->ctx);
    MP_REQUIRE_OK(t.publish());
    MP_REQUIRE(t.can_connect(e->ctx.self(), e->ctx.peer(1 - rank)));
    auto l = t.connect(1 - rank, deadline::after(30s));
    MP_REQUIRE_OK(l);
    // Connected: both sides have unlinked, the name is gone already.
    MP_CHECK(shm_leftovers(tag).empty());
    MP_CHECK(std::string(l.value().kind()) == "shm");
    MP_CHECK(l.value().peer() == 1 - rank);
    MP_CHECK(l.value().capacity() == cclite::shm::options::from_env().value().buffer_bytes);
    MP_CHECK(stream_both_ways(l.value(), rank, 1 - rank, 64ull << 20, 300000) == 0);
    MP_CHECK(l.value().poll().ok());
    // The link lives in a std::variant in the communicator: it must survive a move.
    cclite::shm::link moved = std::move(l.value());
    MP_CHECK(moved.valid() && !l.value().valid());
    MP_CHECK(stream_both_ways(moved, rank, 1 - rank, 1 << 20, 4096) == 0);
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
  CHECK(shm_leftovers(tag).empty());
}

TEST_CASE("shm: small odd-sized messages through a 64 KiB ring") {
  cclite::test::temp_dir dir;
  const std::string tag = new_tag();
  auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
    auto e = make_env(dir.path, tag, rank, size);
    cclite::shm::options o;
    o.buffer_bytes = 1000;  // rounded up to the 64 KiB minimum
    cclite::shm::transport t(e->ctx, o);
    MP_REQUIRE_OK(t.publish());
    auto l = t.connect(1 - rank, deadline::after(30s));
    MP_REQUIRE_OK(l);
    MP_CHECK(l.value().capacity() == (64u << 10));
    // 1..97-byte commits and consumes: every one of them is odd-aligned somewhere,
    // and the ring wraps ~60 times at odd offsets.
    MP_CHECK(stream_both_ways(l.value(), rank, 1 - rank, 4ull << 20, 97) == 0);
    // 1-byte steps.
    MP_CHECK(stream_both_ways(l.value(), rank, 1 - rank, 200000, 1) == 0);
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
  CHECK(shm_leftovers(tag).empty());
}

TEST_CASE("shm: three ranks connect pairwise in ascending pair order") {
  cclite::test::temp_dir dir;
  const std::string tag = new_tag();
  auto r = cclite::test::run_ranks(3, [&](int rank, int size) {
    auto e = make_env(dir.path, tag, rank, size);
    cclite::shm::transport t(e->ctx);
    MP_REQUIRE_OK(t.publish());
    std::vector<cclite::shm::link> links;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      auto l = t.connect(p, deadline::after(30s));
      MP_REQUIRE_OK(l);
      links.push_back(std::move(l.value()));
    }
    for (auto& l : links) MP_CHECK(stream_both_ways(l, rank, l.peer(), 3 << 20, 65536) == 0);
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
  CHECK(shm_leftovers(tag).empty());
}

TEST_CASE("shm: wait with no sender times out at its deadline") {
  cclite::test::temp_dir dir;
  const std::string tag = new_tag();
  auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
    auto e = make_env(dir.path, tag, rank, size);
    cclite::shm::transport t(e->ctx);
    MP_REQUIRE_OK(t.publish());
    auto l = t.connect(1 - rank, deadline::after(30s));
    MP_REQUIRE_OK(l);
    if (rank == 0) {
      auto t0 = cclite::clock::now();
      auto s = l.value().wait(wait_for::recv, deadline::after(200ms));
      auto dt = cclite::clock::now() - t0;
      MP_CHECK(s.code() == errc::timeout);
      MP_CHECK(s.message().find("timed out waiting for data from") != std::string::npos);
      MP_CHECK(s.message().find("rank 1 (") != std::string::npos);
      MP_CHECK(s.message().find("pid " + std::to_string(e->peers[1].pid)) != std::string::npos);
      MP_CHECK(dt >= 190ms);
      MP_CHECK(dt < 20s);  // a hang guard, not a timing test
      signal_key(*e, "done");
    } else {
      wait_key(*e, "done");
    }
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
  CHECK(shm_leftovers(tag).empty());
}

TEST_CASE("shm: abort flag set from another thread ends a wait with errc::aborted") {
  cclite::test::temp_dir dir;
  const std::string tag = new_tag();
  auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
    auto e = make_env(dir.path, tag, rank, size);
    cclite::shm::transport t(e->ctx);
    MP_REQUIRE_OK(t.publish());
    auto l = t.connect(1 - rank, deadline::after(30s));
    MP_REQUIRE_OK(l);
    if (rank == 0) {
      std::thread aborter([&] {
        std::this_thread::sleep_for(100ms);
        e->aborted.store(true);
      });
      auto s = l.value().wait(wait_for::recv, deadline::after(60s));
      aborter.join();
      MP_CHECK(s.code() == errc::aborted);
      MP_CHECK(s.message().find("rank 1 (") != std::string::npos);
      signal_key(*e, "done");
    } else {
      wait_key(*e, "done");
    }
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
  CHECK(shm_leftovers(tag).empty());
}

TEST_CASE("shm: a peer that destroys its link mid-stream is reported as peer_lost") {
  cclite::test::temp_dir dir;
  const std::string tag = new_tag();
  auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
    auto e = make_env(dir.path, tag, rank, size);
    cclite::shm::options o;
    o.buffer_bytes = 64 << 10;
    cclite::shm::transport t(e->ctx, o);
    MP_REQUIRE_OK(t.publish());
    auto l = t.connect(1 - rank, deadline::after(30s));
    MP_REQUIRE_OK(l);
    if (rank == 1) {
      auto w = l.value().send_reserve(1000);
      MP_REQUIRE(w.size == 1000);
      for (std::size_t k = 0; k < w.size; ++k) w.data[k] = pattern(k, 1);
      l.value().send_commit(1000);
      { cclite::shm::link gone = std::move(l.value()); }  // closes, the process lives on
      wait_key(*e, "done");
      return 0;
    }
    // Fill our direction completely: the peer never reads it.
    std::size_t filled = 0;
    for (;;) {
      auto w = l.value().send_reserve(1 << 20);
      if (w.empty()) break;
      l.value().send_commit(w.size);
      filled += w.size;
    }
    MP_CHECK(filled == (64u << 10));
    // What the peer sent before closing is still delivered ...
    std::size_t got = 0;
    while (got < 1000) {
      auto p = l.value().recv_peek();
      if (p.empty()) {
        MP_REQUIRE_OK(l.value().wait(wait_for::recv, deadline::after(30s)));
        continue;
      }
      for (std::size_t k = 0; k < p.size; ++k) MP_CHECK(p.data[k] == pattern(got + k, 1));
      got += p.size;
      l.value().recv_consume(p.size);
    }
    MP_CHECK(got == 1000);
    // ... then every wait and poll says peer_lost, promptly, although the peer process lives.
    auto s = l.value().wait(wait_for::recv, deadline::after(30s));
    MP_CHECK(s.code() == errc::peer_lost);
    MP_CHECK(s.message().find("rank 1 (") != std::string::npos);
    MP_CHECK(s.message().find("closed its shm link (peer exited or destroyed its communicator") != std::string::npos);
    MP_CHECK(l.value().wait(wait_for::send, deadline::after(30s)).code() == errc::peer_lost);
    MP_CHECK(l.value().wait(wait_for::any, deadline::after(30s)).code() == errc::peer_lost);
    MP_CHECK(l.value().poll().code() == errc::peer_lost);
    MP_CHECK(cclite::shm::detail::process_alive(e->peers[1].pid));
    signal_key(*e, "done");
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
  CHECK(shm_leftovers(tag).empty());
}

TEST_CASE("shm: a peer that failed closes its link with the reason, and the other side's peer_lost carries it") {
  const std::string why = "rank 1: allreduce #7 (1 x float, sum): connection to rank 5 (node2, pid 99) lost";
  const std::string longer = why + ": " + std::string(2000, 'x');  // past the 1 KiB field: cut, ending in "..."
  for (const std::string& reason : {why, longer}) {
    cclite::test::temp_dir dir;
    const std::string tag = new_tag();
    auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
      auto e = make_env(dir.path, tag, rank, size);
      cclite::shm::options o;
      o.buffer_bytes = 64 << 10;
      cclite::shm::transport t(e->ctx, o);
      MP_REQUIRE_OK(t.publish());
      auto l = t.connect(1 - rank, deadline::after(30s));
      MP_REQUIRE_OK(l);
      if (rank == 1) {
        l.value().close_because(reason);
        l.value().close_because("a second close changes nothing");
        wait_key(*e, "done");
        return 0;
      }
      auto s = l.value().wait(wait_for::recv, deadline::after(30s));
      MP_CHECK(s.code() == errc::peer_lost);
      const std::string m = s.message();
      MP_CHECK(m.rfind("rank 1 (", 0) == 0);
      if (reason == why) {
        MP_CHECK(m.find(" failed and closed its shm link: " + why) != std::string::npos);
        MP_CHECK(m.size() == m.find(why) + why.size());
      } else {
        MP_CHECK(m.find(" failed and closed its shm link: " + why + ": xxx") != std::string::npos);
        MP_CHECK(m.size() < 1100);
        MP_CHECK(m.compare(m.size() - 4, 4, "x...") == 0);
      }
      MP_CHECK(l.value().poll().code() == errc::peer_lost);
      signal_key(*e, "done");
      return 0;
    });
    CHECK_MESSAGE(r.all_ok(), r.describe());
    CHECK(shm_leftovers(tag).empty());
  }
}

TEST_CASE("shm: SIGKILL of one side mid-stream -> the other gets peer_lost, /dev/shm clean") {
  cclite::test::temp_dir dir;
  const std::string tag = new_tag();
  auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
    auto e = make_env(dir.path, tag, rank, size);
    cclite::shm::transport t(e->ctx);
    MP_REQUIRE_OK(t.publish());
    auto l = t.connect(1 - rank, deadline::after(30s));
    MP_REQUIRE_OK(l);
    auto& link = l.value();
    if (rank == 1) {
      // Send 3 MiB and receive at least 1 MiB (so rank 0 is surely streaming), then die hard.
      std::uint64_t sent = 0, rcvd = 0;
      while (sent < (3u << 20) || rcvd < (1u << 20)) {
        bool progress = false;
        if (sent < (3u << 20)) {
          auto w = link.send_reserve(1 << 16);
          if (!w.empty()) {
            std::memset(w.data, 0x5a, w.size);
            link.send_commit(w.size);
            sent += w.size;
            progress = true;
          }
        }
        auto p = link.recv_peek();
        if (!p.empty()) {
          rcvd += p.size;
          link.recv_consume(p.size);
          progress = true;
        }
        if (!progress) {
          unsigned w = (sent < (3u << 20) ? 2u : 0u) | 1u;
          MP_REQUIRE_OK(link.wait(static_cast<wait_for>(w), deadline::after(30s)));
        }
      }
      ::raise(SIGKILL);
    }
    // Rank 0 sends and receives until the peer is found gone.
    auto t0 = cclite::clock::now();
    std::uint64_t rcvd = 0;
    cclite::status s;
    for (;;) {
      bool progress = false;
      auto w = link.send_reserve(1 << 16);
      if (!w.empty()) {
        std::memset(w.data, 0xa5, w.size);
        link.send_commit(w.size);
        progress = true;
      }
      auto p = link.recv_peek();
      if (!p.empty()) {
        rcvd += p.size;
        link.recv_consume(p.size);
        progress = true;
      }
      if (!progress) {
        s = link.wait(wait_for::any, deadline::after(60s));
        if (!s.ok()) break;
      }
    }
    auto dt = cclite::clock::now() - t0;
    MP_CHECK(s.code() == errc::peer_lost);
    MP_CHECK(s.message().find("rank 1 (") != std::string::npos);
    MP_CHECK(s.message().find("gone") != std::string::npos);
    MP_CHECK(rcvd == (3u << 20));
    MP_CHECK(dt < 30s);  // a hang guard, not a timing test
    return 0;
  });
  CHECK_MESSAGE(r.exit_codes[0] == 0, r.describe());
  CHECK(r.exit_codes[1] == -SIGKILL);
  CHECK(shm_leftovers(tag).empty());
}

TEST_CASE("shm: SIGKILL during connect leaves nothing in /dev/shm") {
  SUBCASE("the opener dies before mapping: the creator unlinks and reports peer_lost") {
    cclite::test::temp_dir dir;
    const std::string tag = new_tag();
    auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
      auto e = make_env(dir.path, tag, rank, size);
      cclite::shm::transport t(e->ctx);
      MP_REQUIRE_OK(t.publish());
      if (rank == 1) {
        wait_key(*e, "shm/0-1");  // the creator has created and published its segment
        MP_CHECK(!shm_leftovers(tag).empty());
        ::raise(SIGKILL);
      }
      auto l = t.connect(1, deadline::after(60s));
      MP_REQUIRE(!l.ok());
      MP_CHECK(l.error().code() == errc::peer_lost);
      MP_CHECK(l.error().message().find("rank 1 (") != std::string::npos);
      MP_CHECK(shm_leftovers(tag).empty());
      return 0;
    });
    CHECK_MESSAGE(r.exit_codes[0] == 0, r.describe());
    CHECK(r.exit_codes[1] == -SIGKILL);
    CHECK(shm_leftovers(tag).empty());
  }
  SUBCASE("the creator dies after publishing: the opener unlinks at once, then peer_lost") {
    cclite::test::temp_dir dir;
    const std::string tag = new_tag();
    auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
      auto e = make_env(dir.path, tag, rank, size);
      cclite::shm::transport t(e->ctx);
      MP_REQUIRE_OK(t.publish());
      if (rank == 0) {
        // A second store handle (a store is used by one thread at a time).
        auto watch = cclite::file_store::open(dir.path);
        MP_REQUIRE_OK(watch);
        std::thread killer([&] {
          (void)watch.value()->get("shm/0-1", deadline::after(60s));
          ::raise(SIGKILL);
        });
        (void)t.connect(1, deadline::after(60s));
        killer.join();
        return 1;  // not reached
      }
      wait_key(*e, "shm/0-1");
      while (cclite::shm::detail::process_alive(e->peers[0].pid)) std::this_thread::sleep_for(5ms);
      auto l = t.connect(0, deadline::after(60s));
      cclite::status s = l.ok() ? l.value().wait(wait_for::recv, deadline::after(60s)) : l.error();
      MP_CHECK(s.code() == errc::peer_lost);
      MP_CHECK(shm_leftovers(tag).empty());
      return 0;
    });
    CHECK(r.exit_codes[0] == -SIGKILL);
    CHECK_MESSAGE(r.exit_codes[1] == 0, r.describe());
    CHECK(shm_leftovers(tag).empty());
  }
  SUBCASE("the creator dies before publishing: the opener removes the name it left") {
    cclite::test::temp_dir dir;
    const std::string tag = new_tag();
    auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
      auto e = make_env(dir.path, tag, rank, size);
      cclite::shm::transport t(e->ctx);
      MP_REQUIRE_OK(t.publish());
      if (rank == 0) {
        // What a creator killed between shm_open and store.set leaves behind.
        std::string name = "/cclite-" + tag + "-0-1";
        int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
        MP_REQUIRE(fd >= 0);
        signal_key(*e, "created");
        ::raise(SIGKILL);
      }
      wait_key(*e, "created");
      MP_CHECK(shm_leftovers(tag).size() == 1);
      auto l = t.connect(0, deadline::after(60s));
      MP_REQUIRE(!l.ok());
      MP_CHECK(l.error().code() == errc::peer_lost);
      MP_CHECK(shm_leftovers(tag).empty());
      return 0;
    });
    CHECK(r.exit_codes[0] == -SIGKILL);
    CHECK_MESSAGE(r.exit_codes[1] == 0, r.describe());
    CHECK(shm_leftovers(tag).empty());
  }
}

TEST_CASE("shm: connect times out at its deadline when the peer never comes") {
  cclite::test::temp_dir dir;
  const std::string tag = new_tag();
  auto r = cclite::test::run_ranks(2, [&](int rank, int size) {
    auto e = make_env(dir.path, tag, rank, size);
    cclite::shm::transport t(e->ctx);
    MP_REQUIRE_OK(t.publish());
    if (rank == 0) {
      auto l = t.connect(1, deadline::after(300ms));
      MP_REQUIRE(!l.ok());
      MP_CHECK(l.error().code() == errc::timeout);
      MP_CHECK(l.error().message().find("rank 1 (") != std::string::npos);
      MP_CHECK(shm_leftovers(tag).empty());  // the creator unlinked on its way out
      signal_key(*e, "done");
    } else {
      wait_key(*e, "done");
    }
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
  CHECK(shm_leftovers(tag).empty());
}
