// train::sharded_optimizer: the optimiser step sharded over a node's ranks and
// fused with the gradient reduction. Real processes, real shared memory.
//
// The claim is "the same bits as data_parallel::synchronize() + opt.step()":
// each rank trains a small MLP twice on the same data, once the plain way and
// once sharded, and the parameter hashes must agree at every step, for SGD
// (momentum, Nesterov, weight decay) and AdamW, on 2, 3 and 4 ranks, with and
// without two micro-batches per step. Plus: rank 0's checkpoint written
// mid-run holds the whole node's state (a sharded run resumed from it ends
// with the uninterrupted run's bits); after the wrapper goes, every rank has
// its own copy of the values again and plain steps go on; over TCP (no shared
// windows) it falls back to synchronize + step; stepping with sync off and an
// optimiser parameter data_parallel does not know are refused; a rank killed
// mid-training is named by the survivors' step().
#include <cclite/cclite.hpp>
#include <cclite/train/train.hpp>

#include <doctest/doctest.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
namespace train = cclite::train;

namespace {

constexpr int features = 20, classes = 5, global_batch = 24;
// fc1: 20x40 + 40, fc2: 40x30 + 30, fc3: 30x5 + 5 = 2,225 values: slices of
// 3 and 4 ranks cut through parameters, and pieces through slices.
const std::vector<int> layer_sizes = {features, 40, 30, classes};

std::uint64_t fnv(const void* p, std::size_t n, std::uint64_t h) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
std::uint64_t hash_params(const train::parameter_list& ps) {
  std::uint64_t h = 1469598103934665603ull;
  for (const train::parameter* p : ps) h = fnv(p->value(), p->bytes(), h);
  return h;
}

// Sample i of step s, the same on every rank: rank r takes the r-th share.
void batch(int step, int rank, int n, std::vector<float>& x, std::vector<std::uint8_t>& y) {
  const int local = global_batch / n;
  x.resize(static_cast<std::size_t>(local) * features);
  y.resize(static_cast<std::size_t>(local));
  for (int j = 0; j < local; ++j) {
    train::rng g(static_cast<std::uint64_t>(step) * 1000 + static_cast<std::uint64_t>(rank * local + j));
    for (int f = 0; f < features; ++f) x[static_cast<std::size_t>(j * features + f)] = g.uniform(-1, 1);
    y[static_cast<std::size_t>(j)] = static_cast<std::uint8_t>(g.uniform(0, 1) * classes) % classes;
  }
}

enum class which { sgd, sgd_nesterov, adamw };

template <class Opt>
Opt make_opt(which w, const train::parameter_list& ps) {
  if constexpr (std::is_same_v<Opt, train::sgd>) {
    return train::sgd(ps, {0.05f, 0.9f, 1e-3f, w == which::sgd_nesterov});
  } else {
    (void)w;
    return train::adamw(ps, {1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f});
  }
}

struct plan {
  which opt = which::sgd;
  int steps = 12;
  int accumulate = 1;
  bool sharded = false;
  int first_step = 0;          // resume: steps [first_step, steps)
  std::string save_at_path;    // rank 0 saves after step save_at
  int save_at = -1;
  std::string load_path;       // every rank loads before the first step
};

// Trains from a fixed initialisation; returns the parameter hash after each step.
template <class Comm, class Opt>
std::vector<std::uint64_t> train_run(Comm& c, const plan& p) {
  const int rank = c.rank(), n = c.size();
  const int micro = global_batch / n / p.accumulate;
  train::set_compute_threads(1);
  train::mlp net(layer_sizes, micro, 77 + static_cast<std::uint64_t>(rank));  // rank 0's is broadcast
  train::dp_options o;
  o.first_bucket_cap_bytes = 1024;  // fc3 (620 B) alone: the small path; fc2, fc1: the window path
  o.bucket_cap_bytes = 6000;
  auto made = train::data_parallel<Comm>::create(c, net.parameters(), o);
  MP_REQUIRE_OK(made);
  auto& ddp = made.value();
  MP_REQUIRE(ddp.shared_gradients() == (n > 1 && !std::is_same_v<Comm, communicator<tcp::transport>>));
  Opt opt = make_opt<Opt>(p.opt, net.parameters());
  if (!p.load_path.empty()) {
    auto ck = train::checkpoint::load(p.load_path);
    MP_REQUIRE_OK(ck);
    MP_REQUIRE_OK(train::load_parameters(ck.value(), net.parameters()));
    MP_REQUIRE_OK(opt.load_state(ck.value()));
  }
  std::vector<std::uint64_t> hashes;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  auto one_step = [&](int s, auto&& finish) {
    for (int m = 0; m < p.accumulate; ++m) {
      ddp.set_sync(m + 1 == p.accumulate);
      batch(s * p.accumulate + m, rank, n * p.accumulate, x, y);  // micro-batch m of step s
      train::softmax_cross_entropy(net.forward(x.data(), micro), y.data(), micro, classes, net.output_grad(),
                                   1.0f / static_cast<float>(global_batch / n));
      net.backward(micro, [&](train::parameter& q) { ddp.grad_ready(q); }, /*accumulate=*/m > 0);
    }
    finish();
    hashes.push_back(hash_params(net.parameters()));
    if (s == p.save_at && rank == 0) {
      train::checkpoint ck;
      train::save_parameters(ck, net.parameters());
      opt.save_state(ck);
      MP_REQUIRE_OK(ck.save(p.save_at_path));
    }
    if (s == p.save_at) MP_REQUIRE_OK(c.barrier());  // saved before anyone steps on
  };
  if (!p.sharded) {
    for (int s = p.first_step; s < p.steps; ++s)
      one_step(s, [&] {
        MP_REQUIRE_OK(ddp.synchronize());
        opt.step();
      });
    return hashes;
  }
  {
    train::sharded_optimizer<Comm, Opt> zo(ddp, opt);
    MP_REQUIRE(zo.fused() == ddp.shared_gradients());
    for (int s = p.first_step; s < p.steps; ++s) one_step(s, [&] { MP_REQUIRE_OK(zo.step()); });
    if (zo.fused()) {
      // One copy for the node: every rank's values are rank 0's memory, and
      // the slices cover the layout once, cut at 16 floats.
      std::size_t first = zo.slice_first(), count = zo.slice_count(), lo = first, hi = first + count;
      MP_REQUIRE_OK(c.allreduce(&lo, 1, reduce_op::min));
      MP_REQUIRE_OK(c.allreduce(&hi, 1, reduce_op::max));
      std::size_t total = count;
      MP_REQUIRE_OK(c.allreduce(&total, 1, reduce_op::sum));
      MP_CHECK(lo == 0 && hi == ddp.flat_size() && total == ddp.flat_size() && first % 16 == 0);
      MP_CHECK(!net.parameters()[0]->owns_value());
    }
  }
  // The wrapper is gone: own values again, and plain steps continue in step.
  for (const train::parameter* q : net.parameters()) MP_CHECK(q->owns_value());
  if (p.steps > p.first_step) {
    one_step(p.steps, [&] {
      MP_REQUIRE_OK(ddp.synchronize());
      opt.step();
    });
  }
  return hashes;
}

template <class Comm, class Opt>
int compare_modes(Comm& c, which w, int accumulate) {
  plan a;
  a.opt = w;
  a.accumulate = accumulate;
  plan b = a;
  b.sharded = true;
  a.steps += 1;  // the sharded run adds one plain step after the wrapper goes
  const auto plain = train_run<Comm, Opt>(c, a), sharded = train_run<Comm, Opt>(c, b);
  if (plain != sharded) {
    std::size_t s = 0;
    while (s < plain.size() && s < sharded.size() && plain[s] == sharded[s]) ++s;
    std::fprintf(stderr, "rank %d: opt %d, %d micro-batch(es): sharded differs from plain from step %zu on\n",
                 c.rank(), static_cast<int>(w), accumulate, s);
    return 1;
  }
  // And every rank got the same bits.
  std::uint64_t h = plain.back(), lo = h, hi = h;
  MP_REQUIRE_OK(c.allreduce(&lo, 1, reduce_op::min));
  MP_REQUIRE_OK(c.allreduce(&hi, 1, reduce_op::max));
  return lo == hi ? 0 : 1;
}

}  // namespace

TEST_CASE("sharded_optimizer: the bits of synchronize() + step() for SGD and AdamW, 2-4 ranks, micro-batches") {
  for (int size : {2, 3, 4}) {
    test::temp_dir dir;
    auto r = test::run_ranks(
        size,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          int bad = 0;
          bad += compare_modes<default_communicator, train::sgd>(*c, which::sgd, 1);
          bad += compare_modes<default_communicator, train::sgd>(*c, which::sgd_nesterov, 2);
          bad += compare_modes<default_communicator, train::adamw>(*c, which::adamw, 1);
          bad += compare_modes<default_communicator, train::adamw>(*c, which::adamw, 2);
          MP_CHECK(bad == 0);
          return 0;
        },
        std::chrono::seconds(180), [&](int rank) { test::set_net_env(test::net::shm_only, rank, size); });
    INFO("size ", size, ": ", r.describe());
    CHECK(r.all_ok());
  }
}

TEST_CASE("sharded_optimizer: rank 0's checkpoint holds the node's whole state; a resumed run ends the same") {
  for (which w : {which::sgd, which::adamw}) {
    test::temp_dir dir;
    const std::string ck = dir.path + "/ck.bin";
    auto r = test::run_ranks(
        3,
        [&](int rank, int sz) {
          auto kv = test::open_dir_store(dir.path);
          auto c = test::make_comm(*kv, rank, sz);
          plan whole;
          whole.opt = w;
          whole.sharded = true;
          whole.save_at = 5;
          whole.save_at_path = ck;
          plan resumed = whole;
          resumed.save_at = -1;
          resumed.first_step = 6;
          resumed.load_path = ck;
          auto a = w == which::sgd ? train_run<default_communicator, train::sgd>(*c, whole)
                                   : train_run<default_communicator, train::adamw>(*c, whole);
          auto b = w == which::sgd ? train_run<default_communicator, train::sgd>(*c, resumed)
                                   : train_run<default_communicator, train::adamw>(*c, resumed);
          MP_REQUIRE(a.size() == 13 && b.size() == 7);
          // Steps 6..11 of the whole run, and the plain step after both.
          MP_CHECK(std::vector<std::uint64_t>(a.begin() + 6, a.end()) == b);
          return 0;
        },
        std::chrono::seconds(120), [&](int rank) { test::set_net_env(test::net::shm_only, rank, 3); });
    INFO(r.describe());
    CHECK(r.all_ok());
  }
}

TEST_CASE("sharded_optimizer: over TCP it is synchronize() + step(); refusals") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      2,
      [&](int rank, int sz) {
        auto kv = test::open_dir_store(dir.path);
        comm_options opts;
        opts.timeout = milliseconds(60000);
        auto tc = communicator<tcp::transport>::create(*kv, rank, sz, opts);
        MP_REQUIRE_OK(tc);
        plan a, b;
        a.steps = 7;  // plain, 6 + the one after
        b.steps = 6;
        b.sharded = true;
        MP_CHECK((train_run<communicator<tcp::transport>, train::sgd>(*tc.value(), a) ==
                  train_run<communicator<tcp::transport>, train::sgd>(*tc.value(), b)));

        auto c = test::make_comm(*kv, rank, sz, opts);
        train::mlp net(layer_sizes, 4, 1);
        auto made = train::data_parallel<default_communicator>::create(*c, net.parameters());
        MP_REQUIRE_OK(made);
        auto& ddp = made.value();
        {
          train::sgd opt(net.parameters(), {0.1f});
          train::sharded_optimizer<default_communicator, train::sgd> zo(ddp, opt);
          MP_CHECK(zo.fused());
          ddp.set_sync(false);
          status st = zo.step();
          MP_CHECK(st.code() == errc::invalid_argument && st.message().find("sync is off") != std::string::npos);
          ddp.set_sync(true);
        }
        {
          train::parameter stranger("stranger.weight", 10);
          train::sgd opt({net.parameters()[0], &stranger}, {0.1f});
          train::sharded_optimizer<default_communicator, train::sgd> zo(ddp, opt);
          status st = zo.step();
          MP_CHECK(st.code() == errc::invalid_argument && st.message().find("stranger.weight") != std::string::npos);
          MP_CHECK(zo.step().code() == errc::invalid_argument);  // stays broken
        }
        MP_REQUIRE_OK(c->barrier());
        return 0;
      },
      std::chrono::seconds(120));
  INFO(r.describe());
  CHECK(r.all_ok());
}

// A rank killed while the others train sharded: the survivors' step() returns
// peer_lost naming it (the step's barriers watch the peers' liveness), well
// before the timeout, and the wrapper stays broken.
TEST_CASE("sharded_optimizer: a rank killed mid-training is named by the survivors' step(), no hang") {
  test::temp_dir dir;
  auto r = test::run_ranks(
      3,
      [&](int rank, int sz) {
        auto kv = test::open_dir_store(dir.path);
        auto c = test::make_comm(*kv, rank, sz);
        const std::string victim = c->peer(1).describe();
        const int micro = global_batch / sz;
        train::set_compute_threads(1);
        train::mlp net(layer_sizes, micro, 5);
        auto made = train::data_parallel<default_communicator>::create(*c, net.parameters());
        MP_REQUIRE_OK(made);
        auto& ddp = made.value();
        train::sgd opt(net.parameters(), {0.05f, 0.9f});
        train::sharded_optimizer<default_communicator, train::sgd> zo(ddp, opt);
        MP_REQUIRE(zo.fused());
        std::vector<float> x;
        std::vector<std::uint8_t> y;
        for (int s = 0; s < 100000; ++s) {
          if (rank == 1 && s == 50) ::raise(SIGKILL);
          batch(s, rank, sz, x, y);
          train::softmax_cross_entropy(net.forward(x.data(), micro), y.data(), micro, classes, net.output_grad(),
                                       1.0f / static_cast<float>(micro));
          net.backward(micro, [&](train::parameter& q) { ddp.grad_ready(q); }, false);
          status st = zo.step();
          if (st.ok()) continue;
          if (st.code() != errc::peer_lost || st.message().find(victim) == std::string::npos)
            std::fprintf(stderr, "rank %d: expected peer_lost naming %s, got %s\n", rank, victim.c_str(),
                         st.to_string().c_str());
          MP_CHECK(st.code() == errc::peer_lost);
          MP_CHECK(st.message().find(victim) != std::string::npos);
          MP_CHECK(st.message().find("sharded_optimizer") != std::string::npos);
          MP_CHECK(zo.step().code() == errc::peer_lost);  // stays broken
          return s >= 49 ? 0 : 1;
        }
        return 1;
      },
      std::chrono::seconds(60), [&](int rank) {
        test::set_net_env(test::net::shm_only, rank, 3);
        ::setenv("CCLITE_TIMEOUT", "60", 1);  // the loss must be reported well before this
      });
  INFO(r.describe());
  CHECK(r.exit_codes[0] == 0);
  CHECK(r.exit_codes[1] == -SIGKILL);
  CHECK(r.exit_codes[2] == 0);
  CHECK_FALSE(r.timed_out);
}
