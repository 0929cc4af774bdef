// tools/run/agent_round.hpp - one round of the agents' rendezvous: the host
// opens it, every agent claims a node rank and publishes its node, the host
// closes it, and the members agree on MASTER_ADDR/PORT and start watching each
// other. An agent that comes after the round closed waits for the next one.
// Keys: agent.hpp's layout, under r<round>/.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <thread>

#include <cclite/tcp/store_client.hpp>

#include "agent_state.hpp"
#include "job.hpp"
#include "placement.hpp"
#include "posix.hpp"

namespace cclite::run {

class agent_round : protected agent_state {
 protected:
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
        (void)store_->set_within(key("left/" + me()), "1", deadline::after(store_budget_on_exit));
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

  std::string start_monitor(deadline until) {
    auto c = tcp::store_client::connect(ep_.host, static_cast<std::uint16_t>(ep_.port),
                                        deadline::min(until, deadline::after(std::chrono::seconds(30))),
                                        op_timeout(), user_token());
    if (!c) return "cannot open a second connection to the rendezvous: " + c.error().message();
    c.value()->set_owner(store_owner);
    watch_.start(std::move(c.value()), {key(""), node_, nodes_, o_->nnodes, o_->node_timeout_s, ep_text_});
    return {};
  }
};

}  // namespace cclite::run
