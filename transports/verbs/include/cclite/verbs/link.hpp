// cclite/verbs/link.hpp - a connected verbs link to one peer: RC QPs, a registered
// send ring and a registered receive FIFO the peer writes into.
//
// Data path (flow.hpp has the arithmetic):
//   send_reserve / send_commit   write into the local send ring (registered)
//   poll()                       posts RDMA WRITE WITH IMMEDIATE from the send
//                                ring to the same offset of the peer's FIFO, as
//                                far as the peer's credits allow; drains the CQ;
//                                returns credits (the consumed count) to the peer
//   recv_peek / recv_consume     read straight out of the FIFO (zero copy)
//   wait()                       polls the CQ for CCLITE_IB_SPIN_US, then arms
//                                the CQ and sleeps on the completion channel in
//                                slices of at most 50 ms, checking the deadline,
//                                the abort flag and the device's async events
//
// Like the tcp link, every poll()/wait() moves both directions, so ranks that
// all send before they receive cannot deadlock, and the FIFO capacity is a
// multiple of 4096 so an element-aligned stream never sees a split element.
//
// Errors (sticky): a failed work completion is peer_lost naming the peer and
// ibv_wc_status_str (retry exceeded = the peer or the path is gone); a QP or
// device async event likewise; invalid_argument for commit/consume beyond the
// reserved/peeked space. wait() adds timeout and aborted (not sticky).
//
// Closing: a link that is destroyed while healthy first writes imm_close to
// the peer (flow.hpp) and waits up to 50 ms for it to be acknowledged. The
// peer then fails (peer_lost) any wait that can no longer be satisfied - for
// receive space or data when nothing is left to read - as the tcp link does
// at end of stream. This is how a rank that failed wakes the ranks blocked on
// it (comm_core's spread_failure closes every link, with close_because(): the
// close carries the failure, so the peer's peer_lost names it even where no
// store holds the job's record, as the shm link's does).
//
// A dead peer (kill -9): RDMA says nothing until a write towards it fails,
// after the QP's retries (4.096 us x 2^CCLITE_IB_TIMEOUT x (CCLITE_IB_RETRY_CNT
// + 1): 34 s with the defaults, as NCCL's net_ib). So that a rank waiting for
// data from a peer that died with nothing in flight towards it does not wait
// for its deadline (CCLITE_TIMEOUT), a wait that sleeps re-sends the current
// credit once a second (probe(): a write the peer's NIC must acknowledge,
// harmless to a live peer), TCP keepalive's idea.
//
// The set-up members (create, establish, close) are defined in link_setup.hpp;
// posting, completions, async events and the wait loop in link_progress.hpp.
// Both are included at the end of this header.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/transport/concept.hpp>
#include <cclite/verbs/config.hpp>
#include <cclite/verbs/device.hpp>
#include <cclite/verbs/flow.hpp>
#include <cclite/verbs/qp.hpp>
#include <cclite/verbs/qp_attr.hpp>

namespace cclite::verbs {

/// A connected byte stream to one peer over RDMA (models cclite::is_link_v).
/// Movable, not copyable. Built by verbs::transport::connect() in two steps:
/// create() (QPs in INIT, receives posted, local record to publish), then
/// establish() with the peer's record.
class link {
 public:
  /// Creates `cfg.qps` QPs, the CQ and completion channel, and registers the
  /// two rings of cfg.buffsize bytes. `record` gets what the peer needs.
  /// Errors: resource_exhausted, system_error.
  static result<link> create(std::shared_ptr<device> dev, int peer, std::string peer_desc,
                             const ib_config& cfg, const std::atomic<bool>* aborted, qp_record& record);

  /// Moves every QP to RTS towards the peer's `remote` record. Errors:
  /// invalid_argument (the two ranks' CCLITE_IB_* settings differ),
  /// system_error (a transition failed).
  status establish(const qp_record& remote, const ib_config& cfg);

  link(link&&) noexcept = default;
  link& operator=(link&& o) noexcept {
    if (this != &o) {
      close();
      peer_ = o.peer_;
      desc_ = std::move(o.desc_);
      aborted_ = o.aborted_;
      s_ = std::move(o.s_);
      error_ = std::move(o.error_);
    }
    return *this;
  }
  link(const link&) = delete;
  link& operator=(const link&) = delete;
  ~link() { close(); }

  /// Closes the link because this rank failed with `reason`: the peer's
  /// peer_lost says "<this rank> failed and closed its verbs link: <reason>"
  /// (cut to fit close_reason_bytes). Otherwise as the destructor's close.
  void close_because(const std::string& reason) noexcept;

  // ---- send side -----------------------------------------------------------

  /// Contiguous free space in the send ring, at most `max` bytes (may be empty).
  mutable_bytes send_reserve(std::size_t max) noexcept {
    const detail::link_state& s = *s_;
    std::uint64_t free = s.st.cap - (s.committed - s.completed);
    std::uint64_t off = s.st.offset(s.committed);
    std::uint64_t n = std::min<std::uint64_t>({free, s.st.cap - off, max});
    return {s.send_ring.data() + off, static_cast<std::size_t>(n)};
  }

  /// Publishes n bytes written into the last reservation; they leave on the
  /// next poll()/wait().
  void send_commit(std::size_t n) noexcept {
    detail::link_state& s = *s_;
    if (s.committed + n - s.completed > s.st.cap) {
      fail(make_error(errc::invalid_argument, "send_commit(%zu) beyond the reserved space (verbs link to %s)",
                      n, desc_.c_str()));
      return;
    }
    s.committed += n;
  }

  // ---- recv side -----------------------------------------------------------

  /// Contiguous received bytes of the FIFO (may be empty).
  const_bytes recv_peek() const noexcept {
    const detail::link_state& s = *s_;
    std::uint64_t off = s.st.offset(s.consumed);
    std::uint64_t n = std::min<std::uint64_t>(s.received - s.consumed, s.st.cap - off);
    return {s.fifo.data() + off, static_cast<std::size_t>(n)};
  }

  /// Releases n peeked bytes; the credit goes back to the peer on the next poll.
  void recv_consume(std::size_t n) noexcept {
    detail::link_state& s = *s_;
    if (s.consumed + n > s.received) {
      fail(make_error(errc::invalid_argument, "recv_consume(%zu) beyond the received bytes (verbs link to %s)",
                      n, desc_.c_str()));
      return;
    }
    s.consumed += n;
  }

  // ---- progress ------------------------------------------------------------

  /// Drains the CQ, posts writes the credits allow, returns credits. Never
  /// blocks. Errors: peer_lost (failed completion, async event), sticky.
  status poll() {
    if (!error_.ok()) return error_;
    drain_cq();
    if (error_.ok()) post_writes();
    if (error_.ok()) post_credit();
    return error_;
  }

  /// Progress until `w` may be satisfied; see the file comment. Errors:
  /// timeout, aborted, peer_lost (also when the peer closed the link and what
  /// `w` needs can therefore never come).
  status wait(wait_for w, deadline until) {
    bool want_recv = has(w, wait_for::recv), want_send = has(w, wait_for::send);
    return progress_until(until, w, [&] {
      if ((want_recv && !recv_peek().empty()) || (want_send && !send_reserve(1).empty())) return true;
      if (s_->peer_closed && (want_send || recv_peek().empty())) {
        // Completions of other QPs may still hold the peer's last bytes.
        drain_cq();
        if (want_recv && !recv_peek().empty()) return true;
        if (!s_->peer_reason.empty()) {
          fail(status(errc::peer_lost, desc_ + " failed and closed its verbs link: " + s_->peer_reason));
          return false;
        }
        fail(make_error(errc::peer_lost,
                        "verbs link to %s closed by the peer (its communicator failed or was destroyed; "
                        "received %llu bytes, %llu of ours not yet acknowledged)",
                        desc_.c_str(), (unsigned long long)s_->received,
                        (unsigned long long)(s_->committed - s_->completed)));
      }
      return false;
    });
  }

  /// Returns once every committed byte is in the peer's FIFO (acknowledged).
  status flush(deadline until) {
    return progress_until(until, wait_for::send, [&] { return s_->completed == s_->committed; });
  }

  int peer() const noexcept { return peer_; }
  const char* kind() const noexcept { return "verbs"; }
  std::size_t capacity() const noexcept { return static_cast<std::size_t>(s_->st.cap); }
  int qps() const noexcept { return s_->st.nqps; }

 private:
  link() = default;

  // ---- set-up and closing (link_setup.hpp) ---------------------------------

  void close() noexcept { close_because(std::string()); }

  // ---- posting, completions, waiting (link_progress.hpp) -------------------

  status post_recv(int q);
  void probe();
  bool post_write(int q, std::uint64_t pos, std::uint64_t len, std::uint32_t imm, wr_kind kind);
  void post_writes();
  void post_credit();
  void drain_cq();
  void complete(const ibv_wc& wc);
  void check_async();
  template <class Done>
  status progress_until(deadline until, wait_for w, Done done);
  status timeout_error(wait_for w) const;

  const status& fail(status st) {
    if (error_.ok()) error_ = std::move(st);
    return error_;
  }

  int peer_ = -1;
  std::string desc_;
  const std::atomic<bool>* aborted_ = nullptr;
  std::unique_ptr<detail::link_state> s_;
  status error_;
};

static_assert(is_link_v<link>, "verbs::link must model the link concept");

}  // namespace cclite::verbs

// The member definitions (each includes this header: either may come first).
#include <cclite/verbs/link_progress.hpp>
#include <cclite/verbs/link_setup.hpp>
