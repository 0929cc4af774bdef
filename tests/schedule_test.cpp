// Single-process checks of the type-free schedules: the bit tree and the
// double binary tree (shape, consistency, complementarity), halving-doubling's
// peers and scratch size, and the cost model's orderings that the selector
// relies on.
#include <cclite/algorithm/halving_doubling.hpp>
#include <cclite/algorithm/tree.hpp>
#include <cclite/collective/cost_model.hpp>

#include <doctest/doctest.h>

#include <vector>

using namespace cclite;

namespace {

// Depth of position i in tree `which` (root = 0), or -1 if the parent links loop.
int depth_of(int which, int i, int n) {
  int d = 0;
  while (i >= 0 && d <= n) {
    const int p = double_tree(which, i, n).parent;
    if (p < 0) return d;
    i = p;
    ++d;
  }
  return -1;
}

}  // namespace

TEST_CASE("trees: every position has one parent that lists it as a child") {
  for (int n = 1; n <= 64; ++n) {
    for (int w = 0; w < 2; ++w) {
      int roots = 0;
      std::vector<int> seen_as_child(static_cast<std::size_t>(n), 0);
      for (int i = 0; i < n; ++i) {
        const tree_node t = double_tree(w, i, n);
        if (t.parent < 0) ++roots;
        for (int c : t.child) {
          if (c < 0) continue;
          REQUIRE(c >= 0);
          REQUIRE(c < n);
          CHECK(double_tree(w, c, n).parent == i);
          ++seen_as_child[static_cast<std::size_t>(c)];
        }
        if (t.parent >= 0) {
          const tree_node p = double_tree(w, t.parent, n);
          CHECK((p.child[0] == i || p.child[1] == i));
        }
        // Depth is logarithmic: at most ceil(lg n) + 1 hops to the root.
        const int d = depth_of(w, i, n);
        CHECK(d >= 0);
        CHECK(d <= cost_model::log2_ceil(n) + 1);
      }
      CHECK(roots == 1);
      for (int i = 0; i < n; ++i) CHECK(seen_as_child[static_cast<std::size_t>(i)] == (double_tree(w, i, n).parent >= 0 ? 1 : 0));
    }
  }
}

TEST_CASE("trees: the second tree's inner nodes are the first tree's leaves (even n)") {
  // NCCL's property: with n even, a rank is an inner node in at most one tree,
  // so no rank forwards more than one tree's half of the data down and up.
  for (int n = 4; n <= 64; n += 2) {
    for (int i = 0; i < n; ++i) {
      auto inner = [&](int w) {
        const tree_node t = double_tree(w, i, n);
        return t.child[0] >= 0 || t.child[1] >= 0;
      };
      CHECK_MESSAGE(!(inner(0) && inner(1)), "n ", n, " position ", i, " is inner in both trees");
    }
  }
}

TEST_CASE("trees: rooted bit tree rotated onto any root reaches everyone") {
  for (int n = 1; n <= 20; ++n)
    for (int root = 0; root < n; ++root) {
      std::vector<int> reached(static_cast<std::size_t>(n), 0);
      // Walk from the root over child links in rotated positions.
      std::vector<int> todo{0};
      while (!todo.empty()) {
        const int p = todo.back();
        todo.pop_back();
        ++reached[static_cast<std::size_t>((p + root) % n)];
        for (int c : bit_tree(p, n).child)
          if (c >= 0) todo.push_back(c);
      }
      for (int r = 0; r < n; ++r) CHECK(reached[static_cast<std::size_t>(r)] == 1);
    }
}

TEST_CASE("halving-doubling: peers are symmetric and scratch covers every half") {
  for (int n = 1; n <= 33; ++n) {
    for (int r = 0; r < n; ++r) {
      int peers[64];
      const int m = halving_doubling_peers(r, n, peers);
      for (int k = 0; k < m; ++k) {
        int back[64];
        const int mb = halving_doubling_peers(peers[k], n, back);
        bool found = false;
        for (int j = 0; j < mb; ++j) found = found || back[j] == r;
        CHECK_MESSAGE(found, "n ", n, ": ", r, " talks to ", peers[k], " but not back");
      }
    }
    for (std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1031), std::size_t(1) << 20}) {
      const std::size_t s = halving_doubling_scratch(count, n);
      if (n == 1) {
        CHECK(s == 0);  // nothing to exchange
        continue;
      }
      CHECK(s >= count / 2 + (count % 2));  // the fold receives ceil(count / 2)
      CHECK(s <= count);
    }
  }
}

TEST_CASE("cost model: the orderings the selector depends on") {
  cost_model m;
  REQUIRE(m.init().ok());
  m.set_link("shm");
  // Tiny messages: recursive doubling beats the ring (fewer latency steps).
  CHECK(m.rd_allreduce(8, 8) < m.ring_allreduce(8, 8, 512 << 10));
  // Huge messages: the ring beats recursive doubling (bandwidth term).
  CHECK(m.ring_allreduce(8, 64 << 20, 512 << 10) < m.rd_allreduce(8, 64 << 20));
  // Across slow links, the hierarchical algorithm beats a flat ring for large data.
  m.set_link("tcp");
  CHECK(m.hier_allreduce(4, 2, 64 << 20, 512 << 10) < m.ring_allreduce(8, 64 << 20, 512 << 10));
}

TEST_CASE("cost model: CCLITE_COST_* must be alpha_us,GBps") {
  ::setenv("CCLITE_COST_TCP", "12,10", 1);
  cost_model m;
  CHECK(m.init().ok());
  m.set_link("tcp");
  CHECK(m.link().alpha_us == doctest::Approx(12.0));
  ::setenv("CCLITE_COST_TCP", "fast", 1);
  cost_model bad;
  const status st = bad.init();
  CHECK(st.code() == errc::invalid_argument);
  CHECK(st.message().find("alpha_us,GBps") != std::string::npos);
  ::unsetenv("CCLITE_COST_TCP");
}
