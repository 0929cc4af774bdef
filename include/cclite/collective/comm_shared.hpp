// cclite/collective/comm_shared.hpp - what a communicator does through memory
// that every rank of its node maps: the shm-direct allreduce (each rank
// reduces its slice from the peers' shared buffers, shm/direct.hpp) and the
// alloc_shared() windows (an in-place allreduce on them needs no staging
// copies). Both exist only when a transport offering a node-wide
// `direct_group` (shm) is compiled in; communicator<...> derives from this.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <cclite/collective/comm_algorithms.hpp>
#include <cclite/collective/mismatch.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>

namespace cclite::detail {

// The first of the transports that offers a node-wide `direct_group` (shm),
// or void: shm-direct exists only when such a transport is compiled in.
template <class T, class = void>
struct direct_of {
  using type = void;
};
template <class T>
struct direct_of<T, std::void_t<typename T::direct_group>> {
  using type = typename T::direct_group;
};
template <class... Ts>
struct first_direct {
  using type = void;
};
template <class T, class... Ts>
struct first_direct<T, Ts...> {
  using mine = typename direct_of<T>::type;
  using type = std::conditional_t<std::is_void_v<mine>, typename first_direct<Ts...>::type, mine>;
};

template <class... Transports>
class comm_shared : public comm_algorithms<Transports...> {
  using core = comm_algorithms<Transports...>;

 protected:
  using core::rank_; using core::size_; using core::log_; using core::peers_; using core::tag_;
  using core::timeout; using core::aborted_; using core::pool_; using core::select_; using core::hdr_;
  using direct_t = typename first_direct<Transports...>::type;
  static constexpr bool has_direct = !std::is_void_v<direct_t>;
  using group_t = std::conditional_t<has_direct, direct_t, int>;  // int: a placeholder without shm

  using core::core;

 public:
  /// Memory every rank of this communicator maps (NCCL's ncclMemAlloc plus
  /// buffer registration, for one node): collective, every rank asks for the
  /// same bytes in the same order. An in-place allreduce on a range of it,
  /// with the same offset on every rank, reads the peers' data where it lies
  /// and writes the result into every rank's copy, with no staging copies
  /// (shm/direct.hpp, shared windows): 2 S bytes of memory traffic per rank
  /// instead of about 4.5 S through the shm links. Zero-filled, page-aligned,
  /// valid until the communicator goes. Other calls on it work as on any
  /// memory. Errors: errc::unsupported unless all ranks share one node over
  /// shm links (use ordinary memory there); as create() for the set-up.
  /// Not while async calls of this communicator are outstanding. A rank
  /// passing a different range, or ordinary memory while the others pass the
  /// window (the call header says which), gets errc::mismatch (with the check
  /// on: CCLITE_CHECK_MISMATCH, collective/mismatch.hpp). In-place calls
  /// of at most 1 KiB take the ordinary path on every rank.
  result<void*> alloc_shared(std::size_t bytes) {
    if constexpr (has_direct) {
      if (!select_.direct_possible())
        return make_error(errc::unsupported, "alloc_shared: the ranks of this communicator do not all share one node "
                          "over shared-memory links (%d node(s))", this->topo_.node_count());
      if (bytes == 0) return make_error(errc::invalid_argument, "alloc_shared: 0 bytes");
      const deadline until = deadline::after(timeout());
      std::unique_lock<std::mutex> hold(pool_->busy, std::defer_lock);
      CCLITE_TRY(hold_links(hold, until));
      auto spin = spin_from_env();
      if (!spin) return spin.error();
      auto g = direct_t::create_window(*this->kv_, tag_, windows_made_++, peers_, rank_, bytes,
                                       &aborted_, spin.value(), until);
      if (!g) return status(g.error().code(), "alloc_shared: " + g.error().message());
      windows_.push_back(std::move(g.value()));
      return static_cast<void*>(windows_.back()->window_data());
    } else {
      (void)bytes;
      return make_error(errc::unsupported, "alloc_shared needs the shm transport");
    }
  }

  /// Where the byte at `p` of this rank's alloc_shared() window lies in rank
  /// `r`'s copy of that window (MPI_Win_shared_query): this process maps
  /// every rank's copy, so loads and stores there reach rank r's memory
  /// directly, with no call on the peer. Ordering is the caller's business:
  /// a barrier() between one rank's stores and another's loads (the
  /// communicator's collectives order memory like release / acquire).
  /// Local, no communication. errc::invalid_argument when `p` is not in a
  /// window of this communicator or `r` is not a rank of it.
  result<void*> shared_peer(const void* p, int r) const {
    if (r < 0 || r >= size_)
      return make_error(errc::invalid_argument, "shared_peer: rank %d is not in this communicator (size %d)", r, size_);
    const auto* q = static_cast<const std::uint8_t*>(p);
    if constexpr (has_direct) {
      if (const auto* w = window_of(q, 1)) {
        if (std::uint8_t* base = w->window_of_rank(peers_[static_cast<std::size_t>(r)].rank))
          return static_cast<void*>(base + (q - w->window_data()));
      }
    }
    return make_error(errc::invalid_argument, "shared_peer: %p is not in a window of alloc_shared()", p);
  }

  /// Unmaps a window of alloc_shared() on this rank (local: the peers keep
  /// theirs until they free them). Not while a call on it is outstanding.
  status free_shared(void* p) {
    for (auto it = windows_.begin(); it != windows_.end(); ++it) {
      if constexpr (has_direct) {
        if ((*it)->window_data() == p) {
          windows_.erase(it);
          return {};
        }
      }
    }
    return make_error(errc::invalid_argument, "free_shared: %p is not from alloc_shared()", p);
  }

 protected:
  // Takes the family's link lock (link_pool.hpp), bounded by the timeout and
  // the abort flag.
  status hold_links(std::unique_lock<std::mutex>& hold, deadline until) {
    // try_lock and a short sleep rather than std::timed_mutex: its
    // pthread_mutex_clocklock is not intercepted by GCC 12's ThreadSanitizer,
    // which then reports every unlock as a bad one. Contention here is rare
    // (a split() parent and child used from two threads at once).
    while (!hold.try_lock()) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (aborted_.load()) return make_error(errc::aborted, "communicator aborted (rank %d)", rank_);
      if (until.expired())
        return make_error(errc::timeout, "rank %d: the links this communicator shares with its split() parent or "
                          "children stayed busy for the whole timeout (calls on them must come in the same "
                          "order on every rank)", rank_);
    }
    return {};
  }

  // The node-wide groups are built on first use (every rank of a one-node job
  // takes this path for the same call, so the set-up is collective): direct_
  // for shm-direct allreduces, small_ (header pages only) for small calls and
  // barriers.
  status ensure_direct(deadline until) { return direct_ ? status{} : make_group(direct_, false, until); }
  status ensure_small(deadline until) { return small_ ? status{} : make_group(small_, true, until); }

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  status make_group(std::unique_ptr<group_t>& slot, bool small, deadline until) {
    if constexpr (has_direct) {
      CCLITE_TRY(this->agree_on_call(until));  // the set-up below waits for every rank
      auto spin = spin_from_env();
      if (!spin) return spin.error();
      auto g = small ? direct_t::create_small(*this->kv_, tag_, peers_, rank_, &aborted_, spin.value(), until)
                     : direct_t::create(*this->kv_, tag_, peers_, rank_, direct_bytes_, &aborted_, spin.value(), until);
      if (!g) return status(g.error().code(), "setting up shm-direct: " + g.error().message());
      slot = std::move(g.value());
      return {};
    } else {
      (void)slot, (void)small, (void)until;
      return make_error(errc::unsupported, "shm-direct needs the shm transport");
    }
  }
CCLITE_SETUP_CODE_END

  status run_direct_allreduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                              const reduction& red, deadline until) {
    if constexpr (has_direct) {
      CCLITE_TRY(ensure_direct(until));
      // Peers' buffers are read directly, without links: the call headers are
      // compared in the group's segments instead (collective/mismatch.hpp).
      std::uint8_t tag[call_header::wire_bytes];
      hdr_.out.encode(tag);
      int odd = -1;
      status st = direct_->allreduce(send, recv, count, red, red.needs_divide ? size_ : 0, until,
                                     hdr_.active ? tag : nullptr, sizeof tag, &odd, links_open());
      if (st.code() == errc::mismatch && odd >= 0)
        return mismatch_error(hdr_.expect, rank_, call_header::decode(direct_->tag_of(odd)),
                              peers_[static_cast<std::size_t>(odd)].rank);
      return st;
    } else {
      (void)send, (void)recv, (void)count, (void)red, (void)until;
      return make_error(errc::unsupported, "shm-direct needs the shm transport");
    }
  }

  // The largest slot shm-direct's small path takes (one rank's share of a
  // small call: the default of CCLITE_SHM_SMALL_MAX), or 0 without shm.
  static constexpr std::size_t small_direct_max = [] {
    if constexpr (has_direct) return group_t::small_max_bytes;
    else return std::size_t(0);
  }();

  // Small calls and barriers on one node (shm/direct.hpp, "Small calls"; a
  // barrier is an allreduce of nothing): allreduce, broadcast, reduce,
  // allgather, reduce_scatter, alltoall, gather and scatter whose slot (what
  // one rank writes) is at most CCLITE_SHM_SMALL_MAX bytes. Once the node-wide
  // small group exists (header pages only: a page per rank, nothing at rest)
  // they need no link traffic at all (dispatch_checked takes this path ahead
  // of the header exchange): the call header travels in the
  // group's slot beside the data and the ranks compare it there. Every rank
  // decides alike: the group is built by the same call everywhere (the first
  // small call goes through dispatch(), over the links) and the size is in
  // the header. A peer that called something else took the links and sent
  // its header down its link: the wait looks at the link from the ring
  // predecessor, and a ring holding ranks of both kinds has one of ours right
  // after one of theirs, which reports the mismatch and wakes the rest.

  // The bytes one rank writes into its slot for `d` (the root's share for
  // broadcast and scatter; every rank's block for reduce_scatter and
  // alltoall), or SIZE_MAX when `d` has no small path.
  std::size_t small_slot_bytes(const op_desc& d) const {
    using ck = collective_kind;
    if (d.kind == ck::barrier) return 0;
    // The compact call header (the slot's tag) holds the root in one byte.
    if ((d.kind == ck::broadcast || d.kind == ck::reduce || d.kind == ck::gather || d.kind == ck::scatter) &&
        (d.root < 0 || d.root > 255))
      return SIZE_MAX;
    if (d.count > small_direct_max) return SIZE_MAX;  // no overflow below
    const std::size_t b = d.count * size_of(d.type);
    switch (d.kind) {
      case ck::allreduce: case ck::broadcast: case ck::reduce: case ck::allgather: case ck::gather:
      case ck::scan: case ck::exscan: return b;
      case ck::reduce_scatter: case ck::alltoall: case ck::scatter: return b * static_cast<std::size_t>(size_);
      default: return SIZE_MAX;
    }
  }
  bool small_direct(const op_desc& d) const {
    const std::size_t b = small_slot_bytes(d);
    // A barrier follows allreduce's CCLITE_ALGO, as it always has.
    return b != SIZE_MAX && select_.small_direct(d.kind == collective_kind::barrier ? collective_kind::allreduce : d.kind, b);
  }
  bool small_direct_ready(const op_desc& d) const { return small_ && small_direct(d); }

  // `h`: this call's header, or null when checking is off. `linkless`: the
  // call sent nothing down the links (else its header went to the ring
  // successor as usual, and the wait only looks for a closed link). The
  // tail is one instance per kind K (comm_dispatch::dispatch_kind<K>): a
  // program compiles the small path of the collectives it calls only.
  template <collective_kind K>
  status run_small_call(const op_desc& d, const call_header* h, bool linkless, deadline until) {
    if constexpr (has_direct) {
      using ck = collective_kind;
      const std::size_t block = K == ck::barrier ? 0 : d.count * size_of(d.type);  // one rank's block
      const bool is_root = rank_ == d.root;
      // What this rank writes (broadcast: its one buffer; broadcast and
      // scatter: the root only), and which part of each slot it reads back.
      const auto* send = static_cast<const std::uint8_t*>(K == ck::broadcast ? d.recv : d.send);
      auto* recv = static_cast<std::uint8_t*>(d.recv);
      const bool gives = !(K == ck::broadcast || K == ck::scatter) || is_root;
      const std::size_t read_from =
          K == ck::reduce_scatter || K == ck::alltoall || K == ck::scatter ? static_cast<std::size_t>(rank_) * block : 0;
      // A rank that reads nothing of the others' leaves at once (direct_small.hpp,
      // "Eager calls"): the root of a broadcast or scatter, the others of a
      // reduce or gather. The scatter root's own block is in its own slot.
      const bool eager = K == ck::broadcast || K == ck::scatter ? is_root
                         : K == ck::reduce || K == ck::gather   ? !is_root
                         : K == ck::scan || K == ck::exscan     ? rank_ == 0  // reads no other slot
                                                                : false;
      CCLITE_TRY(small_exchange(send, gives ? small_slot_bytes(d) : 0, read_from, block, h, linkless, until, eager));
      if (!block) return {};
      // Every slot stays valid until this rank's next small call (direct.hpp).
      if constexpr (K == ck::allreduce || K == ck::reduce || K == ck::reduce_scatter) {
        if (K == ck::reduce && !is_root) return {};
        const reduction red = d.kernels ? d.kernels(d.type, d.op) : reduction{};
        small_->small_reduce(recv, read_from, d.count, red, red.needs_divide ? size_ : 0);
      } else if constexpr (K == ck::broadcast || K == ck::scatter) {
        if (K == ck::scatter || !is_root) std::memcpy(recv, small_->small_data(d.root) + read_from, block);
      } else if constexpr (K == ck::allgather || K == ck::gather || K == ck::alltoall) {
        if (K == ck::gather && !is_root) return {};
        for (int r = 0; r < size_; ++r)
          std::memcpy(recv + static_cast<std::size_t>(r) * block, small_->small_data(r) + read_from, block);
      } else if constexpr (K == ck::scan || K == ck::exscan) {
        // The slots of ranks 0..r (exscan: 0..r-1) in rank order: the chain's bits.
        const int members = K == ck::scan ? rank_ + 1 : rank_;
        if (members == 0) return {};
        const reduction red = d.kernels ? d.kernels(d.type, d.op) : reduction{};
        small_->small_reduce(recv, 0, d.count, red, red.needs_divide ? members : 0, members);
      }
      return {};
    } else {
      (void)d, (void)h, (void)linkless, (void)until;
      return make_error(errc::unsupported, "shm-direct needs the shm transport");
    }
  }

  // The part of every small call that does not depend on its kind: the
  // group, the exchange of slots (direct.hpp small_exchange), the mismatch.
  status small_exchange(const std::uint8_t* send, std::size_t bytes, std::size_t read_from, std::size_t read_bytes,
                        const call_header* h, bool linkless, deadline until, bool eager) {
    if constexpr (has_direct) {
      CCLITE_TRY(ensure_small(until));
      static_assert(call_header::compact_bytes == group_t::small_tag_bytes, "small tag size");
      std::uint8_t tag[call_header::compact_bytes];
      if (h) h->encode_compact(tag);
      int odd = -1;
      status st = small_->small_exchange(send, bytes, read_from, read_bytes, until, h ? tag : nullptr, &odd,
                                         small_probe(h, linkless), eager);
      if (st.code() == errc::mismatch && odd >= 0 && h) return small_mismatch(odd);
      return st;
    } else {
      (void)send, (void)bytes, (void)read_from, (void)read_bytes, (void)h, (void)linkless, (void)until, (void)eager;
      return make_error(errc::unsupported, "shm-direct needs the shm transport");
    }
  }

  // What the small path's waits look at now and then: the link from the ring
  // predecessor, for the header of a peer that took the links instead
  // (`linkless`: this call sent none down them) or for its closing. One type
  // for every wait, so that settle() is compiled once.
  auto small_probe(const call_header* h, bool linkless) {
    return [this, h, linkless, prev = this->topo_.ring_prev(rank_)]() -> status {
      return h && linkless ? this->stray_on_link(prev, *h) : this->link_status(prev);
    };
  }

  // Whether this rank left its last small call early (an eager one, see
  // run_small_call) and has not yet checked that every rank made that call.
  bool small_unsettled() const {
    if constexpr (has_direct) return small_ && small_->unsettled();
    else return false;
  }
  // Checks it (direct_small.hpp, "Eager calls"): the next call of another
  // path does this first, so a mismatch in that call is never left unseen.
  status settle_small(deadline until) {
    if constexpr (has_direct) {
      int odd = -1;
      auto probe = small_probe(nullptr, false);  // an lvalue, as small_exchange passes it
      status st = small_->settle(until, &odd, probe);
      if (st.code() == errc::mismatch && odd >= 0) return small_mismatch(odd);
      return st;
    } else {
      (void)until;
      return {};
    }
  }

CCLITE_SETUP_CODE_BEGIN  // error messages: compiled for size (config.hpp)
  // The mismatch the small group found with member `odd`, both sides read
  // from the slots of the call compared.
  status small_mismatch(int odd) const {
    if constexpr (has_direct) {
      status m = mismatch_error(call_header::decode_compact(small_->small_tag_of(rank_)), rank_,
                                call_header::decode_compact(small_->small_tag_of(odd)),
                                peers_[static_cast<std::size_t>(odd)].rank);
      if (!small_->settle_failed()) return m;
      return status(errc::mismatch, m.message() + " (found at this rank's next call: it had left that call "
                                                  "without waiting, as the root of a small broadcast or scatter "
                                                  "and the other ranks of a small reduce or gather do)");
    } else {
      (void)odd;
      return {};
    }
  }
CCLITE_SETUP_CODE_END

  // Up to this size an in-place allreduce on a window takes the ordinary
  // path: the window's two all-rank synchronisations cost more than recursive
  // doubling's one exchange (2 ranks: 512 B 1.1 vs 0.95 us, 2 KiB 1.2 vs 1.4;
  // docs/performance.md, session 4). The same on every rank: sizes agree.
  static constexpr std::size_t window_min_bytes = 1024;

  // The window an allreduce runs on in place, or null: the same answer on
  // every rank that passes its window (the size is compared in the header,
  // and whether it is a window call too: call_header::window_flag).
  auto* window_call(const op_desc& d) const {
    const std::size_t bytes = d.count * size_of(d.type);
    if (d.kind != collective_kind::allreduce || d.send != d.recv || bytes <= window_min_bytes || windows_.empty())
      return static_cast<group_t*>(nullptr);
    return window_of(static_cast<const std::uint8_t*>(d.recv), bytes);
  }

  // The alloc_shared() window holding [p, p + bytes), or null.
  auto* window_of(const std::uint8_t* p, std::size_t bytes) const {
    for (const auto& w : windows_) {
      if constexpr (has_direct) {
        const std::uint8_t* base = w->window_data();
        if (p >= base && p <= base + w->capacity() && bytes <= static_cast<std::size_t>(base + w->capacity() - p))
          return w.get();
      }
    }
    return static_cast<group_t*>(nullptr);
  }

  // In place on a shared window: every rank passed the same offset in its own
  // copy of the window (checked in the group, with the call header).
  template <class W>
  status run_window_allreduce(W& w, std::uint8_t* data, std::size_t count, const reduction& red, deadline until) {
    if constexpr (has_direct) {
      std::uint8_t tag[call_header::wire_bytes];
      hdr_.out.encode(tag);
      int odd = -1;
      status st = w.allreduce_window(static_cast<std::size_t>(data - w.window_data()), count, red,
                                     red.needs_divide ? size_ : 0, until, hdr_.active ? tag : nullptr, sizeof tag, &odd,
                                     links_open());
      if (st.code() == errc::mismatch && odd >= 0) {
        const status m = mismatch_error(hdr_.expect, rank_, call_header::decode(w.tag_of(odd)),
                                        peers_[static_cast<std::size_t>(odd)].rank);
        return status(errc::mismatch, m.message() + " (or another range of the alloc_shared() window: every rank "
                                                    "must pass the same offset)");
      }
      return st;
    } else {
      (void)w, (void)data, (void)count, (void)red, (void)until;
      return make_error(errc::unsupported, "shared windows need the shm transport");
    }
  }

  // The probe of shm-direct's waits: a rank that failed (a mismatch it found,
  // an abort) closes its links and records why; the ring successor sees the
  // closed link here, within 10 ms, and reports that record, instead of
  // waiting out its deadline for a rank that is alive but gone elsewhere.
  auto links_open() {
    return [this, prev = this->topo_.ring_prev(rank_)]() -> status { return this->link_status(prev); };
  }

  // The wait policy of the node-wide groups (CCLITE_SHM_SPIN_US, as the shm links).
  static result<std::chrono::microseconds> spin_from_env() {
    auto spin = env::get_int("SHM_SPIN_US", 10, false);
    if (!spin) return spin.error();
    return std::chrono::microseconds(spin.value());
  }

  std::vector<std::unique_ptr<group_t>> windows_;  // alloc_shared()
  int windows_made_ = 0;  // names each window's segments (ids are never reused)
  std::unique_ptr<group_t> direct_;  // shm-direct allreduces (header page + 2 areas per member)
  std::unique_ptr<group_t> small_;   // small allreduces and barriers (header page only: nothing at rest)
  std::size_t direct_bytes_ = 1 << 20;  // CCLITE_SHM_DIRECT_BUFFSIZE
};

}  // namespace cclite::detail
