// cclite/algorithm/tree.hpp - binary trees and NCCL's double binary tree.
//
// The tree over n positions 0..n-1 is the in-order binary tree of the bits of
// the position (NCCL's ncclGetBtree): position i with lowest set bit b has
// children i - b/2 and i + b/2 (the right one shrunk until it is < n) and
// parent (i ^ b) | 2b (or i ^ b if that is >= n); position 0 is the root and
// has a single child. Depth is ceil(lg n), and every odd position is a leaf.
//
// Double binary tree (Sanders et al. 2009, NCCL 2.4): a second tree, the
// mirror image (i -> n-1-i) for even n or the shift (i -> i-1) for odd n, has
// the first tree's leaves as its inner nodes. Each tree carries half of the
// data, so every rank sends and receives about N per direction whatever n is,
// with a latency of 2 lg n steps instead of the ring's 2 (n-1).
//
// Allreduce runs reduce (leaves to root), then broadcast (root to leaves),
// chunk by chunk so the levels of the tree work at the same time. Each chunk
// is computed once, at its tree's root, then copied down: every rank ends
// with bitwise-identical results.
//
// Deadlock freedom: every rank runs the steps in the same global order
// (phase, chunk, tree) and in the reduce phase data only goes up, in the
// broadcast phase only down; a step waits only on steps of the same phase
// that come before it in that order on the ranks below (above) it, so the
// waits form no cycle, and a chunk never exceeds a link's buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cclite/algorithm/schedule.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

/// One position's neighbours in a tree (-1 = none).
struct tree_node {
  int parent = -1;
  int child[2] = {-1, -1};
};

/// The in-order bit tree over positions 0..n-1 rooted at 0.
inline tree_node bit_tree(int i, int n) {
  tree_node t;
  if (n <= 1) return t;
  int bit = 1;
  while (bit < n && !(bit & i)) bit <<= 1;
  if (i == 0) {
    t.child[0] = bit >> 1;  // bit is the first power of two >= n here
    return t;
  }
  int up = (i ^ bit) | (bit << 1);
  if (up >= n) up = i ^ bit;
  t.parent = up;
  int low = bit >> 1;
  if (low == 0) return t;
  t.child[0] = i - low;
  int right = i + low;
  while (low > 0 && right >= n) {
    low >>= 1;
    right = i + low;
  }
  t.child[1] = low > 0 ? right : -1;
  return t;
}

/// Position `i` in tree `which` (0 or 1) of the double binary tree over n.
inline tree_node double_tree(int which, int i, int n) {
  if (which == 0 || n <= 1) return bit_tree(i, n);
  // Tree 1 is tree 0 relabelled: position i plays the role of map(i).
  auto map = [n](int x) { return n % 2 == 0 ? n - 1 - x : (x - 1 + n) % n; };
  auto unmap = [n](int y) { return n % 2 == 0 ? n - 1 - y : (y + 1) % n; };
  tree_node t = bit_tree(map(i), n);
  tree_node r;
  r.parent = t.parent < 0 ? -1 : unmap(t.parent);
  for (int c = 0; c < 2; ++c) r.child[c] = t.child[c] < 0 ? -1 : unmap(t.child[c]);
  return r;
}

/// Positions a node talks to in either tree (for connecting them first).
inline int double_tree_peers(int i, int n, int* out) {
  int m = 0;
  for (int w = 0; w < 2; ++w) {
    tree_node t = double_tree(w, i, n);
    for (int p : {t.parent, t.child[0], t.child[1]}) {
      if (p < 0) continue;
      bool seen = false;
      for (int k = 0; k < m; ++k) seen = seen || out[k] == p;
      if (!seen) out[m++] = p;
    }
  }
  return m;
}

/// Double-binary-tree allreduce on `data` (count elements, in place). The
/// callbacks take positions, not ranks: `send(pos, src, bytes)`,
/// `recv(pos, dst, bytes)`. `scratch` has room for `chunk` elements.
template <class Send, class Recv>
status double_tree_allreduce(std::uint8_t* data, std::uint8_t* scratch, std::size_t count,
                             const reduction& red, int pos, int n, std::size_t chunk, Send&& send,
                             Recv&& recv) {
  if (n == 1 || count == 0) return {};
  const std::size_t elem = red.elem_size;
  const segments halves{count, 2};
  const tree_node tree[2] = {double_tree(0, pos, n), double_tree(1, pos, n)};
  const std::size_t rounds = rounds_for(halves, chunk);
  for (std::size_t r = 0; r < rounds; ++r) {  // reduce: up the trees
    for (int w = 0; w < 2; ++w) {
      const round_part pt = part_of(halves, static_cast<std::size_t>(w), r, chunk);
      if (pt.size() == 0) continue;
      std::uint8_t* at = data + pt.begin * elem;
      for (int c : tree[w].child) {
        if (c < 0) continue;
        CCLITE_TRY(recv(c, scratch, pt.size() * elem));
        red.inplace(at, scratch, pt.size());
      }
      if (tree[w].parent >= 0) CCLITE_TRY(send(tree[w].parent, at, pt.size() * elem));
      else if (red.needs_divide) red.divide(at, pt.size(), n);
    }
  }
  for (std::size_t r = 0; r < rounds; ++r) {  // broadcast: down the trees
    for (int w = 0; w < 2; ++w) {
      const round_part pt = part_of(halves, static_cast<std::size_t>(w), r, chunk);
      if (pt.size() == 0) continue;
      std::uint8_t* at = data + pt.begin * elem;
      if (tree[w].parent >= 0) CCLITE_TRY(recv(tree[w].parent, at, pt.size() * elem));
      for (int c : tree[w].child)
        if (c >= 0) CCLITE_TRY(send(c, at, pt.size() * elem));
    }
  }
  return {};
}

/// Tree broadcast from position 0 of bit_tree (callers rotate positions so the
/// root is 0), pipelined in chunks of `chunk` bytes.
template <class Send, class Recv>
status tree_broadcast(std::uint8_t* data, std::size_t bytes, int pos, int n, std::size_t chunk,
                      Send&& send, Recv&& recv) {
  const tree_node t = bit_tree(pos, n);
  for (std::size_t at = 0; at < bytes; at += chunk) {
    const std::size_t len = bytes - at < chunk ? bytes - at : chunk;
    if (t.parent >= 0) CCLITE_TRY(recv(t.parent, data + at, len));
    for (int c : t.child)
      if (c >= 0) CCLITE_TRY(send(c, data + at, len));
  }
  return {};
}

/// Tree reduce to position 0 of bit_tree, pipelined in chunks of `chunk`
/// elements: `send` holds this rank's contribution; `recv` (the root's only)
/// receives the result. `scratch` has room for 2 * `chunk` elements: the
/// incoming piece and, off the root, the partial result of the subtree.
template <class Send, class Recv>
status tree_reduce(const std::uint8_t* send, std::uint8_t* recv, std::uint8_t* scratch, std::size_t count,
                   const reduction& red, int pos, int n, std::size_t chunk, Send&& send_to,
                   Recv&& recv_from) {
  const tree_node t = bit_tree(pos, n);
  const std::size_t elem = red.elem_size;
  std::uint8_t* in = scratch;
  for (std::size_t at = 0; at < count; at += chunk) {
    const std::size_t len = count - at < chunk ? count - at : chunk;
    std::uint8_t* acc = t.parent < 0 ? recv + at * elem : scratch + chunk * elem;
    if (acc != send + at * elem) std::memcpy(acc, send + at * elem, len * elem);
    for (int c : t.child) {
      if (c < 0) continue;
      CCLITE_TRY(recv_from(c, in, len * elem));
      red.inplace(acc, in, len);
    }
    if (t.parent >= 0) CCLITE_TRY(send_to(t.parent, acc, len * elem));
    else if (red.needs_divide) red.divide(acc, len, n);
  }
  return {};
}

}  // namespace cclite
