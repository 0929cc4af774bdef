// TCP transport: real processes over real sockets, meeting in a file store.
//   - the hello frame, endpoints and env settings (pure)
//   - 2 ranks streaming 64 MiB each way at once, every byte checked, nsocks 1 and 4
//   - odd geometry (3 sockets, block and ring that do not divide each other)
//   - 3 ranks fully connected, all pairs exchanging at once
//   - strangers on the listening port during connect do not break the job
//   - SIGKILL of one side -> peer_lost on the other; no sender -> timeout
#include <cclite/bootstrap/file_store.hpp>
#include <cclite/tcp/transport.hpp>
#include <cclite/transport/direct.hpp>

#include <doctest/doctest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/mp.hpp"

using namespace cclite;
using std::chrono::seconds;

static_assert(is_transport_v<tcp::transport>);
static_assert(is_link_v<tcp::link>);
static_assert(std::is_nothrow_move_constructible_v<tcp::link>);
static_assert(!std::is_copy_constructible_v<tcp::link>);

namespace {

// One rank's view of the job: store, peers, context, transport. Lives on the
// child's stack (the transport keeps pointers into it).
struct node {
  std::unique_ptr<file_store> kv;
  std::vector<peer_info> peers;
  std::atomic<bool> aborted{false};
  transport_context ctx;
  std::optional<tcp::transport> tp;
  std::vector<std::optional<tcp::link>> links;
};

// Opens the store, exchanges peer_info, builds the transport and publishes.
void init(node& n, const std::string& dir, int rank, int size, const std::string& tag) {
  auto fs = file_store::open(dir);
  MP_REQUIRE_OK(fs);
  n.kv = std::move(fs.value());
  peer_info me = local_peer_info(rank);
  me.transports = {"tcp"};
  auto all = store_allgather(*n.kv, "peers", rank, size, me.serialize(), deadline::after(seconds(30)));
  MP_REQUIRE_OK(all);
  for (const auto& s : all.value()) {
    auto p = peer_info::parse(s);
    MP_REQUIRE_OK(p);
    n.peers.push_back(p.value());
  }
  n.ctx.rank = rank;
  n.ctx.size = size;
  n.ctx.peers = &n.peers;
  n.ctx.kv = n.kv.get();
  n.ctx.aborted = &n.aborted;
  n.ctx.job_tag = tag;
  n.tp.emplace(n.ctx);
  MP_REQUIRE_OK(n.tp->publish());
  n.links.resize(static_cast<std::size_t>(size));
}

// Connects every pair in ascending (min, max) order, as the communicator does.
void connect_all(node& n, deadline until) {
  int me = n.ctx.rank;
  for (int a = 0; a < n.ctx.size; ++a) {
    for (int b = a + 1; b < n.ctx.size; ++b) {
      if (a != me && b != me) continue;
      int other = a == me ? b : a;
      auto l = n.tp->connect(other, until);
      MP_REQUIRE_OK(l);
      MP_CHECK(l->peer() == other);
      MP_CHECK(std::strcmp(l->kind(), "tcp") == 0);
      n.links[static_cast<std::size_t>(other)].emplace(std::move(l.value()));
    }
  }
}

// The 8-byte word number k of the stream from rank src to rank dst.
inline std::uint64_t pattern(int src, int dst, std::uint64_t k) {
  std::uint64_t z = k + 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(src) * 131 + static_cast<std::uint64_t>(dst) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Byte `i` of the stream from rank src to rank dst.
inline std::uint8_t pattern_byte(int src, int dst, std::uint64_t i) {
  return static_cast<std::uint8_t>(pattern(src, dst, i / 8) >> (8 * (i % 8)));
}

// Writes / checks stream bytes [pos, pos + n): whole words in the middle,
// single bytes at unaligned edges (commits and consumes are of any size).
void fill(std::uint8_t* d, int src, int dst, std::uint64_t pos, std::size_t n) {
  std::size_t i = 0;
  for (; i < n && (pos + i) % 8 != 0; ++i) d[i] = pattern_byte(src, dst, pos + i);
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v = pattern(src, dst, (pos + i) / 8);
    std::memcpy(d + i, &v, 8);
  }
  for (; i < n; ++i) d[i] = pattern_byte(src, dst, pos + i);
}
bool matches(const std::uint8_t* d, int src, int dst, std::uint64_t pos, std::size_t n) {
  std::size_t i = 0;
  for (; i < n && (pos + i) % 8 != 0; ++i)
    if (d[i] != pattern_byte(src, dst, pos + i)) return false;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v;
    std::memcpy(&v, d + i, 8);
    if (v != pattern(src, dst, (pos + i) / 8)) return false;
  }
  for (; i < n; ++i)
    if (d[i] != pattern_byte(src, dst, pos + i)) return false;
  return true;
}

// Per-link progress of one exchange.
struct flow {
  std::uint64_t sent = 0, got = 0;
  std::size_t step = 0;
  bool bad = false;
};

// Sends `bytes` to every connected peer and receives as much from each, all
// links at once, through reserve/commit/peek/consume, checking every byte.
// Odd, varying commit and consume sizes exercise partial blocks, ring wraps
// and byte-granular delivery. `stop_after` > 0: return errc::aborted once that
// many bytes arrived from some peer (the caller then does something nasty).
status exchange(node& n, std::uint64_t bytes, deadline until, std::uint64_t stop_after = 0) {
  static const std::size_t send_sizes[] = {8, 4096, 41, 1 << 20, 65536 + 7, 3 << 20, 1, 256 << 10};
  static const std::size_t recv_sizes[] = {16, 2 << 20, 3, 131072 - 8, 4 << 20, 12345};
  const int me = n.ctx.rank;
  std::vector<flow> flows(n.links.size());
  for (;;) {
    bool all_done = true, progressed = false;
    for (std::size_t p = 0; p < n.links.size(); ++p) {
      if (!n.links[p]) continue;
      tcp::link& l = *n.links[p];
      flow& f = flows[p];
      const int peer = static_cast<int>(p);
      if (f.sent < bytes) {
        std::size_t want = send_sizes[f.step % 8];
        auto r = l.send_reserve(static_cast<std::size_t>(std::min<std::uint64_t>(want, bytes - f.sent)));
        if (r.size) {
          fill(r.data, me, peer, f.sent, r.size);
          l.send_commit(r.size);
          f.sent += r.size;
          progressed = true;
        }
      }
      if (f.got < bytes) {
        auto r = l.recv_peek();
        std::size_t take = std::min<std::size_t>(r.size, recv_sizes[f.step % 6]);
        if (take) {
          if (!matches(r.data, peer, me, f.got, take)) {
            f.bad = true;
            std::fprintf(stderr, "rank %d: wrong bytes in [%llu, +%zu) from rank %d\n", me,
                         (unsigned long long)f.got, take, peer);
          }
          l.recv_consume(take);
          f.got += take;
          progressed = true;
        }
      }
      ++f.step;
      if (f.bad) return make_error(errc::protocol_error, "corrupt data from rank %d", peer);
      if (stop_after && f.got >= stop_after) return make_error(errc::aborted, "stop_after reached");
      CCLITE_TRY(l.poll());
      all_done = all_done && f.sent == bytes && f.got == bytes;
    }
    if (all_done) break;
    if (!progressed) {
      // Block on the first unfinished link; every wait also drives its
      // output, and the other links are polled on the next pass.
      for (std::size_t p = 0; p < n.links.size(); ++p) {
        if (!n.links[p]) continue;
        flow& f = flows[p];
        if (f.sent == bytes && f.got == bytes) continue;
        wait_for w = f.got < bytes ? wait_for::recv : wait_for::send;
        if (f.sent < bytes && f.got < bytes) w = wait_for::any;
        deadline slice = deadline::min(until, deadline::after(milliseconds(n.links.size() > 2 ? 5 : 1000)));
        status s = n.links[p]->wait(w, slice);
        if (!s.ok() && !(s.code() == errc::timeout && !until.expired())) return s;
        break;
      }
    }
  }
  for (auto& l : n.links)
    if (l) CCLITE_TRY(l->flush(until));
  return {};
}

// Sets an environment variable in a child (setup hook).
void setenv_child(const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); }

}  // namespace

TEST_CASE("tcp: hello frame is 40 little-endian bytes") {
  tcp::hello h;
  h.job_hash = 0x0102030405060708ull;
  h.from_rank = 3;
  h.to_rank = 7;
  h.sock_index = 2;
  h.nsocks = 4;
  h.block = 131072;
  std::uint8_t b[tcp::hello_bytes];
  tcp::encode(h, b);
  CHECK(std::memcmp(b, "CCTC", 4) == 0);
  CHECK(b[4] == 1);
  CHECK(b[8] == 0x08);
  CHECK(b[15] == 0x01);
  CHECK(b[16] == 3);
  CHECK(b[20] == 7);
  CHECK(b[24] == 2);
  CHECK(b[28] == 4);
  CHECK(b[34] == 0x02);  // 131072 = 0x00020000
  tcp::hello d = tcp::decode(b);
  CHECK(d.is_hello());
  CHECK(d.job_hash == h.job_hash);
  CHECK(d.from_rank == 3);
  CHECK(d.to_rank == 7);
  CHECK(d.sock_index == 2);
  CHECK(d.nsocks == 4);
  CHECK(d.block == 131072);
  CHECK(tcp::fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(tcp::fnv1a64("a") == 0xaf63dc4c8601ec8cull);
}

TEST_CASE("tcp: hello validation rejects strangers with a reason") {
  const std::uint64_t job = tcp::fnv1a64("job");
  tcp::hello ok;
  ok.job_hash = job;
  ok.from_rank = 1;
  ok.to_rank = 5;
  ok.sock_index = 0;
  ok.nsocks = 2;
  ok.block = 131072;
  CHECK(tcp::reject_reason(ok, job, 5, 8).empty());
  auto bad = [&](auto mutate) {
    tcp::hello h = ok;
    mutate(h);
    return tcp::reject_reason(h, job, 5, 8);
  };
  CHECK(bad([](tcp::hello& h) { std::memcpy(h.magic, "GET ", 4); }).find("not a cclite") != std::string::npos);
  CHECK(bad([](tcp::hello& h) { h.version = 9; }).find("version 9") != std::string::npos);
  CHECK(bad([](tcp::hello& h) { h.job_hash ^= 1; }).find("another job") != std::string::npos);
  CHECK(bad([](tcp::hello& h) { h.to_rank = 4; }).find("addressed to rank 4") != std::string::npos);
  CHECK(!bad([](tcp::hello& h) { h.from_rank = 5; }).empty());  // higher ranks never connect
  CHECK(!bad([](tcp::hello& h) { h.from_rank = -1; }).empty());
  CHECK(!bad([](tcp::hello& h) { h.sock_index = 2; }).empty());
  CHECK(!bad([](tcp::hello& h) { h.nsocks = 17; }).empty());
  CHECK(!bad([](tcp::hello& h) { h.block = 100; }).empty());
}

TEST_CASE("tcp: endpoints round-trip through their store text") {
  auto e = tcp::endpoint::parse("192.0.2.2:41234");
  REQUIRE(e.ok());
  CHECK(e->family() == AF_INET);
  CHECK(e->port() == 41234);
  CHECK(e->to_string() == "192.0.2.2:41234");
  e = tcp::endpoint::parse("[fd00::2]:80");
  REQUIRE(e.ok());
  CHECK(e->family() == AF_INET6);
  CHECK(e->to_string() == "[fd00::2]:80");
  for (const char* bad : {"", "1.2.3.4", "1.2.3.4:", "1.2.3.4:0", "1.2.3.4:70000", "host:80",
                          "[fd00::2]80", "fd00::2:80x", "1.2.3.4:8a"}) {
    auto b = tcp::endpoint::parse(bad);
    CHECK_MESSAGE(!b.ok(), bad);
    if (!b.ok()) CHECK(b.error().code() == errc::protocol_error);
  }
}

TEST_CASE("tcp: listener probes: refused twice is a lost process, silent for 25 s a lost host") {
  using tcp::detail::listener_probe;
  using tcp::detail::probe_answer;
  using verdict = listener_probe::verdict;
  const auto t0 = clock::now();
  const auto at = [&](int ms) { return t0 + milliseconds(ms); };
  {
    listener_probe p(t0);
    CHECK_FALSE(p.due(at(999)));
    CHECK(p.due(at(1000)));
    CHECK(p.record(probe_answer::refused, at(1000)) == verdict::waiting);
    CHECK(p.due(at(2000)));  // confirmed 1 s later
    CHECK(p.record(probe_answer::listening, at(2000)) == verdict::waiting);  // a refusal and then not: alive
    CHECK(p.record(probe_answer::refused, at(4000)) == verdict::waiting);
    CHECK(p.record(probe_answer::refused, at(5000)) == verdict::refused);
  }
  {
    // Silent probes on the schedule (1, 3, 7, 15, 31 s): lost once 3 or more
    // span the silent limit (25 s), not before; an answer in between starts over.
    listener_probe p(t0);
    for (int ms : {1000, 3000, 7000, 15000}) CHECK(p.record(probe_answer::silent, at(ms)) == verdict::waiting);
    CHECK(p.record(probe_answer::silent, at(31000)) == verdict::silent);
    CHECK(p.silent_since() == at(1000));
    listener_probe q(t0);
    for (int ms : {1000, 3000, 7000}) CHECK(q.record(probe_answer::silent, at(ms)) == verdict::waiting);
    CHECK(q.record(probe_answer::listening, at(15000)) == verdict::waiting);
    CHECK(q.record(probe_answer::silent, at(45000)) == verdict::waiting);
    CHECK(q.record(probe_answer::silent, at(75000)) == verdict::waiting);  // 2 silences only
    CHECK(q.record(probe_answer::unknown, at(105000)) == verdict::waiting);  // no probe made: starts over
    CHECK(q.record(probe_answer::silent, at(135000)) == verdict::waiting);
    // CCLITE_TCP_KEEPALIVE=5: three silent probes spanning 5 s are enough.
    listener_probe r(t0, milliseconds(5000));
    for (int ms : {1000, 3000}) CHECK(r.record(probe_answer::silent, at(ms)) == verdict::waiting);
    CHECK(r.record(probe_answer::silent, at(7000)) == verdict::silent);
  }
  // Real answers on loopback: a listener, and its port once closed.
  auto l = tcp::detail::make_socket(AF_INET);
  REQUIRE(l.ok());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(l->get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(l->get(), 4) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(l->get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  auto ep = tcp::endpoint::parse("127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  REQUIRE(ep.ok());
  CHECK(tcp::detail::probe_listener(ep.value(), milliseconds(1000)) == probe_answer::listening);
  l = tcp::detail::make_socket(AF_INET);  // closes the listener
  CHECK(tcp::detail::probe_listener(ep.value(), milliseconds(1000)) == probe_answer::refused);
}

TEST_CASE("tcp: settings from the environment") {
  auto c = tcp::transport_config::from_env();
  REQUIRE(c.ok());
  CHECK(c->nsocks == 2);
  CHECK(c->buffsize == (4u << 20));
  CHECK(c->block == (128u << 10));
  CHECK(c->keepalive_s == 25);
  CHECK(c->direct_min == (1u << 20));
  auto expect_bad = [](const char* k, const char* v, const char* needle) {
    ::setenv(k, v, 1);
    auto r = tcp::transport_config::from_env();
    ::unsetenv(k);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK(r.error().message().find(needle) != std::string::npos);
  };
  expect_bad("CCLITE_NSOCKS", "0", "CCLITE_NSOCKS");
  expect_bad("CCLITE_NSOCKS", "17", "1..16");
  expect_bad("CCLITE_NSOCKS", "two", "not an integer");
  expect_bad("CCLITE_TCP_BUFFSIZE", "5000", "multiple of 4096");
  expect_bad("CCLITE_TCP_BLOCK", "1000", "CCLITE_TCP_BLOCK");
  expect_bad("CCLITE_BUFFSIZE", "5000", "CCLITE_BUFFSIZE=5000");  // the generic size, named
  expect_bad("CCLITE_TCP_KEEPALIVE", "2", "CCLITE_TCP_KEEPALIVE=2 must be between 3 and 86400");
  expect_bad("CCLITE_TCP_KEEPALIVE", "soon", "not an integer");
  expect_bad("CCLITE_TCP_DIRECT", "-1", "CCLITE_TCP_DIRECT=-1 must be between 0 (never) and 1T");
  ::setenv("NCCL_BUFFSIZE", "2M", 1);  // NCCL's per-peer buffer size applies when ours are unset
  c = tcp::transport_config::from_env();
  ::unsetenv("NCCL_BUFFSIZE");
  REQUIRE(c.ok());
  CHECK(c->buffsize == (2u << 20));
  ::setenv("CCLITE_NSOCKS", "4", 1);
  ::setenv("CCLITE_TCP_BUFFSIZE", "1M", 1);
  c = tcp::transport_config::from_env();
  ::unsetenv("CCLITE_NSOCKS");
  ::unsetenv("CCLITE_TCP_BUFFSIZE");
  REQUIRE(c.ok());
  CHECK(c->nsocks == 4);
  CHECK(c->buffsize == (1u << 20));

  CHECK(tcp::transport::enabled().value());
  ::setenv("CCLITE_TCP_DISABLE", "1", 1);
  CHECK_FALSE(tcp::transport::enabled().value());
  ::setenv("CCLITE_TCP_DISABLE", "maybe", 1);
  CHECK_FALSE(tcp::transport::enabled().ok());
  ::unsetenv("CCLITE_TCP_DISABLE");

  transport_context ctx;
  std::vector<peer_info> peers(2);
  peers[0].rank = 0;
  peers[1].rank = 1;
  ctx.peers = &peers;
  ctx.size = 2;
  tcp::transport t(ctx);
  CHECK(t.can_connect(peers[0], peers[1]));
  CHECK_FALSE(t.can_connect(peers[0], peers[0]));
  auto l = t.connect(1, deadline::after(milliseconds(10)));
  REQUIRE_FALSE(l.ok());
  CHECK(l.error().code() == errc::invalid_argument);  // publish() first
}

TEST_CASE("tcp: CCLITE_TCP_KEEPALIVE reaches every data socket, both ends") {
  // The default splits as documented (socket.hpp): 10 s idle + 3 probes 5 s apart.
  constexpr auto d = tcp::detail::keepalive_for(25);
  static_assert(d.idle_s == 10 && d.interval_s == 5 && d.count == 3);
  constexpr auto m = tcp::detail::keepalive_for(3);
  static_assert(m.idle_s == 1 && m.interval_s == 1 && m.count == 3);
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "keepalive");
        MP_CHECK(n.tp->config().keepalive_s == 8);
        connect_all(n, deadline::after(seconds(30)));
        const tcp::link& l = *n.links[static_cast<std::size_t>(1 - rank)];
        MP_CHECK(l.nsocks() == 3);
        for (int j = 0; j < l.nsocks(); ++j) {
          const int fd = l.native_handle(j);
          auto opt = [fd](int level, int name) {
            int v = -1;
            socklen_t len = sizeof v;
            return ::getsockopt(fd, level, name, &v, &len) == 0 ? v : -1;
          };
          MP_CHECK(opt(SOL_SOCKET, SO_KEEPALIVE) == 1);
          MP_CHECK(opt(IPPROTO_TCP, TCP_NODELAY) == 1);
          MP_CHECK(opt(IPPROTO_TCP, TCP_KEEPIDLE) == 5);  // 8 s: 5 idle + 3 probes 1 s apart
          MP_CHECK(opt(IPPROTO_TCP, TCP_KEEPINTVL) == 1);
          MP_CHECK(opt(IPPROTO_TCP, TCP_KEEPCNT) == 3);
          MP_CHECK(opt(IPPROTO_TCP, TCP_USER_TIMEOUT) == 8000);
        }
        return 0;
      },
      seconds(60),
      [&](int) {
        setenv_child("CCLITE_TCP_KEEPALIVE", "8");
        setenv_child("CCLITE_NSOCKS", "3");
        setenv_child("CCLITE_SOCKET_IFNAME", "=lo");
      });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

static void stream_two_ranks(int nsocks, std::uint64_t bytes, const char* buffsize = nullptr,
                             const char* block = nullptr) {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "stream");
        MP_CHECK(n.tp->config().nsocks == nsocks);
        connect_all(n, deadline::after(seconds(30)));
        MP_CHECK(n.links[static_cast<std::size_t>(1 - rank)]->nsocks() == nsocks);
        MP_REQUIRE_OK(exchange(n, bytes, deadline::after(seconds(90))));
        return 0;
      },
      seconds(150),
      [&](int) {
        setenv_child("CCLITE_NSOCKS", std::to_string(nsocks));
        setenv_child("CCLITE_SOCKET_IFNAME", "=lo");
        if (buffsize) setenv_child("CCLITE_TCP_BUFFSIZE", buffsize);
        if (block) setenv_child("CCLITE_TCP_BLOCK", block);
      });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("tcp: 2 ranks stream 64 MiB each way at once, nsocks=1") { stream_two_ranks(1, 64u << 20); }

TEST_CASE("tcp: 2 ranks stream 64 MiB each way at once, nsocks=4") { stream_two_ranks(4, 64u << 20); }

TEST_CASE("tcp: odd geometry: 3 sockets, 12K blocks, 40K rings") {
  stream_two_ranks(3, 8u << 20, "40K", "12K");
}

// Direct windows (transport/direct.hpp): messages that leave from and land
// in the caller's buffer, mixed with ring-staged ones in the same stream, in
// both directions at once, every byte checked. The geometry is odd on
// purpose (3 sockets, 12K blocks, a 40K ring, a 64K threshold): windows
// start mid-block, are longer and shorter than the ring, and begin after
// read-ahead has put part of them in the ring already. Either side picks
// direct or staged per message on its own; one send window opens empty and
// grows in steps, as a chain's middle rank forwards what arrived.
static_assert(direct::has_windows_v<tcp::link>, "tcp links offer direct windows (transport/direct.hpp)");

TEST_CASE("tcp: direct windows carry large messages beside staged ones, both ways at once") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "direct");
        connect_all(n, deadline::after(seconds(30)));
        tcp::link& l = *n.links[static_cast<std::size_t>(1 - rank)];
        const int peer = 1 - rank;
        const std::size_t sizes[] = {100000, 8, 300001, 65536, 5u << 20, 4095, (1u << 20) + 3, 40960, 70001};
        // Below the threshold a window is refused and nothing changes.
        std::uint8_t tiny[16];
        MP_CHECK(!l.recv_direct_begin(tiny, sizeof tiny));
        MP_CHECK(!l.send_direct_begin(tiny, sizeof tiny, sizeof tiny));
        MP_CHECK(!l.recv_direct_begin(tiny, sizeof tiny, true));
        MP_CHECK(!l.send_direct_begin(tiny, sizeof tiny, sizeof tiny, true));
        // A window that opens behind staged bytes and closes before any of
        // its own went (a verb whose other link refused its window) leaves
        // the link as it was: the staged bytes still arrive.
        auto head = l.send_reserve(8);
        MP_REQUIRE(head.size == 8);
        fill(head.data, rank, peer, 0, 8);
        l.send_commit(8);
        MP_REQUIRE(l.send_direct_begin(tiny, 0, 1u << 20));
        l.send_direct_end(status{});
        MP_REQUIRE_OK(l.poll());
        while (l.recv_peek().size < 8) MP_REQUIRE_OK(l.wait(wait_for::recv, deadline::after(seconds(10))));
        MP_CHECK(matches(l.recv_peek().data, peer, rank, 0, 8));
        l.recv_consume(8);
        std::uint64_t pos = 8;  // stream position of the message, the same both ways
        for (std::size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
          const std::size_t bytes = sizes[i];
          std::vector<std::uint8_t> src(bytes), out(bytes, 0xEE);
          fill(src.data(), rank, peer, pos, bytes);
          const bool grow = i == 2 && rank == 0;  // opens empty, grows by 10000
          // Odd messages as a sendrecv's: windows from a quarter of the threshold (16K).
          const bool exchange = i % 2 == 1;
          const std::size_t min = exchange ? 16u << 10 : 64u << 10;
          const bool send_direct = (i + static_cast<std::size_t>(rank)) % 3 != 0 &&
                                   l.send_direct_begin(src.data(), grow ? 0 : bytes, bytes, exchange);
          const bool recv_direct = (i + static_cast<std::size_t>(rank)) % 2 == 0 &&
                                   l.recv_direct_begin(out.data(), bytes, exchange);
          MP_CHECK(send_direct == ((i + static_cast<std::size_t>(rank)) % 3 != 0 && bytes >= min));
          MP_CHECK(recv_direct == ((i + static_cast<std::size_t>(rank)) % 2 == 0 && bytes >= min));
          if (send_direct) MP_CHECK(l.send_reserve(1).empty());  // the window owns the stream's end
          std::size_t ready = grow ? 0 : bytes, sent = send_direct ? bytes : 0, got = 0;
          while (true) {
            if (send_direct && ready < bytes) {
              ready = std::min(bytes, ready + 10000);
              l.send_direct_extend(ready);
            }
            if (!send_direct && sent < bytes) {
              auto w = l.send_reserve(bytes - sent);
              std::memcpy(w.data, src.data() + sent, w.size);
              l.send_commit(w.size);
              sent += w.size;
            }
            if (recv_direct) {
              got = l.recv_direct_arrived();
            } else if (got < bytes) {
              auto c = l.recv_peek();
              const std::size_t take = std::min(c.size, bytes - got);
              std::memcpy(out.data() + got, c.data, take);
              l.recv_consume(take);
              got += take;
            }
            const bool send_done = send_direct ? ready == bytes && l.send_direct_left() == 0 : sent == bytes;
            if (send_done && got == bytes) break;
            status st = l.wait(send_done ? wait_for::recv : got == bytes ? wait_for::send : wait_for::any,
                               deadline::after(milliseconds(20)));
            MP_REQUIRE(st.ok() || st.code() == errc::timeout);
          }
          if (send_direct) l.send_direct_end(status{});
          if (recv_direct) l.recv_direct_end(status{});
          MP_REQUIRE_OK(l.poll());
          if (!matches(out.data(), peer, rank, pos, bytes)) {
            std::fprintf(stderr, "rank %d: message %zu (%zu bytes, %s) wrong\n", rank, i, bytes,
                         recv_direct ? "direct" : "staged");
            return 1;
          }
          pos += bytes;
        }
        // Rank 0 gives up a receive window its peer has not filled: the link
        // fails for good and `out` is never written again, although the
        // peer's bytes come.
        std::vector<std::uint8_t> out(256u << 10, 0xEE);
        if (rank == 0) {
          MP_REQUIRE(l.recv_direct_begin(out.data(), out.size()));
          MP_CHECK(l.recv_direct_arrived() == 0);
          l.recv_direct_end(make_error(errc::timeout, "test gave up"));
          status st = l.poll();
          MP_CHECK(st.code() == errc::timeout);
          MP_CHECK(st.message().find("direct receive with rank 1 (") != std::string::npos);
          MP_CHECK(st.message().find("abandoned midway (the link is unusable): test gave up") != std::string::npos);
          MP_REQUIRE_OK(n.kv->set("abandoned", "1"));
          MP_REQUIRE_OK(n.kv->get("sent", deadline::after(seconds(30))));
          std::this_thread::sleep_for(milliseconds(100));
          MP_CHECK(l.poll().code() == errc::timeout);
          MP_CHECK(l.recv_peek().empty());
          for (std::uint8_t b : out) MP_REQUIRE(b == 0xEE);
          MP_REQUIRE_OK(n.kv->set("checked", "1"));
        } else {
          MP_REQUIRE_OK(n.kv->get("abandoned", deadline::after(seconds(30))));
          fill(out.data(), rank, peer, pos, out.size());
          MP_REQUIRE(l.send_direct_begin(out.data(), out.size(), out.size()));
          while (l.send_direct_left() != 0) MP_REQUIRE_OK(l.wait(wait_for::send, deadline::after(seconds(30))));
          l.send_direct_end(status{});
          MP_REQUIRE_OK(l.flush(deadline::after(seconds(30))));
          MP_REQUIRE_OK(n.kv->set("sent", "1"));
          MP_REQUIRE_OK(n.kv->get("checked", deadline::after(seconds(30))));
        }
        return 0;
      },
      seconds(120),
      [&](int) {
        setenv_child("CCLITE_NSOCKS", "3");
        setenv_child("CCLITE_TCP_BUFFSIZE", "40K");
        setenv_child("CCLITE_TCP_BLOCK", "12K");
        setenv_child("CCLITE_TCP_DIRECT", "64K");
        setenv_child("CCLITE_SOCKET_IFNAME", "=lo");
      });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

// Two ranks that each send 2 bytes and then wait for the other's 2 bytes (an
// fp16 element each, before any end-of-collective padding) must not deadlock:
// the link exposes bytes as they arrive, with no rounding.
TEST_CASE("tcp: a few bytes are delivered at once, whatever their count") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "small");
        connect_all(n, deadline::after(seconds(30)));
        tcp::link& l = *n.links[static_cast<std::size_t>(1 - rank)];
        std::uint64_t pos = 0;
        for (std::size_t len : {2, 1, 3, 5, 7, 6}) {
          auto w = l.send_reserve(len);
          MP_REQUIRE(w.size == len);
          fill(w.data, rank, 1 - rank, pos, len);
          l.send_commit(len);
          while (l.recv_peek().size < len) MP_REQUIRE_OK(l.wait(wait_for::recv, deadline::after(seconds(10))));
          // >= len: the peer may already have sent its next message.
          MP_CHECK(matches(l.recv_peek().data, 1 - rank, rank, pos, len));
          l.recv_consume(len);
          pos += len;
        }
        MP_REQUIRE_OK(l.flush(deadline::after(seconds(10))));
        return 0;
      },
      seconds(60));
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("tcp: IPv6 (::1) when the machine has it") {
  auto ifs = tcp::list_interfaces();
  REQUIRE(ifs.ok());
  if (!tcp::select_interface(ifs.value(), "=lo", "CCLITE_SOCKET_IFNAME", AF_INET6).ok()) {
    MESSAGE("no IPv6 on lo here; skipped");
    return;
  }
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "ipv6");
        MP_CHECK(n.tp->address().rfind("[::1]:", 0) == 0);
        connect_all(n, deadline::after(seconds(30)));
        MP_REQUIRE_OK(exchange(n, 4u << 20, deadline::after(seconds(60))));
        return 0;
      },
      seconds(90), [](int) {
        setenv_child("CCLITE_SOCKET_IFNAME", "=lo");
        setenv_child("CCLITE_SOCKET_FAMILY", "AF_INET6");
      });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("tcp: the connecting rank's nsocks and block win") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "mixed");
        connect_all(n, deadline::after(seconds(30)));
        const tcp::link& l = *n.links[static_cast<std::size_t>(1 - rank)];
        MP_CHECK(l.nsocks() == 3);
        MP_CHECK(l.block() == 8192);
        MP_REQUIRE_OK(exchange(n, 4u << 20, deadline::after(seconds(60))));
        return 0;
      },
      seconds(90),
      [&](int rank) {
        setenv_child("CCLITE_NSOCKS", rank == 0 ? "3" : "5");
        setenv_child("CCLITE_TCP_BLOCK", rank == 0 ? "8K" : "64K");
      });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("tcp: 3 ranks fully connected, every pair exchanging at once") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      3,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "three");
        connect_all(n, deadline::after(seconds(30)));
        // 16 MiB per pair and direction: far more than the rings and the
        // kernel buffers hold, so a rank that did not keep its output flowing
        // while waiting on another link would deadlock the ring.
        MP_REQUIRE_OK(exchange(n, 16u << 20, deadline::after(seconds(90))));
        return 0;
      },
      seconds(150), [](int) { setenv_child("CCLITE_TCP_BUFFSIZE", "256K"); });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

// Rank 2 of the store group is not part of the job: it connects to rank 1's
// listening port before rank 0 does and sends garbage, a hello of another job,
// a hello for another rank, and one connection that says nothing.
TEST_CASE("tcp: strangers on the listening port do not break the job") {
  test::temp_dir dir;
  std::string log_path = dir.path + "/rank1.log";
  auto r = test::run_ranks(
      3,
      [&](int rank, int) {
        if (rank == 2) {
          auto fs = file_store::open(dir.path);
          MP_REQUIRE_OK(fs);
          auto addr = fs.value()->get("tcp/1", deadline::after(seconds(30)));
          MP_REQUIRE_OK(addr);
          auto ep = tcp::endpoint::parse(addr.value());
          MP_REQUIRE_OK(ep);
          std::vector<tcp::socket_fd> keep;
          auto dial = [&](const void* bytes, std::size_t len) {
            int fd = ::socket(ep->family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
            MP_REQUIRE(fd >= 0);
            MP_REQUIRE(::connect(fd, ep->sa(), ep->size()) == 0);
            if (len) MP_REQUIRE(::send(fd, bytes, len, MSG_NOSIGNAL) == static_cast<ssize_t>(len));
            keep.emplace_back(fd);
          };
          const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789012345678901234567890123456789";
          dial(garbage, sizeof garbage);
          tcp::hello h;
          h.job_hash = tcp::fnv1a64("another job");
          h.from_rank = 0;
          h.to_rank = 1;
          h.nsocks = 2;
          h.block = 131072;
          std::uint8_t frame[tcp::hello_bytes];
          tcp::encode(h, frame);
          dial(frame, sizeof frame);
          h.job_hash = tcp::fnv1a64("strangers");
          h.to_rank = 0;  // wrong rank
          tcp::encode(h, frame);
          dial(frame, sizeof frame);
          dial(nullptr, 0);  // silent
          dial(frame, 3);    // a truncated frame that then hangs
          std::this_thread::sleep_for(milliseconds(300));  // let rank 1 read them first
          MP_REQUIRE_OK(fs.value()->set("strangers_done", "1"));
          auto done = fs.value()->get("job_done", deadline::after(seconds(60)));
          MP_REQUIRE_OK(done);
          return 0;
        }
        node n;
        init(n, dir.path, rank, 2, "strangers");
        if (rank == 0) MP_REQUIRE_OK(n.kv->get("strangers_done", deadline::after(seconds(30))));
        connect_all(n, deadline::after(seconds(30)));
        MP_REQUIRE_OK(exchange(n, 8u << 20, deadline::after(seconds(60))));
        if (rank == 1) MP_REQUIRE_OK(n.kv->set("job_done", "1"));
        return 0;
      },
      seconds(120), [&](int rank) {
        if (rank == 1) setenv_child("CCLITE_DEBUG_FILE", log_path);
      });
  CHECK_MESSAGE(r.all_ok(), r.describe());
  std::ifstream f(log_path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string log = ss.str();
  MESSAGE("rank 1 log:\n" << log);
  CHECK(log.find("not a cclite tcp peer") != std::string::npos);
  CHECK(log.find("another job") != std::string::npos);
  CHECK(log.find("addressed to rank 0") != std::string::npos);
}

TEST_CASE("tcp: SIGKILL of one side is peer_lost on the other") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "kill");
        connect_all(n, deadline::after(seconds(30)));
        if (rank == 1) {
          status s = exchange(n, 1ull << 40, deadline::after(seconds(30)), 8u << 20);
          MP_CHECK(s.code() == errc::aborted);  // stop_after reached
          ::kill(::getpid(), SIGKILL);
          return 1;
        }
        auto t0 = clock::now();
        status s = exchange(n, 1ull << 40, deadline::after(seconds(30)));
        double secs = std::chrono::duration<double>(clock::now() - t0).count();
        std::printf("rank 0 after SIGKILL of rank 1 (%.2f s): %s\n", secs, s.to_string().c_str());
        MP_CHECK(s.code() == errc::peer_lost);
        MP_CHECK(s.message().find("rank 1 (") != std::string::npos);
        MP_CHECK(s.message().find("pid " + std::to_string(n.peers[1].pid)) != std::string::npos);
        MP_CHECK(secs < 20);
        // Sticky: the link stays failed.
        MP_CHECK(n.links[1]->poll().code() == errc::peer_lost);
        return 0;
      },
      seconds(60));
  REQUIRE(r.exit_codes.size() == 2);
  CHECK_MESSAGE(r.exit_codes[0] == 0, r.describe());
  CHECK_MESSAGE(r.exit_codes[1] == -SIGKILL, r.describe());
}

TEST_CASE("tcp: wait without a sender times out; abort is seen; clean close is peer_lost") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "timeout");
        connect_all(n, deadline::after(seconds(30)));
        tcp::link& l = *n.links[static_cast<std::size_t>(1 - rank)];
        if (rank == 1) {
          auto t0 = clock::now();
          status s = l.wait(wait_for::recv, deadline::after(milliseconds(200)));
          double secs = std::chrono::duration<double>(clock::now() - t0).count();
          MP_CHECK(s.code() == errc::timeout);
          MP_CHECK(s.message().find("waiting for data from rank 0 (") != std::string::npos);
          MP_CHECK(secs >= 0.19 && secs < 5);
          MP_CHECK(l.poll().ok());  // a timeout does not break the link

          n.aborted = true;
          t0 = clock::now();
          s = l.wait(wait_for::recv, deadline::after(seconds(30)));
          MP_CHECK(s.code() == errc::aborted);
          MP_CHECK(clock::now() - t0 < seconds(5));
          n.aborted = false;
          MP_REQUIRE_OK(n.kv->set("phase1", "1"));

          // Rank 0 sends 8 bytes and closes: we get them, then peer_lost.
          while (l.recv_peek().size < 8) MP_REQUIRE_OK(l.wait(wait_for::recv, deadline::after(seconds(30))));
          MP_CHECK(l.recv_peek().size == 8);
          MP_CHECK(std::memcmp(l.recv_peek().data, "12345678", 8) == 0);
          l.recv_consume(8);
          s = l.wait(wait_for::recv, deadline::after(seconds(30)));
          MP_CHECK(s.code() == errc::peer_lost);
          MP_CHECK(s.message().find("rank 0 (") != std::string::npos);
          return 0;
        }
        MP_REQUIRE_OK(n.kv->get("phase1", deadline::after(seconds(30))));
        auto w = l.send_reserve(8);
        MP_REQUIRE(w.size == 8);
        std::memcpy(w.data, "12345678", 8);
        l.send_commit(8);
        MP_REQUIRE_OK(l.flush(deadline::after(seconds(30))));
        return 0;  // closes the link
      },
      seconds(60));
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

// Both sides of a connect that cannot complete: abort() (set from another
// thread while the connect waits) and a deadline, each reported with the peer.
// Phases run one side at a time, sequenced through the store.
TEST_CASE("tcp: connect timeouts name the peer; abort stops a connect") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "connect-timeout");
        auto abort_soon = [&] {
          return std::thread([&] {
            std::this_thread::sleep_for(milliseconds(200));
            n.aborted = true;
          });
        };
        if (rank == 1) {
          // Rank 0 has not connected yet: the accepting side waits, then stops.
          std::thread t = abort_soon();
          auto t0 = clock::now();
          auto l = n.tp->connect(0, deadline::after(seconds(30)));
          t.join();
          MP_REQUIRE(!l.ok());
          MP_CHECK(l.error().code() == errc::aborted);
          MP_CHECK(clock::now() - t0 < seconds(5));
          n.aborted = false;
          l = n.tp->connect(0, deadline::after(milliseconds(300)));
          MP_REQUIRE(!l.ok());
          MP_CHECK(l.error().code() == errc::timeout);
          MP_CHECK(l.error().message().find("waiting for rank 0 (") != std::string::npos);
          MP_REQUIRE_OK(n.kv->set("accept_side_done", "1"));
          MP_REQUIRE_OK(n.kv->get("done", deadline::after(seconds(30))));
          return 0;
        }
        MP_REQUIRE_OK(n.kv->get("accept_side_done", deadline::after(seconds(30))));
        // Rank 1 no longer accepts: TCP connects (backlog) but no ack comes.
        std::thread t = abort_soon();
        auto t0 = clock::now();
        auto l = n.tp->connect(1, deadline::after(seconds(30)));
        t.join();
        MP_REQUIRE(!l.ok());
        MP_CHECK(l.error().code() == errc::aborted);
        MP_CHECK(clock::now() - t0 < seconds(5));
        n.aborted = false;
        l = n.tp->connect(1, deadline::after(milliseconds(300)));
        MP_REQUIRE(!l.ok());
        MP_CHECK(l.error().code() == errc::timeout);
        MP_CHECK(l.error().message().find("rank 1 (") != std::string::npos);
        MP_REQUIRE_OK(n.kv->set("done", "1"));
        return 0;
      },
      seconds(60));
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("tcp: connecting to a rank whose listener is gone is peer_lost, not a long hang") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        node n;
        init(n, dir.path, rank, size, "gone");
        if (rank == 1) {
          n.tp.reset();  // closes the listening socket
          MP_REQUIRE_OK(n.kv->set("gone", "1"));
          return 0;
        }
        MP_REQUIRE_OK(n.kv->get("gone", deadline::after(seconds(30))));
        auto t0 = clock::now();
        auto l = n.tp->connect(1, deadline::after(seconds(60)));
        MP_REQUIRE(!l.ok());
        MP_CHECK(l.error().code() == errc::peer_lost);
        MP_CHECK(l.error().message().find("rank 1 (") != std::string::npos);
        // Refused, as a rule; but the freed port may already belong to another
        // process (the suite runs programs side by side: CI met it once, well
        // before the 10 s of refusals), whose listener answers and drops our
        // hello: still peer_lost naming rank 1, during the handshake.
        const std::string& m = l.error().message();
        if (m.find("refused") == std::string::npos && m.find("handshake") == std::string::npos)
          std::fprintf(stderr, "unexpected: %s\n", l.error().to_string().c_str());
        MP_CHECK((m.find("refused") != std::string::npos || m.find("handshake") != std::string::npos));
        MP_CHECK(clock::now() - t0 < seconds(30));
        return 0;
      },
      seconds(90));
  CHECK_MESSAGE(r.all_ok(), r.describe());
}
