// A CCLITE_NO_THREADS build (config.hpp): blocking collectives run on the
// caller's thread, *_async calls fail with errc::unsupported, and the process
// never has a second thread, rank 0 hosting the TCP rendezvous store included
// (its server runs in a helper process it forks, tcp/rendezvous.hpp). The macro is set for
// this whole executable (this TU and the doctest main, which includes no
// cclite header), as a program must.
#define CCLITE_NO_THREADS 1
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <dirent.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/comm.hpp"

using namespace cclite;
using test::net;

namespace {

// Threads a rank has with none of cclite's: its main thread, and under
// ThreadSanitizer the runtime's background thread (the full-suite TSan run,
// tests/sanitize-suite.sh, counted 2 without cclite starting one).
#if defined(__SANITIZE_THREAD__)
constexpr int own_threads = 2;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int own_threads = 2;
#else
constexpr int own_threads = 1;
#endif
#else
constexpr int own_threads = 1;
#endif

// Threads of this process, from /proc/self/status ("Threads:\tN").
int thread_count() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int n = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "Threads:", 8) == 0) n = std::atoi(line + 8);
  std::fclose(f);
  return n;
}

// Entries of /proc/self/task: one per thread, counted without trusting the
// "Threads:" summary.
int task_count() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

int blocking_only(default_communicator& c) {
  std::vector<float> v(100000, static_cast<float>(c.rank() + 1));
  MP_REQUIRE_OK(c.allreduce(v.data(), v.size()));
  const float want = static_cast<float>(c.size() * (c.size() + 1) / 2);
  MP_CHECK(v.front() == want && v.back() == want);
  MP_REQUIRE_OK(c.barrier());

  work w = c.allreduce_async(v.data(), v.size());
  status st = w.wait();
  MP_CHECK(st.code() == errc::unsupported);
  MP_CHECK(st.message().find("CCLITE_NO_THREADS") != std::string::npos);
  MP_CHECK(c.barrier_async().wait().code() == errc::unsupported);
  // The refused calls left the communicator usable and the ranks in step.
  MP_REQUIRE_OK(c.broadcast(v.data(), v.size(), dtype::float32, 0));
  MP_CHECK(v.back() == want);
  MP_CHECK(thread_count() == own_threads);
  MP_CHECK(task_count() == own_threads);
  return 0;
}

}  // namespace

TEST_CASE("CCLITE_NO_THREADS: blocking collectives work and async calls are unsupported") {
  for (net n : {net::shm_only, net::tcp_only}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        2,
        [&](int rank, int size) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, size);
          return blocking_only(*c);
        },
        std::chrono::seconds(120), [&](int rank) { test::set_net_env(n, rank, 2); });
    INFO("net ", test::to_string(n), ": ", r.describe());
    CHECK(r.all_ok());
  }
}

// cclite::init() as a launcher starts it: rank 0 hosts the TCP rendezvous
// store on MASTER_ADDR:MASTER_PORT. Without a thread for the server, every rank
// still has exactly one task after init, after collectives and after split()
// (which meets through the store again).
TEST_CASE("CCLITE_NO_THREADS: init() over the TCP rendezvous starts no thread on any rank") {
  for (net n : {net::shm_only, net::tcp_only}) {
    const std::string port = std::to_string(test::free_port());
    REQUIRE(port != "0");
    auto r = test::run_ranks(
        3,
        [&](int rank, int size) {
          MP_CHECK(task_count() == own_threads);
          auto comm = cclite::init();
          MP_REQUIRE_OK(comm);
          auto& c = *comm.value();
          MP_CHECK(c.rank() == rank && c.size() == size);
          MP_CHECK(task_count() == own_threads);
          if (int rc = blocking_only(c)) return rc;
          auto sub = c.split(rank % 2, rank);
          MP_REQUIRE_OK(sub);
          float x = 1;
          MP_REQUIRE_OK(sub.value()->allreduce(&x, 1));
          MP_CHECK(x == (rank % 2 == 0 ? 2.0f : 1.0f));
          MP_REQUIRE_OK(c.barrier());
          MP_CHECK(task_count() == own_threads);
          return 0;
        },
        std::chrono::seconds(120),
        [&](int rank) {
          test::set_net_env(n, rank, 3);
          test::set_launch_env(rank, 3, port);
          ::setenv("CCLITE_TIMEOUT", "60", 1);
        });
    INFO("net ", test::to_string(n), ": ", r.describe());
    CHECK(r.all_ok());
  }
}

// Failure spreading without threads: rank 0 fails (abort), records it in the
// store its helper process serves, and returns at once, so its process exits.
// The helper must keep serving (rank 0 asked it to drain) until ranks 1 and 2,
// calling 0.5 s later, have read the record: they name rank 0's abort instead
// of only "store unreachable" or a closed link.
TEST_CASE("CCLITE_NO_THREADS: the store's helper outlives a failed rank 0 until the others read its failure") {
  const std::string port = std::to_string(test::free_port());
  REQUIRE(port != "0");
  auto r = test::run_ranks(
      3,
      [&](int rank, int) {
        auto comm = cclite::init();
        MP_REQUIRE_OK(comm);
        auto& c = *comm.value();
        std::vector<float> x(1000, 1.0f);
        if (rank == 0) {
          c.abort();
          (void)c.allreduce(x.data(), x.size());  // records the failure
          return 0;                               // env_communicator asks the helper to drain
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0 has exited by then
        const status st = c.allreduce(x.data(), x.size());
        const std::string m = st.message();
        if (st.ok() || m.find("the job's first failure") == std::string::npos || m.find("rank 0") == std::string::npos ||
            m.find("aborted its communicator") == std::string::npos) {
          std::fprintf(stderr, "rank %d: wanted rank 0's recorded abort, got: %s\n", rank, st.to_string().c_str());
          return 1;
        }
        return 0;
      },
      std::chrono::seconds(120),
      [&](int rank) {
        test::set_net_env(net::shm_only, rank, 3);
        test::set_launch_env(rank, 3, port);
        ::setenv("CCLITE_TIMEOUT", "20", 1);
      });
  INFO(r.describe());
  CHECK(r.all_ok());
}
