// cclite/core/clock.hpp - deadlines. Every wait in cclite takes one.
#pragma once

#include <chrono>
#include <cstdint>

namespace cclite {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// Wall-clock microseconds since the Unix epoch (what the flight recorder
/// writes: comparable across processes and nodes, unlike `clock`).
inline std::int64_t wall_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

/// A point in time after which a wait gives up with errc::timeout.
/// `deadline::never()` exists for tests and tools; the library itself always
/// derives deadlines from CCLITE_TIMEOUT or a per-call timeout.
class deadline {
 public:
  deadline() noexcept : at_(clock::time_point::max()) {}
  explicit deadline(clock::time_point at) noexcept : at_(at) {}

  static deadline after(milliseconds d) noexcept {
    auto now = clock::now();
    if (d.count() < 0 || d > milliseconds(std::int64_t(1) << 50)) return never();
    return deadline(now + d);
  }
  static deadline never() noexcept { return deadline(); }

  bool expired() const noexcept { return at_ != clock::time_point::max() && clock::now() >= at_; }
  bool is_never() const noexcept { return at_ == clock::time_point::max(); }
  clock::time_point at() const noexcept { return at_; }

  /// Time left, clamped to [0, cap].
  milliseconds remaining(milliseconds cap = milliseconds(std::int64_t(1) << 40)) const noexcept {
    if (is_never()) return cap;
    auto left = std::chrono::duration_cast<milliseconds>(at_ - clock::now());
    if (left.count() < 0) return milliseconds(0);
    return left < cap ? left : cap;
  }

  /// The earlier of two deadlines.
  static deadline min(deadline a, deadline b) noexcept { return a.at_ < b.at_ ? a : b; }

  /// `until`, or `d` from now if that is earlier: then marked as a slice, a
  /// wait that ends there is not the call's timeout. Waits that build an
  /// error message on expiry skip it for a slice (is_slice()), so a caller
  /// polling in slices allocates nothing while it waits.
  static deadline slice_of(deadline until, milliseconds d) noexcept {
    deadline s = after(d);
    if (!(s.at_ < until.at_)) return until;
    s.slice_ = true;
    return s;
  }
  bool is_slice() const noexcept { return slice_; }

 private:
  clock::time_point at_;
  bool slice_ = false;
};

/// Seconds since an arbitrary epoch, as a double (bench and log timestamps).
inline double now_seconds() noexcept {
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

}  // namespace cclite
