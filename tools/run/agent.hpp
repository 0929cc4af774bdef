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
//
// The pieces: agent_state.hpp (what the agent knows, key names, waits,
// failures, the host's lingering), agent_round.hpp (one round: claim, close,
// exchange, MASTER_ADDR/PORT), and here the agent itself (joining the job,
// the next round, the exit barrier, leaving).
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <cclite/tcp/ifname.hpp>
#include <cclite/tcp/store_client.hpp>
#include <cclite/tcp/store_server.hpp>

#include "agent_round.hpp"
#include "agent_state.hpp"
#include "job.hpp"
#include "net.hpp"
#include "node_watch.hpp"
#include "options.hpp"
#include "posix.hpp"

namespace cclite::run {

class agent : private agent_round {
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
    store_->set_owner(store_owner);
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
    (void)store_->set_within(key("left/" + me()), "1", deadline::after(store_budget_on_exit));
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
      return job_event{"lost the rendezvous store at " + ep_text_ + " (the cclite-run agent there gone?)", 1, false};
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
  /// failure) or a few seconds pass. A store that went away (its host lost)
  /// is not asked again: cclite-run exits as soon as its workers are stopped.
  void leave(int code) {
    watch_.stop();
    if (!store_ || watch_.store_lost()) return;
    const auto by = deadline::after(store_budget_on_exit);
    (void)store_->set_within(gkey("over"), std::to_string(code), by);  // newcomers waiting for a round stop
    (void)store_->set_within(key("left/" + me()), "1", by);
    linger(std::chrono::seconds(10) + to_ms(o_->node_timeout_s));
  }

 private:
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
};

}  // namespace cclite::run
