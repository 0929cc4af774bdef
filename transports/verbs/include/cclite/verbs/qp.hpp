// cclite/verbs/qp.hpp - reliable-connected queue pairs: creation, the
// RESET -> INIT -> RTR -> RTS transitions, registered memory, and the bundle of
// verbs resources one link owns (detail::link_state).
//
// The attribute masks are the ones the InfiniBand specification (and
// ibv_modify_qp(3)) requires for an RC QP at each step; nothing optional is
// set, so a device that rejects a transition tells us about a real mismatch
// (wrong GID index, MTU, port) rather than an unsupported extra.
//
//   INIT  STATE | PKEY_INDEX | PORT | ACCESS_FLAGS   (remote write allowed: the
//         peer writes into our FIFO)
//   RTR   STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC |
//         MIN_RNR_TIMER   (AV: LID on InfiniBand, GRH with the peer's GID on RoCE)
//   RTS   STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC
//
// rnr_retry is 7 (retry forever): a receiver that is busy computing has not
// reposted its receive requests yet, which is normal, not a failure; a dead
// peer is found by the transport retry count instead (CCLITE_IB_TIMEOUT,
// CCLITE_IB_RETRY_CNT: about 4.3 s x 8 with the defaults).
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <cclite/core/status.hpp>
#include <cclite/verbs/config.hpp>
#include <cclite/verbs/device.hpp>
#include <cclite/verbs/flow.hpp>
#include <cclite/verbs/qp_attr.hpp>

namespace cclite::verbs {

/// Work requests per QP: send queue (data writes + one credit) and receive queue.
inline constexpr int sq_depth = 64;
inline constexpr int rq_depth = 256;

/// Page-aligned memory registered with one protection domain. Movable.
class registered_memory {
 public:
  registered_memory() = default;
  registered_memory(registered_memory&& o) noexcept { swap(o); }
  registered_memory& operator=(registered_memory&& o) noexcept {
    registered_memory t(std::move(o));
    swap(t);
    return *this;
  }
  registered_memory(const registered_memory&) = delete;
  registered_memory& operator=(const registered_memory&) = delete;
  ~registered_memory() {
    if (mr_) ::ibv_dereg_mr(mr_);
    std::free(mem_);
  }

  /// Allocates, zeroes (touches every page once, here) and registers `bytes`.
  /// Errors: resource_exhausted (allocation, or the pinned-memory limit:
  /// `ulimit -l`), naming `what`.
  static result<registered_memory> make(ibv_pd* pd, std::size_t bytes, int access, const char* what) {
    registered_memory m;
    if (::posix_memalign(&m.mem_, 4096, bytes) != 0) {
      return make_error(errc::resource_exhausted, "cannot allocate %zu bytes for the verbs %s", bytes, what);
    }
    std::memset(m.mem_, 0, bytes);
    m.size_ = bytes;
    m.mr_ = ::ibv_reg_mr(pd, m.mem_, bytes, access);
    if (!m.mr_) {
      int e = errno;
      return make_error(errc::resource_exhausted,
                        "ibv_reg_mr of %zu bytes for the verbs %s failed: %s (the locked-memory limit "
                        "'ulimit -l' must allow it; lower CCLITE_IB_BUFFSIZE or raise the limit)",
                        bytes, what, std::strerror(e));
    }
    return {std::move(m)};  // nvcc: no implicit move into result<T> (CWG1579)
  }

  std::uint8_t* data() const noexcept { return static_cast<std::uint8_t*>(mem_); }
  std::size_t size() const noexcept { return size_; }
  std::uint32_t lkey() const noexcept { return mr_ ? mr_->lkey : 0; }
  std::uint32_t rkey() const noexcept { return mr_ ? mr_->rkey : 0; }

 private:
  void swap(registered_memory& o) noexcept {
    std::swap(mem_, o.mem_);
    std::swap(size_, o.size_);
    std::swap(mr_, o.mr_);
  }
  void* mem_ = nullptr;
  std::size_t size_ = 0;
  ibv_mr* mr_ = nullptr;
};

/// Creates an RC QP on `cq` and moves it to INIT. Errors: resource_exhausted.
inline result<ibv_qp*> create_rc_qp(const device& dev, ibv_cq* cq) {
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = sq_depth;
  ia.cap.max_recv_wr = rq_depth;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.sq_sig_all = 0;
  ibv_qp* qp = ::ibv_create_qp(dev.pd(), &ia);
  if (!qp) {
    return make_error(errc::resource_exhausted, "ibv_create_qp on %s failed: %s", dev.port().device.c_str(),
                      std::strerror(errno));
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<std::uint8_t>(dev.port().port);
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  int rc = ::ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) {
    ::ibv_destroy_qp(qp);
    return make_error(errc::system_error, "ibv_modify_qp(INIT) on %s port %d failed: %s",
                      dev.port().device.c_str(), dev.port().port, std::strerror(rc));
  }
  return qp;
}

/// INIT -> RTR -> RTS towards the remote QP number `remote_qpn` described by
/// `remote`. `peer_desc` names the peer in errors. Errors: system_error with
/// the step and a hint (GID index, MTU, fabric).
inline status connect_rc_qp(ibv_qp* qp, const device& dev, std::uint32_t local_psn, const qp_record& remote,
                            std::uint32_t remote_qpn, const ib_config& cfg, const std::string& peer_desc) {
  const port_info& port = dev.port();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(remote.mtu < port.mtu ? remote.mtu : port.mtu);
  a.dest_qp_num = remote_qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;  // 0.64 ms before an RNR retry
  a.ah_attr.port_num = static_cast<std::uint8_t>(port.port);
  a.ah_attr.sl = static_cast<std::uint8_t>(cfg.sl);
  if (port.layer == link_layer::ethernet || remote.lid == 0) {
    // RoCE (and routed IB): addressed by GID through the global route header.
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(port.gid.index);
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = static_cast<std::uint8_t>(cfg.tc);
  } else {
    a.ah_attr.dlid = static_cast<std::uint16_t>(remote.lid);
  }
  int rc = ::ibv_modify_qp(qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) {
    return make_error(errc::system_error,
                      "ibv_modify_qp(RTR) towards %s failed: %s (local %s:%d gid index %d, peer lid %u, "
                      "mtu %d/%d); check that both hosts are on the same fabric and CCLITE_IB_GID_INDEX",
                      peer_desc.c_str(), std::strerror(rc), port.device.c_str(), port.port, port.gid.index,
                      remote.lid, port.mtu, remote.mtu);
  }
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.timeout = static_cast<std::uint8_t>(cfg.timeout);
  s.retry_cnt = static_cast<std::uint8_t>(cfg.retry_cnt);
  s.rnr_retry = 7;
  s.sq_psn = local_psn;
  s.max_rd_atomic = 1;
  rc = ::ibv_modify_qp(qp, &s,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) {
    return make_error(errc::system_error, "ibv_modify_qp(RTS) towards %s failed: %s", peer_desc.c_str(),
                      std::strerror(rc));
  }
  return {};
}

namespace detail {
// Every verbs resource of a link, released in the order verbs requires (QPs,
// CQ, channel, MRs). Heap-held so the link moves as one pointer.
struct link_state {
  std::shared_ptr<device> dev;
  ibv_comp_channel* ch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qps[max_qps] = {};
  registered_memory send_ring, fifo;
  stripe st;
  std::uint32_t psn = 0;
  std::uint64_t raddr = 0;
  std::uint32_t rkey = 0;
  int spin_us = 20;
  // Send direction (stream positions).
  std::uint64_t committed = 0, completed = 0, remote_consumed = 0;
  std::uint64_t spos[max_qps] = {}, cpos[max_qps] = {};
  int sq_out[max_qps] = {};
  // Receive direction.
  std::uint64_t rpos[max_qps] = {};
  std::uint64_t received = 0, consumed = 0, credited = 0;
  bool credit_inflight = false;
  bool peer_closed = false;  // the peer's imm_close arrived (flow.hpp)
  std::string peer_reason;   // what it wrote with it ("" if nothing)
  bool close_sent = false;   // ours is posted; its completion clears it
  bool closed = false;       // ours went (close_because() runs once)
  std::chrono::steady_clock::time_point last_probe{};  // link_progress.hpp: probe()

  ~link_state() {
    for (ibv_qp*& q : qps)
      if (q) ::ibv_destroy_qp(q);
    if (cq) ::ibv_destroy_cq(cq);
    if (ch) ::ibv_destroy_comp_channel(ch);
  }
};
}  // namespace detail

}  // namespace cclite::verbs
