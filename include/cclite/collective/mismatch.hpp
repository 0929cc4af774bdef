// cclite/collective/mismatch.hpp - the call header that catches mismatched collectives.
//
// Every collective sends a 32-byte header (kind, dtype, op, root, count, a
// per-communicator collective number; little-endian) to its ring successor
// when it starts, and ahead of its first byte on any other link it sends on;
// it checks the header of each peer before the first byte it consumes from
// that peer, and its ring predecessor's header before it returns. So every
// rank checks its ring predecessor: if any two ranks disagree, some adjacent
// pair does and at least one rank sees it. That rank returns errc::mismatch
// naming both sides and the communicator spreads it to the others
// (comm_checks::spread_failure). Data from a peer that called something else is
// never interpreted, so nothing is silently wrong.
//
// Cost: 32 bytes per link and collective, no extra round trip (the header
// travels ahead of the data in the same stream), but a collective returns
// only once its ring predecessor entered it. CCLITE_CHECK_MISMATCH=0 turns it
// off (then a mismatch hangs until the deadline or corrupts, as in NCCL).
//
// Rooted collectives and scans skip the ring neighbours' exchange: their
// headers ride with their data only (headers_ride_with_data), so a rank that
// only sends (a broadcast's root) leaves once its data is out and the others
// send no header that nobody reads (over tcp a second message per call). A
// rank that reads still checks every sender first; a rank that only sent has
// no output to spoil and finds a mismatch at its next call (the odd peer's
// bytes where none belong) or at close; and two ranks that wait for each
// other, seeing no header at all, compare their calls through the store
// (comm_checks::header_overdue) after a short wait instead of waiting for
// the deadline.
//
// Calls that skip the links compare the header where their data is: the
// shm-direct allreduce and the shared windows in the group's segments, and
// shm-direct's small allreduce (comm_shared.hpp) in the slot beside its data,
// where a peer that took the links instead is found by its header arriving
// down the link while the call waits for it. (So point-to-point bytes a peer
// left in a link ahead of a small shm call, e.g. a send() matched by a recv()
// issued after the collective, are reported only if the call had to wait;
// on the link paths they always are. Issue point-to-point calls in the same
// order relative to collectives on every rank, as NCCL requires.)
//
// Point-to-point calls (send/recv/sendrecv, groups) carry no call header and
// do not advance the collective number: they match in stream order, and each
// message carries an envelope with its size instead (algorithm/p2p_envelope.hpp),
// which its receive checks; CCLITE_CHECK_MISMATCH=0 turns both off.
//
// The header also names the communicator (a 24-bit id of its store prefix, in
// the top bits of the sequence field): a parent and its split() children
// share links (link_pool.hpp), and a rank that issued their calls in another
// order than its peer is reported, not fed the other communicator's data.
#pragma once

#include <cclite/config.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <cclite/algorithm/p2p_envelope.hpp>
#include <cclite/collective/op.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>

namespace cclite::detail {

/// What one rank called, as far as the other ranks must agree with it.
struct call_header {
  static constexpr std::uint32_t magic_value = 0x48434c43;  // "CLCH" little-endian
  static constexpr std::size_t wire_bytes = 32;
  std::uint32_t magic = magic_value;
  std::uint8_t kind = 0, type = 0, op = 0;
  std::int32_t root = 0;
  std::uint32_t aux = 0;  // allgatherv: hash of the counts; allreduce: window_flag or 0
  /// allreduce's aux: in place on an alloc_shared() window (a path of its own).
  static constexpr std::uint32_t window_flag = 1;
  std::uint64_t count = 0;
  std::uint64_t seq = 0;   // low 40 bits on the wire
  std::uint32_t comm = 0;  // 24 bits: which communicator (comm_id_of)

  static constexpr int seq_bits = 40;
  static constexpr std::uint64_t seq_mask = (std::uint64_t(1) << seq_bits) - 1;

  bool operator==(const call_header& o) const {
    return magic == o.magic && kind == o.kind && type == o.type && op == o.op && root == o.root &&
           aux == o.aux && count == o.count && seq == o.seq && comm == o.comm;
  }
  bool operator!=(const call_header& o) const { return !(*this == o); }

  // Fixed layout, little-endian, whatever the host: ranks of one job may run
  // on different machines.
  void encode(std::uint8_t* b) const {
    std::memset(b, 0, wire_bytes);
    put_le(b + 0, magic, 4);
    b[4] = kind;
    b[5] = type;
    b[6] = op;
    put_le(b + 8, static_cast<std::uint32_t>(root), 4);
    put_le(b + 12, aux, 4);
    put_le(b + 16, count, 8);
    put_le(b + 24, (seq & seq_mask) | (std::uint64_t(comm & 0xffffffu) << seq_bits), 8);
  }
  static call_header decode(const std::uint8_t* b) {
    call_header h;
    h.magic = static_cast<std::uint32_t>(get_le(b + 0, 4));
    h.kind = b[4];
    h.type = b[5];
    h.op = b[6];
    h.root = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(b + 8, 4)));
    h.aux = static_cast<std::uint32_t>(get_le(b + 12, 4));
    h.count = get_le(b + 16, 8);
    const std::uint64_t s = get_le(b + 24, 8);
    h.seq = s & seq_mask;
    h.comm = static_cast<std::uint32_t>(s >> seq_bits);
    return h;
  }

  // The 16-byte form, for calls whose count fits 32 bits, whose root fits
  // one byte and that use no aux (shm-direct's small calls and barrier,
  // which compare it beside their data): kind, dtype, op, root, count, seq
  // and comm.
  static constexpr std::size_t compact_bytes = 16;
  void encode_compact(std::uint8_t* b) const {
    std::memset(b, 0, compact_bytes);
    b[0] = kind;
    b[1] = type;
    b[2] = op;
    b[3] = static_cast<std::uint8_t>(root);  // 0..255 (comm_shared.hpp: small_slot_bytes)
    put_le(b + 4, count, 4);
    put_le(b + 8, (seq & seq_mask) | (std::uint64_t(comm & 0xffffffu) << seq_bits), 8);
  }
  static call_header decode_compact(const std::uint8_t* b) {
    call_header h;
    h.kind = b[0];
    h.type = b[1];
    h.op = b[2];
    h.root = b[3];
    h.count = get_le(b + 4, 4);
    const std::uint64_t s = get_le(b + 8, 8);
    h.seq = s & seq_mask;
    h.comm = static_cast<std::uint32_t>(s >> seq_bits);
    return h;
  }

CCLITE_SETUP_CODE_BEGIN  // error messages: compiled for size (config.hpp)
  /// "allreduce(count=1024, float, sum)", "broadcast(count=8, int32, root=1)".
  std::string describe() const {
    if (magic != magic_value) return "something else (no collective header: a point-to-point call or stray bytes)";
    const auto k = static_cast<collective_kind>(kind);
    if (kind >= collective_kind_count) return "an unknown collective";
    if (k == collective_kind::barrier) return "barrier()";
    char buf[160];
    const char* t = type < dtype_count ? to_string(static_cast<dtype>(type)) : "?";
    int n = 0;
    if (k == collective_kind::allgatherv || k == collective_kind::reduce_scatterv)
      n = std::snprintf(buf, sizeof buf, "%s(%s, counts hash %08x", to_string(k), t, aux);
    else if (k == collective_kind::alltoallv || k == collective_kind::gatherv || k == collective_kind::scatterv)
      n = std::snprintf(buf, sizeof buf, "%s(%s", to_string(k), t);
    else n = std::snprintf(buf, sizeof buf, "%s(count=%" PRIu64 ", %s", to_string(k), count, t);
    if (reduces(k) && n > 0 && n < static_cast<int>(sizeof buf))
      n += std::snprintf(buf + n, sizeof buf - static_cast<std::size_t>(n), ", %s",
                         op < reduce_op_count ? to_string(static_cast<reduce_op>(op)) : "?");
    if (k == collective_kind::allreduce && (aux & window_flag) && n > 0 && n < static_cast<int>(sizeof buf))
      n += std::snprintf(buf + n, sizeof buf - static_cast<std::size_t>(n), ", in place on its alloc_shared() window");
    if (rooted(k) && n > 0 && n < static_cast<int>(sizeof buf))
      n += std::snprintf(buf + n, sizeof buf - static_cast<std::size_t>(n), ", root=%d", root);
    return std::string(buf) + ")";
  }
CCLITE_SETUP_CODE_END

  static bool reduces(collective_kind k) { return cclite::reduces(k); }
  static constexpr bool rooted(collective_kind k) {
    return k == collective_kind::broadcast || k == collective_kind::reduce || k == collective_kind::gather ||
           k == collective_kind::scatter || k == collective_kind::gatherv || k == collective_kind::scatterv;
  }
};

static_assert(call_header::magic_value == p2p_envelope::call_header_magic,
              "a receive names a collective's header by its magic (algorithm/p2p_envelope.hpp)");

/// The header of `d`, the `seq`-th collective of this communicator. Fields a
/// kind does not use are zero, so headers compare field by field. Only what
/// must agree across ranks goes in: per-rank counts of the v-variants
/// legitimately differ (the counts *array* of allgatherv and reduce_scatterv
/// must agree, so its hash goes in; the per-rank counts of gatherv and
/// scatterv and the per-pair counts of alltoallv are checked by an envelope
/// ahead of each message, comm_algorithms.hpp).
inline call_header make_call_header(const op_desc& d, int size, std::uint64_t seq, std::uint32_t comm = 0) {
  call_header h;
  h.kind = static_cast<std::uint8_t>(d.kind);
  h.seq = seq & call_header::seq_mask;
  h.comm = comm & 0xffffffu;
  if (d.kind == collective_kind::barrier) return h;
  h.type = static_cast<std::uint8_t>(d.type);
  if (call_header::reduces(d.kind)) h.op = static_cast<std::uint8_t>(d.op);
  if (call_header::rooted(d.kind)) h.root = d.root;
  if (d.kind == collective_kind::allgatherv || d.kind == collective_kind::reduce_scatterv) {
    std::uint32_t x = 2166136261u;  // FNV-1a over the counts
    for (int r = 0; r < size && d.counts; ++r) {
      std::uint64_t c = d.counts[r];
      for (int i = 0; i < 8; ++i) x = (x ^ static_cast<std::uint8_t>(c >> (8 * i))) * 16777619u;
    }
    h.aux = x;
  } else if (d.kind != collective_kind::alltoallv && d.kind != collective_kind::gatherv &&
             d.kind != collective_kind::scatterv) {
    h.count = d.count;
  }
  return h;
}

/// The error a rank reports when the header from `peer` differs from what it
/// expected: "allreduce #12: rank 0 called allreduce(count=1024, float, sum)
/// but rank 1 called allreduce(count=1000, float, sum)".
CCLITE_SETUP_CODE_BEGIN
inline status mismatch_error(const call_header& mine, int self, const call_header& theirs, int peer) {
  std::string m = std::string(to_string(static_cast<collective_kind>(mine.kind))) + " #" +
                  std::to_string(mine.seq) + ": rank " + std::to_string(self) + " called " + mine.describe() +
                  " but rank " + std::to_string(peer) + " called " + theirs.describe();
  if (theirs.magic == call_header::magic_value && theirs.comm != mine.comm) {
    m += " on another communicator sharing the link (a parent and its split() children share connections: "
         "calls on them must come in the same order on every rank)";
    return status(errc::mismatch, std::move(m));
  }
  if (theirs.magic == call_header::magic_value && theirs.seq != mine.seq)
    m += " as its collective #" + std::to_string(theirs.seq);
  m += "; every rank must issue the same collectives in the same order with the same count, dtype, op and root";
  return status(errc::mismatch, std::move(m));
}
CCLITE_SETUP_CODE_END

/// Per-collective header bookkeeping of one communicator: which peers got our
/// header and whose header we checked, as the collective number of the last
/// time (so nothing is cleared between calls, and nothing allocates).
struct header_state {
  call_header out, expect;  ///< what we send; what every peer must send
  std::uint64_t* sent = nullptr;  ///< [peer] = seq of the last header sent to it
  std::uint64_t* seen = nullptr;  ///< [peer] = seq of the last header checked from it
  bool active = false;            ///< false: checking off, or a point-to-point call
  bool knows_culprit = false;     ///< a timeout found the rank that never called
  bool riding = false;            ///< this call's headers ride with its data only
  /// The collectives this rank left without its ring predecessor's header
  /// (calls whose headers ride with their data and which read nothing from
  /// that peer: headers_ride_with_data), numbers unchecked_from up to
  /// unchecked.seq, until a header from the peer shows that it sent nothing
  /// here in them. (Several, when a root broadcasts again before its peer's
  /// bytes of the first could have come.)
  call_header unchecked;
  std::uint64_t unchecked_from = 0;
  int unchecked_peer = -1;  ///< -1: none pending
  /// Called while a call whose headers ride with its data has waited
  /// header_wait_slice for `peer`'s header, and again after each further
  /// slice (comm_checks::header_overdue); an error ends the wait.
  status (*overdue)(void* ctx, int peer) = nullptr;
  void* overdue_ctx = nullptr;
};

/// How long a rank of a riding call waits for a peer's header before it asks
/// the store whether that peer is waiting too, in another call
/// (comm_checks::header_overdue); each later wait is twice as long, up to
/// header_wait_max (a thousand ranks waiting for a slow root ask the store
/// about a thousand times a second, not twenty thousand).
inline constexpr milliseconds header_wait_slice{50};
inline constexpr milliseconds header_wait_max{1600};

/// Collectives whose call headers travel only ahead of their data, without
/// the ring neighbours' exchange of every other collective (begin_checks /
/// end_checks in comm_checks.hpp): the rooted ones and the prefix reductions,
/// in which a rank may only send (a broadcast's or scatter's root; the other
/// ranks of a reduce or gather; a scan's first rank) and so leaves as soon as
/// its data is out, without waiting for a header of a peer that sends it
/// nothing (over tcp that header was a second message per call and rank:
/// 11-15 us per small broadcast against 8-10 without it, docs/performance.md
/// "Session 36"). A rank that reads checks the header of every peer it reads
/// from before any of its data, so its output is never built from a
/// mismatched call; a rank that only sends has no output to spoil, and hears
/// of a mismatch at its next call, which finds the odd peer's bytes where
/// none belong (check_header, comm_checks::probe_unchecked), or from the
/// rank that saw it (spread_failure).
inline constexpr bool headers_ride_with_data(collective_kind k) {
  return call_header::rooted(k) || k == collective_kind::scan || k == collective_kind::exscan;
}

/// The mismatch a rank finds after it left collective h.unchecked without
/// `peer`'s header: `theirs` came from the peer in that call's place.
CCLITE_SETUP_CODE_BEGIN
inline status unchecked_mismatch(const header_state& h, int self, const call_header& theirs, int peer) {
  const status m = mismatch_error(h.unchecked, self, theirs, peer);
  return status(errc::mismatch, m.message() + " (found after this rank had left that call: it read nothing from rank " +
                                    std::to_string(peer) + " there, as the root of a broadcast or scatter and the "
                                    "other ranks of a reduce or gather do, and rank " + std::to_string(peer) +
                                    " sent it data)");
}
CCLITE_SETUP_CODE_END

/// Whether `theirs`, from `peer`, belongs to a collective this rank left
/// unchecked (h.unchecked_from .. h.unchecked.seq): then the peer sent data
/// this rank did not expect. Any header from the peer ends the watch (the
/// stream is in order: one of a later call means nothing came for those).
inline bool stray_of_unchecked(header_state& h, const call_header& theirs, int peer) {
  if (h.unchecked_peer != peer) return false;
  h.unchecked_peer = -1;
  return theirs.magic == call_header::magic_value && theirs.comm == h.unchecked.comm &&
         theirs.seq >= h.unchecked_from && theirs.seq <= h.unchecked.seq;
}

/// Reads and checks `prev`'s header through primitives `p` (32 bytes).
template <class Prims>
status check_header(Prims& p, header_state& h, int self, int prev) {
  std::uint8_t in[call_header::wire_bytes];
  status st = p.recv(in, sizeof in);
  if (!st.ok()) return st;
  h.seen[prev] = h.expect.seq;
  const call_header theirs = call_header::decode(in);
  if (stray_of_unchecked(h, theirs, prev)) return unchecked_mismatch(h, self, theirs, prev);
  if (theirs != h.expect) return mismatch_error(h.expect, self, theirs, prev);
  return {};
}

/// Primitives over (prev -> this rank -> next) that put this rank's header
/// before its first byte to `next`, and check `prev`'s header before the first
/// byte they consume from it, once per collective and direction. Forwards
/// every verb of primitives<P, N> (algorithm/primitives.hpp). The ring
/// neighbours exchange headers in every collective but the riding ones
/// (comm_checks::begin_checks / end_checks), whatever the algorithm, so at
/// least one rank of any disagreeing pair sees it; in a riding call a header
/// that is long in coming is looked for in the store as well (h->overdue).
template <class Prims>
class checked_primitives {
 public:
  /// `h` null = no checking. `eager_bytes`: a sendrecv that sends at most this
  /// many bytes sends them before it checks (they fit the link buffer), so a
  /// small exchange costs one trip, not two.
  checked_primitives(Prims& p, header_state* h, int self, int prev, int next, std::size_t eager_bytes)
      : p_(p), h_(h && h->active ? h : nullptr), self_(self), prev_(prev), next_(next), eager_(eager_bytes) {}

  status send(const std::uint8_t* src, std::size_t bytes) {
    CCLITE_TRY(out(bytes));
    return p_.send(src, bytes);
  }
  status send_prefixed(const std::uint8_t* head, std::size_t hbytes, const std::uint8_t* src, std::size_t bytes) {
    CCLITE_TRY(out(hbytes + bytes));
    return p_.send_prefixed(head, hbytes, src, bytes);
  }
  status recv(std::uint8_t* o, std::size_t bytes) {
    CCLITE_TRY(in(bytes));
    return p_.recv(o, bytes);
  }
  status recv_copy_send(std::uint8_t* o, std::size_t bytes) {
    CCLITE_TRY(in(bytes));
    CCLITE_TRY(out(bytes));
    return p_.recv_copy_send(o, bytes);
  }
  status recv_reduce_send(const std::uint8_t* local, std::size_t bytes) {
    CCLITE_TRY(in(bytes));
    CCLITE_TRY(out(bytes));
    return p_.recv_reduce_send(local, bytes);
  }
  status recv_reduce_copy_send(const std::uint8_t* local, std::uint8_t* o, std::size_t bytes, int divide_by = 0) {
    CCLITE_TRY(in(bytes));
    CCLITE_TRY(out(bytes));
    return p_.recv_reduce_copy_send(local, o, bytes, divide_by);
  }
  status recv_reduce_copy(const std::uint8_t* local, std::uint8_t* o, std::size_t bytes) {
    CCLITE_TRY(in(bytes));
    return p_.recv_reduce_copy(local, o, bytes);
  }
  status recv_copy_reduce_send(const std::uint8_t* local, std::uint8_t* o, std::size_t bytes) {
    CCLITE_TRY(in(bytes));
    CCLITE_TRY(out(bytes));
    return p_.recv_copy_reduce_send(local, o, bytes);
  }
  status sendrecv(const std::uint8_t* src, std::size_t send_bytes, std::uint8_t* o, std::size_t recv_bytes) {
    CCLITE_TRY(out(send_bytes));
    if (needs_check(recv_bytes) && send_bytes + call_header::wire_bytes <= eager_) {
      CCLITE_TRY(p_.send(src, send_bytes));  // fits the buffer: cannot block on the peer
      CCLITE_TRY(in(recv_bytes));
      return p_.recv(o, recv_bytes);
    }
    CCLITE_TRY(in(recv_bytes));
    return p_.sendrecv(src, send_bytes, o, recv_bytes);
  }
  status finish() { return p_.finish(); }
  void will_finish() noexcept { p_.will_finish(); }
  void stream_output(bool out, bool fifo) noexcept { p_.stream_output(out, fifo); }

  /// Sends our header to `next` if it has not had it in this collective.
  status send_header() { return out(1); }
  /// Checks `prev`'s header if not yet done in this collective.
  status check_prev() { return in(1); }

 private:
  bool needs_check(std::size_t bytes) const {
    return h_ && bytes && h_->seen[prev_] != h_->expect.seq;
  }
  status out(std::size_t bytes) {
    if (!h_ || !bytes || h_->sent[next_] == h_->out.seq) return {};
    h_->sent[next_] = h_->out.seq;
    std::uint8_t b[call_header::wire_bytes];
    h_->out.encode(b);
    return p_.send(b, sizeof b);
  }
  status in(std::size_t bytes) {
    if (!needs_check(bytes)) return {};
    // A riding call's peer sends its header only with data it sends us. Two
    // ranks whose calls differ so that each waits for the other (each its own
    // gather's root) would wait for their deadline: after each slice, the
    // overdue hook compares calls through the store instead.
    if (h_->riding && h_->overdue && !p_.prev_has_data()) {  // (with data there: no clock read)
      for (milliseconds slice = header_wait_slice;; slice = std::min(slice * 2, header_wait_max)) {
        CCLITE_TRY(p_.await_prev(deadline::after(slice)));
        if (p_.prev_has_data()) break;
        CCLITE_TRY(h_->overdue(h_->overdue_ctx, prev_));
      }
    }
    return check_header(p_, *h_, self_, prev_);
  }

  Prims& p_;
  header_state* h_;
  int self_, prev_, next_;
  std::size_t eager_;
};

}  // namespace cclite::detail
