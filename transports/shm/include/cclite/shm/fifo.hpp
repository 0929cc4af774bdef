// cclite/shm/fifo.hpp - single-producer single-consumer byte ring in shared memory.
//
// What it is for: one direction of a shm link. The sender writes straight into
// the ring (reserve/commit), the receiver reads or reduces straight out of it
// (peek/consume); nothing is copied in between and nothing is allocated.
//
// Shared state, per direction (fifo_control, in the segment header):
//   head    total bytes ever written. Only the sender stores it (release).
//   tail    total bytes ever read. Only the receiver stores it (release).
//   closed  set once by the sender's link destructor (normal exit mid-stream).
//   cpu     1 + the CPU the sender last waited on (0: unknown); same line as
//           closed, written only by the sender's link (shm::link::wait).
//   close_reason  why the sender closed, when it closed because it failed
//           (NUL-terminated, "" for a plain close): written before closed
//           (release), read after it (acquire), so the peer's error can say
//           what went wrong where the store that would have told it is gone.
// head and tail sit on separate 128-byte blocks (two 64-byte lines: the
// adjacent-line prefetcher must not pull one with the other), so the two sides
// never write the same cache line. Bytes in flight = head - tail <= capacity.
//
// Each side also keeps private copies (fifo_writer / fifo_reader): its own
// index and the last seen value of the peer's index, re-read only when the
// cached one cannot satisfy a request, so a steady stream touches the peer's
// cache line once per refill rather than once per call.
//
// Regions returned by reserve()/peek() are contiguous and never cross the ring
// end; the capacity is a multiple of 4096, so a stream kept aligned to the
// element size never sees an element split (transport/concept.hpp).
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>

#include <cclite/core/bytes.hpp>
#include <cclite/core/status.hpp>
#include <cclite/shm/doorbell.hpp>

namespace cclite::shm {

inline constexpr std::size_t fifo_min_capacity = std::size_t(64) << 10;     // 64 KiB
inline constexpr std::size_t fifo_max_capacity = std::size_t(1) << 30;      // 1 GiB
inline constexpr std::size_t fifo_default_capacity = std::size_t(4) << 20;  // 4 MiB
inline constexpr std::size_t fifo_granule = 4096;

/// A requested capacity (CCLITE_SHM_BUFFSIZE) made valid: rounded up to a
/// multiple of 4096, at least 64 KiB. Non-positive or above 1 GiB: invalid_argument.
inline result<std::size_t> fifo_capacity(std::int64_t requested) {
  if (requested <= 0 || static_cast<std::uint64_t>(requested) > fifo_max_capacity) {
    return make_error(errc::invalid_argument,
                      "CCLITE_SHM_BUFFSIZE=%lld is out of range (accepted: 1 .. 1G bytes, "
                      "e.g. 4M; rounded up to a multiple of 4096, at least 64K)",
                      static_cast<long long>(requested));
  }
  std::size_t c = align_up(static_cast<std::size_t>(requested), fifo_granule);
  return c < fifo_min_capacity ? fifo_min_capacity : c;
}

/// One direction's shared indices. Zero-filled memory is the initial state.
struct fifo_control {
  alignas(128) std::atomic<std::uint64_t> head{0};
  alignas(128) std::atomic<std::uint64_t> tail{0};
  alignas(128) std::atomic<std::uint32_t> closed{0};
  std::atomic<std::uint32_t> cpu{0};
  char close_reason[1016];  // with closed and cpu: 1 KiB, written only by the sender
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the shm FIFO needs lock-free 64-bit atomics (a lock would live in one process)");

/// Sender's view of one direction.
class fifo_writer {
 public:
  fifo_writer() noexcept = default;
  fifo_writer(fifo_control* ctl, std::uint8_t* data, std::size_t capacity) noexcept
      : ctl_(ctl), data_(data), cap_(capacity) {
    head_ = ctl->head.load(std::memory_order_relaxed);
    tail_seen_ = ctl->tail.load(std::memory_order_acquire);
    off_ = static_cast<std::size_t>(head_ % cap_);
  }

  /// Contiguous free space at the write position, at most `max` bytes (may be empty).
  mutable_bytes reserve(std::size_t max) noexcept {
    std::size_t want = cap_ - off_;
    if (max < want) want = max;
    std::size_t free = free_with(tail_seen_);
    if (free < want) {
      tail_seen_ = ctl_->tail.load(std::memory_order_acquire);
      free = free_with(tail_seen_);
    }
    return {data_ + off_, free < want ? free : want};
  }

  /// Publishes `n` bytes written into the last reserve()d region.
  void commit(std::size_t n) noexcept {
    assert(n <= cap_ - off_ && n <= free_with(tail_seen_));
    head_ += n;
    off_ += n;
    if (off_ == cap_) off_ = 0;
    ctl_->head.store(head_, std::memory_order_release);
  }

  /// True if at least one byte can be written now (re-reads the receiver's tail).
  bool writable() noexcept {
    tail_seen_ = ctl_->tail.load(std::memory_order_acquire);
    return free_with(tail_seen_) > 0;
  }

  /// Bytes committed but not consumed yet, as of the last look at the tail.
  std::uint64_t in_flight() const noexcept { return head_ - tail_seen_; }
  bool consistent() const noexcept { return head_ - tail_seen_ <= cap_; }
  std::size_t capacity() const noexcept { return cap_; }
  fifo_control* control() const noexcept { return ctl_; }

 private:
  std::size_t free_with(std::uint64_t tail) const noexcept {
    std::uint64_t used = head_ - tail;
    return used >= cap_ ? 0 : static_cast<std::size_t>(cap_ - used);
  }

  fifo_control* ctl_ = nullptr;
  std::uint8_t* data_ = nullptr;
  std::size_t cap_ = 0;
  std::uint64_t head_ = 0;       // mine: only this side writes it
  std::uint64_t tail_seen_ = 0;  // the receiver's, as last read
  std::size_t off_ = 0;          // head_ % cap_, kept incrementally (no division)
};

/// Receiver's view of one direction.
class fifo_reader {
 public:
  fifo_reader() noexcept = default;
  fifo_reader(fifo_control* ctl, std::uint8_t* data, std::size_t capacity) noexcept
      : ctl_(ctl), data_(data), cap_(capacity) {
    tail_ = ctl->tail.load(std::memory_order_relaxed);
    head_seen_ = ctl->head.load(std::memory_order_acquire);
    off_ = static_cast<std::size_t>(tail_ % cap_);
  }

  /// Contiguous readable bytes at the read position (may be empty).
  const_bytes peek() noexcept {
    std::size_t to_end = cap_ - off_;
    std::size_t avail = avail_with(head_seen_);
    if (avail < to_end) {
      head_seen_ = ctl_->head.load(std::memory_order_acquire);
      avail = avail_with(head_seen_);
    }
    return {data_ + off_, avail < to_end ? avail : to_end};
  }

  /// Releases `n` bytes of the last peek()ed region back to the sender.
  void consume(std::size_t n) noexcept {
    assert(n <= cap_ - off_ && n <= avail_with(head_seen_));
    tail_ += n;
    off_ += n;
    if (off_ == cap_) off_ = 0;
    ctl_->tail.store(tail_, std::memory_order_release);
  }

  /// True if at least one byte is readable now (re-reads the sender's head).
  bool readable() noexcept {
    if (avail_with(head_seen_) > 0) return true;
    head_seen_ = ctl_->head.load(std::memory_order_acquire);
    return avail_with(head_seen_) > 0;
  }

  /// head - tail must stay within [0, capacity]; anything else is a corrupt peer.
  bool consistent() const noexcept { return head_seen_ - tail_ <= cap_; }
  std::size_t capacity() const noexcept { return cap_; }
  fifo_control* control() const noexcept { return ctl_; }

 private:
  // A corrupt head (more than a ring ahead, or behind) reads as "nothing there":
  // regions stay inside the ring whatever the peer wrote.
  std::size_t avail_with(std::uint64_t head) const noexcept {
    std::uint64_t a = head - tail_;
    return a > cap_ ? 0 : static_cast<std::size_t>(a);
  }

  fifo_control* ctl_ = nullptr;
  std::uint8_t* data_ = nullptr;
  std::size_t cap_ = 0;
  std::uint64_t tail_ = 0;       // mine
  std::uint64_t head_seen_ = 0;  // the sender's, as last read
  std::size_t off_ = 0;          // tail_ % cap_
};

/// The segment between ranks lo < hi: this header page, then the lo->hi ring,
/// then the hi->lo ring (each `capacity` bytes, 4096-aligned).
struct segment_header {
  static constexpr std::uint64_t magic_value = 0x31304d4853434c43ull;  // "CLCSHM01"
  static constexpr std::uint32_t version_value = 2;  // 2: fifo_control::close_reason

  std::uint64_t magic;
  std::uint32_t version;
  std::int32_t lo_rank;
  std::int32_t hi_rank;
  std::int32_t creator_pid;
  std::uint64_t capacity;
  fifo_control fifo[2];  ///< [0]: lo -> hi, [1]: hi -> lo
  doorbell bell[2];      ///< [0]: lo sleeps on it, [1]: hi sleeps on it

  static constexpr std::size_t header_bytes = align_up(sizeof(fifo_control) * 2 + 1024, 4096);
  static constexpr std::size_t segment_bytes(std::size_t capacity) {
    return header_bytes + 2 * capacity;
  }
  std::uint8_t* ring(int dir) noexcept {
    return reinterpret_cast<std::uint8_t*>(this) + header_bytes +
           static_cast<std::size_t>(dir) * static_cast<std::size_t>(capacity);
  }
};
static_assert(sizeof(segment_header) <= segment_header::header_bytes, "header page overflow");

}  // namespace cclite::shm
