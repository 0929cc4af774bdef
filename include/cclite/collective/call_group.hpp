// cclite/collective/call_group.hpp - the calls of an open group_start() ..
// group_end() (communicator.hpp): collectives kept as they were issued,
// point-to-point calls kept as their transfers, which algorithm/p2p_group.hpp
// later runs side by side.
//
// Internal (cclite::detail). One communicator's group, issued from one thread.
// The vectors keep their capacity between groups, so a steady stream of groups
// of the same shape does not allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cclite/algorithm/p2p_group.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>

namespace cclite::detail {

class call_group {
 public:
  /// Whether a group is open (calls are recorded, not run).
  bool open() const noexcept { return depth_ > 0; }
  void start() noexcept { ++depth_; }
  /// Closes one level; true when that was the outermost (run_and_clear() next).
  /// Errors: invalid_argument when no group is open.
  result<bool> end() {
    if (depth_ == 0) return make_error(errc::invalid_argument, "group_end() without a group_start()");
    return --depth_ == 0;
  }

  /// Records a call whose arguments were checked and whose buffers are host
  /// memory: send / recv / sendrecv as their transfers, anything else as is.
  void record(const op_desc& d) {
    const bool send = d.kind == collective_kind::send, recv = d.kind == collective_kind::recv;
    if (!send && !recv && d.kind != collective_kind::sendrecv) {
      calls_.push_back(d);
      return;
    }
    const std::size_t elem = size_of(d.type);
    p2p_transfer t;
    t.type = d.type;
    if (!recv) {
      t.peer = d.root;
      t.is_send = true;
      t.send = static_cast<const std::uint8_t*>(d.send);
      t.bytes = d.count * elem;
      transfers_.push_back(t);
    }
    if (!send) {
      t = p2p_transfer();
      t.type = d.type;
      t.peer = recv ? d.root : d.peer2;
      t.recv = static_cast<std::uint8_t*>(d.recv);
      t.bytes = (recv ? d.count : d.count2) * elem;
      transfers_.push_back(t);
    }
  }

  /// Runs what was recorded through `run(const op_desc&)`: the collectives in
  /// issue order, then the transfers as one call, `as_group(count, transfers)`.
  /// Stops at the first error and returns it; forgets the calls either way.
  template <class Run, class AsGroup>
  status run_and_clear(Run&& run, AsGroup&& as_group) {
    status st;
    for (const op_desc& c : calls_) {
      st = run(c);
      if (!st.ok()) break;
    }
    if (st.ok() && !transfers_.empty()) st = run(as_group(transfers_.size(), transfers_.data()));
    calls_.clear();
    transfers_.clear();
    return st;
  }

 private:
  int depth_ = 0;                        ///< group_start() minus group_end()
  std::vector<op_desc> calls_;           ///< the collectives, in issue order
  std::vector<p2p_transfer> transfers_;  ///< the point-to-point calls' transfers
};

}  // namespace cclite::detail
