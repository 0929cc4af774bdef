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
// it (comm_core's spread_failure closes every link).
//
// A dead peer (kill -9): RDMA says nothing until a write towards it fails,
// after the QP's retries (4.096 us x 2^CCLITE_IB_TIMEOUT x (CCLITE_IB_RETRY_CNT
// + 1): 34 s with the defaults, as NCCL's net_ib). So that a rank waiting for
// data from a peer that died with nothing in flight towards it does not wait
// for its deadline (CCLITE_TIMEOUT), a wait that sleeps re-sends the current
// credit once a second (probe(): a write the peer's NIC must acknowledge,
// harmless to a live peer), TCP keepalive's idea.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/transport/concept.hpp>
#include <cclite/verbs/flow.hpp>
#include <cclite/verbs/qp.hpp>

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
                             const ib_config& cfg, const std::atomic<bool>* aborted, qp_record& record) {
    link l;
    l.peer_ = peer;
    l.desc_ = std::move(peer_desc);
    l.aborted_ = aborted;
    l.s_.reset(new detail::link_state());
    detail::link_state& s = *l.s_;
    s.dev = std::move(dev);
    s.st = stripe{cfg.buffsize, std::min(cfg.block, cfg.buffsize), cfg.qps};
    s.spin_us = cfg.spin_us;
    ibv_context* ctx = s.dev->context();
    auto sr = registered_memory::make(s.dev->pd(), cfg.buffsize, IBV_ACCESS_LOCAL_WRITE, "send ring");
    if (!sr) return sr.error();
    s.send_ring = std::move(sr.value());
    auto fi = registered_memory::make(s.dev->pd(), cfg.buffsize,
                                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "receive FIFO");
    if (!fi) return fi.error();
    s.fifo = std::move(fi.value());
    s.ch = ::ibv_create_comp_channel(ctx);
    if (!s.ch) return make_error(errc::resource_exhausted, "ibv_create_comp_channel failed: %s", std::strerror(errno));
    int fl = ::fcntl(s.ch->fd, F_GETFL);
    if (fl >= 0) ::fcntl(s.ch->fd, F_SETFL, fl | O_NONBLOCK);  // drained without blocking
    s.cq = ::ibv_create_cq(ctx, cfg.qps * (sq_depth + rq_depth) + 16, nullptr, s.ch, 0);
    if (!s.cq) return make_error(errc::resource_exhausted, "ibv_create_cq failed: %s", std::strerror(errno));
    // A fresh PSN per connection, so stray packets of an earlier job's QP with
    // a reused number are rejected by sequence.
    s.psn = static_cast<std::uint32_t>(clock::now().time_since_epoch().count() ^ (::getpid() << 8)) & 0xffffff;
    record = qp_record{};
    record.nqps = cfg.qps;
    for (int q = 0; q < cfg.qps; ++q) {
      auto qp = create_rc_qp(*s.dev, s.cq);
      if (!qp) return qp.error();
      s.qps[q] = qp.value();
      record.qpn[q] = s.qps[q]->qp_num;
      s.spos[q] = s.cpos[q] = s.rpos[q] = s.st.first(q);
      // Receives first: the peer may write as soon as its QP is in RTS.
      for (int i = 0; i < rq_depth; ++i) CCLITE_TRY(l.post_recv(q));
    }
    const port_info& p = s.dev->port();
    record.psn = s.psn;
    record.lid = p.lid;
    std::memcpy(record.gid, p.gid_raw, 16);
    record.mtu = p.mtu;
    record.fifo_addr = reinterpret_cast<std::uintptr_t>(s.fifo.data());
    record.rkey = s.fifo.rkey();
    record.cap = cfg.buffsize;
    record.block = s.st.block;
    return {std::move(l)};  // nvcc: no implicit move into result<T> (CWG1579)
  }

  /// Moves every QP to RTS towards the peer's `remote` record. Errors:
  /// invalid_argument (the two ranks' CCLITE_IB_* settings differ),
  /// system_error (a transition failed).
  status establish(const qp_record& remote, const ib_config& cfg) {
    detail::link_state& s = *s_;
    if (remote.nqps != s.st.nqps || remote.cap != s.st.cap || remote.block != s.st.block) {
      return make_error(errc::invalid_argument,
                        "verbs settings differ between this rank and %s: qps %d/%d, buffsize %llu/%llu, "
                        "block %llu/%llu; set CCLITE_IB_QPS_PER_CONNECTION, CCLITE_IB_BUFFSIZE and "
                        "CCLITE_IB_BLOCK alike on every rank",
                        desc_.c_str(), s.st.nqps, remote.nqps, (unsigned long long)s.st.cap,
                        (unsigned long long)remote.cap, (unsigned long long)s.st.block,
                        (unsigned long long)remote.block);
    }
    for (int q = 0; q < s.st.nqps; ++q)
      CCLITE_TRY(connect_rc_qp(s.qps[q], *s.dev, s.psn, remote, remote.qpn[q], cfg, desc_));
    s.raddr = remote.fifo_addr;
    s.rkey = remote.rkey;
    return {};
  }

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

  status post_recv(int q) {
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = make_wr_id(wr_kind::recv, q, 0);
    wr.num_sge = 0;  // write-with-immediate lands by address; the WR only carries the immediate
    int rc = ::ibv_post_recv(s_->qps[q], &wr, &bad);
    if (rc != 0) {
      return fail(make_error(errc::system_error, "ibv_post_recv on the verbs link to %s failed: %s",
                             desc_.c_str(), std::strerror(rc)));
    }
    return {};
  }

  // Tells a connected peer that this link is going away (imm_close) and waits
  // up to 50 ms for the write to be acknowledged, so that it is not lost with
  // the QP. Skipped when the link failed (its QPs may be in the error state)
  // or the peer closed first (it is not listening any more).
  void close() noexcept {
    if (!s_ || !error_.ok() || s_->raddr == 0) return;
    detail::link_state& s = *s_;
    drain_cq();
    if (!error_.ok() || s.peer_closed || s.sq_out[0] >= sq_depth) return;
    if (!post_write(0, 0, 0, imm_close, wr_kind::close)) return;
    s.close_sent = true;
    const auto end = clock::now() + std::chrono::milliseconds(50);
    while (s.close_sent && error_.ok() && clock::now() < end) {
      ::sched_yield();
      drain_cq();
    }
  }

  // Keepalive (file comment): the current credit again, at most once a
  // second, when no credit is in flight. The peer's unwrap_credit() of an
  // unchanged count changes nothing.
  void probe() {
    detail::link_state& s = *s_;
    const auto now = clock::now();
    if (now - s.last_probe < std::chrono::seconds(1) || s.credit_inflight || s.sq_out[0] >= sq_depth ||
        s.raddr == 0)
      return;
    s.last_probe = now;
    if (!post_write(0, 0, 0, encode_credit_imm(s.consumed), wr_kind::credit)) return;
    s.credited = s.consumed;
    s.credit_inflight = true;
  }

  // One RDMA WRITE WITH IMMEDIATE; len 0 = credit return or close (no payload).
  bool post_write(int q, std::uint64_t pos, std::uint64_t len, std::uint32_t imm, wr_kind kind) {
    detail::link_state& s = *s_;
    ibv_sge sge{};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = make_wr_id(kind, q, len);
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = s.raddr + s.st.offset(pos);
    wr.wr.rdma.rkey = s.rkey;
    if (len) {
      sge.addr = reinterpret_cast<std::uintptr_t>(s.send_ring.data() + s.st.offset(pos));
      sge.length = static_cast<std::uint32_t>(len);
      sge.lkey = s.send_ring.lkey();
      wr.sg_list = &sge;
      wr.num_sge = 1;
    }
    int rc = ::ibv_post_send(s.qps[q], &wr, &bad);
    if (rc != 0) {
      fail(make_error(errc::system_error, "ibv_post_send on the verbs link to %s failed: %s", desc_.c_str(),
                      std::strerror(rc)));
      return false;
    }
    ++s.sq_out[q];
    return true;
  }

  void post_writes() {
    detail::link_state& s = *s_;
    std::uint64_t limit = send_limit(s.committed, s.remote_consumed, s.st.cap);
    for (int q = 0; q < s.st.nqps; ++q) {
      const int room = sq_depth - (q == 0 ? 1 : 0);  // QP 0 keeps a slot for credits
      while (s.sq_out[q] < room) {
        std::uint64_t len = s.st.next_write(s.spos[q], limit);
        if (len == 0) break;
        if (!post_write(q, s.spos[q], len, encode_data_imm(len), wr_kind::data)) return;
        s.spos[q] = s.st.advance(s.spos[q], len);
      }
    }
  }

  void post_credit() {
    detail::link_state& s = *s_;
    // One credit message in flight at a time: it coalesces consumption and
    // bounds the receive requests credits take at the peer.
    if (s.credit_inflight || s.consumed == s.credited || s.sq_out[0] >= sq_depth) return;
    if (!post_write(0, 0, 0, encode_credit_imm(s.consumed), wr_kind::credit)) return;
    s.credited = s.consumed;
    s.credit_inflight = true;
  }

  void drain_cq() {
    detail::link_state& s = *s_;
    ibv_wc wc[32];
    for (;;) {
      int n = ::ibv_poll_cq(s.cq, 32, wc);
      if (n < 0) {
        fail(make_error(errc::system_error, "ibv_poll_cq on the verbs link to %s failed", desc_.c_str()));
        return;
      }
      for (int i = 0; i < n; ++i) complete(wc[i]);
      if (n < 32 || !error_.ok()) break;
    }
    s.received = s.st.prefix(s.rpos, ~std::uint64_t(0));
    s.completed = s.st.prefix(s.cpos, s.committed);
  }

  void complete(const ibv_wc& wc) {
    detail::link_state& s = *s_;
    const int q = wr_id_qp(wc.wr_id);
    const wr_kind k = wr_id_kind(wc.wr_id);
    if (wc.status != IBV_WC_SUCCESS) {
      const char* what = k == wr_kind::recv ? "receive" : k == wr_kind::credit ? "credit write" : "rdma write";
      fail(make_error(errc::peer_lost,
                      "verbs link to %s failed: %s (work completion status %d, vendor error 0x%x) on qp %d "
                      "of %d (%s); the peer exited or the path between the hosts is down",
                      desc_.c_str(), ::ibv_wc_status_str(wc.status), static_cast<int>(wc.status), wc.vendor_err,
                      q, s.st.nqps, what));
      return;
    }
    if (q < 0 || q >= s.st.nqps) return;
    switch (k) {
      case wr_kind::recv: {
        std::uint32_t imm = ntohl(wc.imm_data);
        if (imm == imm_close) {
          s.peer_closed = true;
        } else if (is_credit_imm(imm)) {
          s.remote_consumed = unwrap_credit(s.remote_consumed, imm);
        } else {
          s.rpos[q] = s.st.advance(s.rpos[q], imm & imm_value_mask);
        }
        (void)post_recv(q);
        break;
      }
      case wr_kind::data:
        --s.sq_out[q];
        s.cpos[q] = s.st.advance(s.cpos[q], wr_id_len(wc.wr_id));
        break;
      case wr_kind::credit:
        --s.sq_out[q];
        s.credit_inflight = false;
        break;
      case wr_kind::close:
        --s.sq_out[q];
        s.close_sent = false;
        break;
    }
  }

  // Async events: a device-wide failure or a fatal event on one of our QPs.
  void check_async() {
    std::string what = s_->dev->async_failure(s_->qps, s_->st.nqps);
    if (!what.empty()) fail(status(errc::peer_lost, "verbs link to " + desc_ + " failed: " + what));
  }

  template <class Done>
  status progress_until(deadline until, wait_for w, Done done) {
    detail::link_state& s = *s_;
    const auto spin_end = clock::now() + std::chrono::microseconds(s.spin_us);
    for (;;) {  // bounded spin: most waits end within a round trip
      CCLITE_TRY(poll());
      if (done()) return {};
      if (clock::now() >= spin_end) break;
    }
    for (;;) {
      // Arm, then look again: a completion that arrived before arming raises no event.
      if (::ibv_req_notify_cq(s.cq, 0) != 0) {
        return fail(make_error(errc::system_error, "ibv_req_notify_cq on the verbs link to %s failed",
                               desc_.c_str()));
      }
      CCLITE_TRY(poll());
      if (done()) return {};
      check_async();
      if (!error_.ok()) return error_;
      if (aborted_ && aborted_->load(std::memory_order_relaxed)) {
        return make_error(errc::aborted, "communicator aborted while waiting for %s over verbs", desc_.c_str());
      }
      if (until.expired()) return until.is_slice() ? status(errc::timeout, std::string()) : timeout_error(w);
      probe();
      pollfd fds[2] = {{s.ch->fd, POLLIN, 0}, {s.dev->context()->async_fd, POLLIN, 0}};
      ::poll(fds, 2, static_cast<int>(until.remaining(milliseconds(50)).count()));
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      if (::ibv_get_cq_event(s.ch, &ev_cq, &ev_ctx) == 0) ::ibv_ack_cq_events(ev_cq, 1);
    }
  }

  status timeout_error(wait_for w) const {
    const detail::link_state& s = *s_;
    if (w == wait_for::send) {
      return make_error(errc::timeout,
                        "timed out waiting for %s to take data over verbs (%llu bytes committed, %llu "
                        "acknowledged, peer consumed %llu)",
                        desc_.c_str(), (unsigned long long)s.committed, (unsigned long long)s.completed,
                        (unsigned long long)s.remote_consumed);
    }
    return make_error(errc::timeout,
                      "timed out waiting for data from %s over verbs (%llu bytes received so far, %llu of "
                      "ours not yet acknowledged)",
                      desc_.c_str(), (unsigned long long)s.received,
                      (unsigned long long)(s.committed - s.completed));
  }

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
