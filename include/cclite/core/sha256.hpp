// cclite/core/sha256.hpp - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104).
//
// Used by the rendezvous store's job-token handshake
// (transports/tcp/include/cclite/tcp/store_auth.hpp): a client proves it knows
// the job token by answering HMAC-SHA256(token, nonce) to the server's random
// nonce, so the token itself never crosses the network.
//
// Small, portable and dependency-free on purpose (no OpenSSL in an embedded
// build). It is not hardened against timing side channels beyond what the
// algorithm gives for free; compare MACs with digest_equal(), which takes the
// same time whatever the first differing byte. Checked against the FIPS 180-4
// and RFC 4231 test vectors in tests/store_auth_test.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <cclite/config.hpp>

namespace cclite {
CCLITE_SETUP_CODE_BEGIN  // store authentication, checkpoint checksums: compiled for size

/// A SHA-256 digest, 32 bytes.
using sha256_digest = std::array<std::uint8_t, 32>;

/// Incremental SHA-256: update() any number of times, then finish() once.
class sha256 {
 public:
  sha256() noexcept { reset(); }

  void reset() noexcept {
    static constexpr std::uint32_t init[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                              0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    std::memcpy(h_, init, sizeof h_);
    len_ = 0;
    fill_ = 0;
  }

  void update(const void* data, std::size_t n) noexcept {
    auto p = static_cast<const std::uint8_t*>(data);
    len_ += n;
    while (n > 0) {
      std::size_t k = 64 - fill_;
      if (k > n) k = n;
      std::memcpy(buf_ + fill_, p, k);
      fill_ += k;
      p += k;
      n -= k;
      if (fill_ == 64) {
        block(buf_);
        fill_ = 0;
      }
    }
  }
  void update(const std::string& s) noexcept { update(s.data(), s.size()); }

  /// The digest of everything updated so far; the object must be reset()
  /// before it is used again.
  sha256_digest finish() noexcept {
    const std::uint64_t bits = len_ * 8;
    const std::uint8_t pad = 0x80;
    update(&pad, 1);
    const std::uint8_t zero = 0;
    while (fill_ != 56) update(&zero, 1);
    std::uint8_t lenb[8];
    for (int i = 0; i < 8; ++i) lenb[i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));  // big-endian
    update(lenb, 8);
    sha256_digest out{};
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[std::size_t(4 * i + j)] = static_cast<std::uint8_t>(h_[i] >> (24 - 8 * j));
    return out;
  }

  /// One-shot digest.
  static sha256_digest hash(const void* data, std::size_t n) noexcept {
    sha256 s;
    s.update(data, n);
    return s.finish();
  }
  static sha256_digest hash(const std::string& s) noexcept { return hash(s.data(), s.size()); }

 private:
  static std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

  void block(const std::uint8_t* p) noexcept {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
        0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
        0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
        0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
        0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
        0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
        0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
        0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = std::uint32_t(p[4 * i]) << 24 | std::uint32_t(p[4 * i + 1]) << 16 | std::uint32_t(p[4 * i + 2]) << 8 |
             std::uint32_t(p[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      std::uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }

  std::uint32_t h_[8];
  std::uint64_t len_ = 0;
  std::uint8_t buf_[64];
  std::size_t fill_ = 0;
};

/// HMAC-SHA256(key, message), RFC 2104 with SHA-256 (block 64 bytes). Any key
/// length, the empty key included.
inline sha256_digest hmac_sha256(const void* key, std::size_t key_len, const void* msg,
                                 std::size_t msg_len) noexcept {
  std::uint8_t k[64] = {0};
  if (key_len > 64) {
    auto d = sha256::hash(key, key_len);
    std::memcpy(k, d.data(), d.size());
  } else if (key_len > 0) {
    std::memcpy(k, key, key_len);
  }
  std::uint8_t ipad[64], opad[64];
  for (int i = 0; i < 64; ++i) {
    ipad[i] = static_cast<std::uint8_t>(k[i] ^ 0x36);
    opad[i] = static_cast<std::uint8_t>(k[i] ^ 0x5c);
  }
  sha256 inner;
  inner.update(ipad, 64);
  inner.update(msg, msg_len);
  auto ih = inner.finish();
  sha256 outer;
  outer.update(opad, 64);
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

inline sha256_digest hmac_sha256(const std::string& key, const std::string& msg) noexcept {
  return hmac_sha256(key.data(), key.size(), msg.data(), msg.size());
}

/// Compares two byte strings of length n in time independent of where they
/// differ (a MAC check must not tell an attacker how many bytes were right).
inline bool digest_equal(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) noexcept {
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < n; ++i) diff = static_cast<std::uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

/// Lower-case hex of `n` bytes (for test vectors and log lines).
inline std::string to_hex(const std::uint8_t* p, std::size_t n) {
  static const char hex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    s += hex[p[i] >> 4];
    s += hex[p[i] & 15];
  }
  return s;
}

CCLITE_SETUP_CODE_END
}  // namespace cclite
