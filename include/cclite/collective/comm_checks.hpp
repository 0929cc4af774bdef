// cclite/collective/comm_checks.hpp - what keeps a communicator's ranks in
// the same call, and what a failure does to the others.
//
// Between comm_core (ranks, links, set-up; comm_core.hpp) and comm_algorithms
// in the private bases of communicator<...>:
//  - the call-header exchange with the ring neighbours that catches ranks
//    calling different collectives (mismatch.hpp), and the checks for paths
//    that skip the links (shm-direct's small allreduce);
//  - after a timeout, which rank never entered the call;
//  - spreading a fatal error: the job's first failure goes into the store
//    and every link is closed, so the other ranks report it at once instead
//    of waiting for their deadlines (README "Failure behaviour").
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <cclite/bootstrap/fault_record.hpp>
#include <cclite/collective/comm_core.hpp>
#include <cclite/collective/mismatch.hpp>

namespace cclite::detail {

/// How long a failing rank gives the store to take its record of the job's
/// first failure (or to hand over an earlier one) before it reports its own
/// error: a live store answers in milliseconds.
inline constexpr milliseconds fault_store_budget{3000};

template <class... Transports>
class comm_checks : public comm_core<Transports...> {
 protected:
  using base = comm_core<Transports...>;
  using base::base;
  using typename base::link;
  using base::rank_; using base::size_; using base::topo_; using base::peers_; using base::pool_; using base::kv_;
  using base::hdr_; using base::hdr_seen_; using base::with_links; using base::link_at;
  // (Inside the generic lambdas below members are named through this->: GCC 12
  // does not find the names these using-declarations bring in there.)

  // Starts the header exchange of collective `h` (mismatch.hpp): our header
  // goes to the ring successor now, whatever the algorithm; or, for a call
  // whose headers ride with its data (`riding`: headers_ride_with_data), only
  // ahead of the first byte we send on each link.
  status begin_checks(const call_header& h, bool riding, deadline until) {
    hdr_.out = hdr_.expect = h;
    hdr_.active = true;
    hdr_.knows_culprit = false;
    hdr_.riding = riding;
    if (riding) return {};  // (the overdue hook: set_overdue_hook, by the riding kinds' code)
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    return with_links(prev, next, 1, nullptr, until, [&](auto& pr) { return pr.send_header(); });
  }

  // Ends it: the ring predecessor's header must have come (an algorithm that
  // never read from it, e.g. the root of a broadcast, checks it here), and
  // whatever we queued on the ring successor is flushed. A riding call that
  // read nothing from the predecessor leaves without its header: a later
  // header from it shows whether it sent anything here (probe_unchecked).
  status end_checks(bool riding, deadline until) {
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    const bool unread = riding && hdr_seen_[static_cast<std::size_t>(prev)] != hdr_.expect.seq;
    status st = with_links(prev, next, 1, nullptr, until, [&](auto& pr) -> status {
      if (!unread) CCLITE_TRY(pr.check_prev());
      return pr.finish();
    });
    if (unread && st.ok()) {
      if (hdr_.unchecked_peer < 0) hdr_.unchecked_from = hdr_.expect.seq;  // else still watching earlier ones
      hdr_.unchecked = hdr_.expect;
      hdr_.unchecked_peer = prev;
    }
    hdr_.active = false;
    return st;
  }

  // The hook below, set by the code of the riding kinds only
  // (comm_dispatch::dispatch_kind), so that a program that never makes a
  // rooted call or a scan does not compile the store's part in it.
  void set_overdue_hook() {
    hdr_.overdue = &header_overdue;
    hdr_.overdue_ctx = this;
  }

  // header_state::overdue: in a riding call this rank has waited a while for
  // `peer`'s header. If the peer's call differs so that it waits for this
  // rank in turn (each passed itself as a gather's root, or each the other
  // as a broadcast's), neither sends and neither would see the other's
  // header before the deadline. So each posts its call's header in the store
  // (once per call, "callhdr/<rank>") and reads the one the peer posted: one
  // for this call's number that differs is the mismatch. A peer that is only
  // slow has posted nothing for this call, or the same header. Store trouble
  // is not an error here: the wait goes on as it would without the store.
  // (Independent communicators may share the store from several threads:
  // stores serve several threads at once, store.hpp.)
  static status header_overdue(void* self, int peer) {
    return static_cast<comm_checks*>(self)->compare_posted_headers(peer);
  }
CCLITE_SETUP_CODE_BEGIN  // off the fast path: compiled for size (config.hpp)
  status compare_posted_headers(int peer) {
    const deadline reply_by = deadline::after(milliseconds(1000));
    std::uint8_t b[call_header::wire_bytes];
    if (posted_seq_ != hdr_.expect.seq) {  // store values are opaque bytes: the wire form as it is
      hdr_.expect.encode(b);
      const std::string mine(reinterpret_cast<const char*>(b), sizeof b);
      if (!kv_->set_within("callhdr/" + std::to_string(rank_), mine, reply_by).ok()) return {};
      posted_seq_ = hdr_.expect.seq;
    }
    auto got = kv_->get_within("callhdr/" + std::to_string(peer), deadline::after(milliseconds(0)), reply_by);
    if (!got || got.value().size() != sizeof b) return {};
    std::memcpy(b, got.value().data(), sizeof b);
    const call_header theirs = call_header::decode(b);
    if (theirs.seq != hdr_.expect.seq || theirs == hdr_.expect) return {};
    const status m = mismatch_error(hdr_.expect, rank_, theirs, peer);
    return status(errc::mismatch, m.message() + " (seen through the store: each waited for the other's data)");
  }
CCLITE_SETUP_CODE_END

  // At the start of every call after a call left unchecked (end_checks):
  // bytes from that peer now either start a later call of its own, or are
  // what it sent in that call, which no rank there expected: a mismatch,
  // reported here rather than at the next read from the peer, which may be
  // many calls away (a root that broadcasts again and again). Never blocks;
  // until something has come, the watch goes on.
  status probe_unchecked() {
    const int prev = hdr_.unchecked_peer;
    if (prev < 0) return {};
    return std::visit([&](auto& l) -> status {
      if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) {
        return {};
      } else {
        (void)l.poll();  // a broken link is the business of the call that uses it
        const_bytes b = l.recv_peek();
        if (b.size < call_header::wire_bytes) return {};  // nothing yet, or a header split by the ring's wrap
        const call_header theirs = call_header::decode(b.data);
        if (!stray_of_unchecked(this->hdr_, theirs, prev)) return {};
        return unchecked_mismatch(this->hdr_, this->rank_, theirs, prev);
      }
    }, link_at(prev));
  }

  // Before a collective runs other communicators' calls over the same links
  // (the hierarchical algorithm's children): reads the ring predecessor's
  // header now, so it is not left in the stream ahead of the children's data.
  status settle_checks(deadline until) {
    if (!hdr_.active || size_ < 2) return {};
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    return with_links(prev, next, 1, nullptr, until, [&](auto& pr) -> status {
      CCLITE_TRY(pr.check_prev());
      return pr.finish();
    });
  }

  // Before a set-up that waits for every rank through the store (shm-direct's
  // first use) or connects links: makes sure every rank is in this same call
  // and alive. Check the ring predecessor's header, then pass a token around
  // the ring n-1 times; a rank that found a mismatch, or a lost neighbour,
  // passes none and closes its links, so no rank waits out its deadline for
  // store keys or a connection of a rank that called something else or is
  // gone. (With the mismatch check off, the token still goes round.)
  status agree_on_call(deadline until) {
    if (size_ < 2) return {};
    const int prev = topo_.ring_prev(rank_), next = topo_.ring_next(rank_);
    return with_links(prev, next, 1, nullptr, until, [&](auto& pr) -> status {
      if (hdr_.active) {  // a call whose headers ride with its data has not sent its own yet
        CCLITE_TRY(pr.send_header());
        CCLITE_TRY(pr.check_prev());
      }
      std::uint8_t token[max_dtype_size] = {};
      for (int lap = 0; lap < size_ - 1; ++lap) {
        CCLITE_TRY(pr.send(token, sizeof token));
        CCLITE_TRY(pr.recv(token, sizeof token));
      }
      return pr.finish();
    });
  }

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  // Where a collective connects links on first use (ensure_links). A rank
  // that waits to connect to a rank that is gone, or that already failed and
  // will never connect, would wait out its deadline: a connect sees neither.
  enum connect_site : int { site_rd, site_rhd, site_tree, site_tree_rooted, site_rooted_direct, site_alltoall,
                            site_chain, site_scan_rd };

  // The first time a site runs (with a given root; -1: none), every rank
  // first passes agree_on_call's token around the ring, whose links do see a
  // lost or failed rank (README "Failure behaviour"). All ranks run the same
  // site with the same root in the same call, so "first time" agrees on
  // every rank, and later calls pay nothing.
  status agree_before_connecting(connect_site site, int root, deadline until) {
    const int key = static_cast<int>(site) * (size_ + 1) + root + 1;
    for (int k : agreed_sites_)
      if (k == key) return {};
    CCLITE_TRY(agree_on_call(until));
    agreed_sites_.push_back(key);
    return {};
  }

  // After a timeout: if the ring predecessor's header has not arrived, that
  // rank never entered this collective, the most useful thing to report. If
  // it has arrived, check it (a mismatch explains the hang too). Never blocks.
  // Not for a call whose headers ride with its data: there the predecessor
  // may owe this rank nothing, and the wait's own error names the peer it
  // waited for.
  status explain_timeout(status st) {
    if (!hdr_.active || size_ < 2 || hdr_.riding) return st;
    const int prev = topo_.ring_prev(rank_);
    if (hdr_seen_[static_cast<std::size_t>(prev)] == hdr_.expect.seq) return st;
    const std::string who = peers_[static_cast<std::size_t>(prev)].describe();
    const char* kind = to_string(static_cast<collective_kind>(hdr_.expect.kind));
    return std::visit([&](auto& l) -> status {
      if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) {
        return st;
      } else {
        (void)l.poll();
        const_bytes b = l.recv_peek();
        if (b.size >= call_header::wire_bytes) {
          const call_header theirs = call_header::decode(b.data);
          if (theirs != this->hdr_.expect) return mismatch_error(this->hdr_.expect, this->rank_, theirs, prev);
          return st;  // it is in this collective, stuck on something else
        }
        if (b.size != 0) return st;  // a header split by the ring's wrap: say nothing more
        this->hdr_.knows_culprit = true;
        return make_error(errc::timeout, "%s did not call %s #%llu (its call header never came; it is "
                          "still alive but busy elsewhere or waiting in another call): %s", who.c_str(), kind,
                          static_cast<unsigned long long>(this->hdr_.expect.seq), st.message().c_str());
      }
    }, link_at(prev));
  }

  // What the link to `peer` says without blocking: ok, or why it is unusable
  // (closed by the peer, corrupt).
  status link_status(int peer) {
    return std::visit([&](auto& l) -> status {
      if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) return {};
      else return l.poll();
    }, link_at(peer));
  }

  // A call that skipped the links (shm-direct's small allreduce, header
  // `mine`) while `peer` sent something down its link: the peer called
  // something else. A link the peer closed is its error (it failed and
  // recorded why: the caller's error path reports that). Never blocks; ok
  // while the link is empty.
  status stray_on_link(int peer, const call_header& mine) {
    return std::visit([&](auto& l) -> status {
      if constexpr (std::is_same_v<std::decay_t<decltype(l)>, std::monostate>) {
        return {};
      } else {
        CCLITE_TRY(l.poll());
        const_bytes b = l.recv_peek();
        if (b.size == 0) return {};
        call_header theirs;
        if (b.size >= call_header::wire_bytes) theirs = call_header::decode(b.data);
        else theirs.magic = 0;  // not a whole header: "something else"
        status m = mismatch_error(mine, this->rank_, theirs, peer);
        if (theirs != mine) return m;
        return status(errc::mismatch, m.message() + " (the same call, but it took the links where this rank took "
                      "shm-direct's small path: CCLITE_ALGO and CCLITE_SHM_SMALL_MAX must agree on every rank)");
      }
    }, link_at(peer));
  }

  // A fatal error on this rank (`st`, already prefixed with `call`): makes
  // every rank report the job's first failure rather than its own echo of it.
  // The first rank to fail records its error in the store; later ones (ranks
  // whose link to a failed rank broke, after that rank recorded) report the
  // record. Then every link is closed, so ranks blocked on this one wake up at
  // once (peer_lost) and read the record too, instead of waiting for their
  // deadline. Store calls are bounded by a few seconds (fault_store_budget):
  // the store's host may have gone with the failure (a host lost), and every
  // rank woken by the closed links would wait on it in turn. If the store
  // does not answer in time, or cannot be reached, `st` stands, and says so:
  // a rank woken by a closed tcp link names the neighbour that closed it,
  // which may only have echoed another rank's failure, and a store hosted by
  // that other rank (rank 0, under a launcher) refusing connections points
  // to it ("... (rank 0 gone?): Connection refused").
  status spread_failure(status st, const std::string& call) {
    if (fault_spread_) return st;
    fault_spread_ = true;
    std::string trouble;  // why the store could not tell
    const std::string rec = pool_->store_silent.load() ? std::string() : exchange_fault_record(st, trouble);
    close_links(st);
    pool_->fail(st);  // the parent and siblings sharing these links report it
    if (pool_->set) pool_->set->stop_listening();  // and peers waiting to connect to us
    if (rec.empty()) {
      // Once per message: a child's failure inside its parent's, or a peer's
      // closing reason, may carry the note already.
      static constexpr const char* note = "which the job's store could not tell: ";
      if (trouble.empty() || st.code() == errc::aborted || st.message().find(note) != std::string::npos) return st;
      return status(st.code(), st.message() + " (possibly an echo of another rank's failure, " + note + trouble + ")");
    }
    const status first = decode_fault_record(rec);
    if (first.ok()) return st;
    if (st.code() == errc::aborted) return st;  // our own abort() stays "aborted" here
    return status(first.code(), call + ": the job's first failure: " + first.message());
  }

  // Records `st` as the job's first failure if no rank has yet; returns an
  // earlier rank's record, or "" (this rank's own recorded, or no answer:
  // then `trouble` says what the store answered, if it failed).
  std::string exchange_fault_record(const status& st, std::string& trouble) {
    // A plain timeout blames whatever this rank waited on, often a victim of
    // the real culprit: give a rank that knows better a moment to record it.
    const bool weak = st.code() == errc::timeout && !hdr_.knows_culprit;
    const auto wait_ms = milliseconds(weak ? 2000 : 0);
    const deadline reply_by = deadline::after(wait_ms + fault_store_budget);
    auto found = kv_->get_within(fault_record_key, deadline::after(wait_ms), reply_by);
    if (found) return found.value();
    if (reply_by.expired()) {  // no answer: the store's host may be gone
      pool_->store_silent.store(true);
      trouble = found.error().message();
      return {};
    }
    if (found.error().code() != errc::timeout) {  // not "no record yet": refused, closed, ...
      pool_->store_silent.store(true);  // nor will it answer the family's other communicators
      trouble = found.error().message();
      return {};
    }
    auto n = kv_->add_within("fault/n", 1, reply_by);
    if (!n) {
      trouble = n.error().message();
      return {};
    }
    if (n.value() == 1) {
      errc c = st.code() == errc::aborted ? errc::peer_lost : st.code();
      std::string msg = st.code() == errc::aborted
                            ? peers_[static_cast<std::size_t>(rank_)].describe() + " aborted its communicator: " +
                                  st.message()
                            : st.message();
      (void)kv_->set_within(fault_record_key, encode_fault_record(c, msg), reply_by);
      return {};
    }
    // Another rank counted first: its record follows within moments.
    const auto record_ms = milliseconds(5000);
    auto got = kv_->get_within(fault_record_key, deadline::after(record_ms),
                               deadline::after(record_ms + fault_store_budget));
    return got ? got.value() : std::string();
  }

  // Closes this communicator's links (its members' entries of the pool).
  // Links that can carry a reason (shm: close_because) carry `why`, so a
  // rank woken by the closed link names the failure itself even when no
  // store holds the record (its host went with the failure).
  void close_links(const status& why) {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      std::visit([&](auto& l) {
        if constexpr (can_close_because<std::decay_t<decltype(l)>>::value) l.close_because(why.message());
      }, link_at(r));
      link_at(r) = link{};
    }
  }

  template <class L, class = void>
  struct can_close_because : std::false_type {};
  template <class L>
  struct can_close_because<L, std::void_t<decltype(std::declval<L&>().close_because(std::string()))>>
      : std::true_type {};

CCLITE_SETUP_CODE_END

  bool fault_spread_ = false;  // spread_failure() ran: once per communicator
  std::uint64_t posted_seq_ = ~std::uint64_t{0};  // the call whose header this rank posted (header_overdue)
  std::vector<int> agreed_sites_;  // agree_before_connecting()'s sites and roots so far
};

}  // namespace cclite::detail
