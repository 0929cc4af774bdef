// cclite/tcp/detail/store_session.hpp - store_server's implementation: one
// connection's state machine and the server's accept loop and store ops.
// Included by store_server.hpp; not a public header.
//
// Everything here runs on the server's single io thread. A session is owned by
// store_server::sessions_ and by the handlers it has in flight; close() removes
// it from the server, after which its handlers see closed_ and return.
#pragma once

#include <cclite/tcp/store_server.hpp>

namespace cclite::tcp {

class store_server::session : public std::enable_shared_from_this<session> {
 public:
  session(store_server& srv, asio::ip::tcp::socket sock, std::string peer, std::uint64_t id)
      : srv_(srv),
        sock_(std::move(sock)),
        idle_timer_(srv.io_),
        wait_timer_(srv.io_),
        peer_(std::move(peer)),
        id_(id) {}

  /// Sends the challenge and waits for the proof (store_protocol.hpp); only a
  /// connection that passes reads requests. The whole handshake must finish
  /// within idle_timeout, so a silent or trickling stranger is dropped.
  void start() {
    phase_ = phase::handshake;
    proto::auth_frame ch;
    if (status st = proto::make_nonce(ch.payload); !st.ok()) {
      srv_.log("%s", st.message().c_str());
      return close(nullptr);
    }
    nonce_ = ch.payload;
    auth_out_ = proto::encode(ch);
    arm_idle(srv_.opts_.idle_timeout);
    auto self = shared_from_this();
    asio::async_write(sock_, asio::buffer(auth_out_), [this, self](const asio::error_code& ec, std::size_t) {
      if (closed_) return;
      if (ec) return close(nullptr);  // gone before it read the challenge
      challenge_sent_ = true;
      if (proof_in_) check_proof();
    });
    asio::async_read(sock_, asio::buffer(auth_in_), [this, self](const asio::error_code& ec, std::size_t n) {
      if (closed_) return;
      if (ec) {
        // Connect-and-leave (a port probe, an idle client going away): not worth a line.
        if (n == 0 && (ec == asio::error::eof || ec == asio::error::connection_reset)) return close(nullptr);
        char why[160];
        std::snprintf(why, sizeof why, "truncated handshake (%s after %zu of %zu bytes)",
                      ec == asio::error::eof ? "closed" : ec.message().c_str(), n, auth_in_.size());
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
      // Only one write at a time on the socket: a (necessarily bogus) proof
      // that beats the challenge out waits for it.
      if (challenge_sent_) check_proof();
    });
  }

  /// Closes the connection. `why` != nullptr: a protocol violation or timeout,
  /// logged as "dropped client <peer>: <why>".
  void close(const char* why) {
    if (closed_) return;
    closed_ = true;
    if (why) {
      srv_.n_dropped_.fetch_add(1);
      srv_.log("dropped client %s: %s", peer_.c_str(), why);
    }
    asio::error_code ec;
    sock_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    idle_timer_.cancel();
    wait_timer_.cancel();
    if (waiting_) srv_.remove_waiter(key_, this);
    waiting_ = false;
    if (srv_.stopping_) return;
    store_server& srv = srv_;
    srv.sessions_.erase(id_);  // callers hold a reference to *this, but be safe: locals only
    srv.n_conn_.store(srv.sessions_.size());
  }

  /// The key this session waits for was set.
  void key_ready() {
    if (closed_ || !waiting_) return;
    waiting_ = false;
    ++wait_gen_;
    wait_timer_.cancel();
    asio::error_code ec;
    sock_.cancel(ec);  // the disconnect watch (see watch_disconnect)
    answer_present();
  }

 private:
  enum class phase { handshake, between_frames, mid_frame, waiting, writing };

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

  void read_header() {
    phase_ = phase::between_frames;
    hdr_got_ = 0;
    body_got_ = body_total_ = 0;
    arm_idle(established_ ? srv_.opts_.established_idle_timeout : srv_.opts_.idle_timeout);
    read_more_header();
  }

  void read_more_header() {
    auto self = shared_from_this();
    sock_.async_read_some(asio::buffer(hdr_.data() + hdr_got_, hdr_.size() - hdr_got_),
                          [this, self](const asio::error_code& ec, std::size_t n) {
                            if (closed_) return;
                            if (ec) return read_failed(ec);
                            hdr_got_ += n;
                            phase_ = phase::mid_frame;
                            if (hdr_got_ < hdr_.size()) {
                              arm_idle(srv_.opts_.idle_timeout);
                              return read_more_header();
                            }
                            if (const char* bad = proto::decode(hdr_.data(), req_)) return close(bad);
                            body_.clear();
                            body_got_ = 0;
                            body_total_ = std::size_t(req_.key_len) + req_.value_len;
                            read_body();
                          });
  }

  void read_body() {
    if (body_.size() == body_total_) return dispatch();
    arm_idle(srv_.opts_.idle_timeout);
    std::size_t old = body_.size();
    std::size_t want = std::min<std::size_t>(body_total_ - old, 64 << 10);
    // Capacity follows the bytes received (doubling), capped by the validated
    // length: a header announcing 64 MiB followed by silence costs 64 KiB.
    if (old + want > body_.capacity())
      body_.reserve(std::min(body_total_, std::max(old + want, 2 * body_.capacity())));
    body_.resize(old + want);
    auto self = shared_from_this();
    sock_.async_read_some(asio::buffer(&body_[old], want),
                          [this, self, old](const asio::error_code& ec, std::size_t n) {
                            if (closed_) return;
                            body_.resize(old + (ec ? 0 : n));
                            body_got_ = body_.size();
                            if (ec) return read_failed(ec);
                            read_body();
                          });
  }

  void read_failed(const asio::error_code& ec) {
    if (phase_ == phase::between_frames && hdr_got_ == 0) return close(nullptr);  // clean goodbye
    char why[160];
    std::size_t got = hdr_got_ + body_got_, want = hdr_.size() + body_total_;
    if (hdr_got_ < hdr_.size()) want = hdr_.size();
    std::snprintf(why, sizeof why, "truncated frame (%s after %zu of %zu bytes)",
                  ec == asio::error::eof ? "closed" : ec.message().c_str(), got, want);
    close(why);
  }

  void dispatch() {
    arm_idle(std::chrono::milliseconds(0));
    established_ = true;
    key_.assign(body_, 0, req_.key_len);
    switch (req_.code) {
      case proto::op::set: {
        body_.erase(0, req_.key_len);
        auto v = std::make_shared<const std::string>(std::move(body_));
        body_ = std::string();
        std::size_t old = 0;
        auto it = srv_.data_.find(key_);
        if (it != srv_.data_.end()) old = it->second->size() + key_.size();
        std::size_t next = srv_.data_bytes_ - old + key_.size() + v->size();
        if (next > srv_.opts_.max_total_bytes) {
          return reply_error("store full: server_options::max_total_bytes (" +
                             std::to_string(srv_.opts_.max_total_bytes) + ") reached");
        }
        srv_.data_bytes_ = next;
        srv_.data_[key_] = std::move(v);
        reply(proto::reply_status::ok, {});
        return srv_.wake(key_);
      }
      case proto::op::add: {
        std::int64_t delta = proto::get_i64(reinterpret_cast<const std::uint8_t*>(&body_[req_.key_len]));
        body_.clear();
        std::int64_t cur = 0;
        std::size_t old = 0;
        auto it = srv_.data_.find(key_);
        if (it != srv_.data_.end()) {
          old = it->second->size() + key_.size();
          if (!parse_i64(*it->second, cur))
            return reply_error("add on key '" + proto::printable(key_) + "' whose value is not an integer");
        }
        std::int64_t next = 0;
        if (__builtin_add_overflow(cur, delta, &next))
          return reply_error("add on key '" + proto::printable(key_) + "' overflows int64");
        auto v = std::make_shared<const std::string>(std::to_string(next));
        srv_.data_bytes_ = srv_.data_bytes_ - old + key_.size() + v->size();
        srv_.data_[key_] = std::move(v);
        reply(proto::reply_status::ok, std::make_shared<const std::string>(proto::i64_bytes(next)));
        return srv_.wake(key_);
      }
      case proto::op::check: {
        bool has = srv_.data_.count(key_) != 0;
        return reply(proto::reply_status::ok, std::make_shared<const std::string>(1, has ? '\1' : '\0'));
      }
      case proto::op::get:
      case proto::op::wait: {
        if (srv_.data_.count(key_)) return answer_present();
        if (req_.wait_ms == 0) return reply(proto::reply_status::timeout, {});
        phase_ = phase::waiting;
        waiting_ = true;
        std::uint64_t gen = ++wait_gen_;
        srv_.waiters_[key_].push_back(shared_from_this());
        wait_timer_.expires_after(std::chrono::milliseconds(req_.wait_ms));
        auto self = shared_from_this();
        wait_timer_.async_wait([this, self, gen](const asio::error_code&) {
          if (closed_ || !waiting_ || gen != wait_gen_) return;
          waiting_ = false;
          srv_.remove_waiter(key_, this);
          asio::error_code ec;
          sock_.cancel(ec);
          reply(proto::reply_status::timeout, {});
        });
        return watch_disconnect(gen);
      }
    }
  }

  // While a get/wait is parked, a read of one byte tells us when the client
  // goes away (so the waiter does not linger) or breaks the protocol by
  // sending before its reply. It is cancelled when the wait ends.
  void watch_disconnect(std::uint64_t gen) {
    auto self = shared_from_this();
    sock_.async_read_some(asio::buffer(&watch_byte_, 1),
                          [this, self, gen](const asio::error_code& ec, std::size_t) {
                            if (closed_ || !waiting_ || gen != wait_gen_) return;
                            if (ec == asio::error::operation_aborted) return;
                            close(ec ? nullptr : "sent a request while its get/wait was pending");
                          });
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
    proto::reply_header h;
    h.status = st;
    h.value_len = reply_value_ ? static_cast<std::uint32_t>(reply_value_->size()) : 0;
    reply_hdr_ = proto::encode(h);
    std::array<asio::const_buffer, 2> bufs{asio::buffer(reply_hdr_),
                                           reply_value_ ? asio::buffer(*reply_value_) : asio::const_buffer()};
    arm_idle(srv_.opts_.idle_timeout);
    auto self = shared_from_this();
    asio::async_write(sock_, bufs, [this, self](const asio::error_code& ec, std::size_t) {
      if (closed_) return;
      reply_value_.reset();
      if (ec || refusing_) return close(nullptr);  // went away, or refused (already logged)
      read_header();
    });
  }

  void arm_idle(std::chrono::milliseconds d) {
    std::uint64_t gen = ++idle_gen_;
    if (d.count() <= 0) {
      idle_timer_.cancel();
      return;
    }
    idle_timer_.expires_after(d);
    auto self = shared_from_this();
    idle_timer_.async_wait([this, self, gen, d](const asio::error_code&) {
      if (closed_ || gen != idle_gen_) return;
      char why[160];
      long long ms = static_cast<long long>(d.count());
      if (phase_ == phase::handshake)
        std::snprintf(why, sizeof why, "did not complete the job-token handshake within %lld ms", ms);
      else if (phase_ == phase::writing)
        std::snprintf(why, sizeof why, "did not read its reply for %lld ms", ms);
      else if (phase_ == phase::mid_frame)
        std::snprintf(why, sizeof why, "stalled for %lld ms mid-frame (%zu of %zu bytes)", ms,
                      hdr_got_ + body_got_, hdr_got_ < hdr_.size() ? hdr_.size() : hdr_.size() + body_total_);
      else if (!established_)
        std::snprintf(why, sizeof why, "sent no request for %lld ms after connecting", ms);
      else
        std::snprintf(why, sizeof why, "idle for %lld ms", ms);
      close(why);
    });
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
  asio::ip::tcp::socket sock_;
  asio::steady_timer idle_timer_;
  asio::steady_timer wait_timer_;
  std::string peer_;
  std::uint64_t id_;
  phase phase_ = phase::between_frames;
  bool closed_ = false, established_ = false, waiting_ = false, refusing_ = false;
  bool challenge_sent_ = false, proof_in_ = false;
  std::array<std::uint8_t, proto::nonce_bytes> nonce_{}, proof_{};
  std::array<std::uint8_t, proto::auth_frame_bytes> auth_out_{};
  std::array<std::uint8_t, proto::auth_frame_bytes> auth_in_{};
  std::uint64_t idle_gen_ = 0, wait_gen_ = 0;
  std::array<std::uint8_t, proto::request_header_bytes> hdr_{};
  std::size_t hdr_got_ = 0;
  proto::request_header req_;
  std::string body_;
  std::size_t body_total_ = 0;
  std::size_t body_got_ = 0;  // body_.size() includes the area of a read in flight
  std::string key_;
  std::array<std::uint8_t, proto::reply_header_bytes> reply_hdr_{};
  value_ptr reply_value_;
  char watch_byte_ = 0;
};

// ---- store_server ------------------------------------------------------------

inline result<std::unique_ptr<store_server>> store_server::start(const std::vector<std::string>& bind_hosts,
                                                                 std::uint16_t port, server_options opts) {
#if defined(CCLITE_NO_THREADS)
  (void)bind_hosts, (void)port, (void)opts;
  return make_error(errc::unsupported, "the TCP store server needs a thread; built with CCLITE_NO_THREADS");
#else
  std::unique_ptr<store_server> s(new store_server(std::move(opts)));
  std::vector<std::string> hosts = bind_hosts.empty() ? std::vector<std::string>{""} : bind_hosts;
  for (const std::string& bind_host : hosts) {
    std::string host = bind_host;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    auto fail = [&](const std::string& why) {
      return make_error(errc::bootstrap_error,
                        "cannot listen on %s:%u: %s; is another job using that port? set "
                        "CCLITE_RDZV_ENDPOINT / MASTER_PORT to a free port",
                        bind_host.empty() ? "0.0.0.0" : bind_host.c_str(), unsigned(port), why.c_str());
    };
    asio::error_code ec;
    asio::ip::address addr;
    if (host.empty() || host == "*") {
      addr = asio::ip::address_v4::any();
    } else {
      addr = asio::ip::make_address(host, ec);
      if (ec) {
        asio::ip::tcp::resolver r(s->io_);
        auto res = r.resolve(host, "", ec);
        if (ec || res.empty()) return fail("cannot resolve the host: " + ec.message());
        addr = res.begin()->endpoint().address();
      }
    }
    asio::ip::tcp::endpoint ep(addr, port);
    s->listeners_.push_back(std::make_unique<listener>(s->io_));
    auto& acc = s->listeners_.back()->acceptor;
    acc.open(ep.protocol(), ec);
    if (ec) return fail(ec.message());
    acc.set_option(asio::socket_base::reuse_address(true), ec);
    if (addr.is_v6() && addr.is_unspecified()) acc.set_option(asio::ip::v6_only(false), ec);
    acc.bind(ep, ec);
    if (ec) return fail(ec.message());
    acc.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return fail(ec.message());
    auto local = acc.local_endpoint(ec);
    if (ec) return fail(ec.message());
    port = local.port();  // the next addresses share it
    if (s->address_.empty()) {
      s->port_ = port;
      s->address_ = (addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string()) + ":" + std::to_string(port);
    }
  }
  for (auto& l : s->listeners_) s->accept_next(*l);
  store_server* raw = s.get();
  s->thread_ = std::thread([raw] { raw->io_.run(); });
  return {std::move(s)};
#endif
}

inline store_server::~store_server() {
  if (thread_.joinable()) {
    // Closing everything on the io thread cancels every pending operation;
    // run() then returns for lack of work.
    asio::post(io_, [this] { shutdown_all(); });
    thread_.join();
  }
}

inline void store_server::shutdown_all() {
  stopping_ = true;
  asio::error_code ec;
  for (auto& l : listeners_) {
    l->acceptor.close(ec);
    l->retry.cancel();
  }
  for (auto& kv : sessions_) kv.second->close(nullptr);
  sessions_.clear();
  waiters_.clear();
  n_conn_.store(0);
}

inline void store_server::accept_next(listener& l) {
  l.acceptor.async_accept([this, &l](const asio::error_code& ec, asio::ip::tcp::socket sock) {
    if (stopping_) return;
    if (ec) {
      // EMFILE and friends: back off instead of spinning; pending connections
      // wait in the listen backlog.
      if (ec != asio::error::operation_aborted) log("accept failed: %s", ec.message().c_str());
      l.retry.expires_after(std::chrono::milliseconds(100));
      l.retry.async_wait([this, &l](const asio::error_code& e) {
        if (!e && !stopping_) accept_next(l);
      });
      return;
    }
    asio::error_code e2;
    auto rep = sock.remote_endpoint(e2);
    std::string peer =
        e2 ? std::string("unknown")
           : (rep.address().is_v6() ? "[" + rep.address().to_string() + "]" : rep.address().to_string()) +
                 ":" + std::to_string(rep.port());
    if (sessions_.size() >= opts_.max_connections) {
      n_refused_.fetch_add(1);
      log("refused client %s: %zu connections open (server_options::max_connections)", peer.c_str(),
          sessions_.size());
      sock.close(e2);
    } else {
      sock.set_option(asio::ip::tcp::no_delay(true), e2);
      sock.set_option(asio::socket_base::keep_alive(true), e2);
      std::uint64_t id = next_id_++;
      auto s = std::make_shared<session>(*this, std::move(sock), std::move(peer), id);
      sessions_.emplace(id, s);
      n_conn_.store(sessions_.size());
      s->start();
    }
    accept_next(l);
  });
}

inline void store_server::wake(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  auto list = std::move(it->second);
  waiters_.erase(it);
  for (auto& s : list) s->key_ready();
}

inline void store_server::remove_waiter(const std::string& key, const session* s) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  auto& v = it->second;
  v.erase(std::remove_if(v.begin(), v.end(), [s](const std::shared_ptr<session>& p) { return p.get() == s; }),
          v.end());
  if (v.empty()) waiters_.erase(it);
}

inline void store_server::log(const char* fmt, ...) {
  if (!opts_.log) return;
  auto now = clock::now();
  if (now - log_window_ >= std::chrono::seconds(1)) {
    if (log_suppressed_)
      logger_.log(log_level::warn, "tcp store %s: (%llu similar lines suppressed)", address_.c_str(),
                  static_cast<unsigned long long>(log_suppressed_));
    log_window_ = now;
    log_lines_ = 0;
    log_suppressed_ = 0;
  }
  if (++log_lines_ > 20) {
    ++log_suppressed_;
    return;
  }
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  logger_.log(log_level::warn, "tcp store %s: %s", address_.c_str(), buf);
}

}  // namespace cclite::tcp
