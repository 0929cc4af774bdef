// cclite/shm/transport.hpp - the shared-memory transport between ranks of one node.
//
// What it is for: `cclite::shm::transport` models the transport concept
// (transport/concept.hpp) for peers on the same host (same peer_info::host_id).
// Each connected pair of ranks shares one POSIX shm segment holding two
// single-producer single-consumer FIFOs (lo->hi, hi->lo) of CCLITE_SHM_BUFFSIZE
// bytes each: memory use is 2 x buffsize (+4 KiB) per connected pair.
//
// publish() stores this rank's pid namespace ("shm/pidns/<rank>"): a peer's pid
// is watched for liveness only when both ranks share one.
//
// connect(peer, until), both ranks of the pair (lo < hi):
//   lo: shm_open("/cclite-<job_tag>-<lo>-<hi>", O_EXCL), size, fallocate, mmap
//       (MAP_POPULATE); store.set("shm/<lo>-<hi>", name); wait for "shm/<lo>-<hi>/ok";
//       shm_unlink (ENOENT ignored).
//   hi: store.get("shm/<lo>-<hi>"); shm_open + mmap (MAP_POPULATE); shm_unlink at
//       once; check the header; store.set("shm/<lo>-<hi>/ok", "ok").
// After connect no name is left in /dev/shm, so a crash later leaves nothing
// behind. While waiting on the store, each side checks every 100 ms that the
// peer process still exists (errc::peer_lost), the abort flag and the
// deadline; on any error the creator unlinks its name, and the opener unlinks
// the name a creator that died mid-connect would have left.
//
// Environment:
//   CCLITE_SHM_DISABLE=1 (or NCCL_SHM_DISABLE=1)  enabled() is false
//   CCLITE_SHM_BUFFSIZE   bytes per FIFO direction (default 4M; multiple of 4096, >= 64K);
//                         unset: CCLITE_BUFFSIZE / NCCL_BUFFSIZE (env::get_buffsize)
//   CCLITE_SHM_SPIN_US    microseconds wait() busy-polls before yielding/sleeping (default 10)
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/shm/direct.hpp>
#include <cclite/shm/fifo.hpp>
#include <cclite/shm/link.hpp>
#include <cclite/shm/segment.hpp>
#include <cclite/transport/concept.hpp>
#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::shm {

/// Tunables; from_env() reads the CCLITE_SHM_* variables.
struct options {
  /// Bytes per FIFO direction; made valid by fifo_capacity().
  std::size_t buffer_bytes = fifo_default_capacity;
  wait_policy wait;

  static result<options> from_env() {
    options o;
    std::string from;
    auto b = env::get_buffsize("SHM_BUFFSIZE", static_cast<std::int64_t>(fifo_default_capacity), &from);
    if (!b) return b.error();
    auto cap = fifo_capacity(b.value());
    if (!cap) {
      if (from.empty() || from == "CCLITE_SHM_BUFFSIZE") return cap.error();
      return status(cap.error().code(), "value from " + from + " (CCLITE_SHM_BUFFSIZE unset): " + cap.error().message());
    }
    o.buffer_bytes = cap.value();
    auto spin = env::get_int(
        "SHM_SPIN_US", std::chrono::duration_cast<std::chrono::microseconds>(o.wait.spin).count(),
        false);
    if (!spin) return spin.error();
    if (spin.value() < 0 || spin.value() > 1000000) {
      return make_error(errc::invalid_argument,
                        "CCLITE_SHM_SPIN_US=%lld is out of range (0 .. 1000000 microseconds)",
                        static_cast<long long>(spin.value()));
    }
    o.wait.spin = std::chrono::microseconds(spin.value());
    return o;
  }
};

namespace detail {

/// Splits "a\nb\nc" into its lines.
inline std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '\n') {
      out.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  }
  return out;
}

}  // namespace detail

class transport {
 public:
  using link_type = link;
  /// Node-wide shared buffers for the shm-direct allreduce (direct.hpp); the
  /// communicator uses it when every rank of the job is on this node.
  using direct_group = shm::direct_group;
  static constexpr const char* name = "shm";

  /// False when CCLITE_SHM_DISABLE (fallback NCCL_SHM_DISABLE) is set to 1.
  static result<bool> enabled() {
    auto d = env::get_bool("SHM_DISABLE", false);
    if (!d) return d.error();
    return !d.value();
  }

  /// Reads the CCLITE_SHM_* options; a malformed one is reported by publish()/connect().
  explicit transport(const transport_context& ctx) : ctx_(ctx) {
    auto o = options::from_env();
    if (!o) {
      config_ = o.error();
      return;
    }
    opts_ = o.value();
  }
  transport(const transport_context& ctx, options opts) : ctx_(ctx), opts_(opts) {
    auto cap = fifo_capacity(static_cast<std::int64_t>(opts.buffer_bytes));
    if (!cap) {
      config_ = cap.error();
      return;
    }
    opts_.buffer_bytes = cap.value();
  }

  /// Publishes this rank's pid namespace ("shm/pidns/<rank>"): connect() watches
  /// a peer's pid for liveness only if it lives in the same one. Also reports
  /// malformed CCLITE_SHM_* variables.
  status publish() {
    CCLITE_TRY(config_);
    if (!ctx_.kv) return make_error(errc::invalid_argument, "shm publish: no store in the context");
    return ctx_.kv->set("shm/pidns/" + std::to_string(ctx_.rank), detail::pid_namespace());
  }

  /// Same node (host_id) and not the same rank.
  bool can_connect(const peer_info& self, const peer_info& peer) const {
    return self.rank != peer.rank && !self.host_id.empty() && self.host_id == peer.host_id;
  }

  /// Connects to `peer`; both ranks of the pair call it (see the file comment).
  result<link> connect(int peer, deadline until) {
    if (!config_.ok()) return config_;
    if (!ctx_.kv || !ctx_.peers || peer < 0 || peer >= ctx_.size || peer == ctx_.rank ||
        static_cast<std::size_t>(ctx_.size) > ctx_.peers->size()) {
      return make_error(errc::invalid_argument,
                        "shm connect from rank %d to rank %d: bad peer or transport_context",
                        ctx_.rank, peer);
    }
    const int lo = ctx_.rank < peer ? ctx_.rank : peer;
    const int hi = ctx_.rank < peer ? peer : ctx_.rank;
    // Published by the peer's init just before its connects: a short wait at most.
    // Its pid is not watched here: we do not know yet whether it means anything.
    auto ns =
        get_watching("shm/pidns/" + std::to_string(peer), ctx_.peer(peer), 0, until, nullptr, 0);
    if (!ns) {
      return status(ns.error().code(), ns.error().message() + " (did it call publish()?)");
    }
    // In another pid namespace its pid means nothing here: liveness then rests
    // on the closed flag and the deadline.
    const int watch_pid = ns.value() == detail::pid_namespace() ? ctx_.peer(peer).pid : 0;
    if (watch_pid == 0 && ctx_.log) {
      CCLITE_WARN(*ctx_.log,
                  "shm: %s runs in another pid namespace; if it is killed, this rank notices "
                  "only at the timeout (CCLITE_TIMEOUT)",
                  ctx_.peer(peer).describe().c_str());
    }
    const std::string key = "shm/" + std::to_string(lo) + "-" + std::to_string(hi);
    return ctx_.rank == lo ? connect_creator(peer, watch_pid, key, segment_name(lo, hi), until)
                           : connect_opener(peer, watch_pid, key, segment_name(lo, hi), until);
  }

  const options& opts() const noexcept { return opts_; }

  /// "/cclite-<job_tag>-<lo>-<hi>", job_tag reduced to [A-Za-z0-9._-] and 150 chars.
  std::string segment_name(int lo, int hi) const {
    std::string tag = ctx_.job_tag.empty() ? std::string("notag") : ctx_.job_tag.substr(0, 150);
    for (auto& c : tag) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-';
      if (!ok) c = '_';
    }
    return "/cclite-" + tag + "-" + std::to_string(lo) + "-" + std::to_string(hi);
  }

 private:
  result<link> connect_creator(int peer, int watch_pid, const std::string& key,
                               std::string seg_name, deadline until) {
    const peer_info& pi = ctx_.peer(peer);
    const std::size_t cap = opts_.buffer_bytes;
    const std::size_t bytes = segment_header::segment_bytes(cap);
    bool exists = false;
    auto seg = segment::create(seg_name, bytes, &exists);
    if (!seg && exists) {
      // A crashed earlier job with the same tag (or a live one: never touch it).
      std::string alt = seg_name + "-" + std::to_string(::getpid());
      if (ctx_.log)
        CCLITE_WARN(*ctx_.log,
                    "shm: /dev/shm%s already exists (left by a crashed job? remove it with "
                    "`rm /dev/shm/cclite-*` when no cclite job runs); using %s",
                    seg_name.c_str(), alt.c_str());
      seg_name = alt;
      seg = segment::create(seg_name, bytes);
    }
    if (!seg) return context(seg.error(), pi);
    auto* h = new (seg.value().data()) segment_header();
    h->version = segment_header::version_value;
    h->lo_rank = ctx_.rank;
    h->hi_rank = peer;
    h->creator_pid = static_cast<std::int32_t>(::getpid());
    h->capacity = cap;
    h->magic = segment_header::magic_value;
    if (ctx_.log)
      CCLITE_TRACE(*ctx_.log, "shm: created %s (2 x %zu KiB) for rank %d", seg_name.c_str(),
                   cap >> 10, peer);

    CCLITE_TRY(context(ctx_.kv->set(key, seg_name + "\n" + std::to_string(cap)), pi));
    auto ok = get_watching(key + "/ok", pi, watch_pid, until, nullptr, 0);
    if (!ok) return ok.error();  // seg's destructor unlinks the name
    if (ok.value() != "ok") {
      return make_error(errc::system_error, "shm connect: %s could not map the segment: %s",
                        pi.describe().c_str(), ok.value().c_str());
    }
    CCLITE_TRY(seg.value().unlink());
    return make_link(std::move(seg.value()), 0, pi, watch_pid);
  }

  result<link> connect_opener(int peer, int watch_pid, const std::string& key,
                              const std::string& expected_name, deadline until) {
    const peer_info& pi = ctx_.peer(peer);
    // If the creator dies between shm_open and publishing, its name would stay
    // in /dev/shm: remove what it would have created (ours by construction).
    std::string leftover[2] = {expected_name, expected_name + "-" + std::to_string(pi.pid)};
    auto v = get_watching(key, pi, watch_pid, until, leftover, 2);
    if (!v) return v.error();
    auto f = detail::split_lines(v.value());
    if (f.size() < 2 || f[0].rfind("/cclite-", 0) != 0 || f[0].find('/', 1) != std::string::npos) {
      return reject(key, pi, "malformed segment record '" + v.value() + "' in the store");
    }
    const std::string& seg_name = f[0];
    auto seg = segment::open(seg_name, segment_header::header_bytes);
    if (!seg) return reject(key, pi, seg.error().message(), seg.error().code());
    (void)seg.value().unlink();  // at once: from now on a crash leaves nothing behind
    const auto* h = static_cast<const segment_header*>(seg.value().data());
    const std::uint64_t cap = h->capacity;
    if (h->magic != segment_header::magic_value || h->version != segment_header::version_value ||
        h->lo_rank != pi.rank || h->hi_rank != ctx_.rank || h->creator_pid != pi.pid ||
        cap < fifo_min_capacity || cap > fifo_max_capacity || cap % fifo_granule != 0 ||
        seg.value().size() < segment_header::segment_bytes(static_cast<std::size_t>(cap))) {
      return reject(key, pi, "segment " + seg_name + " has an unexpected header (another job's?)");
    }
    CCLITE_TRY(context(ctx_.kv->set(key + "/ok", "ok"), pi));
    if (ctx_.log)
      CCLITE_TRACE(*ctx_.log, "shm: mapped %s (2 x %zu KiB) from rank %d", seg_name.c_str(),
                   static_cast<std::size_t>(cap >> 10), peer);
    return make_link(std::move(seg.value()), 1, pi, watch_pid);
  }

  // No liveness check here: once the handshake completed, a peer that has
  // already exited may have left data in the segment for us (it sent and
  // left, as the last call of a job does). The link reports the peer's exit
  // when a wait finds nothing more to read (link.hpp), as a TCP socket
  // delivers what was sent before the peer closed.
  result<link> make_link(segment seg, int side, const peer_info& pi, int watch_pid) {
    link::parts p;
    p.seg = std::move(seg);
    p.side = side;
    p.peer = pi.rank;
    p.peer_pid = watch_pid;
    p.peer_desc = pi.describe();
    p.aborted = ctx_.aborted;
    p.policy = opts_.wait;
    return link(std::move(p));
  }

  /// store.get in 100 ms slices, checking deadline, abort, peer liveness and
  /// the job's recorded failure in between. If the peer is gone, the names in
  /// cleanup[0..n) are unlinked.
  result<std::string> get_watching(const std::string& key, const peer_info& pi, int watch_pid,
                                   deadline until, const std::string* cleanup,
                                   std::size_t ncleanup) {
    const auto start = clock::now();
    for (;;) {
      auto v = ctx_.kv->get(key, deadline::min(until, deadline::after(milliseconds(100))));
      if (v) return v;
      if (v.error().code() != errc::timeout) return context(v.error(), pi);
      if (until.expired()) {
        double s = std::chrono::duration<double>(clock::now() - start).count();
        return make_error(errc::timeout,
                          "timed out after %.1f s in shm connect waiting for %s (store key '%s')",
                          s, pi.describe().c_str(), key.c_str());
      }
      if (ctx_.is_aborted()) {
        return make_error(errc::aborted, "communicator aborted during shm connect to %s",
                          pi.describe().c_str());
      }
      if (!detail::process_alive(watch_pid)) {
        // It may have answered just before it exited: one last look.
        auto last = ctx_.kv->get(key, deadline::after(milliseconds(0)));
        if (last) return last;
        for (std::size_t i = 0; i < ncleanup; ++i) (void)segment::unlink_name(cleanup[i]);
        return make_error(errc::peer_lost, "%s is gone (exited or was killed during shm connect)",
                          pi.describe().c_str());
      }
      // Alive but failed (it will not answer), or the job failed elsewhere.
      if (status f = ctx_.recorded_failure(); !f.ok()) return context(f, pi);
    }
  }

  /// Tells the creator why the opener gives up (so it fails now, not at its deadline).
  status reject(const std::string& key, const peer_info& pi, const std::string& why,
                errc code = errc::protocol_error) {
    (void)ctx_.kv->set(key + "/ok", "error: " + why);
    return make_error(code, "shm connect to %s: %s", pi.describe().c_str(), why.c_str());
  }

  static status context(const status& s, const peer_info& pi) {
    if (s.ok()) return s;
    return status(s.code(), "shm connect to " + pi.describe() + ": " + s.message());
  }

  transport_context ctx_;
  options opts_;
  status config_;
};

static_assert(is_transport_v<transport>, "shm::transport must model the transport concept");

}  // namespace cclite::shm
CCLITE_SETUP_CODE_END
