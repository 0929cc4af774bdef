// cclite/tcp/detail/store_session.hpp - one store_server connection's state
// machine: the job-token handshake, framing, the store ops and their replies.
// Included by store_server.hpp; not a public header (the server's own loop,
// accept and start: store_server_impl.hpp).
//
// Everything here runs on the serving thread (the background thread, or the
// caller of progress()). A closed session stays in sessions_ (its fd closed,
// out of every waiter list) until the end of the step that closed it, so raw
// session pointers held during a step stay valid.
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
  // --- handshake -------------------------------------------------------------
  void read_proof() {
    while (auth_got_ < auth_in_.size()) {
      long n = ::recv(fd_, auth_in_.data() + auth_got_, auth_in_.size() - auth_got_, 0);
      if (n > 0) {
        auth_got_ += static_cast<std::size_t>(n);
        continue;
      }
      int err = detail::errno_of_io(n);
      if (n < 0 && err == EINTR) continue;
      if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return;
      // Connect-and-leave (a port probe, an idle client going away): not worth a line.
      if (auth_got_ == 0 && (n == 0 || err == ECONNRESET)) return close(nullptr);
      char why[160];
      std::snprintf(why, sizeof why, "truncated handshake (%s after %zu of %zu bytes)",
                    n == 0 ? "closed" : std::strerror(err), auth_got_, auth_in_.size());
      return close(why);
    }
    proto::auth_frame proof;
    if (const char* bad = proto::decode_auth(auth_in_.data(), auth_in_.size(), proto::auth_kind::proof, proof)) {
      char why[200];
      std::snprintf(why, sizeof why, "not a cclite store client (%s; first bytes %02x %02x %02x %02x)", bad,
                    auth_in_[0], auth_in_[1], auth_in_[2], auth_in_[3]);
      return close(why);
    }
    proof_ = proof.payload;
    proof_in_ = true;
    // One reply at a time: a (necessarily bogus) proof that beats the
    // challenge out is checked once the challenge is sent.
    if (head_off_ == head_len_) check_proof();
  }

  void check_proof() {
    proof_in_ = false;
    if (!proto::auth_ok(srv_.opts_.token, nonce_, proof_)) return refuse();
    reply(proto::reply_status::ok, {});  // then read_header()
  }

  // Wrong token: tell the client why (so it can fail with a clear message
  // instead of retrying), then close once the reply is out.
  void refuse() {
    srv_.n_auth_failed_.fetch_add(1);
    srv_.n_dropped_.fetch_add(1);
    srv_.log("refused client %s: wrong job token (its proof does not match this store's CCLITE_RDZV_TOKEN; "
             "another job, or a rank started without the job's token?)",
             peer_.c_str());
    refusing_ = true;
    reply_error(proto::wrong_token_reason, proto::reply_status::refused);
  }

  // --- requests --------------------------------------------------------------
  void read_header() {
    phase_ = phase::between_frames;
    hdr_got_ = 0;
    body_.clear();
    body_total_ = 0;
    arm_idle(established_ ? srv_.opts_.established_idle_timeout : srv_.opts_.idle_timeout);
  }

  void read_request() {
    for (;;) {
      char* p;
      std::size_t want;
      if (hdr_got_ < hdr_.size()) {
        p = reinterpret_cast<char*>(hdr_.data()) + hdr_got_;
        want = hdr_.size() - hdr_got_;
      } else {
        if (body_.size() == body_total_) return dispatch();
        std::size_t old = body_.size();
        want = std::min<std::size_t>(body_total_ - old, 64 << 10);
        // Capacity follows the bytes received (doubling), capped by the
        // validated length: a header announcing 64 MiB then silence costs 64 KiB.
        if (old + want > body_.capacity())
          body_.reserve(std::min(body_total_, std::max(old + want, 2 * body_.capacity())));
        body_.resize(old + want);
        p = &body_[old];
      }
      long n = ::recv(fd_, p, want, 0);
      int err = detail::errno_of_io(n);
      if (hdr_got_ == hdr_.size()) body_.resize(body_.size() - want + static_cast<std::size_t>(n > 0 ? n : 0));
      if (n < 0 && err == EINTR) continue;
      if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return;
      if (n <= 0) return read_failed(err);
      phase_ = phase::mid_frame;
      arm_idle(srv_.opts_.idle_timeout);
      if (hdr_got_ < hdr_.size()) {
        hdr_got_ += static_cast<std::size_t>(n);
        if (hdr_got_ < hdr_.size()) continue;
        if (const char* bad = proto::decode(hdr_.data(), req_)) return close(bad);
        body_total_ = std::size_t(req_.key_len) + req_.value_len;
      }
    }
  }

  void read_failed(int err) {
    if (phase_ == phase::between_frames && hdr_got_ == 0) return close(nullptr);  // clean goodbye
    char why[160];
    std::size_t got = hdr_got_ + body_.size(), want = hdr_.size() + body_total_;
    if (hdr_got_ < hdr_.size()) want = hdr_.size();
    std::snprintf(why, sizeof why, "truncated frame (%s after %zu of %zu bytes)",
                  err == 0 ? "closed" : std::strerror(err), got, want);
    close(why);
  }

  void dispatch() {
    arm_idle(std::chrono::milliseconds(0));
    established_ = true;
    key_.assign(body_, 0, req_.key_len);
    auto& data = srv_.data_;
    switch (req_.code) {
      case proto::op::set: {
        body_.erase(0, req_.key_len);
        auto v = std::make_shared<const std::string>(std::move(body_));
        body_ = std::string();
        std::size_t old = 0;
        auto it = data.find(key_);
        if (it != data.end()) old = it->second->size() + key_.size();
        std::size_t next = srv_.data_bytes_ - old + key_.size() + v->size();
        if (next > srv_.opts_.max_total_bytes) {
          return reply_error("store full: server_options::max_total_bytes (" +
                             std::to_string(srv_.opts_.max_total_bytes) + ") reached");
        }
        srv_.data_bytes_ = next;
        data[key_] = std::move(v);
        reply(proto::reply_status::ok, {});
        return srv_.wake(key_);
      }
      case proto::op::add: {
        std::int64_t delta = proto::get_i64(reinterpret_cast<const std::uint8_t*>(&body_[req_.key_len]));
        body_.clear();
        std::int64_t cur = 0;
        std::size_t old = 0;
        auto it = data.find(key_);
        if (it != data.end()) {
          old = it->second->size() + key_.size();
          if (!parse_i64(*it->second, cur))
            return reply_error("add on key '" + proto::printable(key_) + "' whose value is not an integer");
        }
        std::int64_t next = 0;
        if (__builtin_add_overflow(cur, delta, &next))
          return reply_error("add on key '" + proto::printable(key_) + "' overflows int64");
        auto v = std::make_shared<const std::string>(std::to_string(next));
        srv_.data_bytes_ = srv_.data_bytes_ - old + key_.size() + v->size();
        data[key_] = std::move(v);
        reply(proto::reply_status::ok, std::make_shared<const std::string>(proto::i64_bytes(next)));
        return srv_.wake(key_);
      }
      case proto::op::check:
        return reply(proto::reply_status::ok,
                     std::make_shared<const std::string>(1, data.count(key_) ? '\1' : '\0'));
      case proto::op::get:
      case proto::op::wait:
        if (data.count(key_)) return answer_present();
        if (req_.wait_ms == 0) return reply(proto::reply_status::timeout, {});
        // Parked: POLLIN now means the client left (or broke the protocol by
        // sending before its reply), see watch_disconnect.
        phase_ = phase::waiting;
        waiting_ = true;
        wait_at_ = clock::now() + std::chrono::milliseconds(req_.wait_ms);
        srv_.waiters_[key_].push_back(this);
        return;
    }
  }

  void watch_disconnect() {
    char b;
    long n = ::recv(fd_, &b, 1, MSG_PEEK);
    int err = detail::errno_of_io(n);
    if (n < 0 && (err == EINTR || err == EAGAIN || err == EWOULDBLOCK)) return;
    close(n > 0 ? "sent a request while its get/wait was pending" : nullptr);
  }

  void answer_present() {
    auto it = srv_.data_.find(key_);
    if (it == srv_.data_.end()) return reply(proto::reply_status::timeout, {});
    if (req_.code == proto::op::get) return reply(proto::reply_status::ok, it->second);
    reply(proto::reply_status::ok, {});
  }

  void reply_error(std::string msg, proto::reply_status st = proto::reply_status::error) {
    if (msg.size() > proto::max_error_bytes) msg.resize(proto::max_error_bytes);
    reply(st, std::make_shared<const std::string>(std::move(msg)));
  }

  void reply(proto::reply_status st, value_ptr value) {
    phase_ = phase::writing;
    reply_value_ = std::move(value);
    if (reply_value_ && reply_value_->empty()) reply_value_.reset();
    proto::reply_header h;
    h.status = st;
    h.value_len = reply_value_ ? static_cast<std::uint32_t>(reply_value_->size()) : 0;
    auto b = proto::encode(h);
    std::memcpy(head_.data(), b.data(), b.size());
    head_len_ = b.size();
    head_off_ = 0;
    value_off_ = 0;
    arm_idle(srv_.opts_.idle_timeout);
    flush();
  }

  // Writes what the socket takes of head_ and reply_value_; when all is out,
  // moves on (handshake: check the proof if it came; otherwise read the next
  // request, or close after a refusal).
  void flush() {
    while (head_off_ < head_len_ || reply_value_) {
      iovec iov[2];
      int k = 0;
      if (head_off_ < head_len_) iov[k++] = {head_.data() + head_off_, head_len_ - head_off_};
      if (reply_value_)
        iov[k++] = {const_cast<char*>(reply_value_->data()) + value_off_, reply_value_->size() - value_off_};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<decltype(m.msg_iovlen)>(k);
      long n = ::sendmsg(fd_, &m, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return close(nullptr);  // went away before its reply
      }
      std::size_t left = static_cast<std::size_t>(n);
      std::size_t h = std::min(left, head_len_ - head_off_);
      head_off_ += h;
      left -= h;
      if (reply_value_) {
        value_off_ += left;
        if (value_off_ == reply_value_->size()) reply_value_.reset();
      }
    }
    if (phase_ == phase::handshake) {
      if (proof_in_) check_proof();
      return;
    }
    if (refusing_) return close(nullptr);  // refused (already logged)
    read_header();
  }

  void arm_idle(std::chrono::milliseconds d) {
    idle_len_ = d;
    idle_at_ = d.count() <= 0 ? time_point::max() : clock::now() + d;
  }

  // Strict decimal int64 (what add stores); false for anything else.
  static bool parse_i64(const std::string& s, std::int64_t& out) {
    if (s.empty() || s.size() > 20) return false;
    bool neg = s[0] == '-';
    std::size_t i = (neg || s[0] == '+') ? 1 : 0;
    if (i == s.size()) return false;
    std::uint64_t mag = 0;
    for (; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      if (__builtin_mul_overflow(mag, 10u, &mag) || __builtin_add_overflow(mag, unsigned(s[i] - '0'), &mag))
        return false;
    }
    const std::uint64_t limit = neg ? (std::uint64_t(1) << 63) : (std::uint64_t(1) << 63) - 1;
    if (mag > limit) return false;
    out = neg ? static_cast<std::int64_t>(0 - mag) : static_cast<std::int64_t>(mag);
    return true;
  }

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

// The server's own functions need the session complete: they come after it,
// whichever of the three headers a TU includes first.
#include <cclite/tcp/detail/store_server_impl.hpp>
