// cclite/collective/call_log.hpp - how a communicator names its calls: in
// error messages ("rank 3: allreduce #57 (1048576 x float32, sum)") and in the
// CCLITE_DEBUG=INFO log, which says once per (collective, power-of-two size
// class) which algorithm runs it.
#pragma once

#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include <cclite/collective/op.hpp>
#include <cclite/collective/select.hpp>
#include <cclite/config.hpp>
#include <cclite/core/dtype.hpp>

namespace cclite::detail {

/// Where one call goes, as far as the INFO line tells it.
struct call_route {
  bool local = false;            // a one-rank communicator: a copy
  bool in_window = false;        // an allreduce of a shared window (comm_shared.hpp)
  bool small_direct = false;     // shm-direct's small path
  algorithm algo = algorithm::ring;  // the selector's choice
  bool hier_possible = false, direct_possible = false;  // whether hier / direct apply here
};

CCLITE_SETUP_CODE_BEGIN  // error messages and log lines: compiled for size

/// "rank R: KIND #SEQ (COUNT x DTYPE[, OP])", the prefix of a call's errors.
/// `rank` < 0: "KIND (COUNT x DTYPE[, OP])", a step of another call (a
/// hierarchical child's), whose own rank and number would only repeat the
/// parent's or, counted by the child, read as another call of the user's.
inline std::string describe_call(const op_desc& d, std::uint64_t seq, int rank) {
  char who[48] = "";
  if (rank >= 0) std::snprintf(who, sizeof who, "rank %d: ", rank);
  char num[24] = "";
  if (rank >= 0) std::snprintf(num, sizeof num, " #%" PRIu64, seq);
  char buf[200];
  if (d.kind == collective_kind::barrier) {
    std::snprintf(buf, sizeof buf, "%sbarrier%s", who, num);
  } else if (d.kind == collective_kind::group) {
    std::snprintf(buf, sizeof buf, "%sgroup%s (%zu transfers)", who, num, d.count);
  } else if (d.kind == collective_kind::alltoallv) {  // no count of its own: one per peer
    std::snprintf(buf, sizeof buf, "%salltoallv%s (%s)", who, num, to_string(d.type));
  } else {
    const bool op = d.kind == collective_kind::allreduce;
    std::snprintf(buf, sizeof buf, "%s%s%s (%zu x %s%s%s)", who, to_string(d.kind), num, d.count, to_string(d.type),
                  op ? ", " : "", op ? to_string(d.op) : "");
  }
  return buf;
}

/// The algorithm that runs a call of kind `k` routed as `r`, in words.
inline const char* describe_algorithm(collective_kind k, const call_route& r) {
  if (r.local) return "local copy";
  if (r.in_window) return "shared window (each rank reduces its slice in every rank's copy)";
  if (r.small_direct) return "shm-direct small (one synchronisation, the header beside the data)";
  switch (r.algo) {
    case algorithm::rd: return "recursive doubling";
    case algorithm::rhd: return "halving-doubling (Rabenseifner)";
    case algorithm::tree: return k == collective_kind::allreduce ? "double binary tree" : "binary tree";
    case algorithm::hier:
      if (r.hier_possible) return "hierarchical (node reduce-scatter, cross-node allreduce, node allgather)";
      break;
    case algorithm::direct:
      if (r.direct_possible) return "shm-direct (each rank reduces its slice from the peers' buffers)";
      break;
    default: break;
  }
  switch (k) {  // the ring family's schedule for this collective
    case collective_kind::broadcast: return "ring chain";
    case collective_kind::reduce: return "ring chain to the root";
    case collective_kind::gather: case collective_kind::scatter: case collective_kind::gatherv:
    case collective_kind::scatterv: return "direct to/from the root";
    case collective_kind::alltoall: case collective_kind::alltoallv: return "pairwise exchange";
    case collective_kind::send: case collective_kind::recv: case collective_kind::sendrecv: return "direct";
    case collective_kind::group: return "direct, every peer's transfers at once";
    default: return "ring";
  }
}

CCLITE_SETUP_CODE_END

/// The bytes a call's size class and algorithm choice go by.
inline std::size_t call_bytes(const op_desc& d) noexcept {
  return d.count * (d.kind == collective_kind::barrier || d.kind == collective_kind::group ? 0 : size_of(d.type));
}

/// Remembers which (collective, power-of-two size class) pairs were logged.
class call_log {
 public:
  /// True the first time a call of `d`'s kind and size class comes; `bytes`
  /// and `cls` (its class: bytes <= 2^cls) are set either way.
  bool first(const op_desc& d, std::size_t& bytes, int& cls) noexcept {
    bytes = call_bytes(d);
    cls = 0;
    while (cls < 63 && (std::size_t(1) << cls) < bytes) ++cls;
    const std::uint64_t bit = std::uint64_t(1) << cls;
    std::uint64_t& seen = seen_[static_cast<std::size_t>(d.kind)];
    if (seen & bit) return false;
    seen |= bit;
    return true;
  }

 private:
  std::uint64_t seen_[collective_kind_count] = {};
};

}  // namespace cclite::detail
