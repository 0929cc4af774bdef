// cclite/tcp/store_client.hpp - a rank's connection to the TCP rendezvous store.
//
// store_client implements cclite::store over one TCP connection to a
// store_server (usually hosted by rank 0, see rendezvous.hpp). Calls are
// blocking round trips on a non-blocking socket driven with poll(), so every
// one of them ends by a deadline:
//   - get / wait: the caller's deadline (the server itself answers "timeout"
//     when it passes; the client allows a short grace for the reply);
//   - set / add / check: the op timeout given to connect().
// Every connection (and reconnection) first answers the server's job-token
// challenge (store_auth.hpp); a server that refuses the proof makes connect()
// and every later call fail with errc::bootstrap_error ("store at host:port
// refused this process: wrong job token (CCLITE_RDZV_TOKEN)").
// A server that goes away yields errc::peer_lost ("lost connection to the
// rendezvous store at host:port (rank 0 gone?)"). After any failure in the
// middle of a round trip the connection is closed (its byte stream can no
// longer be trusted) and the next call reconnects once; idempotent calls
// (set, get, wait, check) that find the connection broken retry once on a
// fresh one, add never does.
//
// Plain non-blocking POSIX sockets (store_socket.hpp; no Asio): the client is
// small enough to compile into every program that calls cclite::init().
//
// Thread safety: calls may come from several threads at once; a call that
// finds the connection in use by another thread runs on a spare connection
// of its own (store_pool.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cclite/config.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/store_auth.hpp>
#include <cclite/tcp/store_pool.hpp>
#include <cclite/tcp/store_protocol.hpp>
#include <cclite/tcp/store_socket.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

/// Bound on set / add / check (and on a reconnect) when connect() is not told otherwise.
inline constexpr milliseconds default_store_op_timeout{300000};

class store_client final : public cclite::bounded_store {
 public:
  /// Connects to the store server at host:port (a name, an IPv4 address, or an
  /// IPv6 address with or without brackets), retrying refused and failed
  /// connections with backoff until `until`: ranks usually start before rank 0
  /// has its server up. Sets TCP_NODELAY and proves it knows `token` (the
  /// job token, see store_auth.hpp; open_store() passes CCLITE_RDZV_TOKEN).
  /// `hook`: how to wait for the socket (store_protocol.hpp); set it to
  /// store_server::hook() of a server in this process that has no thread.
  /// Errors: errc::timeout naming the endpoint and the last error when `until`
  /// passes; errc::protocol_error when something else listens on the port;
  /// errc::bootstrap_error when the server refuses the token (not retried).
  static result<std::unique_ptr<store_client>> connect(const std::string& host, std::uint16_t port,
                                                       deadline until,
                                                       milliseconds op_timeout = default_store_op_timeout,
                                                       std::string token = {}, poll_hook hook = {}) {
    std::unique_ptr<store_client> c(new store_client(host, port, op_timeout, hook));
    c->token_ = std::move(token);
    status st = c->connect_until(until);
    if (!st.ok()) return st;
    return {std::move(c)};
  }

  store_client(const store_client&) = delete;
  store_client& operator=(const store_client&) = delete;

  /// "host:port" of the server, as used in messages.
  const std::string& endpoint() const noexcept { return sock_.endpoint(); }

  /// Who hosts the store, as a timeout or a lost connection names it ("is
  /// rank 0 stuck or overloaded?"): "rank 0" unless told otherwise. `owner`
  /// must outlive the client (a string literal). Set it before the client is
  /// shared between threads.
  void set_owner(const char* owner) noexcept {
    owner_ = owner;
    sock_.set_owner(owner);
  }

  // Each call runs on a connection no other thread uses meanwhile (store_pool.hpp).
  status set_within(const std::string& key, const std::string& value, deadline reply_by) override {
    return pool_.run(*this, [&](store_client& c) { return c.set_now(key, value, reply_by); });
  }
  result<std::string> get_within(const std::string& key, deadline until, deadline reply_by) override {
    return pool_.run(*this, [&](store_client& c) { return c.get_now(key, until, reply_by); });
  }
  result<std::int64_t> add_within(const std::string& key, std::int64_t delta, deadline reply_by) override {
    return pool_.run(*this, [&](store_client& c) { return c.add_now(key, delta, reply_by); });
  }
  status wait(const std::vector<std::string>& keys, deadline until) override {
    return pool_.run(*this, [&](store_client& c) { return c.wait_now(keys, until); });
  }
  result<bool> check(const std::string& key) override {
    return pool_.run(*this, [&](store_client& c) { return c.check_now(key); });
  }

 private:
  // Another client of the same server, for a call while this one is in use;
  // its first call connects (call()).
  std::unique_ptr<store_client> spare() {
    std::unique_ptr<store_client> c(new store_client(host_, port_, op_timeout_, hook_));
    c->token_ = token_;
    c->set_owner(owner_);
    return c;
  }

  status set_now(const std::string& key, const std::string& value, deadline reply_by) {
    CCLITE_TRY(check_args(key, value.size()));
    proto::reply_header rh;
    std::string rv;
    CCLITE_TRY(call(proto::op::set, key, value, 0, op_deadline(reply_by), true, rh, rv));
    if (rh.status != proto::reply_status::ok)
      return make_error(errc::resource_exhausted, "store set of key '%s' refused by %s: %s",
                        proto::printable(key).c_str(), endpoint().c_str(), rv.c_str());
    return {};
  }

  result<std::string> get_now(const std::string& key, deadline until, deadline reply_by) {
    CCLITE_TRY(check_args(key, 0));
    auto t0 = clock::now();
    for (;;) {
      proto::reply_header rh;
      std::string rv;
      auto chunk = deadline::min(until, reply_by).remaining(max_wait_chunk);
      CCLITE_TRY(call(proto::op::get, key, {}, static_cast<std::uint32_t>(chunk.count()),
                      deadline::min(reply_by, deadline::after(chunk + grace())), true, rh, rv));
      if (rh.status == proto::reply_status::ok) return rv;
      if (rh.status == proto::reply_status::error) return server_error(key, rv);
      if (until.expired() || reply_by.expired())
        return make_error(errc::timeout,
                          "timed out after %lld ms waiting for key '%s' in the rendezvous store at %s; "
                          "did every rank start, with the same job id and endpoint?",
                          elapsed_ms(t0), proto::printable(key).c_str(), endpoint().c_str());
    }
  }

  result<std::int64_t> add_now(const std::string& key, std::int64_t delta, deadline reply_by) {
    CCLITE_TRY(check_args(key, 8));
    proto::reply_header rh;
    std::string rv;
    CCLITE_TRY(call(proto::op::add, key, proto::i64_bytes(delta), 0, op_deadline(reply_by), false, rh, rv));
    if (rh.status == proto::reply_status::error) return server_error(key, rv);
    if (rh.status != proto::reply_status::ok || rv.size() != 8) return bad_reply("add");
    return proto::get_i64(reinterpret_cast<const std::uint8_t*>(rv.data()));
  }

  status wait_now(const std::vector<std::string>& keys, deadline until) {
    auto t0 = clock::now();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      CCLITE_TRY(check_args(keys[i], 0));
      for (;;) {
        proto::reply_header rh;
        std::string rv;
        auto chunk = until.remaining(max_wait_chunk);
        CCLITE_TRY(call(proto::op::wait, keys[i], {}, static_cast<std::uint32_t>(chunk.count()),
                        deadline::after(chunk + grace()), true, rh, rv));
        if (rh.status == proto::reply_status::ok) break;
        if (rh.status == proto::reply_status::error) return server_error(keys[i], rv);
        if (until.expired()) return wait_timeout(keys, i, t0);
      }
    }
    return {};
  }

  result<bool> check_now(const std::string& key) {
    CCLITE_TRY(check_args(key, 0));
    proto::reply_header rh;
    std::string rv;
    CCLITE_TRY(call(proto::op::check, key, {}, 0, deadline::after(op_timeout_), true, rh, rv));
    if (rh.status == proto::reply_status::error) return server_error(key, rv);
    if (rh.status != proto::reply_status::ok || rv.size() != 1) return bad_reply("check");
    return rv[0] != 0;
  }

  // Server-side waits are cut into chunks so that a lost reply or a wedged
  // server is noticed without waiting out a long (or never-ending) deadline.
  static constexpr milliseconds max_wait_chunk{30000};

  store_client(const std::string& host, std::uint16_t port, milliseconds op_timeout, poll_hook hook)
      : sock_(host, port, "rank 0", hook), op_timeout_(op_timeout), host_(host), port_(port), hook_(hook) {}

  milliseconds grace() const { return std::min(op_timeout_, milliseconds(30000)); }
  deadline op_deadline(deadline reply_by) const { return deadline::min(reply_by, deadline::after(op_timeout_)); }
  static long long elapsed_ms(clock::time_point t0) { return detail::elapsed_ms(t0); }

  static status check_args(const std::string& key, std::size_t value_len) {
    return check_store_sizes(key, value_len);
  }

  status server_error(const std::string& key, const std::string& msg) const {
    return make_error(errc::invalid_argument, "rendezvous store at %s rejected key '%s': %s",
                      endpoint().c_str(), proto::printable(key).c_str(), proto::printable(msg, 400).c_str());
  }
  status bad_reply(const char* what) {
    close();
    return make_error(errc::protocol_error, "malformed %s reply from the rendezvous store at %s", what,
                      endpoint().c_str());
  }

  status wait_timeout(const std::vector<std::string>& keys, std::size_t first_missing, clock::time_point t0) {
    std::string missing;
    std::size_t n = 0;
    for (std::size_t i = first_missing; i < keys.size(); ++i) {
      bool has = false;
      if (i > first_missing) {
        auto r = check_now(keys[i]);
        has = r.ok() && r.value();
      }
      if (has) continue;
      if (++n <= 8) missing += (missing.empty() ? "'" : ", '") + proto::printable(keys[i], 80) + "'";
    }
    if (n > 8) missing += ", ...";
    return make_error(
        errc::timeout,
        "timed out after %lld ms waiting for %zu of %zu keys (%s) in the rendezvous store at %s; "
        "did every rank start, with the same job id and endpoint?",
        elapsed_ms(t0), n, keys.size(), missing.c_str(), endpoint().c_str());
  }

  void close() { sock_.close(); }

  static status greeter(void* me, deadline until) { return static_cast<store_client*>(me)->handshake(until); }

  // One connection attempt over every address, with the job-token handshake.
  bool connect_once(deadline until, std::string& why) {
    return sock_.connect_once(until, deadline::min(until, deadline::after(op_timeout_)), why, fatal_, greeter, this);
  }

  // The job-token handshake on a freshly connected socket (store_protocol.hpp).
  status handshake(deadline until) {
    std::uint8_t ch[proto::auth_frame_bytes];
    CCLITE_TRY(io(false, reinterpret_cast<char*>(ch), sizeof ch, until, "the job-token handshake", nullptr));
    proto::auth_frame f;
    if (const char* bad = proto::decode_auth(ch, sizeof ch, proto::auth_kind::challenge, f))
      return make_error(errc::protocol_error,
                        "the server at %s does not speak the cclite store protocol (%s); is "
                        "CCLITE_RDZV_ENDPOINT (or MASTER_ADDR:MASTER_PORT) pointing at another service?",
                        endpoint().c_str(), bad);
    proto::auth_frame proof;
    proof.kind = proto::auth_kind::proof;
    proof.payload = proto::auth_proof(token_, f.payload);
    auto pb = proto::encode(proof);
    CCLITE_TRY(io(true, reinterpret_cast<char*>(pb.data()), pb.size(), until, "the job-token handshake", nullptr));
    std::uint8_t rb[proto::reply_header_bytes];
    CCLITE_TRY(io(false, reinterpret_cast<char*>(rb), sizeof rb, until, "the job-token handshake", nullptr));
    proto::reply_header rh;
    const char* bad = proto::decode(rb, rh);
    if (!bad && rh.status == proto::reply_status::refused) {
      std::string reason(rh.value_len, '\0');
      if (rh.value_len)
        CCLITE_TRY(io(false, &reason[0], reason.size(), until, "the job-token handshake", nullptr));
      return make_error(errc::bootstrap_error,
                        "store at %s refused this process: %s (CCLITE_RDZV_TOKEN); every rank of a job must "
                        "have the same token (cclite-run derives it from --rdzv-id); is this rank in another "
                        "job, or started by hand without the job's token?",
                        endpoint().c_str(), proto::printable(reason, 200).c_str());
    }
    if (!bad && (rh.status != proto::reply_status::ok || rh.value_len != 0)) bad = "unexpected handshake reply";
    if (bad)
      return make_error(errc::protocol_error, "bad handshake reply from the rendezvous store at %s: %s",
                        endpoint().c_str(), bad);
    return {};
  }

  // Connects and completes the handshake, retrying until `until`: refused
  // while rank 0 is still starting, or closed at once by a server at its
  // connection cap, are both worth retrying; a wrong token is not.
  status connect_until(deadline until) {
    return sock_.connect_until(until, op_timeout_, fatal_, greeter, this, "the rendezvous store",
                               "is rank 0 running, and do all ranks use the same CCLITE_RDZV_ENDPOINT (or "
                               "MASTER_ADDR:MASTER_PORT)?");
  }

  // A round trip, reconnecting first if an earlier call broke the connection.
  // An idempotent op that finds the connection dead retries once.
  status call(proto::op o, const std::string& key, const std::string& value, std::uint32_t wait_ms,
              deadline until, bool idempotent, proto::reply_header& rh, std::string& rv) {
    for (int attempt = 0;; ++attempt) {
      if (!sock_.is_open()) {
        std::string why;
        if (!connect_once(deadline::min(until, deadline::after(op_timeout_)), why)) {
          if (!fatal_.ok()) return fatal_;
          return make_error(errc::peer_lost,
                            "lost connection to the rendezvous store at %s (rank 0 gone?): %s",
                            endpoint().c_str(), why.c_str());
        }
      }
      status st = exchange(o, key, value, wait_ms, until, rh, rv);
      if (st.ok() || st.code() != errc::peer_lost || !idempotent || attempt > 0) return st;
    }
  }

  status exchange(proto::op o, const std::string& key, const std::string& value, std::uint32_t wait_ms,
                  deadline until, proto::reply_header& rh, std::string& rv) {
    proto::request_header h;
    h.code = o;
    h.key_len = static_cast<std::uint32_t>(key.size());
    h.value_len = static_cast<std::uint32_t>(value.size());
    h.wait_ms = wait_ms;
    auto hb = proto::encode(h);
    std::string head(reinterpret_cast<const char*>(hb.data()), hb.size());
    head += key;
    const char* on = proto::to_string(o);
    CCLITE_TRY(io(true, &head[0], head.size(), until, on, &key));
    if (!value.empty()) CCLITE_TRY(io(true, const_cast<char*>(value.data()), value.size(), until, on, &key));
    std::uint8_t rb[proto::reply_header_bytes];
    CCLITE_TRY(io(false, reinterpret_cast<char*>(rb), sizeof rb, until, on, &key));
    if (const char* bad = proto::decode(rb, rh)) {
      close();
      return make_error(errc::protocol_error, "bad reply from the rendezvous store at %s: %s",
                        endpoint().c_str(), bad);
    }
    rv.assign(rh.value_len, '\0');
    if (rh.value_len) CCLITE_TRY(io(false, &rv[0], rv.size(), until, on, &key));
    return {};
  }

  // Moves all `n` bytes or fails (store_socket::io). `what` and `key`
  // (nullptr: none) only feed the messages.
  status io(bool write, char* p, std::size_t n, deadline until, const char* what, const std::string* key) {
    return sock_.io(write, p, n, until,
                    key ? std::string(what) + " of key '" + proto::printable(*key) + "'" : std::string(what));
  }

  detail::store_socket sock_;
  milliseconds op_timeout_;
  std::string token_;
  status fatal_;  // a refusal that makes retrying pointless; sticky
  // What a spare client is made with (spare()).
  std::string host_;
  std::uint16_t port_ = 0;
  poll_hook hook_;
  const char* owner_ = "rank 0";
  detail::connection_pool pool_{[](cclite::store& self) -> std::unique_ptr<cclite::store> {
    return static_cast<store_client&>(self).spare();
  }};
};

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
