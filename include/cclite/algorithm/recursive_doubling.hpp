// cclite/algorithm/recursive_doubling.hpp - latency-optimal allreduce for small messages.
//
// Power-of-two p: in round k every rank exchanges its whole buffer with rank
// ^ 2^k and reduces: lg p rounds, cost lg p * (alpha + N beta + N gamma),
// versus 2(p-1) alpha for the ring - the better choice while alpha dominates.
// Any p (MPICH / Gloo "fold"): with p' the largest power of two <= p and
// extra = p - p', the first 2*extra ranks pair up; each even one hands its data
// to the odd one and sits out, p' ranks run the rounds, then the odd ones hand
// the result back. Every rank ends with the same bits: partners reduce the
// same two operands, and IEEE +, *, min and max are commutative.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

/// `data` holds this rank's contribution and receives the result (count
/// elements); `scratch` has room for count elements. `exchange(peer, out,
/// out_bytes, in, in_bytes)` sends and receives at the same time.
template <class Exchange>
status recursive_doubling_allreduce(std::uint8_t* data, std::uint8_t* scratch, std::size_t count,
                                    const reduction& red, int rank, int n, Exchange&& exchange) {
  const std::size_t bytes = count * red.elem_size;
  if (n == 1 || count == 0) return {};
  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  const int extra = n - pof2;
  // Fold: even ranks below 2*extra give their data to their odd neighbour.
  int id = -1;  // this rank's index among the pof2 that run the rounds
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      CCLITE_TRY(exchange(rank + 1, data, bytes, nullptr, 0));
    } else {
      CCLITE_TRY(exchange(rank - 1, nullptr, 0, scratch, bytes));
      red.inplace(data, scratch, count);
      id = rank / 2;
    }
  } else {
    id = rank - extra;
  }
  if (id >= 0) {
    auto real = [&](int i) { return i < extra ? 2 * i + 1 : i + extra; };
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int partner = real(id ^ mask);
      CCLITE_TRY(exchange(partner, data, bytes, scratch, bytes));
      red.inplace(data, scratch, count);
    }
    if (red.needs_divide) red.divide(data, count, n);
  }
  // Unfold: the odd ranks hand the result back.
  if (rank < 2 * extra) {
    if (rank % 2 == 0) CCLITE_TRY(exchange(rank + 1, nullptr, 0, data, bytes));
    else CCLITE_TRY(exchange(rank - 1, data, bytes, nullptr, 0));
  }
  return {};
}

/// The peers recursive doubling exchanges with, for connecting them first.
inline int recursive_doubling_peers(int rank, int n, int* out) {
  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  const int extra = n - pof2;
  int m = 0;
  if (rank < 2 * extra) out[m++] = rank % 2 == 0 ? rank + 1 : rank - 1;
  const int id = rank < 2 * extra ? (rank % 2 ? rank / 2 : -1) : rank - extra;
  if (id >= 0)
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int i = id ^ mask;
      out[m++] = i < extra ? 2 * i + 1 : i + extra;
    }
  return m;
}

}  // namespace cclite
