// The TCP rendezvous store under hostile input, with real processes: 10,000
// idle connections against a server in its own process, and strangers (and a
// broken insider) throwing garbage and truncated frames at the store port
// while a real 2-rank job bootstraps through it and runs collectives.
#include <cclite/tcp/rendezvous.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"
#include "support/raw_conn.hpp"

using namespace cclite;
using std::chrono::milliseconds;

namespace {

using test::raw_conn;  // the stranger's side

std::vector<std::uint8_t> header(std::uint8_t op, std::uint32_t key_len, std::uint32_t value_len) {
  std::vector<std::uint8_t> h(tcp::proto::request_header_bytes, 0);
  tcp::proto::put_u32(&h[0], tcp::proto::magic);
  h[4] = tcp::proto::protocol_version;
  h[5] = op;
  tcp::proto::put_u32(&h[8], key_len);
  tcp::proto::put_u32(&h[12], value_len);
  return h;
}

// Resident set size of this process in bytes (Linux /proc).
std::size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }
void touch(const std::string& path) {
  std::ofstream f(path);
  f << "1";
}

std::uint16_t free_port() {
  auto probe = tcp::store_server::start("127.0.0.1", 0);
  REQUIRE(probe.ok());
  return probe.value()->port();
}

// Raises this process's RLIMIT_NOFILE to `want` (up to the hard limit);
// returns the soft limit now in force.
rlim_t raise_nofile(rlim_t want) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < want) {
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return rl.rlim_cur;
}

}  // namespace

TEST_CASE("tcp store serves its job with 10000 idle connections open") {
  constexpr int n_idle = 10000;
  constexpr rlim_t fds_needed = n_idle + 200;  // each side: the idle sockets + a few of its own
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < fds_needed) {
    MESSAGE("SKIPPED: 10000 idle connections need " << fds_needed << " descriptors per process but the hard "
            "RLIMIT_NOFILE is " << rl.rlim_max << "; raise it (ulimit -Hn / limits.conf) to run this test");
    return;
  }
  test::temp_dir tmp;
  const std::string port_file = tmp.path + "/port", opened = tmp.path + "/opened",
                    counted = tmp.path + "/counted", done = tmp.path + "/done";
  // Process 0 hosts the server, process 1 holds the idle sockets: each needs
  // about 10,000 descriptors, so neither runs into the other's limit.
  auto r = test::run_ranks(2, [&](int proc, int) {
    MP_REQUIRE(raise_nofile(fds_needed) >= fds_needed);
    if (proc == 0) {
      tcp::server_options o;
      o.token = "tok";
      o.idle_timeout = milliseconds(600000);  // keep the idle ones for the whole test
      o.max_connections = n_idle + 16;
      auto srv = tcp::store_server::start("127.0.0.1", 0, o);
      MP_REQUIRE_OK(srv);
      std::size_t rss0 = rss_bytes();
      {
        std::ofstream f(port_file + ".tmp");
        f << srv.value()->port();
      }
      ::rename((port_file + ".tmp").c_str(), port_file.c_str());
      for (int i = 0; i < 24000 && !exists(opened); ++i) std::this_thread::sleep_for(milliseconds(10));
      MP_REQUIRE(exists(opened));
      for (int i = 0; i < 12000 && srv.value()->connections() < std::size_t(n_idle); ++i)
        std::this_thread::sleep_for(milliseconds(10));
      std::size_t conns = srv.value()->connections();
      std::size_t grown = rss_bytes() > rss0 ? rss_bytes() - rss0 : 0;
      std::printf("server: %zu connections open, resident memory grew by %zu KiB (%zu bytes per connection)\n",
                  conns, grown >> 10, conns ? grown / conns : 0);
      MP_CHECK(conns >= std::size_t(n_idle));
      // Bounded: a connection costs its session, never a frame's announced size.
      MP_CHECK(grown < (std::size_t(256) << 20));
      touch(counted);
      for (int i = 0; i < 24000 && !exists(done); ++i) std::this_thread::sleep_for(milliseconds(10));
      MP_CHECK(srv.value()->auth_failures() == 1);  // the stranger; no idle one was dropped
      MP_CHECK(srv.value()->dropped() == 1);
      return 0;
    }
    for (int i = 0; i < 6000 && !exists(port_file); ++i) std::this_thread::sleep_for(milliseconds(10));
    MP_REQUIRE(exists(port_file));
    std::uint16_t port = 0;
    {
      std::ifstream f(port_file);
      f >> port;
    }
    std::vector<std::unique_ptr<raw_conn>> idle;
    idle.reserve(n_idle);
    for (int i = 0; i < n_idle; ++i) {
      idle.push_back(std::make_unique<raw_conn>(port));
      MP_REQUIRE(idle.back()->fd >= 0);
    }
    touch(opened);
    for (int i = 0; i < 24000 && !exists(counted); ++i) std::this_thread::sleep_for(milliseconds(10));
    // The job's own client gets in and is served while all of them sit there.
    auto c = tcp::store_client::connect("127.0.0.1", port, deadline::after(milliseconds(60000)),
                                        milliseconds(60000), "tok");
    MP_REQUIRE_OK(c);
    for (int i = 0; i < 20; ++i) {
      std::string k = "k" + std::to_string(i);
      MP_REQUIRE_OK(c.value()->set(k, "v" + std::to_string(i)));
      auto v = c.value()->get(k, deadline::after(milliseconds(30000)));
      MP_REQUIRE_OK(v);
      MP_CHECK(v.value() == "v" + std::to_string(i));
    }
    // A stranger among them is still refused.
    raw_conn stranger(port);
    MP_CHECK(stranger.handshake("not-the-token") == int(tcp::proto::reply_status::refused));
    touch(done);
    return 0;
  }, std::chrono::seconds(280));
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

TEST_CASE("garbage and truncated frames at the store port while a 2-rank job runs") {
  const std::uint16_t port = free_port();
  test::temp_dir tmp;
  const std::string attacked = tmp.path + "/attacked", finished = tmp.path + "/finished";
  const std::string token = "job-token-hostile";
  // Processes 0 and 1: the job (TCP store via open_store, TCP data path,
  // allreduce + store traffic every iteration). Process 2: strangers without
  // the token and a broken insider with it, in a loop until the job is done.
  auto r = test::run_ranks(3, [&](int proc, int) {
    if (proc == 2) {
      // The store's port is free again once the job ends and another process
      // may take it, so checks made after `finished` appears are lenient.
      std::mt19937 rng(1234);
      int rounds = 0, refusals = 0;
      auto t_end = std::chrono::steady_clock::now() + std::chrono::seconds(150);
      std::vector<std::unique_ptr<raw_conn>> slow;  // slowloris: partial frames that never finish
      while (!exists(finished) && std::chrono::steady_clock::now() < t_end) {
        {  // random bytes, then gone
          raw_conn c(port);
          if (c.fd < 0) {  // the job has not started its store yet
            std::this_thread::sleep_for(milliseconds(20));
            continue;
          }
          std::vector<std::uint8_t> junk(rng() % 2000);
          for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
          c.send(junk.data(), junk.size());
        }
        {  // another protocol
          raw_conn c(port);
          const char http[] = "GET /index.html HTTP/1.1\r\nHost: node0:29400\r\nAccept: */*\r\n\r\n";
          c.send(http, sizeof http - 1);  // longer than a proof: refused as soon as it is read
          (void)c.closed_within(5000);
        }
        {  // a truncated handshake
          raw_conn c(port);
          char ch[tcp::proto::auth_frame_bytes];
          if (c.recv_all(ch, sizeof ch)) c.send(ch, 13);
        }
        {  // a well-formed proof under the wrong token (-1: the job ended and its store with it)
          raw_conn c(port);
          int st = c.handshake("guess-" + std::to_string(rounds));
          if (st != -1) MP_CHECK(st == int(tcp::proto::reply_status::refused));
          if (st == int(tcp::proto::reply_status::refused)) ++refusals;
        }
        {  // an insider with the token: oversized lengths, unknown op, truncated frames
          raw_conn a(port), b(port), d(port), e(port);
          if (a.handshake(token) == 0) {
            auto h = header(1, 0xFFFFFFFFu, 0xFFFFFFFFu);
            a.send(h.data(), h.size());
            MP_CHECK(a.closed_within(5000));
          }
          if (b.handshake(token) == 0) {
            auto h = header(200, 1, 0);
            b.send(h.data(), h.size());
            MP_CHECK(b.closed_within(5000));
          }
          if (d.handshake(token) == 0) {
            auto h = header(1, 8, 60u << 20);  // announces 60 MiB, sends 100 bytes, leaves
            d.send(h.data(), h.size());
            std::vector<std::uint8_t> some(100, 'z');
            d.send(some.data(), some.size());
          }
          if (e.handshake(token) == 0) {
            auto h = header(2, 5, 0);
            e.send(h.data(), 11);  // half a header, then gone
          }
        }
        if (slow.size() < 50) {
          slow.push_back(std::make_unique<raw_conn>(port));
          auto h = header(1, 4, 4);
          slow.back()->send(h.data(), 5);
        }
        if (++rounds == 20) touch(attacked);
      }
      std::printf("attacker: %d rounds, %d wrong-token refusals\n", rounds, refusals);
      MP_CHECK(rounds >= 20);
      MP_CHECK(refusals >= 20);
      return 0;
    }
    test::set_net_env(test::net::tcp_only, proc, 2);
    ::setenv("CCLITE_RDZV_TOKEN", token.c_str(), 1);
    launch_info li;
    li.rank = proc;
    li.size = 2;
    li.rdzv_host = "127.0.0.1";
    li.rdzv_port = port;
    li.job_id = "hostile";
    std::unique_ptr<tcp::store_server> hosted;
    auto s = tcp::open_store(li, deadline::after(milliseconds(60000)), proc == 0 ? &hosted : nullptr);
    MP_REQUIRE_OK(s);
    auto& kv = *s.value();
    auto comm = test::make_comm(kv, proc, 2);
    std::vector<float> buf(1025);
    const auto t_give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    int it = 0;
    for (;; ++it) {
      for (std::size_t i = 0; i < 1024; ++i) buf[i] = float(proc + 1) * float(i % 7 + it % 3);
      // Rank 0 says whether to go on: at least 200 rounds, and until the attack is well under way.
      buf[1024] =
          (proc == 0 && (it < 200 || !exists(attacked)) && std::chrono::steady_clock::now() < t_give_up) ? 1.0f
                                                                                                          : 0.0f;
      MP_REQUIRE_OK(comm->allreduce(buf.data(), buf.size()));
      for (std::size_t i = 0; i < 1024; ++i) MP_REQUIRE(buf[i] == 3.0f * float(i % 7 + it % 3));
      MP_REQUIRE_OK(kv.add("iterations", 1));
      if (it % 10 == 0) {
        MP_REQUIRE_OK(kv.set("it/" + std::to_string(proc), std::to_string(it)));
        auto other = kv.get("it/" + std::to_string(1 - proc), deadline::after(milliseconds(60000)));
        MP_REQUIRE_OK(other);
      }
      if (buf[1024] == 0.0f) break;
    }
    MP_REQUIRE_OK(comm->barrier());
    auto total = kv.add("iterations", 0);
    MP_REQUIRE_OK(total);
    MP_CHECK(total.value() >= 2 * (it + 1) - 1);  // the other rank may not have added its last yet
    if (proc == 0) {
      touch(finished);
      std::printf("job: %d iterations under attack; store dropped %llu connections, refused %llu tokens\n",
                  it + 1, static_cast<unsigned long long>(hosted->dropped()),
                  static_cast<unsigned long long>(hosted->auth_failures()));
      MP_CHECK(hosted->auth_failures() >= 1);
      MP_CHECK(hosted->dropped() >= 1);
    }
    MP_REQUIRE_OK(kv.add("left", 1));
    if (proc == 0) {  // the host leaves last
      for (int i = 0; i < 6000; ++i) {
        auto n = kv.add("left", 0);
        MP_REQUIRE_OK(n);
        if (n.value() == 2) break;
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
    return 0;
  }, std::chrono::seconds(240));
  CHECK_MESSAGE(r.all_ok(), r.describe());
}
