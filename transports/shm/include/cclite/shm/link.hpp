// cclite/shm/link.hpp - one connected shm link: two FIFOs in a segment shared with one peer.
//
// What it is for: the link type of cclite::shm::transport (transport/concept.hpp
// describes the API). Made only by transport::connect(); movable (it lives in a
// std::variant), not copyable. Destroying it marks our sending direction
// closed, wakes the peer (which then gets errc::peer_lost once it has drained
// what we sent) and unmaps the segment. close_because() does the same and
// tells the peer why (this rank failed): its peer_lost carries the reason.
//
// Hot path: send_reserve/send_commit/recv_peek/recv_consume are a few loads and
// one release store; commit/consume add a fence and issue a FUTEX_WAKE only if
// the peer is asleep. wait() spins briefly (polling with sched_yield when the
// peer last waited on our CPU: see wait()), yields a few times, then sleeps on
// the futex in slices of at most 50 ms, checking after each slice the
// deadline (errc::timeout), the communicator's abort flag (errc::aborted), the
// peer's closed flag and whether the peer process still exists (errc::peer_lost).
//
// Threading: a link is driven by one thread at a time.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/shm/doorbell.hpp>
#include <cclite/shm/fifo.hpp>
#include <cclite/shm/segment.hpp>
#include <cclite/transport/concept.hpp>

namespace cclite::shm {

/// How wait() blocks. Defaults: see transport options (CCLITE_SHM_SPIN_US).
struct wait_policy {
  /// Busy-poll (with a pause instruction) this long first.
  std::chrono::nanoseconds spin{std::chrono::microseconds(10)};
  /// Then call sched_yield() this many times.
  int yields = 8;
  /// Then sleep on the futex in slices of at most this, checking deadline, abort
  /// flag and peer liveness after each.
  std::chrono::nanoseconds slice{std::chrono::milliseconds(50)};
};

namespace detail {

/// False only if process `pid` certainly no longer runs: kill(pid, 0) says
/// ESRCH, or /proc says it is a zombie (killed, not yet reaped by its parent).
inline bool process_alive(int pid) noexcept {
  if (pid <= 0) return true;  // unknown: rely on the closed flag and the deadline
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // open/read, not fopen: a FILE is heap-allocated, and this runs inside
  // collectives (no allocation once set up; tests/alloc_test.cpp).
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* rp = std::strrchr(buf, ')');  // "pid (comm) S ...": comm may hold spaces and ')'
  if (!rp || rp[1] != ' ') return true;
  return rp[2] != 'Z' && rp[2] != 'X';
}

/// "pid:[4026531836]": equal for processes that see each other's pids.
inline std::string pid_namespace() {
  char buf[128];
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  if (n <= 0) return "?";
  return std::string(buf, static_cast<std::size_t>(n));
}
}  // namespace detail

class link {
 public:
  /// Everything connect() hands over. `side` 0 is the lower rank of the pair.
  struct parts {
    segment seg;
    int side = 0;
    int peer = -1;
    int peer_pid = 0;  ///< 0: the peer's pid is not meaningful here (other pid namespace)
    std::string peer_desc;
    const std::atomic<bool>* aborted = nullptr;
    wait_policy policy;
  };

  explicit link(parts p) noexcept
      : seg_(std::move(p.seg)),
        peer_(p.peer),
        peer_pid_(p.peer_pid),
        peer_desc_(std::move(p.peer_desc)),
        aborted_(p.aborted),
        policy_(p.policy) {
    hdr_ = static_cast<segment_header*>(seg_.data());
    const int out = p.side, in = 1 - p.side;  // fifo[0] flows lo -> hi
    const std::size_t cap = static_cast<std::size_t>(hdr_->capacity);
    out_ = fifo_writer(&hdr_->fifo[out], hdr_->ring(out), cap);
    in_ = fifo_reader(&hdr_->fifo[in], hdr_->ring(in), cap);
    my_bell_ = &hdr_->bell[p.side];
    peer_bell_ = &hdr_->bell[1 - p.side];
    prefault(hdr_->ring(out), hdr_->ring(in), cap);
  }

  link(const link&) = delete;
  link& operator=(const link&) = delete;

  // MAP_POPULATE maps a shared segment's pages but the first *write* to each
  // still faults (6-8 us per 4 KiB page on these VMs; bench/machine_limits
  // fault_shm), which made the first ~4 MiB through every FIFO slow. So this
  // side writes its outgoing ring once now (nothing was committed yet, the
  // peer reads none of it) and reads its incoming ring.
  static void prefault(std::uint8_t* out, const std::uint8_t* in, std::size_t cap) noexcept {
    std::memset(out, 0, cap);
    const volatile std::uint8_t* r = in;
    for (std::size_t i = 0; i < cap; i += 4096) (void)r[i];
  }
  link(link&& o) noexcept { take(o); }
  link& operator=(link&& o) noexcept {
    if (this != &o) {
      close();
      take(o);
    }
    return *this;
  }
  ~link() { close(); }

  /// Closes the link because this rank failed with `reason`: the peer's
  /// peer_lost says "<this rank> failed and closed its shm link: <reason>"
  /// (cut to fit 1 KiB). For the case where no store carries the job's first
  /// failure to the other ranks (its host went with the failure).
  void close_because(const std::string& reason) noexcept {
    if (!hdr_) return;
    char* r = out_.control()->close_reason;
    constexpr std::size_t room = sizeof(fifo_control::close_reason) - 1;
    std::size_t n = reason.size() < room ? reason.size() : room;
    std::memcpy(r, reason.data(), n);
    if (reason.size() > room) std::memcpy(r + room - 3, "...", 3);
    r[n] = '\0';
    close();  // publishes it: `closed` is stored with release
  }

  // ---- send side --------------------------------------------------------------
  /// Contiguous writable space in the ring, at most `max` bytes; empty when full.
  mutable_bytes send_reserve(std::size_t max) noexcept { return out_.reserve(max); }

  /// Publishes `n` bytes (n <= size of the last send_reserve()).
  void send_commit(std::size_t n) noexcept {
    if (n == 0) return;
    out_.commit(n);
    ring_if_waiting(*peer_bell_, wake_on_data);
  }

  // ---- receive side -----------------------------------------------------------
  /// Contiguous readable bytes; empty when nothing arrived.
  const_bytes recv_peek() noexcept { return in_.peek(); }

  /// Releases `n` bytes (n <= size of the last recv_peek()) back to the peer.
  void recv_consume(std::size_t n) noexcept {
    if (n == 0) return;
    in_.consume(n);
    ring_if_waiting(*peer_bell_, wake_on_space);
  }

  // ---- progress -----------------------------------------------------------------
  /// Shared memory needs no progress engine: this only reports a peer that
  /// closed its link with nothing left to read (peer_lost) or corrupt indices
  /// (protocol_error). No system call.
  status poll() {
    if (!in_.consistent() || !out_.consistent()) return corrupt();
    if (peer_closed() && !in_.readable()) return closed_error();
    return {};
  }

  /// Whether the peer is still there, without waiting: peer_lost once it
  /// closed its end (with its reason, if it gave one) or its process is gone,
  /// whatever is left to read. For waits outside any call on this link (a
  /// set-up meeting in the store, comm_core::watch_members), where a closed
  /// link means the peer failed.
  status probe_peer() const {
    if (peer_closed()) return closed_error();
    if (!detail::process_alive(peer_pid_))
      return make_error(errc::peer_lost, "%s is gone (shm peer exited or was killed)", peer_desc_.c_str());
    return {};
  }

  /// Blocks until `w` may be satisfied (recv: bytes to read; send: space to
  /// write), or returns timeout / aborted / peer_lost / protocol_error.
  status wait(wait_for w, deadline until) {
    const bool want_recv = has(w, wait_for::recv), want_send = has(w, wait_for::send);
    auto ready = [&]() noexcept {
      return (want_recv && in_.readable()) || (want_send && out_.writable());
    };
    if (!want_recv && !want_send) return {};
    if (ready()) return {};
    const auto start = clock::now();
    // Peer on our CPU (both ranks on one CPU: at start-up before the load
    // balancer separates them, or more ranks than cores): a busy spin only
    // keeps it off the CPU (8 B allreduce, 2 ranks pinned to one CPU: ~17-20
    // us per call), so the spin phase polls with sched_yield() instead, for
    // the same time. Each side publishes the CPU it waits on; on different
    // CPUs nothing changes.
    const bool shared_cpu = publish_cpu();
    if (policy_.spin.count() > 0) {
      const auto spin_until = start + policy_.spin;
      for (unsigned i = 1;; ++i) {
        if (shared_cpu) ::sched_yield();
        else detail::cpu_relax();
        if (ready()) return {};
        if ((shared_cpu || (i & 31) == 0) && clock::now() >= spin_until) break;
      }
    }
    for (int i = 0; i < policy_.yields; ++i) {
      ::sched_yield();
      if (ready()) return {};
    }
    const std::uint32_t what = (want_recv ? wake_on_data : 0) | (want_send ? wake_on_space : 0);
    for (;;) {
      if (peer_closed()) return ready() ? status{} : closed_error();
      if (!in_.consistent() || !out_.consistent()) return corrupt();
      if (until.expired()) return until.is_slice() ? status(errc::timeout, std::string()) : timeout_error(w, start);
      if (aborted_ && aborted_->load(std::memory_order_relaxed)) {
        return make_error(errc::aborted, "communicator aborted while waiting for %s over shm",
                          peer_desc_.c_str());
      }
      if (!detail::process_alive(peer_pid_)) {
        if (ready()) return {};  // it wrote, then died: let the caller drain first
        return make_error(errc::peer_lost, "%s is gone (shm peer exited or was killed)",
                          peer_desc_.c_str());
      }
      auto slice = policy_.slice;
      if (!until.is_never()) {
        auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(until.at() - clock::now());
        if (left < slice) slice = left;
      }
      sleep_unless(*my_bell_, what, slice, ready);
      if (ready()) return {};
    }
  }

  int peer() const noexcept { return peer_; }
  const char* kind() const noexcept { return "shm"; }

  /// "rank 3 (node1, pid 4242)", for messages.
  const std::string& peer_description() const noexcept { return peer_desc_; }
  /// Bytes of each of the two FIFOs.
  std::size_t capacity() const noexcept { return out_.capacity(); }
  bool valid() const noexcept { return hdr_ != nullptr; }

 private:
  // Stores 1 + this CPU for the peer; true if the peer last waited on it too.
  bool publish_cpu() noexcept {
    const int c = ::sched_getcpu();
    if (c < 0) return false;
    const auto mine = static_cast<std::uint32_t>(c) + 1;
    if (out_.control()->cpu.load(std::memory_order_relaxed) != mine)
      out_.control()->cpu.store(mine, std::memory_order_relaxed);
    return in_.control()->cpu.load(std::memory_order_relaxed) == mine;
  }

  bool peer_closed() const noexcept {
    return in_.control()->closed.load(std::memory_order_acquire) != 0;
  }

  // After peer_closed() (acquire): the reason, if any, is complete.
  status closed_error() const {
    const char* why = in_.control()->close_reason;
    const std::size_t n = ::strnlen(why, sizeof(fifo_control::close_reason));
    if (n > 0 && n < sizeof(fifo_control::close_reason))
      return status(errc::peer_lost, peer_desc_ + " failed and closed its shm link: " + std::string(why, n));
    return make_error(errc::peer_lost,
                      "%s closed its shm link (peer exited or destroyed its communicator "
                      "mid-stream)",
                      peer_desc_.c_str());
  }

  status corrupt() const {
    return make_error(errc::protocol_error,
                      "shm FIFO shared with %s is corrupt (indices more than %zu bytes apart)",
                      peer_desc_.c_str(), out_.capacity());
  }

  // No duration in the text: callers wait in slices and know how long they
  // have been blocked (the primitives add it).
  status timeout_error(wait_for w, clock::time_point) const {
    const char* what = w == wait_for::recv   ? "data from"
                       : w == wait_for::send ? "FIFO space (receiver not draining) at"
                                             : "data from or FIFO space at";
    return make_error(errc::timeout, "timed out waiting for %s %s over shm", what,
                      peer_desc_.c_str());
  }

  void close() noexcept {
    if (!hdr_) return;
    out_.control()->closed.store(1, std::memory_order_release);
    ring(*peer_bell_);
    hdr_ = nullptr;
    seg_ = segment();  // munmap
  }

  void take(link& o) noexcept {
    seg_ = std::move(o.seg_);
    hdr_ = std::exchange(o.hdr_, nullptr);
    out_ = o.out_;
    in_ = o.in_;
    my_bell_ = o.my_bell_;
    peer_bell_ = o.peer_bell_;
    peer_ = o.peer_;
    peer_pid_ = o.peer_pid_;
    peer_desc_ = std::move(o.peer_desc_);
    aborted_ = o.aborted_;
    policy_ = o.policy_;
  }

  segment seg_;
  segment_header* hdr_ = nullptr;  // null: moved from / closed
  fifo_writer out_;
  fifo_reader in_;
  doorbell* my_bell_ = nullptr;
  doorbell* peer_bell_ = nullptr;
  int peer_ = -1;
  int peer_pid_ = 0;
  std::string peer_desc_;
  const std::atomic<bool>* aborted_ = nullptr;
  wait_policy policy_;
};

}  // namespace cclite::shm
