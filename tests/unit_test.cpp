// Single-process unit tests: dtypes, reduction kernels, env parsing, schedules,
// topology, the async work queue.
#include <cclite/algorithm/recursive_doubling.hpp>
#include <cclite/algorithm/schedule.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/collective/select.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>
#include <cclite/core/stream_copy.hpp>
#include <cclite/topology/topology.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <ios>
#include <cstring>
#include <vector>

using namespace cclite;

TEST_CASE("float16: every bit pattern survives half -> float -> half") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    half h{static_cast<std::uint16_t>(b)};
    float f = to_float(h);
    half back = to_half(f);
    if (std::isnan(f)) {
      CHECK(std::isnan(to_float(back)));
    } else if (back.bits != h.bits) {
      FAIL("half 0x" << std::hex << b << " -> " << f << " -> 0x" << back.bits);
    }
  }
  CHECK(to_float(to_half(1.0f)) == 1.0f);
  CHECK(to_float(to_half(65504.0f)) == 65504.0f);
  CHECK(std::isinf(to_float(to_half(1e6f))));
  CHECK(to_half(1.0f + 1.0f / 4096).bits == to_half(1.0f).bits);  // rounds to nearest even
  CHECK(to_float(half{0x0001}) == std::ldexp(1.0f, -24));         // smallest subnormal
}

TEST_CASE("bfloat16: conversions round to nearest even") {
  CHECK(to_float(to_bfloat16(1.0f)) == 1.0f);
  CHECK(to_float(to_bfloat16(-3.5f)) == -3.5f);
  CHECK(to_bfloat16(1.0f + 1.0f / 256).bits == to_bfloat16(1.0f).bits);
  CHECK(std::isnan(to_float(to_bfloat16(std::nanf("")))));
  for (std::uint32_t b = 0; b < 0x10000; b += 7) {
    bfloat16 x{static_cast<std::uint16_t>(b)};
    float f = to_float(x);
    if (!std::isnan(f)) CHECK(to_bfloat16(f).bits == x.bits);
  }
}

TEST_CASE("reduction kernels: every dtype and op against scalar arithmetic") {
  auto check_type = [](auto tag) {
    using T = decltype(tag);
    const std::size_t n = 1003;  // odd: exercises the vector loop's tail
    std::vector<T> a(n), b(n), out(n), out2(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(static_cast<int>(i % 11) - 5);
      b[i] = static_cast<T>(static_cast<int>(i % 7) - 3);
    }
    for (int o = 0; o < reduce_op_count; ++o) {
      auto op = static_cast<reduce_op>(o);
      reduction r = reduction_for(dtype_of_v<T>, op);
      if (!applies_to(op, dtype_of_v<T>)) {  // a bitwise op on a floating dtype
        REQUIRE_FALSE(static_cast<bool>(r.inplace));
        continue;
      }
      REQUIRE(static_cast<bool>(r.inplace));
      r.copy2(out.data(), out2.data(), a.data(), b.data(), n);
      std::vector<T> inpl = a;
      r.inplace(inpl.data(), b.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        T x = a[i], y = b[i], want;
        switch (op) {
          case reduce_op::sum: case reduce_op::avg: want = static_cast<T>(x + y); break;
          case reduce_op::prod: want = static_cast<T>(x * y); break;
          case reduce_op::min: want = y < x ? y : x; break;
          case reduce_op::band: case reduce_op::bor: case reduce_op::bxor:
            if constexpr (std::is_integral_v<T>)
              want = static_cast<T>(op == reduce_op::band ? (x & y) : op == reduce_op::bor ? (x | y) : (x ^ y));
            break;
          default: want = x < y ? y : x; break;
        }
        REQUIRE(out[i] == want);
        REQUIRE(out2[i] == want);
        REQUIRE(inpl[i] == want);
      }
    }
  };
  check_type(std::int8_t{});
  check_type(std::uint8_t{});
  check_type(std::int32_t{});
  check_type(std::uint32_t{});
  check_type(std::int64_t{});
  check_type(std::uint64_t{});
  check_type(float{});
  check_type(double{});
}

TEST_CASE("reduction kernels: float16 and bfloat16 reduce in float") {
  std::vector<half> a(5), b(5);
  std::vector<bfloat16> c(5), d(5);
  for (int i = 0; i < 5; ++i) {
    a[i] = to_half(0.5f * i);
    b[i] = to_half(-0.25f * i);
    c[i] = to_bfloat16(3.0f * i);
    d[i] = to_bfloat16(2.0f);
  }
  reduction_for(dtype::float16, reduce_op::sum).inplace(a.data(), b.data(), 5);
  reduction_for(dtype::bfloat16, reduce_op::prod).inplace(c.data(), d.data(), 5);
  for (int i = 0; i < 5; ++i) {
    CHECK(to_float(a[i]) == 0.25f * i);
    CHECK(to_float(c[i]) == 6.0f * i);
  }
  reduction_for(dtype::float16, reduce_op::avg).divide(a.data(), 5, 2);
  CHECK(to_float(a[4]) == 0.5f);
}

// reduce_x86.hpp's kernels (picked by reduction_for on CPUs with AVX2 and
// F16C) must give the portable kernels' bits for every element: whatever the
// length (8-element blocks and the tail), alignment and op, and for the
// values where roundings differ (ties, subnormals, overflow to infinity,
// infinities, signed zeros, NaN: any NaN, its payload aside).
TEST_CASE("reduction kernels: the x86 float16/bfloat16 kernels give the portable kernels' bits") {
#if CCLITE_HAS_X86_KERNELS
  if (!detail::x86::cpu_has_avx2_f16c()) {
    MESSAGE("this CPU lacks AVX2 or F16C: reduction_for keeps the portable kernels; nothing to compare");
    return;
  }
  // Bit patterns: every 16-bit pattern appears as an operand somewhere.
  auto check = [](auto tag, dtype t) {
    using T = decltype(tag);
    const bool is_half = std::is_same_v<T, half>;
    const std::size_t n = 65536 + 37;
    std::vector<T> a(n + 1), b(n + 1);
    std::uint64_t x = 88172645463325252ull;
    for (std::size_t i = 0; i < n + 1; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      a[i].bits = static_cast<std::uint16_t>(i);                // every pattern
      b[i].bits = static_cast<std::uint16_t>(i % 3 == 0 ? i ^ 0x0001u : x);  // ties: neighbours, and noise
    }
    // Signed zeros, infinities and NaN against each other, at fixed places.
    const std::uint16_t special[] = {0x0000, 0x8000, is_half ? std::uint16_t{0x7c00} : std::uint16_t{0x7f80},
                                     is_half ? std::uint16_t{0xfc00} : std::uint16_t{0xff80},
                                     is_half ? std::uint16_t{0x7e00} : std::uint16_t{0x7fc0}, 0x3c00};
    std::size_t at = 1000;
    for (std::uint16_t p : special)
      for (std::uint16_t q : special) a[at].bits = p, b[at].bits = q, ++at;
    auto is_nan = [&](T v) {
      return is_half ? (v.bits & 0x7fffu) > 0x7c00u : (v.bits & 0x7fffu) > 0x7f80u;
    };
    auto same = [&](const std::vector<T>& p, const std::vector<T>& q, std::size_t off, std::size_t len) {
      for (std::size_t i = off; i < off + len; ++i)
        if (p[i].bits != q[i].bits && !(is_nan(p[i]) && is_nan(q[i]))) return false;
      return true;
    };
    for (int o = 0; o < reduce_op_count; ++o) {
      const auto op = static_cast<reduce_op>(o);
      if (!applies_to(op, t)) continue;  // bitwise: integer dtypes only
      const reduction fast = reduction_for(t, op);
      const bool picked = fast.inplace == (op == reduce_op::prod  ? &detail::x86::reduce_inplace<T, reduce_op::prod>
                                           : op == reduce_op::min ? &detail::x86::reduce_inplace<T, reduce_op::min>
                                           : op == reduce_op::max ? &detail::x86::reduce_inplace<T, reduce_op::max>
                                                                  : &detail::x86::reduce_inplace<T, reduce_op::sum>);
      CHECK(picked);  // reduction_for handed out the x86 kernel
      // The portable kernels themselves, by their template names.
      auto ref_inplace = [&](T* io, const T* in, std::size_t len) {
        switch (op) {
          case reduce_op::prod: detail::reduce_inplace<T, reduce_op::prod>(io, in, len); break;
          case reduce_op::min: detail::reduce_inplace<T, reduce_op::min>(io, in, len); break;
          case reduce_op::max: detail::reduce_inplace<T, reduce_op::max>(io, in, len); break;
          default: detail::reduce_inplace<T, reduce_op::sum>(io, in, len); break;
        }
      };
      for (std::size_t off : {std::size_t{0}, std::size_t{1}}) {  // 2-byte misalignment of the 16-byte blocks
        for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9},
                                std::size_t{23}, n - 1}) {
          std::vector<T> want = a, got = a, out1(n + 1), out2(n + 1), cp(n + 1);
          ref_inplace(want.data() + off, b.data() + off, len);
          fast.inplace(got.data() + off, b.data() + off, len);
          INFO("dtype ", to_string(t), " op ", to_string(op), " offset ", off, " length ", len);
          CHECK(same(want, got, off, len));
          fast.copy(cp.data() + off, a.data() + off, b.data() + off, len);
          CHECK(same(want, cp, off, len));
          fast.copy2(out1.data() + off, out2.data() + off, a.data() + off, b.data() + off, len);
          CHECK(same(want, out1, off, len));
          CHECK(same(want, out2, off, len));
          if (op == reduce_op::avg) {
            for (int d : {2, 3, 7}) {
              std::vector<T> dw = want, dg = want;
              detail::divide<T>(dw.data() + off, len, d);
              fast.divide(dg.data() + off, len, d);
              CHECK(same(dw, dg, off, len));
            }
          }
        }
      }
    }
  };
  check(half{}, dtype::float16);
  check(bfloat16{}, dtype::bfloat16);

  // narrow / widen (gradient packing): float -> T of x / d, and back.
  auto convert = [](auto tag) {
    using T = decltype(tag);
    const std::size_t n = 100003;
    std::vector<float> in(n), back(n), want_back(n);
    std::uint32_t x = 2463534242u;
    for (std::size_t i = 0; i < n; ++i) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      std::uint32_t u = i < 64 ? (i << 26) : x;  // all exponents' extremes first, then any bits
      std::memcpy(&in[i], &u, 4);
    }
    for (float d : {1.0f, 2.0f, 3.0f}) {
      std::vector<T> got(n), want(n);
      detail::x86::narrow(in.data() + 1, got.data() + 1, n - 1, d);
      for (std::size_t i = 1; i < n; ++i) want[i] = detail::compute<T>::store(in[i] / d);
      std::size_t bad = 0;
      for (std::size_t i = 1; i < n; ++i) {
        const bool nan = std::isnan(detail::compute<T>::load(want[i])) && std::isnan(detail::compute<T>::load(got[i]));
        bad += want[i].bits != got[i].bits && !nan;
      }
      CHECK(bad == 0);
      detail::x86::widen(got.data() + 1, back.data() + 1, n - 1);
      for (std::size_t i = 1; i < n; ++i) want_back[i] = detail::compute<T>::load(got[i]);
      CHECK(std::memcmp(back.data() + 1, want_back.data() + 1, (n - 1) * sizeof(float)) == 0);
    }
  };
  convert(half{});
  convert(bfloat16{});
#else
  MESSAGE("not an x86-64 GCC/Clang build: only the portable kernels exist");
#endif
}

TEST_CASE("signed integer sums wrap instead of overflowing") {
  std::int8_t a = 127, b = 1;
  reduction_for(dtype::int8, reduce_op::sum).inplace(&a, &b, 1);
  CHECK(a == -128);
  std::int64_t x = INT64_MAX, y = 1;
  reduction_for(dtype::int64, reduce_op::sum).inplace(&x, &y, 1);
  CHECK(x == INT64_MIN);
}

namespace {
struct link_figures {
  double alpha, beta;
};
struct figures_pick {
  // Not inlined: the caller then relies on GCC's mod/ref summary of it.
  [[gnu::noinline]] void pick(bool first) {
    if (first) chosen = one;
    else chosen = two;
  }
  link_figures one{1, 2}, two{30, 40}, chosen = one;
};
}  // namespace

// GCC 11+'s -fipa-modref drops the second pick() below (GCC 12.2: the caller
// keeps reading `one`); the cost model's set_link() was miscompiled that way.
// The cclite CMake target passes -fno-ipa-modref to every program built with
// GCC (CMakeLists.txt); this fails if it stops doing so.
TEST_CASE("compiler: a member copy inside a non-inlined call reaches the caller") {
  figures_pick p;
  p.pick(true);
  const double first = p.chosen.alpha * 3 + p.chosen.beta;
  p.pick(false);
  const double second = p.chosen.alpha * 3 + p.chosen.beta;
  CHECK(first == 5);
  CHECK(second == 130);
}

TEST_CASE("stream_copy: same bytes as memcpy at every alignment and length") {
  // Head, 64-byte body and tail are copied by different code; shift both
  // ends through a 16-byte period and check the bytes around the copy too.
  std::vector<std::uint8_t> src(4096 + 64), dst(4096 + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 131 + 7);
  for (std::size_t d = 0; d < 16; ++d)
    for (std::size_t s : {std::size_t{0}, std::size_t{3}})
      for (std::size_t n : {0, 1, 15, 63, 64, 79, 80, 127, 128, 200, 1000, 4000}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        stream_copy(dst.data() + d, src.data() + s, n);
        stream_fence();
        INFO("dst offset " << d << ", src offset " << s << ", " << n << " bytes");
        CHECK(std::memcmp(dst.data() + d, src.data() + s, n) == 0);
        CHECK(std::count(dst.begin(), dst.begin() + d, 0xEE) == static_cast<long>(d));
        CHECK(std::count(dst.begin() + d + n, dst.end(), 0xEE) == static_cast<long>(dst.size() - d - n));
      }
}

TEST_CASE("invalid dtype or op gives an empty kernel table") {
  CHECK_FALSE(static_cast<bool>(reduction_for(static_cast<dtype>(77), reduce_op::sum).inplace));
  CHECK_FALSE(static_cast<bool>(reduction_for(dtype::float32, static_cast<reduce_op>(9)).inplace));
}

TEST_CASE("segments: balanced split and bounded rounds") {
  segments s{10, 4};
  CHECK(s.length(0) == 3);
  CHECK(s.length(1) == 3);
  CHECK(s.length(2) == 2);
  CHECK(s.length(3) == 2);
  CHECK(s.offset(4) == 10);
  CHECK(rounds_for(s, 2) == 2);
  round_part p = part_of(s, 1, 1, 2);
  CHECK(p.begin == 5);
  CHECK(p.end == 6);
  CHECK(part_of(s, 3, 1, 2).size() == 0);
  CHECK(rounds_for(segments{0, 3}, 8) == 0);
}

TEST_CASE("env: CCLITE_ first, NCCL_ as fallback, malformed values are errors") {
  ::setenv("NCCL_SOCKET_IFNAME", "eth", 1);
  CHECK(env::get_string("SOCKET_IFNAME") == "eth");
  ::setenv("CCLITE_SOCKET_IFNAME", "ib", 1);
  CHECK(env::get_string("SOCKET_IFNAME") == "ib");
  ::unsetenv("CCLITE_SOCKET_IFNAME");
  ::unsetenv("NCCL_SOCKET_IFNAME");
  ::setenv("CCLITE_TEST_SIZE", "4M", 1);
  CHECK(env::get_int("TEST_SIZE", 0).value() == (4 << 20));
  ::setenv("CCLITE_TEST_SIZE", "four", 1);
  auto bad = env::get_int("TEST_SIZE", 0);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("CCLITE_TEST_SIZE") != std::string::npos);
  ::setenv("CCLITE_TIMEOUT", "0.25", 1);
  CHECK(env::timeout().value().count() == 250);
  ::setenv("CCLITE_TIMEOUT", "soon", 1);
  CHECK_FALSE(env::timeout().ok());
  ::unsetenv("CCLITE_TIMEOUT");
  CHECK(env::timeout().value().count() == env::default_timeout_seconds * 1000);
  // A timeout option: -2 (unset) is CCLITE_TIMEOUT; zero or negative is none.
  CHECK(env::timeout_option(milliseconds(-2)).value().count() == env::default_timeout_seconds * 1000);
  CHECK(env::timeout_option(milliseconds(0)).value().count() == -1);
  CHECK(env::timeout_option(milliseconds(-7)).value().count() == -1);
  CHECK(env::timeout_option(milliseconds(40)).value().count() == 40);
  ::setenv("CCLITE_TIMEOUT", "0", 1);
  CHECK(env::timeout_option(milliseconds(-2)).value().count() == -1);
  ::unsetenv("CCLITE_TIMEOUT");
  CHECK(parse_log_level("info") == log_level::info);
  CHECK(parse_log_level("TRACE") == log_level::trace);
  CHECK(parse_log_level(nullptr) == log_level::warn);
}

TEST_CASE("topology: nodes from host ids, local ranks, ring crosses each node boundary once") {
  std::vector<peer_info> peers(5);
  const char* hosts[] = {"a", "b", "a", "b", "a"};
  for (int r = 0; r < 5; ++r) {
    peers[r].rank = r;
    peers[r].host_id = hosts[r];
    peers[r].hostname = hosts[r];
  }
  auto t = topology::build(peers).value();
  CHECK(t.node_count() == 2);
  CHECK(t.local_rank(4) == 2);
  CHECK(t.local_size(1) == 2);
  CHECK(t.ring() == std::vector<int>{0, 2, 4, 1, 3});
  CHECK(t.ring_next(4) == 1);
  CHECK(t.ring_prev(0) == 3);
  peers[3].rank = 1;
  CHECK(topology::build(peers).error().code() == errc::bootstrap_error);
}

TEST_CASE("peer_info round-trips through its store encoding") {
  peer_info p = local_peer_info(3);
  p.transports = {"shm", "tcp"};
  auto q = peer_info::parse(p.serialize()).value();
  CHECK(q.rank == 3);
  CHECK(q.host_id == p.host_id);
  CHECK(q.has_transport("tcp"));
  CHECK_FALSE(peer_info::parse("garbage").ok());
}

TEST_CASE("status: copies keep the message, moves hand it over, an empty one is nothing") {
  status a(errc::timeout, "rank 1 (node0, pid 7) waited 30 s");
  status b = a;
  CHECK(b.code() == errc::timeout);
  CHECK(b.message() == a.message());
  status c = std::move(a);
  CHECK(c.to_string() == "timeout: rank 1 (node0, pid 7) waited 30 s");
  CHECK(a.message().empty());  // NOLINT(bugprone-use-after-move): moved-from state is documented
  status& same = b;
  b = same;  // self-assignment keeps it
  CHECK(b.message() == c.message());
  b = std::move(same);
  CHECK(b.message() == c.message());
  b = status(errc::peer_lost, "gone");  // replaces (and frees: the sanitizer build checks) the old one
  CHECK(b.code() == errc::peer_lost);
  CHECK(b.message() == "gone");
  b = status{};
  CHECK(b.ok());
  CHECK(b.message().empty());
  const status e(errc::timeout, std::string());
  CHECK_FALSE(e.ok());
  CHECK(e.message().empty());
  CHECK(e.to_string() == "timeout: ");
  result<int> r = status{};  // an ok status is not an error: the result says so
  CHECK_FALSE(r.ok());
  CHECK(r.error().code() == errc::invalid_argument);
}

TEST_CASE("result<T>: value or error, never both") {
  result<int> ok = 5;
  CHECK(ok.ok());
  CHECK(ok.value() == 5);
  result<int> bad = make_error(errc::timeout, "waited %d s", 3);
  CHECK_FALSE(bad.ok());
  CHECK(bad.error().to_string() == "timeout: waited 3 s");
#if CCLITE_HAS_EXCEPTIONS
  CHECK_THROWS_AS(bad.value(), cclite::error);
#endif
}

TEST_CASE("v-variant receive blocks: overlapping ones are refused, naming both ranks, in any order") {
  auto check = [](std::vector<std::size_t> counts, std::vector<std::size_t> displs) {
    return detail::check_blocks_disjoint("allgatherv", counts.data(), displs.data(), counts.size());
  };
  // disjoint: ascending, touching, with gaps, empty blocks anywhere, reversed, shuffled
  CHECK(check({4, 4, 4}, {0, 4, 8}).ok());
  CHECK(check({4, 0, 4}, {0, 2, 4}).ok());  // an empty block inside another is nothing
  CHECK(check({2, 3, 1}, {10, 0, 5}).ok());
  CHECK(check({4, 4, 4}, {8, 4, 0}).ok());
  CHECK(check({}, {}).ok());
  // overlapping, ascending: ranks 0 and 1 share an element
  status st = check({4, 4, 4}, {0, 3, 8});
  CHECK(st.code() == errc::invalid_argument);
  CHECK(st.message() ==
        "allgatherv: the recv blocks of rank 0 (displacement 0, count 4) and rank 1 (displacement 3, count 4) "
        "overlap: two peers would write the same elements");
  // reversed: rank 2's block reaches into rank 1's
  st = check({4, 4, 4}, {8, 4, 1});
  CHECK(st.code() == errc::invalid_argument);
  CHECK(st.message().find("rank 1 (displacement 4, count 4) and rank 2 (displacement 1, count 4)") != std::string::npos);
  // a long block covers a later one, in shuffled order
  st = check({2, 10, 2, 2}, {20, 0, 14, 4});
  CHECK(st.code() == errc::invalid_argument);
  CHECK(st.message().find("rank 1 (displacement 0, count 10) and rank 3 (displacement 4, count 2)") != std::string::npos);
  // the same block twice (equal displacements), in no order
  CHECK(check({3, 5, 5}, {20, 7, 7}).code() == errc::invalid_argument);
  // null arrays and overflowing blocks are validate()'s to report
  CHECK(detail::check_blocks_disjoint("alltoallv", nullptr, nullptr, 3).ok());
  CHECK(check({SIZE_MAX, 4}, {8, 0}).ok());
}

TEST_CASE("algorithm selection: automatic by size, CCLITE_ALGO overrides, typos are errors") {
  logger log;
  ::unsetenv("CCLITE_ALGO");
  ::unsetenv("CCLITE_RD_MAX");
  algorithm_selector sel;
  REQUIRE(sel.init(log).ok());
  CHECK(sel.choose(collective_kind::allreduce, 8, 4) == algorithm::rd);
  CHECK(sel.choose(collective_kind::allreduce, 1 << 20, 4) == algorithm::ring);
  CHECK(sel.choose(collective_kind::broadcast, 8, 4) == algorithm::ring);
  ::setenv("CCLITE_ALGO", "allreduce:ring", 1);
  algorithm_selector forced;
  REQUIRE(forced.init(log).ok());
  CHECK(forced.choose(collective_kind::allreduce, 8, 4) == algorithm::ring);
  ::setenv("CCLITE_ALGO", "rd", 1);
  algorithm_selector all_rd;
  REQUIRE(all_rd.init(log).ok());
  CHECK(all_rd.choose(collective_kind::allreduce, 1 << 24, 4) == algorithm::rd);
  CHECK(all_rd.choose(collective_kind::allgather, 8, 4) == algorithm::ring);  // has no rd
  ::setenv("CCLITE_ALGO", "allreduce:fastest", 1);
  algorithm_selector typo;
  CHECK(typo.init(log).code() == errc::invalid_argument);
  ::setenv("CCLITE_ALGO", "allredux:ring", 1);
  CHECK(algorithm_selector().init(log).code() == errc::invalid_argument);
  ::unsetenv("CCLITE_ALGO");
}

TEST_CASE("recursive doubling: partners are symmetric and fold non-powers of two") {
  for (int n = 1; n <= 13; ++n) {
    for (int r = 0; r < n; ++r) {
      int peers[64];
      int m = recursive_doubling_peers(r, n, peers);
      for (int i = 0; i < m; ++i) {
        int back[64];
        int mb = recursive_doubling_peers(peers[i], n, back);
        bool found = false;
        for (int j = 0; j < mb; ++j) found |= back[j] == r;
        CHECK(found);  // a partner of r has r as its partner: links pair up
        CHECK(peers[i] != r);
        CHECK(peers[i] < n);
      }
    }
  }
}
