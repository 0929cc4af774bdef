// cclite/tcp/link.hpp - a connected TCP link to one peer: striped sockets + staging rings.
//
// A link owns nsocks connected non-blocking sockets and two staging rings of
// `capacity` bytes (send and recv), allocated and touched once at connect.
//
// Its parts: link_stripes.hpp (which stream bytes each socket carries, and the
// sendmsg/recvmsg that move them), link_wait.hpp (the spin-then-sleep loop
// behind wait() and flush(), and error recording); both are included at the
// end of this header.
//
// Progress happens inside poll() and wait(), on the caller's thread: every
// call pushes pending output *and* pulls input, whichever direction the
// caller is interested in, so that a ring of ranks that all send before they
// receive cannot deadlock. Optionally (`eager` > 0, CCLITE_TCP_EAGER)
// send_commit() also pushes, without blocking, once `eager` bytes are pending.
// Off by default: neutral over loopback, slower over veth in measurements
// (docs/performance.md, "Session 3: TCP").
//
// Granularity: TCP delivers any number of bytes, so recv_peek() may end in the
// middle of an element; callers take whole elements and wait for the rest (the
// primitives do: align_down + wait). Rounding the exposed prefix to 8 bytes
// instead would deadlock two ranks that exchange, say, 2 fp16 elements each
// before the end-of-collective padding. Because the rings are multiples of
// 4096 and every collective starts 8-aligned, a peeked region never *begins*
// inside an element and the ring wrap never splits one.
//
// Direct windows (transport/direct.hpp): a message of at least `direct_min`
// bytes (CCLITE_TCP_DIRECT) may move between the sockets and the caller's
// buffer without the rings. A window is a range [lo, hi) of stream positions
// that maps to the caller's memory instead of the ring (gather() maps every
// position either way, so striping is unchanged). Send side: the window starts
// at the stream's end and the ring stays closed until it has all left, so
// positions after it start on an empty ring. Receive side: the window starts
// at the reader's position; what read-ahead already landed in the ring is
// copied out once, and positions after the window still land in the ring
// within its usual limit (consumed + capacity), which cannot collide: the
// window's own ring positions were copied out.
//
// Errors (sticky: once a link failed, every later poll()/wait() returns the
// same status): peer_lost (EOF, ECONNRESET, EPIPE, keepalive timeout),
// system_error, invalid_argument (commit/consume beyond what was reserved/
// peeked); wait() adds timeout and aborted, which are not sticky.
#pragma once

#include <poll.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
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
  /// at which send_commit() pushes (0: only poll()/wait() push); `silent_s`:
  /// the sockets' silent limit (socket.hpp), named when it is reached.
CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  static result<link> create(int peer, std::string peer_desc, socket_fd* socks, int nsocks,
                             std::size_t block, std::size_t capacity,
                             const std::atomic<bool>* aborted,
                             std::chrono::microseconds spin = std::chrono::microseconds(200),
                             std::size_t eager = 0, int silent_s = detail::default_silent_s,
                             std::size_t direct_min = 0) {
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
    l.silent_s_ = silent_s;
    l.direct_min_ = direct_min;
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
    if (CCLITE_UNLIKELY(sbuf_ != nullptr)) return {};  // a direct send owns the stream's end
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
    if (CCLITE_UNLIKELY(committed_ + n - sent_ > cap_ || sbuf_ != nullptr)) {
      fail(make_error(errc::invalid_argument, "send_commit(%zu) beyond the reserved space (link to %s)",
                      n, desc_.c_str()));
      return;
    }
    committed_ += n;
    if (eager_ != 0 && committed_ - sent_ >= eager_ && error_.ok()) push_all();
  }

  // ---- recv side -----------------------------------------------------------

  /// Contiguous received bytes (may be empty; may end inside an element).
  const_bytes recv_peek() const noexcept {
    if (CCLITE_UNLIKELY(rbuf_ != nullptr)) return {};  // a direct receive owns the next bytes
    std::uint64_t off = consumed_ % cap_;
    std::uint64_t n = std::min<std::uint64_t>(received_ - consumed_, cap_ - off);
    return {mem_.data() + cap_ + off, static_cast<std::size_t>(n)};
  }

  /// Releases n peeked bytes; their ring space takes new data on the next poll.
  void recv_consume(std::size_t n) noexcept {
    if (CCLITE_UNLIKELY(consumed_ + n > received_ || rbuf_ != nullptr)) {
      fail(make_error(errc::invalid_argument, "recv_consume(%zu) beyond the received bytes (link to %s)",
                      n, desc_.c_str()));
      return;
    }
    consumed_ += n;
  }

  // ---- direct windows (transport/direct.hpp) ---------------------------------

  /// Opens a send window of `total` bytes from `src` at the stream's end, of
  /// which src[0..ready) may go now. false (nothing changed): below the
  /// threshold (a quarter of it for an `exchange`: direct.hpp), the link
  /// failed, or a window is open.
  bool send_direct_begin(const std::uint8_t* src, std::size_t ready, std::size_t total,
                         bool exchange = false) noexcept {
    if (!direct_worth(total, exchange) || sbuf_ != nullptr || !error_.ok() || ready > total) return false;
    sbuf_ = src;
    slo_ = shi_ = committed_;
    stotal_ = total;
    send_direct_extend(ready);
    return true;
  }
  /// src[0..ready) may go now (ready grows; at most the window's total).
  void send_direct_extend(std::size_t ready) noexcept {
    const std::uint64_t hi = slo_ + std::min<std::uint64_t>(ready, stotal_);
    if (sbuf_ == nullptr || hi <= shi_) return;
    shi_ = committed_ = hi;
    if (error_.ok()) push_all();  // what the kernel takes now leaves now
  }
  /// Bytes up to the window's end not yet handed to the kernel.
  std::size_t send_direct_left() const noexcept {
    return sbuf_ != nullptr && sent_ < shi_ ? static_cast<std::size_t>(shi_ - sent_) : 0;
  }
  /// Closes the send window. If some of it has not left (the caller gave up:
  /// `why`), the link fails with `why`: nothing may read src afterwards.
  void send_direct_end(const status& why) {
    if (sbuf_ == nullptr) return;
    if (std::max(sent_, slo_) < shi_) abandon("send", why);  // bytes of src still to go
    sbuf_ = nullptr;
    slo_ = shi_ = stotal_ = 0;
  }

  /// The next `bytes` of the stream land in `out`. false (nothing changed):
  /// below the threshold (as send_direct_begin), the link failed, or a
  /// window is open.
  bool recv_direct_begin(std::uint8_t* out, std::size_t bytes, bool exchange = false) noexcept {
    if (!direct_worth(bytes, exchange) || rbuf_ != nullptr || !error_.ok()) return false;
    rlo_ = rseen_ = consumed_;
    rhi_ = consumed_ + bytes;
    // Read-ahead: copy out of the ring what the sockets already landed of
    // the window (block by block: each socket reached its own point).
    std::uint64_t reached = rlo_;
    for (int j = 0; j < n_; ++j) reached = std::max(reached, rpos_[j]);
    const std::uint64_t end = std::min(reached, rhi_);
    for (std::uint64_t p = rlo_; p < end;) {
      const int j = static_cast<int>((p / block_) % static_cast<std::uint64_t>(n_));
      const std::uint64_t off = p % cap_;
      const std::uint64_t len = std::min({block_end(p), end, p + (cap_ - off)}) - p;
      const std::uint64_t landed = rpos_[j] > p ? std::min(len, rpos_[j] - p) : 0;
      if (landed) std::memcpy(out + (p - rlo_), mem_.data() + cap_ + off, static_cast<std::size_t>(landed));
      p += len;
    }
    rbuf_ = out;
    return true;
  }
  /// Length of the prefix of the receive window that is complete.
  std::size_t recv_direct_arrived() noexcept {
    if (rbuf_ == nullptr) return 0;
    rseen_ = std::min(received_, rhi_);
    return static_cast<std::size_t>(rseen_ - rlo_);
  }
  /// Closes the receive window: its bytes are consumed. If some have not
  /// arrived (the caller gave up: `why`), the link fails with `why`: no
  /// socket may land bytes in `out` afterwards.
  void recv_direct_end(const status& why) {
    if (rbuf_ == nullptr) return;
    if (received_ < rhi_) abandon("receive", why);
    else consumed_ = rhi_;
    rbuf_ = nullptr;
    rlo_ = rhi_ = rseen_ = 0;
  }

  // ---- progress ------------------------------------------------------------

  /// Pushes committed bytes to the sockets and pulls arrived bytes into the
  /// recv ring, without blocking. Errors: peer_lost, system_error (sticky).
  status poll() {
    if (CCLITE_UNLIKELY(!error_.ok())) return error_;
    push_all();
    pull_ready();
    return error_;
  }

  /// Whether the peer is still there, without blocking: poll(), then
  /// peer_lost (sticky) if a socket reached end of stream. For waits outside
  /// any call on this link (a set-up meeting in the store,
  /// comm_core::watch_members), where a peer that closed its end failed.
  status probe_peer() {
    CCLITE_TRY(poll());
    if (closed_mask_ == 0) return {};
    return fail(make_error(errc::peer_lost, "connection to %s lost: connection closed by peer (end of stream)",
                           desc_.c_str()));
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
      // With a direct window open: new bytes in it / all its ready bytes gone.
      const bool in = rbuf_ != nullptr ? received_ > rseen_ : !recv_peek().empty();
      const bool out = sbuf_ != nullptr ? sent_ >= shi_ : !send_reserve(1).empty();
      return (want_recv && in) || (want_send && out);
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
  /// Socket j's descriptor (0 <= j < nsocks()), to read or add socket options
  /// (SO_PRIORITY, IP_TOS, ...); the link owns it: never close, read or write it.
  int native_handle(int j) const noexcept { return fds_[j].get(); }
  std::size_t block() const noexcept { return static_cast<std::size_t>(block_); }
  std::size_t capacity() const noexcept { return static_cast<std::size_t>(cap_); }
  /// Total bytes committed / received so far (stream positions; tests, logs).
  std::uint64_t bytes_committed() const noexcept { return committed_; }
  std::uint64_t bytes_received() const noexcept { return received_; }

 private:
  link() = default;

  // A window for `bytes`: from direct_min_, or a quarter of it when the verb
  // waits for the other direction anyway (an exchange: sendrecv, where
  // windows measured +40-60 % at 256-512 KiB and a lone send or receive
  // lost; docs/performance.md, "Session 39").
  bool direct_worth(std::size_t bytes, bool exchange) const noexcept {
    return direct_min_ != 0 && bytes >= (exchange ? direct_min_ / 4 : direct_min_);
  }

  static constexpr int max_iov = 16;

  // Striping (link_stripes.hpp).
  std::uint64_t block_end(std::uint64_t pos) const noexcept;
  std::uint64_t advance(std::uint64_t pos, std::uint64_t bytes) const noexcept;
  int gather(std::uint64_t pos, std::uint64_t limit, std::uint8_t* ring, std::uint8_t* win,
             std::uint64_t win_lo, std::uint64_t win_hi, iovec* iov, std::uint64_t& want) const noexcept;
  // Where socket j may land received bytes up to (exclusive stream position).
  std::uint64_t recv_room_end() const noexcept {
    return rbuf_ != nullptr ? std::max(rhi_, consumed_ + cap_) : consumed_ + cap_;
  }
  void push(int j);
  void push_all() {
    for (int j = 0; j < n_ && error_.ok(); ++j) push(j);
  }
  void pull_ready();
  void pull_polled(const pollfd* fds);
  void pull(int j);

  // Waiting and errors (link_wait.hpp).
  template <class Done>
  status progress_until(deadline until, bool needs_peer_reading, wait_for w, Done done);
  bool io_error(int e, int j);
  bool recv_starved_by_eof() const noexcept;
  status timeout_error(wait_for w, clock::time_point) const;
  const status& fail(status s);
  void abandon(const char* what, const status& why);

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
  int silent_s_ = detail::default_silent_s;
  const std::atomic<bool>* aborted_ = nullptr;
  // Direct windows (null buffer: none open): send positions [slo_, shi_) come
  // from sbuf_ (stotal_: the window's announced size); receive positions
  // [rlo_, rhi_) land in rbuf_, the reader has seen them up to rseen_.
  std::uint64_t direct_min_ = 0;  // 0: never
  const std::uint8_t* sbuf_ = nullptr;
  std::uint64_t slo_ = 0, shi_ = 0, stotal_ = 0;
  std::uint8_t* rbuf_ = nullptr;
  std::uint64_t rlo_ = 0, rhi_ = 0, rseen_ = 0;
  std::string desc_;  // "rank 3 (node1, pid 4242)"
  status error_;
};

static_assert(is_link_v<link>, "tcp::link must model the link concept");

}  // namespace cclite::tcp

// The private helpers' definitions, in the order they had inside the class:
// that order decides the layout of the emitted code, which stays as it was.
#include <cclite/tcp/link_stripes.hpp>
#include <cclite/tcp/link_wait.hpp>
