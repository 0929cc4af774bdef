// A CCLITE_NO_THREADS build (config.hpp): blocking collectives run on the
// caller's thread, *_async calls fail with errc::unsupported, and the process
// never has a second thread. The macro is set for this whole executable (this
// TU and the doctest main, which includes no cclite header), as a program must.
#define CCLITE_NO_THREADS 1
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "support/comm.hpp"

using namespace cclite;
using test::net;

namespace {

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
  MP_CHECK(thread_count() == 1);
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
