// cclite/shm/detail/direct_small.hpp - shm-direct's small-call exchange: the
// slots in each member's header page, a base of shm::direct_group.
//
// Small calls (small_exchange, at most small_max_bytes per member): one
// all-member synchronisation instead of two. Each member writes its data, its
// tag (the caller's call header, compacted) and then the call's number into
// one slot of its header page, the first 40 data bytes sharing the number's
// line, and reads what it needs from every member's slot itself: an
// allreduce reduces them all in member order (small_reduce: the same bits on
// every member), the other collectives copy or reduce their blocks
// (comm_shared.hpp, run_small_call). An 8-byte call
// moves one cache line per member and direction, where a FIFO hand-off moves
// three (head index, data, header). Two slots alternate by call parity: a
// member rewrites a slot only two calls later, after everyone published the
// next call, i.e. after everyone finished reading this one.
//
// Eager calls: a member that only gives (the root of a broadcast or scatter,
// the other members of a reduce or gather) may publish its slot and return
// without waiting (small_exchange's `eager`), as MPI's eager sends let the
// root of a small MPI_Bcast return: in a loop of such calls the members
// overlap instead of meeting once per call (2 ranks, 8-512 B broadcast and
// reduce: 0.5-0.7 us -> 0.3-0.5; docs/performance.md, "Session 33"). Nobody
// has compared its tag with the others' yet, and its slot may still be
// read, so the call is left unsettled: this member's next call, of any
// kind, first waits until every member has published it and compares the
// tags there (settle()). A mismatch is then reported by that next call, as
// the links path already does for a rank whose part of a rooted call did
// not depend on the odd rank; and when every member was eager in one call
// (each passed itself as the root) nobody has checked it until then. An
// eager member is thus at most one call ahead, which is also what keeps the
// two slots safe.
//
// Not a public header: direct.hpp includes it (direct_group derives from
// direct_small, which derives from direct_core).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>
#include <cclite/shm/detail/direct_core.hpp>

namespace cclite::shm::detail {

class direct_small : public direct_core {
 public:
  /// Largest slot a small call writes (small_exchange), in bytes.
  static constexpr std::size_t small_max_bytes = 1024;
  static constexpr std::size_t small_tag_bytes = 16;

  /// One synchronisation of a small call (see "Small calls" above): writes
  /// `bytes` of `send` (at most small_max_bytes; 0 for a member with nothing to
  /// give) and `tag` into this member's slot, publishes the call's number and
  /// waits until every member published it. Then small_data(m) holds member
  /// m's bytes until this member's next small call. `read_from`, `read_bytes`:
  /// the part of each slot the caller reads next, fetched while waiting.
  /// `tag` (small_tag_bytes, or null) is compared across members before any
  /// data is read, as in allreduce(). `probe()` is called now and then while
  /// waiting for a member: a status other than ok ends the wait with it (the
  /// communicator looks for a peer that took another path).
  /// `eager`: publish and return at once, leaving the call unsettled (see
  /// "Eager calls" above; for a member that reads nothing back). Whatever
  /// `eager`, an unsettled previous call is settled first.
  template <class Probe>
  status small_exchange(const std::uint8_t* send, std::size_t bytes, std::size_t read_from, std::size_t read_bytes,
                        deadline until, const std::uint8_t* tag, int* odd, Probe&& probe, bool eager = false) {
    const std::size_t L = members_.size();
    if (bytes > small_max_bytes) return make_error(errc::invalid_argument, "shm-direct: small call over 1 KiB");
    if (unsettled_) CCLITE_TRY(settle(until, odd, probe));
    const std::uint64_t step = ++small_step_;
    const int parity = static_cast<int>(step & 1);
    std::uint8_t* mine = small_slot(me_, parity);
    if (bytes) std::memcpy(mine + small_data_at, send, bytes);
    if (tag) std::memcpy(mine + 8, tag, small_tag_bytes);
    small_seq(me_, parity).store(step, std::memory_order_release);
    settle_failed_ = false;
    if (eager) {
      unsettled_ = true;
      unsettled_tagged_ = tag != nullptr;
      return {};
    }
    // While waiting, ask for the slots' data lines past the first one too:
    // they arrive with (not after) the line that holds the number, instead of
    // as a second cache miss once the number is seen. A line fetched before
    // its writer finished is invalidated by that write (coherence), so what is
    // read after the acquire below is current. 2 ranks, 64-512 B: 0.60-0.65 us
    // -> 0.48-0.56 (docs/performance.md, "Session 16"). Not above 512 B (nor
    // more than 16 lines in all): at 1 KiB the fetches, repeated while the
    // writers still copy, cost more than they save (0.85 -> 1.0 us).
    const std::size_t early_from = std::max<std::size_t>(64, (small_data_at + read_from) & ~std::size_t(63));
    const std::size_t early_end = read_bytes <= 512 ? small_data_at + read_from + read_bytes : 0;
    auto behind = [&]() {
      std::size_t lines = 0;
      for (std::size_t m = 0; m < L && lines < 16; ++m)
        for (std::size_t at = early_from; at < early_end && lines < 16; at += 64, ++lines)
          __builtin_prefetch(small_slot(static_cast<int>(m), parity) + at);
      for (std::size_t m = 0; m < L; ++m)
        if (small_seq(static_cast<int>(m), parity).load(std::memory_order_acquire) != step) return static_cast<int>(m);
      return -1;
    };
    CCLITE_TRY(wait_until(behind, probe, "entered this call", until));
    return tag ? compare_tags(parity, tag, odd) : status{};
  }
  /// Whether the last small call was eager and has not been settled yet.
  bool unsettled() const { return unsettled_; }
  /// Settles an eager last call (see "Eager calls" above): waits until every
  /// member has published it, then compares their tags with this member's
  /// (mismatch, *odd = the first that differs; settle_failed() is then true
  /// and small_tag_of() reads that call's tags). Nothing to do otherwise.
  template <class Probe>
  status settle(deadline until, int* odd, Probe&& probe) {
    if (!unsettled_) return {};
    const std::size_t L = members_.size();
    const std::uint64_t step = small_step_;
    const int parity = static_cast<int>(step & 1);
    auto behind = [&]() {
      for (std::size_t m = 0; m < L; ++m)
        if (small_seq(static_cast<int>(m), parity).load(std::memory_order_acquire) < step) return static_cast<int>(m);
      return -1;
    };
    CCLITE_TRY(wait_until(behind, probe, "entered the last small call (this rank had returned from it early)", until));
    unsettled_ = false;
    if (!unsettled_tagged_) return {};
    status st = compare_tags(parity, small_slot(me_, parity) + 8, odd);
    settle_failed_ = !st.ok();
    return st;
  }
  /// The last mismatch came from settle(): it is about the call before.
  bool settle_failed() const { return settle_failed_; }

  /// Member `m`'s bytes in the last small_exchange(); valid until this
  /// member's next one (a member rewrites a slot only two calls later).
  const std::uint8_t* small_data(int m) const {
    return small_slot(m, static_cast<int>(small_step_ & 1)) + small_data_at;
  }

  /// recv = reduction, in member order, of `count` elements at byte `offset`
  /// of every member's slot (after small_exchange), divided by `divide_by` when > 0.
  /// `members` >= 1: of the first `members` slots only (a prefix: scan).
  void small_reduce(std::uint8_t* recv, std::size_t offset, std::size_t count, const reduction& red,
                    int divide_by, int members = -1) const {
    const std::size_t L = members < 0 ? members_.size() : static_cast<std::size_t>(members);
    if (L == 1) {
      std::memcpy(recv, small_data(0) + offset, count * red.elem_size);
    } else {
      red.copy(recv, small_data(0) + offset, small_data(1) + offset, count);
      for (std::size_t m = 2; m < L; ++m) red.inplace(recv, small_data(static_cast<int>(m)) + offset, count);
    }
    if (divide_by > 0) red.divide(recv, count, divide_by);
  }
  /// What small_exchange() read from member `m`'s tag in the last call.
  const std::uint8_t* small_tag_of(int m) const { return small_slot(m, static_cast<int>(small_step_ & 1)) + 8; }

 protected:
  direct_small() = default;

 private:
  // small_exchange's slots, in the header page after the counters: the
  // call's number (8 bytes), the tag (16), then the data, whose first 40
  // bytes share the number's cache line (so calls up to 40 bytes move one line).
  static constexpr std::size_t small_area_at = 1024, small_data_at = 8 + small_tag_bytes;
  static constexpr std::size_t small_slot_bytes = align_up(small_data_at + small_max_bytes, 64);
  static_assert(small_area_at + 2 * small_slot_bytes <= header_bytes, "small slots overflow the header page");
  std::uint8_t* small_slot(int m, int parity) const {
    return base(m) + small_area_at + static_cast<std::size_t>(parity) * small_slot_bytes;
  }
  std::atomic<std::uint64_t>& small_seq(int m, int parity) const {
    return *reinterpret_cast<std::atomic<std::uint64_t>*>(small_slot(m, parity));
  }
  // Every member's tag in the slots of `parity` against `tag`: mismatch
  // naming the first that differs (*odd = its index), else ok.
  status compare_tags(int parity, const std::uint8_t* tag, int* odd) const {
    for (std::size_t m = 0; m < members_.size(); ++m) {
      if (std::memcmp(small_slot(static_cast<int>(m), parity) + 8, tag, small_tag_bytes) == 0) continue;
      if (odd) *odd = static_cast<int>(m);
      return make_error(errc::mismatch, "shm-direct: %s called something else", members_[m].name.c_str());
    }
    return {};
  }
  bool unsettled_ = false;         // the last call was eager (settle())
  bool unsettled_tagged_ = false;  // ... and carried a tag to compare
  bool settle_failed_ = false;     // the last mismatch was settle()'s
};

}  // namespace cclite::shm::detail
