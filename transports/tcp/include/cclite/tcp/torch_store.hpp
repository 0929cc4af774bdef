// cclite/tcp/torch_store.hpp - a client of PyTorch's c10d TCPStore.
//
// Under torchrun the agent of the first node hosts a c10d TCPStore at
// MASTER_ADDR:MASTER_PORT and tells its workers so with
// TORCHELASTIC_USE_AGENT_STORE=True: the workers are that store's clients, and
// none of them can bind the port (rank 0 hosting cclite's own store there fails
// with "Address already in use"). torch_store_client implements cclite::store
// over that store's wire protocol, so the ranks of a cclite program meet there
// as torch's own ranks would; the store outlives any worker, as torchrun's does.
//
// Wire (c10d TCPStore). A query is one byte of type, then its arguments; a
// string or a byte vector is a u64 length then the bytes. torch sends integers
// in its host's byte order; this client writes and reads them little-endian,
// that order on every host torch runs on (x86-64, aarch64):
//
//   query     torch 1.x  torch 2.x  arguments               reply
//   validate  -          0          u32 0x3C85F7CE          none (2.x: first)
//   set       0          1          key, value              none
//   get       2          3          key (present: wait 1st) value
//   add       3          4          key, i64 delta          i64 new value
//   check     4          5          u64 n, n keys           u8 0 ready, 1 not
//   wait      5          6          u64 n, n keys           u8 0 once all exist
//
// The server's wait has no time limit: the client polls with the caller's
// deadline and, when it passes, drops the connection (the server forgets the
// waiter) and reconnects at the next call. `add` stores decimal text, as
// cclite::store's contract says.
//
// Dialect. torch 2.0 put `validate` first and moved every other type by one,
// and its servers ignore a connection's first query unless it is `validate`.
// The first connection sends one query that torch 1.x reads as check(n = 1,
// key "\0") and 2.x as add(key "\x01", delta 0), 18 bytes:
//   04 | 01 00 00 00 00 00 00 00 | 01 00 00 00 00 00 00 00 | 00
// and the first byte of the reply names the dialect: 1 (1.x: not ready) or 0
// (2.x: the value 0). torch 2.x's classic server (2.0-2.3; later ones with
// USE_LIBUV=0, as tests/netns/torchrun_torch2.sh runs 2.6) closes the
// connection instead (2.x too), and 2.4's libuv server keeps the bytes until
// more arrive, so each 100 ms without a reply adds a query every dialect
// answers harmlessly (probe()). The probe's connection is then replaced by a
// fresh one. CCLITE_TORCH_STORE_PROTOCOL=1 or 2 skips the probe. A cclite
// store at that port (its 40-byte challenge) is named as such.
//
// Thread safety: calls may come from several threads at once; a call that
// finds the connection in use by another thread runs on a spare connection
// of its own (store_pool.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cclite/config.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/bytes.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/tcp/store_pool.hpp>
#include <cclite/tcp/store_socket.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

class torch_store_client final : public cclite::bounded_store {
 public:
  /// Which numbering of query types the server speaks (header comment).
  enum class dialect : std::uint8_t { unknown = 0, torch1 = 1, torch2 = 2 };

  /// Connects to the c10d TCPStore at host:port, retrying refused connections
  /// with backoff until `until` (workers may start before the agent's store
  /// listens), and finds the dialect unless `d` names it. Every key this client
  /// reads or writes is `key_prefix` + key, so a cclite job keeps to its own
  /// part of a store that torch's agent also uses. On the wire a key starts
  /// with '/', as torch's own client sends it: torch code that opens the same
  /// store sees these keys under the same names.
  static result<std::unique_ptr<torch_store_client>> connect(const std::string& host, std::uint16_t port,
                                                             deadline until, milliseconds op_timeout,
                                                             std::string key_prefix, dialect d = dialect::unknown) {
    std::unique_ptr<torch_store_client> c(new torch_store_client(host, port, op_timeout, std::move(key_prefix), d));
    CCLITE_TRY(c->sock_.connect_until(until, op_timeout, c->fatal_, greeter, c.get(), "torchrun's store",
                                      "is the agent of the first node running, and is MASTER_ADDR:MASTER_PORT "
                                      "reachable from here?"));
    return {std::move(c)};
  }

  /// "host:port" of the store.
  const std::string& endpoint() const noexcept { return sock_.endpoint(); }
  /// The dialect found (or given).
  dialect protocol() const noexcept { return dialect_; }

  // Each call runs on a connection no other thread uses meanwhile (store_pool.hpp).
  status set_within(const std::string& key, const std::string& value, deadline reply_by) override {
    return pool_.run(*this, [&](torch_store_client& c) { return c.set_now(key, value, reply_by); });
  }
  result<std::string> get_within(const std::string& key, deadline until, deadline reply_by) override {
    return pool_.run(*this, [&](torch_store_client& c) { return c.get_now(key, until, reply_by); });
  }
  result<std::int64_t> add_within(const std::string& key, std::int64_t delta, deadline reply_by) override {
    return pool_.run(*this, [&](torch_store_client& c) { return c.add_now(key, delta, reply_by); });
  }
  status wait(const std::vector<std::string>& keys, deadline until) override {
    return pool_.run(*this, [&](torch_store_client& c) { return c.wait_now(keys, until); });
  }
  result<bool> check(const std::string& key) override {
    return pool_.run(*this, [&](torch_store_client& c) { return c.check_within(key, deadline::never()); });
  }

 private:
  // Another client of the same store, for a call while this one is in use
  // (the dialect is known by now); its first call connects (round_trip()).
  std::unique_ptr<torch_store_client> spare() {
    return std::unique_ptr<torch_store_client>(
        new torch_store_client(host_, port_, op_timeout_, prefix_.substr(1), dialect_));
  }

  status set_now(const std::string& key, const std::string& value, deadline reply_by) {
    CCLITE_TRY(check_args(key, value.size()));
    std::string q = key_query(q_set, key);
    put_string(q, value);
    return round_trip("set", key, true, op_deadline(reply_by), std::move(q), nullptr, 0, nullptr);
  }

  result<std::string> get_now(const std::string& key, deadline until, deadline reply_by) {
    // torch's server drops a client that gets a missing key: wait for it
    // first, or, when `until` has passed already (a get of what is there
    // now), check: a wait with no time left would be cut off before its
    // reply and cost the connection.
    if (until.expired()) {
      auto there = check_within(key, reply_by);
      if (!there) return there.error();
      if (!there.value())
        return make_error(errc::timeout, "key '%s' is not in torchrun's store at %s",
                          proto::printable(key, 80).c_str(), endpoint().c_str());
    } else {
      CCLITE_TRY(wait_now({key}, deadline::min(until, reply_by)));
    }
    std::string value;
    CCLITE_TRY(round_trip("get", key, true, op_deadline(reply_by), key_query(q_get, key), nullptr, 0, &value));
    return value;
  }

  result<std::int64_t> add_now(const std::string& key, std::int64_t delta, deadline reply_by) {
    CCLITE_TRY(check_args(key, 0));
    std::string q = key_query(q_add, key);
    put_u64(q, static_cast<std::uint64_t>(delta));
    std::uint8_t v[8];
    status st = round_trip("add", key, false, op_deadline(reply_by), std::move(q), v, 8, nullptr);
    if (st.code() == errc::peer_lost)  // torch's server drops a client whose add fails
      return make_error(errc::peer_lost,
                        "%s (torch's store closes the connection when the value of the key is not an integer)",
                        st.message().c_str());
    CCLITE_TRY(st);
    return static_cast<std::int64_t>(get_le(v, 8));
  }

  status wait_now(const std::vector<std::string>& keys, deadline until) {
    if (keys.empty()) return {};
    for (const auto& k : keys) CCLITE_TRY(check_args(k, 0));
    auto t0 = clock::now();
    std::uint8_t r = 0;
    status st = round_trip("wait", keys[0], true, until, keys_query(q_wait, keys), &r, 1, nullptr);
    if (st.ok() && r != 0) return bad_reply("wait", keys[0]);
    if (st.code() != errc::timeout || !until.expired()) return st;
    std::string names;
    for (std::size_t i = 0; i < keys.size() && i < 8; ++i)
      names += (i ? ", '" : "'") + proto::printable(keys[i], 80) + "'";
    if (keys.size() > 8) names += ", ...";
    return make_error(errc::timeout,
                      "timed out after %lld ms waiting for keys (%s) in torchrun's store at %s; did every rank "
                      "start?",
                      elapsed_ms(t0), names.c_str(), endpoint().c_str());
  }

  result<bool> check_within(const std::string& key, deadline reply_by) {
    CCLITE_TRY(check_args(key, 0));
    std::uint8_t r = 0;
    CCLITE_TRY(round_trip("check", key, true, op_deadline(reply_by), keys_query(q_check, {key}), &r, 1, nullptr));
    if (r > 1) return bad_reply("check", key);
    return r == 0;  // torch's "ready"
  }

  // Query types in torch 2.x's numbering; torch 1.x's are one less (no validate).
  static constexpr std::uint8_t q_validate = 0, q_set = 1, q_get = 3, q_add = 4, q_check = 5, q_wait = 6;
  static constexpr std::uint32_t validate_magic = 0x3C85F7CE;

  deadline op_deadline(deadline reply_by) const { return deadline::min(reply_by, deadline::after(op_timeout_)); }

  torch_store_client(const std::string& host, std::uint16_t port, milliseconds op_timeout, std::string prefix,
                     dialect d)
      : sock_(host, port, "torchrun's agent", {}),
        op_timeout_(op_timeout),
        prefix_("/" + prefix),
        dialect_(d),
        host_(host),
        port_(port) {}

  static long long elapsed_ms(clock::time_point t0) { return detail::elapsed_ms(t0); }

  static status check_args(const std::string& key, std::size_t value_len) {
    return check_store_sizes(key, value_len);
  }

  static void put_u64(std::string& q, std::uint64_t v) {
    char b[8];
    put_le(reinterpret_cast<std::uint8_t*>(b), v, 8);
    q.append(b, 8);
  }
  static void put_string(std::string& q, const std::string& s) {
    put_u64(q, s.size());
    q += s;
  }
  // A query in torch 2.x's numbering; round_trip() renumbers it for 1.x.
  std::string key_query(std::uint8_t type, const std::string& key) const {
    std::string q(1, static_cast<char>(type));
    put_string(q, prefix_ + key);
    return q;
  }
  std::string keys_query(std::uint8_t type, const std::vector<std::string>& keys) const {
    std::string q(1, static_cast<char>(type));
    put_u64(q, keys.size());
    for (const auto& k : keys) put_string(q, prefix_ + k);
    return q;
  }

  static std::string during(const char* op, const std::string& key) {
    return std::string(op) + " of key '" + proto::printable(key) + "'";
  }
  status bad_reply(const char* op, const std::string& key) {
    sock_.close();
    return make_error(errc::protocol_error, "malformed reply to %s from torchrun's store at %s",
                      during(op, key).c_str(), endpoint().c_str());
  }

  // Sends query `q` about `key` and reads its reply: `n` bytes into `reply`,
  // or (`value` set) a u64 length and that many bytes. Reconnects first if an
  // earlier call broke the connection; an idempotent query that finds the
  // connection dead is sent once more on a fresh one.
  status round_trip(const char* op, const std::string& key, bool idempotent, deadline until, std::string q,
                    std::uint8_t* reply, std::size_t n, std::string* value) {
    const std::string what = during(op, key);
    const auto type = static_cast<std::uint8_t>(q[0]);
    for (int attempt = 0;; ++attempt) {
      if (sock_.peer_closed()) sock_.close();  // a set gets no reply: do not send it into a closed stream
      if (!sock_.is_open()) {
        std::string why;
        if (!connect_once(deadline::min(until, deadline::after(op_timeout_)), why)) {
          if (!fatal_.ok()) return fatal_;
          return make_error(errc::peer_lost,
                            "lost connection to torchrun's store at %s (its agent gone?) before %s: %s",
                            endpoint().c_str(), what.c_str(), why.c_str());
        }
      }
      q[0] = static_cast<char>(type - (dialect_ == dialect::torch1 ? 1 : 0));  // known once connected
      status st = sock_.io(true, &q[0], q.size(), until, what);
      if (st.ok() && n) st = sock_.io(false, reinterpret_cast<char*>(reply), n, until, what);
      if (st.ok() && value) {
        std::uint8_t len[8];
        st = sock_.io(false, reinterpret_cast<char*>(len), 8, until, what);
        std::uint64_t k = st.ok() ? get_le(len, 8) : 0;
        if (k > max_store_value_bytes) return bad_reply(op, key);
        value->assign(static_cast<std::size_t>(k), '\0');
        if (st.ok() && k) st = sock_.io(false, &(*value)[0], value->size(), until, what);
      }
      if (st.ok() || st.code() != errc::peer_lost || !idempotent || attempt > 0) return st;
    }
  }

  static status greeter(void* me, deadline until) { return static_cast<torch_store_client*>(me)->greet(until); }
  bool connect_once(deadline until, std::string& why) {
    return sock_.connect_once(until, deadline::min(until, deadline::after(op_timeout_)), why, fatal_, greeter, this);
  }

  // The opening of a connection: torch 2.x's validate. The very first one
  // probes for the dialect instead, and is then replaced by a fresh one.
  status greet(deadline until) {
    if (dialect_ == dialect::unknown) {
      CCLITE_TRY(probe(until));
      return make_error(errc::peer_lost, "reconnect after the protocol probe");
    }
    if (dialect_ == dialect::torch1) return {};
    std::string q(1, static_cast<char>(q_validate));
    char m[4];
    put_le(reinterpret_cast<std::uint8_t*>(m), validate_magic, 4);
    q.append(m, 4);
    return sock_.io(true, &q[0], q.size(), until, "the validation of the connection");
  }

  // Sets dialect_ from the first reply byte to the probe (header comment):
  // 1 is torch 1.x's "not ready", 0 the first byte of torch 2.x's value of
  // "\x01" (only ever added 0 to). A torch 2.x server ignores an unvalidated
  // first query: its older server closes the connection, the libuv one (2.4+)
  // keeps the bytes and reads them when more arrive, so each 100 ms without a
  // reply sends one more query that every dialect answers harmlessly at once
  // (2.x: check of no keys; 1.x: wait for no keys).
  status probe(deadline until) {
    static const std::uint8_t bytes[18] = {4, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    static const std::uint8_t nudge[9] = {q_check, 0, 0, 0, 0, 0, 0, 0, 0};
    std::string q(reinterpret_cast<const char*>(bytes), sizeof bytes);
    CCLITE_TRY(sock_.io(true, &q[0], q.size(), until, "the protocol probe"));
    char r[64];
    result<std::size_t> n = std::size_t(0);
    for (;;) {
      n = sock_.read_some(r, sizeof r, deadline::min(until, deadline::after(milliseconds(100))), "the protocol probe");
      if (n || n.error().code() != errc::timeout || until.expired()) break;
      std::string more(reinterpret_cast<const char*>(nudge), sizeof nudge);
      CCLITE_TRY(sock_.io(true, &more[0], more.size(), until, "the protocol probe"));
    }
    if (!n) {
      if (n.error().code() != errc::peer_lost) return n.error();
      dialect_ = dialect::torch2;  // closed on an unvalidated query: torch 2.x's classic server
      return {};
    }
    if (n.value() >= 4 && std::memcmp(r, "CCST", 4) == 0)
      return make_error(errc::protocol_error,
                        "%s is a cclite store, not torchrun's: TORCHELASTIC_USE_AGENT_STORE=True says the launcher "
                        "hosts the store; unset it, or set CCLITE_RDZV_ENDPOINT to use cclite's own",
                        endpoint().c_str());
    if (r[0] == 1 || r[0] == 0) {
      dialect_ = r[0] == 1 ? dialect::torch1 : dialect::torch2;
      return {};
    }
    return make_error(errc::protocol_error,
                      "the server at %s does not answer as torch's TCPStore (first byte 0x%02x of %zu to the protocol "
                      "probe); is MASTER_ADDR:MASTER_PORT torchrun's store?",
                      endpoint().c_str(), static_cast<unsigned>(static_cast<std::uint8_t>(r[0])), n.value());
  }

  detail::store_socket sock_;
  milliseconds op_timeout_;
  std::string prefix_;
  dialect dialect_;
  status fatal_;  // a foreign protocol: retrying is pointless; sticky
  std::string host_;  // what a spare client is made with (spare())
  std::uint16_t port_ = 0;
  detail::connection_pool pool_{[](cclite::store& self) -> std::unique_ptr<cclite::store> {
    return static_cast<torch_store_client&>(self).spare();
  }};
};

}  // namespace cclite::tcp
CCLITE_SETUP_CODE_END
