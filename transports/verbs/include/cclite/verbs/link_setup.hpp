// cclite/verbs/link_setup.hpp - how a verbs link is made and closed: create()
// (the CQ and completion channel, the two registered rings, the QPs in INIT
// with their receives posted, the record the peer needs), establish() (every
// QP to RTR and RTS towards the peer's record) and close() (imm_close before
// the QPs go).
//
// Definitions of verbs::link's set-up members; their documentation is with
// the declarations in link.hpp, which includes this header at its end
// (including this one first works too). The QP calls themselves are qp.hpp's.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/verbs/config.hpp>
#include <cclite/verbs/device.hpp>
#include <cclite/verbs/flow.hpp>
#include <cclite/verbs/link.hpp>
#include <cclite/verbs/qp.hpp>
#include <cclite/verbs/qp_attr.hpp>

namespace cclite::verbs {

inline result<link> link::create(std::shared_ptr<device> dev, int peer, std::string peer_desc,
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
  // Both rings end in close_reason_bytes outside the stream (flow.hpp).
  auto sr = registered_memory::make(s.dev->pd(), cfg.buffsize + close_reason_bytes, IBV_ACCESS_LOCAL_WRITE,
                                    "send ring");
  if (!sr) return sr.error();
  s.send_ring = std::move(sr.value());
  auto fi = registered_memory::make(s.dev->pd(), cfg.buffsize + close_reason_bytes,
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

inline status link::establish(const qp_record& remote, const ib_config& cfg) {
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

// Tells a connected peer that this link is going away (imm_close, carrying
// `reason` into the peer's reason area) and waits up to 50 ms for the write
// to be acknowledged, so that it is not lost with the QP. Skipped when the
// link failed (its QPs may be in the error state) or the peer closed first
// (it is not listening any more).
inline void link::close_because(const std::string& reason) noexcept {
  if (!s_ || !error_.ok() || s_->raddr == 0) return;
  detail::link_state& s = *s_;
  drain_cq();
  if (!error_.ok() || s.peer_closed || s.closed || s.sq_out[0] >= sq_depth) return;
  s.closed = true;  // a second close would overwrite the reason with ""
  char* r = reinterpret_cast<char*>(s.send_ring.data() + s.st.cap);
  const std::size_t room = close_reason_bytes - 1, n = std::min(reason.size(), room);
  std::memcpy(r, reason.data(), n);
  if (reason.size() > room) std::memcpy(r + room - 3, "...", 3);
  r[n] = '\0';
  if (!post_write(0, 0, n + 1, imm_close, wr_kind::close)) return;
  s.close_sent = true;
  const auto end = clock::now() + std::chrono::milliseconds(50);
  while (s.close_sent && error_.ok() && clock::now() < end) {
    ::sched_yield();
    drain_cq();
  }
}

}  // namespace cclite::verbs
