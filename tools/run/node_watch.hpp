// tools/run/node_watch.hpp - the heartbeat thread of a cclite-run agent.
//
// While a round of the job runs, every agent bumps its heartbeat key in the
// agents' store and reads the others' (on a connection of its own: a store is
// one thread's). It reports, through a pipe the supervisor polls:
//   - a failure another node published (the job's first failure);
//   - a node whose heartbeat stood still for --node-timeout (lost; published
//     as the job's failure unless one came first);
//   - the store itself going away (the endpoint's agent is gone);
//   - a node waiting to join (agent.hpp's `waiting` key) while the round has
//     fewer than --nnodes MAX nodes: torchrun's scale-up. It is published like
//     a failure (the first event of the round wins), so every node restarts
//     its workers for the membership change, not for a failure.
// Only the first event counts. Keys are those of agent.hpp, under the
// round's prefix.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cclite/tcp/store_client.hpp>

#include "placement.hpp"
#include "posix.hpp"

namespace cclite::run {

/// Something that ends this node's part of the job, decided elsewhere.
struct job_event {
  std::string message;  ///< one line, without "cclite-run: "
  int exit_code = 1;
  /// A restart (--max-restarts) may cure it: a worker failed or a node was
  /// lost; not a signal (the job is being cancelled) or a lost store.
  bool restartable = true;
  /// Not a failure: a node waits to join, so every node stops its workers
  /// and the agents meet in a larger round. Not counted as a restart.
  bool rescale = false;
};


/// "CODE KIND message" in the store's failure key -> the event. KIND: 0 not
/// restartable, 1 restartable, 2 a membership change (rescale).
inline job_event parse_failure(const std::string& v) {
  job_event e;
  std::istringstream in(v);
  int kind = 1;
  in >> e.exit_code >> kind;
  in.get();  // the space before the message
  std::getline(in, e.message);
  if (e.exit_code <= 0) e.exit_code = 1;
  e.restartable = kind != 0;
  e.rescale = kind == 2;
  return e;
}

/// How long telling the store something on the way out may take (a failure,
/// leaving): a store that does not answer by then went with its host, and
/// this node's agent must not outlive its job by an op timeout per call.
inline constexpr std::chrono::seconds store_budget_on_exit{5};

/// Publishes `mine` as the job's failure unless one came first (an add()
/// counter decides); returns the failure that counts. Within
/// store_budget_on_exit; a store that does not answer leaves `mine`.
inline job_event publish_failure(cclite::store& s, const std::string& round_prefix, job_event mine) {
  const auto by = deadline::after(store_budget_on_exit);
  auto n = s.add_within(round_prefix + "failures", 1, by);
  if (!n.ok()) return mine;
  if (n.value() == 1) {
    const char* kind = mine.rescale ? " 2 " : mine.restartable ? " 1 " : " 0 ";
    (void)s.set_within(round_prefix + "failure", std::to_string(mine.exit_code) + kind + mine.message, by);
    return mine;
  }
  auto first = s.get_within(round_prefix + "failure", by, by);
  return first.ok() ? parse_failure(first.value()) : mine;
}

inline std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", s);
  return b;
}

class node_watch {
 public:
  struct config {
    std::string prefix;  ///< the round's key prefix
    int me = 0;          ///< this node's rank in the round
    std::vector<node_info> nodes;
    int max_nodes = 0;  ///< --nnodes MAX: a waiting node is taken in while the round has fewer
    double node_timeout_s = 15;
    std::string endpoint;  ///< host:port of the store, for messages
  };

  node_watch() = default;
  node_watch(const node_watch&) = delete;
  node_watch& operator=(const node_watch&) = delete;
  ~node_watch() {
    stop();
    close_fd(pipe_[0]);
    close_fd(pipe_[1]);
  }

  /// Creates the event pipe; "" or what failed.
  std::string open() {
    if (!make_cloexec_pipe(pipe_) || !set_nonblocking(pipe_[0]) || !set_nonblocking(pipe_[1]))
      return std::string("cannot create a pipe: ") + std::strerror(errno);
    return {};
  }

  /// Readable when take() has something.
  int fd() const { return pipe_[0]; }

  /// Starts watching a round over `conn` (owned from now on).
  void start(std::unique_ptr<tcp::store_client> conn, config c) {
    stop();
    take();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = false;
      posted_ = false;
      event_.reset();
    }
    c_ = std::move(c);
    lost_.assign(c_.nodes.size(), false);
    store_lost_ = false;
    thread_ = std::thread([this, s = std::shared_ptr<tcp::store_client>(std::move(conn))] { run(*s); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::optional<job_event> take() {
    char buf[16];
    while (pipe_[0] >= 0 && ::read(pipe_[0], buf, sizeof buf) > 0) {
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto e = std::move(event_);
    event_.reset();
    return e;
  }

  /// Node k was declared lost (read after stop()).
  bool lost(int k) const { return k >= 0 && k < static_cast<int>(lost_.size()) && lost_[k]; }

  /// The store stopped answering (its host or its agent is gone): nothing
  /// more can be told to the other nodes through it (read after stop()).
  bool store_lost() const { return store_lost_; }

 private:
  std::string key(const std::string& k) const { return c_.prefix + k; }

  void post(job_event e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (posted_) return;  // the first event decides
      posted_ = true;
      event_ = std::move(e);
    }
    char b = 1;
    ssize_t n = ::write(pipe_[1], &b, 1);
    (void)n;
  }

  void run(tcp::store_client& s) {
    const auto limit = std::chrono::milliseconds(static_cast<long long>(c_.node_timeout_s * 1000));
    const auto period = std::chrono::milliseconds(std::clamp<long long>(limit.count() / 5, 100, 1000));
    const int n = static_cast<int>(c_.nodes.size());
    std::vector<std::string> last(n);
    std::vector<clock::time_point> changed(n, clock::now());
    std::vector<bool> done(n, false);
    long long beat = 0;
    auto lost_store = [&](const status& st) {
      std::string host = "the endpoint's machine";
      for (const node_info& ni : c_.nodes)
        if (ni.hosting) host = "host " + ni.host;
      store_lost_ = true;  // before the post: leaving then skips the store
      post({"lost the rendezvous store on " + host + ": " + st.message(), 1, false});
    };
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, period, [this] { return stopping_; })) return;
      }
      if (auto st = s.set(key("hb/" + std::to_string(c_.me)), std::to_string(++beat)); !st.ok())
        return lost_store(st);
      auto f = s.check(key("failure"));
      if (!f.ok()) return lost_store(f.error());
      if (f.value()) {
        auto m = s.get(key("failure"), deadline::after(std::chrono::seconds(5)));
        if (m.ok()) return post(parse_failure(m.value()));
      }
      if (n < c_.max_nodes) {
        auto w = s.check(key("waiting"));
        if (!w.ok()) return lost_store(w.error());
        if (w.value() && !finishing(s, n)) {
          std::string msg = "a node is waiting to join (the job has " + std::to_string(n) + " of at most " +
                            std::to_string(c_.max_nodes) +
                            " nodes); the workers restart on every node to take it in";
          return post(publish_failure(s, c_.prefix, {msg, 1, true, /*rescale=*/true}));
        }
      }
      for (int k = 0; k < n; ++k) {
        if (k == c_.me || done[k]) continue;
        auto d = s.check(key("left/" + std::to_string(k)));
        if (d.ok() && d.value()) {
          done[k] = true;
          continue;
        }
        auto v = s.get(key("hb/" + std::to_string(k)), deadline::after(std::chrono::seconds(5)));
        if (!v.ok()) return lost_store(v.error());
        auto now = clock::now();
        if (v.value() != last[k]) {
          last[k] = v.value();
          changed[k] = now;
        } else if (now - changed[k] > limit) {
          lost_[k] = true;
          const node_info& ni = c_.nodes[k];
          std::string msg = "node " + std::to_string(k) + " (host " + ni.host + ", " + ni.addr +
                            ", agent pid " + std::to_string(ni.pid) +
                            ") is lost: its cclite-run agent sent no heartbeat for " +
                            seconds_text(c_.node_timeout_s) +
                            " (killed, or the network between the nodes is down)";
          return post(publish_failure(s, c_.prefix, {msg, 1, true}));
        }
      }
    }
  }

  /// Some node's workers have all finished (exit barrier): the job is ending,
  /// so a newcomer is not taken in (it would restart finished work).
  bool finishing(tcp::store_client& s, int n) const {
    for (int k = 0; k < n; ++k) {
      auto d = s.check(key("done/" + std::to_string(k)));
      if (d.ok() && d.value()) return true;
    }
    return false;
  }

  config c_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool posted_ = false;
  std::optional<job_event> event_;
  std::vector<bool> lost_;  ///< written by the thread before it posts, read after stop()
  bool store_lost_ = false;  ///< likewise
  int pipe_[2] = {-1, -1};
};

}  // namespace cclite::run
