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

}  // namespace cclite
