// cclite/tcp/listener_probe.hpp - is a peer that has not connected yet still there?
//
// The higher rank of a pair waits in acceptor::wait_for() until the lower rank
// connects. If the lower rank's process is gone (killed before a point-to-point
// call's first connection, or during a lazy set-up), nothing would arrive until
// the deadline (CCLITE_TIMEOUT, 30 min by default). Its listener tells: a rank
// publishes its address only after listen(), and the kernel refuses connections
// to a port nobody listens on any more, so a refused probe means the process
// exited or destroyed its transport. A host that is down or cut off does not
// refuse: it does not answer at all, where a live host answers a connection in
// well under a second even when the process is busy (its kernel does); probes
// unanswered for the silent limit (the data sockets' keepalive limit: 25 s, or
// CCLITE_TCP_KEEPALIVE) mean
// the host is lost. A firewall that rejects or drops connections to the lower
// rank's port reads as "gone" too, although the job's links only ever connect
// the other way: the message names the address, whose port must then be opened.
//
// Probes are few: the first after 1 s of waiting, then every 2, 4, 8 ... up to
// 30 s, and 1 s after a refusal to confirm it (two refusals in a row: lost;
// silent probes from the first to one at least the silent limit later, 3 or
// more: lost, at ~31 s for 25 s). A live but busy peer holds them in its
// accept queue until its next wait_for(), which closes them without a word: a
// probe sends the magic "CCTP" and hangs up.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/tcp/socket.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::tcp::detail {

/// The first 4 bytes of a probe connection; the acceptor drops it silently.
inline constexpr char probe_magic[4] = {'C', 'C', 'T', 'P'};

/// silent: no answer within the wait, or the host is unreachable (no route,
/// no ARP reply); unknown: the probe could not be made.
enum class probe_answer { listening, refused, silent, unknown };

/// One connection attempt to `ep`, answered within `wait` (a live local or LAN
/// listener answers in well under a millisecond).
inline probe_answer probe_listener(const endpoint& ep, milliseconds wait) {
  auto s = make_socket(ep.family());
  if (!s) return probe_answer::unknown;
  int e = 0;
  if (::connect(s->get(), ep.sa(), ep.size()) != 0) {
    e = errno;
    if (e == EINPROGRESS || e == EINTR) {
      if (poll_one(s->get(), POLLOUT, wait) == 0) return probe_answer::silent;
      socklen_t len = sizeof e;
      if (::getsockopt(s->get(), SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
    }
  }
  if (e == ECONNREFUSED) return probe_answer::refused;
  if (e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH) return probe_answer::silent;
  if (e != 0) return probe_answer::unknown;
  (void)::send(s->get(), probe_magic, sizeof probe_magic, MSG_NOSIGNAL | MSG_DONTWAIT);
  return probe_answer::listening;  // the socket closes here
}

/// The schedule of probes for one wait, and its verdict.
class listener_probe {
 public:
  static constexpr milliseconds first{1000}, confirm{1000}, longest{30000};
  /// How long one probe waits for an answer (a LAN's round trip is far less).
  static constexpr milliseconds answer_wait{1000};
  enum class verdict { waiting, refused, silent };

  /// When the probes went unanswered first (valid after a silent verdict).
  clock::time_point silent_since() const noexcept { return silent_since_; }

  /// True when a probe is due at `now`.
  bool due(clock::time_point now) const noexcept { return now >= next_; }

  /// Records a probe's answer: refused twice in a row, or silent 3 times or
  /// more over the silent limit, and the peer is lost.
  verdict record(probe_answer a, clock::time_point now) noexcept {
    if (a == probe_answer::refused) {
      silences_ = 0;
      if (++refusals_ >= 2) return verdict::refused;
      next_ = now + confirm;
      return verdict::waiting;
    }
    refusals_ = 0;
    if (a != probe_answer::silent) {
      silences_ = 0;
    } else {
      if (silences_++ == 0) silent_since_ = now;
      if (silences_ >= 3 && now - silent_since_ >= silent_limit_) return verdict::silent;
    }
    next_ = now + interval_;
    interval_ = interval_ * 2 < longest ? interval_ * 2 : longest;
    return verdict::waiting;
  }

  /// Starts the schedule of a wait that begins at `start`. `silent_limit`:
  /// how long a host may leave connections unanswered before it counts as
  /// lost, the data sockets' (socket.hpp: CCLITE_TCP_KEEPALIVE, 25 s).
  explicit listener_probe(clock::time_point start,
                          milliseconds silent_limit = milliseconds(default_silent_s * 1000)) noexcept
      : next_(start + first), silent_limit_(silent_limit) {}

 private:
  clock::time_point next_;
  milliseconds silent_limit_;
  milliseconds interval_{2000};
  int refusals_ = 0;
  int silences_ = 0;
  clock::time_point silent_since_{};
};

}  // namespace cclite::tcp::detail
CCLITE_SETUP_CODE_END
