// cclite/tcp/link_stripes.hpp - tcp::link's striping: which stream bytes each
// of its sockets carries, and the non-blocking sendmsg/recvmsg that move them.
//
// Definitions of link's private push/pull side, declared in link.hpp, which
// includes this header at its end (including this one first works too).
//
// Striping: the byte stream of each direction is cut into blocks of `block`
// bytes; block i travels on socket i % nsocks. No framing is needed: socket j
// carries blocks j, j+n, j+2n, ... back to back, so byte q of socket j is
// stream byte ((q / block) * n + j) * block + q % block. A sender pushes a
// partially committed block as far as it goes and continues it later; a
// receiver lands every byte directly at its stream position in the recv ring,
// and recv_peek() exposes the prefix that is complete on all sockets.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include <cclite/tcp/hello.hpp>
#include <cclite/tcp/link.hpp>
#include <cclite/tcp/socket.hpp>

namespace cclite::tcp {

inline std::uint64_t link::block_end(std::uint64_t pos) const noexcept { return pos - pos % block_ + block_; }

// Moves a per-socket stream position forward by `bytes` of that socket's
// stream, jumping over the other sockets' blocks at each block end.
inline std::uint64_t link::advance(std::uint64_t pos, std::uint64_t bytes) const noexcept {
  while (bytes > 0) {
    std::uint64_t end = block_end(pos);
    std::uint64_t take = std::min(end - pos, bytes);
    pos += take;
    bytes -= take;
    if (pos == end) pos += static_cast<std::uint64_t>(n_ - 1) * block_;
  }
  return pos;
}

// Fills iov with the memory of socket j's stream from `pos` up to `limit`
// (exclusive stream position): ring regions, and for positions in the direct
// window [win_lo, win_hi) the caller's buffer `win`. Returns the iov count;
// `want` = total bytes.
inline int link::gather(std::uint64_t pos, std::uint64_t limit, std::uint8_t* ring, std::uint8_t* win,
                        std::uint64_t win_lo, std::uint64_t win_hi, iovec* iov,
                        std::uint64_t& want) const noexcept {
  int cnt = 0;
  want = 0;
  while (cnt < max_iov && pos < limit) {
    std::uint64_t be = block_end(pos);
    std::uint64_t len = std::min(be, limit) - pos;
    std::uint8_t* base;
    if (pos >= win_lo && pos < win_hi) {
      base = win + (pos - win_lo);
      len = std::min(len, win_hi - pos);
    } else {
      const std::uint64_t off = pos % cap_;
      base = ring + off;
      len = std::min(len, cap_ - off);
      if (pos < win_lo) len = std::min(len, win_lo - pos);
    }
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

inline void link::push(int j) {
  while (spos_[j] < committed_) {
    iovec iov[max_iov];
    std::uint64_t want = 0;
    // sendmsg only reads the window; iovec has no const variant.
    int cnt = gather(spos_[j], committed_, mem_.data(), const_cast<std::uint8_t*>(sbuf_), slo_, shi_, iov, want);
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

// Pulls what has arrived. The socket that carries the next byte the reader
// needs (the block holding received_) is read first, without poll(2): a
// message within one block travels on that socket alone, so one recvmsg is all
// a small message costs (a poll(2) first made it two syscalls, each the price
// of a whole small call on loopback). Only when that socket delivered up to its
// block's end can the stream go on over the others (a large message): then one
// zero-timeout poll(2) finds the readable ones (a recvmsg per socket that
// fails with EAGAIN costs more). Bytes that reach another socket while this one
// lags stay in the kernel until this one catches up (received_ cannot pass it
// anyway) or until wait() polls every socket before it sleeps.
inline void link::pull_ready() {
  const int first = static_cast<int>((received_ / block_) % static_cast<std::uint64_t>(n_));
  const std::uint64_t from = rpos_[first];
  pull(first);
  if (n_ == 1 || !error_.ok() || rpos_[first] < block_end(from)) return;
  pollfd fds[max_nsocks];
  int want = 0;
  for (int j = 0; j < n_; ++j) {
    const bool room = j != first && rpos_[j] < recv_room_end() && !(closed_mask_ & (1u << j));
    fds[j] = pollfd{fds_[j].get(), static_cast<short>(room ? POLLIN : 0), 0};
    want += room;
  }
  if (want == 0) return;
  int r = ::poll(fds, static_cast<nfds_t>(n_), 0);
  if (r <= 0) return;  // nothing readable (or EINTR: the next call retries)
  pull_polled(fds);
}

// Pulls the sockets a poll(2) found readable, closed or failed.
inline void link::pull_polled(const pollfd* fds) {
  for (int j = 0; j < n_ && error_.ok(); ++j) {
    if (fds[j].revents & (POLLIN | POLLHUP | POLLERR)) pull(j);
  }
}

inline void link::pull(int j) {
  if (closed_mask_ & (1u << j)) return;
  const std::uint64_t room_end = recv_room_end();
  while (rpos_[j] < room_end) {
    iovec iov[max_iov];
    std::uint64_t want = 0;
    int cnt = gather(rpos_[j], room_end, mem_.data() + cap_, rbuf_, rlo_, rhi_, iov, want);
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

}  // namespace cclite::tcp
