// cclite/algorithm/ring_gather.hpp - ring allgather(v), ring reduce-scatter(v), chain reduce.
//
// All three move data around the ring (prev -> this rank -> next) in rounds of
// at most `chunk` elements per block, like ring_allreduce, so a round always
// fits the link buffers.
//
//   allgather(v)    n-1 steps, each rank sends (n-1)/n of the output:
//                   step 0 send own block, then recv_copy_send, last step recv.
//                   Cost (n-1) alpha + (n-1)/n * N beta (N = output bytes).
//   reduce_scatter  n-1 steps: send, recv_reduce_send..., last recv_reduce_copy
//   (v)             into this rank's own block. Same cost plus the reductions.
//   reduce (chain)  the ring cut open after the root: rank root+1 sends, the
//                   others reduce and forward, the root keeps the result.
//                   Pipelined, so ~ (n-1) alpha + N beta for large N.
#pragma once

#include <cstring>

#include <cclite/algorithm/primitives.hpp>
#include <cclite/algorithm/schedule.hpp>

namespace cclite {

/// Which rank sits at each ring position, and where each rank's block lives.
struct ring_blocks {
  const int* ring;         ///< ring[q] = rank at ring position q
  const std::size_t* len;  ///< len[r] = elements of rank r's block; null: max_len each
  const std::size_t* off;  ///< off[r] = element offset of rank r's block; null: r * max_len
  std::size_t max_len;

  std::size_t len_of(int r) const { return len ? len[r] : max_len; }
  std::size_t off_of(int r) const { return off ? off[r] : static_cast<std::size_t>(r) * max_len; }
};

/// Allgather(v): every block already sits at its place in `recv` on its owner
/// (the caller copies its own contribution in first). Moves the others.
/// `out_of_place`: the caller's send buffer was not its block of `recv`; then
/// outputs of ring_stream_output_min_bytes and more are written with
/// non-temporal stores (primitives.hpp).
template <class Prims>
status ring_allgather(Prims& prims, std::uint8_t* recv, std::size_t elem, int n, int pos,
                      const ring_blocks& b, std::size_t chunk, bool out_of_place = false) {
  if (n == 1) return {};
  std::size_t total = 0;
  for (int r = 0; r < n; ++r) total += b.len[r] * elem;
  const bool stream = out_of_place && total >= ring_stream_output_min_bytes;
  prims.stream_output(stream, stream);
  const std::size_t rounds = b.max_len ? (b.max_len + chunk - 1) / chunk : 0;
  auto block_at = [&](int k) { return b.ring[((pos - k) % n + n) % n]; };
  auto part = [&](int r, std::size_t round, std::size_t& begin) {
    std::size_t lo = std::min(b.len[r], round * chunk), hi = std::min(b.len[r], lo + chunk);
    begin = (b.off[r] + lo) * elem;
    return (hi - lo) * elem;
  };
  for (std::size_t rd = 0; rd < rounds; ++rd) {
    // The last sending verb carries the stream's end pad (primitives::will_finish).
    const bool last = rd + 1 == rounds;
    std::size_t at = 0, bytes = part(block_at(0), rd, at);
    if (last && n == 2) prims.will_finish();
    CCLITE_TRY(prims.send(recv + at, bytes));                       // our own block
    for (int k = 1; k < n - 1; ++k) {
      bytes = part(block_at(k), rd, at);
      if (last && k == n - 2) prims.will_finish();
      CCLITE_TRY(prims.recv_copy_send(recv + at, bytes));           // keep and pass on
    }
    bytes = part(block_at(n - 1), rd, at);
    CCLITE_TRY(prims.recv(recv + at, bytes));                       // the last one stops here
  }
  return prims.finish();
}

/// Reduce-scatter(v): `send` holds every rank's block (block r: b.len[r]
/// elements at element b.off[r]); `recv` receives this rank's (`self`) block
/// reduced over all ranks. `recv` may alias send's own block (in place).
/// Blocks of different lengths move in the same rounds of `chunk` elements:
/// a block that has run out sends nothing in the later rounds.
template <class Prims>
status ring_reduce_scatter(Prims& prims, const std::uint8_t* send, std::uint8_t* recv, const ring_blocks& b,
                           std::size_t elem, const reduction& red, int n, int pos, int self, std::size_t chunk) {
  const std::size_t own_off = b.off_of(self) * elem, own_len = b.len_of(self);
  if (n == 1) {
    if (own_len && send + own_off != recv) std::memcpy(recv, send + own_off, own_len * elem);
    return {};
  }
  // Step k handles the block of ring position p-k-1, so the last step (k = n-1)
  // completes the block of ring position p: this rank's own.
  auto block_at = [&](int k) { return b.ring[((pos - k - 1) % n + n) % n]; };
  const std::size_t rounds = b.max_len ? (b.max_len + chunk - 1) / chunk : 0;
  for (std::size_t rd = 0; rd < rounds; ++rd) {
    // Step k's piece of its block in this round: [lo, hi) of it, as bytes.
    auto piece = [&](int k, std::size_t& at) {
      const int r = block_at(k);
      const std::size_t lo = std::min(b.len_of(r), rd * chunk), hi = std::min(b.len_of(r), lo + chunk);
      at = (b.off_of(r) + lo) * elem;
      return (hi - lo) * elem;
    };
    std::size_t at = 0, bytes = piece(0, at);
    const bool last = rd + 1 == rounds;  // its last sending verb carries the end pad
    if (last && n == 2) prims.will_finish();
    CCLITE_TRY(prims.send(send + at, bytes));
    for (int k = 1; k < n - 1; ++k) {
      bytes = piece(k, at);
      if (last && k == n - 2) prims.will_finish();
      CCLITE_TRY(prims.recv_reduce_send(send + at, bytes));
    }
    bytes = piece(n - 1, at);
    std::uint8_t* out = recv + (at - own_off);
    CCLITE_TRY(prims.recv_reduce_copy(send + at, out, bytes));
    if (red.needs_divide) red.divide(out, bytes / elem, n);
  }
  return prims.finish();
}

/// Reduce to `root`: `rel` = (ring position - root's position) mod n. Only the
/// root's `recv` is written.
template <class Prims>
status chain_reduce(Prims& prims, const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                    std::size_t elem, const reduction& red, int n, int rel) {
  const std::size_t bytes = count * elem;
  if (n == 1) {
    if (bytes && send != recv) std::memcpy(recv, send, bytes);
    return {};
  }
  prims.will_finish();  // one verb each: it carries the end pad
  if (rel == 1) {
    CCLITE_TRY(prims.send(send, bytes));                    // the chain starts after the root
  } else if (rel != 0) {
    CCLITE_TRY(prims.recv_reduce_send(send, bytes));        // add ours, pass on
  } else {
    CCLITE_TRY(prims.recv_reduce_copy(send, recv, bytes));  // the root keeps the total
    if (red.needs_divide) red.divide(recv, count, n);
  }
  return prims.finish();
}

}  // namespace cclite
