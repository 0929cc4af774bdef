// tools/run/supervisor.hpp - runs the job: starts the workers, relays their
// output, forwards signals, stops everyone when one fails or time runs out.
//
// A single thread and a single poll() over the signal pipe and every worker
// pipe: no locks, and output, exits and signals are handled in arrival order.
// Every wait is bounded: SIGTERM is followed by SIGKILL after a grace period,
// and a worker that survives even SIGKILL is abandoned after a while with a
// message instead of hanging the launcher.
#pragma once

#include <poll.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "agent.hpp"
#include "job.hpp"
#include "logs.hpp"
#include "options.hpp"
#include "signals.hpp"
#include "worker.hpp"

namespace cclite::run {

struct timings {
  std::chrono::milliseconds failure_grace{5000};  ///< SIGTERM -> SIGKILL after a worker fails
  std::chrono::milliseconds signal_grace{10000};  ///< forwarded signal -> SIGKILL
  std::chrono::milliseconds kill_wait{10000};     ///< SIGKILL -> give up on the process
  /// After the last exit, for output still in flight (children holding the pipes).
  std::chrono::milliseconds output_drain{1000};
};

class supervisor {
 public:
  /// `peers`: the agents' rendezvous of a multi-node job (nullptr on one node
  /// or in a static launch): a failure here is told to every node, and a
  /// failure or a lost node elsewhere stops the workers here.
  supervisor(options opts, rendezvous rdzv, signal_events& signals, timings t = {},
             agent* peers = nullptr)
      : opts_(std::move(opts)),
        rdzv_(std::move(rdzv)),
        signals_(signals),
        t_(t),
        host_(host_name()),
        peers_(peers) {}

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
  using clock = std::chrono::steady_clock;

  bool start_workers() {
    const int n = opts_.nproc_per_node;
    const int first = first_rank_of(opts_, rdzv_);
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
        r = spawn_worker(w, opts_.command, env, signals_);
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

  /// Reads up to `max_reads` chunks from worker `w`'s stdout (or stderr),
  /// writes them to its log file as they are, and the whole lines they
  /// complete to our stdout (stderr) unless redirected. At EOF flushes the last
  /// partial line and closes the pipe and the file.
  void read_stream(worker& w, bool err, int max_reads) {
    stream s = stream_of(w, err);
    char buf[64 * 1024];
    for (int reads = 0; s.fd >= 0 && reads < max_reads;) {
      ssize_t n = ::read(s.fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {  // EOF (or a read error, which we treat the same way)
        finish_stream(w, err);
        return;
      }
      const std::string_view chunk(buf, static_cast<std::size_t>(n));
      if (s.log >= 0 && !write_all(s.log, chunk.data(), chunk.size())) {
        say("rank " + std::to_string(w.rank) + ": writing its log file failed (" + std::strerror(errno) +
            "); its output goes on here");
        close_fd(s.log);
        s.console = true;
      }
      if (s.console) emit(s.to, s.lines.feed(chunk));
      ++reads;
    }
  }

  void finish_stream(worker& w, bool err) {
    stream s = stream_of(w, err);
    close_fd(s.log);
    if (s.fd < 0 && !s.lines.has_pending()) return;
    emit(s.to, s.lines.finish());
    close_fd(s.fd);
  }

  // One of a worker's two output streams: its pipe, its lines, its log file,
  // whether it reaches our console, and which of our fds that is.
  struct stream {
    int& fd;
    line_splitter& lines;
    int& log;
    bool& console;
    int to;
  };
  static stream stream_of(worker& w, bool err) {
    if (err) return {w.err_fd, w.err_lines, w.err_log, w.err_console, STDERR_FILENO};
    return {w.out_fd, w.out_lines, w.out_log, w.out_console, STDOUT_FILENO};
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
    stop(SIGTERM, t_.failure_grace);
  }

  /// Another node failed or was lost (or the rendezvous store went away).
  void handle_remote(const job_event& e) {
    if (stopping_) return;
    exit_code_ = e.exit_code;
    restartable_ = e.restartable;
    rescale_ = e.rescale;
    int n = running_count();
    say(e.message + (n > 0 ? "; stopping the " + plural(n, "worker") + " on this node" : ""));
    stop(SIGTERM, t_.failure_grace);
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
      stop(SIGTERM, t_.failure_grace);
    }
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

  int running_count() const {
    return static_cast<int>(
        std::count_if(workers_.begin(), workers_.end(), [](const worker& w) { return w.running; }));
  }

  bool any_stream_open() const {
    return std::any_of(workers_.begin(), workers_.end(),
                       [](const worker& w) { return w.out_fd >= 0 || w.err_fd >= 0; });
  }

  /// Writes to our stdout/stderr; after a write error (EPIPE: the reader left)
  /// that stream is dropped, and the job goes on.
  void emit(int to, const std::string& text) {
    if (text.empty()) return;
    bool& ok = to == STDOUT_FILENO ? stdout_ok_ : stderr_ok_;
    if (ok) ok = write_all(to, text);
  }

  void say(const std::string& line) { emit(STDERR_FILENO, "cclite-run: " + line + "\n"); }

  static std::string plural(int n, const char* noun) {
    return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
  }

  static std::string seconds(std::chrono::milliseconds ms) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g s", static_cast<double>(ms.count()) / 1000.0);
    return buf;
  }

  static bool debug_enabled() {
    const char* d = std::getenv("CCLITE_DEBUG");
    if (!d) return false;
    std::string v(d);
    for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return v == "INFO" || v == "TRACE";
  }

  options opts_;
  rendezvous rdzv_;
  signal_events& signals_;
  timings t_;
  std::string host_;
  agent* peers_ = nullptr;
  std::vector<worker> workers_;

  std::optional<int> exit_code_;  ///< the first reason to stop decides it
  bool restartable_ = false;
  bool rescale_ = false;
  bool stopping_ = false;
  int stop_signal_ = SIGTERM;
  std::chrono::milliseconds stop_grace_{0};
  std::optional<clock::time_point> job_deadline_;  ///< --timeout
  std::optional<clock::time_point> kill_at_;       ///< SIGKILL everyone
  std::optional<clock::time_point> give_up_at_;    ///< stop waiting for the unkillable
  bool stdout_ok_ = true;
  bool stderr_ok_ = true;
};

}  // namespace cclite::run
