// tcp::torch_store_client against stand-ins of torch's c10d TCPStore server
// (support/fake_c10d.hpp) in both dialects, foreign and lost servers, and
// open_store() under TORCHELASTIC_USE_AGENT_STORE with real processes. A real
// torchrun (torch 1.13's server) is tests/netns/torchrun_test.sh.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <cclite/tcp/rendezvous.hpp>
#include <cclite/tcp/store_server.hpp>
#include <cclite/tcp/torch_store.hpp>

#include "support/fake_c10d.hpp"
#include "support/mp.hpp"
#include "support/raw_conn.hpp"
#include "support/store_threads.hpp"

using namespace cclite;
using std::chrono::milliseconds;
using dialect = tcp::torch_store_client::dialect;

namespace {

const std::string prefix = "cclite/j/attempt_0/";

std::unique_ptr<tcp::torch_store_client> open_client(std::uint16_t port, dialect d = dialect::unknown) {
  auto c = tcp::torch_store_client::connect("127.0.0.1", port, deadline::after(milliseconds(5000)),
                                            milliseconds(5000), prefix, d);
  REQUIRE_MESSAGE(c.ok(), c.error().to_string());
  return std::move(c.value());
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A stand-in server in a process of its own, for tests that fork ranks: a
// forked rank must not inherit the server's connections (one the server drops
// would stay open in it, as torch's agent never lets its workers inherit).
struct server_process {
  pid_t pid = -1;
  std::uint16_t port = 0;
  int from = -1, to = -1;  // server -> test (port, then keys), test -> server (stop)

  server_process(int dialect, test::fake_c10d::unvalidated u) {
    int a[2], b[2];
    REQUIRE(::pipe(a) == 0);
    REQUIRE(::pipe(b) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(a[0]);
      ::close(b[1]);
      test::fake_c10d srv(dialect, u);
      std::uint16_t p = srv.port();
      (void)!::write(a[1], &p, sizeof p);
      char c;
      (void)!::read(b[0], &c, 1);
      std::string all;
      for (const auto& k : srv.keys_seen()) all += k + "\n";
      (void)!::write(a[1], all.data(), all.size());
      ::_exit(0);
    }
    ::close(a[1]);
    ::close(b[0]);
    from = a[0];
    to = b[1];
    REQUIRE(::read(from, &port, sizeof port) == static_cast<long>(sizeof port));
  }
  // Stops the server; the keys it saw, one per line.
  std::string stop() {
    (void)!::write(to, "x", 1);
    std::string all;
    char buf[4096];
    for (long k; (k = ::read(from, buf, sizeof buf)) > 0;) all.append(buf, static_cast<std::size_t>(k));
    ::close(from);
    ::close(to);
    int st = 0;
    ::waitpid(pid, &st, 0);
    return all;
  }
};

}  // namespace

TEST_CASE("torch store client: semantics in torch 1.x's and 2.x's dialect") {
  using u = test::fake_c10d::unvalidated;
  struct variant {
    int server;
    u unvalidated;
    dialect given, expect;
  };
  for (auto v : {variant{1, u::served, dialect::unknown, dialect::torch1},
                 variant{2, u::served, dialect::unknown, dialect::torch2},
                 variant{2, u::closed, dialect::unknown, dialect::torch2},
                 variant{2, u::ignored, dialect::unknown, dialect::torch2},
                 variant{1, u::served, dialect::torch1, dialect::torch1},
                 variant{2, u::ignored, dialect::torch2, dialect::torch2}}) {
    CAPTURE(v.server);
    CAPTURE(static_cast<int>(v.unvalidated));
    CAPTURE(static_cast<int>(v.given));
    test::fake_c10d srv(v.server, v.unvalidated);
    REQUIRE(srv.port() != 0);
    auto c = open_client(srv.port(), v.given);
    CHECK(c->protocol() == v.expect);

    std::string bin("x\0y\xff", 4);
    CHECK(c->set("a", "1").ok());
    CHECK(c->set("a", bin).ok());  // overwrite, any bytes
    CHECK(c->get("a", deadline::after(milliseconds(2000))).value() == bin);
    CHECK(c->set("empty", "").ok());
    CHECK(c->get("empty", deadline::after(milliseconds(2000))).value().empty());
    CHECK(c->add("n", 5).value() == 5);
    CHECK(c->add("n", -7).value() == -2);
    CHECK(c->get("n", deadline::never()).value() == "-2");  // decimal text, as cclite::store says
    CHECK(c->check("a").value());
    CHECK_FALSE(c->check("missing").value());
    CHECK(c->wait({"a", "n", "empty"}, deadline::after(milliseconds(2000))).ok());
    std::string big(3u << 20, '\0');
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
    CHECK(c->set("big", big).ok());
    CHECK(c->get("big", deadline::never()).value() == big);

    // The server's wait has no limit: the client's deadline ends it, and the
    // next call works on a fresh connection.
    const int before = srv.connections_accepted();
    auto t0 = std::chrono::steady_clock::now();
    auto miss = c->get("missing", deadline::after(milliseconds(200)));
    auto took = std::chrono::steady_clock::now() - t0;
    REQUIRE_FALSE(miss.ok());
    CHECK(miss.error().code() == errc::timeout);
    CHECK(contains(miss.error().message(), "'missing'"));
    CHECK(took >= milliseconds(150));
    CHECK(took < milliseconds(5000));
    auto w = c->wait({"a", "gone1", "gone2"}, deadline::after(milliseconds(100)));
    CHECK(w.code() == errc::timeout);
    CHECK(contains(w.message(), "gone2"));
    CHECK(c->get("a", deadline::after(milliseconds(2000))).value() == bin);
    CHECK(srv.connections_accepted() > before);

    // A get of what is there now (deadline already passed): a check, then
    // the value; a missing key is a timeout on the same connection.
    const int kept = srv.connections_accepted();
    CHECK(c->get("a", deadline::after(milliseconds(0))).value() == bin);
    auto now_missing = c->get("missing", deadline::after(milliseconds(0)));
    REQUIRE_FALSE(now_missing.ok());
    CHECK(now_missing.error().code() == errc::timeout);
    CHECK(contains(now_missing.error().message(), "'missing' is not in torchrun's store"));
    CHECK(c->get_within("n", deadline::after(milliseconds(0)), deadline::after(milliseconds(2000))).value() == "-2");
    CHECK(srv.connections_accepted() == kept);

    // A waiter on one connection is woken by a set on another.
    auto other = open_client(srv.port(), v.expect);
    std::thread late([&] {
      std::this_thread::sleep_for(milliseconds(100));
      CHECK(other->set("late", "here").ok());
    });
    CHECK(c->get("late", deadline::after(milliseconds(5000))).value() == "here");
    late.join();

    // torch's server drops a client whose add meets text; the client says why and goes on.
    auto bad = c->add("a", 1);
    REQUIRE_FALSE(bad.ok());
    CHECK(contains(bad.error().message(), "not an integer"));
    CHECK(c->check("a").value());

    // Keys travel as torch's client sends them: '/' + prefix + key.
    for (const auto& k : srv.keys_seen()) {
      if (k.size() <= 1) continue;  // the dialect probe's one-byte key
      CHECK_MESSAGE(k.rfind("/" + prefix, 0) == 0, k);
    }
    CHECK(srv.keys_seen().count("/" + prefix + "late") == 1);
  }
}

// cclite calls a store from several threads at once (store.hpp): a thread that
// finds the connection busy gets a spare one (store_pool.hpp), which knows the
// dialect already.
TEST_CASE("torch store client: several threads at once") {
  for (int server : {1, 2}) {
    CAPTURE(server);
    test::fake_c10d srv(server);
    REQUIRE(srv.port() != 0);
    auto c = open_client(srv.port(), dialect::unknown);
    test::check_threads(*c, "threads/");
    CHECK(srv.connections_accepted() > 1);
  }
}

TEST_CASE("torch store client: unreachable, lost and foreign servers") {
  SUBCASE("nothing listens: timeout naming the endpoint") {
    test::fake_c10d gone(1);
    std::uint16_t port = gone.port();
    gone.stop();
    auto c = tcp::torch_store_client::connect("127.0.0.1", port, deadline::after(milliseconds(300)),
                                              milliseconds(1000), prefix);
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().code() == errc::timeout);
    CHECK(contains(c.error().message(), "127.0.0.1:" + std::to_string(port)));
  }
  SUBCASE("the agent goes away: peer_lost") {
    test::fake_c10d srv(2, test::fake_c10d::unvalidated::closed);
    auto c = open_client(srv.port());
    CHECK(c->set("k", "v").ok());
    srv.stop();
    auto st = c->set("k", "w");
    CHECK(st.code() == errc::peer_lost);
    CHECK(contains(st.message(), "torchrun's store"));
  }
  SUBCASE("a cclite store at that port is named as such") {
    auto srv = tcp::store_server::start("127.0.0.1", 0);
    REQUIRE(srv.ok());
    auto c = tcp::torch_store_client::connect("127.0.0.1", srv.value()->port(), deadline::after(milliseconds(3000)),
                                              milliseconds(3000), prefix);
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().code() == errc::protocol_error);
    CHECK(contains(c.error().message(), "cclite store, not torchrun's"));
  }
  SUBCASE("a reply announcing more than a store value may hold is refused, not allocated") {
    test::loopback_listener l(1);
    REQUIRE(l.fd >= 0);
    std::thread t([&l] {
      pollfd pf{l.fd, POLLIN, 0};
      if (::poll(&pf, 1, 5000) != 1) return;
      const int s = ::accept(l.fd, nullptr, nullptr);
      char buf[4096];
      (void)::recv(s, buf, sizeof buf, 0);  // the wait of get(): answer "present" with torch 1.x's 0
      (void)::send(s, "\0", 1, MSG_NOSIGNAL);
      (void)::recv(s, buf, sizeof buf, 0);  // the get itself: a length of 2^40
      const std::uint64_t huge = std::uint64_t(1) << 40;
      (void)::send(s, &huge, sizeof huge, MSG_NOSIGNAL);
      std::this_thread::sleep_for(milliseconds(300));
      ::close(s);
    });
    auto c = tcp::torch_store_client::connect("127.0.0.1", l.port, deadline::after(milliseconds(3000)),
                                              milliseconds(3000), prefix, dialect::torch1);
    REQUIRE_MESSAGE(c.ok(), c.error().to_string());
    auto v = c.value()->get("k", deadline::after(milliseconds(3000)));
    t.join();
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().code() == errc::protocol_error);
    CHECK(contains(v.error().message(), "malformed reply to get of key 'k'"));
  }
  SUBCASE("a server that answers something else") {
    test::loopback_listener l(1);
    REQUIRE(l.fd >= 0);
    std::thread t = l.answer_like_a_web_server(true);  // torch's server speaks only when asked
    auto c = tcp::torch_store_client::connect("127.0.0.1", l.port, deadline::after(milliseconds(3000)),
                                              milliseconds(3000), prefix);
    t.join();
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().code() == errc::protocol_error);
    CHECK(contains(c.error().message(), "does not answer as torch's TCPStore"));
  }
}

TEST_CASE("open_store under torchrun's agent store: 3 processes, no rank hosts") {
  for (int d : {1, 2}) {
    CAPTURE(d);
    server_process srv(d, d == 2 ? test::fake_c10d::unvalidated::ignored : test::fake_c10d::unvalidated::served);
    auto r = test::run_ranks(3, [&](int rank, int size) {
      launch_info li;
      li.rank = rank;
      li.size = size;
      li.rdzv_host = "127.0.0.1";
      li.rdzv_port = srv.port;
      li.job_id = "tj";
      li.launcher_store = true;
      li.restart_count = 1;
      std::unique_ptr<tcp::store_server> hosted;
      auto s = tcp::open_store(li, deadline::after(milliseconds(30000)), &hosted);
      MP_REQUIRE_OK(s);
      MP_CHECK(hosted == nullptr);
      auto all = store_allgather(*s.value(), "info", rank, size, "r" + std::to_string(rank),
                                 deadline::after(milliseconds(30000)));
      MP_REQUIRE_OK(all);
      for (int p = 0; p < size; ++p) MP_CHECK(all.value()[static_cast<std::size_t>(p)] == "r" + std::to_string(p));
      return 0;
    });
    CHECK_MESSAGE(r.all_ok(), r.describe());
    auto keys = srv.stop();
    CHECK(contains(keys, "/cclite/tj/attempt_1/cclite/rdzv/job_id\n"));
    CHECK(contains(keys, "/cclite/tj/attempt_1/info/2\n"));
  }

  test::fake_c10d srv(1);
  launch_info li;
  li.rank = 0;
  li.size = 2;
  li.rdzv_host = "127.0.0.1";
  li.rdzv_port = srv.port();
  li.job_id = "tj";
  li.launcher_store = true;
  ::setenv("CCLITE_TORCH_STORE_PROTOCOL", "3", 1);
  auto bad = tcp::open_store(li, deadline::after(milliseconds(3000)), nullptr);
  ::unsetenv("CCLITE_TORCH_STORE_PROTOCOL");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK(contains(bad.error().message(), "CCLITE_TORCH_STORE_PROTOCOL='3'"));
}
