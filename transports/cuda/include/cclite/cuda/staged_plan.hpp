// cclite/cuda/staged_plan.hpp - what the staged path does for one chunk, free of CUDA.
//
// Internal (cclite::cuda::detail). staged_engine.hpp runs these steps with
// device <-> pinned copies and a CUDA host function; tests/gpu/cuda_test.cpp
// runs the same steps with memcpy and a real CPU communicator on 2-3
// processes for every collective, in place or not, and checks the results
// (DESIGN.md: schedules are type-free code).
//
// The steps of chunk c, as calls on a visitor, in order: down (at most once;
// the v-variants once per non-empty row), host (once), up (as down):
//   down(slot_off, src_off, src_pitch, width, rows)
//                       `rows` rows of `width` bytes: the caller's send at
//                       src_off + r * src_pitch -> the slot at slot_off + r * width
//   host(count)         the CPU call on the slot (staged_host_call): `count`
//                       elements per rank (the v-variants and sendrecv: 0, their
//                       counts come from staged_v_counts)
//   up(dst_off, dst_pitch, slot_off, width, rows)
//                       the slot at slot_off + r * width -> the caller's recv at
//                       dst_off + r * dst_pitch
// Offsets are bytes.
//
// What each rank copies (send / recv: the caller's device buffers; `count`
// elements, per rank for the per-rank collectives):
//   allreduce       send chunk -> slot; allreduce in place; slot -> recv chunk
//   broadcast       root: buf chunk -> slot; the others: nothing. broadcast in
//                   place; the others: slot -> buf chunk, the root: nothing
//   reduce          send chunk -> slot; reduce (in place on the root); root only:
//                   slot -> recv chunk
//   allgather       this rank's send chunk -> its piece of the slot; allgather in
//                   place; every piece -> its rank's block of recv (one 2D copy)
//   reduce_scatter  the chunk of every rank's block of send -> the slot (one 2D
//                   copy); reduce_scatter in place; this rank's piece -> recv chunk
//   gather          as allgather, but only the root copies the slot out
//   scatter         root: as reduce_scatter's way in; the others: nothing. scatter
//                   in place; this rank's piece -> recv chunk
//   alltoall        as reduce_scatter's way in; alltoall in place (the CPU
//                   communicator's in-place form); every piece -> recv (2D copy)
//   allgatherv      as allgather, each rank's row as long as its block's piece
//                   (a copy per non-empty row)
//   alltoallv       the outgoing pieces -> rows 0..size-1, alltoallv from them
//                   into rows size..2 size-1, those -> recv (a copy per row);
//                   in place (send == recv) with the recv counts both ways
//   sendrecv        the send chunk -> row 0, sendrecv, row 1 -> the recv chunk;
//                   as many chunks as the longer direction needs (after the
//                   other ran out, a send or a recv alone)
//   send / recv     sender: send chunk -> slot, then the CPU send; receiver: the
//                   CPU recv, then slot -> recv chunk. Chunks match in order (both
//                   sides cut `count` alike), and the CPU send / recv rules hold:
//                   a chunk larger than the link buffer waits for its receiver,
//                   so two ranks sending to each other first deadlock (until the
//                   timeout) exactly as with host buffers
//
// Chunking: the chunks are separate CPU collectives matched in order across
// ranks, so every rank must cut a call the same way. allreduce, broadcast and
// reduce (and send / recv) cut `count` into chunk_bytes / element-size pieces.
// allgather, reduce_scatter, gather, scatter and alltoall cut the per-rank
// count instead, chunk_bytes / (element size x ranks) elements of each rank's
// piece per chunk: a chunk then holds piece c of every rank side by side, so
// each chunk is one ordinary CPU call of n elements per rank on every rank
// (cutting the whole size x count buffer would give chunks that start in the
// middle of one rank's block on one rank and not on another, i.e. different
// calls). The result depends only on (count, dtype, ranks, chunk_bytes), which
// every rank shares. The v-variants cut every block into the same pieces and
// take as many chunks as the largest block needs (every rank must agree on
// it: v_largest_block), piece c of a block possibly short or empty; alltoallv
// needs 2 x ranks rows, sendrecv 2 (one each way, each running out at its own
// chunk).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cclite/collective/op.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>

namespace cclite::cuda::detail {

/// allgather(v), reduce_scatter, gather, scatter, alltoall(v): buffers of one
/// piece per rank, chunked per piece.
inline bool per_rank_pieces(collective_kind k) noexcept {
  return k == collective_kind::allgather || k == collective_kind::reduce_scatter ||
         k == collective_kind::gather || k == collective_kind::scatter || k == collective_kind::alltoall ||
         k == collective_kind::allgatherv || k == collective_kind::alltoallv;
}

/// allgatherv, alltoallv: per-rank counts and displacements.
inline bool is_v(collective_kind k) noexcept {
  return k == collective_kind::allgatherv || k == collective_kind::alltoallv;
}

/// Elements of chunk c of a block of `total` elements cut in pieces of `per`.
inline std::size_t v_piece(std::size_t total, std::size_t per, std::size_t c) noexcept {
  const std::size_t from = std::min(total, c * per);
  return std::min(per, total - from);
}

/// Elements of each rank's piece in one staged chunk (of the whole buffer for
/// allreduce, broadcast, reduce, send, recv; of each direction for sendrecv;
/// each row's length for the v-variants). invalid_argument when a
/// `chunk_bytes` slot cannot hold one element of every rank.
inline result<std::size_t> staged_chunk_elems(collective_kind k, dtype t, int size, std::size_t chunk_bytes) {
  // alltoallv's slot holds what goes out and what comes in, one row per rank each.
  const std::size_t ranks = static_cast<std::size_t>(std::max(1, size));
  const std::size_t rows = k == collective_kind::alltoallv   ? 2 * ranks
                           : per_rank_pieces(k)               ? ranks
                           : k == collective_kind::sendrecv ? 2  // what goes out, what comes in
                                                            : 1;
  const std::size_t row_bytes = size_of(t) * rows;
  const std::size_t per = chunk_bytes / row_bytes;
  if (per == 0) {
    return make_error(errc::invalid_argument,
                      "device %s: a staging chunk of %zu bytes cannot hold one %s element of each of %d "
                      "ranks; set device_options::chunk_bytes to at least %zu",
                      to_string(k), chunk_bytes, to_string(t), size, row_bytes);
  }
  return per;
}

/// One call as the plans see it (arguments already checked; ipc_plan.hpp's
/// ipc_call adds one field). `root`: the rooted ones' root, send's / recv's
/// peer, sendrecv's destination. The v-variants: `count` is the largest block
/// any rank sends or receives (all ranks must agree on it: it sets the number
/// of chunks), counts / displs the send side (allgatherv: every rank's),
/// rcounts / rdispls alltoallv's receive side (size entries each).
struct staged_call {
  collective_kind kind = collective_kind::allreduce;
  int rank = 0;
  int size = 1;
  int root = 0;
  std::size_t count = 0;      ///< elements (per rank for the per-rank collectives)
  std::size_t elem = 1;       ///< bytes per element
  std::size_t per_chunk = 1;  ///< staged_chunk_elems
  const std::size_t* counts = nullptr;
  const std::size_t* displs = nullptr;
  const std::size_t* rcounts = nullptr;
  const std::size_t* rdispls = nullptr;
  std::size_t count2 = 0;  ///< sendrecv: elements received (`count`: sent, `root`: the destination)
  int peer2 = 0;           ///< sendrecv: the source

  std::size_t chunks() const noexcept {
    const std::size_t most = std::max(count, count2);
    return per_chunk ? (most + per_chunk - 1) / per_chunk : 0;
  }
};

/// The chunk's host call takes its counts from a staged_v_chunk: the
/// v-variants, and sendrecv (whose two directions run out at different chunks).
inline bool counts_per_chunk(collective_kind k) noexcept { return is_v(k) || k == collective_kind::sendrecv; }

/// The v-variants' arrays as the caller passed them (size entries each; an
/// in-place alltoallv passes its recv arrays as the send ones too), and
/// sendrecv's receive side.
struct v_args {
  const std::size_t* counts = nullptr;   ///< allgatherv: every rank's count; alltoallv: send counts
  const std::size_t* displs = nullptr;   ///< their displacements (elements)
  const std::size_t* rcounts = nullptr;  ///< alltoallv: recv counts
  const std::size_t* rdispls = nullptr;  ///< alltoallv: recv displacements
  std::size_t count2 = 0;                 ///< sendrecv: elements received
  int peer2 = 0;                          ///< sendrecv: the source

  /// Copies them into `c`: an op_desc or a plan's call (the same field names).
  template <class Call>
  void apply(Call& c) const {
    c.counts = counts;
    c.displs = displs;
    c.rcounts = rcounts;
    c.rdispls = rdispls;
    c.count2 = count2;
    c.peer2 = peer2;
  }
};

/// The common fields of a call, and the v-variants' / sendrecv's.
template <class Call>
void describe_call(Call& c, collective_kind k, int rank, int size, int root, std::size_t count, dtype t,
                   std::size_t per_chunk, const v_args& va) {
  c.kind = k;
  c.rank = rank;
  c.size = size;
  c.root = root;
  c.count = count;
  c.elem = size_of(t);
  c.per_chunk = per_chunk;
  va.apply(c);
}

/// The largest block of a v-variant call, which sets its number of chunks on
/// every rank: allgatherv's from its counts (equal on all ranks); alltoallv's
/// agreed with an allreduce(max) on `agree` (each rank knows only its own).
template <class Comm>
result<std::size_t> v_largest_block(collective_kind k, const v_args& va, int size, Comm* agree) {
  std::uint64_t m = 0;
  for (int r = 0; r < size; ++r) {
    m = std::max<std::uint64_t>(m, va.counts[r]);
    if (k == collective_kind::alltoallv) m = std::max<std::uint64_t>(m, va.rcounts[r]);
  }
  if (k == collective_kind::alltoallv) CCLITE_TRY(agree->allreduce(&m, &m, 1, dtype::uint64, reduce_op::max));
  return static_cast<std::size_t>(m);
}

/// The host call's counts and displacements (elements, from the slot) for
/// chunk c of a v-variant or a sendrecv; `per` is the row length. Filled by
/// staged_v_counts.
struct staged_v_chunk {
  std::size_t per = 0;
  std::vector<std::size_t> counts, displs, rcounts, rdispls;
  int peer2 = 0;  ///< sendrecv's source (its counts: counts[0] out, rcounts[0] in)
};

/// Chunk c's pieces of every block: allgatherv row r = rank r's piece;
/// alltoallv rows 0..size-1 go out, rows size..2 size-1 come in; sendrecv
/// counts[0] out, rcounts[0] in. Does not allocate once `out` has held size
/// entries.
inline void staged_v_counts(const staged_call& call, std::size_t c, staged_v_chunk& out) {
  const std::size_t n = static_cast<std::size_t>(call.size), per = call.per_chunk;
  out.per = per;
  out.peer2 = call.peer2;
  out.counts.resize(n);
  out.displs.resize(n);
  out.rcounts.resize(n);
  out.rdispls.resize(n);
  if (call.kind == collective_kind::sendrecv) {
    out.counts[0] = v_piece(call.count, per, c);
    out.rcounts[0] = v_piece(call.count2, per, c);
    return;
  }
  for (std::size_t r = 0; r < n; ++r) {
    out.counts[r] = v_piece(call.counts[r], per, c);
    out.displs[r] = r * per;
    out.rcounts[r] = call.rcounts ? v_piece(call.rcounts[r], per, c) : 0;
    out.rdispls[r] = r * per;  // from the slot's second half (alltoallv)
  }
}

/// Calls `v` for the steps of chunk `c` of `call` (see the file comment).
template <class Visitor>
void staged_chunk_plan(const staged_call& call, std::size_t c, Visitor& v) {
  const collective_kind k = call.kind;
  if (is_v(k)) {
    // One row per rank (and alltoallv's incoming rows after them), each as
    // long as that block's piece of this chunk: a copy per non-empty row.
    const std::size_t es = call.elem, per = call.per_chunk, row = per * es, n = static_cast<std::size_t>(call.size);
    const std::size_t me = static_cast<std::size_t>(call.rank);
    const std::size_t at = c * per;  // the chunk's element offset in each block
    if (k == collective_kind::allgatherv) {
      if (const std::size_t w = v_piece(call.counts[me], per, c) * es) v.down(me * row, at * es, 0, w, 1);
    } else {
      for (std::size_t p = 0; p < n; ++p)
        if (const std::size_t w = v_piece(call.counts[p], per, c) * es) v.down(p * row, (call.displs[p] + at) * es, 0, w, 1);
    }
    v.host(0);
    const std::size_t* cnt = k == collective_kind::allgatherv ? call.counts : call.rcounts;
    const std::size_t* dsp = k == collective_kind::allgatherv ? call.displs : call.rdispls;
    const std::size_t in = k == collective_kind::allgatherv ? 0 : n * row;  // where incoming rows start
    for (std::size_t q = 0; q < n; ++q)
      if (const std::size_t w = v_piece(cnt[q], per, c) * es) v.up((dsp[q] + at) * es, 0, in + q * row, w, 1);
    return;
  }
  if (k == collective_kind::sendrecv) {
    // Row 0 goes out, row 1 comes in; either runs out first (a zero-length part).
    const std::size_t es = call.elem, per = call.per_chunk, at = c * per * es;
    if (const std::size_t w = v_piece(call.count, per, c) * es) v.down(0, at, 0, w, 1);
    v.host(0);
    if (const std::size_t w = v_piece(call.count2, per, c) * es) v.up(at, 0, per * es, w, 1);
    return;
  }
  const bool is_root = call.rank == call.root;
  const std::size_t off = c * call.per_chunk * call.elem;  // the chunk's byte offset in each rank's block
  const std::size_t n = std::min(call.per_chunk, call.count - c * call.per_chunk);
  const std::size_t w = n * call.elem;
  const std::size_t pitch = call.count * call.elem;  // bytes between two ranks' blocks in send / recv
  const std::size_t rows = per_rank_pieces(k) ? static_cast<std::size_t>(call.size) : 1;
  const std::size_t mine = rows > 1 ? static_cast<std::size_t>(call.rank) * w : 0;  // this rank's piece
  // Which copies this rank makes, and whether they move every rank's row or its own piece.
  const bool down = !((k == collective_kind::broadcast || k == collective_kind::scatter) && !is_root) &&
                    k != collective_kind::recv;
  const bool up = !(k == collective_kind::broadcast && is_root) &&
                  !((k == collective_kind::reduce || k == collective_kind::gather) && !is_root) &&
                  k != collective_kind::send;
  const bool rows_down = k == collective_kind::reduce_scatter || k == collective_kind::alltoall ||
                         k == collective_kind::scatter;
  const bool rows_up = k == collective_kind::allgather || k == collective_kind::alltoall ||
                       k == collective_kind::gather;
  if (down) {
    if (rows_down) v.down(0, off, pitch, w, rows);
    else v.down(mine, off, pitch, w, 1);
  }
  v.host(n);
  if (up) {
    if (rows_up) v.up(off, pitch, 0, w, rows);
    else v.up(off, pitch, mine, w, 1);
  }
}

/// The CPU call of one chunk, in place on the slot `h` (`count` elements per
/// rank; this rank's piece at its row for the per-rank collectives). The
/// v-variants and sendrecv take their counts from `vc` (staged_v_counts).
template <class Comm>
status staged_host_call(Comm& c, collective_kind k, unsigned char* h, std::size_t count, dtype t, reduce_op op,
                        int root, const staged_v_chunk* vc = nullptr) {
  unsigned char* mine = h + (per_rank_pieces(k) ? static_cast<std::size_t>(c.rank()) * count * size_of(t) : 0);
  const bool is_root = c.rank() == root;
  if (counts_per_chunk(k) && !vc) return make_error(errc::invalid_argument, "%s: staged chunk without its counts", to_string(k));
  switch (k) {
    case collective_kind::sendrecv: {
      // A direction that ran out is left out of the chunk's call: its peer cut
      // the same count alike, so each chunk's message meets a receive of its
      // size (point-to-point envelopes, algorithm/p2p_envelope.hpp), and a
      // chunk with nothing either way is no call.
      const std::size_t out = vc->counts[0], in = vc->rcounts[0];
      unsigned char* rbuf = h + vc->per * size_of(t);
      if (out && in) return c.sendrecv(h, out, root, rbuf, in, vc->peer2, t);
      if (out) return c.send(h, out, t, root);
      if (in) return c.recv(rbuf, in, t, vc->peer2);
      return {};
    }
    case collective_kind::allgatherv: {
      const std::size_t me = static_cast<std::size_t>(c.rank());
      return c.allgatherv(h + vc->displs[me] * size_of(t), vc->counts[me], h, vc->counts.data(), vc->displs.data(), t);
    }
    case collective_kind::alltoallv:
      return c.alltoallv(h, vc->counts.data(), vc->displs.data(),
                         h + static_cast<std::size_t>(c.size()) * vc->per * size_of(t), vc->rcounts.data(),
                         vc->rdispls.data(), t);
    case collective_kind::allreduce: return c.allreduce(h, h, count, t, op);
    case collective_kind::broadcast: return c.broadcast(h, count, t, root);
    case collective_kind::reduce: return c.reduce(h, is_root ? h : nullptr, count, t, op, root);
    case collective_kind::allgather: return c.allgather(mine, h, count, t);
    case collective_kind::reduce_scatter: return c.reduce_scatter(h, mine, count, t, op);
    case collective_kind::gather: return c.gather(mine, is_root ? h : nullptr, count, t, root);
    case collective_kind::scatter: return c.scatter(is_root ? h : nullptr, mine, count, t, root);
    case collective_kind::alltoall: return c.alltoall(h, h, count, t);  // in place
    case collective_kind::send: return c.send(h, count, t, root);
    case collective_kind::recv: return c.recv(h, count, t, root);
    default: return make_error(errc::invalid_argument, "%s is not a staged collective", to_string(k));
  }
}

}  // namespace cclite::cuda::detail
