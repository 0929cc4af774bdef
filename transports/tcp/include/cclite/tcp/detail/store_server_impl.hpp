// cclite/tcp/detail/store_server_impl.hpp - store_server's own functions:
// start (bind and listen), the poll loop's step, accept, waking waiters,
// logging, and the destructor. Included at the end of store_session.hpp (a
// connection's state machine, which store_server.hpp includes); not a public
// header.
//
// Everything here runs on the serving thread (the background thread, or the
// caller of progress()), start() and the destructor excepted.
#pragma once

#include <cclite/config.hpp>
#include <cclite/tcp/detail/store_session.hpp>  // store_server.hpp, then the session

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp {

inline result<std::unique_ptr<store_server>> store_server::start(const std::vector<std::string>& bind_hosts,
                                                                 std::uint16_t port, server_options opts) {
#if defined(CCLITE_NO_THREADS)
  opts.background_thread = false;
#endif
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
    sockaddr_storage ss{};
    auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (host.empty() || host == "*" || ::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
      ss.ss_family = AF_INET;  // sin_addr stays 0 = INADDR_ANY for "" and "*"
    } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
      ss.ss_family = AF_INET6;
    } else {
      addrinfo hints{}, *res = nullptr;
      hints.ai_socktype = SOCK_STREAM;
      int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
      if (rc != 0 || !res) return fail(std::string("cannot resolve the host: ") + ::gai_strerror(rc));
      std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
      ::freeaddrinfo(res);
    }
    const bool is6 = ss.ss_family == AF_INET6;
    if (is6)
      v6->sin6_port = htons(port);
    else
      v4->sin_port = htons(port);
    int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(std::strerror(errno));
    s->listeners_.push_back(listener{fd, {}});
    int one = 1, zero = 0;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (is6 && IN6_IS_ADDR_UNSPECIFIED(&v6->sin6_addr))
      (void)::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    socklen_t len = is6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
      return fail(std::strerror(errno));
    port = ntohs(is6 ? v6->sin6_port : v4->sin_port);  // the next addresses share it
    if (s->address_.empty()) {
      s->port_ = port;
      s->address_ = detail::sockaddr_text(ss);
    }
  }
#if !defined(CCLITE_NO_THREADS)
  if (s->opts_.background_thread) {
    if (::pipe2(s->wake_fd_, O_NONBLOCK | O_CLOEXEC) != 0)
      return make_error(errc::bootstrap_error, "tcp store: pipe: %s", std::strerror(errno));
    s->threaded_ = true;
    store_server* raw = s.get();
    s->thread_ = std::thread([raw] {
      while (!raw->stopping_.load()) raw->step(-1, -1, 0);
    });
  }
#endif
  return {std::move(s)};
}

inline store_server::~store_server() {
#if !defined(CCLITE_NO_THREADS)
  if (thread_.joinable()) {
    stopping_.store(true);
    char b = 1;
    while (::write(wake_fd_[1], &b, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
#endif
  stopping_.store(true);
  for (auto& l : listeners_) ::close(l.fd);
  for (auto& s : sessions_) s->close(nullptr);
  sessions_.clear();
  for (int fd : wake_fd_)
    if (fd >= 0) ::close(fd);
  if (helper_fd_ >= 0) ::close(helper_fd_);  // the helper process sees its channel close and ends
  n_conn_.store(0);
}

// One round of the loop: wait for a socket (or a timer, or `extra_fd`) at most
// `timeout_ms`, then serve every ready connection and every expired timer.
inline short store_server::step(int timeout_ms, int extra_fd, short extra_events) {
  auto now = clock::now();
  clock::time_point next = clock::time_point::max();
  pfds_.clear();
  if (wake_fd_[0] >= 0) pfds_.push_back({wake_fd_[0], POLLIN, 0});
  const std::size_t first_listener = pfds_.size();
  for (auto& l : listeners_) {
    if (l.retry_at > now) next = std::min(next, l.retry_at);
    pfds_.push_back({l.retry_at > now ? -1 : l.fd, POLLIN, 0});
  }
  const std::size_t first_session = pfds_.size();
  for (auto& s : sessions_) {
    pfds_.push_back({s->fd(), s->events(), 0});
    next = std::min(next, s->next_timer());
  }
  const std::size_t extra = pfds_.size();
  if (extra_fd >= 0) pfds_.push_back({extra_fd, extra_events, 0});
  if (next != clock::time_point::max()) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
    ms = std::max<decltype(ms)>(ms, 0);
    if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = static_cast<int>(std::min<decltype(ms)>(ms, 1 << 30));
  }
  int r = ::poll(pfds_.data(), static_cast<nfds_t>(pfds_.size()), timeout_ms);
  if (r < 0) return 0;  // EINTR: the caller comes back
  // Sessions accepted below are not in pfds_; they are served from the next step.
  const std::size_t n_sessions = sessions_.size();
  for (std::size_t i = 0; i < n_sessions; ++i)
    if (short ev = pfds_[first_session + i].revents) sessions_[i]->on_ready(ev);
  now = clock::now();
  for (std::size_t i = 0; i < listeners_.size(); ++i)
    if (pfds_[first_listener + i].revents) accept_all(listeners_[i], now);
  for (std::size_t i = 0; i < n_sessions; ++i) sessions_[i]->on_timers(now);
  sessions_.erase(std::remove_if(sessions_.begin(), sessions_.end(),
                                 [](const std::unique_ptr<session>& s) { return s->closed(); }),
                  sessions_.end());
  return extra_fd >= 0 ? pfds_[extra].revents : 0;
}

inline void store_server::accept_all(listener& l, clock::time_point now) {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(l.fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // EMFILE and friends: back off instead of spinning; pending connections
      // wait in the listen backlog.
      log("accept failed: %s", std::strerror(errno));
      l.retry_at = now + std::chrono::milliseconds(100);
      return;
    }
    std::string peer = detail::sockaddr_text(ss);
    if (open_ >= opts_.max_connections) {
      n_refused_.fetch_add(1);
      log("refused client %s: %zu connections open (server_options::max_connections)", peer.c_str(), open_);
      ::close(fd);
      continue;
    }
    int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    sessions_.push_back(std::make_unique<session>(*this, fd, std::move(peer)));
    ++open_;
    n_conn_.store(open_);
    sessions_.back()->start();
  }
}

inline void store_server::wake(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  auto list = std::move(it->second);
  waiters_.erase(it);
  for (session* s : list) s->key_ready();
}

inline void store_server::remove_waiter(const std::string& key, const session* s) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  auto& v = it->second;
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
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
CCLITE_SETUP_CODE_END
