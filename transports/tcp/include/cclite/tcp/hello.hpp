// cclite/tcp/hello.hpp - the handshake frame that opens every TCP data socket.
//
// The lower rank of a pair connects nsocks sockets to the higher rank's
// listening address and sends one hello frame on each; when the higher rank
// holds all nsocks of them it answers each with an ack frame (same layout,
// magic "CCTA", from/to swapped). Only then is the pair connected on both
// sides. Frame, 40 bytes, every integer little-endian:
//
//   offset size field
//        0    4 magic       "CCTC" hello, "CCTA" ack
//        4    4 version     hello_version (1)
//        8    8 job_hash    FNV-1a 64 of transport_context::job_tag
//       16    4 from_rank   sender's rank
//       20    4 to_rank     receiver's rank
//       24    4 sock_index  0 .. nsocks-1
//       28    4 nsocks      sockets of this pair (the connecting rank's CCLITE_NSOCKS)
//       32    4 block       striping block in bytes (the connecting rank's CCLITE_TCP_BLOCK)
//       36    4 reserved    0
//
// The connecting (lower) rank's nsocks and block win: the accepting rank takes
// them from the hello, so both ends of a pair always agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <cclite/config.hpp>
#include <cclite/core/bytes.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::tcp {

inline constexpr std::uint32_t hello_version = 1;
inline constexpr std::size_t hello_bytes = 40;
inline constexpr int max_nsocks = 16;
inline constexpr std::uint32_t min_block = 4096;
inline constexpr std::uint32_t max_block = 64u << 20;

struct hello {
  char magic[4] = {'C', 'C', 'T', 'C'};
  std::uint32_t version = hello_version;
  std::uint64_t job_hash = 0;
  std::int32_t from_rank = -1;
  std::int32_t to_rank = -1;
  std::uint32_t sock_index = 0;
  std::uint32_t nsocks = 0;
  std::uint32_t block = 0;

  bool is_hello() const noexcept { return std::memcmp(magic, "CCTC", 4) == 0; }
  bool is_ack() const noexcept { return std::memcmp(magic, "CCTA", 4) == 0; }
};

/// FNV-1a 64-bit: stable across processes, builds and machines (std::hash is not).
inline std::uint64_t fnv1a64(const std::string& s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

inline void encode(const hello& h, std::uint8_t out[hello_bytes]) noexcept {
  std::memcpy(out, h.magic, 4);
  put_le(out + 4, h.version, 4);
  put_le(out + 8, h.job_hash, 8);
  put_le(out + 16, static_cast<std::uint32_t>(h.from_rank), 4);
  put_le(out + 20, static_cast<std::uint32_t>(h.to_rank), 4);
  put_le(out + 24, h.sock_index, 4);
  put_le(out + 28, h.nsocks, 4);
  put_le(out + 32, h.block, 4);
  put_le(out + 36, 0, 4);
}

inline hello decode(const std::uint8_t in[hello_bytes]) noexcept {
  hello h;
  std::memcpy(h.magic, in, 4);
  h.version = static_cast<std::uint32_t>(get_le(in + 4, 4));
  h.job_hash = get_le(in + 8, 8);
  h.from_rank = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(in + 16, 4)));
  h.to_rank = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(in + 20, 4)));
  h.sock_index = static_cast<std::uint32_t>(get_le(in + 24, 4));
  h.nsocks = static_cast<std::uint32_t>(get_le(in + 28, 4));
  h.block = static_cast<std::uint32_t>(get_le(in + 32, 4));
  return h;
}

/// Parses a frame from bytes [p, p + n) into `out`: false (out untouched)
/// when fewer than hello_bytes are there. Pure; bytes past the frame are
/// ignored. Validity is reject_reason()'s job. Fuzzed by tests/fuzz/hello_fuzz.cpp.
inline bool parse_hello(const std::uint8_t* p, std::size_t n, hello& out) noexcept {
  if (!p || n < hello_bytes) return false;
  out = decode(p);
  return true;
}

/// Why a hello received by rank `me` of a `size`-rank job with `job_hash` is
/// not acceptable, or an empty string if it is. Pure; the caller logs the
/// reason and closes the socket (a stranger never fails the job).
inline std::string reject_reason(const hello& h, std::uint64_t job_hash, int me, int size) {
  char buf[160];
  if (!h.is_hello()) {
    std::snprintf(buf, sizeof buf, "not a cclite tcp peer (first bytes %02x %02x %02x %02x)",
                  static_cast<unsigned char>(h.magic[0]), static_cast<unsigned char>(h.magic[1]),
                  static_cast<unsigned char>(h.magic[2]), static_cast<unsigned char>(h.magic[3]));
    return buf;
  }
  if (h.version != hello_version) {
    std::snprintf(buf, sizeof buf, "speaks tcp protocol version %u, this process speaks %u",
                  h.version, hello_version);
    return buf;
  }
  if (h.job_hash != job_hash) return "belongs to another job or communicator (job tag differs)";
  if (h.to_rank != me) {
    std::snprintf(buf, sizeof buf, "is addressed to rank %d, this is rank %d", h.to_rank, me);
    return buf;
  }
  if (h.from_rank < 0 || h.from_rank >= me || h.from_rank >= size) {
    // long long: `me - 1` must not overflow for any `me` (found by hello_fuzz).
    std::snprintf(buf, sizeof buf, "claims to come from rank %d (only ranks 0..%lld connect to %d)",
                  h.from_rank, static_cast<long long>(me) - 1, me);
    return buf;
  }
  if (h.nsocks < 1 || h.nsocks > static_cast<std::uint32_t>(max_nsocks) || h.sock_index >= h.nsocks) {
    std::snprintf(buf, sizeof buf, "has socket index %u of %u (allowed: nsocks 1..%d)",
                  h.sock_index, h.nsocks, max_nsocks);
    return buf;
  }
  if (h.block < min_block || h.block > max_block || h.block % 8 != 0) {
    std::snprintf(buf, sizeof buf, "has block size %u (allowed: multiple of 8 in %u..%u)", h.block,
                  min_block, max_block);
    return buf;
  }
  return {};
}

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
