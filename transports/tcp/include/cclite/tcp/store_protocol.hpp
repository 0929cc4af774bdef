// cclite/tcp/store_protocol.hpp - wire format of the TCP rendezvous store.
//
// Every integer on this wire is LITTLE-ENDIAN, whatever the host's byte order
// (put_u32 / get_u32 below write and read byte by byte).
//
// A connection starts with the job-token handshake, then carries round trips:
// one request, then one reply; a client never pipelines.
//
// Handshake (store_auth.hpp computes the proof):
//
//   server -> client, as soon as it accepts: challenge, auth_frame_bytes = 40
//   0      4    magic      0x54534343, the bytes "CCST"
//   4      1    version    protocol_version (2)
//   5      1    kind       0x10 challenge
//   6      2    reserved   0
//   8      32   nonce      fresh random bytes (getrandom)
//
//   client -> server: proof, 40 bytes, same layout with kind 0x11 and
//   8      32   HMAC-SHA256(token, "cclite-store-auth-v1" || nonce)
//
//   server -> client: a reply header (below) with status ok and no value, or
//   status refused (3) and a one-line reason, after which the server closes
//   the connection. Nothing else is accepted before an ok. The token is never
//   sent; a recorded proof is useless for another connection's nonce.
//
// Request (request_header_bytes = 20, then key, then value):
//
//   offset size field
//   0      4    magic      0x54534343, the bytes "CCST"
//   4      1    version    protocol_version (2)
//   5      1    op         1 set, 2 get, 3 add, 4 wait, 5 check
//   6      2    reserved   0
//   8      4    key_len    1 .. max_store_key_bytes
//   12     4    value_len  set: 0 .. max_store_value_bytes; add: 8; others: 0
//   16     4    wait_ms    get / wait: how long the server may wait for the key
//                          to appear (0 = answer now); other ops: 0
//   20     key_len    key bytes
//   ..     value_len  value bytes (set: the value; add: the delta as int64 LE)
//
// Reply (reply_header_bytes = 12, then value):
//
//   0      4    magic      0x54534343
//   4      1    version    protocol_version
//   5      1    status     0 ok, 1 timeout (get/wait: key still absent after
//                          wait_ms), 2 error (value = one-line message),
//                          3 refused (handshake only: value = the reason)
//   6      2    reserved   0
//   8      4    value_len  <= max_store_value_bytes
//   12     value_len  get: the value; add: the new value as int64 LE;
//                     check: one byte, 1 if the key exists; set / wait: empty
//
// Both sides validate every header before reading anything after it, and never
// allocate more than a validated length. The server answers a malformed frame
// by closing that connection (there is no way to resynchronise a byte stream).
// The parsers (decode, decode_auth, parse_request) are pure functions over
// bytes, fuzzed by tests/fuzz/store_frame_fuzz.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include <cclite/config.hpp>
#include <cclite/bootstrap/store.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

/// How a store_client waits for its socket. Empty (the default): poll(). A
/// client talking to a store_server of its own process with no background
/// thread (CCLITE_NO_THREADS) waits through store_server::hook() instead, which
/// serves the server's connections while it waits: wait(ctx, fd, events,
/// timeout_ms) returns fd's revents (0 when not ready); fd < 0 just serves.
struct poll_hook {
  short (*wait)(void* ctx, int fd, short events, int timeout_ms) = nullptr;
  void* ctx = nullptr;
};

}  // namespace cclite::tcp

namespace cclite::tcp::proto {

inline constexpr std::uint32_t magic = 0x54534343u;  // "CCST" in memory order
inline constexpr std::uint8_t protocol_version = 2;
inline constexpr std::size_t request_header_bytes = 20;
inline constexpr std::size_t reply_header_bytes = 12;
inline constexpr std::size_t auth_frame_bytes = 40;
inline constexpr std::size_t nonce_bytes = 32;
/// Longest error message a server sends (longer ones are cut).
inline constexpr std::size_t max_error_bytes = 1024;

enum class op : std::uint8_t { set = 1, get = 2, add = 3, wait = 4, check = 5 };
enum class reply_status : std::uint8_t { ok = 0, timeout = 1, error = 2, refused = 3 };
enum class auth_kind : std::uint8_t { challenge = 0x10, proof = 0x11 };

inline const char* to_string(op o) noexcept {
  switch (o) {
    case op::set:
      return "set";
    case op::get:
      return "get";
    case op::add:
      return "add";
    case op::wait:
      return "wait";
    case op::check:
      return "check";
  }
  return "?";
}

struct request_header {
  op code = op::check;
  std::uint32_t key_len = 0;
  std::uint32_t value_len = 0;
  std::uint32_t wait_ms = 0;
};

struct reply_header {
  reply_status status = reply_status::ok;
  std::uint32_t value_len = 0;
};

inline void put_u32(std::uint8_t* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint32_t get_u32(const std::uint8_t* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(p[i]) << (8 * i);
  return v;
}
inline void put_i64(std::uint8_t* p, std::int64_t v) noexcept {
  auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(u >> (8 * i));
}
inline std::int64_t get_i64(const std::uint8_t* p) noexcept {
  std::uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= std::uint64_t(p[i]) << (8 * i);
  return static_cast<std::int64_t>(u);
}
inline std::string i64_bytes(std::int64_t v) {
  std::string s(8, '\0');
  put_i64(reinterpret_cast<std::uint8_t*>(&s[0]), v);
  return s;
}

inline std::array<std::uint8_t, request_header_bytes> encode(const request_header& h) noexcept {
  std::array<std::uint8_t, request_header_bytes> b{};
  put_u32(&b[0], magic);
  b[4] = protocol_version;
  b[5] = static_cast<std::uint8_t>(h.code);
  put_u32(&b[8], h.key_len);
  put_u32(&b[12], h.value_len);
  put_u32(&b[16], h.wait_ms);
  return b;
}

inline std::array<std::uint8_t, reply_header_bytes> encode(const reply_header& h) noexcept {
  std::array<std::uint8_t, reply_header_bytes> b{};
  put_u32(&b[0], magic);
  b[4] = protocol_version;
  b[5] = static_cast<std::uint8_t>(h.status);
  put_u32(&b[8], h.value_len);
  return b;
}

/// Parses and validates a request header. Returns nullptr when it is valid,
/// else a short reason for the server's log line ("bad magic").
inline const char* decode(const std::uint8_t* b, request_header& h) noexcept {
  if (get_u32(&b[0]) != magic) return "bad magic";
  if (b[4] != protocol_version) return "unsupported protocol version";
  if (b[5] < 1 || b[5] > 5) return "unknown op";
  if (b[6] != 0 || b[7] != 0) return "nonzero reserved bytes";
  h.code = static_cast<op>(b[5]);
  h.key_len = get_u32(&b[8]);
  h.value_len = get_u32(&b[12]);
  h.wait_ms = get_u32(&b[16]);
  if (h.key_len == 0) return "empty key";
  if (h.key_len > max_store_key_bytes) return "key_len over max_store_key_bytes";
  switch (h.code) {
    case op::set:
      if (h.value_len > max_store_value_bytes) return "value_len over max_store_value_bytes";
      break;
    case op::add:
      if (h.value_len != 8) return "add value_len is not 8";
      break;
    case op::get:
    case op::wait:
    case op::check:
      if (h.value_len != 0) return "unexpected value bytes";
      break;
  }
  if (h.wait_ms != 0 && h.code != op::get && h.code != op::wait) return "wait_ms on a non-waiting op";
  return nullptr;
}

/// Parses and validates a reply header (client side). nullptr when valid.
inline const char* decode(const std::uint8_t* b, reply_header& h) noexcept {
  if (get_u32(&b[0]) != magic) return "bad magic";
  if (b[4] != protocol_version) return "unsupported protocol version";
  if (b[5] > 3) return "unknown reply status";
  if (b[6] != 0 || b[7] != 0) return "nonzero reserved bytes";
  h.status = static_cast<reply_status>(b[5]);
  h.value_len = get_u32(&b[8]);
  if (h.value_len > max_store_value_bytes) return "value_len over max_store_value_bytes";
  if ((h.status == reply_status::error || h.status == reply_status::refused) && h.value_len > max_error_bytes)
    return "error text too long";
  return nullptr;
}

/// A challenge or proof frame: kind plus 32 payload bytes (nonce or MAC).
struct auth_frame {
  auth_kind kind = auth_kind::challenge;
  std::array<std::uint8_t, nonce_bytes> payload{};
};

inline std::array<std::uint8_t, auth_frame_bytes> encode(const auth_frame& f) noexcept {
  std::array<std::uint8_t, auth_frame_bytes> b{};
  put_u32(&b[0], magic);
  b[4] = protocol_version;
  b[5] = static_cast<std::uint8_t>(f.kind);
  std::memcpy(&b[8], f.payload.data(), nonce_bytes);
  return b;
}

/// Parses and validates an auth frame of the expected kind from the first
/// `n` bytes at `b`. nullptr when valid, else a short reason.
inline const char* decode_auth(const std::uint8_t* b, std::size_t n, auth_kind want, auth_frame& f) noexcept {
  if (n < auth_frame_bytes) return "truncated handshake frame";
  if (get_u32(&b[0]) != magic) return "bad magic";
  if (b[4] != protocol_version) return "unsupported protocol version";
  if (b[5] != static_cast<std::uint8_t>(want)) return "unexpected handshake frame kind";
  if (b[6] != 0 || b[7] != 0) return "nonzero reserved bytes";
  f.kind = want;
  std::memcpy(f.payload.data(), &b[8], nonce_bytes);
  return nullptr;
}

/// Outcome of parse_request().
struct parsed_request {
  enum class state { need_more, complete, bad } st = state::need_more;
  const char* why = nullptr;  ///< bad: the reason (as decode() gives it)
  request_header header;
  std::size_t frame_bytes = 0;  ///< complete: bytes the frame occupies
  const std::uint8_t* key = nullptr;
  const std::uint8_t* value = nullptr;
};

/// Parses one request frame from the start of bytes [b, b + n): the same
/// validation the server applies as the bytes arrive (header first, then
/// exactly key_len + value_len body bytes). Pure; never reads past b + n.
inline parsed_request parse_request(const std::uint8_t* b, std::size_t n) noexcept {
  parsed_request r;
  if (n < request_header_bytes) return r;
  if (const char* bad = decode(b, r.header)) {
    r.st = parsed_request::state::bad;
    r.why = bad;
    return r;
  }
  // Both lengths are validated above (<= 4 KiB and <= 64 MiB): no overflow.
  std::size_t total = request_header_bytes + std::size_t(r.header.key_len) + r.header.value_len;
  if (n < total) return r;
  r.st = parsed_request::state::complete;
  r.frame_bytes = total;
  r.key = b + request_header_bytes;
  r.value = r.key + r.header.key_len;
  return r;
}

/// A key as it may appear in a message: printable ASCII kept, other bytes
/// \xNN-escaped, long keys cut (keys are bytes and may come from the wire).
inline std::string printable(const std::string& key, std::size_t max_chars = 160) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : key) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace cclite::tcp::proto
CCLITE_SETUP_CODE_END
