// Strings and vectors whose size only their owner knows (collective/objects.hpp):
// real processes over shared memory and loopback TCP. Checked: root's data on
// every rank whatever the others held, every rank's contribution in rank order
// (lengths 0 to 300 KB, different per rank) on every rank or on a root, a
// root's parts scattered (and a root with a part too few: invalid_argument on
// every rank, no wait), empty data everywhere, the same
// over a tcp-only communicator, and a rank passing another root gets
// errc::mismatch instead of a hang or mixed data.
#include <cclite/cclite.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;

namespace {

// Rank r's contribution: a length of its own (one of them empty) and bytes
// that say whose they are and where.
std::string text_of(int rank, int round) {
  const std::size_t len = rank == 1 ? 0 : static_cast<std::size_t>(rank) * 100000 + static_cast<std::size_t>(round) * 7 + 3;
  std::string s(len, ' ');
  for (std::size_t i = 0; i < len; ++i) s[i] = static_cast<char>('a' + (rank * 31 + i * 7 + static_cast<std::size_t>(round)) % 26);
  return s;
}
std::vector<double> numbers_of(int rank) {
  std::vector<double> v(static_cast<std::size_t>(rank) * 3 + 1);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = rank + 0.25 * static_cast<double>(i);
  return v;
}

template <class Comm>
int check_all(Comm& comm) {
  const int rank = comm.rank(), n = comm.size();
  for (int root = 0; root < n; ++root) {
    // Others hold data of their own, longer or shorter: replaced by root's.
    std::string s = rank == root ? text_of(root, 1) : std::string(static_cast<std::size_t>(rank) * 5, 'x');
    MP_REQUIRE_OK(broadcast_string(comm, s, root));
    MP_CHECK(s == text_of(root, 1));
    std::vector<double> v = rank == root ? numbers_of(root) : std::vector<double>(50, -1.0);
    MP_REQUIRE_OK(broadcast_vector(comm, v, root));
    MP_CHECK(v == numbers_of(root));
  }
  std::string empty = rank == 0 ? "" : "stale";
  MP_REQUIRE_OK(broadcast_string(comm, empty, 0));
  MP_CHECK(empty.empty());

  for (int round = 0; round < 3; ++round) {
    auto all = allgather_strings(comm, text_of(rank, round));
    MP_REQUIRE_OK(all);
    MP_REQUIRE(all.value().size() == static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) MP_CHECK(all.value()[static_cast<std::size_t>(r)] == text_of(r, round));
  }
  auto nums = allgather_vectors(comm, numbers_of(rank));
  MP_REQUIRE_OK(nums);
  for (int r = 0; r < n; ++r) MP_CHECK(nums.value()[static_cast<std::size_t>(r)] == numbers_of(r));
  auto nothing = allgather_strings(comm, std::string());
  MP_REQUIRE_OK(nothing);
  for (const auto& s : nothing.value()) MP_CHECK(s.empty());
  // gather to each root in turn: rank order on the root, nothing elsewhere
  for (int root = 0; root < n; ++root) {
    auto g = gather_strings(comm, text_of(rank, root), root);
    MP_REQUIRE_OK(g);
    if (rank != root) {
      MP_CHECK(g.value().empty());
      continue;
    }
    MP_REQUIRE(g.value().size() == static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) MP_CHECK(g.value()[static_cast<std::size_t>(r)] == text_of(r, root));
  }
  auto gn = gather_vectors(comm, numbers_of(rank), n - 1);
  MP_REQUIRE_OK(gn);
  if (rank == n - 1)
    for (int r = 0; r < n; ++r) MP_CHECK(gn.value()[static_cast<std::size_t>(r)] == numbers_of(r));
  // scatter from each root: rank r gets the root's part r (one of them empty)
  for (int root = 0; root < n; ++root) {
    std::vector<std::string> parts;
    if (rank == root)
      for (int r = 0; r < n; ++r) parts.push_back(text_of(r, root + 5));
    auto mine = scatter_strings(comm, parts, root);
    MP_REQUIRE_OK(mine);
    MP_CHECK(mine.value() == text_of(rank, root + 5));
  }
  std::vector<std::vector<double>> nparts;
  if (rank == 1)
    for (int r = 0; r < n; ++r) nparts.push_back(numbers_of(n - r));
  auto sn = scatter_vectors(comm, nparts, 1);
  MP_REQUIRE_OK(sn);
  MP_CHECK(sn.value() == numbers_of(n - rank));
  // a root with a part too few: invalid_argument everywhere, no wait, and the communicator goes on
  std::vector<std::string> short_parts(rank == 0 ? static_cast<std::size_t>(n - 1) : 0, "x");
  auto wrong = scatter_strings(comm, short_parts, 0);
  MP_CHECK(wrong.error().code() == errc::invalid_argument);
  const char* said = rank == 0 ? "the root has 2 parts for 3 ranks" : "the root (rank 0) was not given one part per rank";
  MP_CHECK(wrong.error().message().find(said) != std::string::npos);
  MP_REQUIRE_OK(comm.barrier());
  return 0;
}

}  // namespace

TEST_CASE("objects: broadcast, allgather, gather and scatter of strings and vectors of any length, 3 ranks, shm and tcp") {
  for (bool tcp : {false, true}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        3,
        [&](int rank, int size) {
          auto kv = test::open_dir_store(dir.path);
          if (tcp) {
            comm_options o;
            o.timeout = milliseconds(60000);
            auto c = communicator<tcp::transport>::create(*kv, rank, size, o);
            MP_REQUIRE_OK(c);
            return check_all(*c.value());
          }
          auto c = test::make_comm(*kv, rank, size);
          return check_all(*c);
        },
        std::chrono::seconds(120));
    INFO((tcp ? "tcp: " : "shm: "), r.describe());
    REQUIRE(r.all_ok());
  }
}

TEST_CASE("objects: a rank that names another root gets a mismatch, not another rank's bytes") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        comm_options o;
        o.timeout = milliseconds(20000);
        auto c = test::make_comm(*kv, rank, size, o);
        std::string s = "rank " + std::to_string(rank);
        status st = broadcast_string(*c, s, rank);  // each names itself
        MP_CHECK(!st.ok());
        MP_CHECK(st.code() == errc::mismatch);
        MP_CHECK(s == "rank " + std::to_string(rank));  // untouched
        return 0;
      },
      std::chrono::seconds(60));
  INFO(r.describe());
  REQUIRE(r.all_ok());
}
