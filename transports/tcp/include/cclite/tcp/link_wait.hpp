// cclite/tcp/link_wait.hpp - tcp::link's wait loop (spin, then sleep in
// poll(2)) behind wait() and flush(), and how the link records its errors.
//
// Definitions of link's private waiting and error helpers, declared in
// link.hpp, which includes this header at its end (including this one first
// works too). The errors themselves are listed in link.hpp.
//
// Waiting: wait() first spins for `spin` (default 200 us; poll(2) with a zero
// timeout, one syscall for all sockets), then sleeps in poll(2). A wake-up
// from poll(2) costs 20-40 us on a loaded VM, more than a loopback round trip;
// the spin turns most small-message waits into no sleep at all (Open MPI's
// TCP BTL never sleeps while a request is pending). Each empty spin round
// calls sched_yield(): with more runnable processes than CPUs the spin would
// otherwise hold the CPU the peer needs to answer (measured: 233 us per 8-byte
// call with one CPU hog, 32 us with the yield, 33 us without spinning).
// CCLITE_TCP_SPIN_US=0 turns the spin off. An adaptive spin (halved after a
// wait that slept) was tried and dropped: its floor fell below the round trip
// and it stayed there (45 us per call).
#pragma once

#include <poll.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <utility>

#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/hello.hpp>
#include <cclite/tcp/link.hpp>
#include <cclite/tcp/socket.hpp>
#include <cclite/transport/concept.hpp>

namespace cclite::tcp {

// The loop behind wait() and flush(): progress, then sleep in poll(2) on all
// sockets (POLLOUT where bytes are pending, POLLIN where the recv ring has
// room) for at most 50 ms, until done() or an error.
template <class Done>
inline status link::progress_until(deadline until, bool needs_peer_reading, wait_for w, Done done) {
  auto start = clock::now();
  const auto spin_end = start + spin_;
  pollfd fds[max_nsocks];
  bool polled = false;  // fds holds what the last poll(2) below found
  for (;;) {
    // Push first: a wait that only needed its bytes handed to the kernel (the
    // flush that ends a small call) is then done without a look at the
    // receive side, a syscall fewer per call. (Errors are sticky: push_all()
    // does nothing after one.)
    push_all();
    if (CCLITE_UNLIKELY(!error_.ok())) return error_;
    if (done()) return {};
    // After a poll(2), read the sockets it found readable (a socket other
    // than the one pull_ready() reads first may be); else pull_ready().
    if (polled) {
      pull_polled(fds);
    } else {
      pull_ready();
    }
    if (CCLITE_UNLIKELY(!error_.ok())) return error_;
    if (done()) return {};
    if (closed_mask_ != 0 && (needs_peer_reading || recv_starved_by_eof())) {
      return fail(make_error(errc::peer_lost,
                             "connection to %s lost: connection closed by peer (end of stream; "
                             "received %llu bytes, %llu bytes of ours not yet sent)",
                             desc_.c_str(), (unsigned long long)received_,
                             (unsigned long long)(committed_ - sent_)));
    }
    if (aborted_ && aborted_->load(std::memory_order_relaxed)) {
      return make_error(errc::aborted, "communicator aborted while waiting for %s over tcp",
                        desc_.c_str());
    }
    if (until.expired()) return until.is_slice() ? status(errc::timeout, std::string()) : timeout_error(w, start);
    for (int j = 0; j < n_; ++j) {
      short ev = 0;
      if (spos_[j] < committed_) ev |= POLLOUT;
      if (rpos_[j] < recv_room_end() && !(closed_mask_ & (1u << j))) ev |= POLLIN;
      fds[j] = pollfd{fds_[j].get(), ev, 0};
    }
    // Spin (zero-timeout polls, no progress calls in between) until
    // spin_end, then sleep.
    int r = 0;
    for (;;) {
      const bool spinning = clock::now() < spin_end;
      r = ::poll(fds, static_cast<nfds_t>(n_),
                 spinning ? 0 : static_cast<int>(until.remaining(milliseconds(50)).count()));
      if (r != 0 || !spinning) break;
      // Let a runnable peer on this CPU answer (more ranks than CPUs).
      ::sched_yield();
    }
    polled = r > 0;
    if (r < 0 && errno != EINTR) {
      return fail(make_error(errc::system_error, "poll() on the tcp link to %s failed: %s",
                             desc_.c_str(), detail::errno_text(errno).c_str()));
    }
  }
}

// Classifies a send/recv errno: false = "try later", true = failed (sticky).
inline bool link::io_error(int e, int j) {
  if (e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS || e == ENOMEM) return false;
  const char* why = nullptr;
  switch (e) {
    case ECONNRESET: case EPIPE: why = "connection reset by peer"; break;
    case ETIMEDOUT:
      fail(make_error(errc::peer_lost, "connection to %s lost: no answer to keepalive probes or retransmissions "
                      "for %d s (host down or network cut; CCLITE_TCP_KEEPALIVE sets this limit) (socket %d of %d)",
                      desc_.c_str(), silent_s_, j, n_));
      return true;
    case EHOSTUNREACH: case ENETUNREACH: case ENETDOWN: case ECONNABORTED: case ENOTCONN: break;
    default:
      fail(make_error(errc::system_error, "tcp link to %s: socket %d of %d failed: %s",
                      desc_.c_str(), j, n_, detail::errno_text(e).c_str()));
      return true;
  }
  std::string text = why ? std::string(why) : detail::errno_text(e);
  fail(make_error(errc::peer_lost, "connection to %s lost: %s (socket %d of %d)", desc_.c_str(),
                  text.c_str(), j, n_));
  return true;
}

// The socket that carries the next byte the reader needs is at end of stream.
inline bool link::recv_starved_by_eof() const noexcept {
  int j = static_cast<int>((received_ / block_) % static_cast<std::uint64_t>(n_));
  return (closed_mask_ & (1u << j)) != 0 && recv_peek().empty();
}

// No duration in the text: callers wait in slices and know how long they
// have been blocked (the primitives add it).
inline status link::timeout_error(wait_for w, clock::time_point) const {
  if (w == wait_for::send) {
    return make_error(errc::timeout,
                      "timed out waiting for %s to take data over tcp (send ring "
                      "full, %llu bytes not yet sent)",
                      desc_.c_str(), (unsigned long long)(committed_ - sent_));
  }
  return make_error(errc::timeout,
                    "timed out waiting for data from %s over tcp (%llu bytes "
                    "received so far, %llu of ours not yet sent)",
                    desc_.c_str(), (unsigned long long)received_,
                    (unsigned long long)(committed_ - sent_));
}

// A direct window closed before its bytes moved: the link must never touch
// the caller's buffer again (it may be freed now), so it fails, for good.
inline void link::abandon(const char* what, const status& why) {
  if (!error_.ok()) return;  // already failed: no socket call runs again
  fail(make_error(why.ok() ? errc::invalid_argument : why.code(),
                  "direct %s with %s abandoned midway (the link is unusable): %s", what, desc_.c_str(),
                  why.ok() ? "closed before its bytes moved" : why.message().c_str()));
}

// Records the first hard error; every later poll()/wait() returns it.
inline const status& link::fail(status s) {
  if (error_.ok()) error_ = std::move(s);
  return error_;
}

}  // namespace cclite::tcp
