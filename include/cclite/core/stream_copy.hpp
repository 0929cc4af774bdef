// cclite/core/stream_copy.hpp - a copy whose destination bypasses the cache.
//
// An ordinary store to a line that is not in cache first reads the line from
// memory (write-allocate), so copying S bytes into a cold destination moves
// 3S bytes over the memory bus: S read, S read for ownership, S written back.
// Non-temporal stores write whole lines without reading them: 2S. For the
// last copy of a large collective (the result into the caller's buffer,
// larger than any cache, not read again by us) that is a third less traffic
// on a memory-bound machine. For small buffers it is a loss: the caller's
// next read of its result would miss the cache, hence the size threshold at
// the call sites.
//
// x86-64 only (SSE2 is part of the base ISA); elsewhere it is std::memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace cclite {

/// Copies `n` bytes like std::memcpy, with non-temporal stores for the
/// 16-byte-aligned body of `dst` where the target has them. The stores are
/// not ordered with later ones until stream_fence(): call it before another
/// thread or process may read `dst`.
inline void stream_copy(void* dst, const void* src, std::size_t n) noexcept {
#if defined(__SSE2__)
  auto* d = static_cast<std::uint8_t*>(dst);
  auto* s = static_cast<const std::uint8_t*>(src);
  const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16;
  if (n < head + 64) {
    std::memcpy(d, s, n);
    return;
  }
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; d += 64, s += 64, n -= 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n);
#else
  std::memcpy(dst, src, n);
#endif
}

/// Orders the non-temporal stores of stream_copy() before every later store
/// (x86 sfence; nothing elsewhere).
inline void stream_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace cclite
