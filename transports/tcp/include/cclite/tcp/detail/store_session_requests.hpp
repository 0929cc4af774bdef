// cclite/tcp/detail/store_session_requests.hpp - what a store_server session
// reads: the job-token handshake, then request frames. Not a public header.
//
// Definitions of store_server::session's private reading side, declared in
// store_session.hpp, which includes this header (including this one first
// works too). Reading stays bounded: the proof is checked before any request
// is read, a request header is validated (proto::decode) before any body byte
// is read, and the body buffer grows with the bytes that arrive, not with the
// length a header announces.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include <cclite/config.hpp>
#include <cclite/tcp/detail/store_session.hpp>
#include <cclite/tcp/store_auth.hpp>
#include <cclite/tcp/store_protocol.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

// --- handshake -------------------------------------------------------------
inline void store_server::session::read_proof() {
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

inline void store_server::session::check_proof() {
  proof_in_ = false;
  if (!proto::auth_ok(srv_.opts_.token, nonce_, proof_)) return refuse();
  reply(proto::reply_status::ok, {});  // then read_header()
}

// Wrong token: tell the client why (so it can fail with a clear message
// instead of retrying), then close once the reply is out.
inline void store_server::session::refuse() {
  srv_.n_auth_failed_.fetch_add(1);
  srv_.n_dropped_.fetch_add(1);
  srv_.log("refused client %s: wrong job token (its proof does not match this store's CCLITE_RDZV_TOKEN; "
           "another job, or a rank started without the job's token?)",
           peer_.c_str());
  refusing_ = true;
  reply_error(proto::wrong_token_reason, proto::reply_status::refused);
}

// --- requests --------------------------------------------------------------
inline void store_server::session::read_header() {
  phase_ = phase::between_frames;
  hdr_got_ = 0;
  body_.clear();
  body_total_ = 0;
  arm_idle(established_ ? srv_.opts_.established_idle_timeout : srv_.opts_.idle_timeout);
}

inline void store_server::session::read_request() {
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

inline void store_server::session::read_failed(int err) {
  if (phase_ == phase::between_frames && hdr_got_ == 0) return close(nullptr);  // clean goodbye
  char why[160];
  std::size_t got = hdr_got_ + body_.size(), want = hdr_.size() + body_total_;
  if (hdr_got_ < hdr_.size()) want = hdr_.size();
  std::snprintf(why, sizeof why, "truncated frame (%s after %zu of %zu bytes)",
                err == 0 ? "closed" : std::strerror(err), got, want);
  close(why);
}

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
