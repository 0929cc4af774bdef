// tests/support/fake_c10d.hpp - a stand-in for PyTorch's c10d TCPStore server,
// for tests of tcp::torch_store_client without torch: the wire of
// tcp/torch_store.hpp's header table, in torch 1.x's numbering or 2.x's, and
// 2.x's ways with a connection whose first query is not `validate`. Behaves as
// torch's server where
// it matters to a client: `get` of a missing key and `add` to a non-integer
// close the connection (torch's handler throws), waits have no time limit, and
// an unknown query closes the connection. (The real torch 1.13 server is
// exercised by tests/netns/torchrun_test.sh when python3-torch is installed.)
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "raw_conn.hpp"

namespace cclite::test {

class fake_c10d {
 public:
  /// What a 2.x server does with a connection whose first query is not validate.
  enum class unvalidated {
    served,   ///< answers it (no torch release does; the probe must cope anyway)
    closed,   ///< closes the connection (torch 2.0-2.3's server)
    ignored,  ///< keeps the bytes unread until more arrive, then serves them all (2.4's libuv server)
  };
  /// dialect 1 or 2; `u`: 2 only.
  explicit fake_c10d(int dialect, unvalidated u = unvalidated::served)
      : dialect_(dialect), unvalidated_(u), listener_(64) {
    thread_ = std::thread([this] { loop(); });
  }
  ~fake_c10d() { stop(); }
  fake_c10d(const fake_c10d&) = delete;
  fake_c10d& operator=(const fake_c10d&) = delete;

  std::uint16_t port() const { return listener_.port; }
  /// Closes every connection and the listener (the agent gone).
  void stop() {
    if (stop_.exchange(true)) return;
    thread_.join();
    for (auto& c : conns_) ::close(c.fd);
    conns_.clear();
    listener_.close();
  }
  /// Every key any query named, as it came on the wire.
  std::set<std::string> keys_seen() {
    std::lock_guard<std::mutex> g(mu_);
    return seen_;
  }
  int connections_accepted() const { return accepted_.load(); }

 private:
  enum op { validate = 0, set = 1, get = 3, add = 4, check = 5, wait = 6 };  // 2.x numbering
  struct conn {
    int fd = -1;
    std::string in;
    bool first = true;  // no query seen yet
    std::vector<std::string> waiting;  // keys of a pending wait
  };

  void loop() {
    while (!stop_.load()) {
      std::vector<pollfd> p{{listener_.fd, POLLIN, 0}};
      for (auto& c : conns_) p.push_back({c.fd, POLLIN, 0});
      if (::poll(p.data(), p.size(), 20) <= 0) continue;
      if (p[0].revents & POLLIN) {
        int fd = ::accept(listener_.fd, nullptr, nullptr);
        if (fd >= 0) {
          conn c;
          c.fd = fd;
          conns_.push_back(std::move(c));
          ++accepted_;
        }
      }
      for (std::size_t i = 1; i < p.size(); ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        conn& c = conns_[i - 1];
        char buf[65536];
        long k = ::recv(c.fd, buf, sizeof buf, 0);
        if (k <= 0) {
          drop(c);
          continue;
        }
        c.in.append(buf, static_cast<std::size_t>(k));
        if (dialect_ == 2 && c.first && unvalidated_ != unvalidated::served && c.in[0] != validate) {
          c.first = false;
          if (unvalidated_ == unvalidated::closed) drop(c);
          continue;  // ignored: read again with what comes next
        }
        c.first = false;
        while (c.fd >= 0 && c.waiting.empty() && serve_one(c)) {
        }
      }
      std::vector<conn> alive;
      for (auto& c : conns_)
        if (c.fd >= 0) alive.push_back(std::move(c));
      conns_ = std::move(alive);
    }
  }
  void drop(conn& c) {
    ::close(c.fd);
    c.fd = -1;
  }

  // Reads a u64 / string at `pos` of c.in; false when not all there yet.
  static bool u64_at(const std::string& in, std::size_t& pos, std::uint64_t& v) {
    if (in.size() < pos + 8) return false;
    std::memcpy(&v, in.data() + pos, 8);  // little-endian hosts, as torch's
    pos += 8;
    return true;
  }
  static bool str_at(const std::string& in, std::size_t& pos, std::string& s) {
    std::uint64_t n = 0;
    if (!u64_at(in, pos, n) || in.size() < pos + n) return false;
    s.assign(in, pos, n);
    pos += n;
    return true;
  }
  static void put_u64(std::string& out, std::uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
  void reply(conn& c, const std::string& out) {
    if (::send(c.fd, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<long>(out.size())) drop(c);
  }
  bool has(const std::string& k) { return kv_.count(k) != 0; }
  void note(const std::string& k) {
    std::lock_guard<std::mutex> g(mu_);
    seen_.insert(k);
  }
  // Answers the waits that the latest set / add completed.
  void wake() {
    for (auto& w : conns_) {
      if (w.fd < 0 || w.waiting.empty()) continue;
      bool all = true;
      for (auto& k : w.waiting) all = all && has(k);
      if (!all) continue;
      w.waiting.clear();
      reply(w, std::string(1, '\0'));
    }
  }

  // Serves one complete query from c.in; false when it is incomplete or the connection was dropped.
  bool serve_one(conn& c) {
    if (c.in.empty()) return false;
    int t = static_cast<std::uint8_t>(c.in[0]);
    int o = dialect_ == 1 ? t + 1 : t;
    std::size_t pos = 1;
    std::string key, value;
    std::uint64_t n = 0;
    std::vector<std::string> keys;
    switch (o) {
      case validate: {
        if (dialect_ == 1 || c.in.size() < 5) return dialect_ == 1 ? (drop(c), false) : false;
        std::uint32_t m = 0;
        std::memcpy(&m, c.in.data() + 1, 4);
        if (m != 0x3C85F7CE) return drop(c), false;
        pos = 5;
        break;
      }
      case set:
        if (!str_at(c.in, pos, key) || !str_at(c.in, pos, value)) return false;
        note(key);
        kv_[key] = value;
        wake();
        break;
      case get:
        if (!str_at(c.in, pos, key)) return false;
        note(key);
        if (!has(key)) return drop(c), false;
        value.clear();
        put_u64(value, kv_[key].size());
        reply(c, value + kv_[key]);
        break;
      case add: {
        if (!str_at(c.in, pos, key) || !u64_at(c.in, pos, n)) return false;
        note(key);
        long long now = 0;
        if (has(key)) {
          char* end = nullptr;
          const std::string& v = kv_[key];
          now = std::strtoll(v.c_str(), &end, 10);
          if (v.empty() || *end) return drop(c), false;  // torch's std::stoll throws
        }
        now += static_cast<long long>(n);
        kv_[key] = std::to_string(now);
        value.clear();
        put_u64(value, static_cast<std::uint64_t>(now));
        reply(c, value);
        wake();
        break;
      }
      case check:
      case wait: {
        if (!u64_at(c.in, pos, n)) return false;
        for (std::uint64_t i = 0; i < n; ++i) {
          if (!str_at(c.in, pos, key)) return false;
          keys.push_back(key);
        }
        bool all = true;
        for (auto& k : keys) {
          note(k);
          all = all && has(k);
        }
        if (o == check)
          reply(c, std::string(1, all ? '\0' : '\1'));
        else if (all)
          reply(c, std::string(1, '\0'));
        else
          c.waiting = keys;
        break;
      }
      default:
        return drop(c), false;
    }
    if (c.fd >= 0) c.in.erase(0, pos);
    return c.fd >= 0;
  }

  int dialect_;
  unvalidated unvalidated_;
  loopback_listener listener_;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::vector<conn> conns_;  // the server thread's only
  std::map<std::string, std::string> kv_;
  std::mutex mu_;
  std::set<std::string> seen_;
  std::thread thread_;
};

}  // namespace cclite::test
