// cclite/shm/direct.hpp - shm-direct allreduce: every rank of a node reduces
// its slice straight from its peers' shared buffers.
//
// Each member owns one segment "/cclite-<job>-direct-<rank>" that every other
// member maps: a header with two step counters, an input area and a result
// area of `capacity` bytes each. One allreduce moves the buffer in pieces of
// at most `capacity` bytes; per piece, with `step` counting pieces:
//
//   1. copy my piece into my input area;       published = step
//   2. wait until every member published step
//   3. reduce my slice (1/L of the piece) across all input areas, in member
//      order, into my result area;              reduced = step
//   4. wait until every member reduced step; copy each member's result slice
//      into my output
//
// No ring hops: each byte crosses the memory bus a fixed number of times
// whatever L is, and a piece costs two synchronisations instead of 2(L-1)
// FIFO handshakes. Areas are reused safely without more flags: a member
// overwrites its input area (step 1 of the next piece) only after step 4,
// i.e. after everyone reduced, i.e. after everyone read it; it overwrites its
// result area (step 3 of the next piece) only after everyone published the
// next piece, i.e. after everyone finished copying the previous results.
// Each slice is computed by one member, so results are bitwise identical.
//
// Shared windows (create_window, allreduce_window): the same group with one
// area per member and no result area, where the area is the caller's data
// (communicator::alloc_shared). An allreduce of a range of the window needs
// no copy in or out: after (2), each member reduces its slice of the range
// across every member's window and writes the result into every member's
// window; after (4) every window holds the whole result. Per member: S bytes
// read, S written, the least an allreduce can move.
//
// Small calls (small_exchange, at most small_max_bytes per member): one
// all-member synchronisation instead of two, through two slots in each
// member's header page (detail/direct_small.hpp, "Small calls").
//
// The members, the header page's layout and the waits, which end on a
// killed member instead of hanging: detail/direct_core.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cclite/algorithm/schedule.hpp>
#include <cclite/config.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>
#include <cclite/core/stream_copy.hpp>
#include <cclite/shm/detail/direct_small.hpp>
#include <cclite/shm/link.hpp>
#include <cclite/shm/segment.hpp>
#include <cclite/topology/peer_info.hpp>

namespace cclite::shm {

class direct_group : public detail::direct_small {
 public:
CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  /// Collective over `members` (the peer_info of every member, the same list
  /// in the same order on each; `me` is this rank's index in it). `kv` is the
  /// communicator's store, where the shm transport published each rank's pid
  /// namespace; `job_tag` makes segment names unique per job.
  static result<std::unique_ptr<direct_group>> create(store& kv, const std::string& job_tag,
                                                       const std::vector<peer_info>& members, int me,
                                                       std::size_t capacity,
                                                       const std::atomic<bool>* aborted,
                                                       std::chrono::nanoseconds spin, deadline until) {
    return create_named(kv, job_tag, "direct", members, me, capacity, 2, aborted, spin, until);
  }

  /// The header page alone, for small calls and barriers: one page per
  /// member, where create() maps 2 x capacity more (collective, as create()).
  static result<std::unique_ptr<direct_group>> create_small(store& kv, const std::string& job_tag,
                                                             const std::vector<peer_info>& members, int me,
                                                             const std::atomic<bool>* aborted,
                                                             std::chrono::nanoseconds spin, deadline until) {
    return create_named(kv, job_tag, "small", members, me, 0, 0, aborted, spin, until);
  }

  /// A shared window of `bytes` per member (collective, as create()):
  /// window_data() is this member's, zero-filled; `id` names it (unique per
  /// communicator, the same on every member).
  static result<std::unique_ptr<direct_group>> create_window(store& kv, const std::string& job_tag, int id,
                                                              const std::vector<peer_info>& members, int me,
                                                              std::size_t bytes, const std::atomic<bool>* aborted,
                                                              std::chrono::nanoseconds spin, deadline until) {
    auto g = create_named(kv, job_tag, "win" + std::to_string(id), members, me, bytes, 1, aborted, spin, until);
    if (g) {
      g.value()->window_ = true;
      g.value()->scratch_.resize(64u << 10);
    }
    return g;
  }

 private:
  static result<std::unique_ptr<direct_group>> create_named(store& kv, const std::string& job_tag,
                                                             const std::string& what,
                                                             const std::vector<peer_info>& members, int me,
                                                             std::size_t capacity, int areas,
                                                             const std::atomic<bool>* aborted,
                                                             std::chrono::nanoseconds spin, deadline until) {
    std::unique_ptr<direct_group> g(new direct_group);
    g->me_ = me;
    g->cap_ = std::max<std::size_t>(max_dtype_size, align_down(capacity, max_dtype_size));
    g->aborted_ = aborted;
    g->spin_ = spin;
    const std::string my_ns = detail::pid_namespace();
    for (const peer_info& p : members) {
      member m;
      m.rank = p.rank;
      m.name = p.describe();
      // A pid in another pid namespace means nothing here (see transport.hpp).
      auto ns = kv.get("shm/pidns/" + std::to_string(p.rank), until);
      if (!ns) return ns.error();
      m.watch_pid = ns.value() == my_ns ? p.pid : 0;
      g->members_.push_back(std::move(m));
    }
    const std::size_t bytes = header_bytes + static_cast<std::size_t>(areas) * g->cap_;
    const int my_rank = g->members_[static_cast<std::size_t>(me)].rank;
    std::string tag;
    for (char c : job_tag)
      if (tag.size() < 150) tag += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
    const std::string name = "/cclite-" + tag + "-" + what + "-" + std::to_string(my_rank);
    const std::string key = "shm" + what + "/";
    auto own = segment::create(name, bytes);
    if (!own) return own.error();
    g->segs_.resize(g->members_.size());
    g->segs_[static_cast<std::size_t>(me)] = std::move(own.value());
    CCLITE_TRY(kv.set(key + std::to_string(my_rank), name));
    for (std::size_t i = 0; i < g->members_.size(); ++i) {
      if (static_cast<int>(i) == me) continue;
      auto peer_name = kv.get(key + std::to_string(g->members_[i].rank), until);
      if (!peer_name) return peer_name.error();
      auto s = segment::open(peer_name.value(), bytes);
      if (!s) return s.error();
      g->segs_[i] = std::move(s.value());
    }
    // Once everyone mapped every segment, the names can go: nothing is left in
    // /dev/shm if a member is killed later.
    CCLITE_TRY(kv.set(key + "mapped/" + std::to_string(my_rank), "1"));
    for (const member& m : g->members_) {
      auto ok = kv.get(key + "mapped/" + std::to_string(m.rank), until);
      if (!ok) return ok.error();
    }
    CCLITE_TRY(g->segs_[static_cast<std::size_t>(me)].unlink());
    return {std::move(g)};  // nvcc: no implicit move into result<T> (CWG1579)
  }

CCLITE_SETUP_CODE_END

 public:
  std::size_t capacity() const noexcept { return cap_; }
  /// The tag member `m` published with its last allreduce (see allreduce()).
  const std::uint8_t* tag_of(int m) const { return tag_slot(m); }

  /// Bytes of the caller's tag that allreduce() can compare across members.
  static constexpr std::size_t max_tag_bytes = 48;

  /// This member's window (create_window): capacity() bytes.
  std::uint8_t* window_data() const noexcept { return window_ ? input(me_) : nullptr; }
  /// The window of the member with communicator rank `rank` (this process
  /// maps every member's), or null when `rank` is not a member.
  std::uint8_t* window_of_rank(int rank) const noexcept {
    if (!window_) return nullptr;
    for (std::size_t m = 0; m < members_.size(); ++m)
      if (members_[m].rank == rank) return input(static_cast<int>(m));
    return nullptr;
  }

  /// In place over a window: every member's bytes [offset, offset + count x
  /// elem) become the reduction of that range across all members. Members
  /// must pass the same offset and count: both are compared (with `tag`, as
  /// in allreduce()) before anything is read, a difference is errc::mismatch.
  template <class Probe = no_probe>
  status allreduce_window(std::size_t offset, std::size_t count, const reduction& red, int divide_by,
                          deadline until, const std::uint8_t* tag = nullptr, std::size_t tag_bytes = 0,
                          int* odd = nullptr, Probe probe = Probe{}) {
    const std::size_t elem = red.elem_size, L = members_.size();
    if (!window_ || offset > cap_ || count > (cap_ - offset) / elem || offset % elem)
      return make_error(errc::invalid_argument, "shm window: range outside the window or misaligned");
    // The tag: the caller's call header, then the range (so that a rank
    // reducing another part of its window is caught even without headers).
    std::uint8_t mine[max_tag_bytes] = {};
    if (tag) std::memcpy(mine, tag, std::min<std::size_t>(tag_bytes, 32));
    const std::uint64_t range[2] = {offset, count};
    std::memcpy(mine + 32, range, sizeof range);
    const std::uint64_t step = ++step_;
    std::memcpy(tag_slot(me_), mine, max_tag_bytes);
    counter(me_, 0).store(step, std::memory_order_release);
    CCLITE_TRY(wait_all(0, step, until, probe));
    CCLITE_TRY(compare_tags(mine, max_tag_bytes, odd));
    const segments slices{count, L};
    const std::size_t first = slices.offset(static_cast<std::size_t>(me_)), len = slices.length(static_cast<std::size_t>(me_));
    // Pieces small enough that the L inputs and the result stay in cache
    // between the reduction and the copies to the other windows.
    const std::size_t piece = std::max<std::size_t>(1, (64u << 10) / elem);
    auto at_ = [&](int m, std::size_t i) { return input(m) + offset + i * elem; };
    for (std::size_t at = first; at < first + len; at += piece) {
      const std::size_t n = std::min(piece, first + len - at);
      // Members 0 and 1 reduce into their own window ("1 op 0": the same
      // value as "0 op 1", up to the sign of a zero min/max or a NaN payload;
      // every rank gets the same bits anyway, each element being computed
      // once); member >= 2 into scratch, as it reads its own input after 0's
      // and 1's.
      std::uint8_t* out = at_(me_, at);
      if (L > 1 && me_ < 2) red.inplace(out, at_(1 - me_, at), n);
      else if (L > 1) red.copy(out = scratch_.data(), at_(0, at), at_(1, at), n);
      for (std::size_t m = 2; m < L; ++m) red.inplace(out, at_(static_cast<int>(m), at), n);
      if (divide_by > 0) red.divide(out, n, divide_by);
      for (std::size_t m = 0; m < L; ++m)
        if (at_(static_cast<int>(m), at) != out) std::memcpy(at_(static_cast<int>(m), at), out, n * elem);
    }
    counter(me_, 1).store(step, std::memory_order_release);
    return wait_all(1, step, until, probe);
  }

  /// Calls of at least this many bytes write the result with stream_copy().
  static constexpr std::size_t stream_copy_min_bytes = 8u << 20;

  /// recv = reduction of every member's send (count elements); send may equal
  /// recv. Collective over the group; pieces of at most capacity() bytes.
  /// With `tag` (tag_bytes <= max_tag_bytes: the caller's description of the
  /// call, collective/mismatch.hpp): every member publishes it with its first
  /// piece and compares everyone's before reading any input, so members that
  /// called different things all return errc::mismatch, with `*odd` = a member
  /// whose tag differs (tag_of() reads it), instead of reducing garbage.
  template <class Probe = no_probe>
  status allreduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count, const reduction& red,
                   int divide_by, deadline until, const std::uint8_t* tag = nullptr, std::size_t tag_bytes = 0,
                   int* odd = nullptr, Probe probe = Probe{}) {
    const std::size_t elem = red.elem_size, L = members_.size();
    const std::size_t piece = cap_ / elem;
    // A result this large is out of cache by the time the caller reads it:
    // writing it with non-temporal stores saves the read-for-ownership of
    // every line (core/stream_copy.hpp). 2 ranks, CCLITE_ALGO=allreduce:direct,
    // out of place, 4 alternated runs: 16 MiB +8 %, 64 MiB +10 % busbw. (The
    // selector takes the ring there, faster still; the same copy in the ring's
    // last pass measured no gain.)
    const bool stream = count * elem >= stream_copy_min_bytes;
    for (std::size_t at = 0; at < count; at += piece) {
      const std::size_t n = count - at < piece ? count - at : piece;
      const std::uint64_t step = ++step_;
      std::memcpy(input(me_), send + at * elem, n * elem);
      if (tag && at == 0) std::memcpy(tag_slot(me_), tag, std::min(tag_bytes, max_tag_bytes));
      counter(me_, 0).store(step, std::memory_order_release);
      CCLITE_TRY(wait_all(0, step, until, probe));
      if (tag && at == 0) CCLITE_TRY(compare_tags(tag, tag_bytes, odd));
      const segments slices{n, L};
      const std::size_t off = slices.offset(static_cast<std::size_t>(me_)), len = slices.length(static_cast<std::size_t>(me_));
      if (len) {
        std::uint8_t* out = output(me_) + off * elem;
        if (L == 1) std::memcpy(out, input(0) + off * elem, len * elem);
        else red.copy(out, input(0) + off * elem, input(1) + off * elem, len);
        for (std::size_t m = 2; m < L; ++m) red.inplace(out, input(static_cast<int>(m)) + off * elem, len);
        if (divide_by > 0) red.divide(out, len, divide_by);
      }
      counter(me_, 1).store(step, std::memory_order_release);
      CCLITE_TRY(wait_all(1, step, until, probe));
      for (std::size_t m = 0; m < L; ++m) {
        const std::size_t o = slices.offset(m), l = slices.length(m);
        if (!l) continue;
        if (stream) stream_copy(recv + (at + o) * elem, output(static_cast<int>(m)) + o * elem, l * elem);
        else std::memcpy(recv + (at + o) * elem, output(static_cast<int>(m)) + o * elem, l * elem);
      }
    }
    if (stream) stream_fence();
    return {};
  }

 private:
  status compare_tags(const std::uint8_t* tag, std::size_t tag_bytes, int* odd) const {
    for (std::size_t m = 0; m < members_.size(); ++m) {
      if (std::memcmp(tag_slot(static_cast<int>(m)), tag, std::min(tag_bytes, max_tag_bytes)) == 0) continue;
      if (odd) *odd = static_cast<int>(m);
      return make_error(errc::mismatch, "shm-direct: %s called something else", members_[m].name.c_str());
    }
    return {};
  }

  direct_group() = default;
};

}  // namespace cclite::shm
