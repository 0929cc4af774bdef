// cclite/core/bytes.hpp - non-owning byte ranges (a C++17 stand-in for std::span<std::byte>).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cclite {

/// Read-only bytes [data, data + size).
struct const_bytes {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  bool empty() const noexcept { return size == 0; }
};

/// Writable bytes [data, data + size).
struct mutable_bytes {
  std::uint8_t* data = nullptr;
  std::size_t size = 0;
  bool empty() const noexcept { return size == 0; }
};

/// Rounds `n` down / up to a multiple of `a` (a > 0).
constexpr std::size_t align_down(std::size_t n, std::size_t a) noexcept { return n - n % a; }
constexpr std::size_t align_up(std::size_t n, std::size_t a) noexcept {
  return (n + a - 1) / a * a;
}

/// The low `n` bytes of `v` into `p`, little-endian whatever the host: every
/// frame cclite defines is encoded this way (config.hpp, byte order).
inline void put_le(std::uint8_t* p, std::uint64_t v, int n) noexcept {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
/// `n` little-endian bytes at `p` as a number.
inline std::uint64_t get_le(const std::uint8_t* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace cclite
