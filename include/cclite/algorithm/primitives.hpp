// cclite/algorithm/primitives.hpp - the verbs every ring/chain algorithm is written in.
//
// NCCL's primitive set, over two links: data arrives from `prev` and leaves to
// `next` (they may be the same link when there are two ranks):
//
//   send(src)                          next <- src
//   recv(out)                          out  <- prev
//   recv_copy_send(out)                out  <- prev, next <- same bytes
//   recv_reduce_send(local)            next <- local (op) prev
//   recv_reduce_copy_send(local, out)  out  <- local (op) prev, next <- out
//
// Each verb streams `bytes` through the links in pieces of at most
// `piece_bytes` (64 KiB by default): small enough that a piece stays in L2
// between the reduction and the forward copy and that the next rank starts
// before we finish, large enough that the per-piece bookkeeping is noise.
// Reductions go straight from the receive FIFO into the send FIFO (no
// intermediate buffer). A verb returns only when all its bytes have moved, or
// with the first error of either link (timeout, peer_lost, aborted).
//
// send, recv, recv_copy_send and sendrecv of large messages over links with
// direct windows (transport/direct.hpp: tcp) skip the FIFOs: the sockets read
// from and write into the caller's buffers, and a middle rank forwards out of
// its output what has arrived there. A sendrecv whose links differ (shm one
// way, tcp the other) or whose directions differ in size uses the window on
// the side that can, the FIFO on the other.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cclite/config.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/stream_copy.hpp>
#include <cclite/core/status.hpp>
#include <cclite/transport/concept.hpp>
#include <cclite/transport/direct.hpp>

namespace cclite {

/// Out-of-place calls of at least this many bytes (ring_allreduce: the
/// buffer; ring_allgather and the pairwise alltoall: the whole output) write
/// their final segments and their pure copies into the send FIFO with
/// non-temporal stores (primitives::stream_output). 2 ranks on the
/// development VM, alternated runs (session 8): final segments streamed,
/// 16 MiB 10.7-11.8 -> 12.0-12.6 GB/s busbw, 64 MiB 9.8-10.4 -> 10.6-10.9
/// (3 pairs); the FIFO copies too, 64 MiB a further +7 % (median 9.6 -> 10.3
/// in 8 of 8 pairs, a slower hour). At 1-8 MiB, where the data still fits the
/// cache, 0.5-2 GB/s slower; in place slower at every size (the FIFO part by
/// 40 %); reducing into the FIFO or a scratch piece to stream the reduced
/// segment as well lost. Allgather, 2 ranks, 5 alternated pairs (session
/// 18): 16 MiB +10 % (17.7 -> 19.4 GB/s algbw, medians), 4-8 MiB within the
/// noise (+6 %, -2 %); alltoall, 4 pairs: 16 MiB +10 %, 32-64 MiB +3-4 %.
inline constexpr std::size_t ring_stream_output_min_bytes = std::size_t{16} << 20;

template <class Prev, class Next>
class primitives {
  static_assert(is_link_v<Prev> && is_link_v<Next>, "primitives need two links");

 public:
  /// `elem` is the element size: pieces are whole elements. `red` may be
  /// null for verbs that do not reduce.
  primitives(Prev& prev, Next& next, std::size_t elem, const reduction* red, deadline until,
             std::size_t piece_bytes = 64 << 10)
      : prev_(prev), next_(next), elem_(elem), red_(red), until_(until),
        piece_(std::max(align_down(piece_bytes, max_dtype_size), std::size_t(max_dtype_size))) {}

  /// A promise that no send follows this collective's next verb that sends:
  /// that verb carries the stream's end pad (finish()) itself, so a peer
  /// waiting for it in its own finish() has it with the data instead of one
  /// trip later.
  /// Matters when a collective's bytes to a peer are not a multiple of 8
  /// (a 4-byte allreduce or sendrecv over tcp: 22-26 -> 11-13 us, over shm
  /// 0.82-0.90 -> 0.68-0.75 us; docs/performance.md, "Session 17"). The
  /// bytes on the wire do not change, only when the pad leaves.
  void will_finish() noexcept { last_ = true; }

  status send(const std::uint8_t* src, std::size_t bytes) {
    if (direct_ok(bytes) && begin_send(src, bytes, bytes)) return exchange(nullptr, 0, false, src, bytes, true, false);
    return pump(bytes, false, true, [&](const std::uint8_t*, std::uint8_t* dst, std::size_t n, std::size_t off) {
      pass_on(dst, src + off, n);
    });
  }

  /// next <- head (hbytes), then src (bytes), as one stream: a small
  /// message and its header reach the peer in one piece (point-to-point
  /// envelopes, p2p_envelope.hpp).
  status send_prefixed(const std::uint8_t* head, std::size_t hbytes, const std::uint8_t* src, std::size_t bytes) {
    if (direct_ok(bytes)) {
      // A large message: the header through the FIFO (without the end pad a
      // will_finish() asked for: the data follows), the data by send().
      const bool last = last_;
      last_ = false;
      status st = pump(hbytes, false, true, [&](const std::uint8_t*, std::uint8_t* dst, std::size_t n, std::size_t off) {
        std::memcpy(dst, head + off, n);
      });
      last_ = last;
      CCLITE_TRY(st);
      return send(src, bytes);
    }
    return pump(hbytes + bytes, false, true, [&](const std::uint8_t*, std::uint8_t* dst, std::size_t n, std::size_t off) {
      const std::size_t h = off < hbytes ? std::min(n, hbytes - off) : 0;
      if (h) std::memcpy(dst, head + off, h);
      if (n > h) pass_on(dst + h, src + (off + h - hbytes), n - h);
    });
  }

  status recv(std::uint8_t* out, std::size_t bytes) {
    if (direct_ok(bytes) && begin_recv(out, bytes)) return exchange(out, bytes, true, nullptr, 0, false, false);
    return pump(bytes, true, false, [&](const std::uint8_t* in, std::uint8_t*, std::size_t n, std::size_t off) {
      keep(out + off, in, n);
    });
  }

  status recv_copy_send(std::uint8_t* out, std::size_t bytes) {
    // Both links direct, or neither: the send window opens empty and grows
    // over `out` as bytes arrive there (nothing of it is committed if the
    // receive side refuses, so closing it then is harmless). A chain rank
    // between nodes (shm in, tcp out, or the reverse) stays staged: its
    // window side measured no faster on the development VM (2 fake nodes x 2
    // ranks, broadcast 4 MiB +7 %, 64 MiB -4 %, gather and scatter -9..+3 %,
    // all within the noise; docs/performance.md, "Session 40").
    if (direct_ok(bytes) && begin_send(out, 0, bytes)) {
      if (begin_recv(out, bytes)) return exchange(out, bytes, true, out, bytes, true, true);
      if constexpr (has_direct) next_.send_direct_end(status{});
    }
    return pump(bytes, true, true, [&](const std::uint8_t* in, std::uint8_t* dst, std::size_t n, std::size_t off) {
      keep(out + off, in, n);
      std::memcpy(dst, in, n);
    });
  }

  /// Until finish(), for calls larger than the cache: `out` (recv,
  /// recv_copy_send, sendrecv) and / or the pure copies into the send FIFO
  /// (send, sendrecv, the forward of recv_reduce_copy_send) are written with
  /// non-temporal stores (core/stream_copy.hpp): no read for ownership of the
  /// caller's cold lines, and none of FIFO lines the peer's core read last.
  /// Loops that store to the FIFO while reading other memory keep ordinary
  /// stores (slower streamed).
  void stream_output(bool out, bool fifo) noexcept {
    stream_out_ = out;
    stream_fifo_ = fifo;
  }

  status recv_reduce_send(const std::uint8_t* local, std::size_t bytes) {
    return pump(bytes, true, true, [&](const std::uint8_t* in, std::uint8_t* dst, std::size_t n, std::size_t off) {
      red_->copy(dst, local + off, in, n / elem_);
    });
  }

  /// out = local (op) prev; forwards out. With `divide_by` > 0 (reduce_op::avg)
  /// the result is divided before it is kept and forwarded, so every rank ends
  /// with the bits the owner computed. `local` may equal `out` (in place).
  status recv_reduce_copy_send(const std::uint8_t* local, std::uint8_t* out, std::size_t bytes,
                               int divide_by = 0) {
    return pump(bytes, true, true, [&](const std::uint8_t* in, std::uint8_t* dst, std::size_t n, std::size_t off) {
      const std::size_t elems = n / elem_;
      // Reduce into `out`, then forward the piece (still in L1/L2) with
      // memcpy, rather than one fused pass (reduction::copy2) that also
      // stores into the FIFO. The FIFO's lines were last read by the peer's
      // core, and a compiled loop interleaving stores to them with stores to
      // `out` stalled: 2-rank out-of-place allreduce ran at half the in-place
      // speed (1-4 MiB: 4.3-5.0 GB/s fused, 10-12 GB/s this way, same session;
      // docs/performance.md, session 3). The in-place path always did this.
      if (local == out) red_->inplace(out + off, in, elems);
      else red_->copy(out + off, local + off, in, elems);
      if (divide_by > 0) red_->divide(out + off, elems, divide_by);
      pass_on(dst, out + off, n);
    });
  }

  /// out = prev; forwards local (op) prev (an exclusive scan's middle hop,
  /// scan.hpp). `local` may equal `out`: each piece is reduced before it is kept.
  status recv_copy_reduce_send(const std::uint8_t* local, std::uint8_t* out, std::size_t bytes) {
    return pump(bytes, true, true, [&](const std::uint8_t* in, std::uint8_t* dst, std::size_t n, std::size_t off) {
      red_->copy(dst, local + off, in, n / elem_);
      keep(out + off, in, n);
    });
  }

  /// out = local (op) prev, nothing forwarded (the last hop of a reduce).
  status recv_reduce_copy(const std::uint8_t* local, std::uint8_t* out, std::size_t bytes) {
    return pump(bytes, true, false, [&](const std::uint8_t* in, std::uint8_t*, std::size_t n, std::size_t off) {
      if (local == out) red_->inplace(out + off, in, n / elem_);
      else red_->copy(out + off, local + off, in, n / elem_);
    });
  }

  /// next <- src (send_bytes) while out <- prev (recv_bytes), both progressing
  /// together: the pairwise-exchange step of alltoall and send/recv. Neither
  /// direction waits for the other to finish, so two ranks exchanging more
  /// than a FIFO's worth with each other cannot deadlock.
  status sendrecv(const std::uint8_t* src, std::size_t send_bytes, std::uint8_t* out,
                  std::size_t recv_bytes) {
    // A large direction over a link with direct windows goes through its
    // window, the other (small, or a link without them) through its FIFO, in
    // the same loop: neither waits for the other.
    const bool win_out = direct_ok(send_bytes) && begin_send(src, send_bytes, send_bytes, true);
    const bool win_in = direct_ok(recv_bytes) && begin_recv(out, recv_bytes, true);
    return exchange(out, recv_bytes, win_in, src, send_bytes, win_out, false);
  }

  /// Whether a byte from prev can be read now (without waiting).
  bool prev_has_data() { return !prev_.recv_peek().empty(); }

  /// Waits as a verb does (both links progressed) until a byte from prev can
  /// be read or `by` passes, whichever comes first: ok either way. Errors:
  /// prev's link, the call's deadline. For a caller that has something to do
  /// when a peer is slow (checked_primitives: a call header that is late).
  status await_prev(deadline by) {
    if (prev_has_data()) return {};
    const deadline whole = until_;
    until_ = deadline::min(by, whole);
    int idle = 0;
    status st;
    while (st.ok() && !prev_has_data() && !until_.expired()) st = stall(true, false, wait_for::recv, idle);
    until_ = whole;
    stalled_ = false;
    if (st.code() == errc::timeout && !whole.expired()) return {};  // `by` came first
    return st;
  }

  /// Pads both streams to a multiple of max_dtype_size so the next collective,
  /// whatever its dtype, starts element-aligned (see transport/concept.hpp).
  status finish() {
    const std::size_t pad_in = end_pad(received_);
    CCLITE_TRY(pad_out());
    elem_ = 1;
    if (pad_in) CCLITE_TRY(pump(pad_in, true, false, [](const std::uint8_t*, std::uint8_t*, std::size_t, std::size_t) {}));
    sent_ = received_ = 0;
    last_ = false;
    stream_out_ = stream_fifo_ = false;
    // A link that buffers output in user space (tcp) must hand it all to the
    // kernel before the collective returns: the caller may compute for a
    // long time before its next call, and the peer needs those bytes now.
    CCLITE_TRY(flush(next_));
    if (static_cast<const void*>(&next_) != static_cast<const void*>(&prev_)) CCLITE_TRY(flush(prev_));
    return {};
  }

 private:
  // A piece of the result into the caller's buffer, and a piece copied into
  // the send FIFO (see stream_output()).
  void keep(std::uint8_t* to, const std::uint8_t* from, std::size_t n) noexcept { copy_piece(to, from, n, stream_out_); }
  void pass_on(std::uint8_t* to, const std::uint8_t* from, std::size_t n) noexcept {
    copy_piece(to, from, n, stream_fifo_);
  }
  static void copy_piece(std::uint8_t* to, const std::uint8_t* from, std::size_t n, bool streamed) noexcept {
    if (!streamed) {
      std::memcpy(to, from, n);
      return;
    }
    stream_copy(to, from, n);
    stream_fence();  // before the FIFO's commit publishes the piece
  }

  // Bytes from stream position `at` to the next multiple of max_dtype_size.
  static std::size_t end_pad(std::size_t at) noexcept { return align_up(at, max_dtype_size) - at; }
  // Zeros up to the next multiple of max_dtype_size on the output stream.
  status pad_out() {
    const std::size_t pad = end_pad(sent_), elem = elem_;
    if (!pad) return {};
    elem_ = 1;  // the pad need not be whole elements
    status st = pump(pad, false, true, [](const std::uint8_t*, std::uint8_t* d, std::size_t n, std::size_t) { std::memset(d, 0, n); });
    elem_ = elem;
    return st;
  }

  // Called when a verb can move nothing. First lets both links move bytes (a
  // TCP link pushes pending output here even when this verb only receives:
  // in a ring where everyone waits for its predecessor, unpushed bytes would
  // deadlock). Errors count only on a link this verb needs: a peer that
  // finished and closed a link we merely flush is not an error yet (finish()
  // reports undeliverable bytes). After a few idle rounds it blocks on the
  // side that is short (`w`: recv = prev, send = next) in slices of at most
  // 2 ms, so the other link keeps being progressed, until the deadline.
  status stall(bool in, bool out, wait_for w, int& idle) {
    const bool same = static_cast<const void*>(&next_) == static_cast<const void*>(&prev_);
    status sp = prev_.poll();
    if ((in || (same && out)) && !sp.ok()) return sp;
    if (!same) {
      status sn = next_.poll();
      if (out && !sn.ok()) return sn;
    }
    if (++idle < 4) return {};
    idle = 0;
    if (!stalled_) {
      stalled_ = true;
      stalled_since_ = clock::now();
    }
    const deadline slice = same ? until_ : deadline::slice_of(until_, milliseconds(2));
    status st = w == wait_for::recv ? prev_.wait(w, slice) : next_.wait(w, slice);
    if (st.code() == errc::timeout) {
      if (!until_.expired()) return {};  // only the slice ended
      // The deadline passed just after the slice: ask again for the link's text.
      if (st.message().empty()) st = w == wait_for::recv ? prev_.wait(w, until_) : next_.wait(w, until_);
      double secs = std::chrono::duration<double>(clock::now() - stalled_since_).count();
      return make_error(errc::timeout, "no progress for %.1f s, deadline reached: %s", secs,
                        st.message().c_str());
    }
    return st;
  }

  // ---- direct windows (transport/direct.hpp) ----
  static constexpr bool has_direct = direct::has_windows_v<Prev> && direct::has_windows_v<Next>;
  // Below a piece the links' thresholds are never reached: no call to ask them.
  bool direct_ok(std::size_t bytes) const noexcept { return has_direct && bytes >= piece_; }
  // `exchange`: a sendrecv's direction (direct.hpp: a lower threshold).
  bool begin_send(const std::uint8_t* src, std::size_t ready, std::size_t total, bool exchange = false) {
    if constexpr (has_direct) return next_.send_direct_begin(src, ready, total, exchange);
    else return false;
  }
  bool begin_recv(std::uint8_t* out, std::size_t bytes, bool exchange = false) {
    if constexpr (has_direct) return prev_.recv_direct_begin(out, bytes, exchange);
    else return false;
  }

  // Both directions of a verb in one loop, neither waiting for the other. In:
  // `in_bytes` into `to`, through prev's receive window (`win_in`) or its
  // FIFO. Out: `out_bytes` from `from`, through next's send window
  // (`win_out`) or its FIFO; with `forward` (recv_copy_send: from == to) only
  // what has arrived may go, and a send window grows over it. The windows are
  // closed on every exit; closed early, they fail their links (direct.hpp).
  // After will_finish() the end pad leaves with the data: through the FIFO in
  // this loop (it must not wait for the receive: a 4-byte sendrecv is one
  // trip), after a send window once it has closed.
  status exchange(std::uint8_t* to, std::size_t in_bytes, bool win_in, const std::uint8_t* from,
                  std::size_t out_bytes, bool win_out, bool forward) {
    // The FIFO's end: the data, then zeros up to the pad (a multiple of
    // elem_, since sent_ and out_bytes are).
    const std::size_t put_end = out_bytes + (last_ && !win_out ? end_pad(sent_ + out_bytes) : 0);
    std::size_t got = 0, put = 0;  // bytes arrived in `to`; bytes committed to next's FIFO
    std::size_t left = 0;          // bytes the send window has yet to push
    if constexpr (has_direct) {
      if (win_out) left = next_.send_direct_left();
    }
    int idle = 0;
    status st;
    for (;;) {
      bool moved = false;
      if (win_in) {
        if constexpr (has_direct) {
          const std::size_t a = prev_.recv_direct_arrived();
          moved |= a != got;
          got = a;
        }
      } else if (got < in_bytes) {
        const_bytes in = prev_.recv_peek();
        const std::size_t n = align_down(std::min({in.size, in_bytes - got, piece_}), elem_);
        if (n) {
          keep(to + got, in.data, n);
          prev_.recv_consume(n);
          got += n;
          moved = true;
        }
      }
      const std::size_t ready = forward ? got : out_bytes;
      if (win_out) {
        if constexpr (has_direct) {
          if (forward) next_.send_direct_extend(ready);
          const std::size_t l = next_.send_direct_left();
          moved |= l != left;
          left = l;
        }
      } else if (const std::size_t end = ready == out_bytes ? put_end : ready; put < end) {
        mutable_bytes dst = next_.send_reserve(std::min(end - put, piece_));
        const std::size_t n = align_down(dst.size, elem_);
        if (n) {
          const std::size_t data = put < out_bytes ? std::min(n, out_bytes - put) : 0;
          if (data) pass_on(dst.data, from + put, data);
          if (n > data) std::memset(dst.data + data, 0, n - data);
          next_.send_commit(n);
          put += n;
          moved = true;
        }
      }
      const bool out_pending = win_out ? left != 0 || ready != out_bytes : put < put_end;
      if (got == in_bytes && !out_pending) break;
      if (moved) {
        idle = 0;
        stalled_ = false;
        continue;
      }
      const bool short_in = got < in_bytes;
      st = stall(short_in, out_pending, short_in ? wait_for::recv : wait_for::send, idle);
      if (!st.ok()) break;
    }
    if constexpr (has_direct) {
      if (win_in) prev_.recv_direct_end(st);
      if (win_out) next_.send_direct_end(st);
    }
    CCLITE_TRY(st);
    received_ += in_bytes;
    sent_ += win_out ? out_bytes : put_end;
    return last_ && end_pad(sent_) ? pad_out() : status{};
  }

  template <class L>
  auto flush(L& l) -> decltype(l.flush(deadline{})) {
    return l.flush(until_);
  }
  template <class L, class... Ignored>
  status flush(L&, Ignored...) {
    return {};
  }

  // Moves `bytes` through the links: waits for input (if `in`) and output
  // space (if `out`), hands contiguous whole-element pieces to `body`. The
  // loop, with both links' calls inlined, is compiled once (pump_pieces); each
  // verb's body is reached through a function pointer, one call per piece.
  template <class Body>
  status pump(std::size_t bytes, bool in, bool out, Body&& body) {
    using B = std::remove_reference_t<Body>;
    piece_fn call = [](void* b, const std::uint8_t* src, std::uint8_t* dst, std::size_t n, std::size_t off) {
      (*static_cast<B*>(b))(src, dst, n, off);
    };
    return pump_pieces(bytes, in, out, call, const_cast<void*>(static_cast<const void*>(&body)));
  }
  using piece_fn = void (*)(void* body, const std::uint8_t* src, std::uint8_t* dst, std::size_t n, std::size_t off);
  CCLITE_NOINLINE status pump_pieces(std::size_t bytes, bool in, bool out, piece_fn body, void* ctx) {
    std::size_t done = 0;
    int idle = 0;
    while (done < bytes) {
      std::size_t n = std::min(bytes - done, piece_);
      const_bytes src{};
      mutable_bytes dst{};
      if (in) {
        src = prev_.recv_peek();
        n = std::min(n, src.size);
      }
      if (out) {
        dst = next_.send_reserve(n);
        n = std::min(n, dst.size);
      }
      n = align_down(n, elem_);
      if (n == 0) {
        bool need_in = in && src.size < std::min(bytes - done, elem_);
        CCLITE_TRY(stall(in, out, need_in || !out ? wait_for::recv : wait_for::send, idle));
        continue;
      }
      idle = 0;
      stalled_ = false;
      body(ctx, src.data, dst.data, n, done);
      if (in) prev_.recv_consume(n);
      if (out) next_.send_commit(n);
      done += n;
    }
    if (in) received_ += bytes;
    if (!out) return {};
    sent_ += bytes;
    // After will_finish(): the end pad follows at once (pad_out's own pump
    // ends aligned, so this does not recurse further).
    return last_ && end_pad(sent_) ? pad_out() : status{};
  }

  Prev& prev_;
  Next& next_;
  std::size_t elem_;
  const reduction* red_;
  deadline until_;
  std::size_t piece_;
  std::size_t sent_ = 0, received_ = 0;
  bool stalled_ = false;
  bool last_ = false;  // will_finish(): the next send carries the end pad
  bool stream_out_ = false;
  bool stream_fifo_ = false;
  clock::time_point stalled_since_{};
};

}  // namespace cclite
