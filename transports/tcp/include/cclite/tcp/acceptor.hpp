// cclite/tcp/acceptor.hpp - the listening side of the TCP transport.
//
// One acceptor per transport owns the listening socket. When the higher rank
// of a pair calls connect(), it waits here until all nsocks sockets of that
// peer have arrived with a valid hello. Meanwhile it accepts everything that
// comes: connections of other peers (whose own connect() comes later: every
// rank connects its pairs in ascending order) are kept; strangers (bad magic,
// other job, wrong rank, bad index, silent for 30 s) are closed with one WARN
// line each and never fail the job. At most 256 connections may be mid-hello;
// beyond that the oldest is closed. Liveness probes of waiting peers
// (listener_probe.hpp) are closed without a word.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/hello.hpp>
#include <cclite/tcp/listener_probe.hpp>
#include <cclite/tcp/socket.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::tcp::detail {

/// The sockets one peer connected, in index order.
struct peer_sockets {
  socket_fd socks[max_nsocks];
  int nsocks = 0;
  std::size_t block = 0;
};

class acceptor {
 public:
  static constexpr auto hello_timeout = std::chrono::seconds(30);
  static constexpr std::size_t max_handshaking = 256;

  /// Starts listening on `at` (port 0 = ephemeral); accepted sockets get
  /// set_socket_options(sockbuf, silent_s). Errors: system_error.
  status listen(const endpoint& at, int sockbuf, int silent_s) {
    auto l = listen_on(at, sockbuf, silent_s);
    if (!l) return l.error();
    auto local = local_endpoint(l->get());
    if (!local) return local.error();
    listener_ = std::move(l.value());
    address_ = local->to_string();
    sockbuf_ = sockbuf;
    silent_s_ = silent_s;
    return {};
  }

  bool listening() const noexcept { return listener_.valid(); }

  /// Closes the listening socket and every connection not yet handed over:
  /// after this rank's communicators failed, a peer connecting to it is
  /// refused or reset (peer_lost) instead of waiting for its deadline.
  void stop() noexcept {
    listener_ = socket_fd();
    handshaking_.clear();
    arrived_.clear();
  }
  /// "addr:port" of the listening socket.
  const std::string& address() const noexcept { return address_; }

  /// Waits until rank `peer` has connected all its sockets with valid hellos
  /// addressed to rank `me` of `size` in the job `job_hash`, and hands them
  /// over. `peer_desc` and `fallback_nsocks` only shape the timeout message.
  /// `still_there()` is asked on every turn (every <= 50 ms) whether waiting
  /// makes sense; its error ends the wait (the peer's listener probe,
  /// transport.hpp). Errors: timeout (naming the peer and our address),
  /// aborted, still_there()'s.
  template <class StillThere>
  result<peer_sockets> wait_for(int peer, int me, int size, std::uint64_t job_hash, deadline until,
                                const std::atomic<bool>* aborted, const std::string& peer_desc,
                                int fallback_nsocks, const logger& log, StillThere&& still_there) {
    auto start = clock::now();
    std::vector<pollfd> fds;
    for (;;) {
      service(me, size, job_hash, log);
      int n = 0, have = 0;
      for (const auto& a : arrived_) {
        if (a.h.from_rank == peer) {
          n = static_cast<int>(a.h.nsocks);
          ++have;
        }
      }
      if (n > 0 && have == n) break;
      if (aborted && aborted->load(std::memory_order_relaxed)) {
        return make_error(errc::aborted, "communicator aborted while waiting for %s to connect over tcp",
                          peer_desc.c_str());
      }
      CCLITE_TRY(still_there());
      if (until.expired()) {
        return make_error(errc::timeout,
                          "timed out after %.1f s waiting for %s to connect to %s over tcp (%d of %d "
                          "sockets arrived); check that it is running and can reach this address "
                          "(CCLITE_SOCKET_IFNAME, firewall)",
                          std::chrono::duration<double>(clock::now() - start).count(),
                          peer_desc.c_str(), address_.c_str(), have, n > 0 ? n : fallback_nsocks);
      }
      fds.clear();
      fds.push_back(pollfd{listener_.get(), POLLIN, 0});
      for (const auto& h : handshaking_) fds.push_back(pollfd{h.fd.get(), POLLIN, 0});
      (void)::poll(fds.data(), static_cast<nfds_t>(fds.size()),
                   static_cast<int>(until.remaining(milliseconds(50)).count()));
    }
    peer_sockets out;
    for (std::size_t i = 0; i < arrived_.size();) {
      if (arrived_[i].h.from_rank != peer) {
        ++i;
        continue;
      }
      out.nsocks = static_cast<int>(arrived_[i].h.nsocks);
      out.block = arrived_[i].h.block;
      out.socks[arrived_[i].h.sock_index] = std::move(arrived_[i].fd);
      arrived_[i] = std::move(arrived_.back());
      arrived_.pop_back();
    }
    return {std::move(out)};  // nvcc: no implicit move into result<T> (CWG1579)
  }

 private:
  struct handshaking {
    socket_fd fd;
    std::string from;  // "addr:port" of the remote end, for WARN lines
    clock::time_point since;
    std::uint8_t buf[hello_bytes] = {};
    std::size_t got = 0;
  };
  struct arrived {
    socket_fd fd;
    hello h;
  };

  // Accepts whatever is pending, reads hellos, moves valid ones to arrived_
  // and closes strangers with one WARN line each.
  void service(int me, int size, std::uint64_t job_hash, const logger& log) {
    for (;;) {
      sockaddr_storage from{};
      socklen_t len = sizeof from;
      int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&from), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          CCLITE_WARN(log, "tcp: accept() on %s failed: %s; will retry", address_.c_str(),
                      errno_text(errno).c_str());
        }
        break;
      }
      // A probe (listener_probe.hpp) that waited in the accept queue has sent
      // its 4 bytes long ago: drop it here, before it counts against the cap.
      char head[4];
      if (::recv(fd, head, sizeof head, MSG_PEEK | MSG_DONTWAIT) == 4 && std::memcmp(head, probe_magic, 4) == 0) {
        ::close(fd);
        continue;
      }
      (void)set_socket_options(fd, sockbuf_, silent_s_);
      if (handshaking_.size() >= max_handshaking) {
        CCLITE_WARN(log, "tcp: more than %zu connections to %s without a hello; closing the one "
                    "from %s", max_handshaking, address_.c_str(), handshaking_.front().from.c_str());
        handshaking_.erase(handshaking_.begin());
      }
      handshaking h;
      h.fd = socket_fd(fd);
      h.from = endpoint::from(from).to_string();
      h.since = clock::now();
      handshaking_.push_back(std::move(h));
    }
    for (std::size_t i = 0; i < handshaking_.size();) {
      handshaking& h = handshaking_[i];
      std::string reason;
      ssize_t r = ::recv(h.fd.get(), h.buf + h.got, hello_bytes - h.got, MSG_DONTWAIT);
      if (r > 0) h.got += static_cast<std::size_t>(r);
      else if (r == 0) reason = "closed before sending a complete hello";
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) reason = errno_text(errno);
      if (h.got >= 4 && std::memcmp(h.buf, probe_magic, 4) == 0) {  // a peer's liveness probe
        handshaking_[i] = std::move(handshaking_.back());
        handshaking_.pop_back();
        continue;
      }
      if (reason.empty() && h.got >= 4 && std::memcmp(h.buf, "CCTC", 4) != 0) {
        reason = reject_reason(decode(h.buf), job_hash, me, size);  // bad magic: no need to wait
      }
      if (reason.empty() && h.got == hello_bytes) {
        hello hh = decode(h.buf);
        reason = reject_reason(hh, job_hash, me, size);
        if (reason.empty()) reason = conflict(hh);
        if (reason.empty()) {
          arrived_.push_back(arrived{std::move(h.fd), hh});
          handshaking_[i] = std::move(handshaking_.back());
          handshaking_.pop_back();
          continue;
        }
      }
      if (reason.empty() && clock::now() - h.since > hello_timeout) {
        reason = "sent no complete hello within 30 s";
      }
      if (!reason.empty()) {
        CCLITE_WARN(log, "tcp: ignoring connection from %s to %s: %s", h.from.c_str(),
                    address_.c_str(), reason.c_str());
        handshaking_[i] = std::move(handshaking_.back());
        handshaking_.pop_back();
        continue;
      }
      ++i;
    }
  }

  // A valid-looking hello that contradicts sockets already received from its rank.
  std::string conflict(const hello& h) const {
    for (const auto& a : arrived_) {
      if (a.h.from_rank != h.from_rank) continue;
      if (a.h.sock_index == h.sock_index) return "duplicate socket index " + std::to_string(h.sock_index);
      if (a.h.nsocks != h.nsocks || a.h.block != h.block) return "nsocks/block differ from its other sockets";
    }
    return {};
  }

  socket_fd listener_;
  std::string address_;
  int sockbuf_ = 0;
  int silent_s_ = default_silent_s;
  std::vector<handshaking> handshaking_;
  std::vector<arrived> arrived_;  // valid hellos whose pair is not connected yet
};

}  // namespace cclite::tcp::detail
CCLITE_SETUP_CODE_END
