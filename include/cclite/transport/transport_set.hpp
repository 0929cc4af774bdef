// cclite/transport/transport_set.hpp - a compile-time list of transports, chosen per peer at run time.
//
// `transport_set<shm::transport, tcp::transport>` holds one instance of each
// transport. For every peer, the first transport in the list that both ranks
// enabled and whose can_connect() says yes is used (NCCL's rule over its
// ncclTransports[] array). The connected link lives in a std::variant: no heap,
// no vtable, and algorithms visit it once per step, not per byte.
#pragma once

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <cclite/transport/concept.hpp>

namespace cclite {

template <class... Ts>
class transport_set {
  static_assert(sizeof...(Ts) > 0, "a communicator needs at least one transport");
  static_assert((is_transport_v<Ts> && ...),
                "every type in communicator<...> must model the transport concept "
                "(see cclite/transport/concept.hpp)");

 public:
  /// std::monostate = not connected.
  using link = std::variant<std::monostate, typename Ts::link_type...>;
  static constexpr std::size_t count = sizeof...(Ts);

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  explicit transport_set(const transport_context& ctx) : transports_(ctx_for<Ts>(ctx)...) {}

  /// Names of the transports this process enables (env switches applied).
  static result<std::vector<std::string>> enabled_names() {
    std::vector<std::string> names;
    status err;
    auto add = [&](const char* name, result<bool> on) {
      if (!on) err = on.error();
      else if (on.value()) names.emplace_back(name);
    };
    (add(Ts::name, Ts::enabled()), ...);
    if (!err.ok()) return err;
    return names;
  }

  /// Name of transport number `index` in the list.
  static const char* name(int index) {
    const char* names[] = {Ts::name...};
    return index >= 0 && index < static_cast<int>(count) ? names[index] : "none";
  }

  /// Calls publish() on every transport this rank enabled.
  status publish(const peer_info& self) {
    status st;
    for_each([&](auto& t, auto) {
      using T = std::decay_t<decltype(t)>;
      if (st.ok() && self.has_transport(T::name)) st = t.publish();
    });
    return st;
  }

  /// Index of the transport to use between self and peer, or -1 if none.
  int choose(const peer_info& self, const peer_info& peer) const {
    int chosen = -1;
    for_each([&](const auto& t, auto i) {
      using T = std::decay_t<decltype(t)>;
      if (chosen < 0 && self.has_transport(T::name) && peer.has_transport(T::name) &&
          t.can_connect(self, peer)) {
        chosen = static_cast<int>(i);
      }
    });
    return chosen;
  }

  /// Connects to `peer` with transport number `index` (from choose()) and
  /// builds the link in `into` (which holds none), where it stays: a link
  /// variant is never moved, which would compile a move of every
  /// alternative into every such place.
  status connect(int index, int peer, deadline until, link& into) {
    status out(errc::no_transport, "no transport");
    for_each([&](auto& t, auto i) {
      if (static_cast<int>(i) != index) return;
      auto l = t.connect(peer, until);
      if (!l) {
        out = l.error();
        return;
      }
      into.template emplace<1 + decltype(i)::value>(std::move(l.value()));
      out = status{};
    });
    return out;
  }

  /// After a fatal error of the communicators over these transports: each
  /// transport that has a listener closes it (tcp::transport::stop_listening),
  /// so peers waiting to connect to this rank learn it instead of waiting.
  void stop_listening() noexcept {
    for_each([](auto& t, auto) {
      if constexpr (has_stop_listening<std::decay_t<decltype(t)>>::value) t.stop_listening();
    });
  }
CCLITE_SETUP_CODE_END

 private:
  template <class T, class = void>
  struct has_stop_listening : std::false_type {};
  template <class T>
  struct has_stop_listening<T, std::void_t<decltype(std::declval<T&>().stop_listening())>> : std::true_type {};

  template <class>
  static const transport_context& ctx_for(const transport_context& c) { return c; }

  // f(transport, std::integral_constant<size_t, I>) for each transport in order.
  template <class F>
  void for_each(F&& f) {
    for_each_impl(std::forward<F>(f), std::index_sequence_for<Ts...>{});
  }
  template <class F>
  void for_each(F&& f) const {
    for_each_impl(std::forward<F>(f), std::index_sequence_for<Ts...>{});
  }
  template <class F, std::size_t... I>
  void for_each_impl(F&& f, std::index_sequence<I...>) {
    (f(std::get<I>(transports_), std::integral_constant<std::size_t, I>{}), ...);
  }
  template <class F, std::size_t... I>
  void for_each_impl(F&& f, std::index_sequence<I...>) const {
    (f(std::get<I>(transports_), std::integral_constant<std::size_t, I>{}), ...);
  }

  std::tuple<Ts...> transports_;
};

/// The kind ("shm", "tcp") of a connected link, "none" if not connected.
template <class Variant>
const char* link_kind(const Variant& v) {
  return std::visit(
      [](const auto& l) -> const char* {
        if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) {
          return "none";
        } else {
          return l.kind();
        }
      },
      v);
}

}  // namespace cclite
