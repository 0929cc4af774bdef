// libFuzzer target: the TCP rendezvous store's wire parsers
// (transports/tcp/include/cclite/tcp/store_protocol.hpp, store_auth.hpp).
//
// The first byte picks a side:
//   even: the server's view of a connection: a 40-byte proof frame, then
//         request frames back to back, each parsed by proto::parse_request as
//         the server does (header validated before any body byte is used);
//   odd:  the client's view: a 40-byte challenge, then reply headers and
//         their values, as store_client reads them.
// Every accepted frame is checked against the limits the server relies on;
// a violation aborts (a crash for libFuzzer), as do ASan/UBSan findings.
#include <cclite/tcp/store_auth.hpp>
#include <cclite/tcp/store_protocol.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace proto = cclite::tcp::proto;

#define FUZZ_ASSERT(c) \
  do {                 \
    if (!(c)) std::abort(); \
  } while (0)

static void server_side(const std::uint8_t* p, std::size_t n) {
  proto::auth_frame proof;
  if (proto::decode_auth(p, n, proto::auth_kind::proof, proof)) return;  // dropped, as the server does
  FUZZ_ASSERT(n >= proto::auth_frame_bytes);
  std::array<std::uint8_t, proto::nonce_bytes> nonce{};
  for (std::size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<std::uint8_t>(i * 7);
  // A random proof must not pass (2^-256), and the check must not read out of bounds.
  FUZZ_ASSERT(!proto::auth_ok("fuzz-token", nonce, proof.payload) ||
              proof.payload == proto::auth_proof("fuzz-token", nonce));
  p += proto::auth_frame_bytes;
  n -= proto::auth_frame_bytes;
  while (n > 0) {
    proto::parsed_request r = proto::parse_request(p, n);
    if (r.st == proto::parsed_request::state::need_more) return;  // truncated: waits, then times out
    if (r.st == proto::parsed_request::state::bad) {
      FUZZ_ASSERT(r.why != nullptr);
      return;  // malformed: the server closes the connection
    }
    const proto::request_header& h = r.header;
    FUZZ_ASSERT(h.key_len >= 1 && h.key_len <= cclite::max_store_key_bytes);
    FUZZ_ASSERT(h.value_len <= cclite::max_store_value_bytes);
    FUZZ_ASSERT(h.code != proto::op::add || h.value_len == 8);
    FUZZ_ASSERT(h.code == proto::op::set || h.code == proto::op::add || h.value_len == 0);
    FUZZ_ASSERT(h.wait_ms == 0 || h.code == proto::op::get || h.code == proto::op::wait);
    FUZZ_ASSERT(r.frame_bytes == proto::request_header_bytes + h.key_len + h.value_len);
    FUZZ_ASSERT(r.frame_bytes <= n);
    FUZZ_ASSERT(r.key == p + proto::request_header_bytes && r.value == r.key + h.key_len);
    // What the server does with the bytes: keys go into log lines escaped.
    std::string key(reinterpret_cast<const char*>(r.key), h.key_len);
    std::string shown = proto::printable(key);
    FUZZ_ASSERT(shown.size() <= 160 * 4 + 3);
    if (h.code == proto::op::add) (void)proto::get_i64(r.value);
    // Round trip: what the client would have sent for this header.
    auto again = proto::encode(h);
    for (std::size_t i = 0; i < again.size(); ++i) FUZZ_ASSERT(again[i] == p[i]);
    p += r.frame_bytes;
    n -= r.frame_bytes;
  }
}

static void client_side(const std::uint8_t* p, std::size_t n) {
  proto::auth_frame ch;
  if (proto::decode_auth(p, n, proto::auth_kind::challenge, ch)) return;  // "does not speak the protocol"
  (void)proto::auth_proof("", ch.payload);
  p += proto::auth_frame_bytes;
  n -= proto::auth_frame_bytes;
  while (n >= proto::reply_header_bytes) {
    proto::reply_header h;
    if (proto::decode(p, h)) return;  // the client closes and reports a protocol error
    FUZZ_ASSERT(h.value_len <= cclite::max_store_value_bytes);
    FUZZ_ASSERT((h.status != proto::reply_status::error && h.status != proto::reply_status::refused) ||
                h.value_len <= proto::max_error_bytes);
    p += proto::reply_header_bytes;
    n -= proto::reply_header_bytes;
    if (h.value_len > n) return;  // truncated value: the client times out or sees the close
    std::string v(reinterpret_cast<const char*>(p), h.value_len);
    if (h.status != proto::reply_status::ok) (void)proto::printable(v, 400);
    p += h.value_len;
    n -= h.value_len;
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  if (data[0] % 2 == 0)
    server_side(data + 1, size - 1);
  else
    client_side(data + 1, size - 1);
  return 0;
}
