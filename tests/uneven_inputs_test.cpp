// Uneven inputs in data_parallel (dp_options::uneven_inputs and join(),
// PyTorch's Join context): real processes over shared memory, each rank
// running its own number of steps. Each step every training rank fills its
// gradients with values every rank can regenerate (small integers, so sums
// are exact), marks them ready in backward's order (early buckets go
// asynchronously, the last inline) and synchronizes; a rank out of steps
// calls join(), whose callback runs where the optimiser step would. Checked:
//   - at every step, on every rank (joined ones included), each gradient is
//     the sum over the ranks still training divided by the world size;
//   - active_ranks() counts the ranks still training;
//   - join() returns how many steps it took part in (the longest rank's
//     count minus this rank's);
//   - after an SGD step per step on every rank, all hold bitwise equal values;
//   - the same with gradients in ordinary memory, bf16 on the wire, and
//     micro-batches accumulated under no_sync();
//   - join() without uneven_inputs is refused, and ranks that disagree on the
//     option get errc::mismatch from create().
#include <cclite/cclite.hpp>
#include <cclite/train/data_parallel.hpp>
#include <cclite/train/optim.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "support/comm.hpp"
#include "support/grad_fixture.hpp"
#include "support/mp.hpp"

using namespace cclite;
namespace train = cclite::train;

namespace {

// Rank r's gradient element i at step s: an integer in [-64, 64].
float grad_value(int step, int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>(test::grad_bits(step, rank, i) % 129) - 64);
}

enum class variant { window, ordinary, bf16, accumulate };

const char* name_of(variant v) {
  switch (v) {
    case variant::window: return "shared window";
    case variant::ordinary: return "ordinary memory";
    case variant::bf16: return "bf16 on the wire";
    case variant::accumulate: return "2 micro-batches (no_sync)";
  }
  return "?";
}

int check_rank(default_communicator& comm, const std::vector<int>& steps, variant v) {
  const int rank = comm.rank(), n = comm.size();
  std::vector<train::parameter> params;
  for (const auto& s : test::toy_model) params.emplace_back(s.name, s.size);
  train::parameter_list list;
  for (auto& p : params) list.push_back(&p);
  train::dp_options o;
  o.first_bucket_cap_bytes = 1024;
  o.bucket_cap_bytes = 8192;
  o.uneven_inputs = true;
  o.shared_gradients = v != variant::ordinary;
  if (v == variant::bf16) o.compression = train::grad_compression::bf16;
  auto made = train::data_parallel<default_communicator>::create(comm, list, o);
  MP_REQUIRE_OK(made);
  auto& ddp = made.value();
  MP_REQUIRE(ddp.buckets().buckets.size() == 3);
  MP_CHECK(ddp.shared_gradients() == (v == variant::window || v == variant::accumulate));
  train::sgd opt(list, {0.01f, 0.9f});

  // What every rank must hold after step s: the still-training ranks' sum / n.
  auto check_grads = [&](int step) {
    const int active = static_cast<int>(std::count_if(steps.begin(), steps.end(), [&](int c) { return c > step; }));
    if (ddp.active_ranks() != active) {
      std::fprintf(stderr, "rank %d step %d: active_ranks() %d, expected %d\n", rank, step, ddp.active_ranks(), active);
      return false;
    }
    std::size_t base = 0;
    for (auto& p : params) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        double sum = 0, mag = 0;
        for (int r = 0; r < n; ++r) {
          if (steps[static_cast<std::size_t>(r)] <= step) continue;
          sum += grad_value(step, r, base + i);
          mag += std::fabs(grad_value(step, r, base + i));
        }
        const double want = sum / n;
        const double got = p.grad()[i];
        // fp32: the sums of small integers are exact and the division by n
        // rounds once. bf16 (u = 2^-8): each value is rounded when packed and
        // every partial sum in bf16; grad_compression_test derives the bound
        // (u + gamma_{n-1} (1 + u)) sum |g| / n, below 5 u sum |g| / n here.
        const double tol = v == variant::bf16 ? 5 * std::ldexp(mag / n, -8) : std::ldexp(std::fabs(want), -22);
        if (std::fabs(got - want) > tol) {
          std::fprintf(stderr, "rank %d step %d %s[%zu]: %.9g, expected %.9g (%s)\n", rank, step, p.name().c_str(), i,
                       got, want, name_of(v));
          return false;
        }
      }
      base += p.size();
    }
    return true;
  };

  const int mine = steps[static_cast<std::size_t>(rank)];
  for (int step = 0; step < mine; ++step) {
    std::size_t base = 0;
    if (v == variant::accumulate) {
      // First micro-batch: half of each value, nothing communicated.
      auto guard = ddp.no_sync();
      for (auto& p : params) {
        for (std::size_t i = 0; i < p.size(); ++i) p.grad()[i] = grad_value(step, rank, base + i) / 2;
        base += p.size();
      }
      for (std::size_t k = params.size(); k-- > 0;) ddp.grad_ready(params[k]);
      MP_REQUIRE_OK(ddp.synchronize());
      base = 0;
    }
    for (auto& p : params) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        const float g = grad_value(step, rank, base + i);
        p.grad()[i] = v == variant::accumulate ? p.grad()[i] + g / 2 : g;  // halves of an integer: exact
      }
      base += p.size();
    }
    for (std::size_t k = params.size(); k-- > 0;) ddp.grad_ready(params[k]);
    MP_REQUIRE_OK(ddp.synchronize());
    MP_REQUIRE(check_grads(step));
    opt.step();
  }
  int next = mine;
  bool good = true;
  auto joined = ddp.join([&] {
    good = good && check_grads(next++);
    opt.step();
  });
  MP_REQUIRE_OK(joined);
  MP_REQUIRE(good);
  const int longest = *std::max_element(steps.begin(), steps.end());
  MP_CHECK(joined.value() == static_cast<std::size_t>(longest - mine));

  // Same optimiser steps on the same averages: the same values everywhere.
  std::uint64_t h = 1469598103934665603ull;
  for (auto& p : params) h = test::fnv_floats(p.value(), p.size(), h);
  MP_CHECK(test::same_on_all_ranks(comm, h));
  // The job goes on normally afterwards: one more collective.
  std::uint64_t one = 1;
  MP_REQUIRE_OK(comm.allreduce(&one, 1, reduce_op::sum));
  MP_CHECK(one == static_cast<std::uint64_t>(n));
  return 0;
}

void run(const std::vector<int>& steps, variant v) {
  test::temp_dir dir;
  const int ranks = static_cast<int>(steps.size());
  auto r = test::run_ranks(
      ranks,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        auto comm = test::make_comm(*kv, rank, size);
        return check_rank(*comm, steps, v);
      },
      std::chrono::seconds(120));
  INFO(std::string(name_of(v)), ", ", ranks, " ranks: ", r.describe());
  REQUIRE(r.all_ok());
}

}  // namespace

TEST_CASE("data_parallel: uneven inputs, 2, 3 and 4 ranks: joined ranks shadow the others' steps") {
  run({4, 1}, variant::window);
  run({5, 2, 4}, variant::window);
  run({3, 6, 1, 6}, variant::window);  // two ranks share the longest count
  run({2, 2, 2}, variant::window);     // even after all: join() returns 0 everywhere
}

TEST_CASE("data_parallel: uneven inputs with ordinary memory, bf16 on the wire, and no_sync micro-batches") {
  run({5, 2, 4}, variant::ordinary);
  run({5, 2, 4}, variant::bf16);
  run({1, 3, 2}, variant::accumulate);
}

TEST_CASE("data_parallel: join() needs uneven_inputs; ranks that disagree on it get a mismatch") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        auto comm = test::make_comm(*kv, rank, size);
        train::parameter p("w", 100);
        {
          auto plain = train::data_parallel<default_communicator>::create(*comm, {&p});
          MP_REQUIRE_OK(plain);
          auto j = plain.value().join([] {});
          MP_REQUIRE(!j.ok());
          MP_CHECK(j.error().code() == errc::invalid_argument);
          MP_CHECK(j.error().message().find("uneven_inputs") != std::string::npos);
        }
        train::dp_options o;
        o.uneven_inputs = rank == 0;
        auto made = train::data_parallel<default_communicator>::create(*comm, {&p}, o);
        MP_REQUIRE(!made.ok());
        MP_CHECK(made.error().code() == errc::mismatch);
        MP_CHECK(made.error().message().find("uneven_inputs") != std::string::npos);
        return 0;
      },
      std::chrono::seconds(60));
  INFO(r.describe());
  REQUIRE(r.all_ok());
}
