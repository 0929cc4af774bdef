// cclite/tcp/link.hpp - a connected TCP link to one peer: striped sockets + staging rings.
//
// A link owns nsocks connected non-blocking sockets and two staging rings of
// `capacity` bytes (send and recv), allocated and touched once at connect.
//
// Striping: the byte stream of each direction is cut into blocks of `block`
// bytes; block i travels on socket i % nsocks. No framing is needed: socket j
// carries blocks j, j+n, j+2n, ... back to back, so byte q of socket j is
// stream byte ((q / block) * n + j) * block + q % block. A sender pushes a
// partially committed block as far as it goes and continues it later; a
// receiver lands every byte directly at its stream position in the recv ring,
// and recv_peek() exposes the prefix that is complete on all sockets.
//
// Progress happens inside poll() and wait(), on the caller's thread: every
// call pushes pending output *and* pulls input, whichever direction the
// caller is interested in, so that a ring of ranks that all send before they
// receive cannot deadlock. Optionally (`eager` > 0, CCLITE_TCP_EAGER)
// send_commit() also pushes, without blocking, once `eager` bytes are pending.
// Off by default: neutral over loopback, slower over veth in measurements
// (docs/performance.md, "Session 3: TCP").
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
//
// Granularity: TCP delivers any number of bytes, so recv_peek() may end in the
// middle of an element; callers take whole elements and wait for the rest (the
// primitives do: align_down + wait). Rounding the exposed prefix to 8 bytes
// instead would deadlock two ranks that exchange, say, 2 fp16 elements each
// before the end-of-collective padding. Because the rings are multiples of
// 4096 and every collective starts 8-aligned, a peeked region never *begins*
// inside an element and the ring wrap never splits one.
//
// Errors (sticky: once a link failed, every later poll()/wait() returns the
// same status): peer_lost (EOF, ECONNRESET, EPIPE, keepalive timeout),
// system_error, invalid_argument (commit/consume beyond what was reserved/
// peeked); wait() adds timeout and aborted, which are not sticky.
#pragma once

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include <cclite/config.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/hello.hpp>
#include <cclite/tcp/socket.hpp>
#include <cclite/transport/concept.hpp>

namespace cclite::tcp {

/// A connected, reliable, ordered, bidirectional byte stream to one peer over
/// TCP (models cclite::is_link_v). Movable, not copyable; the destructor
/// closes the sockets. Built only by tcp::transport::connect().
class link {
 public:
  /// Takes ownership of `nsocks` connected sockets (socks[0..nsocks)) and maps
  /// 2 x `capacity` bytes of rings. `capacity` and `block` are multiples of
  /// 4096 (checked by the transport). `peer_desc` names the peer in errors.
  /// `spin`: how long wait() polls without sleeping; `eager`: pending bytes
  /// at which send_commit() pushes (0: only poll()/wait() push).
CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  static result<link> create(int peer, std::string peer_desc, socket_fd* socks, int nsocks,
                             std::size_t block, std::size_t capacity,
                             const std::atomic<bool>* aborted,
                             std::chrono::microseconds spin = std::chrono::microseconds(200),
                             std::size_t eager = 0) {
    auto mem = detail::mapped_memory::map(2 * capacity);
    if (!mem) {
      return make_error(errc::resource_exhausted, "%s (link to %s; lower CCLITE_TCP_BUFFSIZE=%zu)",
                        mem.error().message().c_str(), peer_desc.c_str(), capacity);
    }
    link l;
    l.peer_ = peer;
    l.desc_ = std::move(peer_desc);
    l.n_ = nsocks;
    l.block_ = block;
    l.cap_ = capacity;
    l.mem_ = std::move(mem.value());
    l.aborted_ = aborted;
    l.spin_ = spin;
    l.eager_ = eager;
    for (int j = 0; j < nsocks; ++j) {
      l.fds_[j] = std::move(socks[j]);
      l.spos_[j] = l.rpos_[j] = static_cast<std::uint64_t>(j) * block;
    }
    return {std::move(l)};  // nvcc: no implicit move into result<T> (CWG1579)
  }
CCLITE_SETUP_CODE_END

  link(link&&) noexcept = default;
  link& operator=(link&&) noexcept = default;
  link(const link&) = delete;
  link& operator=(const link&) = delete;
  ~link() = default;

  // ---- send side -----------------------------------------------------------

  /// Contiguous free space in the send ring, at most `max` bytes (may be empty).
  mutable_bytes send_reserve(std::size_t max) noexcept {
    std::uint64_t free = cap_ - (committed_ - sent_);
    std::uint64_t off = committed_ % cap_;
    std::uint64_t n = std::min<std::uint64_t>({free, cap_ - off, max});
    return {mem_.data() + off, static_cast<std::size_t>(n)};
  }

  /// Publishes n bytes written into the last reservation. With `eager` > 0,
  /// once that many bytes are pending, they are handed to the sockets that
  /// take them without blocking; otherwise (and for the rest) they leave on
  /// the next poll()/wait(). An I/O error here is returned by the next
  /// poll()/wait().
  void send_commit(std::size_t n) noexcept {
    if (CCLITE_UNLIKELY(committed_ + n - sent_ > cap_)) {
      fail(make_error(errc::invalid_argument, "send_commit(%zu) beyond the reserved space (link to %s)",
                      n, desc_.c_str()));
      return;
    }
    committed_ += n;
    if (eager_ != 0 && committed_ - sent_ >= eager_ && error_.ok()) {
      for (int j = 0; j < n_ && error_.ok(); ++j) push(j);
    }
  }

  // ---- recv side -----------------------------------------------------------

  /// Contiguous received bytes (may be empty; may end inside an element).
  const_bytes recv_peek() const noexcept {
    std::uint64_t off = consumed_ % cap_;
    std::uint64_t n = std::min<std::uint64_t>(received_ - consumed_, cap_ - off);
    return {mem_.data() + cap_ + off, static_cast<std::size_t>(n)};
  }

  /// Releases n peeked bytes; their ring space takes new data on the next poll.
  void recv_consume(std::size_t n) noexcept {
    if (CCLITE_UNLIKELY(consumed_ + n > received_)) {
      fail(make_error(errc::invalid_argument, "recv_consume(%zu) beyond the received bytes (link to %s)",
                      n, desc_.c_str()));
      return;
    }
    consumed_ += n;
  }

  // ---- progress ------------------------------------------------------------

  /// Pushes committed bytes to the sockets and pulls arrived bytes into the
  /// recv ring, without blocking. Errors: peer_lost, system_error (sticky).
  status poll() {
    if (CCLITE_UNLIKELY(!error_.ok())) return error_;
    for (int j = 0; j < n_ && error_.ok(); ++j) push(j);
    pull_ready();
    return error_;
  }

  /// Makes progress until `w` can be satisfied (recv: recv_peek() non-empty;
  /// send: send_reserve() non-empty), spinning up to `spin`, then sleeping in
  /// poll(2) on this link's sockets in slices of at most 50 ms between which
  /// the abort flag and the deadline are checked. Errors: timeout, aborted,
  /// peer_lost (also when the peer closed the link and what `w` needs can
  /// therefore never come).
  status wait(wait_for w, deadline until) {
    bool want_recv = has(w, wait_for::recv), want_send = has(w, wait_for::send);
    return progress_until(until, want_send, w, [&] {
      return (want_recv && !recv_peek().empty()) || (want_send && !send_reserve(1).empty());
    });
  }

  /// Blocks until every committed byte has been handed to the kernel, which
  /// delivers it even after the link is closed. Call before destroying a link
  /// whose last bytes the peer still needs. Errors: as wait().
  status flush(deadline until) {
    // Nothing pending (the usual case at the end of a small collective): no syscall.
    if (sent_ == committed_ && error_.ok()) return {};
    return progress_until(until, true, wait_for::send, [&] { return sent_ == committed_; });
  }

  /// Bytes committed but not yet handed to the kernel.
  std::uint64_t pending_send_bytes() const noexcept { return committed_ - sent_; }

  int peer() const noexcept { return peer_; }
  const char* kind() const noexcept { return "tcp"; }

  int nsocks() const noexcept { return n_; }
  std::size_t block() const noexcept { return static_cast<std::size_t>(block_); }
  std::size_t capacity() const noexcept { return static_cast<std::size_t>(cap_); }
  /// Total bytes committed / received so far (stream positions; tests, logs).
  std::uint64_t bytes_committed() const noexcept { return committed_; }
  std::uint64_t bytes_received() const noexcept { return received_; }

 private:
  link() = default;

  static constexpr int max_iov = 16;

  std::uint64_t block_end(std::uint64_t pos) const noexcept { return pos - pos % block_ + block_; }

  // Moves a per-socket stream position forward by `bytes` of that socket's
  // stream, jumping over the other sockets' blocks at each block end.
  std::uint64_t advance(std::uint64_t pos, std::uint64_t bytes) const noexcept {
    while (bytes > 0) {
      std::uint64_t end = block_end(pos);
      std::uint64_t take = std::min(end - pos, bytes);
      pos += take;
      bytes -= take;
      if (pos == end) pos += static_cast<std::uint64_t>(n_ - 1) * block_;
    }
    return pos;
  }

  // Fills iov with ring regions of socket j's stream from `pos` up to `limit`
  // (exclusive stream position). Returns the iov count; `want` = total bytes.
  int gather(std::uint64_t pos, std::uint64_t limit, std::uint8_t* ring, iovec* iov,
             std::uint64_t& want) const noexcept {
    int cnt = 0;
    want = 0;
    while (cnt < max_iov && pos < limit) {
      std::uint64_t be = block_end(pos);
      std::uint64_t off = pos % cap_;
      std::uint64_t len = std::min(be, limit) - pos;
      len = std::min(len, cap_ - off);
      std::uint8_t* base = ring + off;
      if (cnt > 0 && static_cast<std::uint8_t*>(iov[cnt - 1].iov_base) + iov[cnt - 1].iov_len == base) {
        iov[cnt - 1].iov_len += len;  // n == 1: consecutive blocks are adjacent
      } else {
        iov[cnt++] = iovec{base, static_cast<std::size_t>(len)};
      }
      want += len;
      pos += len;
      if (pos == be) pos += static_cast<std::uint64_t>(n_ - 1) * block_;
    }
    return cnt;
  }

  void push(int j) {
    while (spos_[j] < committed_) {
      iovec iov[max_iov];
      std::uint64_t want = 0;
      int cnt = gather(spos_[j], committed_, mem_.data(), iov, want);
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<decltype(m.msg_iovlen)>(cnt);
      ssize_t w = ::sendmsg(fds_[j].get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (!io_error(errno, j)) break;
        return;
      }
      spos_[j] = advance(spos_[j], static_cast<std::uint64_t>(w));
      if (static_cast<std::uint64_t>(w) < want) break;
    }
    std::uint64_t lo = committed_;
    for (int k = 0; k < n_; ++k) lo = std::min(lo, spos_[k]);
    sent_ = lo;
  }

  // Pulls every socket that has input. With several sockets, one zero-timeout
  // poll(2) finds the readable ones first: a recvmsg per socket that fails
  // with EAGAIN costs more (syscalls are the price of a small message, and
  // usually only one socket carries it).
  void pull_ready() {
    if (n_ == 1) {
      pull(0);
      return;
    }
    pollfd fds[max_nsocks];
    int want = 0;
    for (int j = 0; j < n_; ++j) {
      const bool room = rpos_[j] < consumed_ + cap_ && !(closed_mask_ & (1u << j));
      fds[j] = pollfd{fds_[j].get(), static_cast<short>(room ? POLLIN : 0), 0};
      want += room;
    }
    if (want == 0) return;
    int r = ::poll(fds, static_cast<nfds_t>(n_), 0);
    if (r <= 0) return;  // nothing readable (or EINTR: the next call retries)
    for (int j = 0; j < n_ && error_.ok(); ++j) {
      if (fds[j].revents != 0) pull(j);
    }
  }

  void pull(int j) {
    if (closed_mask_ & (1u << j)) return;
    while (rpos_[j] < consumed_ + cap_) {
      iovec iov[max_iov];
      std::uint64_t want = 0;
      int cnt = gather(rpos_[j], consumed_ + cap_, mem_.data() + cap_, iov, want);
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<decltype(m.msg_iovlen)>(cnt);
      ssize_t r = ::recvmsg(fds_[j].get(), &m, MSG_DONTWAIT);
      if (r == 0) {
        closed_mask_ |= 1u << j;  // orderly close; an error only if we need more (wait())
        break;
      }
      if (r < 0) {
        if (errno == EINTR) continue;
        if (!io_error(errno, j)) break;
        return;
      }
      rpos_[j] = advance(rpos_[j], static_cast<std::uint64_t>(r));
      if (static_cast<std::uint64_t>(r) < want) break;
    }
    std::uint64_t lo = rpos_[0];
    for (int k = 1; k < n_; ++k) lo = std::min(lo, rpos_[k]);
    received_ = lo;
  }

  // The loop behind wait() and flush(): progress, then sleep in poll(2) on all
  // sockets (POLLOUT where bytes are pending, POLLIN where the recv ring has
  // room) for at most 50 ms, until done() or an error.
  template <class Done>
  status progress_until(deadline until, bool needs_peer_reading, wait_for w, Done done) {
    auto start = clock::now();
    const auto spin_end = start + spin_;
    for (;;) {
      CCLITE_TRY(poll());
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
      pollfd fds[max_nsocks];
      for (int j = 0; j < n_; ++j) {
        short ev = 0;
        if (spos_[j] < committed_) ev |= POLLOUT;
        if (rpos_[j] < consumed_ + cap_ && !(closed_mask_ & (1u << j))) ev |= POLLIN;
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
      if (r < 0 && errno != EINTR) {
        return fail(make_error(errc::system_error, "poll() on the tcp link to %s failed: %s",
                               desc_.c_str(), detail::errno_text(errno).c_str()));
      }
    }
  }

  // Classifies a send/recv errno: false = "try later", true = failed (sticky).
  bool io_error(int e, int j) {
    if (e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS || e == ENOMEM) return false;
    const char* why = nullptr;
    switch (e) {
      case ECONNRESET: case EPIPE: why = "connection reset by peer"; break;
      case ETIMEDOUT: why = "no answer to keepalive probes or retransmissions (host down or network cut)"; break;
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
  bool recv_starved_by_eof() const noexcept {
    int j = static_cast<int>((received_ / block_) % static_cast<std::uint64_t>(n_));
    return (closed_mask_ & (1u << j)) != 0 && recv_peek().empty();
  }

  // No duration in the text: callers wait in slices and know how long they
  // have been blocked (the primitives add it).
  status timeout_error(wait_for w, clock::time_point) const {
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

  // Records the first hard error; every later poll()/wait() returns it.
  const status& fail(status s) {
    if (error_.ok()) error_ = std::move(s);
    return error_;
  }

  int peer_ = -1;
  int n_ = 0;
  std::uint64_t block_ = 0;
  std::uint64_t cap_ = 0;
  detail::mapped_memory mem_;  // [send ring | recv ring], cap_ bytes each
  socket_fd fds_[max_nsocks];
  // Send direction (stream positions): writer commits up to committed_; socket j
  // has sent everything of its blocks below spos_[j]; sent_ = min(spos_, committed_).
  std::uint64_t committed_ = 0;
  std::uint64_t sent_ = 0;
  std::uint64_t spos_[max_nsocks] = {};
  // Recv direction: socket j has landed everything of its blocks below rpos_[j];
  // received_ = min(rpos_); the reader released everything below consumed_.
  std::uint64_t consumed_ = 0;
  std::uint64_t received_ = 0;
  std::uint64_t rpos_[max_nsocks] = {};
  unsigned closed_mask_ = 0;  // sockets that saw end of stream
  std::chrono::microseconds spin_{200};
  std::uint64_t eager_ = 0;
  const std::atomic<bool>* aborted_ = nullptr;
  std::string desc_;  // "rank 3 (node1, pid 4242)"
  status error_;
};

static_assert(is_link_v<link>, "tcp::link must model the link concept");

}  // namespace cclite::tcp
