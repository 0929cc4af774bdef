// cclite/transport/concept.hpp - what a transport and its links must provide.
//
// A *transport* (shm::transport, tcp::transport, ...) is constructed once per
// communicator and creates *links*. A link is a connected, reliable, ordered,
// bidirectional byte stream to one peer, driven without blocking:
//
//   Send side   mutable_bytes send_reserve(size_t max)   contiguous writable space (may be empty)
//               void          send_commit(size_t n)      publish n bytes written into it
//   Recv side   const_bytes   recv_peek()                contiguous readable bytes (may be empty)
//               void          recv_consume(size_t n)     release n bytes back to the sender
//   Progress    status        poll()                     non-blocking progress (move bytes between
//                                                        socket and staging, ...); errors: peer_lost,
//                                                        protocol_error
//               status        wait(wait_for w, deadline) block until `w` may be satisfied; may
//                                                        return early (callers loop); errors: timeout,
//                                                        peer_lost, aborted
//               status        flush(deadline)            optional: returns once every committed
//                                                        byte can reach the peer without further
//                                                        calls on this link (tcp: all handed to
//                                                        the kernel); called at the end of each
//                                                        collective
//               status        probe_peer()               optional: never blocks; peer_lost if the
//                                                        peer is gone or closed the link (set-up
//                                                        waits in the store ask it between slices,
//                                                        comm_core::watch_members)
//               int           peer() const               the peer's rank
//               const char*   kind() const               "shm", "tcp" (logs)
//
// Why reserve/commit and peek/consume rather than send(buf)/recv(buf): the
// algorithms reduce straight out of the receive buffer into the send buffer
// of the next hop (NCCL's recvReduceSend) with no intermediate copy, and a
// transport with real shared memory exposes its FIFO directly.
//
// Stream alignment contract: the algorithm layer only ever commits/consumes
// multiples of the element size within one collective and pads every stream
// to a multiple of max_dtype_size (8) at the end of each collective. Transports
// keep their buffer capacities a multiple of 4096, so a reserved or peeked
// region never splits an element.
//
// A *transport* T provides:
//   using link_type = ...;                                    movable
//   static constexpr const char* name;                        "shm": the name in peer_info::transports
//   static result<bool> enabled();                            env switch (CCLITE_SHM_DISABLE=1 ...)
//   explicit T(const transport_context&);                     cheap; no I/O
//   status publish();                                         called once on every rank before any
//                                                             connect: put this rank's endpoint
//                                                             (listen address, ...) into the store
//   bool can_connect(const peer_info& self, const peer_info& peer) const;
//                                                             topology test only (same host for shm);
//                                                             both ranks of a pair must agree
//   result<link_type> connect(int peer, deadline until);      both ranks of the pair call it (in any
//                                                             order relative to other pairs' connects,
//                                                             but each rank connects its peers in
//                                                             ascending (min,max) pair order)
// Communicators list transports in priority order; for each peer the first
// transport both ranks enabled and whose can_connect() is true wins (NCCL's rule).
#pragma once

#include <atomic>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include <cclite/bootstrap/fault_record.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/topology/peer_info.hpp>

namespace cclite {

/// What a caller of link::wait() is waiting for (bit mask).
enum class wait_for : unsigned { recv = 1, send = 2, any = 3 };
inline constexpr bool has(wait_for set, wait_for bit) noexcept {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(bit)) != 0;
}

/// Everything a transport gets from the communicator that owns it. Pointers
/// stay valid for the transport's whole life.
struct transport_context {
  int rank = 0;
  int size = 1;
  const std::vector<peer_info>* peers = nullptr;  ///< indexed by rank
  store* kv = nullptr;                            ///< prefixed per communicator
  const logger* log = nullptr;
  const std::atomic<bool>* aborted = nullptr;     ///< set by communicator::abort()
  std::string job_tag;                            ///< unique per communicator (shm names)

  const peer_info& self() const { return (*peers)[static_cast<std::size_t>(rank)]; }
  const peer_info& peer(int r) const { return (*peers)[static_cast<std::size_t>(r)]; }
  bool is_aborted() const { return aborted && aborted->load(std::memory_order_relaxed); }

  /// The job's first failure if a communicator over these transports has
  /// recorded one in `kv` (bootstrap/fault_record.hpp), else ok: asked now and
  /// then by connect waits that no link can end (a peer that failed while its
  /// process lives on, or was lost where only others could see it). One store
  /// round trip; a store silent for 500 ms counts as no record.
  status recorded_failure() const {
    if (!kv) return {};
    status st = recorded_fault(*kv, deadline::after(milliseconds(500)));
    if (st.ok()) return st;
    return status(st.code(), "gave up: the job's first failure: " + st.message());
  }
};

namespace detail {
template <class L, class = void>
struct is_link : std::false_type {};
template <class L>
struct is_link<L, std::void_t<decltype(std::declval<L&>().send_reserve(std::size_t{})),
                              decltype(std::declval<L&>().send_commit(std::size_t{})),
                              decltype(std::declval<L&>().recv_peek()),
                              decltype(std::declval<L&>().recv_consume(std::size_t{})),
                              decltype(std::declval<L&>().poll()),
                              decltype(std::declval<L&>().wait(wait_for::any, deadline{})),
                              decltype(std::declval<const L&>().peer()),
                              decltype(std::declval<const L&>().kind())>> : std::true_type {};

template <class T, class = void>
struct is_transport : std::false_type {};
template <class T>
struct is_transport<
    T, std::void_t<typename T::link_type, decltype(T::name), decltype(T::enabled()),
                   decltype(std::declval<T&>().publish()),
                   decltype(std::declval<const T&>().can_connect(std::declval<const peer_info&>(),
                                                                 std::declval<const peer_info&>())),
                   decltype(std::declval<T&>().connect(0, deadline{}))>>
    : std::bool_constant<is_link<typename T::link_type>::value> {};
}  // namespace detail

template <class L>
inline constexpr bool is_link_v = detail::is_link<L>::value;
template <class T>
inline constexpr bool is_transport_v = detail::is_transport<T>::value;

}  // namespace cclite
