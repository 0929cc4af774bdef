// cclite/verbs/flow.hpp - the bookkeeping of a verbs link: FIFO positions, striping
// across queue pairs, credits, immediate-data encoding.
//
// Each direction of a link is a byte stream landing in the receiver's
// registered FIFO of `cap` bytes (a ring: stream byte p sits at p % cap). The
// sender writes with RDMA WRITE WITH IMMEDIATE straight into it. The stream is
// cut into blocks of `block` bytes; block i travels on QP i % nqps (the same
// striping as the tcp link's sockets), so each QP carries blocks j, j+n, ...
// in order, and the receiver computes the complete prefix as the minimum of
// the per-QP positions (RC QPs are ordered each, not with each other).
//
// A write never crosses a block boundary or the ring end, so it is contiguous
// on both sides, and carries its length in the immediate (the receiving
// completion says which QP). Flow control is by byte credits: the receiver
// returns its consumed-byte count (modulo 2^31, in the immediate of a
// zero-length write with the top bit set); the sender never writes beyond
// remote_consumed + cap, so nothing in the FIFO is overwritten before it is read.
//
// Pure and allocation-free: unit tested without a device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace cclite::verbs {

/// Geometry of one striped stream: FIFO capacity, block size, QP count.
struct stripe {
  std::uint64_t cap = 0;    ///< ring bytes, multiple of 4096
  std::uint64_t block = 0;  ///< multiple of 4096
  int nqps = 1;

  /// Stream position where the block holding `pos` ends.
  std::uint64_t block_end(std::uint64_t pos) const noexcept { return pos - pos % block + block; }
  /// QP carrying stream byte `pos`.
  int qp_of(std::uint64_t pos) const noexcept {
    return static_cast<int>((pos / block) % static_cast<std::uint64_t>(nqps));
  }
  /// First stream position of QP q's sub-stream.
  std::uint64_t first(int q) const noexcept { return static_cast<std::uint64_t>(q) * block; }
  /// Advances a QP's position by `bytes` of its own sub-stream, jumping over the
  /// other QPs' blocks at each block end.
  std::uint64_t advance(std::uint64_t pos, std::uint64_t bytes) const noexcept {
    while (bytes > 0) {
      std::uint64_t end = block_end(pos);
      std::uint64_t take = std::min(end - pos, bytes);
      pos += take;
      bytes -= take;
      if (pos == end) pos += static_cast<std::uint64_t>(nqps - 1) * block;
    }
    return pos;
  }
  /// Length of the next write a QP at `pos` may post when the sender may go up
  /// to `limit` (exclusive): within one block and one ring lap. 0 = nothing.
  std::uint64_t next_write(std::uint64_t pos, std::uint64_t limit) const noexcept {
    if (pos >= limit) return 0;
    std::uint64_t n = std::min(block_end(pos), limit) - pos;
    return std::min(n, cap - pos % cap);
  }
  /// The complete prefix: the lowest per-QP position, capped by `ceiling`.
  std::uint64_t prefix(const std::uint64_t* pos, std::uint64_t ceiling) const noexcept {
    std::uint64_t lo = ceiling;
    for (int q = 0; q < nqps; ++q) lo = std::min(lo, pos[q]);
    return lo;
  }
  /// Ring offset of stream byte `pos`.
  std::uint64_t offset(std::uint64_t pos) const noexcept { return pos % cap; }
};

/// How far the sender may write: up to what the peer has consumed plus its FIFO.
inline std::uint64_t send_limit(std::uint64_t committed, std::uint64_t remote_consumed,
                                std::uint64_t cap) noexcept {
  return std::min(committed, remote_consumed + cap);
}

// ---- immediate data -----------------------------------------------------------

inline constexpr std::uint32_t imm_credit_bit = 0x80000000u;
inline constexpr std::uint32_t imm_value_mask = 0x7fffffffu;

/// Immediate of a data write of `len` bytes (len < 2^31: at most one block).
inline std::uint32_t encode_data_imm(std::uint64_t len) noexcept {
  return static_cast<std::uint32_t>(len) & imm_value_mask;
}
/// Immediate of a credit return: the consumed-byte count modulo 2^31.
inline std::uint32_t encode_credit_imm(std::uint64_t consumed) noexcept {
  return imm_credit_bit | (static_cast<std::uint32_t>(consumed) & imm_value_mask);
}
inline bool is_credit_imm(std::uint32_t imm) noexcept { return (imm & imm_credit_bit) != 0; }
/// Immediate of the last write a link makes before its QPs are destroyed: a
/// data write of 0 bytes, which no data write is. RDMA has no end of stream
/// (a destroyed QP sends nothing), so this is how a peer blocked on the link
/// learns at once that nothing more will come, as a tcp peer does from EOF.
inline constexpr std::uint32_t imm_close = 0;
/// Bytes past the end of each FIFO (and of each send ring) for the reason a
/// closing link gives (link::close_because): the imm_close write carries it,
/// NUL-terminated, to the same place in the peer's FIFO, where RC's ordering
/// has it in place before the close completes there.
inline constexpr std::size_t close_reason_bytes = 1024;

/// Rebuilds the full 64-bit consumed count from the previous one and a 31-bit
/// credit value. Valid because consumption never runs more than one FIFO (at
/// most 1 GiB < 2^31) ahead of what the sender has already seen.
inline std::uint64_t unwrap_credit(std::uint64_t prev, std::uint32_t imm) noexcept {
  std::uint64_t delta = (static_cast<std::uint64_t>(imm & imm_value_mask) - prev) & imm_value_mask;
  return prev + delta;
}

// ---- work request ids ------------------------------------------------------------

/// What a send-queue completion was for; kept in wr_id with the QP and length.
enum class wr_kind : std::uint64_t { data = 1, credit = 2, recv = 3, close = 4 };

inline std::uint64_t make_wr_id(wr_kind k, int qp, std::uint64_t len) noexcept {
  return (static_cast<std::uint64_t>(k) << 56) | (static_cast<std::uint64_t>(qp & 0xff) << 48) |
         (len & 0xffffffffffffull);
}
inline wr_kind wr_id_kind(std::uint64_t id) noexcept { return static_cast<wr_kind>(id >> 56); }
inline int wr_id_qp(std::uint64_t id) noexcept { return static_cast<int>((id >> 48) & 0xff); }
inline std::uint64_t wr_id_len(std::uint64_t id) noexcept { return id & 0xffffffffffffull; }

}  // namespace cclite::verbs
