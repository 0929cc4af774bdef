// cclite/tcp/store_auth.hpp - the job token that every connection to the TCP
// rendezvous store must prove it knows.
//
// The server sends a fresh 32-byte nonce; the client answers
// HMAC-SHA256(token, "cclite-store-auth-v1" || nonce) (frames in
// store_protocol.hpp). The token never crosses the network and a recorded
// answer does not open another connection.
//
// The token comes from CCLITE_RDZV_TOKEN (cclite-run exports one derived from
// --rdzv-id). Unset means the empty token: the handshake still runs, so a
// process with a token and one without refuse each other with a clear
// message instead of talking past each other, but any cclite process that
// also runs without a token can join. Set a secret token when the store port
// is reachable by other users.
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cclite/config.hpp>
#include <cclite/core/sha256.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/store_protocol.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

/// The job token of this process: CCLITE_RDZV_TOKEN, or "" when unset.
inline std::string rdzv_token_from_env() {
  const char* v = std::getenv("CCLITE_RDZV_TOKEN");
  return v ? std::string(v) : std::string();
}

namespace proto {

/// Domain separation: a MAC made for this handshake is worthless elsewhere.
inline constexpr char auth_context[] = "cclite-store-auth-v1";

/// The proof for `nonce` under `token`.
inline std::array<std::uint8_t, nonce_bytes> auth_proof(const std::string& token,
                                                         const std::array<std::uint8_t, nonce_bytes>& nonce) {
  std::uint8_t msg[sizeof auth_context - 1 + nonce_bytes];
  std::memcpy(msg, auth_context, sizeof auth_context - 1);
  std::memcpy(msg + sizeof auth_context - 1, nonce.data(), nonce_bytes);
  sha256_digest d = hmac_sha256(token.data(), token.size(), msg, sizeof msg);
  std::array<std::uint8_t, nonce_bytes> out{};
  std::memcpy(out.data(), d.data(), nonce_bytes);
  return out;
}

/// True when `proof` answers `nonce` under `token` (constant-time compare).
inline bool auth_ok(const std::string& token, const std::array<std::uint8_t, nonce_bytes>& nonce,
                    const std::array<std::uint8_t, nonce_bytes>& proof) {
  auto want = auth_proof(token, nonce);
  return digest_equal(want.data(), proof.data(), nonce_bytes);
}

/// Fills `nonce` from the kernel's random source.
/// Errors: errc::system_error when getrandom() fails (no entropy source).
inline status make_nonce(std::array<std::uint8_t, nonce_bytes>& nonce) {
  std::size_t got = 0;
  while (got < nonce.size()) {
    ssize_t n = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(errc::system_error, "getrandom() failed for the store handshake nonce: errno %d",
                        errno);
    }
    got += static_cast<std::size_t>(n);
  }
  return {};
}

/// Reason text of a refused handshake (sent to the client, which shows it).
inline constexpr char wrong_token_reason[] = "wrong job token";

}  // namespace proto
}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
