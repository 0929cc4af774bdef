// Single-process tests of cclite::train's parts: the sampler's sharding (as
// torch.utils.data.DistributedSampler), checkpoints (atomic, refused when
// truncated or corrupt at any byte), bucket planning, GEMM against a naive
// reference, the optimisers against PyTorch's update rules, and the MLP's
// gradients against finite differences.
#include <cclite/train/train.hpp>

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/mp.hpp"

using namespace cclite;
namespace train = cclite::train;

// ---- sampler ------------------------------------------------------------------------------

TEST_CASE("sampler: shards are disjoint, cover the epoch, pad or drop like PyTorch") {
  for (std::size_t n : {1u, 7u, 10u, 64u, 1000u, 1001u}) {
    for (int world = 1; world <= 5; ++world) {
      for (bool drop_last : {false, true}) {
        if (drop_last && n < static_cast<std::size_t>(world)) continue;
        // PyTorch: num_samples = ceil((n - N) / N) with drop_last and n % N != 0, else ceil(n / N).
        const std::size_t w = static_cast<std::size_t>(world);
        const std::size_t want = drop_last && n % w ? (n - w + w - 1) / w : (n + w - 1) / w;
        std::vector<std::size_t> all;
        std::vector<std::size_t> order;
        for (int r = 0; r < world; ++r) {
          train::distributed_sampler s(n, r, world, 5, true, drop_last);
          s.set_epoch(3);
          CHECK(s.num_samples() == want);
          REQUIRE(s.indices().size() == want);
          if (r == 0) order = s.global_order();
          CHECK(s.global_order() == order);  // the same permutation on every rank
          // Strided: rank r takes positions r, r + N, ...
          for (std::size_t i = 0; i < want; ++i) CHECK(s.indices()[i] == order[i * w + static_cast<std::size_t>(r)]);
          all.insert(all.end(), s.indices().begin(), s.indices().end());
        }
        std::set<std::size_t> distinct(all.begin(), all.end());
        INFO("n ", n, " world ", world, " drop_last ", drop_last);
        if (drop_last) {
          CHECK(distinct.size() == all.size());  // disjoint
          CHECK(all.size() == n / w * w);
        } else {
          CHECK(distinct.size() == n);  // everything covered, padding repeats the start
          CHECK(all.size() == want * w);
          std::vector<std::size_t> perm(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
          for (std::size_t i = n; i < order.size(); ++i) CHECK(order[i] == perm[(i - n) % n]);
        }
        for (std::size_t v : all) CHECK(v < n);
      }
    }
  }
}

TEST_CASE("sampler: seeded, a new permutation per epoch, global steps independent of the rank count") {
  train::distributed_sampler a(1000, 0, 1, 42), b(1000, 0, 1, 42), c(1000, 0, 1, 43);
  CHECK(a.indices() == b.indices());
  CHECK(a.indices() != c.indices());
  const auto e0 = a.indices();
  a.set_epoch(1);
  CHECK(a.indices() != e0);
  std::vector<std::size_t> sorted = a.indices();
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) CHECK(sorted[i] == i);  // a permutation
  // Global batch 40 on 1 rank vs 10 per rank on 4 ranks: same samples per step.
  std::vector<train::distributed_sampler> four;
  for (int r = 0; r < 4; ++r) four.emplace_back(1000, r, 4, 42), four.back().set_epoch(1);
  for (std::size_t step = 0; step < 25; ++step) {
    std::multiset<std::size_t> one(a.indices().begin() + static_cast<std::ptrdiff_t>(step * 40),
                                   a.indices().begin() + static_cast<std::ptrdiff_t>(step * 40 + 40));
    std::multiset<std::size_t> many;
    for (auto& s : four) many.insert(s.indices().begin() + static_cast<std::ptrdiff_t>(step * 10),
                                     s.indices().begin() + static_cast<std::ptrdiff_t>(step * 10 + 10));
    CHECK(one == many);
  }
}

TEST_CASE("sampler: state round-trips through a checkpoint, also onto another world size") {
  train::distributed_sampler s(1000, 1, 2, 9);
  s.set_epoch(4);
  s.set_position(120);
  train::checkpoint ck;
  s.save_state(ck);
  train::distributed_sampler t(1000, 1, 2, 0);
  REQUIRE(t.load_state(ck).ok());
  CHECK(t.epoch() == 4);
  CHECK(t.position() == 120);
  CHECK(t.indices() == s.indices());
  train::distributed_sampler u(1000, 0, 4, 0);  // resumed on 4 ranks: same global position
  REQUIRE(u.load_state(ck).ok());
  CHECK(u.position() == 60);
  train::distributed_sampler other(999, 0, 2, 0);
  auto st = other.load_state(ck);
  CHECK(st.code() == errc::invalid_argument);
  CHECK(st.message().find("999") != std::string::npos);
}

// ---- checkpoint ----------------------------------------------------------------------------

namespace {
std::vector<char> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void spit(const std::string& p, const std::vector<char>& v) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(v.data(), static_cast<std::streamsize>(v.size()));
}
}  // namespace

TEST_CASE("checkpoint: round trip, atomic replacement, nothing left behind") {
  test::temp_dir dir;
  const std::string path = dir.path + "/ck.bin";
  std::vector<float> w(1000);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.25f - 3.0f;
  train::checkpoint ck;
  ck.put_u64("epoch", 7);
  ck.put_f64("loss", 0.125);
  ck.put_floats("w", w.data(), w.size());
  REQUIRE(ck.save(path).ok());
  auto in = train::checkpoint::load(path);
  REQUIRE(in.ok());
  CHECK(in.value().checksum() == ck.checksum());
  CHECK(in.value().get_u64("epoch").value() == 7);
  CHECK(in.value().get_f64("loss").value() == 0.125);
  std::vector<float> back(1000);
  REQUIRE(in.value().get_floats("w", back.data(), back.size()).ok());
  CHECK(back == w);
  CHECK(in.value().get_floats("w", back.data(), 999).code() == errc::invalid_argument);  // another model
  CHECK(in.value().get_u64("nope").error().code() == errc::invalid_argument);

  // In memory: serialize() is the file's bytes, parse() reads them back.
  const std::vector<char> file = slurp(path);
  const std::vector<std::uint8_t> bytes = in.value().serialize();
  CHECK(std::vector<char>(bytes.begin(), bytes.end()) == file);
  auto parsed = train::checkpoint::parse(bytes.data(), bytes.size(), "from memory");
  REQUIRE(parsed.ok());
  CHECK(parsed.value().checksum() == ck.checksum());
  CHECK(parsed.value().get_u64("epoch").value() == 7);
  auto cut = train::checkpoint::parse(bytes.data(), bytes.size() - 1, "from memory");
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.error().message().find("checkpoint 'from memory' refused: truncated") == 0);

  ck.put_u64("epoch", 8);  // replaces the section
  REQUIRE(ck.save(path).ok());
  CHECK(train::checkpoint::load(path).value().get_u64("epoch").value() == 8);
  // Only the checkpoint itself is left (the temporary was renamed over it).
  CHECK(std::system(("test $(ls -A '" + dir.path + "' | wc -l) -eq 1").c_str()) == 0);
  // A save that cannot complete leaves the old file intact.
  CHECK_FALSE(ck.save(dir.path + "/no/such/dir/ck.bin").ok());
  CHECK(train::checkpoint::load(path).ok());
}

TEST_CASE("checkpoint: every truncation and every flipped byte is refused, never loaded") {
  test::temp_dir dir;
  const std::string path = dir.path + "/ck.bin", bad = dir.path + "/bad.bin";
  train::checkpoint ck;
  ck.put_u64("epochs_done", 3);
  std::vector<float> w(50, 1.5f);
  ck.put_floats("param.fc1.weight", w.data(), w.size());
  REQUIRE(ck.save(path).ok());
  const std::vector<char> good = slurp(path);
  REQUIRE(good.size() > train::checkpoint::header_bytes);
  for (std::size_t len = 0; len < good.size(); ++len) {
    spit(bad, std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)));
    auto r = train::checkpoint::load(bad);
    INFO("truncated to ", len, " bytes");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == errc::protocol_error);
    if (len >= 8) CHECK(r.error().message().find("truncated") != std::string::npos);
    CHECK(r.error().message().find(bad) != std::string::npos);  // names the file
  }
  for (std::size_t pos = 0; pos < good.size(); ++pos) {
    std::vector<char> v = good;
    v[pos] = static_cast<char>(v[pos] ^ 0x10);
    spit(bad, v);
    auto r = train::checkpoint::load(bad);
    INFO("byte ", pos, " flipped");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == errc::protocol_error);
  }
  std::vector<char> longer = good;
  longer.push_back(0);
  spit(bad, longer);
  CHECK(train::checkpoint::load(bad).error().message().find("unexpected bytes") != std::string::npos);
  spit(bad, std::vector<char>(100, 'x'));
  CHECK(train::checkpoint::load(bad).error().message().find("not a cclite checkpoint") != std::string::npos);
  CHECK(train::checkpoint::load(dir.path + "/missing").error().code() == errc::system_error);
}

TEST_CASE("checkpoint: parameters and optimiser state; a different model is refused untouched") {
  train::mlp net({6, 5, 3}, 4, 1), other({6, 4, 3}, 4, 2);
  train::adamw opt(net.parameters(), {});
  for (train::parameter* p : net.parameters()) std::fill(p->grad(), p->grad() + p->size(), 0.5f);
  opt.step();
  train::checkpoint ck;
  train::save_parameters(ck, net.parameters());
  opt.save_state(ck);
  train::mlp copy({6, 5, 3}, 4, 99);
  REQUIRE(train::load_parameters(ck, copy.parameters()).ok());
  for (std::size_t k = 0; k < net.parameters().size(); ++k)
    CHECK(std::equal(copy.parameters()[k]->values().begin(), copy.parameters()[k]->values().end(),
                     net.parameters()[k]->values().begin()));
  train::adamw opt2(copy.parameters(), {});
  REQUIRE(opt2.load_state(ck).ok());
  CHECK(opt2.steps() == 1);
  train::sgd wrong(copy.parameters(), {});
  CHECK_FALSE(wrong.load_state(ck).ok());
  const auto now = other.parameters()[0]->values();
  const std::vector<float> before(now.begin(), now.end());
  auto st = train::load_parameters(ck, other.parameters());
  CHECK(st.code() == errc::invalid_argument);
  CHECK(st.message().find("fc1.weight") != std::string::npos);
  CHECK(std::equal(before.begin(), before.end(), other.parameters()[0]->value()));
}

// ---- buckets ----------------------------------------------------------------------------------

TEST_CASE("bucket_plan: reverse order, contiguous, caps respected, parameters never split") {
  // Registration order: fc1.w 784x256, fc1.b, fc2.w 256x128, fc2.b, fc3.w 128x10, fc3.b.
  const std::vector<std::size_t> sizes = {200704, 256, 32768, 128, 1280, 10};
  auto one = train::bucket_plan::make(sizes, 4, 1 << 20, 25 << 20);  // DDP defaults: all fits in 1 MiB
  CHECK(one.buckets.size() == 1);
  auto p = train::bucket_plan::make(sizes, 4, 256 << 10, 256 << 10);
  REQUIRE(p.buckets.size() == 2);
  CHECK(p.buckets[0].params == 5);  // fc3.b fc3.w fc2.b fc2.w fc1.b: fits in 256 KiB
  CHECK(p.buckets[1].params == 1);  // fc1.w (784 KiB, alone over the cap)
  // With layer groups fc1.b stays with fc1.w: both are final only at the end of backward.
  auto g = train::bucket_plan::make(sizes, 4, 256 << 10, 256 << 10, {1, 1, 2, 2, 3, 3});
  REQUIRE(g.buckets.size() == 2);
  CHECK(g.buckets[0].params == 4);
  CHECK(g.buckets[1].params == 2);
  CHECK(g.param_bucket[1] == 1);
  CHECK(p.param_offset[5] == 0);    // the last registered comes first
  CHECK(p.param_offset[4] == 10);
  CHECK(p.param_bucket[0] == 1);
  std::size_t off = 0;
  for (const auto& b : p.buckets) {
    CHECK(b.offset == off);
    off += b.count;
  }
  CHECK(off == p.total);
  auto tiny = train::bucket_plan::make(sizes, 4, 1, 1);  // every parameter alone
  CHECK(tiny.buckets.size() == sizes.size());
  CHECK(train::bucket_plan::make({}, 4, 1, 1).buckets.empty());
}

TEST_CASE("bucket_plan: split_bytes cuts a large parameter into equal pieces, one bucket each") {
  const std::vector<std::size_t> sizes = {200704, 256, 32768, 128, 1280, 10};
  const std::vector<std::size_t> groups = {1, 1, 2, 2, 3, 3};
  // fc1.w (784 KiB) in 4 pieces of 196 KiB = 64 rows of 784; the first piece joins fc1.b.
  auto p = train::bucket_plan::make(sizes, 4, 256 << 10, 25 << 20, groups, 196 << 10);
  REQUIRE(p.buckets.size() == 5);
  CHECK(p.buckets[0].params == 4);
  CHECK(p.buckets[1].count == 256 + 50176);
  for (std::size_t b = 2; b < 5; ++b) CHECK(p.buckets[b].count == 50176);
  CHECK(p.param_bucket[0] == 1);  // a split parameter names its first bucket
  CHECK(p.param_offset[0] == p.buckets[1].offset + 256);
  std::size_t off = 0;
  for (const auto& b : p.buckets) {
    CHECK(b.offset == off);
    off += b.count;
  }
  CHECK(off == p.total);
  CHECK(p.total == 200704 + 256 + 32768 + 128 + 1280 + 10);
  // Uneven: 10 elements in ceil(40 / 12) = 4 pieces of 2 or 3; small parameters unaffected.
  auto u = train::bucket_plan::make({10, 2}, 4, 0, 0, {}, 12);
  REQUIRE(u.buckets.size() == 4);
  CHECK(u.buckets[0].count == 2 + 2);
  CHECK(u.buckets[1].count + u.buckets[2].count + u.buckets[3].count == 8);
  // No split requested, or nothing above it: the plan without split_bytes.
  auto n = train::bucket_plan::make(sizes, 4, 256 << 10, 25 << 20, groups, 1 << 20);
  CHECK(n.buckets.size() == 2);
}

// ---- numerics ------------------------------------------------------------------------------------

TEST_CASE("gemm: every transpose combination against a naive reference") {
  train::rng g(1);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int m : {1, 3, 17})
        for (int n : {1, 5, 33})
          for (int k : {0, 1, 9, 70}) {
            const int lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
            std::vector<float> a(static_cast<std::size_t>((ta ? k : m) * lda + 1)), b(static_cast<std::size_t>((tb ? n : k) * ldb + 1)),
                c(static_cast<std::size_t>(m * ldc));
            for (float& v : a) v = g.uniform(-1, 1);
            for (float& v : b) v = g.uniform(-1, 1);
            for (float& v : c) v = g.uniform(-1, 1);
            std::vector<float> c0 = c, c1 = c;
            train::gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c.data(), ldc);
            train::detail::gemm_portable(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c1.data(), ldc);
            for (int i = 0; i < m; ++i)
              for (int j = 0; j < n; ++j) {
                double ref = 2.0 * c0[static_cast<std::size_t>(i * ldc + j)];
                for (int p = 0; p < k; ++p)
                  ref += 0.5 * (ta ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)]) *
                         (tb ? b[static_cast<std::size_t>(j * ldb + p)] : b[static_cast<std::size_t>(p * ldb + j)]);
                const double tol = 1e-5 * (k + 2);
                CHECK(std::fabs(c[static_cast<std::size_t>(i * ldc + j)] - ref) <= tol);
                CHECK(std::fabs(c1[static_cast<std::size_t>(i * ldc + j)] - ref) <= tol);
              }
          }
}

TEST_CASE("optimisers: PyTorch's update rules; AdamW's vector path equals its scalar path bit for bit") {
  train::parameter p("p", 3);
  const float init[] = {1.0f, -2.0f, 0.5f};
  std::copy(init, init + 3, p.value());
  train::sgd s({&p}, {0.1f, 0.9f, 0.01f, false});
  for (int step = 0; step < 2; ++step) {
    std::fill(p.grad(), p.grad() + 3, 0.25f);
    s.step();
  }
  // By hand: d = g + wd w; buf1 = d1; w1 = w0 - lr d1; d2 = g + wd w1; buf2 = 0.9 d1 + d2; w2 = w1 - lr buf2.
  const float w0 = 1.0f, d1 = 0.25f + 0.01f * w0, w1 = w0 - 0.1f * d1, d2 = 0.25f + 0.01f * w1;
  CHECK(p.values()[0] == w1 - 0.1f * (0.9f * d1 + d2));

  train::parameter q("q", 1);
  q.values()[0] = 1.0f;
  train::adamw a({&q}, {0.01f, 0.9f, 0.999f, 1e-8f, 0.1f});
  q.grad()[0] = 0.5f;
  a.step();
  // First AdamW step: w (1 - lr wd) - lr * sign(g) (m_hat / sqrt(v_hat) = 1 up to eps).
  CHECK(q.values()[0] == doctest::Approx(1.0 * (1 - 0.001) - 0.01).epsilon(1e-6));

  const std::size_t n = 103;  // not a multiple of the vector width
  std::vector<float> w(n), gr(n), m(n), v(n);
  train::rng g(5);
  for (std::size_t i = 0; i < n; ++i) w[i] = g.uniform(-1, 1), gr[i] = g.uniform(-1, 1), m[i] = g.uniform(-0.1f, 0.1f), v[i] = g.uniform(0, 0.01f);
  std::vector<float> w2 = w, m2 = m, v2 = v;
  train::detail::adamw_update(w.data(), gr.data(), m.data(), v.data(), n, 0.999f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.3f);
  for (std::size_t i = 0; i < n; ++i)  // one element at a time: the scalar tail
    train::detail::adamw_update(&w2[i], &gr[i], &m2[i], &v2[i], 1, 0.999f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.3f);
  CHECK(w == w2);
  CHECK(m == m2);
  CHECK(v == v2);
}

TEST_CASE("mlp: backward matches finite differences of the loss") {
  const int batch = 3;
  train::mlp net({5, 4, 3}, batch, 11);
  std::vector<float> x(batch * 5);
  train::rng g(2);
  for (float& v : x) v = g.uniform(-1, 1);
  const std::uint8_t y[batch] = {0, 2, 1};
  auto loss = [&] {
    auto r = train::softmax_cross_entropy(net.forward(x.data(), batch), y, batch, 3, nullptr, 0.0f);
    return r.loss_sum / batch;
  };
  train::zero_grads(net.parameters());
  train::softmax_cross_entropy(net.forward(x.data(), batch), y, batch, 3, net.output_grad(), 1.0f / batch);
  std::vector<const train::parameter*> order;
  net.backward(batch, [&](train::parameter& p) { order.push_back(&p); });
  auto params = net.parameters();
  REQUIRE(order.size() == params.size());
  CHECK(order.front() == params.back());  // reverse registration order: fc2.bias first
  int checked = 0, kinks = 0;
  for (train::parameter* p : params) {
    for (std::size_t i = 0; i < p->size(); ++i) {
      const float keep = p->values()[i];
      const float h = 1e-3f;
      const double mid = loss();
      p->values()[i] = keep + h;
      const double up = loss();
      p->values()[i] = keep - h;
      const double down = loss();
      p->values()[i] = keep;
      // A ReLU switching inside [-h, h] makes the two one-sided slopes differ:
      // no derivative to compare with there.
      if (std::fabs((up - mid) - (mid - down)) > 1e-5) {
        ++kinks;
        continue;
      }
      INFO(p->name(), "[", i, "]");
      CHECK(p->grad()[i] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-2).scale(1e-3));
      ++checked;
    }
  }
  CHECK(kinks <= 6);
  CHECK(checked >= 30);
}

TEST_CASE("mlp: overwriting backward equals zero + accumulate; first-layer row blocks report every element once") {
  const int batch = 5;
  train::mlp a({12, 8, 6, 3}, batch, 4), b({12, 8, 6, 3}, batch, 4);
  std::vector<float> x(batch * 12);
  train::rng g(9);
  for (float& v : x) v = g.uniform(-1, 1);
  const std::uint8_t y[batch] = {0, 2, 1, 1, 0};
  auto pass = [&](train::mlp& net, auto&& hook, bool accumulate) {
    train::softmax_cross_entropy(net.forward(x.data(), batch), y, batch, 3, net.output_grad(), 1.0f / batch);
    net.backward(batch, hook, accumulate);
  };
  auto pa = a.parameters(), pb = b.parameters();
  for (train::parameter* p : pa) std::fill(p->grad(), p->grad() + p->size(), 123.0f);  // stale
  train::zero_grads(pb);
  pass(a, [](train::parameter&) {}, false);
  pass(b, [](train::parameter&) {}, true);
  for (std::size_t k = 0; k < pa.size(); ++k)
    CHECK(std::equal(pa[k]->grad(), pa[k]->grad() + pa[k]->size(), pb[k]->grad()));  // same bits
  // A second pass accumulates: twice the gradient, up to rounding (a BLAS may
  // add the old C into its running sum rather than at the end).
  pass(a, [](train::parameter&) {}, true);
  for (std::size_t k = 0; k < pa.size(); ++k)
    for (std::size_t i = 0; i < pa[k]->size(); ++i)
      CHECK(pa[k]->grad()[i] == doctest::Approx(2 * pb[k]->grad()[i]).epsilon(1e-5).scale(1e-6));

  // Blocks: 3 row blocks of fc1.weight (8 rows: 2 + 3 + 3), reported in order, then the whole.
  b.set_grad_blocks(3);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  std::vector<const train::parameter*> whole;
  pass(b, [&](train::parameter& p, auto... r) {
    if constexpr (sizeof...(r) == 2) {
      CHECK(&p == pb[0]);
      ranges.push_back({r...});
    } else {
      whole.push_back(&p);
    }
  }, false);
  REQUIRE(ranges.size() == 3);
  CHECK(ranges[0] == std::make_pair(std::size_t{0}, std::size_t{2 * 12}));
  CHECK(ranges[1] == std::make_pair(std::size_t{2 * 12}, std::size_t{5 * 12}));
  CHECK(ranges[2] == std::make_pair(std::size_t{5 * 12}, std::size_t{8 * 12}));
  REQUIRE(whole.size() == pb.size());
  CHECK(whole.back() == pb[0]);  // the whole weight last, after its blocks
  // Same gradient as in one piece, up to the BLAS's blocking (here: the same bits
  // with the portable loop; a BLAS may round a block differently).
  for (std::size_t k = 0; k < pa.size(); ++k)
    for (std::size_t i = 0; i < pa[k]->size(); ++i)
      CHECK(pb[k]->grad()[i] == doctest::Approx(pa[k]->grad()[i] / 2).epsilon(1e-5).scale(1e-6));
}

// What sharded_optimizer builds on: values and optimiser state in memory the
// caller owns, and a step taken in parts giving the bits of step().
TEST_CASE("parameters and optimiser state move to the caller's memory and back; a step in parts equals step()") {
  train::parameter p("p", 5);
  for (std::size_t i = 0; i < 5; ++i) p.value()[i] = static_cast<float>(i) - 1.5f;
  std::vector<float> ext(5, 0.0f);
  p.bind_value(ext.data());
  CHECK(p.value() == ext.data());
  CHECK_FALSE(p.owns_value());
  CHECK(ext[4] == 2.5f);
  ext[2] = 7.0f;
  CHECK(p.values()[2] == 7.0f);
  p.use_own_value();
  CHECK(p.owns_value());
  CHECK(p.value() != ext.data());
  CHECK(p.values()[2] == 7.0f);

  train::sgd s({&p}, {0.1f, 0.9f});
  std::fill(p.grad(), p.grad() + 5, 0.5f);
  s.step();
  std::vector<float> st(5, 0.0f);
  s.bind_state(0, 0, st.data());
  CHECK(st[0] == 0.5f);  // the momentum after one step moved along
  s.step();
  CHECK(st[0] == 0.9f * 0.5f + 0.5f);
  train::sgd shared = s;  // a copy shares bound state...
  CHECK(shared.state(0, 0) == st.data());
  s.use_own_state();
  CHECK(s.state(0, 0) != st.data());
  CHECK(s.state(0, 0)[0] == st[0]);
  train::sgd own = s;  // ...and owns copies of owned state
  CHECK(own.state(0, 0) != s.state(0, 0));
  CHECK(own.state(0, 0)[3] == s.state(0, 0)[3]);

  // Parts: [0, 2) and [2, 5), then end_step(), against step(), SGD and AdamW.
  auto same = [](const train::parameter& a, const train::parameter& b) {
    return std::memcmp(a.value(), b.value(), a.bytes()) == 0;
  };
  train::parameter a("a", 5), b("b", 5);
  for (std::size_t i = 0; i < 5; ++i) a.value()[i] = b.value()[i] = 0.3f * static_cast<float>(i) - 0.7f;
  train::sgd sa({&a}, {0.05f, 0.9f, 1e-2f, true}), sb({&b}, {0.05f, 0.9f, 1e-2f, true});
  train::adamw aa({&a}, {1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f}), ab({&b}, {1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f});
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < 5; ++i) a.grad()[i] = b.grad()[i] = 0.1f * static_cast<float>(i + step) - 0.2f;
    sa.step();
    sb.update(0, 0, 2, b.grad());
    sb.update(0, 2, 5, b.grad() + 2);
    sb.end_step();
    aa.step();
    ab.update(0, 3, 5, b.grad() + 3);
    ab.update(0, 0, 3, b.grad());
    ab.end_step();
    CHECK(same(a, b));
    CHECK(std::memcmp(sa.state(0, 0), sb.state(0, 0), 5 * sizeof(float)) == 0);
    CHECK(std::memcmp(aa.state(0, 1), ab.state(0, 1), 5 * sizeof(float)) == 0);
  }
  CHECK(sb.steps() == 3);
  CHECK(ab.steps() == 3);
}
