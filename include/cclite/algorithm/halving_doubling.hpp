// cclite/algorithm/halving_doubling.hpp - Rabenseifner's allreduce for medium messages.
//
// Reduce-scatter by recursive halving, then allgather by recursive doubling
// (Rabenseifner 2004; MPICH's and Open MPI's "rsag", Gloo's halving-doubling).
// With p' = the largest power of two <= p:
//
//   halving  lg p' rounds; in round k (mask = p'/2, p'/4, ... 1) a rank keeps
//            the half of its current block range on its side of `mask`, sends
//            the other half to rank ^ mask and reduces what it receives into
//            the half it keeps. Afterwards rank i owns block i, fully reduced.
//   doubling lg p' rounds in the reverse order; partners swap the ranges they
//            hold, which double each round until everyone has every block.
//
// Cost: 2 lg p' alpha + 2 (p'-1)/p' N beta + (p'-1)/p' N gamma - the ring's
// bandwidth term with the latency of recursive doubling, so it wins between
// the small messages (recursive doubling) and the large ones (ring: its
// chunks pipeline and every step uses a neighbour link).
//
// Non-power-of-two p: the first 2*(p - p') ranks fold in pairs, exactly as in
// recursive_doubling.hpp: the even one hands its data to the odd one, which
// takes part; the result is handed back at the end.
//
// Every block is computed by one owner and then copied, so every rank ends
// with bitwise-identical results; avg divides by p at the owner.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cclite/algorithm/schedule.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

namespace detail {
// i-th rank of the p' that run the rounds (the folded pairs' odd members first).
inline int hd_real(int i, int extra) { return i < extra ? 2 * i + 1 : i + extra; }
inline int hd_pof2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
}  // namespace detail

/// Elements of scratch halving_doubling_allreduce needs: the larger half of
/// the buffer (the first blocks carry the remainder elements).
inline std::size_t halving_doubling_scratch(std::size_t count, int n) {
  const int pof2 = detail::hd_pof2(n);
  if (pof2 == 1) return 0;
  return segments{count, static_cast<std::size_t>(pof2)}.offset(static_cast<std::size_t>(pof2 / 2));
}

/// `data` holds this rank's contribution and receives the result (count
/// elements); `scratch` has room for halving_doubling_scratch(count, n).
/// `exchange(peer, out, out_bytes, in, in_bytes)` sends and receives at once.
template <class Exchange>
status halving_doubling_allreduce(std::uint8_t* data, std::uint8_t* scratch, std::size_t count,
                                  const reduction& red, int rank, int n, Exchange&& exchange) {
  const std::size_t elem = red.elem_size;
  if (n == 1 || count == 0) return {};
  const int pof2 = detail::hd_pof2(n);
  const int extra = n - pof2;
  int id = -1;
  if (rank < 2 * extra) {
    // In two halves, because scratch holds only half the buffer (and each
    // exchange is one framed message: both sides must split alike).
    const std::size_t h = count / 2;
    if (rank % 2 == 0) {
      CCLITE_TRY(exchange(rank + 1, data, h * elem, nullptr, 0));
      CCLITE_TRY(exchange(rank + 1, data + h * elem, (count - h) * elem, nullptr, 0));
    } else {
      CCLITE_TRY(exchange(rank - 1, nullptr, 0, scratch, h * elem));
      red.inplace(data, scratch, h);
      CCLITE_TRY(exchange(rank - 1, nullptr, 0, scratch, (count - h) * elem));
      red.inplace(data + h * elem, scratch, count - h);
      id = rank / 2;
    }
  } else {
    id = rank - extra;
  }
  if (id >= 0) {
    const segments blocks{count, static_cast<std::size_t>(pof2)};
    // [lo, hi): the blocks this rank is still responsible for.
    int lo = 0, hi = pof2;
    for (int mask = pof2 / 2; mask >= 1; mask /= 2) {
      const int partner = detail::hd_real(id ^ mask, extra);
      const int mid = lo + (hi - lo) / 2;
      const bool keep_low = (id & mask) == 0;
      const int klo = keep_low ? lo : mid, khi = keep_low ? mid : hi;
      const int slo = keep_low ? mid : lo, shi = keep_low ? hi : mid;
      const std::size_t keep_at = blocks.offset(static_cast<std::size_t>(klo));
      const std::size_t keep_n = blocks.offset(static_cast<std::size_t>(khi)) - keep_at;
      const std::size_t send_at = blocks.offset(static_cast<std::size_t>(slo));
      const std::size_t send_n = blocks.offset(static_cast<std::size_t>(shi)) - send_at;
      CCLITE_TRY(exchange(partner, data + send_at * elem, send_n * elem, scratch, keep_n * elem));
      red.inplace(data + keep_at * elem, scratch, keep_n);
      lo = klo;
      hi = khi;
    }
    // Now lo == id: block id is complete here.
    if (red.needs_divide) {
      const std::size_t at = blocks.offset(static_cast<std::size_t>(id));
      red.divide(data + at * elem, blocks.length(static_cast<std::size_t>(id)), n);
    }
    for (int mask = 1; mask < pof2; mask *= 2) {
      const int partner = detail::hd_real(id ^ mask, extra);
      // The partner holds the aligned range of the same width next to ours.
      const int width = hi - lo;
      const int plo = (id & mask) ? lo - width : lo + width;
      const std::size_t my_at = blocks.offset(static_cast<std::size_t>(lo));
      const std::size_t my_n = blocks.offset(static_cast<std::size_t>(hi)) - my_at;
      const std::size_t p_at = blocks.offset(static_cast<std::size_t>(plo));
      const std::size_t p_n = blocks.offset(static_cast<std::size_t>(plo + width)) - p_at;
      CCLITE_TRY(exchange(partner, data + my_at * elem, my_n * elem, data + p_at * elem, p_n * elem));
      lo = lo < plo ? lo : plo;
      hi = lo + 2 * width;
    }
  }
  if (rank < 2 * extra) {
    if (rank % 2 == 0) CCLITE_TRY(exchange(rank + 1, nullptr, 0, data, count * elem));
    else CCLITE_TRY(exchange(rank - 1, data, count * elem, nullptr, 0));
  }
  return {};
}

/// The peers halving-doubling exchanges with (the same as recursive doubling's).
inline int halving_doubling_peers(int rank, int n, int* out) {
  const int pof2 = detail::hd_pof2(n);
  const int extra = n - pof2;
  int m = 0;
  if (rank < 2 * extra) out[m++] = rank % 2 == 0 ? rank + 1 : rank - 1;
  const int id = rank < 2 * extra ? (rank % 2 ? rank / 2 : -1) : rank - extra;
  if (id >= 0)
    for (int mask = 1; mask < pof2; mask <<= 1) out[m++] = detail::hd_real(id ^ mask, extra);
  return m;
}

}  // namespace cclite
