// cclite/tcp/detail/store_session.hpp - one store_server connection's state
// machine: the job-token handshake, framing, the store ops and their replies.
// Included by store_server.hpp; not a public header (the server's own loop,
// accept and start: store_server_impl.hpp).
//
// Everything here runs on the serving thread (the background thread, or the
// caller of progress()). A closed session stays in sessions_ (its fd closed,
// out of every waiter list) until the end of the step that closed it, so raw
// session pointers held during a step stay valid.
//
// The session's private functions live in detail/store_session_requests.hpp
// (reading: handshake, request frames) and detail/store_session_ops.hpp
// (answering: the store ops, parked get/wait, replies), included after it.
#pragma once

#include <cclite/config.hpp>
#include <cclite/tcp/store_server.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

namespace detail {
inline int errno_of_io(long n) { return n == 0 ? 0 : errno; }
inline std::string sockaddr_text(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    ::inet_ntop(AF_INET6, &a.sin6_addr, buf, sizeof buf);
    port = ntohs(a.sin6_port);
    return "[" + std::string(buf) + "]:" + std::to_string(port);
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  port = ntohs(a.sin_port);
  return std::string(buf) + ":" + std::to_string(port);
}
}  // namespace detail

struct store_server::session {
  enum class phase { handshake, between_frames, mid_frame, waiting, writing };
  using time_point = clock::time_point;

  session(store_server& srv, int fd, std::string peer) : srv_(srv), fd_(fd), peer_(std::move(peer)) {}
  ~session() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// Sends the challenge and waits for the proof (store_protocol.hpp); only a
  /// connection that passes reads requests. The whole handshake must finish
  /// within idle_timeout, so a silent or trickling stranger is dropped.
  void start() {
    proto::auth_frame ch;
    if (status st = proto::make_nonce(ch.payload); !st.ok()) {
      srv_.log("%s", st.message().c_str());
      return close(nullptr);
    }
    nonce_ = ch.payload;
    auto b = proto::encode(ch);
    std::memcpy(head_.data(), b.data(), b.size());
    head_len_ = b.size();
    head_off_ = 0;
    arm_idle(srv_.opts_.idle_timeout);
    flush();
  }

  bool closed() const { return fd_ < 0; }
  int fd() const { return fd_; }
  bool writing() const { return head_off_ < head_len_ || reply_value_ != nullptr; }
  short events() const {
    short out = writing() ? POLLOUT : 0;
    if (phase_ == phase::handshake) return out | (auth_got_ < auth_in_.size() ? POLLIN : 0);
    return out ? out : POLLIN;
  }
  time_point next_timer() const { return std::min(idle_at_, waiting_ ? wait_at_ : time_point::max()); }

  void on_ready(short revents) {
    if (closed()) return;
    if ((revents & (POLLOUT | POLLERR | POLLHUP)) && writing()) flush();
    if (closed() || (writing() && phase_ != phase::handshake)) return;
    if (revents & (POLLIN | POLLERR | POLLHUP)) {
      if (phase_ == phase::handshake) return read_proof();
      if (phase_ == phase::waiting) return watch_disconnect();
      read_request();
    }
  }

  void on_timers(time_point now) {
    if (closed()) return;
    if (waiting_ && now >= wait_at_) {
      waiting_ = false;
      wait_at_ = time_point::max();
      srv_.remove_waiter(key_, this);
      return reply(proto::reply_status::timeout, {});
    }
    if (now < idle_at_) return;
    char why[160];
    long long ms = static_cast<long long>(idle_len_.count());
    if (phase_ == phase::handshake)
      std::snprintf(why, sizeof why, "did not complete the job-token handshake within %lld ms", ms);
    else if (phase_ == phase::writing)
      std::snprintf(why, sizeof why, "did not read its reply for %lld ms", ms);
    else if (phase_ == phase::mid_frame)
      std::snprintf(why, sizeof why, "stalled for %lld ms mid-frame (%zu of %zu bytes)", ms,
                    hdr_got_ + body_.size(), hdr_got_ < hdr_.size() ? hdr_.size() : hdr_.size() + body_total_);
    else if (!established_)
      std::snprintf(why, sizeof why, "sent no request for %lld ms after connecting", ms);
    else
      std::snprintf(why, sizeof why, "idle for %lld ms", ms);
    close(why);
  }

  /// Closes the connection. `why` != nullptr: a protocol violation or timeout,
  /// logged as "dropped client <peer>: <why>".
  void close(const char* why) {
    if (closed()) return;
    if (why) {
      srv_.n_dropped_.fetch_add(1);
      srv_.log("dropped client %s: %s", peer_.c_str(), why);
    }
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    fd_ = -1;
    if (waiting_) srv_.remove_waiter(key_, this);
    waiting_ = false;
    reply_value_.reset();
    --srv_.open_;
    srv_.n_conn_.store(srv_.open_);
  }

  /// The key this session waits for was set.
  void key_ready() {
    if (closed() || !waiting_) return;
    waiting_ = false;
    wait_at_ = time_point::max();
    answer_present();
  }

 private:
  // Reading (store_session_requests.hpp).
  void read_proof();
  void check_proof();
  void refuse();
  void read_header();
  void read_request();
  void read_failed(int err);

  // Answering (store_session_ops.hpp).
  void dispatch();
  void watch_disconnect();
  void answer_present();
  void reply_error(std::string msg, proto::reply_status st = proto::reply_status::error);
  void reply(proto::reply_status st, value_ptr value);
  void flush();
  void arm_idle(std::chrono::milliseconds d);
  static bool parse_i64(const std::string& s, std::int64_t& out);

  store_server& srv_;
  int fd_;
  std::string peer_;
  phase phase_ = phase::handshake;
  bool established_ = false, waiting_ = false, refusing_ = false, proof_in_ = false;
  time_point idle_at_ = time_point::max(), wait_at_ = time_point::max();
  std::chrono::milliseconds idle_len_{0};
  std::array<std::uint8_t, proto::nonce_bytes> nonce_{}, proof_{};
  std::array<std::uint8_t, proto::auth_frame_bytes> auth_in_{};
  std::size_t auth_got_ = 0;
  std::array<std::uint8_t, proto::request_header_bytes> hdr_{};
  std::size_t hdr_got_ = 0;
  proto::request_header req_;
  std::string body_;
  std::size_t body_total_ = 0;
  std::string key_;
  std::array<std::uint8_t, proto::auth_frame_bytes> head_{};  // challenge or reply header being written
  std::size_t head_len_ = 0, head_off_ = 0;
  value_ptr reply_value_;
  std::size_t value_off_ = 0;
};

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END

// The private functions' definitions, in the order they had inside the struct:
// that order decides the layout of the emitted code, which stays as it was.
#include <cclite/tcp/detail/store_session_requests.hpp>
#include <cclite/tcp/detail/store_session_ops.hpp>

// The server's own functions need the session complete: they come after it,
// whichever of the three headers a TU includes first.
#include <cclite/tcp/detail/store_server_impl.hpp>
