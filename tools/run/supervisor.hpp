// tools/run/supervisor.hpp - runs the job: starts the workers, relays their
// output, forwards signals, stops everyone when one fails or time runs out.
//
// A single thread and a single poll() over the signal pipe and every worker
// pipe: no locks, and output, exits and signals are handled in arrival order.
// Every wait is bounded: SIGTERM is followed by SIGKILL after a grace period,
// and a worker that survives even SIGKILL is abandoned after a while with a
// message instead of hanging the launcher.
//
// The pieces: output_relay.hpp (the workers' pipes, log files and console
// output; our messages), stop_policy.hpp (what an exit, a remote failure, a
// signal or a deadline means for the job, and stopping the workers), and here
// the loop itself: starting the workers, poll(), reaping, the exit barrier.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "agent.hpp"
#include "cpu_bind.hpp"
#include "job.hpp"
#include "logs.hpp"
#include "options.hpp"
#include "output_relay.hpp"
#include "signals.hpp"
#include "stop_policy.hpp"
#include "worker.hpp"

namespace cclite::run {

class supervisor : private stop_policy {
 public:
  /// `peers`: the agents' rendezvous of a multi-node job (nullptr on one node
  /// or in a static launch): a failure here is told to every node, and a
  /// failure or a lost node elsewhere stops the workers here.
  supervisor(options opts, rendezvous rdzv, signal_events& signals, timings t = {},
             agent* peers = nullptr)
      : stop_policy(std::move(opts), t, peers), rdzv_(std::move(rdzv)), signals_(signals) {}

  /// Runs the job to the end; returns cclite-run's exit status.
  int run() {
    if (start_workers() && opts_.timeout_s > 0)
      job_deadline_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                         std::chrono::duration<double>(opts_.timeout_s));
    supervise();
    drain_after_exit();
    // A stopped job's workers are gone; leftovers of their process groups that
    // ignored SIGTERM (and kept our pipes open until now) go too.
    if (stopping_) signal_groups(SIGKILL);
    if (peers_ && !exit_code_) {
      // Our workers are done; the job is not until every node's are.
      auto take_signal = [this] {
        for (int sig : signals_.take())
          if (sig != SIGCHLD && !exit_code_) exit_code_ = 128 + sig;
        return exit_code_.value_or(0);
      };
      if (auto e = peers_->exit_barrier(signals_.fd(), take_signal)) {
        say(e->message);
        exit_code_ = e->exit_code;
        restartable_ = e->restartable;
        rescale_ = e->rescale;
      }
    }
    return exit_code_.value_or(0);
  }

  /// After run(): the job failed in a way a restart may cure (a worker
  /// failed, here or on another node, or a node was lost), as opposed to a
  /// signal, --timeout or a program that cannot be executed.
  bool restartable() const { return restartable_ && exit_code_.value_or(0) != 0; }

  /// After run(): the workers were stopped because a node waits to join
  /// (--nnodes MIN:MAX); the agents meet again without counting a restart.
  bool rescaling() const { return rescale_; }

 private:
  /// --bind-to: one CPU set per local worker, or none. Unbound (with a line
  /// saying why) when this process's CPUs cannot be read.
  std::vector<cpu_set_t> cpu_binds(int n, int first) {
    if (opts_.bind_to == "none") return {};
    bool shared = false;
    const auto sets = cpu_sets_for(read_cpu_places(), opts_.bind_to, n, &shared);
    if (sets.empty()) {
      say("--bind-to " + opts_.bind_to + ": cannot read this process's CPUs; workers start unbound");
      return {};
    }
    if (shared) say("--bind-to " + opts_.bind_to + ": more workers than units, some share one");
    std::vector<cpu_set_t> out(sets.size());
    for (std::size_t i = 0; i < sets.size(); ++i) {
      CPU_ZERO(&out[i]);
      for (int c : sets[i])
        if (c < CPU_SETSIZE) CPU_SET(c, &out[i]);
      if (debug_enabled())
        say("rank " + std::to_string(first + static_cast<int>(i)) + " bound to CPUs " + cpu_list_string(sets[i]));
    }
    return out;
  }

  bool start_workers() {
    const int n = opts_.nproc_per_node;
    const int first = first_rank_of(opts_, rdzv_);
    const std::vector<cpu_set_t> binds = cpu_binds(n, first);
    for (int local = 0; local < n; ++local) {
      worker w;
      w.local_rank = local;
      w.rank = first + local;
      std::string prefix = opts_.prefix ? "[rank " + std::to_string(w.rank) + "]: " : "";
      w.out_lines = line_splitter(prefix);
      w.err_lines = line_splitter(prefix);
      // --redirects: into the worker's log files only; --tee: there and here.
      // A rank --local-ranks-filter keeps off the console writes to its files.
      const bool shown = shown_on_console(opts_.local_ranks_filter, local);
      const int redirect = shown ? std_streams_for(opts_.redirects, local) : 3;
      const int tee = shown ? std_streams_for(opts_.tee, local) : 0;
      w.out_console = !(redirect & 1) || (tee & 1);
      w.err_console = !(redirect & 2) || (tee & 2);
      spawn_result r;
      r.error = open_worker_logs(opts_.log_run_dir, rdzv_.restart_count, local, (redirect | tee) & 3, w.out_log,
                                 w.err_log);
      if (r.error.empty()) {
        auto env = merge_environment(environ, worker_variables(opts_, rdzv_, local));
        r = spawn_worker(w, opts_.command, env, signals_,
                         binds.empty() ? nullptr : &binds[static_cast<std::size_t>(local)]);
      }
      if (!r.ok) {
        close_fd(w.out_log);
        close_fd(w.err_log);
        say(r.error);
        exit_code_ = r.exec_errno == 0 ? 1 : r.exec_errno == ENOENT ? 127 : 126;
        if (peers_) peers_->report_failure(r.error + " (host " + host_ + ")", *exit_code_);
        if (!workers_.empty())
          say("stopping the " + plural(running_count(), "worker") + " already started");
        stop(SIGTERM, t_.failure_grace);
        return false;
      }
      workers_.push_back(std::move(w));
    }
    if (debug_enabled())
      say("started " + plural(n, "worker") + ": ranks " + std::to_string(first) + ".." +
          std::to_string(first + n - 1) + " of " + std::to_string(world_size_of(opts_, rdzv_)) +
          ", rendezvous " + rdzv_.endpoint + " (MASTER_ADDR=" + rdzv_.master_addr +
          " MASTER_PORT=" + std::to_string(rdzv_.master_port) + "), id " + opts_.rdzv_id);
    return true;
  }

  void supervise() {
    while (running_count() > 0) {
      if (give_up_at_ && clock::now() >= *give_up_at_) {
        for (const worker& w : workers_)
          if (w.running)
            say("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
                ") is still alive after SIGKILL (stuck in the kernel?); giving up on it");
        return;
      }
      poll_once(next_wake());
      reap();
      check_deadlines();
    }
  }

  /// Output written just before the last exit may still be in the pipes, and a
  /// worker's children may hold them open: read until EOF, for a bounded time.
  void drain_after_exit() {
    auto until = clock::now() + t_.output_drain;
    while (any_stream_open() && clock::now() < until) poll_once(until);
    for (worker& w : workers_) {
      finish_stream(w, false);
      finish_stream(w, true);
    }
  }

  clock::time_point next_wake() const {
    auto wake = clock::now() + std::chrono::seconds(1);
    if (job_deadline_ && !stopping_) wake = std::min(wake, *job_deadline_);
    if (kill_at_ && !give_up_at_) wake = std::min(wake, *kill_at_);
    if (give_up_at_) wake = std::min(wake, *give_up_at_);
    if (traces_until_) wake = std::min(wake, clock::now() + std::chrono::milliseconds(20));  // files do not wake poll()
    return wake;
  }

  /// One poll() over the signal pipe and every open worker pipe, then handles
  /// whatever is ready. Returns at `wake_by` at the latest.
  void poll_once(clock::time_point wake_by) {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}, {peers_ ? peers_->event_fd() : -1, POLLIN, 0}};
    struct source {
      worker* w;
      bool is_err;
    };
    std::vector<source> sources;
    for (worker& w : workers_) {
      if (w.out_fd >= 0) {
        fds.push_back({w.out_fd, POLLIN, 0});
        sources.push_back({&w, false});
      }
      if (w.err_fd >= 0) {
        fds.push_back({w.err_fd, POLLIN, 0});
        sources.push_back({&w, true});
      }
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake_by - clock::now());
    int timeout_ms = static_cast<int>(std::clamp<long long>(wait.count() + 1, 0, 1000));
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // timeout or EINTR

    if (fds[0].revents != 0)
      for (int sig : signals_.take())
        if (sig != SIGCHLD) handle_signal(sig);  // exits are found by reap()
    if (fds[1].revents != 0)
      if (auto e = peers_->take_event()) handle_remote(*e);
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      worker& w = *sources[i - 2].w;
      // One read per ready pipe per round keeps a chatty worker from starving the others.
      read_stream(w, sources[i - 2].is_err, 1);
    }
  }

  void reap() {
    for (worker& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == w.pid) {
        on_exit(w, status);
      } else if (r < 0 && errno == ECHILD) {  // someone else reaped it; we cannot know how it ended
        w.running = false;
        say("lost track of rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
            ")");
      }
    }
  }

  rendezvous rdzv_;
  signal_events& signals_;
};

}  // namespace cclite::run
