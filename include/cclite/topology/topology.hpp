// cclite/topology/topology.hpp - nodes, local ranks and the ring order, computed
// from what every rank published (never trusted from the launcher alone: a
// launcher's LOCAL_RANK is only a hint, and a wrong hint would put two ranks on
// one GPU or send node-local traffic over the network).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <cclite/core/status.hpp>
#include <cclite/topology/peer_info.hpp>
#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite {

class topology {
 public:
  /// Groups ranks by host_id. Nodes are numbered in order of their lowest rank,
  /// local ranks in rank order within a node. `peers[i].rank` must equal i.
  static result<topology> build(const std::vector<peer_info>& peers) {
    topology t;
    const int n = static_cast<int>(peers.size());
    t.node_of_.assign(static_cast<std::size_t>(n), -1);
    t.local_rank_of_.assign(static_cast<std::size_t>(n), -1);
    for (int r = 0; r < n; ++r) {
      const peer_info& p = peers[static_cast<std::size_t>(r)];
      if (p.rank != r) {
        return make_error(errc::bootstrap_error,
                          "rank %d published itself as rank %d: two processes share a rank? "
                          "check RANK / CCLITE_RANK",
                          r, p.rank);
      }
      int node = -1;
      for (std::size_t k = 0; k < t.node_ids_.size(); ++k)
        if (t.node_ids_[k] == p.host_id) node = static_cast<int>(k);
      if (node < 0) {
        node = static_cast<int>(t.node_ids_.size());
        t.node_ids_.push_back(p.host_id);
        t.node_ranks_.emplace_back();
      }
      t.node_of_[static_cast<std::size_t>(r)] = node;
      t.local_rank_of_[static_cast<std::size_t>(r)] =
          static_cast<int>(t.node_ranks_[static_cast<std::size_t>(node)].size());
      t.node_ranks_[static_cast<std::size_t>(node)].push_back(r);
    }
    // Ring: node by node, local ranks in order, so that only node boundaries
    // cross the network (NCCL builds intra-node chains the same way).
    for (const auto& ranks : t.node_ranks_)
      for (int r : ranks) t.ring_.push_back(r);
    t.ring_pos_.assign(static_cast<std::size_t>(n), 0);
    for (int i = 0; i < n; ++i) t.ring_pos_[static_cast<std::size_t>(t.ring_[static_cast<std::size_t>(i)])] = i;
    return t;
  }

  int size() const noexcept { return static_cast<int>(node_of_.size()); }
  int node_count() const noexcept { return static_cast<int>(node_ids_.size()); }
  int node_of(int rank) const { return node_of_[static_cast<std::size_t>(rank)]; }
  int local_rank(int rank) const { return local_rank_of_[static_cast<std::size_t>(rank)]; }
  int local_size(int rank) const {
    return static_cast<int>(node_ranks_[static_cast<std::size_t>(node_of(rank))].size());
  }
  const std::vector<int>& node_ranks(int node) const {
    return node_ranks_[static_cast<std::size_t>(node)];
  }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }

  /// Ring order: ring()[i] is the rank at position i.
  const std::vector<int>& ring() const noexcept { return ring_; }
  int ring_position(int rank) const { return ring_pos_[static_cast<std::size_t>(rank)]; }
  int ring_next(int rank) const {
    int n = size();
    return ring_[static_cast<std::size_t>((ring_position(rank) + 1) % n)];
  }
  int ring_prev(int rank) const {
    int n = size();
    return ring_[static_cast<std::size_t>((ring_position(rank) + n - 1) % n)];
  }

  /// "2 nodes: node0 [0 1 2] node1 [3 4 5]" for INFO logs.
  std::string describe(const std::vector<peer_info>& peers) const {
    std::string s = std::to_string(node_count()) + (node_count() == 1 ? " node:" : " nodes:");
    for (int k = 0; k < node_count(); ++k) {
      const auto& rs = node_ranks_[static_cast<std::size_t>(k)];
      s += " " + peers[static_cast<std::size_t>(rs.front())].hostname + " [";
      for (std::size_t i = 0; i < rs.size(); ++i) s += (i ? " " : "") + std::to_string(rs[i]);
      s += "]";
    }
    return s;
  }

 private:
  std::vector<std::string> node_ids_;
  std::vector<std::vector<int>> node_ranks_;
  std::vector<int> node_of_, local_rank_of_, ring_, ring_pos_;
};

}  // namespace cclite
CCLITE_SETUP_CODE_END
