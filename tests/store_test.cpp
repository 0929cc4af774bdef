// Stores: memory_store, file_store, and the TCP store (server + client +
// rendezvous), including a server under attack by strangers and real
// processes hammering one store.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cclite/bootstrap/file_store.hpp>
#include <cclite/bootstrap/memory_store.hpp>
#include <cclite/tcp/rendezvous.hpp>
#include <cclite/tcp/store_client.hpp>
#include <cclite/tcp/store_server.hpp>

#include "support/mp.hpp"
#include "support/raw_conn.hpp"
#include "support/store_threads.hpp"

using namespace cclite;
using cclite::tcp::chosen_interface;
using cclite::tcp::make_interface;
using std::chrono::milliseconds;

namespace {

// Semantics every store must have; `s` starts empty.
void check_semantics(store& s) {
  CHECK(s.set("a", "1").ok());
  auto a = s.get("a", deadline::after(milliseconds(1000)));
  REQUIRE(a.ok());
  CHECK(a.value() == "1");
  CHECK(s.set("a", "two").ok());  // overwrite
  CHECK(s.get("a", deadline::after(milliseconds(1000))).value() == "two");

  std::string bin("x\0y/../\xff", 8);  // any bytes are a key
  CHECK(s.set(bin, std::string("\0\1\2", 3)).ok());
  CHECK(s.get(bin, deadline::never()).value() == std::string("\0\1\2", 3));
  std::string long_key(max_store_key_bytes, 'k');
  CHECK(s.set(long_key, "long").ok());
  CHECK(s.get(long_key, deadline::never()).value() == "long");
  CHECK(s.set(std::string(max_store_key_bytes + 1, 'k'), "x").code() == errc::invalid_argument);
  CHECK(s.set("", "x").code() == errc::invalid_argument);
  CHECK(s.set("empty", "").ok());
  CHECK(s.get("empty", deadline::never()).value().empty());

  CHECK(s.check("a").value());
  CHECK_FALSE(s.check("missing").value());

  CHECK(s.add("n", 5).value() == 5);
  CHECK(s.add("n", -7).value() == -2);
  CHECK(s.get("n", deadline::never()).value() == "-2");
  CHECK(s.add("a", 1).error().code() == errc::invalid_argument);  // "two" is no integer

  CHECK(s.wait({"a", "n", "empty"}, deadline::after(milliseconds(1000))).ok());

  auto t0 = std::chrono::steady_clock::now();
  auto miss = s.get("missing", deadline::after(milliseconds(200)));
  auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(miss.ok());
  CHECK(miss.error().code() == errc::timeout);
  CHECK(miss.error().message().find("missing") != std::string::npos);
  CHECK(took >= milliseconds(150));
  CHECK(took < milliseconds(10000));

  auto w = s.wait({"a", "gone1", "gone2"}, deadline::after(milliseconds(100)));
  CHECK(w.code() == errc::timeout);
  CHECK(w.message().find("gone1") != std::string::npos);
  CHECK(w.message().find("gone2") != std::string::npos);

  std::string big(3u << 20, '\0');  // spans many reads / writes
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  CHECK(s.set("big", big).ok());
  CHECK(s.get("big", deadline::never()).value() == big);
}

// 4 processes x 200 adds, then every process publishes a key and reads all.
void check_processes(const std::function<std::unique_ptr<store>()>& open) {
  auto r = test::run_ranks(4, [&](int rank, int size) {
    auto s = open();
    MP_REQUIRE(s != nullptr);
    for (int i = 0; i < 200; ++i) MP_REQUIRE_OK(s->add("counter", 1));
    MP_REQUIRE_OK(s->set("done/" + std::to_string(rank), "1"));
    MP_REQUIRE_OK(s->set("rank/" + std::to_string(rank), "hello from " + std::to_string(rank)));
    for (int p = 0; p < size; ++p) {
      auto v = s->get("rank/" + std::to_string(p), deadline::after(milliseconds(30000)));
      MP_REQUIRE_OK(v);
      MP_CHECK(v.value() == "hello from " + std::to_string(p));
    }
    MP_REQUIRE_OK(s->wait({"done/0", "done/1", "done/2", "done/3"}, deadline::after(milliseconds(30000))));
    auto total = s->add("counter", 0);
    MP_REQUIRE_OK(total);
    MP_CHECK(total.value() == 800);
    return 0;
  });
  CHECK_MESSAGE(r.all_ok(), r.describe());
}

using test::raw_conn;  // a raw TCP connection for playing the stranger

std::vector<std::uint8_t> header(std::uint8_t op, std::uint32_t key_len, std::uint32_t value_len,
                                 std::uint32_t magic = tcp::proto::magic) {
  std::vector<std::uint8_t> h(tcp::proto::request_header_bytes, 0);
  tcp::proto::put_u32(&h[0], magic);
  h[4] = tcp::proto::protocol_version;
  h[5] = op;
  tcp::proto::put_u32(&h[8], key_len);
  tcp::proto::put_u32(&h[12], value_len);
  return h;
}

std::unique_ptr<tcp::store_client> client_for(const tcp::store_server& srv) {
  auto c = tcp::store_client::connect("127.0.0.1", srv.port(), deadline::after(milliseconds(10000)),
                                      milliseconds(10000));
  REQUIRE_MESSAGE(c.ok(), c.error().to_string());
  return std::move(c.value());
}

void check_serves(tcp::store_client& c, const std::string& tag) {
  CHECK(c.set("alive/" + tag, tag).ok());
  auto v = c.get("alive/" + tag, deadline::after(milliseconds(5000)));
  REQUIRE_MESSAGE(v.ok(), v.error().to_string());
  CHECK(v.value() == tag);
}

}  // namespace

TEST_CASE("memory_store semantics") {
  memory_store s;
  check_semantics(s);
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(50));
    (void)s.set("late", "x");
  });
  CHECK(s.get("late", deadline::after(milliseconds(10000))).value() == "x");
  t.join();
}

TEST_CASE("file_store semantics") {
  test::temp_dir tmp;
  auto fs = file_store::open(tmp.path + "/a/b/store");  // creates parents
  REQUIRE_MESSAGE(fs.ok(), fs.error().to_string());
  check_semantics(*fs.value());
  // Key bytes never escape the directory, and long keys still fit a file name.
  std::string dir = tmp.path + "/a/b/store/";
  for (std::string key : {std::string("../../etc/passwd"), std::string(4096, '/'), std::string("\0\n.", 3)}) {
    std::string p = fs.value()->path_of(key);
    CHECK(p.compare(0, dir.size(), dir) == 0);
    CHECK(p.find('/', dir.size()) == std::string::npos);
    CHECK(p.size() - dir.size() <= 210);
  }

  // A second object on the same directory sees the same keys.
  auto fs2 = file_store::open(tmp.path + "/a/b/store");
  REQUIRE(fs2.ok());
  CHECK(fs2.value()->get("a", deadline::never()).value() == "two");
}

TEST_CASE("file_store polls a local filesystem faster than a shared one") {
  // /dev/shm is tmpfs on every Linux: local, 5 ms between polls at most.
  char dir[] = "/dev/shm/cclite-store-test-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  auto fs = file_store::open(std::string(dir) + "/store");
  REQUIRE_MESSAGE(fs.ok(), fs.error().to_string());
  CHECK(fs.value()->poll_cap() == milliseconds(5));
  fs.value().reset();
  std::system((std::string("rm -rf ") + dir).c_str());
  // Network filesystems keep 50 ms: NFS, Lustre, GPFS, CIFS, FUSE.
  for (unsigned long t : {0x6969ul, 0x0bd00bd0ul, 0x47504653ul, 0xff534d42ul, 0x65735546ul})
    CHECK_FALSE(file_store::local_filesystem(t));
  for (unsigned long t : {0x01021994ul, 0xef53ul, 0x58465342ul, 0x9123683eul})
    CHECK(file_store::local_filesystem(t));
}

TEST_CASE("file_store reports an unusable directory") {
  test::temp_dir tmp;
  std::string file = tmp.path + "/plain-file";
  FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f);
  std::fclose(f);
  auto fs = file_store::open(file + "/store");
  REQUIRE_FALSE(fs.ok());
  CHECK(fs.error().code() == errc::bootstrap_error);
  CHECK(fs.error().message().find(file) != std::string::npos);
  CHECK(fs.error().message().find("CCLITE_RDZV_DIR") != std::string::npos);
}

TEST_CASE("file_store across processes") {
  test::temp_dir tmp;
  check_processes([&]() -> std::unique_ptr<store> {
    auto fs = file_store::open(tmp.path + "/job");
    return fs.ok() ? std::move(fs.value()) : nullptr;
  });
}

TEST_CASE("tcp store semantics") {
  auto srv = tcp::store_server::start("127.0.0.1", 0);
  REQUIRE_MESSAGE(srv.ok(), srv.error().to_string());
  CHECK(srv.value()->port() != 0);
  auto c = client_for(*srv.value());
  check_semantics(*c);

  // A waiter is woken by another client's set.
  auto c2 = client_for(*srv.value());
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(100));
    (void)c2->set("late", "x");
  });
  CHECK(c->get("late", deadline::after(milliseconds(10000))).value() == "x");
  t.join();
  CHECK(srv.value()->connections() == 2);
}

// cclite calls a store from several threads at once (store.hpp): a TCP client
// gives a thread that finds its connection busy a spare one (store_pool.hpp).
TEST_CASE("stores serve several threads at once") {
  auto srv = tcp::store_server::start("127.0.0.1", 0);
  REQUIRE_MESSAGE(srv.ok(), srv.error().to_string());
  auto c = client_for(*srv.value());
  test::check_threads(*c, "tcp/");
  const std::size_t conns = srv.value()->connections();
  CHECK(conns > 1);   // the waits had connections of their own
  CHECK(conns <= 8);  // at most one per thread (8 threads)
  test::check_threads(*c, "tcp-again/");
  CHECK(srv.value()->connections() <= 8);  // the spares were kept and used again
  memory_store m;
  test::check_threads(m, "mem/");
  test::temp_dir tmp;
  auto f = file_store::open(tmp.path);
  REQUIRE(f.ok());
  test::check_threads(*f.value(), "file/");
}

TEST_CASE("tcp store across processes") {
  auto srv = tcp::store_server::start("127.0.0.1", 0);
  REQUIRE(srv.ok());
  std::uint16_t port = srv.value()->port();
  check_processes([&]() -> std::unique_ptr<store> {
    auto c = tcp::store_client::connect("127.0.0.1", port, deadline::after(milliseconds(10000)));
    return c.ok() ? std::move(c.value()) : nullptr;
  });
}

TEST_CASE("tcp store survives strangers") {
  tcp::server_options o;
  o.idle_timeout = milliseconds(500);
  auto srv = tcp::store_server::start("127.0.0.1", 0, o);
  REQUIRE(srv.ok());
  auto& s = *srv.value();
  auto good = client_for(s);
  check_serves(*good, "start");

  SUBCASE("garbage bytes") {
    raw_conn r(s.port());
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    r.send(junk, sizeof junk);
    CHECK(r.closed_within(5000));
  }
  SUBCASE("oversized key_len") {
    raw_conn r(s.port());
    REQUIRE(r.auth());
    auto h = header(1, 0xFFFFFFFFu, 0);
    r.send(h.data(), h.size());
    CHECK(r.closed_within(5000));
  }
  SUBCASE("oversized value_len") {
    raw_conn r(s.port());
    REQUIRE(r.auth());
    auto h = header(1, 1, 0xFFFFFFFFu);
    r.send(h.data(), h.size());
    CHECK(r.closed_within(5000));
  }
  SUBCASE("unknown op and bad version") {
    raw_conn r1(s.port()), r2(s.port());
    REQUIRE(r1.auth());
    REQUIRE(r2.auth());
    auto h = header(9, 1, 0);
    r1.send(h.data(), h.size());
    h = header(2, 1, 0);
    h[4] = 77;
    r2.send(h.data(), h.size());
    CHECK(r1.closed_within(5000));
    CHECK(r2.closed_within(5000));
  }
  SUBCASE("truncated frame") {
    {
      raw_conn r(s.port());
      REQUIRE(r.auth());
      auto h = header(1, 3, 100);
      r.send(h.data(), h.size());
      r.send("key and only part of the value", 20);
    }  // closed mid-frame
    raw_conn r2(s.port());
    REQUIRE(r2.auth());
    auto h = header(2, 3, 0);
    r2.send(h.data(), 9);  // half a header, then gone
  }
  SUBCASE("slow half-frame client") {
    raw_conn slow(s.port());
    REQUIRE(slow.auth());
    auto h = header(1, 4, 4);
    slow.send(h.data(), 7);
    // Others are served while it stalls...
    for (int i = 0; i < 20; ++i) check_serves(*good, "during-stall-" + std::to_string(i));
    // ...and it is dropped after the idle timeout.
    CHECK(slow.closed_within(10000));
  }
  SUBCASE("connected but silent stranger") {
    raw_conn silent(s.port());
    CHECK(silent.closed_within(10000));
  }
  SUBCASE("half a proof then silence") {
    raw_conn slow(s.port());
    char ch[tcp::proto::auth_frame_bytes];
    REQUIRE(slow.recv_all(ch, sizeof ch));
    slow.send(ch, 10);  // the first bytes of a frame, never the rest
    CHECK(slow.closed_within(10000));
  }
  SUBCASE("valid frame before the handshake") {
    raw_conn r(s.port());
    auto h = header(5, 1, 0);
    h.push_back('k');
    h.resize(tcp::proto::auth_frame_bytes, 0);  // as long as a proof, but a request
    r.send(h.data(), h.size());
    CHECK(r.closed_within(5000));
  }

  check_serves(*good, "end");
  auto fresh = client_for(s);
  check_serves(*fresh, "fresh");
}

TEST_CASE("tcp store: waiters that leave, pipelining, store limits") {
  tcp::server_options o;
  o.max_total_bytes = 1000;
  auto srv = tcp::store_server::start("127.0.0.1", 0, o);
  REQUIRE(srv.ok());
  auto& s = *srv.value();
  auto good = client_for(s);

  auto get_frame = [](const std::string& key, std::uint32_t wait_ms) {
    auto h = header(2, static_cast<std::uint32_t>(key.size()), 0);
    tcp::proto::put_u32(&h[16], wait_ms);
    h.insert(h.end(), key.begin(), key.end());
    return h;
  };
  {
    // A client parked in a long get that disconnects is forgotten at once.
    raw_conn r(s.port());
    REQUIRE(r.auth());
    auto f = get_frame("nobody-sets-this", 600000);
    r.send(f.data(), f.size());
    std::this_thread::sleep_for(milliseconds(100));
    CHECK(s.connections() == 2);
  }
  for (int i = 0; i < 500 && s.connections() != 1; ++i) std::this_thread::sleep_for(milliseconds(10));
  CHECK(s.connections() == 1);
  {
    // Sending again before the reply is a protocol violation.
    raw_conn r(s.port());
    REQUIRE(r.auth());
    auto f = get_frame("nobody-sets-this", 600000);
    r.send(f.data(), f.size());
    r.send(f.data(), f.size());
    CHECK(r.closed_within(5000));
  }
  // The server holds at most max_total_bytes.
  auto full = good->set("big", std::string(2000, 'x'));
  CHECK(full.code() == errc::resource_exhausted);
  CHECK(full.message().find("max_total_bytes") != std::string::npos);
  check_serves(*good, "small");
}

TEST_CASE("tcp store: drops are counted and the server keeps its data") {
  auto srv = tcp::store_server::start("127.0.0.1", 0);
  REQUIRE(srv.ok());
  auto c = client_for(*srv.value());
  CHECK(c->set("k", "v").ok());
  for (int i = 0; i < 50; ++i) {
    raw_conn r(srv.value()->port());
    REQUIRE(r.auth());
    auto h = header(3, 1, 8, 0xdeadbeefu);
    r.send(h.data(), h.size());
    CHECK(r.closed_within(5000));
  }
  CHECK(srv.value()->dropped() >= 50);
  CHECK(c->get("k", deadline::after(milliseconds(5000))).value() == "v");
}

TEST_CASE("tcp store survives 1000 idle connections and caps connections") {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 2200 && rl.rlim_max >= 2200) {
    rl.rlim_cur = 2200;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  ::getrlimit(RLIMIT_NOFILE, &rl);
  int n = rl.rlim_cur >= 2200 ? 1000 : static_cast<int>(rl.rlim_cur / 2) - 50;
  MESSAGE("idle connections: " << n);

  tcp::server_options o;
  o.max_connections = static_cast<std::size_t>(n) + 1;
  auto srv = tcp::store_server::start("127.0.0.1", 0, o);
  REQUIRE(srv.ok());
  auto good = client_for(*srv.value());
  std::vector<std::unique_ptr<raw_conn>> idle;
  for (int i = 0; i < n; ++i) {
    idle.push_back(std::make_unique<raw_conn>(srv.value()->port()));
    REQUIRE(idle.back()->fd >= 0);
  }
  check_serves(*good, "with-idle");
  for (int i = 0; i < 200 && srv.value()->connections() < static_cast<std::size_t>(n) + 1; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  CHECK(srv.value()->connections() == static_cast<std::size_t>(n) + 1);

  // At the cap, a newcomer is refused; the connected client is still served.
  auto extra =
      tcp::store_client::connect("127.0.0.1", srv.value()->port(), deadline::after(milliseconds(300)));
  CHECK_FALSE(extra.ok());
  CHECK(srv.value()->refused() >= 1);
  check_serves(*good, "at-cap");

  idle.clear();
  auto later = client_for(*srv.value());
  check_serves(*later, "after-idle");
}

TEST_CASE("tcp client: unreachable, lost and foreign servers") {
  SUBCASE("nobody listening: retries until the deadline") {
    auto probe = tcp::store_server::start("127.0.0.1", 0);
    REQUIRE(probe.ok());
    std::uint16_t port = probe.value()->port();
    probe.value().reset();  // the port is free again
    auto c = tcp::store_client::connect("127.0.0.1", port, deadline::after(milliseconds(300)));
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().code() == errc::timeout);
    CHECK(c.error().message().find("could not connect") != std::string::npos);
  }
  SUBCASE("server started late: the client waits for it") {
    auto probe = tcp::store_server::start("127.0.0.1", 0);
    REQUIRE(probe.ok());
    std::uint16_t port = probe.value()->port();
    probe.value().reset();
    std::unique_ptr<tcp::store_server> late;
    std::thread t([&] {
      std::this_thread::sleep_for(milliseconds(300));
      auto s = tcp::store_server::start("127.0.0.1", port);
      if (s.ok()) late = std::move(s.value());
    });
    auto c = tcp::store_client::connect("127.0.0.1", port, deadline::after(milliseconds(10000)));
    t.join();
    REQUIRE_MESSAGE(c.ok(), c.error().to_string());
    check_serves(*c.value(), "late");
  }
  SUBCASE("server dies during a get") {
    auto srv = tcp::store_server::start("127.0.0.1", 0);
    REQUIRE(srv.ok());
    auto c = client_for(*srv.value());
    std::thread t([&] {
      std::this_thread::sleep_for(milliseconds(200));
      srv.value().reset();
    });
    auto v = c->get("never", deadline::after(milliseconds(20000)));
    t.join();
    REQUIRE_FALSE(v.ok());
    CHECK(v.error().code() == errc::peer_lost);
    CHECK(v.error().message().find("rank 0 gone?") != std::string::npos);
    CHECK(c->set("x", "y").code() == errc::peer_lost);  // reconnect fails too
  }
  SUBCASE("a server that stops answering: the *_within calls end at their deadline") {
    // A host lost mid-job: its kernel no longer answers, the connection stays
    // open. Here the server stops serving (no thread, progress() no longer
    // called) while the kernel keeps the connection: the plain calls would
    // wait out the op timeout (60 s here), the bounded ones end at reply_by.
    tcp::server_options o;
    o.background_thread = false;
    auto srv = tcp::store_server::start("127.0.0.1", 0, o);
    REQUIRE(srv.ok());
    std::atomic<bool> serve{true};
    std::thread server([&] {
      while (serve.load()) (void)srv.value()->progress(5);
    });
    auto made = tcp::store_client::connect("127.0.0.1", srv.value()->port(), deadline::after(milliseconds(10000)),
                                           milliseconds(60000));
    REQUIRE(made.ok());
    auto& c = *made.value();
    REQUIRE(c.set_within("k", "v", deadline::after(milliseconds(5000))).ok());
    REQUIRE(c.get_within("k", deadline::after(milliseconds(0)), deadline::after(milliseconds(5000))).value() == "v");
    REQUIRE(c.add_within("n", 2, deadline::after(milliseconds(5000))).value() == 2);
    serve = false;
    server.join();
    auto timed = [](auto&& f) {
      const auto t0 = clock::now();
      errc code = f();
      const auto ms = std::chrono::duration_cast<milliseconds>(clock::now() - t0).count();
      CHECK(ms >= 250);
      CHECK(ms < 5000);  // the op timeout is 60 s
      return code;
    };
    const auto by = [] { return deadline::after(milliseconds(300)); };
    CHECK(timed([&] { return c.get_within("k", deadline::after(milliseconds(0)), by()).error().code(); }) ==
          errc::timeout);
    // The timed-out get closed the connection (a reply may still be on its
    // way): these two reconnect first, and the handshake gets no answer.
    const errc add = timed([&] { return c.add_within("n", 1, by()).error().code(); });
    CHECK((add == errc::timeout || add == errc::peer_lost));
    const errc set = timed([&] { return c.set_within("k", "w", by()).code(); });
    CHECK((set == errc::timeout || set == errc::peer_lost));
    // Serving again: the client reconnects and the store kept its data.
    serve = true;
    std::thread again([&] {
      while (serve.load()) (void)srv.value()->progress(5);
    });
    auto v = c.get_within("k", deadline::after(milliseconds(0)), deadline::after(milliseconds(10000)));
    serve = false;
    again.join();
    REQUIRE_MESSAGE(v.ok(), v.error().to_string());
    CHECK((v.value() == "v" || v.value() == "w"));  // the cut set may have reached the server
  }
  SUBCASE("something else on the port") {
    // A foreign server on loopback that answers like a web server would.
    test::loopback_listener l(1);
    REQUIRE(l.fd >= 0);
    const std::uint16_t port = l.port;
    std::thread t = l.answer_like_a_web_server(false);
    auto c = tcp::store_client::connect("127.0.0.1", port, deadline::after(milliseconds(5000)));
    t.join();
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().code() == errc::protocol_error);
    CHECK(c.error().message().find("does not speak") != std::string::npos);
  }
  SUBCASE("port in use") {
    auto a = tcp::store_server::start("127.0.0.1", 0);
    REQUIRE(a.ok());
    // SO_REUSEADDR does not allow two listeners on one port.
    auto b = tcp::store_server::start("127.0.0.1", a.value()->port());
    REQUIRE_FALSE(b.ok());
    CHECK(b.error().code() == errc::bootstrap_error);
    CHECK(b.error().message().find("cannot listen on 127.0.0.1:") != std::string::npos);
    CHECK(b.error().message().find("free port") != std::string::npos);
  }
}

TEST_CASE("rendezvous: open_store") {
  SUBCASE("one process needs nothing") {
    launch_info li;
    li.rank = 0;
    li.size = 1;
    auto s = tcp::open_store(li, deadline::after(milliseconds(1000)), nullptr);
    REQUIRE(s.ok());
    CHECK(s.value()->set("k", "v").ok());
  }
  SUBCASE("tcp, rank 0 hosts, 4 processes") {
    auto probe = tcp::store_server::start("127.0.0.1", 0);
    REQUIRE(probe.ok());
    std::uint16_t port = probe.value()->port();
    probe.value().reset();
    auto r = test::run_ranks(4, [&](int rank, int size) {
      launch_info li;
      li.rank = rank;
      li.size = size;
      li.rdzv_host = "127.0.0.1";
      li.rdzv_port = port;
      li.job_id = "job42";
      auto s = tcp::open_store(li, deadline::after(milliseconds(30000)), nullptr);
      MP_REQUIRE_OK(s);
      auto all = store_allgather(*s.value(), "info", rank, size, "r" + std::to_string(rank),
                                 deadline::after(milliseconds(30000)));
      MP_REQUIRE_OK(all);
      for (int p = 0; p < size; ++p)
        MP_CHECK(all.value()[static_cast<std::size_t>(p)] == "r" + std::to_string(p));
      // Rank 0 owns the server: it leaves last.
      MP_REQUIRE_OK(s.value()->add("left", 1));
      if (rank == 0) {
        for (int i = 0; i < 3000; ++i) {
          auto n = s.value()->add("left", 0);
          MP_REQUIRE_OK(n);
          if (n.value() == size) break;
          std::this_thread::sleep_for(milliseconds(10));
        }
      }
      return 0;
    });
    CHECK_MESSAGE(r.all_ok(), r.describe());
  }
  SUBCASE("another job's store is detected") {
    launch_info li;
    li.rank = 0;
    li.size = 2;
    li.rdzv_host = "127.0.0.1";
    li.rdzv_port = 0;  // filled in below
    auto probe = tcp::store_server::start("127.0.0.1", 0);
    REQUIRE(probe.ok());
    li.rdzv_port = probe.value()->port();
    probe.value().reset();
    li.job_id = "A";
    std::unique_ptr<tcp::store_server> hosted;
    auto s0 = tcp::open_store(li, deadline::after(milliseconds(10000)), &hosted);
    REQUIRE_MESSAGE(s0.ok(), s0.error().to_string());
    CHECK(hosted != nullptr);
    li.rank = 1;
    li.job_id = "B";
    auto s1 = tcp::open_store(li, deadline::after(milliseconds(10000)), nullptr);
    REQUIRE_FALSE(s1.ok());
    CHECK(s1.error().code() == errc::bootstrap_error);
    CHECK(s1.error().message().find("belongs to job 'A'") != std::string::npos);
  }
  SUBCASE("file store in <dir>/<job id>") {
    test::temp_dir tmp;
    launch_info li;
    li.rank = 1;
    li.size = 2;
    li.rdzv_dir = tmp.path;
    li.job_id = "slurm/77";
    auto s = tcp::open_store(li, deadline::after(milliseconds(1000)), nullptr);
    REQUIRE_MESSAGE(s.ok(), s.error().to_string());
    CHECK(s.value()->set("k", "v").ok());
    auto direct = file_store::open(tmp.path + "/slurm_77");
    REQUIRE(direct.ok());
    CHECK(direct.value()->get("k", deadline::never()).value() == "v");
  }
  SUBCASE("bind address choice") {
    auto nic = [] {
      chosen_interface c;
      c.iface = make_interface("eth9", "192.0.2.77");
      c.reason = "eth9 192.0.2.77 (test)";
      return result<chosen_interface>(c);
    };
    auto no_nic = [] { return result<chosen_interface>(make_error(errc::unsupported, "no interface")); };
    auto hosts = [](const result<tcp::detail::bind_choice>& r) {
      REQUIRE_MESSAGE(r.ok(), r.error().to_string());
      return r.value().hosts;
    };
    using v = std::vector<std::string>;
    CHECK(hosts(tcp::detail::bind_addresses_for("127.0.0.1", false, nic)) == v{"127.0.0.1"});
    auto lh = hosts(tcp::detail::bind_addresses_for("localhost", false, nic));
    REQUIRE(lh.size() == 1);
    in_addr v4{};
    in6_addr v6{};
    CHECK((lh[0] == "::1" || (::inet_pton(AF_INET, lh[0].c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) ||
           (::inet_pton(AF_INET6, lh[0].c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6))));
    // TEST-NET is not ours: never every address, the chosen interface instead.
    CHECK(hosts(tcp::detail::bind_addresses_for("192.0.2.1", false, nic)) == v{"192.0.2.77"});
    auto none = tcp::detail::bind_addresses_for("192.0.2.1", false, no_nic);
    REQUIRE_FALSE(none.ok());
    CHECK(none.error().code() == errc::bootstrap_error);
    CHECK(none.error().message().find("CCLITE_STORE_BIND_ANY=1") != std::string::npos);
    // Only on request.
    CHECK(hosts(tcp::detail::bind_addresses_for("192.0.2.1", true, nic)) == v{"0.0.0.0"});
    CHECK(hosts(tcp::detail::bind_addresses_for("127.0.0.1", true, nic)) == v{"0.0.0.0"});
  }
}
