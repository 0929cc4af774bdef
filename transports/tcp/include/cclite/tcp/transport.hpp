// cclite/tcp/transport.hpp - the TCP transport: reaches any peer, on any host.
//
//   publish()        picks the interface (ifname.hpp), listens on its address
//                    with an ephemeral port, and sets store key "tcp/<rank>" to
//                    "addr:port" ("[addr]:port" for IPv6).
//   connect(p, t)    lower rank of the pair: connects nsocks sockets to the
//                    higher rank's address (retrying refused connections with
//                    backoff until `t`), sends a hello on each (hello.hpp) and
//                    waits for the acks; refused for 10 s, or no answer for
//                    25 s (its host lost), is peer_lost. Higher rank: accepts
//                    until it holds all nsocks sockets of rank p, keeping
//                    sockets of other peers for their own connect(), then acks
//                    them; a lower rank that is gone is peer_lost within
//                    seconds (its listener refuses probes), one whose host is
//                    lost within ~31 s (probes unanswered: listener_probe.hpp),
//                    not at `t`.
//                    Connections that are not from this job (bad magic, other
//                    job tag, wrong rank, bad index, silent for 30 s) are
//                    logged with one WARN line and closed; the job goes on.
//
// Environment (read by publish()):
//   CCLITE_SOCKET_IFNAME / NCCL_SOCKET_IFNAME   interface (see ifname.hpp)
//   CCLITE_SOCKET_FAMILY / NCCL_SOCKET_FAMILY   AF_INET or AF_INET6
//   CCLITE_NSOCKS        sockets per peer pair, 1..16 (default 2)
//   CCLITE_TCP_BUFFSIZE  bytes of each staging ring (send, recv) per peer,
//                        multiple of 4096 (default 4M); unset: CCLITE_BUFFSIZE
//                        / NCCL_BUFFSIZE (env::get_buffsize)
//   CCLITE_TCP_BLOCK     striping block, multiple of 4096 (default 128K)
//   CCLITE_TCP_SOCKBUF   SO_SNDBUF/SO_RCVBUF; 0 = kernel autotuning (default 0)
//   CCLITE_TCP_SPIN_US   microseconds a waiting link polls before it sleeps,
//                        0..100000 (default 200; see link.hpp)
//   CCLITE_TCP_EAGER     pending bytes at which a commit pushes to the
//                        sockets; 0 = only when waiting (default 0)
//   CCLITE_TCP_DIRECT    messages of at least this many bytes move between
//                        the sockets and the caller's buffer, not through
//                        the rings (transport/direct.hpp); 0 = never
//                        (default 1M)
//   CCLITE_TCP_KEEPALIVE seconds a peer's host may leave every connection
//                        unanswered before it is lost, 3..86400 (default 25;
//                        socket.hpp)
//   CCLITE_TCP_DISABLE=1 turns the transport off (enabled() is false)
// For a pair, the connecting (lower) rank's NSOCKS and BLOCK win.
//
// Memory: 2 x CCLITE_TCP_BUFFSIZE per TCP peer, mapped at connect().
// Thread safety: one thread at a time per transport and per link.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cclite/config.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/acceptor.hpp>
#include <cclite/tcp/hello.hpp>
#include <cclite/tcp/ifname.hpp>
#include <cclite/tcp/link.hpp>
#include <cclite/tcp/listener_probe.hpp>
#include <cclite/tcp/socket.hpp>
#include <cclite/transport/concept.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::tcp {

/// Settings of the TCP data path, from the environment.
struct transport_config {
  int nsocks = 2;
  std::size_t buffsize = 4u << 20;
  std::size_t block = 128u << 10;
  int sockbuf = 0;
  int spin_us = 200;
  std::size_t eager = 0;
  /// Messages of at least this many bytes skip the rings (0: never).
  std::size_t direct_min = std::size_t{1} << 20;
  /// Seconds a peer's host may leave the connections unanswered before it
  /// counts as lost (socket.hpp: keepalive, TCP_USER_TIMEOUT, listener probes).
  int keepalive_s = detail::default_silent_s;

  /// Reads CCLITE_NSOCKS, CCLITE_TCP_BUFFSIZE, CCLITE_TCP_BLOCK, CCLITE_TCP_SOCKBUF,
  /// CCLITE_TCP_SPIN_US, CCLITE_TCP_EAGER, CCLITE_TCP_DIRECT, CCLITE_TCP_KEEPALIVE.
  /// Errors: invalid_argument naming the variable and its accepted range.
  static result<transport_config> from_env() {
    transport_config c;
    auto ns = env::get_int("NSOCKS", 2);
    if (!ns) return ns.error();
    if (ns.value() < 1 || ns.value() > max_nsocks) {
      return make_error(errc::invalid_argument, "CCLITE_NSOCKS=%lld is out of range (1..%d)",
                        (long long)ns.value(), max_nsocks);
    }
    c.nsocks = static_cast<int>(ns.value());
    std::string from;
    auto bs = env::get_buffsize("TCP_BUFFSIZE", 4 << 20, &from);
    if (!bs) return bs.error();
    if (bs.value() < 4096 || bs.value() % 4096 != 0 || bs.value() > (std::int64_t(1) << 32)) {
      return make_error(errc::invalid_argument, "%s=%lld must be a multiple of 4096 between 4K and 4G (TCP staging ring)",
                        from.c_str(), (long long)bs.value());
    }
    c.buffsize = static_cast<std::size_t>(bs.value());
    auto bl = env::get_int("TCP_BLOCK", 128 << 10, false);
    if (!bl) return bl.error();
    if (bl.value() < min_block || bl.value() > max_block || bl.value() % 4096 != 0) {
      return make_error(errc::invalid_argument,
                        "CCLITE_TCP_BLOCK=%lld must be a multiple of 4096 between 4K and 64M",
                        (long long)bl.value());
    }
    c.block = static_cast<std::size_t>(bl.value());
    auto sb = env::get_int("TCP_SOCKBUF", 0, false);
    if (!sb) return sb.error();
    if (sb.value() < 0 || sb.value() > (std::int64_t(1) << 30)) {
      return make_error(errc::invalid_argument, "CCLITE_TCP_SOCKBUF=%lld must be between 0 and 1G",
                        (long long)sb.value());
    }
    c.sockbuf = static_cast<int>(sb.value());
    auto sp = env::get_int("TCP_SPIN_US", 200, false);
    if (!sp) return sp.error();
    if (sp.value() < 0 || sp.value() > 100000) {
      return make_error(errc::invalid_argument, "CCLITE_TCP_SPIN_US=%lld must be between 0 and 100000",
                        (long long)sp.value());
    }
    c.spin_us = static_cast<int>(sp.value());
    auto eg = env::get_int("TCP_EAGER", 0, false);
    if (!eg) return eg.error();
    if (eg.value() < 0 || eg.value() > (std::int64_t(1) << 32)) {
      return make_error(errc::invalid_argument, "CCLITE_TCP_EAGER=%lld must be between 0 and 4G",
                        (long long)eg.value());
    }
    c.eager = static_cast<std::size_t>(eg.value());
    auto dm = env::get_int("TCP_DIRECT", 1 << 20, false);
    if (!dm) return dm.error();
    if (dm.value() < 0 || dm.value() > (std::int64_t(1) << 40)) {
      return make_error(errc::invalid_argument, "CCLITE_TCP_DIRECT=%lld must be between 0 (never) and 1T",
                        (long long)dm.value());
    }
    c.direct_min = static_cast<std::size_t>(dm.value());
    auto ka = env::get_int("TCP_KEEPALIVE", detail::default_silent_s, false);
    if (!ka) return ka.error();
    if (ka.value() < detail::min_silent_s || ka.value() > detail::max_silent_s) {
      return make_error(errc::invalid_argument,
                        "CCLITE_TCP_KEEPALIVE=%lld must be between %d and %d (seconds a silent host has before "
                        "it counts as lost)", (long long)ka.value(), detail::min_silent_s, detail::max_silent_s);
    }
    c.keepalive_s = static_cast<int>(ka.value());
    return c;
  }
};

/// The TCP transport (models cclite::is_transport_v). See the file comment.
class transport {
 public:
  using link_type = tcp::link;
  static constexpr const char* name = "tcp";

  /// False when CCLITE_TCP_DISABLE=1. Errors: invalid_argument (not a boolean).
  static result<bool> enabled() {
    auto off = env::get_bool("TCP_DISABLE", false, false);
    if (!off) return off.error();
    return !off.value();
  }

  /// Cheap; no I/O. `ctx` must outlive the transport.
  explicit transport(const transport_context& ctx) : ctx_(ctx), job_hash_(fnv1a64(ctx.job_tag)) {
    if (!ctx_.log) own_log_ = std::make_unique<logger>(ctx_.rank);
  }

  /// Listens on the chosen interface and publishes "tcp/<rank>" = "addr:port".
  /// Errors: invalid_argument (bad environment), unsupported (no interface),
  /// system_error (socket calls), and whatever the store returns.
  status publish() {
    if (acceptor_.listening()) return {};
    if (!ctx_.kv) return make_error(errc::invalid_argument, "tcp::transport needs a store (ctx.kv is null)");
    auto cfg = transport_config::from_env();
    if (!cfg) return cfg.error();
    cfg_ = cfg.value();
    auto iface = choose_interface();
    if (!iface) return iface.error();
    CCLITE_TRY(acceptor_.listen(endpoint::from(iface->iface.addr), cfg_.sockbuf, cfg_.keepalive_s));
    CCLITE_INFO(log(), "tcp: listening on %s, interface %s; nsocks %d, block %zu, buffers 2 x %zu per peer, "
                "spin %d us, eager push at %zu bytes, a silent host lost after %d s", acceptor_.address().c_str(),
                iface->reason.c_str(), cfg_.nsocks, cfg_.block, cfg_.buffsize, cfg_.spin_us, cfg_.eager,
                cfg_.keepalive_s);
    return ctx_.kv->set(key(ctx_.rank), acceptor_.address());
  }

  /// True for every peer but ourselves: TCP reaches other hosts and this one.
  bool can_connect(const peer_info& self, const peer_info& peer) const {
    return self.rank != peer.rank;
  }

  /// Connects to `peer`; both ranks of the pair call it (see concept.hpp for
  /// the order). Errors: timeout (naming the peer and the address), aborted,
  /// peer_lost, protocol_error (the peer's address answered like something
  /// else), invalid_argument (bad peer, publish() not called), resource_exhausted.
  result<link> connect(int peer, deadline until) {
    if (!acceptor_.listening()) {
      return make_error(errc::invalid_argument, "tcp::transport::connect(%d) before publish()", peer);
    }
    if (peer < 0 || peer >= ctx_.size || peer == ctx_.rank) {
      return make_error(errc::invalid_argument, "tcp::transport::connect(%d): not a peer of rank %d of %d",
                        peer, ctx_.rank, ctx_.size);
    }
    if (ctx_.is_aborted()) {
      return make_error(errc::aborted, "communicator aborted before connecting to %s over tcp",
                        describe(peer).c_str());
    }
    return ctx_.rank < peer ? connect_to(peer, until) : accept_from(peer, until);
  }

  /// Accepts no more connections (acceptor::stop): called once the
  /// communicators over this transport failed, so that a peer still waiting
  /// to connect to this rank (a set-up, a first call's link) is told at once:
  /// its connect is refused or reset, its probe of this listener refused.
  void stop_listening() noexcept { acceptor_.stop(); }

  /// "addr:port" this rank listens on (empty before publish()).
  const std::string& address() const noexcept { return acceptor_.address(); }
  const transport_config& config() const noexcept { return cfg_; }

 private:
  static constexpr auto refused_limit = std::chrono::seconds(10);
  // How often a connect wait looks for the job's recorded failure (a store
  // round trip): a peer that failed while alive never connects nor refuses.
  static constexpr auto record_every = std::chrono::milliseconds(200);

  static std::string key(int rank) { return "tcp/" + std::to_string(rank); }
  const logger& log() const { return ctx_.log ? *ctx_.log : *own_log_; }
  std::string describe(int r) const {
    if (ctx_.peers && r >= 0 && static_cast<std::size_t>(r) < ctx_.peers->size()) {
      const peer_info& p = ctx_.peer(r);
      if (p.rank == r) return p.describe();
    }
    return "rank " + std::to_string(r);
  }
  static double since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  }

  // ---- lower rank: connect, hello, wait for acks ----------------------------

  result<link> connect_to(int peer, deadline until) {
    auto start = clock::now();
    auto text = ctx_.kv->get(key(peer), until);
    if (!text) {
      return status(text.error().code(), "cannot find the tcp address of " + describe(peer) +
                                             " in the store: " + text.error().message());
    }
    auto ep = endpoint::parse(text.value());
    if (!ep) return ep.error();
    std::string what = "connecting to " + describe(peer) + " at " + ep->to_string() + " over tcp";
    socket_fd socks[max_nsocks];
    const int n = cfg_.nsocks;
    for (int i = 0; i < n; ++i) {
      auto s = dial(ep.value(), until, what, start);
      if (!s) return s.error();
      socks[i] = std::move(s.value());
      hello h;
      h.job_hash = job_hash_;
      h.from_rank = ctx_.rank;
      h.to_rank = peer;
      h.sock_index = static_cast<std::uint32_t>(i);
      h.nsocks = static_cast<std::uint32_t>(n);
      h.block = static_cast<std::uint32_t>(cfg_.block);
      std::uint8_t frame[hello_bytes];
      encode(h, frame);
      CCLITE_TRY(annotate(detail::write_all(socks[i].get(), frame, hello_bytes, until, ctx_.aborted, what.c_str()), start));
    }
    for (int i = 0; i < n; ++i) {
      std::uint8_t frame[hello_bytes];
      std::string waiting = what + " (waiting for its handshake reply)";
      CCLITE_TRY(annotate(detail::read_exact(socks[i].get(), frame, hello_bytes, until, ctx_.aborted, waiting.c_str()), start));
      hello a = decode(frame);
      if (!a.is_ack() || a.job_hash != job_hash_ || a.from_rank != peer || a.to_rank != ctx_.rank ||
          a.sock_index != static_cast<std::uint32_t>(i) || a.nsocks != static_cast<std::uint32_t>(n) ||
          a.block != cfg_.block) {
        return make_error(errc::protocol_error,
                          "%s: socket %d got a reply that is not this job's handshake ack (from rank "
                          "%d to %d, index %u of %u); is another process using that address?",
                          what.c_str(), i, a.from_rank, a.to_rank, a.sock_index, a.nsocks);
      }
    }
    CCLITE_TRACE(log(), "tcp: connected to %s at %s with %d sockets", describe(peer).c_str(),
                 ep->to_string().c_str(), n);
    return link::create(peer, describe(peer), socks, n, cfg_.block, cfg_.buffsize, ctx_.aborted,
                        std::chrono::microseconds(cfg_.spin_us), cfg_.eager, cfg_.keepalive_s,
                        cfg_.direct_min);
  }

  // Timeouts from the setup helpers ("timed out <what>") get the elapsed time.
  status annotate(status s, clock::time_point start) const {
    static const std::string head = "timed out ";
    if (s.code() == errc::timeout && s.message().compare(0, head.size(), head) == 0) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "timed out after %.1f s ", since(start));
      return status(errc::timeout, buf + s.message().substr(head.size()));
    }
    return s;
  }

  static bool retryable(int e) {
    return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
           e == ECONNRESET || e == EAGAIN || e == ECONNABORTED;
  }

  // One connected socket to `ep`; refused/unreachable attempts are retried with
  // backoff (5 ms doubling to 500 ms) until `until`. The address is published
  // only after listen(), so refusals that go on for refused_limit mean the peer's
  // listener is gone (process dead, transport destroyed), and attempts that get
  // no answer for cfg_.keepalive_s mean its host is (listener_probe.hpp):
  // peer_lost rather than waiting out a 30-minute CCLITE_TIMEOUT.
  result<socket_fd> dial(const endpoint& ep, deadline until, const std::string& what,
                         clock::time_point start) {
    milliseconds backoff(5);
    int last = 0;
    clock::time_point refused_since{}, silent_since{}, record_due = start + record_every;
    for (;;) {
      const auto attempt = clock::now();
      if (ctx_.is_aborted()) return make_error(errc::aborted, "communicator aborted while %s", what.c_str());
      if (attempt >= record_due) {
        record_due = attempt + record_every;
        if (status f = ctx_.recorded_failure(); !f.ok()) return status(f.code(), what + ": " + f.message());
      }
      if (until.expired()) {
        return make_error(errc::timeout, "timed out after %.1f s %s (last error: %s); check that the "
                          "peer is running and this host can reach that address (CCLITE_SOCKET_IFNAME, firewall)",
                          since(start), what.c_str(), last ? detail::errno_text(last).c_str() : "none");
      }
      auto s = detail::make_socket(ep.family());
      if (!s) return s.error();
      CCLITE_TRY(detail::set_socket_options(s->get(), cfg_.sockbuf, cfg_.keepalive_s));
      int e = 0;
      if (::connect(s->get(), ep.sa(), ep.size()) != 0) {
        e = errno;
        if (e == EINPROGRESS || e == EINTR) {
          e = EINPROGRESS;
          while (e == EINPROGRESS) {
            if (ctx_.is_aborted() || until.expired()) break;
            if (detail::poll_one(s->get(), POLLOUT, until.remaining(milliseconds(50))) != 0) {
              socklen_t len = sizeof e;
              if (::getsockopt(s->get(), SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
            }
          }
          if (e == EINPROGRESS) continue;  // aborted or expired: reported above
        }
      }
      if (e == 0) return std::move(s.value());
      last = e;
      // No answer at all (TCP_USER_TIMEOUT ends a connect after keepalive_s)
      // or no route / ARP reply: the host is down or cut off, not just slow.
      const bool silent = e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH;
      if (!silent) {
        silent_since = {};
      } else if (silent_since == clock::time_point{}) {
        silent_since = attempt;
      }
      if (silent && clock::now() - silent_since >= std::chrono::seconds(cfg_.keepalive_s)) {
        return make_error(errc::peer_lost,
                          "%s: no answer for %.0f s (last error: %s): the peer's host is down or the network "
                          "is cut",
                          what.c_str(), since(silent_since), detail::errno_text(e).c_str());
      }
      if (e != ECONNREFUSED) {
        refused_since = {};
      } else if (refused_since == clock::time_point{}) {
        refused_since = clock::now();
      } else if (clock::now() - refused_since > refused_limit) {
        return make_error(errc::peer_lost,
                          "%s: connection refused for %.0f s; the peer's listener is gone (process "
                          "exited, or its communicator failed or was destroyed)",
                          what.c_str(), std::chrono::duration<double>(refused_limit).count());
      }
      if (!retryable(e)) {
        return make_error(errc::system_error, "%s: connect() failed: %s", what.c_str(),
                          detail::errno_text(e).c_str());
      }
      std::this_thread::sleep_for(std::min(backoff, until.remaining(backoff)));
      backoff = std::min(backoff * 2, milliseconds(500));
    }
  }

  // ---- higher rank: wait for the peer's sockets, ack them -------------------

  // A lower rank that is gone never connects: rather than wait out the
  // deadline, probe its listener now and then while waiting (listener_probe.hpp).
  auto peer_still_there(int peer, clock::time_point start) {
    return [this, peer, start, probe = detail::listener_probe(start, std::chrono::seconds(cfg_.keepalive_s)), ep = endpoint(),
            address = std::string(), record_due = start + record_every]() mutable {
      const auto now = clock::now();
      if (now >= record_due) {  // alive but failed, or the job failed elsewhere
        record_due = now + record_every;
        if (status f = ctx_.recorded_failure(); !f.ok()) return f;
      }
      if (!probe.due(now)) return status();
      auto answer = detail::probe_answer::unknown;
      if (address.empty()) {  // published at its publish(), before any connect()
        // The store may be as silent as the peer (rank 0's host, lost with
        // it): a store that does not answer, or cannot be reached (a lost
        // host's address fails at once once ARP gave up), counts as a silent
        // probe; only a store that says the key is not there does not.
        const auto reply_by = deadline::after(detail::listener_probe::answer_wait);
        auto text = ctx_.kv->get_within(key(peer), deadline::after(milliseconds(0)), reply_by);
        auto parsed = text ? endpoint::parse(text.value()) : result<endpoint>(text.error());
        if (parsed) {
          ep = parsed.value();
          address = text.value();
        } else if (!text && (reply_by.expired() || text.error().code() == errc::peer_lost)) {
          answer = detail::probe_answer::silent;
        }
      }
      if (!address.empty()) answer = detail::probe_listener(ep, detail::listener_probe::answer_wait);
      const auto v = probe.record(answer, now);
      if (v == detail::listener_probe::verdict::waiting) return status();
      if (v == detail::listener_probe::verdict::silent && address.empty())
        return make_error(errc::peer_lost,
                          "%s will not connect: neither it nor the rendezvous store (which has its address) "
                          "answers (for %.0f s: host down or network cut); noticed after waiting %.1f s for it",
                          describe(peer).c_str(), since(probe.silent_since()), since(start));
      if (v == detail::listener_probe::verdict::silent)
        return make_error(errc::peer_lost,
                          "%s will not connect: its host does not answer at %s (connections unanswered for "
                          "%.0f s: host down or network cut); noticed after waiting %.1f s for it",
                          describe(peer).c_str(), address.c_str(), since(probe.silent_since()), since(start));
      return make_error(errc::peer_lost,
                        "%s will not connect: its tcp listener at %s refuses connections (the process "
                        "exited, or its communicator failed or was destroyed); noticed after waiting %.1f s for it",
                        describe(peer).c_str(), address.c_str(), since(start));
    };
  }

  result<link> accept_from(int peer, deadline until) {
    auto start = clock::now();
    auto got = acceptor_.wait_for(peer, ctx_.rank, ctx_.size, job_hash_, until, ctx_.aborted,
                                  describe(peer), cfg_.nsocks, log(), peer_still_there(peer, start));
    if (!got) return got.error();
    detail::peer_sockets& p = got.value();
    if (p.nsocks != cfg_.nsocks || p.block != cfg_.block) {
      CCLITE_INFO(log(), "tcp: %s connects with nsocks %d, block %zu (this rank has %d, %zu): the "
                  "connecting rank's settings are used", describe(peer).c_str(), p.nsocks, p.block,
                  cfg_.nsocks, cfg_.block);
    }
    std::string what = "acknowledging the tcp connection of " + describe(peer);
    for (int i = 0; i < p.nsocks; ++i) {
      hello a;
      std::memcpy(a.magic, "CCTA", 4);
      a.job_hash = job_hash_;
      a.from_rank = ctx_.rank;
      a.to_rank = peer;
      a.sock_index = static_cast<std::uint32_t>(i);
      a.nsocks = static_cast<std::uint32_t>(p.nsocks);
      a.block = static_cast<std::uint32_t>(p.block);
      std::uint8_t frame[hello_bytes];
      encode(a, frame);
      CCLITE_TRY(annotate(detail::write_all(p.socks[i].get(), frame, hello_bytes, until, ctx_.aborted,
                                            what.c_str()), start));
    }
    CCLITE_TRACE(log(), "tcp: accepted %s with %d sockets", describe(peer).c_str(), p.nsocks);
    return link::create(peer, describe(peer), p.socks, p.nsocks, p.block, cfg_.buffsize, ctx_.aborted,
                        std::chrono::microseconds(cfg_.spin_us), cfg_.eager, cfg_.keepalive_s,
                        cfg_.direct_min);
  }

  transport_context ctx_;
  std::uint64_t job_hash_;
  std::unique_ptr<logger> own_log_;
  transport_config cfg_;
  detail::acceptor acceptor_;
};

static_assert(is_transport_v<transport>, "tcp::transport must model the transport concept");

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
