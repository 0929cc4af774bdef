// Gradient compression in data_parallel (dp_options::compression, fp16 and
// bf16): real processes over shared memory. Each rank fills its gradients with
// values every rank can regenerate (seeded by rank and element), marks them
// ready in backward's order (so the early buckets go asynchronously and the
// last inline), and synchronizes. Checked, for 2, 3 and 4 ranks:
//   - every element is within the rounding bound of the exact mean (below);
//   - every element is a value of the 16-bit type (what was sent is what came
//     back, unpacked exactly): compression really happened;
//   - every rank holds bitwise identical gradients;
//   - ranks that disagree on compression get errc::mismatch from create().
//
// The bound. Rank r sends p_r = fl(g_r / N) = (g_r / N)(1 + d_r), |d_r| <= u
// (u = 2^-8 for bf16, 2^-11 for fp16; u + 2^-23 when g_r / N is not exact in
// fp32, which rounds first), plus, for fp16, an absolute error up to
// 2^-25 where the result is subnormal. The allreduce adds the N values in some
// order, rounding every partial sum to the type: by Higham (Accuracy and
// Stability of Numerical Algorithms, 4.2) the computed sum is within
// gamma_{N-1} sum |p_r| of the exact one, gamma_k = k u / (1 - k u). With
// S = sum_r |g_r| / N, the mean of the magnitudes:
//   |result - mean| <= (u + gamma_{N-1} (1 + u)) S + N 2^-25 (fp16 only).
#include <cclite/cclite.hpp>
#include <cclite/train/data_parallel.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "support/comm.hpp"
#include "support/grad_fixture.hpp"
#include "support/mp.hpp"

using namespace cclite;
namespace train = cclite::train;

namespace {

// Rank r's gradient element i at step s: signs mixed, magnitudes spread over
// 2^-10 .. 2^8 (inside fp16's normal range after dividing by N <= 4, apart
// from rare values near zero), so both roundings are exercised.
float grad_value(int step, int rank, std::size_t i) {
  const std::uint64_t x = test::grad_bits(step, rank, i);
  const double unit = static_cast<double>(x >> 11) / 9007199254740992.0;  // [0, 1)
  const int e = static_cast<int>((x >> 3) % 19) - 10;
  return static_cast<float>((unit * 2 - 1) * std::ldexp(1.0, e));
}

bool representable(float v, train::grad_compression c) {
  if (c == train::grad_compression::bf16) {
    std::uint32_t b;
    std::memcpy(&b, &v, 4);
    return (b & 0xffffu) == 0;
  }
  return to_float(to_half(v)) == v;
}

int check_rank(default_communicator& comm, train::grad_compression c) {
  const int rank = comm.rank(), n = comm.size();
  std::vector<train::parameter> params;
  for (const auto& s : test::toy_model) params.emplace_back(s.name, s.size);
  train::parameter_list list;
  for (auto& p : params) list.push_back(&p);
  train::dp_options o;
  o.first_bucket_cap_bytes = 1024;  // 3 buckets: two asynchronous, the last inline
  o.bucket_cap_bytes = 8192;
  o.compression = c;
  auto made = train::data_parallel<default_communicator>::create(comm, list, o);
  MP_REQUIRE_OK(made);
  auto& ddp = made.value();
  MP_REQUIRE(ddp.buckets().buckets.size() == 3);
  MP_CHECK(!ddp.shared_gradients());  // compressed: the window is not what is reduced

  // g / N is rounded to fp32 before the 16-bit rounding (exact for N = 2, 4):
  // the packing error is at most u + 2^-23, not u.
  const double u = std::ldexp(1.0, c == train::grad_compression::bf16 ? -8 : -11);
  const double pack = u + std::ldexp(1.0, -23);
  const double gamma = (n - 1) * u / (1 - (n - 1) * u);
  const double floor = c == train::grad_compression::fp16 ? n * std::ldexp(1.0, -25) : 0.0;
  double worst = 0;  // largest error / bound seen
  bool rounded = false;
  for (int step = 0; step < 3; ++step) {
    // Every element's offset in the registration order identifies it for grad_value.
    std::size_t base = 0;
    std::vector<std::size_t> first(params.size());
    for (std::size_t k = 0; k < params.size(); ++k) {
      first[k] = base;
      for (std::size_t i = 0; i < params[k].size(); ++i) params[k].grad()[i] = grad_value(step, rank, base + i);
      base += params[k].size();
    }
    for (std::size_t k = params.size(); k-- > 0;) ddp.grad_ready(params[k]);
    MP_REQUIRE_OK(ddp.synchronize());
    for (std::size_t k = 0; k < params.size(); ++k) {
      for (std::size_t i = 0; i < params[k].size(); ++i) {
        double mean = 0, s = 0;
        for (int r = 0; r < n; ++r) {
          const double g = grad_value(step, r, first[k] + i);
          mean += g / n;
          s += std::fabs(g) / n;
        }
        const float got = params[k].grad()[i];
        const double err = std::fabs(static_cast<double>(got) - mean);
        const double bound = (pack + gamma * (1 + u)) * s + floor;
        worst = std::max(worst, err / bound);
        rounded = rounded || static_cast<float>(mean) != got;
        if (err > bound || !representable(got, c)) {
          std::fprintf(stderr, "rank %d step %d %s[%zu]: got %.9g, mean %.9g, error %.3g > bound %.3g or not %s\n",
                       rank, step, params[k].name().c_str(), i, static_cast<double>(got), mean, err, bound,
                       train::to_string(c));
          return 1;
        }
      }
    }
    std::uint64_t h = 1469598103934665603ull;
    for (auto& p : params) h = test::fnv_floats(p.grad(), p.size(), h);
    MP_CHECK(test::same_on_all_ranks(comm, h));
  }
  MP_CHECK(rounded);  // some element is not the fp32 mean: the 16-bit path ran
  if (rank == 0)
    std::printf("%s, %d ranks: largest error %.3f of the bound\n", train::to_string(c), n, worst);
  return 0;
}

void run(int ranks, train::grad_compression c) {
  test::temp_dir dir;
  auto r = test::run_ranks(
      ranks,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        auto comm = test::make_comm(*kv, rank, size);
        return check_rank(*comm, c);
      },
      std::chrono::seconds(120));
  INFO(train::to_string(c), ", ", ranks, " ranks: ", r.describe());
  REQUIRE(r.all_ok());
}

}  // namespace

TEST_CASE("grad_compression: names parse and print") {
  train::grad_compression c = train::grad_compression::none;
  CHECK(train::parse_grad_compression("bf16", c));
  CHECK(c == train::grad_compression::bf16);
  CHECK(train::parse_grad_compression("fp16", c));
  CHECK(c == train::grad_compression::fp16);
  CHECK(train::parse_grad_compression("none", c));
  CHECK(c == train::grad_compression::none);
  CHECK_FALSE(train::parse_grad_compression("fp8", c));
  CHECK_FALSE(train::parse_grad_compression("bf1", c));
  CHECK_FALSE(train::parse_grad_compression("bf166", c));
}

TEST_CASE("data_parallel: bf16 compression, 2, 3 and 4 ranks: within the rounding bound, bitwise equal") {
  run(2, train::grad_compression::bf16);
  run(3, train::grad_compression::bf16);
  run(4, train::grad_compression::bf16);
}

TEST_CASE("data_parallel: fp16 compression, 2 and 4 ranks: within the rounding bound, bitwise equal") {
  run(2, train::grad_compression::fp16);
  run(4, train::grad_compression::fp16);
}

TEST_CASE("data_parallel: ranks that disagree on compression get a mismatch, not mixed bytes") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        auto comm = test::make_comm(*kv, rank, size);
        train::parameter p("w", 100);
        train::dp_options o;
        o.compression = rank == 0 ? train::grad_compression::bf16 : train::grad_compression::none;
        auto made = train::data_parallel<default_communicator>::create(*comm, {&p}, o);
        MP_REQUIRE(!made.ok());
        MP_CHECK(made.error().code() == errc::mismatch);
        MP_CHECK(made.error().message().find("compression") != std::string::npos);
        return 0;
      },
      std::chrono::seconds(60));
  INFO(r.describe());
  REQUIRE(r.all_ok());
}
