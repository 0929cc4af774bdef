// cclite/verbs/link_progress.hpp - what moves a verbs link: posting (the
// receives, the data writes the credits allow, credit returns, the keepalive
// probe), draining the CQ (each completion advances a stream position or
// fails the link), async events, and the wait loop (bounded spin, then the
// armed CQ's completion channel).
//
// Definitions of verbs::link's private data-path members, declared in
// link.hpp, which includes this header at its end (including this one first
// works too). The arithmetic (striping, credits, immediates, wr_id) is
// flow.hpp's.
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/transport/concept.hpp>
#include <cclite/verbs/flow.hpp>
#include <cclite/verbs/link.hpp>
#include <cclite/verbs/qp.hpp>

namespace cclite::verbs {

inline status link::post_recv(int q) {
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

// Keepalive (link.hpp's file comment): the current credit again, at most
// once a second, when no credit is in flight. The peer's unwrap_credit() of
// an unchanged count changes nothing.
inline void link::probe() {
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

// One RDMA WRITE WITH IMMEDIATE; len 0 = credit return (no payload). A
// close writes its reason from and to the area past the rings' ends.
inline bool link::post_write(int q, std::uint64_t pos, std::uint64_t len, std::uint32_t imm, wr_kind kind) {
  detail::link_state& s = *s_;
  const std::uint64_t off = kind == wr_kind::close ? s.st.cap : s.st.offset(pos);
  ibv_sge sge{};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = make_wr_id(kind, q, len);
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = s.raddr + off;
  wr.wr.rdma.rkey = s.rkey;
  if (len) {
    sge.addr = reinterpret_cast<std::uintptr_t>(s.send_ring.data() + off);
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

inline void link::post_writes() {
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

inline void link::post_credit() {
  detail::link_state& s = *s_;
  // One credit message in flight at a time: it coalesces consumption and
  // bounds the receive requests credits take at the peer.
  if (s.credit_inflight || s.consumed == s.credited || s.sq_out[0] >= sq_depth) return;
  if (!post_write(0, 0, 0, encode_credit_imm(s.consumed), wr_kind::credit)) return;
  s.credited = s.consumed;
  s.credit_inflight = true;
}

inline void link::drain_cq() {
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

inline void link::complete(const ibv_wc& wc) {
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
        const char* r = reinterpret_cast<const char*>(s.fifo.data() + s.st.cap);
        s.peer_reason.assign(r, ::strnlen(r, close_reason_bytes - 1));
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
inline void link::check_async() {
  std::string what = s_->dev->async_failure(s_->qps, s_->st.nqps);
  if (!what.empty()) fail(status(errc::peer_lost, "verbs link to " + desc_ + " failed: " + what));
}

template <class Done>
inline status link::progress_until(deadline until, wait_for w, Done done) {
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

inline status link::timeout_error(wait_for w) const {
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

}  // namespace cclite::verbs
