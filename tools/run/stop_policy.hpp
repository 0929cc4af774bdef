// tools/run/stop_policy.hpp - why the job stops and what it ends with: a
// worker's exit, another node's failure, a signal or --timeout each set the
// exit status, whether a restart may cure it and whether the agents meet again
// to take a new node in; then how it stops: SIGTERM to every worker's process
// group, SIGKILL after a grace period, and giving up on a worker that survives
// even that.
//
// The first reason to stop decides the exit status; a later stop can only
// bring the SIGKILL closer. The base of supervisor.hpp, whose poll loop calls
// these as exits, remote events, signals and deadlines arrive.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent.hpp"
#include "job.hpp"
#include "node_watch.hpp"
#include "options.hpp"
#include "output_relay.hpp"
#include "posix.hpp"
#include "trace_request.hpp"
#include "worker.hpp"

namespace cclite::run {

struct timings {
  std::chrono::milliseconds failure_grace{5000};  ///< SIGTERM -> SIGKILL after a worker fails
  std::chrono::milliseconds signal_grace{10000};  ///< forwarded signal -> SIGKILL
  std::chrono::milliseconds kill_wait{10000};     ///< SIGKILL -> give up on the process
  /// After the last exit, for output still in flight (children holding the pipes).
  std::chrono::milliseconds output_drain{1000};
  /// A failure's SIGTERM waits this long at most for the flight recorder
  /// files the running workers were asked for (trace_request.hpp).
  std::chrono::milliseconds trace_wait{3000};
};

class stop_policy : protected output_relay {
 protected:
  stop_policy(options opts, timings t, agent* peers)
      : opts_(std::move(opts)), t_(t), host_(host_name()), peers_(peers) {}

  using clock = std::chrono::steady_clock;

  void on_exit(worker& w, int status) {
    w.running = false;
    // Its last words first: what it wrote before exiting is already in the pipes.
    read_stream(w, false, 16);
    read_stream(w, true, 16);
    if (stopping_) return;  // an effect of the stop we started, not news
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;

    std::string how;
    if (WIFEXITED(status)) {
      exit_code_ = WEXITSTATUS(status);
      how = "exited with status " + std::to_string(*exit_code_);
    } else {
      int sig = WTERMSIG(status);
      exit_code_ = 128 + sig;
      how = "killed by signal " + signal_name(sig);
#ifdef WCOREDUMP
      if (WCOREDUMP(status)) how += " (core dumped)";
#endif
    }
    restartable_ = true;
    std::string msg = "rank " + std::to_string(w.rank) + " (host " + host_ + ", pid " +
                      std::to_string(w.pid) + ") " + how;
    if (peers_) {
      job_event first = peers_->report_failure(msg, *exit_code_);
      if (first.rescale) {  // our workers were stopped elsewhere to take a new node in
        rescale_ = true;
        say(msg + ": " + first.message);  // what stopped it: the newcomer, not a failure
        stop(SIGTERM, t_.failure_grace);
        return;
      }
      if (first.message != msg) {  // another node failed first: its failure is the job's
        say(msg + " after another node failed");
        msg = "the first failure: " + first.message;
        exit_code_ = first.exit_code;
        restartable_ = first.restartable;
      } else {
        msg += " (node " + std::to_string(peers_->node_rank()) + ")";
      }
    }
    if (int others = running_count(); others > 0)
      msg += "; stopping the other " + plural(others, "worker") + (peers_ ? " here" : "");
    if (peers_) msg += "; the job stops on every node";
    say(msg);
    stop_after_traces(t_.failure_grace);
  }

  // With the flight recorder on, where its files are and what reads them
  // (once per run): each worker whose communicator failed wrote one, and
  // those asked by stop_after_traces().
  void hint_traces() {
    if (traces_hinted_) return;
    traces_hinted_ = true;
    const std::string prefix = trace_prefix(opts_);
    if (prefix.empty()) return;
    say("flight recorder: the workers that failed in a collective, or were asked for their files, wrote " + prefix +
        "<host>.<pid>; read them with: cclite-trace " + prefix + "*" +
        (peers_ ? " (every node's files; a shared CCLITE_TRACE_FILE collects them)" : ""));
  }

  /// The stop of a failed or timed-out job. With the flight recorder on, the
  /// workers still running that catch its signal are first asked for their
  /// files (trace_request.hpp), and the SIGTERM waits until each wrote one or
  /// exited, at most t_.trace_wait (check_traces()).
  void stop_after_traces(std::chrono::milliseconds grace) {
    const std::string prefix = stopping_ ? std::string() : trace_prefix(opts_);
    const int sig = prefix.empty() ? 0 : trace_signal_of_env();
    std::vector<int> ranks;
    for (const worker& w : workers_) {
      if (sig == 0 || !w.running || !catches_signal(w.pid, sig)) continue;
      trace_asked a{w.rank, w.pid, prefix + host_ + "." + std::to_string(w.pid), {}};
      a.before = stamp_of(a.path);
      if (::kill(w.pid, sig) != 0) continue;
      asked_.push_back(a);
      ranks.push_back(w.rank);
    }
    if (asked_.empty()) {
      hint_traces();
      stop(SIGTERM, grace);
      return;
    }
    say("flight recorder: asked " + rank_list(ranks) + " for " + (ranks.size() == 1 ? "its file" : "their files") +
        " (" + signal_name(sig) + "); stopping " + (ranks.size() == 1 ? "it" : "them") + " once written (at most " +
        seconds(t_.trace_wait) + ")");
    stopping_ = true;  // exits from here on are effects of the stop
    traces_until_ = clock::now() + t_.trace_wait;
    traces_grace_ = grace;
    hint_traces();
  }

  /// While waiting for asked files: the SIGTERM once every asked worker that
  /// is still running has written its file, or when the wait is over.
  void check_traces() {
    if (!traces_until_) return;
    std::vector<int> missing;
    for (const trace_asked& a : asked_) {
      bool running = false;
      for (const worker& w : workers_) running = running || (w.pid == a.pid && w.running);
      if (running && stamp_of(a.path) == a.before) missing.push_back(a.rank);  // not written yet
    }
    if (!missing.empty() && clock::now() < *traces_until_) return;
    if (!missing.empty()) say("flight recorder: no file from " + rank_list(missing) + " within " + seconds(t_.trace_wait));
    stop(SIGTERM, traces_grace_);
  }

  /// Another node failed or was lost (or the rendezvous store went away).
  void handle_remote(const job_event& e) {
    if (stopping_) return;
    exit_code_ = e.exit_code;
    restartable_ = e.restartable;
    rescale_ = e.rescale;
    int n = running_count();
    say(e.message + (n > 0 ? "; stopping the " + plural(n, "worker") + " on this node" : ""));
    if (e.rescale) stop(SIGTERM, t_.failure_grace);
    else stop_after_traces(t_.failure_grace);
  }

  void handle_signal(int sig) {
    int n = running_count();
    if (n == 0) return;  // the job is over; we exit within output_drain anyway
    say("received " + signal_name(sig) + "; forwarding it to " + plural(n, "worker") +
        (kill_at_ ? "" : " (SIGKILL in " + seconds(t_.signal_grace) + " if they keep running)"));
    if (!exit_code_) exit_code_ = 128 + sig;
    rescale_ = false;  // a cancelled job does not go on to a larger round
    if (peers_)
      peers_->report_failure("cclite-run on node " + std::to_string(peers_->node_rank()) + " (host " +
                                 host_ + ") received " + signal_name(sig),
                             128 + sig, /*restartable=*/false);
    stop(sig, t_.signal_grace);
  }

  void check_deadlines() {
    auto now = clock::now();
    if (job_deadline_ && !stopping_ && now >= *job_deadline_) {
      char limit[32];
      std::snprintf(limit, sizeof(limit), "%g", opts_.timeout_s);
      say(std::string("job still running after --timeout ") + limit + " s; stopping all " +
          plural(running_count(), "worker") + " and exiting with status 124");
      exit_code_ = 124;
      stop_after_traces(t_.failure_grace);
    }
    check_traces();
    if (kill_at_ && !give_up_at_ && now >= *kill_at_) {
      std::string ranks;
      for (const worker& w : workers_)
        if (w.running) ranks += (ranks.empty() ? "" : ", ") + std::to_string(w.rank);
      if (!ranks.empty())
        say((ranks.find(',') == std::string::npos ? "rank " : "ranks ") + ranks +
            " still running " + seconds(stop_grace_) + " after " + signal_name(stop_signal_) +
            "; sending SIGKILL");
      signal_groups(SIGKILL);
      give_up_at_ = now + t_.kill_wait;
    }
  }

  /// Sends `sig` to every worker's process group and arms SIGKILL `grace` later.
  /// A later stop can only bring the SIGKILL closer, never postpone it.
  void stop(int sig, std::chrono::milliseconds grace) {
    stopping_ = true;
    traces_until_.reset();  // (a signal during the wait for traces stops at once)
    asked_.clear();
    signal_groups(sig);
    auto at = clock::now() + grace;
    if (!kill_at_ || at < *kill_at_) {
      kill_at_ = at;
      stop_signal_ = sig;
      stop_grace_ = grace;
    }
  }

  /// Includes the groups of workers that already exited: their children may
  /// live on. ESRCH (nobody left in the group) is the normal case there.
  void signal_groups(int sig) {
    for (const worker& w : workers_) ::kill(-w.pid, sig);
  }

  options opts_;
  timings t_;
  std::string host_;
  agent* peers_ = nullptr;

  std::optional<int> exit_code_;  ///< the first reason to stop decides it
  bool restartable_ = false;
  bool rescale_ = false;
  bool stopping_ = false;
  bool traces_hinted_ = false;  // hint_traces() said it
  int stop_signal_ = SIGTERM;
  std::chrono::milliseconds stop_grace_{0};
  std::optional<clock::time_point> job_deadline_;  ///< --timeout
  std::optional<clock::time_point> kill_at_;       ///< SIGKILL everyone
  std::optional<clock::time_point> give_up_at_;    ///< stop waiting for the unkillable
  std::optional<clock::time_point> traces_until_;  ///< stop_after_traces(): SIGTERM by then
  std::chrono::milliseconds traces_grace_{0};
  std::vector<trace_asked> asked_;
};

}  // namespace cclite::run
