// cclite/collective/hier_allreduce.hpp - the hierarchical allreduce of a
// multi-node communicator: reduce-scatter inside each node, allreduce of each
// shard across the nodes, allgather inside the node (NCCL's "tree" between
// nodes plays the same role; Horovod's hierarchical allreduce is this one).
//
// It runs on two child communicators built on first use from the topology
// every rank already knows (no extra agreement): the ranks of this node, and
// the ranks with this local rank on every node (one node-leader per shard).
// Both share the parent's links (link_pool.hpp) and run only inside the
// parent's calls, which already hold those links. The selector picks it
// (select.hpp: algorithm::hier) for large calls on several nodes of equal size.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cclite/collective/op.hpp>
#include <cclite/config.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>
#include <cclite/topology/topology.hpp>

namespace cclite::detail {

/// The two children of one communicator and the algorithm over them. `Comm`
/// is the communicator type itself (the children are communicators too).
template <class Comm>
class hier_allreduce {
 public:
  bool built() const noexcept { return node_ != nullptr; }

CCLITE_SETUP_CODE_BEGIN
  /// Builds both children through `make_child(ranks, where)` (ranks as the
  /// parent numbers them, in their new order; `where`: a name under the
  /// parent's prefix), returning result<std::unique_ptr<Comm>>. Collective
  /// over the parent's ranks.
  template <class MakeChild>
  status build(const topology& topo, int rank, const logger& log, MakeChild&& make_child) {
    const int node = topo.node_of(rank), lr = topo.local_rank(rank);
    std::vector<int> ranks = topo.node_ranks(node);  // in local-rank order
    auto in_node = make_child(ranks, "hier/node" + std::to_string(node));
    if (!in_node) return status(in_node.error().code(), "building the node communicator: " + in_node.error().message());
    ranks.clear();
    for (int k = 0; k < topo.node_count(); ++k) ranks.push_back(topo.node_ranks(k)[static_cast<std::size_t>(lr)]);
    auto across = make_child(ranks, "hier/cross" + std::to_string(lr));
    if (!across) return status(across.error().code(), "building the cross-node communicator: " + across.error().message());
    node_ = std::move(in_node.value());
    cross_ = std::move(across.value());
    raw_[0] = node_.get();
    raw_[1] = cross_.get();
    CCLITE_INFO(log, "hierarchical allreduce: node %d (%d ranks over %s), shard %d across %d nodes over %s", node,
                node_->size(), link_name(*node_), lr, cross_->size(), link_name(*cross_));
    return {};
  }
CCLITE_SETUP_CODE_END

  /// The call `d` of a parent of `world` ranks, on built children. The
  /// count % local_size tail elements are allreduced in the node, then across.
  /// avg sums at both levels and divides once at the end, so the result is
  /// the reference's (two integer divisions would truncate twice).
  status run(const op_desc& d, const reduction& red, int world) {
    Comm& in_node = *node_;
    Comm& across = *cross_;
    const std::size_t elem = red.elem_size, L = static_cast<std::size_t>(in_node.size());
    const std::size_t q = d.count / L, tail = d.count - q * L;
    const reduce_op inner = red.needs_divide ? reduce_op::sum : d.op;
    const auto* send = static_cast<const std::uint8_t*>(d.send);
    auto* recv = static_cast<std::uint8_t*>(d.recv);
    std::uint8_t* shard = recv + static_cast<std::size_t>(in_node.rank()) * q * elem;
    // The children's calls carry the parent call's kernels (op.hpp: kernel_lookup).
    auto allreduce = [&](Comm& c, std::uint8_t* p, std::size_t n) {
      return c.template run_with<collective_kind::allreduce>(p, p, n, d.type, inner, d.kernels);
    };
    if (q) {
      CCLITE_TRY(step("in the node", in_node.template run_with<collective_kind::reduce_scatter>(
                                                        send, shard, q, d.type, inner, d.kernels)));
      CCLITE_TRY(step("across nodes", allreduce(across, shard, q)));
      if (red.needs_divide) red.divide(shard, q, world);
      CCLITE_TRY(step("in the node", in_node.allgather(shard, recv, q, d.type)));
    }
    if (tail) {
      std::uint8_t* t = recv + q * L * elem;
      if (send != recv) std::memcpy(t, send + q * L * elem, tail * elem);
      CCLITE_TRY(step("tail in the node", allreduce(in_node, t, tail)));
      CCLITE_TRY(step("tail across nodes", allreduce(across, t, tail)));
      if (red.needs_divide) red.divide(t, tail, world);
    }
    return {};
  }

  /// Aborts both children (safe from any thread, as Comm::abort()).
  void abort() noexcept {
    for (auto& child : raw_)
      if (Comm* c = child.load()) c->abort();
  }
  /// Gives both children the deadline `t` (as Comm::set_timeout(); any thread).
  void set_timeout(milliseconds t) noexcept {
    for (auto& child : raw_)
      if (Comm* c = child.load()) c->set_timeout(t);
  }

 private:
  // "hierarchical allreduce, in the node: allgather (...): <cause>" (the
  // child's message names its call's kind and shape, comm_dispatch.hpp).
  static status step(const char* what, status st) {
    return st.ok() ? st : status(st.code(), std::string("hierarchical allreduce, ") + what + ": " + st.message());
  }
  static const char* link_name(const Comm& c) {
    return c.size() > 1 ? c.transport_of((c.rank() + 1) % c.size()) : "self";
  }

  std::unique_ptr<Comm> node_, cross_;
  std::atomic<Comm*> raw_[2] = {};  // for abort() and set_timeout() from another thread
};

}  // namespace cclite::detail
