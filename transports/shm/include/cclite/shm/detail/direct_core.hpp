// cclite/shm/detail/direct_core.hpp - what every shm-direct group stands on
// (shm::direct_group, direct.hpp): its members, the segment each of them
// maps, the layout of a segment's header page, and the waits on the peers.
//
// A member's segment is a header page (header_bytes) and then its areas of
// capacity bytes each: input and result for an allreduce group, the window
// for a shared window, none for a small-call group. The header page holds
// the two step counters, each on a cache line of its own, the allreduce tag
// between them, the CPU the member last waited on, and from byte 1024 the
// small calls' two slots (direct_small.hpp).
//
// Waits poll the peers' counters (they are a few cache lines), then yield,
// then sleep in short slices, checking the deadline, the abort flag and the
// peers' liveness: a killed member is peer_lost, never a hang.
//
// Not a public header: direct.hpp includes it, through direct_small.hpp.
#pragma once

#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/shm/doorbell.hpp>
#include <cclite/shm/link.hpp>
#include <cclite/shm/segment.hpp>

namespace cclite::shm::detail {

class direct_core {
 protected:
  struct member {
    int rank = -1;
    int watch_pid = 0;  // 0: not watchable (another pid namespace)
    std::string name;   // "rank 3 (node1, pid 4242)"
  };

 public:
  /// The default probe of the waits below (`probe()`: called every 10 ms
  /// once a wait stops spinning; a status other than ok ends the wait with
  /// it): nothing to look at.
  struct no_probe {
    status operator()() const { return {}; }
  };

 protected:
  // Each counter on a cache line of its own; 4096 keeps a window's data
  // page-aligned (any dtype, and vector loads, are aligned in it).
  static constexpr std::size_t header_bytes = 4096;

  direct_core() = default;

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

}  // namespace cclite::shm::detail
