// cclite/transport/direct.hpp - optional link extension: large messages that
// move between the wire and the caller's buffer without a staging ring.
//
// A link that stages bytes in user-space rings (tcp) copies every byte twice
// on each side: caller <-> ring by memcpy, ring <-> kernel by the socket
// call. For a large message the ring copy is pure cost: the socket calls can
// read from and write into the caller's buffer themselves (Open MPI's TCP BTL
// does so for its large messages). A link offers that with these members
// (all optional; links without them, shm and verbs, keep the staged path):
//
//   bool        send_direct_begin(const uint8_t* src, size_t ready, size_t total,
//                                 bool exchange = false)
//                   opens a send window of `total` bytes at the stream's
//                   current end, sent from src itself; src[0..ready) may go
//                   now. false (nothing changed): the link will not (message
//                   below its threshold, a failed link, a window already open).
//                   `exchange`: the verb moves the other direction in the
//                   same loop (sendrecv), so it waits for the receive
//                   anyway and a window pays from a lower threshold
//   void        send_direct_extend(size_t ready)   src[0..ready) may go now
//   size_t      send_direct_left()                 bytes not yet handed to
//                                                  the kernel (0: src is free)
//   void        send_direct_end(const status& why) closes the window
//   bool        recv_direct_begin(uint8_t* out, size_t bytes, bool exchange = false)
//                   the next `bytes` of the stream land in out; false as above
//   size_t      recv_direct_arrived()              length of the prefix of out
//                                                  that is complete
//   void        recv_direct_end(const status& why) closes the window
//
// While a window is open the link's ring calls of that direction are closed
// to the caller (send_reserve() is empty, recv_peek() is empty), and wait()
// returns when the window moved (recv: new bytes arrived; send: all ready
// bytes left). Ending a window whose bytes have not all moved (the verb failed
// or timed out: `why`) fails the link with `why`, sticky: its sockets never
// touch the caller's buffer again, which the caller may free at once.
//
// Contract difference from the staged path, on the send side: a staged send
// returns once its last byte is in the ring; a direct one once its last byte
// is in the kernel. A peer that only reads after it has itself sent more than
// its buffers hold would wait. The algorithms never ask that: a ring round
// sends at most a chunk per step (CCLITE_CHUNKSIZE, at most a quarter of the
// smallest link buffer), which the peer's receive ring takes while the peer
// sends too; the verbs that move whole messages (a chain broadcast, a reduce
// chain's first hop, a scan's hops, gather / scatter to and from the root)
// have a receiving peer; and a sendrecv moves its receive (window or FIFO)
// in the same loop as its send window, so its peer's sends never wait on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <cclite/core/status.hpp>

namespace cclite::direct {

/// Whether link type L has the members above (all of them: a link offers
/// both directions or none).
template <class L, class = void>
struct has_windows : std::false_type {};
template <class L>
struct has_windows<L, std::void_t<decltype(std::declval<L&>().send_direct_begin(
                                      std::declval<const std::uint8_t*>(), std::size_t{}, std::size_t{}, bool{})),
                                  decltype(std::declval<L&>().send_direct_extend(std::size_t{})),
                                  decltype(std::declval<L&>().send_direct_left()),
                                  decltype(std::declval<L&>().send_direct_end(std::declval<const status&>())),
                                  decltype(std::declval<L&>().recv_direct_begin(std::declval<std::uint8_t*>(),
                                                                                std::size_t{}, bool{})),
                                  decltype(std::declval<L&>().recv_direct_arrived()),
                                  decltype(std::declval<L&>().recv_direct_end(std::declval<const status&>()))>>
    : std::true_type {};
template <class L>
inline constexpr bool has_windows_v = has_windows<L>::value;

}  // namespace cclite::direct
