// cclite/algorithm/p2p_envelope.hpp - what a point-to-point message carries ahead of its bytes.
//
// A send() puts 16 bytes on the link before its data: a magic number, the
// dtype and the count. The matching recv() reads them before it reads any
// data and compares the size with its own, so a send of 100 floats met by a
// receive of 50 is reported on the receiving rank (errc::mismatch, MPI's
// MPI_ERR_TRUNCATE) instead of leaving 200 bytes in the link that the next
// call on it would take as its own data. The same holds the other way round
// (a receive larger than the send) and for a receive that meets a
// collective's call header (collective/mismatch.hpp): the peer issued its
// calls in another order.
//
// Only the size must agree, as on the wire: a send of 8 float32 may meet a
// receive of 32 uint8 (a reinterpretation, the caller's business, as with
// NCCL). Lone calls and grouped ones (p2p_group.hpp) put the same envelope,
// so they match each other. CCLITE_CHECK_MISMATCH=0 turns envelopes off with
// the call headers (every rank must agree on it).
//
// Layout, little-endian whatever the host: magic "CLP2" (4 bytes), dtype (1),
// zero (3), count (8). 16 bytes keep the stream aligned to max_dtype_size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cclite/config.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>

namespace cclite::detail {

struct p2p_envelope {
  static constexpr std::uint32_t magic_value = 0x32504c43;  // "CLP2" little-endian
  static constexpr std::size_t wire_bytes = 16;
  /// What a collective's call header starts with (collective/mismatch.hpp
  /// asserts it): a receive that meets one says the peer is in a collective.
  static constexpr std::uint32_t call_header_magic = 0x48434c43;  // "CLCH"
  static_assert(wire_bytes % max_dtype_size == 0, "the envelope keeps the stream aligned");

  /// The envelope of a send of `count` elements of `t`.
  static void encode(std::uint8_t* b, dtype t, std::size_t count) {
    std::memset(b, 0, wire_bytes);
    put_le(b, magic_value, 4);
    b[4] = static_cast<std::uint8_t>(t);
    put_le(b + 8, count, 8);
  }

  /// Checks envelope `b` from rank `peer` against a receive of `count`
  /// elements of `t`: ok when the sizes agree, else errc::mismatch saying what
  /// each side called.
  static status check(const std::uint8_t* b, dtype t, std::size_t count, int peer) {
    const std::uint32_t magic = static_cast<std::uint32_t>(get_le(b, 4));
    const std::uint64_t their_count = get_le(b + 8, 8);
    if (magic == magic_value && b[4] < dtype_count &&
        their_count * size_of(static_cast<dtype>(b[4])) == count * size_of(t))
      return {};
    return mismatch(b, magic, their_count, t, count, peer);
  }

 private:
CCLITE_SETUP_CODE_BEGIN  // error messages: compiled for size (config.hpp)
  [[gnu::noinline]] static status mismatch(const std::uint8_t* b, std::uint32_t magic, std::uint64_t their_count,
                                           dtype t, std::size_t count, int peer) {
    const char* hint = "; every send must meet a receive of the same size from its peer, in the same order";
    if (magic == call_header_magic)
      return make_error(errc::mismatch, "receiving %zu x %s from rank %d, but rank %d is in a collective (its call "
                        "header came down the link); issue point-to-point calls in the same order relative to "
                        "collectives on every rank", count, to_string(t), peer, peer);
    if (magic != magic_value || b[4] >= dtype_count)
      return make_error(errc::mismatch, "receiving %zu x %s from rank %d, but what came down the link is not a "
                        "point-to-point message (CCLITE_CHECK_MISMATCH must be the same on every rank)%s", count,
                        to_string(t), peer, hint);
    const dtype their = static_cast<dtype>(b[4]);
    return make_error(errc::mismatch, "rank %d sent %llu x %s (%llu bytes) where this rank receives %zu x %s "
                      "(%zu bytes)%s", peer, static_cast<unsigned long long>(their_count), to_string(their),
                      static_cast<unsigned long long>(their_count * size_of(their)), count, to_string(t),
                      count * size_of(t), hint);
  }
CCLITE_SETUP_CODE_END
};

}  // namespace cclite::detail
