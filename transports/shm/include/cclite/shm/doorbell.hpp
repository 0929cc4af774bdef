// cclite/shm/doorbell.hpp - cross-process sleep/wake on a futex in shared memory.
//
// What it is for: a process blocked on a shm link (no data to read, no space to
// write) must not spin forever, yet the peer that makes progress must not pay a
// system call per message when nobody sleeps. Each side of a link owns one
// doorbell in the shared segment; the classic "waiters flag" protocol gives
// both properties:
//
//   sleeper (owns the bell)                  waker (the peer)
//   s = seq (acquire)                        publish progress (head/tail, release)
//   waiting = what  ; fence(seq_cst)         fence(seq_cst)
//   if condition now true: waiting = 0       if (waiting & what): ++seq ; FUTEX_WAKE
//   else FUTEX_WAIT(&seq, s, slice)
//   waiting = 0
//
// The two seq_cst fences order "store flag, load condition" against "store
// condition, load flag": at least one side sees the other's store, so either
// the sleeper sees the progress and does not sleep, or the waker sees the flag
// and bumps `seq`, which makes a FUTEX_WAIT that has not started yet return
// EAGAIN. No lost wake-up, and no syscall when `waiting` is clear.
//
// The futex is shared (no FUTEX_PRIVATE_FLAG): the word lives in a MAP_SHARED
// segment mapped by two processes.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>

namespace cclite::shm {

/// What a sleeping side waits for (bit mask in doorbell::waiting).
inline constexpr std::uint32_t wake_on_data = 1;   ///< peer committed bytes to us
inline constexpr std::uint32_t wake_on_space = 2;  ///< peer consumed bytes we sent

/// Lives in the shared segment; zero-initialised memory is a valid initial state.
struct alignas(128) doorbell {
  std::atomic<std::uint32_t> seq{0};      ///< FUTEX word: bumped by the waker before waking
  std::atomic<std::uint32_t> waiting{0};  ///< written by the owner only: what it sleeps on
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "futex word must be lock-free");
static_assert(sizeof(std::atomic<std::uint32_t>) == 4, "futex word must be 32 bits");

namespace detail {

/// One pause/yield instruction for spin loops.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

/// FUTEX_WAIT on a shared word for at most `timeout`. Returns when woken, on a
/// signal, on timeout, or at once if *word != expected; callers re-check.
inline void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                       std::chrono::nanoseconds timeout) noexcept {
  if (timeout.count() <= 0) return;
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts,
                  nullptr, 0);
}

inline void futex_wake_all(std::atomic<std::uint32_t>* word) noexcept {
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
                  nullptr, 0);
}

}  // namespace detail

/// Waker side: call after publishing progress with a release store. Issues a
/// system call only if the owner of `bell` sleeps on one of `what`.
inline void ring_if_waiting(doorbell& bell, std::uint32_t what) noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell.waiting.load(std::memory_order_relaxed) & what) {
    bell.seq.fetch_add(1, std::memory_order_release);
    detail::futex_wake_all(&bell.seq);
  }
}

/// Waker side, unconditional (rare events: close).
inline void ring(doorbell& bell) noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bell.seq.fetch_add(1, std::memory_order_release);
  detail::futex_wake_all(&bell.seq);
}

/// Sleeper side: sleeps at most `slice` unless `ready()` turns true first.
/// Returns after a wake-up, a timeout or a signal; the caller re-checks
/// everything (deadline, abort, peer liveness) and calls again.
template <class Ready>
inline void sleep_unless(doorbell& bell, std::uint32_t what, std::chrono::nanoseconds slice,
                         Ready&& ready) noexcept {
  std::uint32_t s = bell.seq.load(std::memory_order_acquire);
  bell.waiting.store(what, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!ready()) detail::futex_wait(&bell.seq, s, slice);
  bell.waiting.store(0, std::memory_order_relaxed);
}

}  // namespace cclite::shm
