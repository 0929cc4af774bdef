// cclite/verbs/transport.hpp - the InfiniBand / RoCE transport (RDMA verbs).
//
//   enabled()        false when CCLITE_IB_DISABLE / NCCL_IB_DISABLE is set.
//   publish()        discovers the devices (device.hpp), picks one active port
//                    (CCLITE_IB_HCA, NUMA node, local rank), opens it, and sets
//                    store key "verbs/<rank>" to its fabric_record (qp_attr.hpp):
//                    the port's link layer and subnet, or why this rank has no
//                    usable port. No device is not an error.
//   can_connect()    reads the peer's record once (cached) and says yes only
//                    when both ranks have a usable port on the same fabric
//                    (same link layer; same subnet prefix on InfiniBand).
//                    Otherwise no, with one INFO line saying why, and the
//                    communicator uses the next transport of its list (tcp).
//                    Both ranks compare the same two records, so they agree.
//   connect(p, t)    both ranks: create the QPs (INIT, receives posted) and the
//                    registered rings, publish "verbs/<lo>-<hi>/<rank>" (QP
//                    numbers, PSN, LID, GID, MTU, FIFO address and rkey), read
//                    the peer's, move the QPs to RTR and RTS, then exchange
//                    "ready" so neither side writes before the other's QPs
//                    can receive.
//   registrations()  the registration cache for user buffers (reg_cache.hpp)
//                    on this rank's protection domain, for zero-copy paths;
//                    the data path does not use it yet (it copies through the
//                    registered rings).
//
// Before opening the device, publish() calls ibv_fork_init() once per process
// (fork.hpp; CCLITE_IB_FORK_SAFE=0 skips it, a failure is a WARN line). With
// no usable port it calls neither.
//
// Environment: config.hpp. Memory: 2 x CCLITE_IB_BUFFSIZE registered per peer,
// plus at most CCLITE_IB_REG_CACHE_MAX_MB of user buffers held by the cache.
// Thread safety: one thread at a time per transport and per link.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cclite/bootstrap/store.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/transport/concept.hpp>
#include <cclite/verbs/config.hpp>
#include <cclite/verbs/device.hpp>
#include <cclite/verbs/fork.hpp>
#include <cclite/verbs/hca.hpp>
#include <cclite/verbs/link.hpp>
#include <cclite/verbs/qp_attr.hpp>
#include <cclite/verbs/reg_cache.hpp>

namespace cclite::verbs {

/// The verbs transport (models cclite::is_transport_v). See the file comment.
class transport {
 public:
  using link_type = verbs::link;
  using user_reg_cache = reg_cache<ibv_registrar>;
  static constexpr const char* name = "verbs";

  /// False when CCLITE_IB_DISABLE=1 (or NCCL_IB_DISABLE=1). Errors:
  /// invalid_argument (not a boolean).
  static result<bool> enabled() {
    auto off = ib_config::disabled();
    if (!off) return off.error();
    return !off.value();
  }

  /// Cheap; no I/O. `ctx` must outlive the transport.
  explicit transport(const transport_context& ctx) : ctx_(ctx) {
    if (!ctx_.log) own_log_ = std::make_unique<logger>(ctx_.rank);
  }

  /// Discovers the ports and publishes this rank's fabric record. Errors:
  /// invalid_argument (bad CCLITE_IB_* value), and the store's.
  status publish() {
    if (!ctx_.kv) return make_error(errc::invalid_argument, "verbs::transport needs a store (ctx.kv is null)");
    auto cfg = ib_config::from_env();
    if (!cfg) return publish_failure(cfg.error());
    cfg_ = cfg.value();
    auto filter = parse_hca_list(cfg_.hca);
    if (!filter) return publish_failure(filter.error());
    auto found = discover(cfg_, filter.value());
    if (!found) return publish_failure(found.error());
    self_ = fabric_record{};
    int at = pick_port(found->ports, current_numa_node(), local_index());
    if (at < 0) {
      self_.reason = found->reason;
    } else {
      const port_info& p = found->ports[static_cast<std::size_t>(at)];
      // Before anything is registered (libibverbs requires it), once per process.
      const fork_init_outcome& forked = ensure_fork_init(cfg_.fork_safe);
      if (!forked.warning.empty()) CCLITE_WARN(log(), "%s", forked.warning.c_str());
      reg_cache_.reset();
      auto dev = device::open(p);
      if (!dev) {
        self_.reason = dev.error().message();
      } else {
        dev_ = std::move(dev.value());
        reg_cache_ = std::make_unique<user_reg_cache>(ibv_registrar(dev_->pd()),
                                                      reg_cache_limits::from_config(cfg_));
        self_.usable = true;
        self_.device = p.device;
        self_.port = p.port;
        self_.layer = p.layer;
        self_.subnet_prefix = p.subnet_prefix;
        CCLITE_INFO(log(), "verbs: using %s (gid: %s; CCLITE_IB_HCA: %s); %d qp(s) per peer, buffers 2 x %zu, "
                    "block %zu", p.describe().c_str(), p.gid.reason.c_str(), filter->describe().c_str(), cfg_.qps,
                    cfg_.buffsize, cfg_.block);
      }
    }
    if (!self_.usable) {
      CCLITE_INFO(log(), "verbs: no usable RDMA port: %s; peers are reached by the next transport",
                  self_.reason.c_str());
    }
    published_ = true;
    return ctx_.kv->set(key(ctx_.rank), self_.serialize());
  }

  /// True when both ranks published a usable port on the same fabric; reads
  /// the peer's record from the store (waits at most CCLITE_TIMEOUT for it).
  bool can_connect(const peer_info& self, const peer_info& peer) const {
    if (self.rank == peer.rank || !published_ || peer.rank < 0 || peer.rank >= ctx_.size) return false;
    if (verdict_.empty()) verdict_.assign(static_cast<std::size_t>(ctx_.size), -1);
    signed char& v = verdict_[static_cast<std::size_t>(peer.rank)];
    if (v >= 0) return v == 1;
    std::string why;
    bool ok = false;
    if (!self_.usable) {
      why = "this rank has no usable RDMA port (" + self_.reason + ")";  // no need to ask the store
    } else {
      auto t = env::timeout();
      auto rec = ctx_.kv->get(key(peer.rank), t ? deadline::after(t.value()) : deadline::after(milliseconds(60000)));
      auto parsed = rec ? fabric_record::parse(rec.value()) : result<fabric_record>(rec.error());
      if (!parsed) why = "cannot read the peer's verbs record: " + parsed.error().message();
      else ok = fabric_compatible(self_, parsed.value(), why);
    }
    v = ok ? 1 : 0;
    // Without a port of our own, publish() already said why, once.
    if (!ok && self_.usable) CCLITE_INFO(log(), "verbs: not used for %s: %s", peer.describe().c_str(), why.c_str());
    return ok;
  }

  /// Connects to `peer` (both ranks of the pair call it). Errors:
  /// invalid_argument (before publish(), not a verbs peer, settings differ
  /// between the ranks), timeout (the peer never published its QPs), aborted,
  /// resource_exhausted / system_error (verbs resources, QP transitions).
  result<link> connect(int peer, deadline until) {
    if (!published_ || !dev_) {
      return make_error(errc::invalid_argument, "verbs::transport::connect(%d) without a usable port "
                        "(publish() not called, or can_connect() was false)", peer);
    }
    if (peer < 0 || peer >= ctx_.size || peer == ctx_.rank) {
      return make_error(errc::invalid_argument, "verbs::transport::connect(%d): not a peer of rank %d of %d",
                        peer, ctx_.rank, ctx_.size);
    }
    if (ctx_.is_aborted()) {
      return make_error(errc::aborted, "communicator aborted before connecting to %s over verbs",
                        describe(peer).c_str());
    }
    qp_record mine;
    auto l = link::create(dev_, peer, describe(peer), cfg_, ctx_.aborted, mine);
    if (!l) return status(l.error().code(), "connecting to " + describe(peer) + " over verbs: " + l.error().message());
    const std::string base = pair_key(peer);
    CCLITE_TRY(ctx_.kv->set(base + std::to_string(ctx_.rank), mine.serialize()));
    auto text = get_watched(base + std::to_string(peer), until);
    if (!text) {
      return status(text.error().code(), "waiting for the verbs queue pairs of " + describe(peer) + ": " +
                                             text.error().message());
    }
    auto theirs = qp_record::parse(text.value());
    if (!theirs) return theirs.error();
    CCLITE_TRY(l->establish(theirs.value(), cfg_));
    CCLITE_TRY(ctx_.kv->set(base + std::to_string(ctx_.rank) + "/ready", "1"));
    auto ready = get_watched(base + std::to_string(peer) + "/ready", until);
    if (!ready) {
      return status(ready.error().code(), "waiting for " + describe(peer) + " to make its verbs queue pairs "
                                              "ready: " + ready.error().message());
    }
    CCLITE_TRACE(log(), "verbs: connected to %s with %d qp(s)", describe(peer).c_str(), cfg_.qps);
    return std::move(l.value());
  }

  /// A key of the peer's in the store, waited for in 200 ms slices: a peer
  /// lost or failed never writes it, and RDMA gives no sign of either before
  /// a queue pair exists, so between slices the wait looks for the job's
  /// recorded failure (the ranks that saw the loss record it) and the abort
  /// flag.
  result<std::string> get_watched(const std::string& k, deadline until) {
    store_wait_watch w;
    w.check = [](void* ctx) -> status {
      const auto& c = *static_cast<const transport_context*>(ctx);
      if (c.is_aborted()) return make_error(errc::aborted, "communicator aborted");
      return c.recorded_failure();
    };
    w.arg = &ctx_;
    return store_get_watched(*ctx_.kv, k, until, w);
  }

  /// This rank's published record (tests, logs). Valid after publish().
  const fabric_record& self_record() const noexcept { return self_; }
  const ib_config& config() const noexcept { return cfg_; }
  /// The registration cache for user buffers on this rank's protection
  /// domain; nullptr without a usable port (before publish(), or no device).
  /// Nothing in the data path uses it yet.
  user_reg_cache* registrations() noexcept { return reg_cache_.get(); }

 private:
  static std::string key(int rank) { return "verbs/" + std::to_string(rank); }
  // Peers wait for our record in can_connect(): leave one that says no, so a
  // bad setting here fails this rank at once instead of stalling the others.
  status publish_failure(status err) {
    fabric_record r;
    r.reason = "its verbs set-up failed: " + err.message();
    (void)ctx_.kv->set(key(ctx_.rank), r.serialize());
    return err;
  }
  std::string pair_key(int peer) const {
    int lo = std::min(peer, ctx_.rank), hi = std::max(peer, ctx_.rank);
    return "verbs/" + std::to_string(lo) + "-" + std::to_string(hi) + "/";
  }
  const logger& log() const { return ctx_.log ? *ctx_.log : *own_log_; }
  std::string describe(int r) const {
    if (ctx_.peers && r >= 0 && static_cast<std::size_t>(r) < ctx_.peers->size()) {
      const peer_info& p = ctx_.peer(r);
      if (p.rank == r) return p.describe();
    }
    return "rank " + std::to_string(r);
  }
  // Position of this rank among the ranks of its node (spreads ranks over NICs).
  int local_index() const {
    if (!ctx_.peers || static_cast<std::size_t>(ctx_.rank) >= ctx_.peers->size()) return 0;
    const std::string& me = ctx_.self().host_id;
    int i = 0;
    for (int r = 0; r < ctx_.rank; ++r)
      if (ctx_.peer(r).host_id == me) ++i;
    return i;
  }

  transport_context ctx_;
  std::unique_ptr<logger> own_log_;
  ib_config cfg_;
  fabric_record self_;
  bool published_ = false;
  std::shared_ptr<device> dev_;
  std::unique_ptr<user_reg_cache> reg_cache_;  // after dev_: destroyed first, while the PD lives
  mutable std::vector<signed char> verdict_;  // per peer: -1 unknown, 0 no, 1 yes
};

static_assert(is_transport_v<transport>, "verbs::transport must model the transport concept");

}  // namespace cclite::verbs
