// cclite/tcp/detail/store_session_ops.hpp - what a store_server session does
// with a request: the store ops (set, add, check, get, wait), a parked get or
// wait, and writing the reply. Not a public header.
//
// Definitions of store_server::session's private answering side, declared in
// store_session.hpp, which includes this header (including this one first
// works too). A get or wait on a missing key parks the session in the
// server's waiters_ until the key is set (key_ready()), its wait_ms runs out
// (on_timers()) or the client leaves (watch_disconnect()).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/tcp/detail/store_session.hpp>
#include <cclite/tcp/store_protocol.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

// --- operations ------------------------------------------------------------
inline void store_server::session::dispatch() {
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

// --- parked get/wait -------------------------------------------------------
inline void store_server::session::watch_disconnect() {
  char b;
  long n = ::recv(fd_, &b, 1, MSG_PEEK);
  int err = detail::errno_of_io(n);
  if (n < 0 && (err == EINTR || err == EAGAIN || err == EWOULDBLOCK)) return;
  close(n > 0 ? "sent a request while its get/wait was pending" : nullptr);
}

inline void store_server::session::answer_present() {
  auto it = srv_.data_.find(key_);
  if (it == srv_.data_.end()) return reply(proto::reply_status::timeout, {});
  if (req_.code == proto::op::get) return reply(proto::reply_status::ok, it->second);
  reply(proto::reply_status::ok, {});
}

// --- replies ---------------------------------------------------------------
inline void store_server::session::reply_error(std::string msg, proto::reply_status st) {
  if (msg.size() > proto::max_error_bytes) msg.resize(proto::max_error_bytes);
  reply(st, std::make_shared<const std::string>(std::move(msg)));
}

inline void store_server::session::reply(proto::reply_status st, value_ptr value) {
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
inline void store_server::session::flush() {
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

inline void store_server::session::arm_idle(std::chrono::milliseconds d) {
  idle_len_ = d;
  idle_at_ = d.count() <= 0 ? time_point::max() : clock::now() + d;
}

// Strict decimal int64 (what add stores); false for anything else.
inline bool store_server::session::parse_i64(const std::string& s, std::int64_t& out) {
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

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
