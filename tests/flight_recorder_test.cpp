// The flight recorder (include/cclite/collective/flight_recorder.hpp) and its
// reader, cclite-trace (tools/cclite_trace.cpp): real ranks (forked
// processes) hang or disagree, each failing process writes its file, and the
// real cclite-trace binary reads them and must name what happened: the rank
// that never came (no file), a rank waiting in another communicator's call
// (cross-communicator deadlock), the collective the ranks called differently.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
using cclite::test::net;

namespace {

// The communicators' deadline: set-up must fit in it (slower under a
// sanitizer), and each hang below lasts it.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr milliseconds deadline_ms{15000};
#else
constexpr milliseconds deadline_ms{2500};
#endif

// A rank that waited and timed out says so (after its call returned, so its
// file, if any, is written).
void timed_out(store& kv, int rank) { (void)kv.set("timed out/" + std::to_string(rank), "1"); }

// A rank that stays away until every other rank has timed out (timed_out()),
// so they time out rather than see it exit; four deadlines at most.
void stay_away(store& kv, int me, int size) {
  const deadline until = deadline::after(4 * deadline_ms);
  for (int r = 0; r < size; ++r)
    if (r != me) (void)kv.get("timed out/" + std::to_string(r), until);
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// The flight recorder files ("t.<host>.<pid>") in `dir`.
std::vector<std::string> trace_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("t.", 0) == 0 && name.find(".tmp") == std::string::npos) out.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs build/bin/cclite-trace on `files`; its stdout, and its exit status in `rc`.
std::string run_cclite_trace(const std::vector<std::string>& files, int& rc) {
  const char* bin = std::getenv("CCLITE_BIN_DIR");
  std::string cmd = std::string(bin && *bin ? bin : "bin") + "/cclite-trace";
  for (const auto& f : files) cmd += " '" + f + "'";
  cmd += " 2>&1";
  std::string out;
  rc = -1;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    rc = ::pclose(p);
  }
  return out;
}

// cclite-trace's report on the files in `dir`, of which there must be `expect`.
std::string trace_report(const std::string& dir, std::size_t expect) {
  const auto files = trace_files(dir);
  REQUIRE(files.size() == expect);
  int rc = 0;
  std::string rep = run_cclite_trace(files, rc);
  INFO(rep);
  CHECK(rc == 0);
  return rep;
}

// `size` ranks over `n` with the recorder on (CCLITE_TRACE_BUFFER=`kept`),
// files in `dir`, deadline_ms deadlines; `body` gets the rank's communicator;
// `before` runs in each rank before its communicator is made.
test::run_result run_traced(int size, net n, const std::string& dir, const char* kept,
                            const std::function<int(int, store&, default_communicator&)>& body,
                            const std::function<void()>& before = {}) {
  return test::run_ranks(
      size,
      [&](int rank, int sz) {
        auto kv = test::open_dir_store(dir + "/store");
        comm_options o;
        o.timeout = deadline_ms;
        auto c = test::make_comm(*kv, rank, sz, o);
        return body(rank, *kv, *c);
      },
      std::chrono::seconds(120), [&](int rank) {
        test::set_net_env(n, rank, size);
        if (kept) ::setenv("CCLITE_TRACE_BUFFER", kept, 1);
        else ::unsetenv("CCLITE_TRACE_BUFFER");
        ::setenv("CCLITE_TRACE_FILE", (dir + "/t.").c_str(), 1);
        if (before) before();
      });
}

// create() with these CCLITE_TRACE_BUFFER / CCLITE_TRACE_SIGNAL values (signal
// null: unset) fails with invalid_argument, its message naming `expect`.
void check_refused(const char* buffer, const char* signal, const std::string& expect) {
  test::temp_dir dir;
  auto r = test::run_ranks(1, [&](int, int) {
    ::setenv("CCLITE_TRACE_BUFFER", buffer, 1);
    if (signal) ::setenv("CCLITE_TRACE_SIGNAL", signal, 1);
    auto kv = test::open_dir_store(dir.path);
    auto c = default_communicator::create(*kv, 0, 1);
    MP_CHECK(!c && c.error().code() == errc::invalid_argument);
    MP_CHECK(!c && has(c.error().message(), expect));
    return 0;
  });
  CHECK(r.all_ok());
}

int some_calls(default_communicator& c, int allreduces) {
  std::vector<float> v(1000, 1.0f);
  for (int i = 0; i < allreduces; ++i) MP_REQUIRE(c.allreduce(v.data(), v.size()).ok());
  MP_REQUIRE(c.broadcast(v.data(), v.size(), 0).ok());
  return 0;
}

}  // namespace

TEST_CASE("a rank that never comes: the others' files name the call, cclite-trace names the rank") {
  for (net n : {net::shm_only, net::tcp_only, net::mixed}) {
    test::temp_dir dir;
    auto r = run_traced(4, n, dir.path, "64", [](int rank, store& kv, default_communicator& c) {
      if (some_calls(c, 3) != 0) return 1;
      if (rank == 3) {  // alive, but never calls allreduce #5
        stay_away(kv, 3, 4);
        return 0;
      }
      std::vector<float> v(4096, 1.0f);
      status st = c.allreduce(v.data(), v.size());
      MP_CHECK(st.code() == errc::timeout);
      timed_out(kv, rank);
      return 0;
    });
    INFO("net ", test::to_string(n), ": ", r.describe());
    CHECK(r.all_ok());
    const auto files = trace_files(dir.path);
    REQUIRE(files.size() == 3);  // ranks 0-2 failed; rank 3 did not
    const std::string one = slurp(files[0]);
    CHECK(has(one, "cclite-trace 1\nprocess host="));
    CHECK(has(one, " size=4 calls=5 kept=5 queued=0\n"));
    CHECK(has(one, "call seq=4 coll=4 kind=broadcast count=1000 dtype=float"));
    CHECK(has(one, "call seq=5 coll=5 kind=allreduce count=4096 dtype=float op=sum"));
    CHECK(has(one, "state=failed code=timeout\n"));
    const std::string rep = trace_report(dir.path, 3);
    INFO(rep);
    CHECK(has(rep, "3 flight recorder files"));
    CHECK(has(rep, "(id "));
    CHECK(has(rep, "4 ranks): files from ranks 0-2; none from rank 3"));
    CHECK(has(rep, "furthest call: allreduce #5 (4096 x float, sum): ranks 0-2 failed (timeout)"));
    CHECK(has(rep, "rank 3: no file"));
    CHECK(!has(rep, "MISMATCH"));
    CHECK(has(rep, "\n    algorithm: "));  // the one the failed ranks ran, as CCLITE_DEBUG=INFO names it
    // A file that says another algorithm (ranks must agree: create() checks
    // the settings) is pointed out.
    std::string edited = one;
    const std::size_t at = edited.rfind(" algo=");
    REQUIRE(at != std::string::npos);
    edited.replace(at, edited.find(' ', at + 1) - at, " algo=edited_by_the_test");
    if (std::FILE* f = std::fopen(files[0].c_str(), "w")) {
      std::fputs(edited.c_str(), f);
      std::fclose(f);
    }
    const std::string rep2 = trace_report(dir.path, 3);
    INFO(rep2);
    CHECK(has(rep2, "    ALGORITHMS DIFFER: "));
    CHECK(has(rep2, " edited_by_the_test"));
  }
}

TEST_CASE("a rank waiting in another communicator's call: cclite-trace says where each side was") {
  for (net n : {net::shm_only, net::tcp_only}) {
    test::temp_dir dir;
    auto r = run_traced(3, n, dir.path, "64", [](int rank, store& kv, default_communicator& a) {
      auto b = a.dup();
      MP_REQUIRE_OK(b);
      if (some_calls(a, 1) != 0 || some_calls(*b.value(), 2) != 0) return 1;
      std::vector<float> v(256, 1.0f);
      // Ranks 0 and 1 go on in a, rank 2 in b: each side waits for the other.
      status st = rank == 2 ? b.value()->allreduce(v.data(), v.size()) : a.allreduce(v.data(), v.size());
      MP_CHECK(st.code() == errc::timeout);
      // Stay until the other side timed out too (an exit would close links: peer_lost).
      timed_out(kv, rank);
      stay_away(kv, rank, 3);
      return 0;
    });
    INFO("net ", test::to_string(n), ": ", r.describe());
    CHECK(r.all_ok());
    const std::string rep = trace_report(dir.path, 3);
    INFO(rep);
    // a: ranks 0, 1 in its collective #3; rank 2 never started it, being in b's #4
    CHECK(has(rep, "furthest call: allreduce #3 (256 x float, sum): ranks 0,1 failed (timeout)"));
    CHECK(has(rep, "rank 2 never started collective #3; its last was broadcast #2 (1000 x float, root 0), done in"));
    CHECK(has(rep, "meanwhile it was in allreduce #4 (256 x float, sum) of communicator "));
    // b: the mirror image
    CHECK(has(rep, "furthest call: allreduce #4 (256 x float, sum): rank 2 failed (timeout)"));
    CHECK(has(rep, "rank 0 never started collective #4; its last was broadcast #3 (1000 x float, root 0), done in"));
    CHECK(has(rep, "meanwhile it was in allreduce #3 (256 x float, sum) of communicator "));
    CHECK(!has(rep, "no file"));
  }
}

TEST_CASE("ranks calling different collectives: every rank's file, and cclite-trace shows the mismatch") {
  test::temp_dir dir;
  auto r = run_traced(3, net::shm_only, dir.path, "64", [](int rank, store&, default_communicator& c) {
    if (some_calls(c, 2) != 0) return 1;
    std::vector<float> v(512, 1.0f);
    status st = rank == 1 ? c.broadcast(v.data(), v.size(), 0) : c.allreduce(v.data(), v.size());
    MP_CHECK(st.code() == errc::mismatch);
    return 0;
  });
  INFO(r.describe());
  CHECK(r.all_ok());
  const std::string rep = trace_report(dir.path, 3);
  INFO(rep);
  CHECK(has(rep, "MISMATCH: collective #4 was called differently: ranks 0,2: allreduce (512 x float, sum); "
                 "rank 1: broadcast (512 x float, root 0)"));
  CHECK(has(rep, "failed (mismatch)"));
}

TEST_CASE("the recorder keeps the last N calls, is off by default, and refuses a bad CCLITE_TRACE_BUFFER") {
  SUBCASE("a small buffer keeps the newest calls") {
    test::temp_dir dir;
    auto r = run_traced(2, net::shm_only, dir.path, "4", [](int rank, store& kv, default_communicator& c) {
      if (some_calls(c, 9) != 0) return 1;  // calls 1-10
      if (rank == 1) {
        stay_away(kv, 1, 2);
        return 0;
      }
      std::vector<float> v(8, 1.0f);
      MP_CHECK(c.allreduce(v.data(), v.size()).code() == errc::timeout);  // call 11
      timed_out(kv, rank);
      return 0;
    });
    INFO(r.describe());
    CHECK(r.all_ok());
    const auto files = trace_files(dir.path);
    REQUIRE(files.size() == 1);
    const std::string t = slurp(files[0]);
    CHECK(has(t, " rank=0 size=2 calls=11 kept=4 queued=0\n"));
    CHECK(!has(t, "call seq=7 "));
    CHECK(has(t, "call seq=8 coll=8 kind=allreduce"));
    CHECK(has(t, "call seq=10 coll=10 kind=broadcast"));
    CHECK(has(t, "call seq=11 coll=11 kind=allreduce count=8 "));
    // 32 bytes, two ranks of one node over shm: shm-direct's small path.
    CHECK(has(t, " algo=shm-direct_small state=failed code=timeout\n"));
  }
  SUBCASE("off unless CCLITE_TRACE_BUFFER is set: no file") {
    test::temp_dir dir;
    auto r = run_traced(2, net::shm_only, dir.path, nullptr, [](int rank, store& kv, default_communicator& c) {
      if (rank == 1) {
        stay_away(kv, 1, 2);
        return 0;
      }
      std::vector<float> v(8, 1.0f);
      MP_CHECK(c.allreduce(v.data(), v.size()).code() == errc::timeout);
      timed_out(kv, rank);
      return 0;
    });
    INFO(r.describe());
    CHECK(r.all_ok());
    CHECK(trace_files(dir.path).empty());
  }
  SUBCASE("a bad value fails create() and names the variable") { check_refused("-5", nullptr, "CCLITE_TRACE_BUFFER=-5"); }
}

TEST_CASE("dump_traces() on demand: every live communicator of the process, point-to-point calls included") {
  test::temp_dir dir;
  auto r = run_traced(2, net::tcp_only, dir.path, "16", [&](int rank, store&, default_communicator& c) {
    auto half = c.split(0, rank);  // a second communicator of the same ranks
    MP_REQUIRE_OK(half);
    int x = rank;
    MP_REQUIRE(rank == 0 ? c.send(&x, 1, dtype::int32, 1).ok() : c.recv(&x, 1, dtype::int32, 0).ok());
    MP_REQUIRE(half.value()->allreduce(&x, 1).ok());
    auto path = dump_traces("asked for by the test");
    MP_REQUIRE_OK(path);
    const std::string t = slurp(path.value());
    MP_CHECK(has(t, "reason=asked for by the test\n"));
    MP_CHECK(has(t, "name=cclite/0 rank=" + std::to_string(rank) + " size=2 calls=2"));  // split's allgather, the send or recv
    MP_CHECK(has(t, "name=cclite/0/split1/0 rank=" + std::to_string(rank) + " size=2 calls=1"));
    MP_CHECK(has(t, rank == 0 ? "kind=send count=1 dtype=int32" : "kind=recv count=1 dtype=int32"));
    MP_CHECK(has(t, " coll=0 kind=" + std::string(rank == 0 ? "send" : "recv")));  // not a collective
    MP_CHECK(has(t, "state=done code=ok"));
    MP_CHECK(!has(t, "state=failed"));
    return 0;
  });
  INFO(r.describe());
  CHECK(r.all_ok());
  const std::string rep = trace_report(dir.path, 2);
  INFO(rep);
  CHECK(has(rep, "every rank finished collective #1"));
  CHECK(!has(rep, "never started"));
  // A file that is not the recorder's is refused with its name.
  std::ofstream(dir.path + "/t.bogus") << "hello\n";
  int rc = 0;
  const std::string bad = run_cclite_trace({dir.path + "/t.bogus"}, rc);
  CHECK(rc != 0);
  CHECK(has(bad, "t.bogus:1: not a cclite flight recorder file"));
}

// Dump on request (collective/trace_signal.hpp): SIGUSR1 makes a process write
// its file and go on.

TEST_CASE("SIGUSR1 during collectives: a file on request, and every call still completes with the right result") {
  for (net n : {net::shm_only, net::tcp_only}) {
    test::temp_dir dir;
    auto r = run_traced(3, n, dir.path, "32", [](int rank, store&, default_communicator& c) {
      // A thread signals this process every millisecond: the signal lands on
      // any thread, in the middle of poll(), futex waits, sends and receives.
      std::atomic<bool> stop{false};
      std::atomic<int> sent{0};
      std::thread storm([&] {
        while (!stop.load()) {
          ::kill(::getpid(), SIGUSR1);
          sent.fetch_add(1);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
      std::vector<float> v(16384);
      for (int i = 0; i < 150; ++i) {
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(rank + 1) * static_cast<float>(j % 7 + i);
        status st = c.allreduce(v.data(), v.size());
        MP_REQUIRE_OK(st);
        for (std::size_t j = 0; j < v.size(); j += 97) MP_REQUIRE(v[j] == 6.0f * static_cast<float>(j % 7 + i));
        int x = i * 10 + rank;
        MP_REQUIRE(c.broadcast(&x, 1, i % 3).ok());
        MP_REQUIRE(x == i * 10 + i % 3);
      }
      stop = true;
      storm.join();
      MP_CHECK(sent.load() > 10);
      // The file of the last request names the calls made so far (the dumper
      // runs after the signal, so wait for one that has the last call).
      const std::string path = std::string(std::getenv("CCLITE_TRACE_FILE")) + env::host_name() + "." + std::to_string(::getpid());
      ::kill(::getpid(), SIGUSR1);
      std::string t;
      for (int i = 0; i < 500 && !has(t, "call seq=300 "); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        t = slurp(path);
      }
      MP_CHECK(has(t, "reason=SIGUSR1: a dump on request (the process went on)\n"));
      MP_CHECK(has(t, "calls=300 kept=32 queued=0\n"));
      MP_CHECK(has(t, "call seq=300 coll=300 kind=broadcast count=1 dtype=int32"));
      MP_CHECK(!has(t, "state=failed"));
      return 0;
    });
    INFO("net ", test::to_string(n), ": ", r.describe());
    CHECK(r.all_ok());
    CHECK(trace_files(dir.path).size() == 3);
  }
}

TEST_CASE("a rank stuck outside cclite: files on request show the others waiting for it, and where it stopped") {
  test::temp_dir dir;
  const std::string snap = dir.path + "/snapshot";
  REQUIRE(::mkdir(snap.c_str(), 0700) == 0);
  auto r = run_traced(3, net::tcp_only, dir.path, "64", [&](int rank, store& kv, default_communicator& c) {
    MP_REQUIRE_OK(kv.set("pid/" + std::to_string(rank), std::to_string(::getpid())));
    if (some_calls(c, 2) != 0) return 1;  // collectives #1-#3
    std::vector<float> v(777, 1.0f);
    if (rank != 2) {  // waits in allreduce #4 for rank 2
      status st = c.allreduce(v.data(), v.size());
      MP_CHECK(st.code() == errc::timeout);
      timed_out(kv, rank);
      return 0;
    }
    // Rank 2 "computes" instead; meanwhile it asks every rank for its file,
    // itself included, as `kill -USR1` or cclite-run would.
    std::this_thread::sleep_for(deadline_ms / 5);
    for (int peer = 0; peer < 3; ++peer) {
      auto pid = kv.get("pid/" + std::to_string(peer), deadline::after(deadline_ms));
      MP_REQUIRE_OK(pid);
      MP_REQUIRE(::kill(std::atoi(pid.value().c_str()), SIGUSR1) == 0);
    }
    // Keep the three files as they were then (the others time out later and
    // write their files again, as failures).
    std::vector<std::string> files;
    for (int i = 0; i < 300 && files.size() < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      files = trace_files(dir.path);
    }
    MP_REQUIRE(files.size() == 3);
    for (const std::string& f : files) {
      const std::string t = slurp(f);
      MP_REQUIRE(has(t, "reason=SIGUSR1"));
      std::ofstream(snap + f.substr(f.rfind('/'))) << t;
    }
    stay_away(kv, 2, 3);
    return 0;
  });
  INFO(r.describe());
  CHECK(r.all_ok());
  const std::string rep = trace_report(snap, 3);
  INFO(rep);
  CHECK(has(rep, "3 flight recorder files"));
  CHECK(has(rep, ": SIGUSR1: a dump on request (the process went on)"));
  CHECK(has(rep, "furthest call: allreduce #4 (777 x float, sum): ranks 0,1 still running at the dump"));
  CHECK(has(rep, "rank 2 never started collective #4; its last was broadcast #3 (1000 x float, root 0), done in"));
  CHECK(!has(rep, "no file"));
}

TEST_CASE("CCLITE_TRACE_SIGNAL: a program's own handler is kept, 0 installs none, a bad value is refused") {
  test::temp_dir dir;
  SUBCASE("the program handles SIGUSR1 itself: its handler stays, no file") {
    static std::atomic<int> mine{0};
    auto r = run_traced(2, net::shm_only, dir.path, "8", [](int, store&, default_communicator& c) {
      auto d = c.dup();  // a second communicator arms again: still the program's handler
      MP_REQUIRE_OK(d);
      ::raise(SIGUSR1);
      MP_CHECK(mine.load() == 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a dumper would have written by now
      return 0;
    }, [] {
      struct sigaction sa {};
      sa.sa_handler = [](int) { mine.fetch_add(1); };
      ::sigaction(SIGUSR1, &sa, nullptr);
    });
    INFO(r.describe());
    CHECK(r.all_ok());
    CHECK(trace_files(dir.path).empty());
  }
  SUBCASE("CCLITE_TRACE_SIGNAL=0: SIGUSR1 keeps its default action") {
    ::setenv("CCLITE_TRACE_SIGNAL", "0", 1);
    auto r = run_traced(2, net::shm_only, dir.path, "8", [](int, store&, default_communicator&) {
      struct sigaction old {};
      ::sigaction(SIGUSR1, nullptr, &old);
      MP_CHECK(old.sa_handler == SIG_DFL);
      return 0;
    });
    ::unsetenv("CCLITE_TRACE_SIGNAL");
    CHECK(r.all_ok());
  }
  SUBCASE("CCLITE_TRACE_SIGNAL=USR2: SIGUSR2 asks, SIGUSR1 is left alone") {
    ::setenv("CCLITE_TRACE_SIGNAL", "SIGUSR2", 1);
    auto r = run_traced(1, net::shm_only, dir.path, "8", [](int, store&, default_communicator&) {
      struct sigaction old {};
      ::sigaction(SIGUSR1, nullptr, &old);
      MP_CHECK(old.sa_handler == SIG_DFL);
      ::raise(SIGUSR2);
      const std::string path = std::string(std::getenv("CCLITE_TRACE_FILE")) + env::host_name() + "." +
                               std::to_string(::getpid());
      for (int i = 0; i < 300 && slurp(path).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      MP_CHECK(has(slurp(path), "reason=SIGUSR2: a dump on request"));
      return 0;
    });
    ::unsetenv("CCLITE_TRACE_SIGNAL");
    CHECK(r.all_ok());
    CHECK(trace_files(dir.path).size() == 1);
  }
  SUBCASE("a bad value fails create() and names the variable") { check_refused("8", "HUP", "CCLITE_TRACE_SIGNAL='HUP'"); }
}

TEST_CASE("a request's file names the dump before it; with no communicator left, that file is kept, written anew") {
  test::temp_dir dir;
  auto r = test::run_ranks(1, [&](int, int) {
    ::setenv("CCLITE_TRACE_BUFFER", "8", 1);
    ::setenv("CCLITE_TRACE_FILE", (dir.path + "/t.").c_str(), 1);
    auto kv = test::open_dir_store(dir.path + "/store");
    auto c = test::make_comm(*kv, 0, 1);
    int x = 1;
    MP_REQUIRE(c->allreduce(&x, 1).ok());
    auto path = dump_traces("the failure's dump");
    MP_REQUIRE_OK(path);
    // A request replaces that file (the communicator lives): its reason stays.
    ::raise(SIGUSR1);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the dumper's turn
    MP_CHECK(has(slurp(path.value()), "reason=SIGUSR1: a dump on request (the process went on); "
                                      "the last dump before it: the failure's dump\n"));
    path = dump_traces("the failure's dump");  // as a failure would leave it
    MP_REQUIRE_OK(path);
    c.reset();  // the program is ending: its communicator is gone
    struct stat before {}, after {};
    MP_REQUIRE(::stat(path.value().c_str(), &before) == 0);
    const std::string was = slurp(path.value());
    ::raise(SIGUSR1);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the dumper's turn
    const std::string t = slurp(path.value());
    MP_CHECK(t == was);
    MP_CHECK(has(t, "reason=the failure's dump\n"));
    MP_CHECK(has(t, "kind=allreduce count=1 dtype=int32"));
    // ... as a new file: cclite-run, waiting for an answer, sees another inode
    // (a touch could keep the time where file times are coarse).
    MP_REQUIRE(::stat(path.value().c_str(), &after) == 0);
    MP_CHECK(after.st_ino != before.st_ino);
    return 0;
  });
  CHECK(r.all_ok());
}

TEST_CASE("calls issued but not started are in the file, and cclite-trace says a rank had issued the collective") {
  test::temp_dir dir;
  auto r = run_traced(3, net::shm_only, dir.path, "16", [](int rank, store&, default_communicator& c) {
    if (some_calls(c, 0) != 0) return 1;  // broadcast #1
    std::vector<float> v(300, 1.0f);
    if (rank != 2) {  // allreduce #2, for which rank 2's queue never gets free
      MP_CHECK(c.allreduce(v.data(), v.size()).code() == errc::timeout);
      std::this_thread::sleep_for(deadline_ms / 2);  // until rank 2 timed out too
      return 0;
    }
    // Rank 2: a receive nobody answers occupies its communicator (another
    // thread's blocking call), and the allreduce waits in the queue behind it.
    int x = 0;
    std::thread stuck([&] { MP_CHECK(c.recv(&x, 1, dtype::int32, 0).code() == errc::timeout); });
    std::this_thread::sleep_for(deadline_ms / 10);
    work w = c.allreduce_async(v.data(), v.size());
    stuck.join();
    MP_CHECK(!w.wait().ok());
    return 0;
  });
  INFO(r.describe());
  CHECK(r.all_ok());
  const std::string rep = trace_report(dir.path, 3);
  INFO(rep);
  CHECK(has(rep, "furthest call: allreduce #2 (300 x float, sum): ranks 0,1 failed (timeout)"));
  CHECK(has(rep, "rank 2 never started collective #2; its last was broadcast #1 (1000 x float, root 0), done in"));
  CHECK(has(rep, "    it had issued it: allreduce #2 (300 x float, sum) queued, not started, issued "));
  CHECK(has(rep, "rank 2: recv from rank 0 (call #2, 1 x int32) failed (timeout) after"));
  bool queued_line = false;
  for (const std::string& f : trace_files(dir.path)) {
    const std::string t = slurp(f);
    if (!has(t, " rank=2 size=3 ")) continue;
    CHECK(has(t, " rank=2 size=3 calls=2 kept=2 queued=1\n"));
    queued_line = has(t, "call seq=0 coll=2 kind=allreduce count=300 dtype=float op=sum root=0 peer2=0 count2=0 "
                         "start_us=0 end_us=0 queued_us=");
  }
  CHECK(queued_line);
}
