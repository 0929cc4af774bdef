// cclite/collective/select.hpp - which algorithm runs a collective.
//
// Automatic choice, per call: the cheapest algorithm under the alpha-beta
// cost model (cost_model.hpp) for the collective, the message size, the rank
// count and the slowest link kind of the job. Recursive doubling is
// considered only up to CCLITE_RD_MAX bytes (default 32 KiB; its scratch is
// allocated at init). CCLITE_ALGO forces a choice, for every collective
// ("ring") or per collective ("allreduce:rhd,broadcast:tree"), as NCCL_ALGO
// does. A forced algorithm a collective does not have is reported once at
// init (WARN) and ignored.
//
//   allreduce  ring, tree (double binary), rd (recursive doubling),
//              rhd (Rabenseifner halving-doubling), hier (reduce-scatter in
//              each node, allreduce of each shard across nodes, allgather in
//              each node; needs the same rank count on every node),
//              direct (shm-direct: each rank reduces its slice straight
//              from the others' shared buffers; one node, shm links only)
//   broadcast  ring (pipelined chain), tree
//   reduce     ring (pipelined chain), tree
//   others     ring (allgather, reduce_scatter, barrier) or their one
//              schedule (direct gather/scatter, pairwise alltoall)
#pragma once

#include <cclite/config.hpp>

#include <cstring>
#include <string>

#include <cclite/collective/cost_model.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>

namespace cclite {

enum class algorithm : std::uint8_t { automatic, ring, rd, rhd, tree, hier, direct };

inline const char* to_string(algorithm a) noexcept {
  switch (a) {
    case algorithm::automatic: return "auto";
    case algorithm::ring: return "ring";
    case algorithm::rd: return "rd";
    case algorithm::rhd: return "rhd";
    case algorithm::tree: return "tree";
    case algorithm::hier: return "hier";
    case algorithm::direct: return "direct";
  }
  return "?";
}

/// Whether `a` exists for collective `k` in this version.
inline bool available(collective_kind k, algorithm a) noexcept {
  if (a == algorithm::automatic || a == algorithm::ring) return true;
  switch (k) {
    case collective_kind::allreduce: return true;  // hier and direct fall back to ring where they do not apply
    case collective_kind::broadcast:
    case collective_kind::reduce: return a == algorithm::tree;
    case collective_kind::scan:
    case collective_kind::exscan: return a == algorithm::rd;
    default: return false;
  }
}

class algorithm_selector {
 public:
CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  /// Reads CCLITE_ALGO and CCLITE_RD_MAX; unknown names are an error (a typo
  /// must not silently measure the wrong algorithm).
  status init(const logger& log) {
    CCLITE_TRY(cost_.init());
    auto rd = env::get_int("RD_MAX", 32 << 10, false);
    if (!rd) return rd.error();
    rd_max_ = static_cast<std::size_t>(rd.value() < 0 ? 0 : rd.value());
    const std::string spec = env::get_string("ALGO", "", false);
    std::size_t start = 0;
    while (start < spec.size()) {
      std::size_t end = spec.find(',', start);
      if (end == std::string::npos) end = spec.size();
      std::string item = spec.substr(start, end - start);
      start = end + 1;
      if (item.empty()) continue;
      std::string coll, name = item;
      if (auto colon = item.find(':'); colon != std::string::npos) {
        coll = item.substr(0, colon);
        name = item.substr(colon + 1);
      }
      algorithm a;
      if (name == "ring") a = algorithm::ring;
      else if (name == "rd") a = algorithm::rd;
      else if (name == "rhd") a = algorithm::rhd;
      else if (name == "tree") a = algorithm::tree;
      else if (name == "hier") a = algorithm::hier;
      else if (name == "direct") a = algorithm::direct;
      else if (name == "auto") a = algorithm::automatic;
      else {
        return make_error(errc::invalid_argument,
                          "CCLITE_ALGO='%s': unknown algorithm '%s' (use ring, tree, rd, rhd, hier, direct or auto, "
                          "optionally per collective: allreduce:rhd,broadcast:tree)",
                          spec.c_str(), name.c_str());
      }
      bool matched = false;
      for (int k = 0; k < collective_kind_count; ++k) {
        auto kind = static_cast<collective_kind>(k);
        if (!coll.empty() && coll != to_string(kind)) continue;
        matched = true;
        if (available(kind, a)) forced_[k] = a;
        else if (!coll.empty())
          CCLITE_WARN(log, "CCLITE_ALGO: %s has no algorithm '%s'; using the automatic choice",
                      coll.c_str(), name.c_str());
      }
      if (!matched) {
        return make_error(errc::invalid_argument, "CCLITE_ALGO='%s': unknown collective '%s'",
                          spec.c_str(), coll.c_str());
      }
    }
    return {};
  }
CCLITE_SETUP_CODE_END

  /// Tells the model the job's slowest link kind and the pipeline chunk; all
  /// ranks must pass the same values so that they choose alike.
  void set_job(const std::string& link_kind, std::size_t chunk_bytes) {
    cost_.set_link(link_kind);
    link_kind_ = link_kind;
    chunk_bytes_ = chunk_bytes;
  }
  const cost_model& costs() const noexcept { return cost_; }
  cost_model& costs() noexcept { return cost_; }
  const std::string& link_kind() const noexcept { return link_kind_; }
  /// Node layout for the hierarchical algorithm: `local` ranks on each of
  /// `nodes` nodes, or local = 0 when nodes hold different rank counts.
  void set_nodes(int nodes, int local) {
    nodes_ = nodes;
    local_ = local;
  }
  /// Whether the hierarchical algorithm applies to this job at all.
  bool hier_possible() const noexcept { return nodes_ > 1 && local_ > 1; }
  /// Whether shm-direct applies: the communicator has a transport offering a
  /// node-wide group, all ranks share one node, and every link is shm.
  /// `piece`: the bytes one shm-direct step moves (CCLITE_SHM_DIRECT_BUFFSIZE).
  /// `small_max`: allreduces up to this many bytes take shm-direct's
  /// one-synchronisation small path (CCLITE_SHM_SMALL_MAX; 0: never).
  void set_direct(bool compiled_in, std::size_t piece, std::size_t small_max = 0) {
    direct_ = compiled_in && nodes_ == 1 && local_ > 1 && link_kind_ == "shm";
    direct_piece_ = piece;
    small_max_ = small_max;
  }
  bool direct_possible() const noexcept { return direct_; }
  /// Whether a call of `k` whose slot is `bytes` (what one rank writes)
  /// takes shm-direct's small path: one node over shm, at most small_max
  /// bytes, and CCLITE_ALGO does not name another algorithm for `k`. It
  /// depends on the call's size only, so every rank of a call decides alike.
  bool small_direct(collective_kind k, std::size_t bytes) const noexcept {
    const algorithm f = forced_[static_cast<int>(k)];
    return direct_ && bytes <= small_max_ && (f == algorithm::automatic || f == algorithm::direct);
  }

  /// The algorithm for one call of `k` moving `bytes` per rank on `n` ranks.
  algorithm choose(collective_kind k, std::size_t bytes, int n) const noexcept {
    algorithm f = forced_[static_cast<int>(k)];
    if (f != algorithm::automatic) return f;
    const double b = static_cast<double>(bytes), c = static_cast<double>(chunk_bytes_);
    switch (k) {
      case collective_kind::allreduce: {
        if (n <= 1) return algorithm::ring;
        algorithm best = algorithm::ring;
        double t = cost_.ring_allreduce(n, b, c);
        auto consider = [&](algorithm a, double ta) {
          if (ta < t) best = a, t = ta;
        };
        if (bytes <= rd_max_) consider(algorithm::rd, cost_.rd_allreduce(n, b));
        // rhd receives half the buffer into scratch: only up to what init sized.
        if (bytes / 2 <= 2 * chunk_bytes_) consider(algorithm::rhd, cost_.rhd_allreduce(n, b));
        consider(algorithm::tree, cost_.tree_allreduce(n, b, c));
        if (hier_possible()) consider(algorithm::hier, cost_.hier_allreduce(local_, nodes_, b, c));
        if (direct_ && bytes <= direct_piece_) consider(algorithm::direct, cost_.direct_allreduce(n, b));
        return best;
      }
      case collective_kind::broadcast:
      case collective_kind::reduce: {
        const bool red = k == collective_kind::reduce;
        return cost_.tree_rooted(n, b, c, red) < cost_.chain_rooted(n, b, c, red) ? algorithm::tree
                                                                                   : algorithm::ring;
      }
      case collective_kind::scan:
      case collective_kind::exscan:
        // Up to CCLITE_RD_MAX on 3 or more ranks, log2(p) exchanges of the
        // vector beat p - 1 hops (algorithm/scan.hpp); 2 ranks: one hop either way.
        return n > 2 && bytes <= rd_max_ ? algorithm::rd : algorithm::ring;
      default: return algorithm::ring;
    }
  }

  /// Bytes of scratch recursive doubling needs (allocated once at init).
  std::size_t rd_scratch_bytes() const noexcept {
    return forced_[static_cast<int>(collective_kind::allreduce)] == algorithm::rd ? 0 : rd_max_;
  }
  bool rd_forced() const noexcept {
    return forced_[static_cast<int>(collective_kind::allreduce)] == algorithm::rd;
  }

 private:
  algorithm forced_[collective_kind_count] = {};
  std::size_t rd_max_ = 32 << 10;
  std::size_t chunk_bytes_ = 512 << 10;
  int nodes_ = 1, local_ = 0;
  bool direct_ = false;
  std::size_t direct_piece_ = 1 << 20;
  std::size_t small_max_ = 0;
  std::string link_kind_ = "shm";
  cost_model cost_;
};

}  // namespace cclite
