// cclite/algorithm/p2p_group.hpp - a group of sends and receives to any peers, progressing together.
//
// What communicator::group_end() runs (ncclGroupStart / ncclGroupEnd,
// torch.distributed.batch_isend_irecv). Transfers to or from one peer use
// that peer's link one after another, in the order they were issued (the
// peer's matching calls come in the same order: NCCL's rule); transfers on
// different links and in the two directions of one link move side by side.
// So any group in which every send meets its receive in the peer's group
// completes whatever the sizes and the order across peers (rank r sending to
// r+1 and receiving from r-1, halo exchanges, all-to-all patterns), where
// the same calls issued one by one would wait on each other once a message
// exceeds the link buffer.
//
// On the wire each transfer is what a lone send / recv puts there: its
// envelope (p2p_envelope.hpp, unless checking is off), its bytes, then zeros
// up to a multiple of max_dtype_size (the stream alignment rule of
// transport/concept.hpp), so a grouped send matches a lone recv and back. A
// receive checks the envelope before it takes any data: a size mismatch is
// errc::mismatch, not bytes left in the link for the next call.
// A send to this rank itself is a copy into the matching receive from itself
// (the i-th send to self meets the i-th receive from self).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <cclite/algorithm/p2p_envelope.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>
#include <cclite/transport/concept.hpp>

namespace cclite {

/// One send or receive of a group of point-to-point calls
/// (communicator::group_start()): `bytes` of `send` go to `peer`, or `bytes`
/// from `peer` land in `recv`; `type` is the call's dtype (for the envelope).
struct p2p_transfer {
  int peer = 0;
  bool is_send = false;
  const std::uint8_t* send = nullptr;
  std::uint8_t* recv = nullptr;
  std::size_t bytes = 0;
  dtype type = dtype::uint8;
};

namespace detail {
/// Progress of one transfer of a group (scratch kept by the communicator:
/// a steady stream of groups does not allocate).
struct group_step {
  const p2p_transfer* t = nullptr;
  std::size_t head = 0;  ///< envelope bytes ahead of the data: 0 or p2p_envelope::wire_bytes
  std::size_t wire = 0;  ///< bytes on the link: head + t->bytes padded to max_dtype_size
  std::size_t done = 0;
  std::ptrdiff_t after = -1;  ///< the step before it on the same link and direction, -1: none
  std::uint8_t env[p2p_envelope::wire_bytes];  ///< the envelope sent, or as received so far
};

// A step's wire bytes [off, off + n) are its envelope (head bytes), its data,
// then padding. wire_out() writes them into a link's send buffer `b`;
// wire_in() takes them from its receive buffer `b` (padding is dropped).
inline void wire_out(const group_step& s, std::uint8_t* b, std::size_t off, std::size_t n) {
  const std::size_t data_end = s.head + s.t->bytes;
  for (std::size_t k; n; b += k, off += k, n -= k) {
    if (off < s.head) std::memcpy(b, s.env + off, k = std::min(n, s.head - off));
    else if (off < data_end) std::memcpy(b, s.t->send + (off - s.head), k = std::min(n, data_end - off));
    else std::memset(b, 0, k = n);
  }
}
inline void wire_in(group_step& s, const std::uint8_t* b, std::size_t off, std::size_t n) {
  const std::size_t data_end = s.head + s.t->bytes;
  for (std::size_t k; n; b += k, off += k, n -= k) {
    if (off < s.head) std::memcpy(s.env + off, b, k = std::min(n, s.head - off));
    else if (off < data_end) std::memcpy(s.t->recv + (off - s.head), b, k = std::min(n, data_end - off));
    else k = n;
  }
}

/// Copies the self-transfers (send to self -> receive from self, in order).
inline status copy_to_self(const p2p_transfer* t, std::size_t n, int self) {
  std::size_t s = 0, r = 0;
  for (;;) {
    while (s < n && !(t[s].peer == self && t[s].is_send)) ++s;
    while (r < n && !(t[r].peer == self && !t[r].is_send)) ++r;
    if (s == n && r == n) return {};
    if (s == n || r == n)
      return make_error(errc::invalid_argument, "group: a %s itself has no matching %s itself",
                        s < n ? "send to" : "receive from", s < n ? "receive from" : "send to");
    if (t[s].bytes != t[r].bytes)
      return make_error(errc::invalid_argument, "group: a send of %zu bytes to itself meets a receive of %zu bytes",
                        t[s].bytes, t[r].bytes);
    if (t[s].bytes) std::memmove(t[r].recv, t[s].send, t[s].bytes);
    ++s;
    ++r;
  }
}
}  // namespace detail

/// Runs the `n` transfers of `t` (this rank is `self`); `link_of(peer)`
/// returns a link (transport/concept.hpp) to that peer, already connected.
/// `envelopes`: each transfer carries one (p2p_envelope.hpp; off only when
/// every rank turned mismatch checking off). Returns once every byte has
/// moved and the links are flushed, or with the first error of a link a
/// pending transfer needs, errc::mismatch when an envelope disagrees with its
/// receive, or errc::timeout at `until`.
template <class LinkOf>
status run_p2p_group(const p2p_transfer* t, std::size_t n, int self, LinkOf&& link_of, deadline until,
                     std::vector<detail::group_step>& steps, bool envelopes = true, std::size_t piece = 64 << 10) {
  CCLITE_TRY(detail::copy_to_self(t, n, self));
  steps.clear();
  std::size_t left = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (t[i].peer == self) continue;
    detail::group_step s;
    s.t = &t[i];
    s.head = envelopes ? detail::p2p_envelope::wire_bytes : 0;
    s.wire = s.head + align_up(t[i].bytes, max_dtype_size);
    if (envelopes && t[i].is_send) detail::p2p_envelope::encode(s.env, t[i].type, t[i].bytes / size_of(t[i].type));
    for (std::size_t j = steps.size(); j-- > 0;) {  // groups are small: a backward scan
      if (steps[j].t->peer == t[i].peer && steps[j].t->is_send == t[i].is_send) {
        s.after = static_cast<std::ptrdiff_t>(j);
        break;
      }
    }
    if (s.wire) ++left;
    steps.push_back(s);
  }
  // Pending, and the transfer before it on the same link and direction is through.
  auto ready = [&](const detail::group_step& s) {
    if (s.done == s.wire) return false;
    if (s.after < 0) return true;
    const detail::group_step& before = steps[static_cast<std::size_t>(s.after)];
    return before.done == before.wire;
  };
  int idle = 0;
  std::size_t turn = 0;
  const clock::time_point start = clock::now();
  while (left) {
    bool moved = false;
    for (auto& s : steps) {
      if (!ready(s)) continue;
      auto l = link_of(s.t->peer);
      const std::size_t want = std::min(s.wire - s.done, piece);
      std::size_t moved_here = 0;
      if (s.t->is_send) {
        mutable_bytes m = l.send_reserve(want);
        moved_here = std::min(m.size, want);
        if (moved_here) {
          detail::wire_out(s, m.data, s.done, moved_here);
          l.send_commit(moved_here);
        }
      } else {
        const_bytes c = l.recv_peek();
        moved_here = std::min(c.size, want);
        // The envelope is checked as soon as it is whole, before any data is taken.
        const std::size_t head = s.done < s.head ? std::min(moved_here, s.head - s.done) : 0;
        if (head) {
          detail::wire_in(s, c.data, s.done, head);
          if (s.done + head == s.head) {
            status st = detail::p2p_envelope::check(s.env, s.t->type, s.t->bytes / size_of(s.t->type), s.t->peer);
            if (!st.ok()) return status(st.code(), "group: " + st.message());
          }
        }
        if (moved_here) {
          detail::wire_in(s, c.data + head, s.done + head, moved_here - head);
          l.recv_consume(moved_here);
        }
      }
      if (!moved_here) continue;
      s.done += moved_here;
      if (s.done == s.wire) --left;
      moved = true;
    }
    if (moved) {
      idle = 0;
      continue;
    }
    // Nothing moved: let every pending link progress (a tcp link pushes its
    // output here), and fail on an error of a link a transfer still needs.
    for (auto& s : steps) {
      if (s.done == s.wire) continue;
      status st = link_of(s.t->peer).poll();
      if (!st.ok())
        return status(st.code(), std::string(s.t->is_send ? "sending to rank " : "receiving from rank ") +
                                     std::to_string(s.t->peer) + ": " + st.message());
    }
    if (++idle < 4) continue;
    idle = 0;
    // Block on one waiting transfer at a time, round robin, in 2 ms slices so
    // the others keep moving.
    const detail::group_step* w = nullptr;
    for (std::size_t k = 0; k < steps.size() && !w; ++k) {
      const auto& s = steps[(turn + k) % steps.size()];
      if (ready(s)) w = &s;
    }
    ++turn;
    if (!w) continue;  // cannot happen: a pending chain always has a ready head
    const wait_for dir = w->t->is_send ? wait_for::send : wait_for::recv;
    // A wait that keeps answering early cannot outlast the deadline either.
    status st = until.expired() ? status(errc::timeout, std::string())
                                : link_of(w->t->peer).wait(dir, deadline::slice_of(until, milliseconds(2)));
    if (st.ok()) continue;
    if (st.code() == errc::timeout && !until.expired()) continue;  // only the slice ended
    const double secs = std::chrono::duration<double>(clock::now() - start).count();
    std::string what = std::string(w->t->is_send ? "sending to rank " : "receiving from rank ") +
                       std::to_string(w->t->peer) + " (" + std::to_string(w->done) + " of " +
                       std::to_string(w->wire) + " bytes moved)";
    if (st.code() == errc::timeout)
      return make_error(errc::timeout, "group: deadline reached after %.1f s, still %s; did rank %d issue the "
                        "matching %s?", secs, what.c_str(), w->t->peer, w->t->is_send ? "receive" : "send");
    return status(st.code(), what + ": " + st.message());
  }
  // Hand every link's output to the peer before returning (tcp buffers it).
  for (auto& s : steps) {
    if (!s.t->is_send) continue;
    status st = link_of(s.t->peer).flush(until);
    if (!st.ok()) return status(st.code(), "sending to rank " + std::to_string(s.t->peer) + ": " + st.message());
  }
  return {};
}

}  // namespace cclite
