// cclite/cuda/ipc_plan.hpp - what the CUDA IPC path does for one chunk, free of CUDA.
//
// Internal (cclite::cuda::detail). ipc_engine.hpp runs these steps with device
// copies, kernels and interprocess events; tests/gpu/cuda_test.cpp runs the same
// steps on host memory for every collective, rank count and ragged size, with
// the ranks in lockstep between exchanges, and checks the results and that no
// rank reads a slot it did not wait for or that its owner writes meanwhile
// (DESIGN.md: schedules are type-free code). Every rank's slot holds one chunk:
// the whole chunk, or for the per-rank collectives (staged_chunk_elems) piece c
// of every rank's block side by side, one row each.
//
// The steps of chunk c, as calls on a visitor, in order:
//   copy_in(slot_off, send_off, bytes)        this rank's send -> its own slot
//   exchange(ev, from)                        record event `ev`, host barrier, then
//                                             wait for the peers' `ev`: every peer
//                                             (-1), rank `from` only, or none (-2)
//   reduce(to_slot, out_off, slot_off, elems, first)
//                                             out = the op over every rank's slot at
//                                             slot_off, starting with rank `first`;
//                                             out is this rank's own slot at out_off
//                                             (to_slot) or its recv at out_off
//   copy_out(recv_off, from_rank, slot_off, bytes)
//                                             rank from_rank's slot -> this rank's recv
// Offsets are bytes; send / recv offsets count from the caller's pointers.
//
// Per collective: allreduce reduces its own segment from every slot in place,
// then every rank copies every segment out (two exchanges); the others take
// one: broadcast reads the root's slot, reduce and gather every slot on the
// root, allgather(v) every slot everywhere, reduce_scatter reduces its own row
// of every slot, scatter and alltoall(v) read row `rank` of the root's / every
// slot. Point to point is not here: native_engine.hpp gives it to the staged
// path.
#pragma once

#include <algorithm>
#include <cstddef>

#include <cclite/collective/op.hpp>
#include <cclite/cuda/staged_plan.hpp>

namespace cclite::cuda::detail {

/// Elements [offset, offset + count) of an n-element allreduce chunk that rank
/// q reduces: ceil(n / size) elements rounded up to a multiple of `align`
/// elements (so every segment of an aligned chunk starts 16-byte aligned, which
/// the kernels' vector path needs), the last segments shorter or empty.
struct ipc_segment {
  std::size_t offset = 0;
  std::size_t count = 0;
};

inline ipc_segment ipc_segment_of(std::size_t n, int size, int q, std::size_t align) noexcept {
  const std::size_t ranks = static_cast<std::size_t>(std::max(1, size));
  std::size_t per = (n + ranks - 1) / ranks;
  if (align > 1) per = (per + align - 1) / align * align;
  const std::size_t begin = std::min(n, per * static_cast<std::size_t>(std::max(0, q)));
  return {begin, std::min(n, begin + per) - begin};
}

/// Elements per 16 bytes for `elem`-byte elements (at least 1): ipc_segment_of's `align`.
inline std::size_t ipc_align_elems(std::size_t elem) noexcept { return std::max<std::size_t>(1, 16 / elem); }

/// The events of a slot, in the order a chunk records them.
enum ipc_event_kind : int { ipc_in = 0, ipc_red = 1, ipc_done = 2 };

/// One call as the plan sees it (every rank's view, arguments already checked).
struct ipc_call : staged_call {
  /// This rank's own block needs no copy: allgather(v) with send == recv + its
  /// offset, gather's root with the same, scatter's root with recv == send +
  /// root * count (the communicator's in-place forms).
  bool own_block_in_place = false;
};

/// ipc_call::own_block_in_place for a call with `block` bytes per rank.
inline bool own_block_in_place(collective_kind k, const void* send, const void* recv, std::size_t block, int rank,
                               int root) noexcept {
  const auto* s = static_cast<const unsigned char*>(send);
  const auto* r = static_cast<const unsigned char*>(recv);
  const std::size_t mine = static_cast<std::size_t>(rank) * block;
  if (k == collective_kind::allgather || (k == collective_kind::gather && rank == root)) return s && r && s == r + mine;
  if (k == collective_kind::scatter && rank == root) return s && r && r == s + mine;
  return false;
}

/// Calls `v` for the steps of chunk `c` of `call` (see the file comment).
template <class Visitor>
void ipc_chunk_plan(const ipc_call& call, std::size_t c, Visitor& v) {
  const collective_kind k = call.kind;
  if (is_v(k)) {
    // allgatherv: this rank's piece at the start of its slot, every peer reads
    // it; alltoallv: row p of the slot = the piece for rank p, which reads it.
    // Each row as long as its block's piece of this chunk (maybe empty).
    const std::size_t es = call.elem, per = call.per_chunk, row = per * es, n = static_cast<std::size_t>(call.size);
    const std::size_t me = static_cast<std::size_t>(call.rank);
    const std::size_t at = c * per;  // the chunk's element offset in each block
    const bool gv = k == collective_kind::allgatherv;
    for (std::size_t p = gv ? me : 0; p < (gv ? me + 1 : n); ++p)
      if (const std::size_t w = v_piece(call.counts[p], per, c) * es)
        v.copy_in(gv ? 0 : p * row, ((gv ? 0 : call.displs[p]) + at) * es, w);
    v.exchange(ipc_in, -1);
    const std::size_t* cnt = gv ? call.counts : call.rcounts;
    const std::size_t* dsp = gv ? call.displs : call.rdispls;
    for (std::size_t q = 0; q < n; ++q) {
      if (gv && q == me && call.own_block_in_place) continue;
      if (const std::size_t w = v_piece(cnt[q], per, c) * es)
        v.copy_out((dsp[q] + at) * es, static_cast<int>(q), gv ? 0 : me * row, w);
    }
    return;
  }
  const int me = call.rank;
  const bool is_root = me == call.root;
  const std::size_t es = call.elem;
  const std::size_t off = c * call.per_chunk * es;  // the chunk's byte offset in each rank's block
  const std::size_t n = std::min(call.per_chunk, call.count - c * call.per_chunk);
  const std::size_t w = n * es;
  const std::size_t pitch = call.count * es;  // bytes between two ranks' blocks in send / recv
  // in: this rank's part of the chunk into its slot; reduce_scatter, alltoall
  // and scatter's root: one row per rank (row r = piece c of block r).
  const bool rows_in = k == collective_kind::reduce_scatter || k == collective_kind::alltoall ||
                       (k == collective_kind::scatter && is_root);
  if (rows_in) {
    for (int r = 0; r < call.size; ++r) v.copy_in(static_cast<std::size_t>(r) * w, static_cast<std::size_t>(r) * pitch + off, w);
  } else if (!(k == collective_kind::broadcast && !is_root) && k != collective_kind::scatter &&
             !(k == collective_kind::gather && is_root && call.own_block_in_place)) {
    v.copy_in(0, off, w);
  }
  // Whose slots this rank reads next: every peer (-1), one rank, or none (-2).
  int from = -1;
  if (k == collective_kind::broadcast || k == collective_kind::scatter) from = is_root ? -2 : call.root;
  if ((k == collective_kind::reduce || k == collective_kind::gather) && !is_root) from = -2;
  v.exchange(ipc_in, from);
  switch (k) {
    case collective_kind::allreduce: {
      // Own segment reduced in place in the own slot, then every segment out.
      const std::size_t align = ipc_align_elems(es);
      const ipc_segment my = ipc_segment_of(n, call.size, me, align);
      if (my.count) v.reduce(true, my.offset * es, my.offset * es, my.count, me);
      v.exchange(ipc_red, -1);
      for (int q = 0; q < call.size; ++q) {
        const ipc_segment sg = ipc_segment_of(n, call.size, q, align);
        if (sg.count) v.copy_out(off + sg.offset * es, q, sg.offset * es, sg.count * es);
      }
      break;
    }
    case collective_kind::reduce:
      if (is_root) v.reduce(false, off, 0, n, me);
      break;
    case collective_kind::broadcast:
      if (!is_root) v.copy_out(off, call.root, 0, w);
      break;
    case collective_kind::allgather:
      for (int q = 0; q < call.size; ++q) {
        if (q == me && call.own_block_in_place) continue;  // already in place
        v.copy_out(static_cast<std::size_t>(q) * pitch + off, q, 0, w);
      }
      break;
    case collective_kind::gather:
      for (int q = 0; is_root && q < call.size; ++q) {
        if (q == me && call.own_block_in_place) continue;
        v.copy_out(static_cast<std::size_t>(q) * pitch + off, q, 0, w);
      }
      break;
    case collective_kind::scatter:
      if (!(is_root && call.own_block_in_place)) v.copy_out(off, call.root, static_cast<std::size_t>(me) * w, w);
      break;
    case collective_kind::alltoall:
      // Row `me` of every rank's slot is the piece it sends here.
      for (int q = 0; q < call.size; ++q) v.copy_out(static_cast<std::size_t>(q) * pitch + off, q, static_cast<std::size_t>(me) * w, w);
      break;
    case collective_kind::reduce_scatter:
      v.reduce(false, off, static_cast<std::size_t>(me) * w, n, me);
      break;
    default:
      break;  // not offered on device buffers (device_communicator refuses it)
  }
}

}  // namespace cclite::cuda::detail
