// data_parallel end to end: real processes, real shared memory / loopback TCP.
//
// An MLP is trained for 300 steps of global batch 64 on 1 rank, and on 2 and
// 4 ranks with 64/N samples each (distributed_sampler shards, so global step s
// sees the same 64 samples whatever N is). Checked:
//   - every rank of a run holds bitwise identical parameters after every step
//     (hash compared through min/max allreduces), although each rank
//     initialised its model from a different seed (create() broadcasts rank 0's);
//   - at every step the N-rank parameters stay within a bound of the 1-rank
//     ones derived from the summation order (see trajectory_bound below);
//   - the same 2-rank job over communicator<tcp::transport> and through a
//     wrapper communicator gives the same bits as over shm (same ring order);
//   - no_sync micro-batches issue no collective and accumulate correctly;
//   - split mode: fc1's weight gradient computed in row blocks and cut into
//     buckets reduced as soon as their rows are done, and gradients
//     overwritten by backward instead of zeroed: same bounds, same bitwise
//     agreement across ranks;
//   - earlier buckets are issued before backward ends (overlap), checked from
//     the issue order, not from timings.
#include <cclite/cclite.hpp>
#include <cclite/train/train.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "support/comm.hpp"
#include "support/mp.hpp"

using namespace cclite;
namespace train = cclite::train;

namespace {

constexpr int features = 64, classes = 10, dataset = 4096, global_batch = 64, steps = 300;
const std::vector<int> layer_sizes = {features, 48, 32, classes};
constexpr float lr = 0.05f, momentum = 0.9f;

// A learnable synthetic task: labels are the arg-max of a fixed random linear
// "teacher" on uniform inputs. Every process builds the same data from the seed.
struct synthetic {
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  synthetic() : x(static_cast<std::size_t>(dataset) * features), y(dataset) {
    train::rng g(2024);
    std::vector<float> teacher(static_cast<std::size_t>(classes) * features);
    for (float& w : teacher) w = g.uniform(-1, 1);
    for (float& v : x) v = g.uniform(-1, 1);
    for (int i = 0; i < dataset; ++i) {
      int best = 0;
      float best_v = -1e30f;
      for (int c = 0; c < classes; ++c) {
        float s = 0;
        for (int f = 0; f < features; ++f) s += teacher[static_cast<std::size_t>(c * features + f)] * x[static_cast<std::size_t>(i * features + f)];
        if (s > best_v) best_v = s, best = c;
      }
      y[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(best);
    }
  }
};

// Any communicator works: this one forwards to a real one and counts calls.
template <class C>
struct counting_comm {
  C* c;
  int async_calls = 0, blocking_calls = 0;
  int rank() const { return c->rank(); }
  int size() const { return c->size(); }
  template <class T>
  status broadcast(T* p, std::size_t n, int root) { ++blocking_calls; return c->broadcast(p, n, root); }
  template <class T>
  status allreduce(T* p, std::size_t n, reduce_op op) { ++blocking_calls; return c->allreduce(p, n, op); }
  template <class T>
  work allreduce_async(T* p, std::size_t n, reduce_op op) { ++async_calls; return c->allreduce_async(p, n, op); }
};

template <class C>
int dpc_calls(const counting_comm<C>& c) { return c.async_calls + c.blocking_calls; }
template <class C>
int dpc_calls(const C&) { return 0; }  // not counted

struct run_cfg {
  int ranks = 1;
  int accumulate = 1;          // micro-batches per step (no_sync for all but the last)
  bool tcp = false;            // communicator<tcp::transport> instead of the default
  bool wrapped = false;        // through counting_comm
  std::string trajectory;      // rank 0 appends all parameters after every step
  std::string bound_terms;     // 1 rank: per step G_t and max|theta| for trajectory_bound
  bool split = false;          // fc1.weight in 3 blocks/buckets; backward overwrites, no zero_grad
};

std::uint64_t fnv(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// The training loop every run shares. `raw` checks cross-rank equality; `dpc`
// is what data_parallel talks to (the same communicator, or a wrapper of it).
template <class Raw, class DpComm>
int train_loop(Raw& raw, DpComm& dpc, const run_cfg& cfg, int* collectives_in_no_sync) {
  const int rank = raw.rank(), n = raw.size();
  train::set_compute_threads(1);  // one compute thread per rank, as the ranks share 2 cores
  static const synthetic data;
  const int local = global_batch / n, micro = local / cfg.accumulate;
  // A different initialisation on every rank: data_parallel must replace it by rank 0's.
  train::mlp net(layer_sizes, micro, 1000 + static_cast<std::uint64_t>(rank));
  train::dp_options o;
  o.first_bucket_cap_bytes = 2048;  // fc3 alone
  o.bucket_cap_bytes = 8192;        // fc2; fc1 (12 KiB weight and its bias) alone: never split...
  if (cfg.split) {
    // ...unless asked: fc1.weight (12 KiB) in 2 pieces of 24 rows (fc2.weight,
    // 6 KiB, is not above the limit), and backward reports it in 3 blocks of
    // 16 rows: the pieces do not line up with the blocks on purpose, a piece
    // goes once every element of it is final.
    o.split_bytes = 6144;
    net.set_grad_blocks(3);
  }
  auto made = train::data_parallel<DpComm>::create(dpc, net.parameters(), o);
  MP_REQUIRE_OK(made);
  auto& ddp = made.value();
  // Unset, the wait bound follows a communicator's own timeout(); a wrapper
  // without one gets CCLITE_TIMEOUT at create().
  if constexpr (train::detail::has_timeout<DpComm>::value) MP_CHECK(ddp.options().timeout.count() == -2);
  else MP_CHECK(ddp.options().timeout == env::timeout().value());
  const std::size_t nb = cfg.split ? 4 : 3;
  MP_REQUIRE(ddp.buckets().buckets.size() == nb);
  train::sgd opt(net.parameters(), {lr, momentum, 0.0f, false});
  train::distributed_sampler sampler(dataset, rank, n, /*seed=*/7);
  const int steps_per_epoch = dataset / global_batch;
  std::FILE* traj = rank == 0 && !cfg.trajectory.empty() ? std::fopen(cfg.trajectory.c_str(), "wb") : nullptr;
  std::vector<float> x(static_cast<std::size_t>(micro) * features);
  std::vector<std::uint8_t> y(static_cast<std::size_t>(micro));
  // For the bound: a batch-1 copy of the model gives each sample's gradient.
  std::FILE* terms = n == 1 && !cfg.bound_terms.empty() ? std::fopen(cfg.bound_terms.c_str(), "wb") : nullptr;
  train::mlp probe(layer_sizes, 1, 0);
  for (int step = 0; step < steps; ++step) {
    if (step % steps_per_epoch == 0) sampler.set_epoch(static_cast<std::uint64_t>(step / steps_per_epoch));
    const std::size_t base = static_cast<std::size_t>(step % steps_per_epoch) * static_cast<std::size_t>(local);
    for (int m = 0; m < cfg.accumulate; ++m) {
      const bool last = m + 1 == cfg.accumulate;
      ddp.set_sync(last);
      for (int j = 0; j < micro; ++j) {
        const std::size_t idx = sampler.indices()[base + static_cast<std::size_t>(m * micro + j)];
        std::copy(data.x.begin() + static_cast<std::ptrdiff_t>(idx * features),
                  data.x.begin() + static_cast<std::ptrdiff_t>((idx + 1) * features), x.begin() + j * features);
        y[static_cast<std::size_t>(j)] = data.y[idx];
      }
      if (terms) {
        // G_t = max over parameter elements of sum_i |t_i|, the per-sample
        // terms (already scaled by 1/B) that the batch reduction adds up.
        auto pp = probe.parameters(), np = net.parameters();
        std::vector<double> abs_sum;
        for (std::size_t k = 0; k < pp.size(); ++k) {
          std::copy(np[k]->value(), np[k]->value() + np[k]->size(), pp[k]->value());
          abs_sum.resize(abs_sum.size() + pp[k]->size(), 0.0);
        }
        for (int j = 0; j < micro; ++j) {
          train::zero_grads(pp);
          train::softmax_cross_entropy(probe.forward(x.data() + j * features, 1), y.data() + j, 1, classes,
                                       probe.output_grad(), 1.0f / static_cast<float>(local));
          probe.backward(1);
          std::size_t e = 0;
          for (train::parameter* q : pp)
            for (std::size_t i = 0; i < q->size(); ++i) abs_sum[e++] += std::fabs(static_cast<double>(q->grad()[i]));
        }
        double g = 0, th = 0;
        for (double v : abs_sum) g = std::max(g, v);
        for (train::parameter* q : np)
          for (std::size_t i = 0; i < q->size(); ++i) th = std::max(th, std::fabs(static_cast<double>(q->value()[i])));
        const double rec[2] = {g, th};
        std::fwrite(rec, sizeof rec, 1, terms);
      }
      const int before = dpc_calls(dpc);
      train::softmax_cross_entropy(net.forward(x.data(), micro), y.data(), micro, classes, net.output_grad(),
                                   1.0f / static_cast<float>(local));
      if (cfg.split)
        net.backward(micro, [&](train::parameter& p, auto... r) { ddp.grad_ready(p, r...); }, /*accumulate=*/m > 0);
      else
        net.backward(micro, [&](train::parameter& p) { ddp.grad_ready(p); });
      if (!last) {
        MP_REQUIRE_OK(ddp.synchronize());  // a no-op while sync is off
        if (collectives_in_no_sync) *collectives_in_no_sync += dpc_calls(dpc) - before;
      }
    }
    MP_REQUIRE_OK(ddp.synchronize());
    if (n > 1) {
      // Overlap, structurally: every bucket but the last was issued from
      // grad_ready, i.e. before backward returned (in split mode also the
      // first pieces of fc1.weight); the last one by synchronize().
      const auto& tl = ddp.timeline();
      bool ok = tl.size() == nb && tl[nb - 1].launched_us >= ddp.backward_end_us();
      for (std::size_t b = 0; ok && b + 1 < nb; ++b) ok = tl[b].launched_us <= ddp.backward_end_us();
      MP_CHECK(ok);
    }
    opt.step();
    if (!cfg.split) ddp.zero_grad();  // split mode: the next backward overwrites

    std::uint64_t h = 1469598103934665603ull;
    for (train::parameter* p : net.parameters()) h = fnv(p->value(), p->bytes(), h);
    std::uint64_t lo = h, hi = h;
    MP_REQUIRE_OK(raw.allreduce(&lo, 1, reduce_op::min));
    MP_REQUIRE_OK(raw.allreduce(&hi, 1, reduce_op::max));
    if (lo != hi) {
      std::fprintf(stderr, "rank %d: parameters differ between ranks after step %d\n", rank, step);
      return 1;
    }
    if (traj)
      for (train::parameter* p : net.parameters()) std::fwrite(p->value(), sizeof(float), p->size(), traj);
  }
  if (traj) std::fclose(traj);
  if (terms) std::fclose(terms);
  return 0;
}

void run(const run_cfg& cfg) {
  test::temp_dir dir;
  auto r = test::run_ranks(
      cfg.ranks,
      [&](int rank, int size) {
        auto kv = test::open_dir_store(dir.path);
        comm_options opts;
        opts.timeout = milliseconds(60000);
        int calls = 0;
        int rc;
        if (cfg.tcp) {
          auto c = communicator<tcp::transport>::create(*kv, rank, size, opts);
          MP_REQUIRE_OK(c);
          rc = train_loop(*c.value(), *c.value(), cfg, nullptr);
        } else {
          auto c = test::make_comm(*kv, rank, size, opts);
          if (cfg.wrapped) {
            counting_comm<default_communicator> w{c.get()};
            rc = train_loop(*c, w, cfg, &calls);
            MP_CHECK(calls == 0);  // no_sync micro-batches communicated nothing
            // Every bucket but the last async, the last blocking.
            MP_CHECK(w.async_calls == steps * (cfg.split ? 3 : 2));
          } else {
            rc = train_loop(*c, *c, cfg, nullptr);
          }
        }
        return rc;
      },
      std::chrono::seconds(120));
  INFO("ranks ", cfg.ranks, ": ", r.describe());
  REQUIRE(r.all_ok());
}

std::vector<float> read_floats(const std::string& path) {
  std::vector<float> v;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return v;
  float buf[4096];
  std::size_t k;
  while ((k = std::fread(buf, sizeof(float), 4096, f)) > 0) v.insert(v.end(), buf, buf + k);
  std::fclose(f);
  return v;
}

// Largest |a - b| over the parameters after step s.
double max_diff(const std::vector<float>& a, const std::vector<float>& b, std::size_t per_step, int s) {
  double d = 0;
  for (std::size_t i = 0; i < per_step; ++i) {
    const std::size_t k = static_cast<std::size_t>(s) * per_step + i;
    d = std::max(d, std::fabs(static_cast<double>(a[k]) - static_cast<double>(b[k])));
  }
  return d;
}


// The bound, per parameter element, on |theta_N(s) - theta_1(s)| after step s.
//
// The runs differ only in the order in which the batch sums are added up. Per
// step, a gradient element is g = sum_i t_i over the B = 64 samples, t_i being
// sample i's term already scaled by 1/B: the 1-rank run adds the 64 terms in
// its GEMM's order; the N-rank run adds 64/N per rank, then the N partial sums
// around the ring. All scalings are by powers of two (1/(B/N), the avg over
// N = 2 or 4), hence exact, and the per-sample terms are the same bits in both
// runs (each sample's forward/backward is independent of the batch it is in).
// Any order of adding B terms is within gamma_{B-1} sum_i |t_i| of the exact
// sum (Higham, Accuracy and Stability of Numerical Algorithms, 4.2), with
// gamma_k = k u / (1 - k u), u = 2^-24; two orders differ by at most
// 2 gamma_{B-1} G_t, where G_t = max over elements of sum_i |t_i| (computed
// exactly in the 1-rank run from per-sample gradients). SGD with momentum mu
// passes a gradient difference on to the parameters with total weight at most
// lr (1 + mu + mu^2 + ...) = lr / (1 - mu). The update's own roundings, which
// may go differently once inputs differ, add at most 2u |theta| per step for
// theta and 2u |v| <= 2u G_t / (1 - mu) per step for each momentum operation
// (|v| <= sum_k mu^k |g| <= G_t / (1 - mu)). Summed over the steps so far:
//   bound(s) = sum_{t <= s} [ lr/(1-mu) (2 gamma_{B-1} + 6u/(1-mu)) G_t + 2u Theta_t ]
// with Theta_t = max |theta| after step t. This is first order: it leaves out
// the feedback of a parameter difference through the loss curvature, which
// over 300 steps of this small-lr run stays far inside the worst-case
// rounding terms.
//
// That worst case assumes every rounding goes the same way. Rounding errors
// behave like independent zero-mean variables (Higham and Mary, "A new
// approach to probabilistic rounding error analysis", SISC 2019): a sum of B
// terms is then within lambda sqrt(B) u sum|t_i| with probability at least
// 1 - 2 exp(-lambda^2 / 2), and per-step differences add up like a random walk.
// The tighter, probabilistic bound (lambda = 6) is checked as well:
//   pbound(s) = sqrt( sum_{t <= s} [ lr/(1-mu) (2 lambda sqrt(B) u + 6u/(1-mu)) G_t + 2u Theta_t ]^2 )
struct bounds {
  std::vector<double> worst, probable;
};
bounds trajectory_bound(const std::string& terms_path, const std::vector<float>& traj1, std::size_t per_step) {
  std::vector<double> terms;
  {
    std::FILE* f = std::fopen(terms_path.c_str(), "rb");
    REQUIRE(f);
    double rec[2];
    while (std::fread(rec, sizeof rec, 1, f) == 1) terms.push_back(rec[0]);
    std::fclose(f);
  }
  REQUIRE(terms.size() == static_cast<std::size_t>(steps));
  const double u = std::ldexp(1.0, -24), gamma = (global_batch - 1) * u / (1 - (global_batch - 1) * u);
  const double mu = momentum, lambda = 6;
  const double k = lr / (1 - mu) * (2 * gamma + 6 * u / (1 - mu));
  const double kp = lr / (1 - mu) * (2 * lambda * std::sqrt(static_cast<double>(global_batch)) * u + 6 * u / (1 - mu));
  bounds b;
  double acc = 0, acc2 = 0;
  for (int t = 0; t < steps; ++t) {
    double theta = 0;
    for (std::size_t i = 0; i < per_step; ++i)
      theta = std::max(theta, std::fabs(static_cast<double>(traj1[static_cast<std::size_t>(t) * per_step + i])));
    const double g = terms[static_cast<std::size_t>(t)];
    acc += k * g + 2 * u * theta;
    const double p = kp * g + 2 * u * theta;
    acc2 += p * p;
    b.worst.push_back(acc);
    b.probable.push_back(std::sqrt(acc2));
  }
  return b;
}

// Checks trajectory `other` against the 1-rank one at every step.
void check_within_bound(const char* what, const std::vector<float>& one, const std::vector<float>& other,
                        const bounds& b, std::size_t per_step) {
  REQUIRE(other.size() == one.size());
  double worst = 0, probable = 0, d_end = 0;
  for (int s = 0; s < steps; ++s) {
    const double d = max_diff(one, other, per_step, s);
    worst = std::max(worst, d / b.worst[static_cast<std::size_t>(s)]);
    probable = std::max(probable, d / b.probable[static_cast<std::size_t>(s)]);
    if (s == steps - 1) d_end = d;
  }
  char line[300];
  std::snprintf(line, sizeof line,
                "%s: max |theta - theta_1rank| after step %d = %.3g; bounds there %.3g (worst case), %.3g "
                "(probabilistic); largest fraction of the bounds over all steps: %.3f, %.3f",
                what, steps, d_end, b.worst.back(), b.probable.back(), worst, probable);
  MESSAGE(line);
  CHECK(worst <= 1.0);
  CHECK(probable <= 1.0);
}

}  // namespace

TEST_CASE("data_parallel: 1, 2 and 4 ranks train the same model; ranks stay bitwise identical") {
  test::temp_dir dir;
  const std::string t1 = dir.path + "/r1", t2 = dir.path + "/r2", t4 = dir.path + "/r4", terms = dir.path + "/terms";
  run_cfg one{1, 1, false, false, t1, terms};
  run(one);
  run({2, 1, false, false, t2, ""});
  run({4, 1, false, false, t4, ""});
  const auto a = read_floats(t1), b = read_floats(t2), c = read_floats(t4);
  const std::size_t per_step = a.size() / steps;
  REQUIRE(per_step == train::mlp(layer_sizes, 1, 0).parameter_count());
  const auto bound = trajectory_bound(terms, a, per_step);
  check_within_bound("2 ranks", a, b, bound, per_step);
  check_within_bound("4 ranks", a, c, bound, per_step);
  // The N-rank runs are not trivially equal to the 1-rank one (a different
  // summation really happened), or this test would prove nothing.
  CHECK(max_diff(a, b, per_step, steps - 1) > 0);
}

TEST_CASE("data_parallel: any communicator - tcp-only and a wrapper give the shm run's bits") {
  test::temp_dir dir;
  const std::string shm = dir.path + "/shm", tcp = dir.path + "/tcp", wrapped = dir.path + "/wrapped";
  run({2, 1, false, false, shm, ""});
  run({2, 1, true, false, tcp, ""});
  run({2, 1, false, true, wrapped, ""});
  const auto a = read_floats(shm), b = read_floats(tcp), c = read_floats(wrapped);
  REQUIRE(!a.empty());
  CHECK(a == b);  // same ring, same chunking, same order of additions: same bits
  CHECK(a == c);
}

TEST_CASE("data_parallel: no_sync accumulation over 2 micro-batches communicates once per step") {
  test::temp_dir dir;
  const std::string t1 = dir.path + "/r1", acc = dir.path + "/acc", terms = dir.path + "/terms";
  run({1, 1, false, false, t1, terms});
  run({2, 2, false, true, acc, ""});  // the wrapper asserts: no call during no_sync, 2 async per step
  const auto a = read_floats(t1), b = read_floats(acc);
  const std::size_t per_step = a.size() / steps;
  // Accumulating micro-batches is one more summation order of the same 64 terms.
  check_within_bound("2 ranks x 2 micro-batches", a, b, trajectory_bound(terms, a, per_step), per_step);
}

TEST_CASE("data_parallel: split buckets (fc1.weight in row blocks) and overwriting backward, 2 and 4 ranks") {
  test::temp_dir dir;
  const std::string t1 = dir.path + "/r1", s2 = dir.path + "/s2", s4 = dir.path + "/s4", acc = dir.path + "/acc",
                    terms = dir.path + "/terms";
  run({1, 1, false, false, t1, terms});
  run_cfg two{2, 1, false, true, s2, ""};  // through the wrapper: 3 async calls per step
  two.split = true;
  run(two);
  run_cfg four{4, 1, false, false, s4, ""};
  four.split = true;
  run(four);
  run_cfg micro{2, 2, false, true, acc, ""};  // no_sync: the first micro-batch overwrites, the second adds
  micro.split = true;
  run(micro);
  const auto a = read_floats(t1);
  const std::size_t per_step = a.size() / steps;
  const auto bound = trajectory_bound(terms, a, per_step);
  // Blocks change only how the GEMM groups rows, not which 64 terms each
  // gradient element adds up: the same bound holds.
  check_within_bound("2 ranks, split", a, read_floats(s2), bound, per_step);
  check_within_bound("4 ranks, split", a, read_floats(s4), bound, per_step);
  check_within_bound("2 ranks x 2 micro-batches, split", a, read_floats(acc), bound, per_step);
}
