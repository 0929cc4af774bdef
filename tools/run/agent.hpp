// tools/run/agent.hpp - the agents of a multi-node job meet, agree on node
// ranks and watch each other (torchrun's c10d rendezvous), round after round
// when the job restarts.
//
// Every node runs the same `cclite-run --nnodes N --rdzv-endpoint H:P ...`.
// The agent on host H (an address of this machine) hosts a cclite TCP store
// on port P for the whole job; if the port is taken there, or H is not this
// machine, the agent is a client (so "the first to bind" hosts when several
// agents share H). The host writes cclite-run/job = "<id> <nnodes>", which
// every joiner compares with its own: an agent of another job at the same
// endpoint is refused with a message naming both ids.
//
// Keys, under cclite-run/<rdzv-id>/: `round` (the round the job is in; the
// host opens each), then per round, under r<round>/:
//   claim/<k>   add() counter: the first to bump it owns node rank k
//   next        add() counter: automatic node ranks in joining order (the
//               host takes 0, so MASTER_ADDR is the endpoint's machine)
//   node/<k>    "host addr nproc pid hosting" of node k
//   closed      how many nodes the round has (the host closes it: all MAX,
//               or MIN and --rdzv-last-call without a newcomer)
//   master      MASTER_PORT, a free port picked by node 0
//   hb/<k>, failures, failure   node_watch.hpp: heartbeats, the first failure
//   done/<k>, left/<k>  exit barrier; the host keeps the store up until every
//               node has left (or is lost), so nobody loses it mid-job
//   waiting     add() counter: agents that came after the round closed with
//               fewer than MAX nodes; the running nodes see it (node_watch.hpp)
//               and all restart their workers in the next round, which takes
//               the newcomers in (torchrun's scale-up; not counted as a restart)
// and `over` (the job's exit status, written when an agent leaves the job for
// good): an agent still waiting for a next round stops waiting.
//
// Every wait has a deadline: --rdzv-timeout for joining, --node-timeout for
// liveness, a few seconds for leaving.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cclite/tcp/ifname.hpp>
#include <cclite/tcp/store_client.hpp>
#include <cclite/tcp/store_server.hpp>

#include "job.hpp"
#include "net.hpp"
#include "node_watch.hpp"
#include "options.hpp"
#include "placement.hpp"
#include "posix.hpp"

namespace cclite::run {

class agent {
 public:
  agent() = default;
  agent(const agent&) = delete;
  agent& operator=(const agent&) = delete;
  ~agent() {
    watch_.stop();
  }

  /// Meets the other nodes' agents at --rdzv-endpoint and fills in `r`
  /// (node rank, rank offset, world size, MASTER_ADDR/PORT). Then starts the
  /// heartbeat thread. Returns "" on success, else one line saying what is
  /// wrong and what to do; the other agents are told, so they stop waiting.
  std::string join(const options& o, rendezvous& r) {
    o_ = &o;
    host_ = host_name();
    if (std::string err = parse_host_port(o.rdzv_endpoint, default_rdzv_port, ep_); !err.empty())
      return "--rdzv-endpoint " + err;
    ep_text_ = format_host_port(ep_.host, ep_.port);
    if (std::string err = watch_.open(); !err.empty()) return err;
    auto until = deadline::after(to_ms(o.rdzv_timeout_s));
    // This node's own mistakes (a CCLITE_SOCKET_IFNAME that selects nothing)
    // end here, before it joins: the others are not kept waiting for it.
    if (std::string err = my_address(addr_); !err.empty()) return err;

    // The endpoint's machine hosts the store; of several agents there, the
    // first to bind. --rdzv-conf is_host overrides: true hosts here (on every
    // address when the endpoint's name is not this machine's), false never.
    std::string bind = o.rdzv_is_host == 0 ? "" : local_address_of(ep_.host);
    if (o.rdzv_is_host == 1 && bind.empty()) bind = ep_.host.find(':') != std::string::npos ? "::" : "0.0.0.0";
    // A host name that resolves to loopback here (Debian's "127.0.1.1 node0"
    // in /etc/hosts) still names this machine for the others: listen on
    // every address, or they could not reach us.
    if (!bind.empty() && is_loopback(bind) && !is_loopback(ep_.host) && ep_.host != "localhost")
      bind = bind.find(':') != std::string::npos ? "::" : "0.0.0.0";
    if (!bind.empty()) {
      tcp::server_options so;
      so.log = true;  // strangers and other jobs get a line on stderr
      so.token = user_token();
      auto s = tcp::store_server::start(bind, static_cast<std::uint16_t>(ep_.port), so);
      if (s)
        server_ = std::move(s.value());
      else if (o.rdzv_is_host == 1)
        return "--rdzv-conf is_host=true, but the agents' store cannot start here: " + s.error().message();
      else
        info("the endpoint is this machine but " + s.error().message() + "; joining as a client");
    }
    auto c = tcp::store_client::connect(ep_.host, static_cast<std::uint16_t>(ep_.port), until,
                                        op_timeout(), user_token());
    if (!c)
      return "cannot reach the rendezvous at " + ep_text_ + " within " + secs(o.rdzv_timeout_s) +
             ": " + c.error().message() +
             " (start the same command on the node that owns " + ep_.host +
             ", or check the address and firewall)";
    store_ = std::move(c.value());
    pfx_ = "cclite-run/" + o.rdzv_id + "/";
    if (server_) info("hosting the rendezvous store on " + server_->address());

    std::string err = server_ ? ok_or(store_->set("cclite-run/job", o.rdzv_id + " " + nnodes_text()))
                              : check_job(until);
    if (!err.empty()) return err;
    if (!server_) {  // join the round the job is in now
      std::string v;
      auto got = store_->get(gkey("round"), until);
      if (!got.ok()) return ok_or(got.error());
      round_ = std::atoi(got.value().c_str());
    }
    return join_round(r, until);
  }

  /// After a failure, with restarts left, or a membership change: leaves this
  /// round and meets the others again in the next one (the nodes alive by
  /// then and those waiting to join; with --nnodes MIN:MAX at least MIN).
  /// Fills in `r` as join() does.
  std::string next_round(rendezvous& r) {
    watch_.stop();
    (void)store_->set(key("left/" + me()), "1");
    ++round_;
    return join_round(r, deadline::after(to_ms(o_->rdzv_timeout_s)));
  }

  int node_rank() const { return node_; }

  /// Readable when take_event() has something.
  int event_fd() const { return watch_.fd(); }

  std::optional<job_event> take_event() { return watch_.take(); }

  /// Tells every node that this one failed. Returns the job's first failure:
  /// this one, or an earlier one from another node (whose code then wins).
  job_event report_failure(const std::string& message, int code, bool restartable = true) {
    return publish_failure(message, code, restartable);
  }

  /// Polled while waiting for the other agents: returns a signal that ends
  /// the wait (0: none). A cancelled job must not sit in a rendezvous.
  void set_interrupt(std::function<int()> f) { interrupted_ = std::move(f); }
  /// The signal that ended a wait, 0 if none.
  int interrupt_signal() const { return interrupt_signal_; }

  /// After this node's workers all exited 0: waits until every node's did
  /// (torchrun's exit barrier), a failure, a lost node, or a signal: when
  /// `signal_fd` is readable, `take_signal()` returns the signal that ends
  /// the wait (0 for none, e.g. only SIGCHLDs). Returns the event that ended
  /// the job, if any (nullopt also after a signal; the caller saw it).
  template <class TakeSignal>
  std::optional<job_event> exit_barrier(int signal_fd, TakeSignal take_signal) {
    if (!store_) return std::nullopt;
    if (!ok(store_->set(key("done/" + me()), "1")))
      return job_event{"lost the rendezvous store at " + ep_text_ + " (its agent gone?)", 1, false};
    for (;;) {
      int done = 0;
      for (int k = 0; k < group_; ++k) {
        auto c = store_->check(key("done/" + std::to_string(k)));
        if (c.ok() && c.value()) ++done;
      }
      if (done == group_) return std::nullopt;
      pollfd p[2] = {{watch_.fd(), POLLIN, 0}, {signal_fd, POLLIN, 0}};
      ::poll(p, 2, 500);
      if (p[1].revents && take_signal() != 0) return std::nullopt;
      if (auto e = take_event()) return e;
    }
  }

  /// Leaves the job for good with exit status `code`. The host keeps serving
  /// until every other node has left (they may still need to read the
  /// failure) or a few seconds pass.
  void leave(int code) {
    watch_.stop();
    if (!store_) return;
    (void)store_->set(gkey("over"), std::to_string(code));  // newcomers waiting for a round stop
    (void)store_->set(key("left/" + me()), "1");
    linger(std::chrono::seconds(10) + to_ms(o_->node_timeout_s));
  }

 private:
  /// One round of the rendezvous: claim a node rank, wait until the round is
  /// closed (all MAX nodes, or MIN and --rdzv-last-call without newcomers),
  /// exchange the nodes' details, agree on MASTER_ADDR/PORT, start watching.
  std::string join_round(rendezvous& r, deadline until) {
    node_ = -1;
    nodes_.clear();
    group_ = 0;
    std::string err;
    for (;;) {
      if (server_) {
        // The host opens each round: it takes node 0 (unless pinned elsewhere)
        // and only then announces the round, so the endpoint's machine is node 0.
        if (o_->node_rank <= 0) {
          auto n = store_->add(key("claim/0"), 1);
          if (!n.ok()) return ok_or(n.error());
          if (n.value() == 1) node_ = 0;
        }
        err = ok_or(store_->set(gkey("round"), std::to_string(round_)));
      } else {
        err = wait_round(until);
      }
      if (err.empty()) err = claim_node_rank();
      if (!err.empty()) break;

      err = ok_or(store_->set(key("hb/" + me()), "0"));
      if (err.empty())
        err = ok_or(store_->set(key("node/" + me()),
                                to_record({host_, addr_, o_->nproc_per_node, ::getpid(), server_ ? 1 : 0})));
      std::string closed;
      if (err.empty()) err = server_ ? close_round(until, closed) : wait_key("closed", until, closed);
      if (!err.empty()) break;
      group_ = std::atoi(closed.c_str());
      if (node_ < group_) break;
      // Too late for this round (elastic: it closed without us): the next
      // one, which the running nodes open for us (node_watch sees `waiting`).
      info("round " + std::to_string(round_) + " closed with " + std::to_string(group_) +
           " nodes before this one joined; waiting for the running nodes to take it in");
      if (auto w = store_->add(key("waiting"), 1); !w.ok()) {
        err = ok_or(w.error());
        break;
      }
      ++round_;
      node_ = -1;
    }
    for (int k = 0; err.empty() && k < group_; ++k) {
      std::string v;
      err = wait_key("node/" + std::to_string(k), until, v);
      if (err.empty()) nodes_.push_back(parse_node_record(v));
    }
    std::string master;
    if (err.empty()) {
      const char* spec = std::getenv("CCLITE_SOCKET_IFNAME");
      if (!spec || !*spec) spec = std::getenv("NCCL_SOCKET_IFNAME");
      err = choose_master_addr(nodes_, o_->master_addr, ep_.host, spec && *spec, master);
    }
    // Node 0 picks MASTER_PORT; rank 0's worker will bind it.
    int port = o_->master_port;
    if (err.empty() && port <= 0) {
      std::string v;
      if (node_ == 0) {
        port = find_free_port(master.c_str(), v);  // a name (not an IPv4 literal): any address
        if (port == 0) err = "cannot find a free TCP port on " + master + ": " + v;
        if (err.empty()) err = ok_or(store_->set(key("master"), std::to_string(port)));
      } else {
        err = wait_key("master", until, v);
        if (err.empty()) port = std::atoi(v.c_str());
      }
    }
    if (!err.empty()) {
      // A member of the round (or of one not closed yet) tells the others, so
      // they stop waiting for it. An agent that holds no node rank (one too
      // many, a --node-rank taken, a newcomer waiting for the next round)
      // must not: the job runs on without it.
      if (node_ >= 0 && (group_ == 0 || node_ < group_)) {
        publish_failure(err + " (node " + me() + ", host " + host_ + ")", 1, false);
        (void)store_->set(key("left/" + me()), "1");
      }
      linger(std::chrono::seconds(10));
      return err;
    }

    place_node(nodes_, node_, r);
    r.master_addr = master;
    r.master_port = port;
    r.endpoint = format_host_port(r.master_addr, port);
    info("node " + me() + " of " + std::to_string(group_) + " (host " + host_ + ", " + addr_ +
         "): ranks " + std::to_string(r.rank_offset) + ".." +
         std::to_string(r.rank_offset + o_->nproc_per_node - 1) + " of " +
         std::to_string(r.world_size) + "; workers meet at " + r.endpoint +
         (round_ > 0 ? " (round " + std::to_string(round_) + ")" : ""));
    return start_monitor(until);
  }

  /// Non-host: waits until the host has opened round_ (or a later one, then
  /// joins that). A failure published in the round we come from does not
  /// count: it is why we are here.
  std::string wait_round(deadline until) {
    for (;;) {
      auto v = store_->get(gkey("round"), deadline::min(until, deadline::after(std::chrono::seconds(1))));
      if (!v.ok() && v.error().code() != errc::timeout) return ok_or(v.error());
      if (v.ok() && std::atoi(v.value().c_str()) >= round_) {
        round_ = std::atoi(v.value().c_str());
        return {};
      }
      auto over = store_->check(gkey("over"));
      if (over.ok() && over.value()) {
        auto code = store_->get(gkey("over"), deadline::after(std::chrono::seconds(5)));
        return "job '" + o_->rdzv_id + "' ended (status " + (code.ok() ? code.value() : "?") +
               ") before this node could join it";
      }
      if (std::string e = check_interrupt(); !e.empty()) return e;
      if (until.expired())
        return "rendezvous timed out after " + secs(o_->rdzv_timeout_s) + " waiting for round " +
               std::to_string(round_) + " of job '" + o_->rdzv_id + "' at " + ep_text_ +
               " (is the agent on the endpoint's node still running?)";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  /// Host: closes the round once MAX nodes joined, or at least MIN and none
  /// joined for --rdzv-last-call. Nodes are numbered in joining order, so the
  /// first `closed` indices are exactly the members.
  std::string close_round(deadline until, std::string& closed) {
    const int max = o_->nnodes, min = min_nodes();
    int seen = -1;
    auto changed = clock::now();
    for (;;) {
      int n = 0;
      while (n < max) {
        auto c = store_->check(key("node/" + std::to_string(n)));
        if (!c.ok()) return ok_or(c.error());
        if (!c.value()) break;
        ++n;
      }
      if (n != seen) {
        seen = n;
        changed = clock::now();
      }
      if (n == max || (n >= min && clock::now() - changed >= to_ms(o_->rdzv_last_call_s))) {
        closed = std::to_string(n);
        info("round " + std::to_string(round_) + " closed with " + closed + " node" +
             (n == 1 ? "" : "s") + (n < max ? " (--nnodes " + nnodes_text() + ")" : ""));
        return ok_or(store_->set(key("closed"), closed));
      }
      if (std::string e = check_interrupt(); !e.empty()) return e;
      if (until.expired())
        return "rendezvous timed out after " + secs(o_->rdzv_timeout_s) + ": " + std::to_string(n) +
               " of " + std::to_string(min) + (min < max ? " (at least)" : "") + " nodes joined job '" +
               o_->rdzv_id + "' at " + ep_text_ +
               "; start the same command (same --rdzv-id, --nnodes, --rdzv-endpoint) on every node";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

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
  /// none: then it is the --rdzv-id check below that keeps other jobs out,
  /// with a message naming both ids (the workers get a token derived from the id).
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

  std::string check_job(deadline until) {
    // A cclite-run host writes it right after it starts: a long silence means
    // something else (a cclite job's own store) listens there.
    auto v = store_->get("cclite-run/job", deadline::min(until, deadline::after(std::chrono::seconds(30))));
    if (!v.ok()) {
      if (v.error().code() == errc::timeout)
        return "the rendezvous at " + ep_text_ +
               " answers but names no job (is it a cclite-run agent of an older version?)";
      return ok_or(v.error());
    }
    std::istringstream in(v.value());
    std::string id, nnodes;
    in >> id >> nnodes;
    if (id != o_->rdzv_id)
      return "the rendezvous at " + ep_text_ + " belongs to job '" + id +
             "' but this agent was started with --rdzv-id " + o_->rdzv_id +
             "; refusing to join another job (use the same --rdzv-id on every node, or another "
             "--rdzv-endpoint port for this job)";
    if (nnodes != nnodes_text())
      return "job '" + id + "' at " + ep_text_ + " has --nnodes " + nnodes +
             " but this agent was started with --nnodes " + nnodes_text() +
             "; run the same command on every node";
    return {};
  }

  std::string claim_node_rank() {
    if (node_ >= 0) return {};  // the host took 0
    const int max = o_->nnodes;
    auto claim = [this](int k, bool& mine) -> std::string {
      auto n = store_->add(key("claim/" + std::to_string(k)), 1);
      if (!n.ok()) return ok_or(n.error());
      mine = n.value() == 1;
      return {};
    };
    bool mine = false;
    if (o_->node_rank >= 0) {
      if (std::string e = claim(o_->node_rank, mine); !e.empty()) return e;
      if (!mine)
        return "--node-rank " + std::to_string(o_->node_rank) + " is already taken in job '" +
               o_->rdzv_id + "'; give every node its own --node-rank, or leave it out everywhere";
      node_ = o_->node_rank;
      return {};
    }
    for (;;) {
      auto n = store_->add(key("next"), 1);
      if (!n.ok()) return ok_or(n.error());
      int k = static_cast<int>(n.value() - 1);
      if (k >= max)
        return "job '" + o_->rdzv_id + "' already has its " + std::to_string(max) +
               " nodes; this agent (host " + host_ +
               ") is one too many (an agent started twice, or --nnodes too small?)";
      if (std::string e = claim(k, mine); !e.empty()) return e;
      if (mine) {
        node_ = k;
        return {};
      }
    }
  }

  /// The address the other nodes reach this one at: the interface that
  /// CCLITE_SOCKET_IFNAME / NCCL_SOCKET_IFNAME selects, else the one that
  /// routes to the endpoint (the endpoint itself on its own machine).
  std::string my_address(std::string& out) {
    const char* spec = std::getenv("CCLITE_SOCKET_IFNAME");
    if (!spec || !*spec) spec = std::getenv("NCCL_SOCKET_IFNAME");
    if (spec && *spec) {
      auto c = tcp::choose_interface();
      if (!c.ok()) return c.error().message();
      out = tcp::address_text(c.value().iface.addr);
      info("node address " + out + ": " + c.value().reason);
      return {};
    }
    out = route_address_to(ep_.host, ep_.port);
    if (out.empty()) return "cannot find a local address that reaches " + ep_text_;
    info("node address " + out + ": the interface that routes to the endpoint " + ep_text_);
    return {};
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

  std::string start_monitor(deadline until) {
    auto c = tcp::store_client::connect(ep_.host, static_cast<std::uint16_t>(ep_.port),
                                        deadline::min(until, deadline::after(std::chrono::seconds(30))),
                                        op_timeout(), user_token());
    if (!c) return "cannot open a second connection to the rendezvous: " + c.error().message();
    watch_.start(std::move(c.value()), {key(""), node_, nodes_, o_->nnodes, o_->node_timeout_s, ep_text_});
    return {};
  }

  const options* o_ = nullptr;
  std::string host_;
  host_port ep_;
  std::string ep_text_;
  std::string pfx_;
  std::string addr_;  ///< this node's address (my_address)
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
