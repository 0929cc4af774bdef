// cclite/tcp/store_server.hpp - the TCP rendezvous store that rank 0 hosts.
//
// store_server keeps the key-value map in memory and serves any number of
// store_client connections (store_client.hpp) with the protocol of
// store_protocol.hpp. It is one poll() loop over non-blocking sockets (no
// Asio, no per-operation allocation of handlers), so the map needs no lock and
// a stalled or hostile client never holds up the others. The loop runs
//   - on one background thread (the default), or
//   - on the caller's thread, a bounded step per progress() call, with
//     server_options::background_thread = false; this is forced under
//     CCLITE_NO_THREADS. A store_client in the same process drives it while it
//     waits (hook(), see poll_hook in store_protocol.hpp); other processes are
//     served only while this process is inside progress() (a store call of its
//     own client), which is what rank 0 does during init.
//
// Robustness (the port is reachable by anything on the network):
//   - a connection must first prove it knows the job token
//     (server_options::token; handshake in store_protocol.hpp and
//     store_auth.hpp); one that fails gets a "refused" reply, is closed and
//     logged at WARN ("... tcp store: refused client 1.2.3.4:5555: wrong job
//     token ..."); the job goes on;
//   - every header is validated before its body is read; a malformed or
//     truncated frame drops only that connection, with one WARN line
//     ("... tcp store: dropped client 1.2.3.4:5555: bad magic");
//   - a body buffer grows with the bytes actually received, never past the
//     validated length, so a header that announces 64 MiB costs nothing;
//   - a connection that stalls mid-frame, or sends no valid request at all,
//     is dropped after server_options::idle_timeout;
//   - at most server_options::max_connections are open; more are refused;
//   - the stored bytes are capped by server_options::max_total_bytes;
//   - log lines are rate limited, so a flood cannot flood stderr.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#if !defined(CCLITE_NO_THREADS)
#include <thread>
#endif

#include <cclite/config.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/store_auth.hpp>
#include <cclite/tcp/store_protocol.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

/// Limits of a store_server. The defaults suit a job of up to ~16k ranks.
struct server_options {
  /// The job token a client must prove it knows (see store_auth.hpp);
  /// rendezvous passes CCLITE_RDZV_TOKEN. Empty = the empty token: the
  /// handshake still runs, and only clients without a token get in.
  std::string token;
  /// A connection that makes no progress this long in the middle of a frame
  /// (or while its reply is being written), or that does not complete the
  /// token handshake / send a valid request this long after connecting, is
  /// dropped.
  std::chrono::milliseconds idle_timeout{60000};
  /// Idle limit between requests for a client that already sent a valid
  /// request; 0 = none, because ranks keep their connection for the whole job
  /// and may stay quiet for hours.
  std::chrono::milliseconds established_idle_timeout{0};
  /// Connections beyond this are accepted and closed at once.
  std::size_t max_connections = 16384;
  /// Total key + value bytes held; a set past it gets an error reply.
  // 4 GiB, or 1 GiB where size_t is 32 bits (4 << 30 would wrap to 0 and refuse every key).
  std::size_t max_total_bytes = sizeof(std::size_t) >= 8 ? std::size_t(4) << 30 : std::size_t(1) << 30;
  /// Log a WARN line (cclite's logger: CCLITE_DEBUG, CCLITE_DEBUG_FILE) for
  /// each dropped or refused client; at most 20 a second.
  bool log = true;
  /// Serve on a background thread (true) or only inside progress() calls
  /// (false; always false under CCLITE_NO_THREADS).
  bool background_thread = true;
};

/// The TCP store server. Create with start(); the destructor closes every
/// connection (and joins the thread, if any). The counters are thread-safe;
/// progress() belongs to one thread at a time.
class store_server {
 public:
  /// Listens on bind_host:port ("" or "0.0.0.0" = every IPv4 address, "::" =
  /// every address; port 0 = an ephemeral port, see port()) with SO_REUSEADDR
  /// and starts serving (see the top: background thread or progress()).
  /// open_store() (rendezvous.hpp) picks one address, never "every address"
  /// unless CCLITE_STORE_BIND_ANY=1.
  /// Errors: errc::bootstrap_error when the host does not resolve or the port
  /// cannot be bound (the message says which and how to pick another port).
  static result<std::unique_ptr<store_server>> start(const std::string& bind_host, std::uint16_t port,
                                                     server_options opts = {}) {
    return start(std::vector<std::string>{bind_host}, port, std::move(opts));
  }
  /// The same on several addresses at once (for a host name that resolves to
  /// 127.0.1.1 here and to the NIC's address on the other nodes); the first
  /// picks the port (0 = ephemeral) and the others bind the same one.
  static result<std::unique_ptr<store_server>> start(const std::vector<std::string>& bind_hosts,
                                                     std::uint16_t port, server_options opts = {});
  ~store_server();
  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;

  /// The bound port (the ephemeral one when started with port 0).
  std::uint16_t port() const noexcept { return port_; }
  /// The bound address as "host:port" (for messages).
  const std::string& address() const noexcept { return address_; }
  /// Connections open now.
  std::size_t connections() const noexcept { return n_conn_.load(); }
  /// Connections dropped for a protocol violation or a timeout, so far.
  std::uint64_t dropped() const noexcept { return n_dropped_.load(); }
  /// Connections refused because max_connections were open, so far.
  std::uint64_t refused() const noexcept { return n_refused_.load(); }
  /// Connections that failed the job-token proof, so far.
  std::uint64_t auth_failures() const noexcept { return n_auth_failed_.load(); }
  /// True when a background thread serves; false when progress() must.
  bool threaded() const noexcept { return threaded_; }
  /// Serves (or, with a background thread, waits) until no connection is open
  /// or `until` passes. For a host whose job failed: the other ranks read the
  /// failure record before they disconnect (collective/init.hpp). A store
  /// handed over to a helper process (hand_over()) asks the helper to do this
  /// once this process has gone, and returns at once.
  void drain_clients(deadline until) {
    if (helper_fd_ >= 0) {
      unsigned char msg[5] = {'D'};  // then the milliseconds left, at most 10 minutes
      const auto ms = static_cast<std::uint32_t>(until.remaining(milliseconds(600000)).count());
      std::memcpy(msg + 1, &ms, sizeof ms);
      (void)::send(helper_fd_, msg, sizeof msg, MSG_NOSIGNAL);  // a dead helper: EPIPE, no signal
      return;
    }
    while (connections() > 0 && !until.expired()) (void)progress(5);
  }

  /// In the parent after fork() (tcp/rendezvous.hpp, CCLITE_NO_THREADS):
  /// another process serves this store from now on. Closes this process's
  /// copies of the listening sockets and keeps `helper_fd`, this end of a
  /// socket pair with the helper, which drain_clients() sends to and whose
  /// closing (this object destroyed, or the process gone) ends the helper.
  void hand_over(int helper_fd) {
    for (auto& l : listeners_) ::close(l.fd);
    listeners_.clear();
    helper_fd_ = helper_fd;
  }

  /// Without a background thread: serves whatever is ready, waiting at most
  /// `timeout_ms` (< 0: until something happens) for the server's sockets and
  /// for `fd` (< 0: none) to be ready for `events`. Returns fd's revents (0 if
  /// it was not ready). With a background thread it only waits for `fd`.
  short progress(int timeout_ms, int fd = -1, short events = 0) {
    if (threaded_) {
      pollfd p{fd, events, 0};
      int r = ::poll(&p, fd >= 0 ? 1 : 0, timeout_ms);
      return r > 0 ? p.revents : 0;
    }
    return step(timeout_ms, fd, events);
  }
  /// The hook a store_client of this process waits through (store_protocol.hpp).
  poll_hook hook() noexcept {
    poll_hook h;
    h.ctx = this;
    h.wait = [](void* ctx, int fd, short events, int ms) -> short {
      return static_cast<store_server*>(ctx)->progress(ms, fd, events);
    };
    return h;
  }

 private:
  struct session;
  using value_ptr = std::shared_ptr<const std::string>;
  struct listener {
    int fd = -1;
    clock::time_point retry_at{};  // after an accept error: not polled before this
  };

  explicit store_server(server_options o) : opts_(std::move(o)) {}
  short step(int timeout_ms, int extra_fd, short extra_events);
  void accept_all(listener& l, clock::time_point now);
  void wake(const std::string& key);
  void remove_waiter(const std::string& key, const session* s);
  void log(const char* fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
      __attribute__((format(printf, 2, 3)))
#endif
      ;

  server_options opts_;
  std::vector<listener> listeners_;
  std::uint16_t port_ = 0;
  std::string address_;
  bool threaded_ = false;
#if !defined(CCLITE_NO_THREADS)
  std::thread thread_;
#endif
  int wake_fd_[2] = {-1, -1};  // background thread: the destructor writes a byte to stop it
  int helper_fd_ = -1;         // hand_over(): the channel to the process serving this store
  std::atomic<bool> stopping_{false};

  // Touched by the serving thread only.
  std::vector<std::unique_ptr<session>> sessions_;
  std::size_t open_ = 0;
  std::unordered_map<std::string, value_ptr> data_;
  std::size_t data_bytes_ = 0;
  std::unordered_map<std::string, std::vector<session*>> waiters_;
  std::vector<pollfd> pfds_;  // reused by step()
  clock::time_point log_window_{};
  int log_lines_ = 0;
  std::uint64_t log_suppressed_ = 0;

  std::atomic<std::size_t> n_conn_{0};
  std::atomic<std::uint64_t> n_dropped_{0};
  std::atomic<std::uint64_t> n_refused_{0};
  std::atomic<std::uint64_t> n_auth_failed_{0};
  logger logger_{0};  // the server runs in rank 0
};

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END

#include <cclite/tcp/detail/store_session.hpp>  // and, at its end, detail/store_server_impl.hpp
