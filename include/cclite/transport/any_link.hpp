// cclite/transport/any_link.hpp - one link type for a whole transport set.
//
// `any_link<std::variant<std::monostate, shm::link, tcp::link>>` models the
// link concept (transport/concept.hpp) over whichever link the variant holds.
// The communicator runs every algorithm over primitives<any_link<...>,
// any_link<...>>, so each algorithm is compiled once per transport set instead
// of once per (incoming link type, outgoing link type) pair: with shm and tcp
// that was four copies of every algorithm and of every primitive, the largest
// share of the code a TU that calls a collective compiles.
//
// The price is one switch on the variant index per link call; the primitives
// make a few such calls per piece (up to 64 KiB), not per byte, and the
// reduction kernels inside are untouched (bench/allreduce_perf shows no
// difference, see README "Footprint").
//
// Precondition: the variant does not hold std::monostate (with_links checks
// that before it builds an any_link); calls on an empty one are no-ops that
// report errc::no_transport where they can.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <variant>

#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/transport/concept.hpp>
#include <cclite/transport/direct.hpp>

namespace cclite {

template <class Variant>
class any_link {
 public:
  explicit any_link(Variant& v) noexcept : v_(v) {}

  mutable_bytes send_reserve(std::size_t max) {
    return on([&](auto& l) { return l.send_reserve(max); }, [] { return mutable_bytes{}; });
  }
  void send_commit(std::size_t n) {
    on([&](auto& l) { l.send_commit(n); return 0; }, [] { return 0; });
  }
  const_bytes recv_peek() {
    return on([&](auto& l) { return l.recv_peek(); }, [] { return const_bytes{}; });
  }
  void recv_consume(std::size_t n) {
    on([&](auto& l) { l.recv_consume(n); return 0; }, [] { return 0; });
  }
  status poll() {
    return on([&](auto& l) { return l.poll(); }, not_connected);
  }
  status wait(wait_for w, deadline until) {
    return on([&](auto& l) { return l.wait(w, until); }, not_connected);
  }
  /// Links without flush() (shm) have nothing buffered in user space.
  status flush(deadline until) {
    return on([&](auto& l) { return flush_one(l, until); }, [] { return status{}; });
  }
  // Direct windows (transport/direct.hpp), where the held link has them;
  // elsewhere begin is refused and the rest does nothing.
  bool send_direct_begin(const std::uint8_t* src, std::size_t ready, std::size_t total, bool exchange = false) {
    return on_direct(false, [&](auto& l) { return l.send_direct_begin(src, ready, total, exchange); });
  }
  void send_direct_extend(std::size_t ready) {
    on_direct(0, [&](auto& l) { return l.send_direct_extend(ready), 0; });
  }
  std::size_t send_direct_left() {
    return on_direct(std::size_t{0}, [&](auto& l) { return l.send_direct_left(); });
  }
  void send_direct_end(const status& why) {
    on_direct(0, [&](auto& l) { return l.send_direct_end(why), 0; });
  }
  bool recv_direct_begin(std::uint8_t* out, std::size_t bytes, bool exchange = false) {
    return on_direct(false, [&](auto& l) { return l.recv_direct_begin(out, bytes, exchange); });
  }
  std::size_t recv_direct_arrived() {
    return on_direct(std::size_t{0}, [&](auto& l) { return l.recv_direct_arrived(); });
  }
  void recv_direct_end(const status& why) {
    on_direct(0, [&](auto& l) { return l.recv_direct_end(why), 0; });
  }

  int peer() const {
    return std::visit([](const auto& l) -> int {
      if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) return -1;
      else return l.peer();
    }, v_);
  }
  const char* kind() const {
    return std::visit([](const auto& l) -> const char* {
      if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) return "none";
      else return l.kind();
    }, v_);
  }

 private:
  static status not_connected() { return status(errc::no_transport, "link not connected"); }

  template <class L>
  static auto flush_one(L& l, deadline until) -> decltype(l.flush(until)) { return l.flush(until); }
  template <class L, class... Ignored>
  static status flush_one(L&, deadline, Ignored...) { return {}; }

  // `f(link)` where the held link has direct windows, else `none`.
  template <class R, class F>
  R on_direct(R none, F&& f) {
    return on([&](auto& l) -> R {
      if constexpr (direct::has_windows_v<std::decay_t<decltype(l)>>) return f(l);
      else return none;
    }, [&] { return none; });
  }

  // Index-checked dispatch without std::visit: a chain of compares that GCC
  // and Clang turn into a jump or two, and no bad_variant_access path (this
  // header is used with -fno-exceptions). `empty()` makes the result for
  // std::monostate only, so the hot path builds no status message.
  template <class F, class E>
  auto on(F&& f, E&& empty) {
    return on_impl<0>(f, empty);
  }
  template <std::size_t I, class F, class E>
  auto on_impl(F& f, E& empty) -> decltype(empty()) {
    if constexpr (I == std::variant_size_v<Variant>) {
      return empty();
    } else if constexpr (std::is_same_v<std::variant_alternative_t<I, Variant>, std::monostate>) {
      return on_impl<I + 1>(f, empty);
    } else {
      if (v_.index() == I) return f(*std::get_if<I>(&v_));
      return on_impl<I + 1>(f, empty);
    }
  }

  Variant& v_;
};

}  // namespace cclite
