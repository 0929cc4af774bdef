// tools/run/agent_state.hpp - what a cclite-run agent knows of the rendezvous
// (its options, the agents' store, its round, node rank and the round's nodes)
// and the store helpers that every step of it uses: the key names of
// agent.hpp's layout, waits that a published failure or a signal ends,
// publishing this node's failure, and the host lingering until the others
// have left. The base of agent_round.hpp and agent.hpp.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cclite/tcp/store_client.hpp>
#include <cclite/tcp/store_server.hpp>

#include "job.hpp"
#include "net.hpp"
#include "node_watch.hpp"
#include "options.hpp"
#include "placement.hpp"
#include "posix.hpp"

namespace cclite::run {

class agent_state {
 protected:
  /// Who hosts the agents' store, as its timeouts name it ("is ... stuck or overloaded?").
  static constexpr const char* store_owner = "the cclite-run agent there";

  int min_nodes() const { return o_->min_nnodes > 0 ? o_->min_nnodes : o_->nnodes; }
  std::string nnodes_text() const {
    return min_nodes() == o_->nnodes ? std::to_string(o_->nnodes)
                                     : std::to_string(min_nodes()) + ":" + std::to_string(o_->nnodes);
  }

  /// On the host: keeps the store up until every node that joined has left
  /// (a node that never joined, or was lost, is not waited for), for at most `most`.
  void linger(std::chrono::milliseconds most) {
    if (!server_) return;
    auto until = clock::now() + most;
    // A node whose heartbeat stands still for a few periods is dead: its
    // agent's monitor beats until the moment it leaves.
    const auto silent = std::min<std::chrono::milliseconds>(std::chrono::seconds(3), to_ms(o_->node_timeout_s));
    const int n = std::max(group_, o_->nnodes);  // a failed join: whoever got that far
    std::vector<bool> gone(static_cast<std::size_t>(n), false);
    std::vector<std::string> beat(static_cast<std::size_t>(n));
    std::vector<clock::time_point> changed(static_cast<std::size_t>(n), clock::now());
    while (clock::now() < until) {
      bool all = true;
      for (int k = 0; k < n; ++k) {
        if (!gone[k]) {
          auto joined = store_->check(key("node/" + std::to_string(k)));
          auto left = store_->check(key("left/" + std::to_string(k)));
          auto hb = store_->get(key("hb/" + std::to_string(k)), deadline::after(std::chrono::milliseconds(100)));
          if (hb.ok() && hb.value() != beat[k]) {
            beat[k] = hb.value();
            changed[k] = clock::now();
          }
          gone[k] = (joined.ok() && !joined.value()) || (left.ok() && left.value()) ||
                    clock::now() - changed[k] > silent ||
                    watch_.lost(k);
        }
        all = all && gone[k];
      }
      if (all) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  static std::chrono::milliseconds to_ms(double s) {
    return std::chrono::milliseconds(static_cast<long long>(s * 1000));
  }
  static std::string secs(double s) { return seconds_text(s); }
  std::chrono::milliseconds op_timeout() const {
    return std::max(std::chrono::milliseconds(5000), to_ms(o_->node_timeout_s));
  }
  /// Keys of the current round; gkey: of the whole job.
  std::string key(const std::string& k) const { return pfx_ + "r" + std::to_string(round_) + "/" + k; }
  std::string gkey(const std::string& k) const { return pfx_ + k; }
  /// The agents' store proves the token the user set (CCLITE_RDZV_TOKEN), or
  /// none: then it is the --rdzv-id check (agent.hpp's check_job) that keeps
  /// other jobs out, with a message naming both ids (the workers get a token
  /// derived from the id).
  static std::string user_token() {
    const char* t = std::getenv("CCLITE_RDZV_TOKEN");
    return t ? t : "";
  }
  std::string me() const { return std::to_string(node_); }
  static bool ok(const status& s) { return s.ok(); }
  static std::string ok_or(const status& s) {
    return s.ok() ? std::string() : "rendezvous store: " + s.message();
  }
  void info(const std::string& line) {
    if (debug_on()) write_all(STDERR_FILENO, "cclite-run: INFO " + line + "\n");
  }

  /// get() in one-second slices, so that a failure another node published
  /// (or a store that went away) ends the wait at once.
  std::string wait_key(const std::string& k, deadline until, std::string& out) {
    for (;;) {
      auto v = store_->get(key(k), deadline::min(until, deadline::after(std::chrono::seconds(1))));
      if (v.ok()) {
        out = v.value();
        return {};
      }
      if (v.error().code() != errc::timeout) return ok_or(v.error());
      if (std::string e = check_interrupt(); !e.empty()) return e;
      auto f = store_->check(key("failure"));
      if (f.ok() && f.value()) {
        auto m = store_->get(key("failure"), deadline::after(std::chrono::seconds(5)));
        if (m.ok()) return "another node failed: " + parse_failure(m.value()).message;
      }
      if (until.expired()) {
        std::string joined;
        int n = 0;
        for (int j = 0; j < o_->nnodes; ++j) {
          auto c = store_->check(key("node/" + std::to_string(j)));
          if (c.ok() && c.value()) ++n;
        }
        return "rendezvous timed out after " + secs(o_->rdzv_timeout_s) + " waiting for " + k +
               ": " + std::to_string(n) + " of " + nnodes_text() +
               " nodes joined job '" + o_->rdzv_id + "' at " + ep_text_ +
               "; start the same command (same --rdzv-id, --nnodes, --rdzv-endpoint) on every node";
      }
    }
  }

  job_event publish_failure(const std::string& message, int code, bool restartable) {
    if (!store_) return {message, code, restartable};
    std::lock_guard<std::mutex> lock(publish_mu_);
    return run::publish_failure(*store_, key(""), {message, code, restartable});
  }

  /// "" or the line that ends a wait because of a signal.
  std::string check_interrupt() {
    int sig = interrupted_ ? interrupted_() : 0;
    if (sig == 0) return {};
    interrupt_signal_ = sig;
    return "received " + signal_name(sig) + " while waiting for the other nodes";
  }

  const options* o_ = nullptr;
  std::string host_;
  host_port ep_;
  std::string ep_text_;
  std::string pfx_;
  std::string addr_;  ///< this node's address (agent.hpp's my_address)
  int round_ = 0;     ///< rendezvous round: 0, then one more per restart
  int node_ = -1;
  int group_ = 0;     ///< nodes in this round
  std::vector<node_info> nodes_;
  std::unique_ptr<tcp::store_server> server_;
  std::unique_ptr<tcp::store_client> store_;  ///< main thread only (under publish_mu_)
  std::mutex publish_mu_;

  node_watch watch_;
  std::function<int()> interrupted_;
  int interrupt_signal_ = 0;
};

}  // namespace cclite::run
