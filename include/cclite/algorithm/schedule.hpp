// cclite/algorithm/schedule.hpp - type-free arithmetic shared by the algorithms.
#pragma once

#include <algorithm>
#include <cstddef>

namespace cclite {

/// `count` elements split into `parts` contiguous segments whose sizes differ
/// by at most one element (the first count % parts segments get the extra one).
struct segments {
  std::size_t count, parts;
  std::size_t offset(std::size_t i) const {
    std::size_t base = count / parts, rem = count % parts;
    return i * base + std::min(i, rem);
  }
  std::size_t length(std::size_t i) const { return offset(i + 1) - offset(i); }
  std::size_t max_length() const { return count / parts + (count % parts ? 1 : 0); }
};

/// The part of segment `seg` that ring round `round` moves, in elements:
/// [begin, end) relative to the buffer start. Each round moves at most
/// `chunk` elements of every segment, so one round's traffic per link is
/// bounded by the chunk size, which is what keeps a ring with bounded FIFOs
/// deadlock-free (every rank can complete its send of a round without the
/// receiver having consumed anything).
struct round_part {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
inline round_part part_of(const segments& s, std::size_t seg, std::size_t round, std::size_t chunk) {
  std::size_t len = s.length(seg), lo = std::min(len, round * chunk), hi = std::min(len, lo + chunk);
  return {s.offset(seg) + lo, s.offset(seg) + hi};
}
inline std::size_t rounds_for(const segments& s, std::size_t chunk) {
  std::size_t m = s.max_length();
  return m == 0 ? 0 : (m + chunk - 1) / chunk;
}

}  // namespace cclite
