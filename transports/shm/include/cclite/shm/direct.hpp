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
// Waits poll the peers' counters (they are a few cache lines), then yield,
// then sleep in short slices, checking the deadline, the abort flag and the
// peers' liveness: a killed member is peer_lost, never a hang.
#pragma once

#include <sched.h>
#include <time.h>

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
#include <cclite/shm/doorbell.hpp>
#include <cclite/shm/link.hpp>
#include <cclite/shm/segment.hpp>
#include <cclite/topology/peer_info.hpp>

namespace cclite::shm {

class direct_group {
  struct member {
    int rank = -1;
    int watch_pid = 0;  // 0: not watchable (another pid namespace)
    std::string name;   // "rank 3 (node1, pid 4242)"
  };

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
  /// The default probe of the waits below (`probe()`: called every 10 ms
  /// once a wait stops spinning; a status other than ok ends the wait with
  /// it): nothing to look at.
  struct no_probe {
    status operator()() const { return {}; }
  };

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
  template <class Probe>
  status small_exchange(const std::uint8_t* send, std::size_t bytes, std::size_t read_from, std::size_t read_bytes,
                        deadline until, const std::uint8_t* tag, int* odd, Probe&& probe) {
    const std::size_t L = members_.size();
    if (bytes > small_max_bytes) return make_error(errc::invalid_argument, "shm-direct: small call over 1 KiB");
    const std::uint64_t step = ++small_step_;
    const int parity = static_cast<int>(step & 1);
    std::uint8_t* mine = small_slot(me_, parity);
    if (bytes) std::memcpy(mine + small_data_at, send, bytes);
    if (tag) std::memcpy(mine + 8, tag, small_tag_bytes);
    small_seq(me_, parity).store(step, std::memory_order_release);
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
    if (tag) {
      for (std::size_t m = 0; m < L; ++m) {
        if (std::memcmp(small_slot(static_cast<int>(m), parity) + 8, tag, small_tag_bytes) == 0) continue;
        if (odd) *odd = static_cast<int>(m);
        return make_error(errc::mismatch, "shm-direct: %s called something else", members_[m].name.c_str());
      }
    }
    return {};
  }
  /// Member `m`'s bytes in the last small_exchange(); valid until this
  /// member's next one (a member rewrites a slot only two calls later).
  const std::uint8_t* small_data(int m) const {
    return small_slot(m, static_cast<int>(small_step_ & 1)) + small_data_at;
  }

  /// recv = reduction, in member order, of `count` elements at byte `offset`
  /// of every member's slot (after small_exchange), divided by `divide_by` when > 0.
  void small_reduce(std::uint8_t* recv, std::size_t offset, std::size_t count, const reduction& red,
                    int divide_by) const {
    const std::size_t L = members_.size();
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
  // Each counter on a cache line of its own; 4096 keeps a window's data
  // page-aligned (any dtype, and vector loads, are aligned in it).
  static constexpr std::size_t header_bytes = 4096;

  status compare_tags(const std::uint8_t* tag, std::size_t tag_bytes, int* odd) const {
    for (std::size_t m = 0; m < members_.size(); ++m) {
      if (std::memcmp(tag_slot(static_cast<int>(m)), tag, std::min(tag_bytes, max_tag_bytes)) == 0) continue;
      if (odd) *odd = static_cast<int>(m);
      return make_error(errc::mismatch, "shm-direct: %s called something else", members_[m].name.c_str());
    }
    return {};
  }

  direct_group() = default;

  std::uint8_t* base(int m) const { return static_cast<std::uint8_t*>(segs_[static_cast<std::size_t>(m)].data()); }
  std::atomic<std::uint64_t>& counter(int m, int which) const {
    return *reinterpret_cast<std::atomic<std::uint64_t>*>(base(m) + 64 * which);
  }
  std::uint8_t* input(int m) const { return base(m) + header_bytes; }
  // Between the two counters' cache lines' first words: bytes 8..56.
  std::uint8_t* tag_slot(int m) const { return base(m) + 8; }
  // 1 + the CPU member m last waited on (0: unknown), after the second counter.
  std::atomic<std::uint32_t>& cpu_slot(int m) const {
    return *reinterpret_cast<std::atomic<std::uint32_t>*>(base(m) + 96);
  }
  std::uint8_t* output(int m) const { return base(m) + header_bytes + cap_; }
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

  // Until every member's counter `which` reached `step`. A member that last
  // waited on our CPU needs it to catch up: we poll with sched_yield() rather
  // than spin then (shm::link::wait does the same).
  template <class Probe>
  status wait_all(int which, std::uint64_t step, deadline until, Probe&& probe) const {
    auto behind = [&]() {
      for (std::size_t m = 0; m < members_.size(); ++m)
        if (counter(static_cast<int>(m), which).load(std::memory_order_acquire) < step) return static_cast<int>(m);
      return -1;
    };
    return wait_until(behind, probe, which == 0 ? "published its piece" : "reduced its slice", until);
  }

  // Until behind() (a member not there yet, or -1) is -1; probe() is
  // consulted with the liveness checks, every 10 ms once the spin is over.
  template <class Behind, class Probe>
  status wait_until(Behind&& behind_of, Probe&& probe, const char* what, deadline until) const {
    // A peer on another core that is in step arrives within a few hundred
    // nanoseconds: poll a little before paying for the clock (26 ns a read
    // with kvm-clock) and sched_getcpu().
    for (int i = 0; i < 32; ++i) {
      if (behind_of() < 0) return {};
      detail::cpu_relax();
    }
    const auto start = clock::now();
    auto last_check = start;
    int rounds = 0;
    const int c = ::sched_getcpu();
    const std::uint32_t mine = c < 0 ? 0 : static_cast<std::uint32_t>(c) + 1;
    if (mine && cpu_slot(me_).load(std::memory_order_relaxed) != mine) cpu_slot(me_).store(mine, std::memory_order_relaxed);
    for (;;) {
      const int behind = behind_of();
      if (behind < 0) return {};
      const auto now = clock::now();
      if (now - start < spin_) {
        if (mine && cpu_slot(behind).load(std::memory_order_relaxed) == mine) ::sched_yield();
        else detail::cpu_relax();
        continue;
      }
      if (aborted_ && aborted_->load(std::memory_order_relaxed))
        return make_error(errc::aborted, "shm-direct: aborted");
      if (now - last_check > std::chrono::milliseconds(10)) {
        last_check = now;
        CCLITE_TRY(probe());
        for (const member& m : members_)
          if (!detail::process_alive(m.watch_pid))
            return make_error(errc::peer_lost, "shm-direct: %s is gone (process exited or was killed)", m.name.c_str());
        if (until.expired()) {
          return make_error(errc::timeout, "shm-direct: %s has not %s after %.1f s",
                            members_[static_cast<std::size_t>(behind)].name.c_str(), what,
                            std::chrono::duration<double>(now - start).count());
        }
      }
      if (++rounds < 64) {
        ::sched_yield();
      } else {
        struct timespec ts{0, 20000};  // 20 us: a peer descheduled on a busy core
        ::nanosleep(&ts, nullptr);
      }
    }
  }

  std::vector<member> members_;
  std::vector<segment> segs_;
  int me_ = 0;
  std::size_t cap_ = 0;
  std::uint64_t step_ = 0;
  std::uint64_t small_step_ = 0;  // small_exchange's calls
  bool window_ = false;
  std::vector<std::uint8_t> scratch_;  // allreduce_window, member >= 2: one piece
  const std::atomic<bool>* aborted_ = nullptr;
  std::chrono::nanoseconds spin_{std::chrono::microseconds(10)};
};

}  // namespace cclite::shm
