// cclite/verbs/device.hpp - RDMA device discovery and the opened device a transport uses.
//
//   discover(cfg, filter)   every port of every device CCLITE_IB_HCA keeps:
//                           state, link layer, speed, MTU, LID, the chosen GID.
//                           No device (no kernel driver, no NIC, a container
//                           without /dev/infiniband) is not an error: an empty
//                           list and a reason for the INFO line.
//   pick_port(ports, ...)   one active port for this process: those on the
//                           process's NUMA node first, then spread over local
//                           ranks (local index modulo count), as NCCL spreads
//                           ranks over NICs.
//   device                  the opened context + protection domain, shared by
//                           the transport and its links (shared_ptr: links may
//                           outlive the transport object); drains async events.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cclite/core/status.hpp>
#include <cclite/verbs/config.hpp>
#include <cclite/verbs/gid.hpp>
#include <cclite/verbs/hca.hpp>
#include <cclite/verbs/qp_attr.hpp>

namespace cclite::verbs {

/// One port of one device, as discovered.
struct port_info {
  std::string device;  ///< "mlx5_0"
  int port = 1;
  bool active = false;  ///< IBV_PORT_ACTIVE
  link_layer layer = link_layer::infiniband;
  double gbps = 0;
  int mtu = 0;  ///< ibv_mtu of active_mtu
  std::uint32_t lid = 0;
  std::uint64_t subnet_prefix = 0;
  gid_choice gid;  ///< index and why; meaningless unless gid_ok
  bool gid_ok = false;
  std::string gid_error;
  std::uint8_t gid_raw[16] = {};
  int numa_node = -1;  ///< from sysfs, -1 unknown

  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s:%d %s %s, %.0f Gb/s, mtu %d, gid %d %s", device.c_str(), port,
                  to_string(layer), active ? "active" : "down", gbps, 128 << mtu, gid.index,
                  gid_to_string(gid_raw).c_str());
    return buf;
  }
};

/// Result of discover(): the ports kept, and why none is usable when empty.
struct discovery {
  std::vector<port_info> ports;
  int devices = 0;       ///< devices ibv_get_device_list returned
  std::string reason;    ///< set when no active port was found
};

namespace detail {
inline int sysfs_int(const std::string& path, int def) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return def;
  int v = def;
  if (std::fscanf(f, "%d", &v) != 1) v = def;
  std::fclose(f);
  return v;
}
}  // namespace detail

/// NUMA node of the CPU this thread runs on (-1 unknown).
inline int current_numa_node() {
  int cpu = ::sched_getcpu();
  if (cpu < 0) return -1;
  for (int n = 0; n < 1024; ++n) {
    std::string p = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/node" + std::to_string(n);
    if (::access(p.c_str(), F_OK) == 0) return n;
    if (n > 64 && ::access("/sys/devices/system/node", F_OK) != 0) break;
  }
  return -1;
}

/// Lists the ports `filter` keeps. Never fails for "no RDMA here": that is an
/// empty `ports` and a `reason`. Errors: invalid_argument from the GID choice
/// when CCLITE_IB_GID_INDEX names an empty entry of an active port.
inline result<discovery> discover(const ib_config& cfg, const hca_filter& filter) {
  discovery out;
  int n = 0;
  errno = 0;
  ibv_device** list = ::ibv_get_device_list(&n);
  if (!list) {
    // ENOSYS: libibverbs found no kernel RDMA support (/sys/class/infiniband_verbs).
    int e = errno ? errno : ENODEV;
    out.reason = e == ENOSYS ? std::string("no RDMA device (no kernel RDMA support on this host: "
                                           "ibv_get_device_list returned ENOSYS)")
                             : std::string("ibv_get_device_list failed: ") + std::strerror(e) +
                                   " (is an RDMA driver loaded? 'ibv_devices' lists the devices)";
    return out;
  }
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> guard(list, ::ibv_free_device_list);
  out.devices = n;
  int kept = 0, seen = 0;
  for (int d = 0; d < n; ++d) {
    std::string name = ::ibv_get_device_name(list[d]);
    ibv_context* ctx = ::ibv_open_device(list[d]);
    if (!ctx) continue;
    std::unique_ptr<ibv_context, int (*)(ibv_context*)> ctx_guard(ctx, ::ibv_close_device);
    ibv_device_attr da{};
    if (::ibv_query_device(ctx, &da) != 0) continue;
    int numa = detail::sysfs_int("/sys/class/infiniband/" + name + "/device/numa_node", -1);
    for (int p = 1; p <= da.phys_port_cnt; ++p) {
      ++seen;
      if (!filter.matches(name, p)) continue;
      ibv_port_attr pa{};
      if (::ibv_query_port(ctx, static_cast<std::uint8_t>(p), &pa) != 0) continue;
      ++kept;
      port_info pi;
      pi.device = name;
      pi.port = p;
      pi.active = pa.state == IBV_PORT_ACTIVE;
      pi.layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? link_layer::ethernet : link_layer::infiniband;
      pi.gbps = port_gbps(pa.active_width, pa.active_speed);
      pi.mtu = static_cast<int>(pa.active_mtu);
      pi.lid = pa.lid;
      pi.numa_node = numa;
      std::vector<gid_entry> table;
      for (int i = 0; i < pa.gid_tbl_len; ++i) {
        ibv_gid_entry ge{};
        if (::ibv_query_gid_ex(ctx, static_cast<std::uint32_t>(p), static_cast<std::uint32_t>(i), &ge, 0) != 0)
          continue;  // ENODATA: empty entry
        gid_entry e;
        e.index = i;
        std::memcpy(e.raw, ge.gid.raw, 16);
        e.kind = ge.gid_type == IBV_GID_TYPE_ROCE_V2   ? gid_kind::roce_v2
                 : ge.gid_type == IBV_GID_TYPE_ROCE_V1 ? gid_kind::roce_v1
                                                       : gid_kind::ib;
        table.push_back(e);
        if (i == 0) {
          for (int b = 0; b < 8; ++b) pi.subnet_prefix = pi.subnet_prefix << 8 | e.raw[b];
        }
      }
      auto g = select_gid(table, pi.layer == link_layer::ethernet, cfg.gid_index);
      if (g) {
        pi.gid = g.value();
        pi.gid_ok = true;
        for (const auto& e : table)
          if (e.index == pi.gid.index) std::memcpy(pi.gid_raw, e.raw, 16);
      } else {
        if (pi.active && g.error().code() == errc::invalid_argument) return g.error();
        pi.gid_error = g.error().message();
      }
      out.ports.push_back(std::move(pi));
    }
  }
  bool any_active = false;
  for (const auto& p : out.ports) any_active = any_active || (p.active && p.gid_ok);
  if (any_active) return out;
  if (n == 0) {
    out.reason = "no RDMA device (ibv_get_device_list found none)";
  } else if (kept == 0) {
    out.reason = std::to_string(n) + " device(s), " + std::to_string(seen) +
                 " port(s), none kept by CCLITE_IB_HCA (" + filter.describe() + ")";
  } else {
    out.reason = std::to_string(kept) + " port(s) kept, none active with a usable GID";
    for (const auto& p : out.ports)
      if (p.active && !p.gid_ok) out.reason += " (" + p.device + ":" + std::to_string(p.port) + ": " + p.gid_error + ")";
  }
  return out;
}

/// Index into `ports` of the port this process uses, -1 when none is active.
/// Active ports with a usable GID on `numa_node` are preferred when there are
/// any; among the candidates, local rank `local_index` takes number
/// local_index % count, so the ranks of a node spread over its NICs.
inline int pick_port(const std::vector<port_info>& ports, int numa_node, int local_index) {
  std::vector<int> near, all;
  for (int i = 0; i < static_cast<int>(ports.size()); ++i) {
    const port_info& p = ports[static_cast<std::size_t>(i)];
    if (!p.active || !p.gid_ok) continue;
    all.push_back(i);
    if (numa_node >= 0 && p.numa_node == numa_node) near.push_back(i);
  }
  const std::vector<int>& from = near.empty() ? all : near;
  if (from.empty()) return -1;
  if (local_index < 0) local_index = 0;
  return from[static_cast<std::size_t>(local_index) % from.size()];
}

/// The opened device a transport and its links share: context, protection
/// domain, and the asynchronous events reported so far.
class device {
 public:
  /// Opens `name` and allocates a protection domain. Errors: unsupported
  /// (device gone), system_error (PD allocation).
  static result<std::shared_ptr<device>> open(const port_info& port) {
    int n = 0;
    ibv_device** list = ::ibv_get_device_list(&n);
    if (!list) return make_error(errc::unsupported, "ibv_get_device_list failed: %s", std::strerror(errno));
    std::unique_ptr<ibv_device*, void (*)(ibv_device**)> guard(list, ::ibv_free_device_list);
    ibv_context* ctx = nullptr;
    for (int d = 0; d < n && !ctx; ++d)
      if (port.device == ::ibv_get_device_name(list[d])) ctx = ::ibv_open_device(list[d]);
    if (!ctx) return make_error(errc::unsupported, "RDMA device %s cannot be opened", port.device.c_str());
    std::shared_ptr<device> dev(new device());
    dev->ctx_ = ctx;
    dev->port_ = port;
    dev->pd_ = ::ibv_alloc_pd(ctx);
    if (!dev->pd_) {
      return make_error(errc::system_error, "ibv_alloc_pd on %s failed: %s", port.device.c_str(),
                        std::strerror(errno));
    }
    // Non-blocking, so links can drain events while they poll.
    int fl = ::fcntl(ctx->async_fd, F_GETFL);
    if (fl >= 0) ::fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
    return dev;
  }

  ~device() {
    if (pd_) ::ibv_dealloc_pd(pd_);
    if (ctx_) ::ibv_close_device(ctx_);
  }
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  ibv_context* context() const noexcept { return ctx_; }
  ibv_pd* pd() const noexcept { return pd_; }
  const port_info& port() const noexcept { return port_; }

  /// Reads pending async events. A device or port failure is remembered for
  /// every link; a QP's fatal event is returned through qp_failed().
  void drain_async() {
    ibv_async_event ev;
    while (::ibv_get_async_event(ctx_, &ev) == 0) {
      switch (ev.event_type) {
        case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
          if (failed_qps_.size() < 4096)
            failed_qps_.push_back({ev.element.qp->qp_num, ::ibv_event_type_str(ev.event_type)});
          break;
        case IBV_EVENT_DEVICE_FATAL: case IBV_EVENT_PORT_ERR: case IBV_EVENT_CQ_ERR:
          if (fatal_.empty()) fatal_ = ::ibv_event_type_str(ev.event_type);
          break;
        default: break;  // PORT_ACTIVE, LID_CHANGE, ...: informational
      }
      ::ibv_ack_async_event(&ev);
    }
  }
  /// Name of a device-wide failure event ("local catastrophic error"), or "".
  const std::string& fatal() const noexcept { return fatal_; }
  /// Drains the events; "" when neither the device nor one of `qps[0..n)`
  /// failed, else what happened ("device mlx5_0 reported 'local catastrophic error'").
  std::string async_failure(ibv_qp* const* qps, int n) {
    drain_async();
    if (!fatal_.empty()) return "device " + port_.device + " reported '" + fatal_ + "'";
    for (int q = 0; q < n; ++q) {
      if (const char* what = qps[q] ? qp_failed(qps[q]->qp_num) : nullptr)
        return "qp " + std::to_string(q) + " of " + std::to_string(n) + " reported '" + what + "'";
    }
    return {};
  }
  /// The async event reported for QP `qpn`, or nullptr.
  const char* qp_failed(std::uint32_t qpn) const noexcept {
    for (const auto& f : failed_qps_)
      if (f.qpn == qpn) return f.what;
    return nullptr;
  }

 private:
  device() = default;
  struct qp_event {
    std::uint32_t qpn;
    const char* what;
  };
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  port_info port_;
  std::string fatal_;
  std::vector<qp_event> failed_qps_;
};

}  // namespace cclite::verbs
