// cclite/collective/call_group.hpp - the calls of an open group_start() ..
// group_end() (communicator.hpp): collectives kept as they were issued,
// point-to-point calls kept as their transfers, which algorithm/p2p_group.hpp
// later runs side by side.
//
// Internal (cclite::detail). One communicator's group, issued from one thread.
// The vectors keep their capacity between groups, so a steady stream of groups
// of the same shape does not allocate.
#pragma once

#include <algorithm>
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
  /// Runs nothing if a receive's buffer overlaps another transfer's
  /// (check_overlaps()). Stops at the first error and returns it; forgets the
  /// calls either way.
  template <class Run, class AsGroup>
  status run_and_clear(Run&& run, AsGroup&& as_group) {
    status st = check_overlaps();
    for (const op_desc& c : calls_) {
      if (!st.ok()) break;
      st = run(c);
    }
    if (st.ok() && !transfers_.empty()) st = run(as_group(transfers_.size(), transfers_.data()));
    calls_.clear();
    transfers_.clear();
    return st;
  }

 private:
  /// The group's transfers run side by side, so a receive whose buffer
  /// overlaps another transfer's would overwrite bytes a send still reads or
  /// another receive wrote (MPI calls such a group erroneous; sends may share
  /// a buffer). Found by sorting the transfers' byte ranges (scratch kept
  /// between groups): invalid_argument naming both, before anything runs.
  status check_overlaps() {
    spans_.clear();
    for (std::size_t i = 0; i < transfers_.size(); ++i) {
      const p2p_transfer& t = transfers_[i];
      const void* p = t.is_send ? static_cast<const void*>(t.send) : t.recv;
      if (t.bytes != 0 && p != nullptr) spans_.push_back(span{reinterpret_cast<std::uintptr_t>(p), i});
    }
    std::sort(spans_.begin(), spans_.end(), [](const span& a, const span& b) { return a.at < b.at; });
    // Sweep in address order: the furthest end of any earlier range and of
    // any earlier receive's; a range starting before it overlaps that one.
    std::uintptr_t any_end = 0, recv_end = 0;
    std::size_t any_i = 0, recv_i = 0;
    for (const span& s : spans_) {
      const p2p_transfer& t = transfers_[s.index];
      if (!t.is_send && s.at < any_end) return overlap(s.index, any_i);
      if (t.is_send && s.at < recv_end) return overlap(recv_i, s.index);
      const std::uintptr_t end = s.at + t.bytes;
      if (end > any_end) any_end = end, any_i = s.index;
      if (!t.is_send && end > recv_end) recv_end = end, recv_i = s.index;
    }
    return {};
  }
  // Receive `r` overlaps transfer `o`. Numbered from 1 in issue order, a
  // sendrecv counting as its send, then its receive.
  status overlap(std::size_t r, std::size_t o) const {
    const p2p_transfer &a = transfers_[r], &b = transfers_[o];
    return make_error(errc::invalid_argument,
                      "group_end(): the buffer of transfer %zu, a receive from rank %d (%p, %zu bytes), overlaps "
                      "that of transfer %zu, a %s rank %d (%p, %zu bytes): a receive's buffer must not overlap "
                      "any other send or receive of its group",
                      r + 1, a.peer, static_cast<const void*>(a.recv), a.bytes, o + 1,
                      b.is_send ? "send to" : "receive from", b.peer,
                      b.is_send ? static_cast<const void*>(b.send) : static_cast<const void*>(b.recv), b.bytes);
  }

  struct span {
    std::uintptr_t at;
    std::size_t index;  ///< into transfers_
  };

  int depth_ = 0;                        ///< group_start() minus group_end()
  std::vector<op_desc> calls_;           ///< the collectives, in issue order
  std::vector<p2p_transfer> transfers_;  ///< the point-to-point calls' transfers
  std::vector<span> spans_;              ///< check_overlaps()'s scratch
};

}  // namespace cclite::detail
