// cclite/collective/flight_recorder.hpp - the last calls of every communicator,
// kept in memory and written to a file when a call fails: PyTorch's NCCL
// "flight recorder" (TORCH_NCCL_TRACE_BUFFER_SIZE) for cclite.
//
// A hang across many ranks is hard to read from one rank's error: rank 0
// times out in allreduce #58 waiting for rank 3, but why is rank 3 not there?
// With CCLITE_TRACE_BUFFER=N every communicator keeps its last N calls (what,
// when started, when ended, how). When a call fails for good (timeout,
// peer_lost, mismatch, aborted, ...) the process writes the calls of *all* its
// live communicators to CCLITE_TRACE_FILE<host>.<pid> (default prefix
// /tmp/cclite-trace.); `cclite-trace FILE...` (tools/cclite_trace.cpp) reads
// the files of every rank and says which ranks were in which call, which
// never started it, and what those were doing instead, e.g. waiting in a call
// of another communicator.
//
// Off by default (N = 0): then a call costs one predictable branch. On, each
// call takes an uncontended mutex twice and reads the wall clock twice (0.1
// us here: README, "Flight recorder"); the buffer is allocated once (N x 72 bytes), so calls still allocate
// nothing. A program can also dump on its own: cclite::dump_traces(reason);
// and anyone can ask a process for its file with SIGUSR1 (trace_signal.hpp).
//
// File format (text, one record per line, `key=value` fields, stable within a
// version):
//   cclite-trace 1
//   process host=node1 pid=4242 dumped_us=<unix us> reason=<rest of the line>
//   comm id=<hex> name=<store prefix> rank=R size=N calls=<recorded> kept=<in file> queued=<Q>
//   call seq=S coll=C kind=allreduce count=N dtype=float op=sum root=R peer2=P count2=M
//        start_us=<unix us> end_us=<unix us, 0 while running> algo=<A> state=done|running|failed code=<errc>
//   ... then the communicator's Q calls issued but not started yet (queued
//   behind the running one: _async calls, or blocking calls of other threads),
//   in the order they will run:
//   call seq=0 coll=<the number it will have; 0 for point to point> kind=... start_us=0 end_us=0
//        queued_us=<unix us, when issued> state=queued code=ok
// (the fields of op_desc, whichever the kind uses: root is a rooted call's
// root or a send's / recv's peer, peer2 and count2 a sendrecv's source and
// receive count; algo the algorithm the call ran, as CCLITE_DEBUG=INFO names
// it, spaces made '_' and the explanation in brackets left out: ring,
// double_binary_tree, recursive_doubling, shm-direct_small, ...; absent for a
// queued call)
// `seq` is the call's number in error messages ("allreduce #57"); `coll` counts
// the calls every rank makes (collectives; 0 for send / recv / sendrecv /
// groups), so ranks are compared by `coll`.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <cclite/collective/op.hpp>
#include <cclite/collective/work_queue.hpp>
#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>

namespace cclite {
namespace detail {

/// One recorded call.
struct trace_entry {
  std::uint64_t seq = 0;   ///< the call's number in this communicator's error messages
  std::uint64_t coll = 0;  ///< collectives so far, this one included (0: point to point)
  std::int64_t start_us = 0, end_us = 0;  ///< wall clock, us since the epoch; end 0: running
  std::uint64_t count = 0, count2 = 0;
  std::int32_t root = 0, peer2 = 0;
  collective_kind kind = collective_kind::barrier;
  dtype type = dtype::uint8;
  reduce_op op = reduce_op::sum;
  errc code = errc::ok;
  const char* algo = nullptr;  ///< describe_algorithm()'s text (static storage); null: not known
};

class flight_recorder;

/// The recorders of this process's live communicators (a dump writes them
/// all): a list through the recorders themselves, nothing allocated.
struct trace_registry {
  std::mutex m;
  flight_recorder* first = nullptr;
  std::string last_reason;  // of the last dump_traces() (a failure's, usually) ...
  pid_t last_reason_pid = 0;  // ... by this process, not the parent it was forked from
};
inline trace_registry& trace_recorders() {
  static trace_registry r;
  return r;
}

/// A communicator's ring of its last calls. Written by the thread that runs
/// the communicator's calls, read by whichever thread dumps.
class flight_recorder {
 public:
  flight_recorder() = default;
  flight_recorder(const flight_recorder&) = delete;
  flight_recorder& operator=(const flight_recorder&) = delete;
  ~flight_recorder() { disable(); }

  bool on() const noexcept { return capacity_ != 0; }

  /// The call `d`, number `seq`, starts, run by `algo` (a string of static
  /// storage, call_log.hpp); returns its slot for end().
  CCLITE_NOINLINE std::size_t begin(const op_desc& d, std::uint64_t seq, const char* algo) noexcept {
    std::lock_guard<std::mutex> g(m_);
    const bool all_ranks = every_rank_calls(d.kind);
    const std::size_t slot = static_cast<std::size_t>(recorded_++ % capacity_);
    trace_entry& e = ring_[slot];
    e = entry_of(d, seq, all_ranks ? ++coll_ : 0);
    e.algo = algo;
    e.start_us = wall_us();
    return slot;
  }

  /// The call in `slot` (number `seq`) ended with `st`.
  void end(std::size_t slot, std::uint64_t seq, const status& st) noexcept {
    std::lock_guard<std::mutex> g(m_);
    trace_entry& e = ring_[slot];
    if (e.seq != seq) return;  // overwritten meanwhile (nested calls on a tiny buffer)
    e.end_us = wall_us();
    e.code = st.code();
  }

CCLITE_SETUP_CODE_BEGIN  // set-up and dumps: compiled for size (config.hpp)
  /// Keeps the last `capacity` calls of communicator `name` (id, rank, size).
  CCLITE_NOINLINE void enable(std::size_t capacity, std::string name, std::uint32_t id, int rank, int size) {
    if (capacity == 0 || on()) return;
    {
      std::lock_guard<std::mutex> g(m_);
      ring_.reset(new trace_entry[capacity]);
      capacity_ = capacity;
      name_ = std::move(name);
      for (char& c : name_)  // one token of a key=value line (a store prefix may hold anything)
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '=') c = '_';
      id_ = id;
      rank_ = rank;
      size_ = size;
    }
    trace_registry& r = trace_recorders();
    std::lock_guard<std::mutex> g(r.m);
    next_ = r.first;
    r.first = this;
  }

  void disable() {
    if (!on()) return;
    trace_registry& r = trace_recorders();
    std::lock_guard<std::mutex> g(r.m);
    for (flight_recorder** p = &r.first; *p; p = &(*p)->next_) {
      if (*p == this) {
        *p = next_;
        break;
      }
    }
  }

  /// Dumps list the calls `q` holds that have not started (null: none; the
  /// communicator unlinks its queue before destroying it).
  void watch_queue(const work_queue* q) {
    std::lock_guard<std::mutex> g(m_);
    queue_ = q;
  }

  /// The next live recorder (under the registry's lock).
  const flight_recorder* next() const noexcept { return next_; }

  /// Appends this communicator's section of a dump (oldest call first).
  void append(std::string& out) const {
    std::lock_guard<std::mutex> g(m_);
    const std::uint64_t kept = std::min<std::uint64_t>(recorded_, capacity_);
    // The calls waiting in the queue, as lines, before this section's head
    // (which counts them).
    std::string waiting;
    std::size_t queued = 0;
    char line[512];
    if (queue_) {
      std::uint64_t coll = coll_;
      queue_->for_each_queued([&](const op_desc& d, std::int64_t queued_us) {
        ++queued;  // (no number yet: seq 0; coll the number it will have)
        append_call(waiting, entry_of(d, 0, every_rank_calls(d.kind) ? ++coll : 0), "queued", queued_us);
      });
    }
    std::snprintf(line, sizeof line, "comm id=%06x name=", static_cast<unsigned>(id_));
    out += line;
    out += name_;  // any length
    std::snprintf(line, sizeof line, " rank=%d size=%d calls=%" PRIu64 " kept=%" PRIu64 " queued=%zu\n", rank_,
                  size_, recorded_, kept, queued);
    out += line;
    for (std::uint64_t i = recorded_ - kept; i < recorded_; ++i) {
      const trace_entry& e = ring_[static_cast<std::size_t>(i % capacity_)];
      append_call(out, e, e.end_us == 0 ? "running" : e.code == errc::ok ? "done" : "failed", 0);
    }
    out += waiting;
  }
CCLITE_SETUP_CODE_END

 private:
  // The entry of call `d` (numbers `seq`, `coll`), times left at zero.
  static trace_entry entry_of(const op_desc& d, std::uint64_t seq, std::uint64_t coll) noexcept {
    trace_entry e;
    e.seq = seq;
    e.coll = coll;
    e.count = d.count;
    e.count2 = d.count2;
    e.root = d.root;
    e.peer2 = d.peer2;
    e.kind = d.kind;
    e.type = d.type;
    e.op = d.op;
    return e;
  }

CCLITE_SETUP_CODE_BEGIN
  // One "call" line of a dump; `queued_us` (when a call still queued was
  // issued; 0 for the others) is written when set.
  static void append_call(std::string& out, const trace_entry& e, const char* state, std::int64_t queued_us) {
    char line[512];
    int n = std::snprintf(line, sizeof line,
                          "call seq=%" PRIu64 " coll=%" PRIu64 " kind=%s count=%" PRIu64 " dtype=%s op=%s root=%d "
                          "peer2=%d count2=%" PRIu64 " start_us=%" PRId64 " end_us=%" PRId64,
                          e.seq, e.coll, to_string(e.kind), e.count, to_string(e.type), to_string(e.op), e.root,
                          e.peer2, e.count2, e.start_us, e.end_us);
    out.append(line, static_cast<std::size_t>(std::min<int>(n, sizeof line - 1)));
    if (queued_us != 0) {
      std::snprintf(line, sizeof line, " queued_us=%" PRId64, queued_us);
      out += line;
    }
    if (e.algo) {  // one token: "double binary tree (...)" -> "double_binary_tree"
      out += " algo=";
      for (const char* c = e.algo; *c && !(c[0] == ' ' && c[1] == '('); ++c) out += *c == ' ' ? '_' : *c;
    }
    std::snprintf(line, sizeof line, " state=%s code=%s\n", state, to_string(e.code));
    out += line;
  }
CCLITE_SETUP_CODE_END

  mutable std::mutex m_;  // before the queue's own lock, never after
  const work_queue* queue_ = nullptr;
  std::unique_ptr<trace_entry[]> ring_;
  std::size_t capacity_ = 0;
  flight_recorder* next_ = nullptr;  // in trace_recorders()
  std::uint64_t recorded_ = 0, coll_ = 0;
  std::string name_;
  std::uint32_t id_ = 0;
  int rank_ = 0, size_ = 0;
};

CCLITE_SETUP_CODE_BEGIN
/// CCLITE_TRACE_BUFFER: calls kept per communicator (0: no recorder).
inline result<std::size_t> trace_capacity() {
  auto n = env::get_int("TRACE_BUFFER", 0, false);
  if (!n) return n.error();
  if (n.value() < 0 || n.value() > (1 << 20)) {
    return make_error(errc::invalid_argument, "CCLITE_TRACE_BUFFER=%lld is out of range (0 .. 1048576 calls "
                      "kept per communicator; 0 turns the flight recorder off)", static_cast<long long>(n.value()));
  }
  return static_cast<std::size_t>(n.value());
}
CCLITE_SETUP_CODE_END

}  // namespace detail

CCLITE_SETUP_CODE_BEGIN
/// The recorded calls of every live communicator of this process that keeps
/// them (CCLITE_TRACE_BUFFER > 0), in the file format above; `reason` ends
/// the process line (one line: newlines become spaces).
inline std::string trace_text(const std::string& reason) {
  const std::string host = env::host_name("?");
  std::string why = reason;
  for (char& c : why)
    if (c == '\n' || c == '\r') c = ' ';
  char head[400];
  std::snprintf(head, sizeof head, "cclite-trace 1\nprocess host=%s pid=%d dumped_us=%" PRId64 " reason=", host.c_str(),
                static_cast<int>(::getpid()), wall_us());
  std::string out = head + why + "\n";
  detail::trace_registry& r = detail::trace_recorders();
  std::lock_guard<std::mutex> g(r.m);
  for (const detail::flight_recorder* f = r.first; f; f = f->next()) f->append(out);
  return out;
}

namespace detail {
/// This process's file: CCLITE_TRACE_FILE<host>.<pid>.
inline std::string trace_file_path() {
  std::string host = env::host_name();
  for (char& c : host)
    if (c == '/') c = '_';
  return env::get_string("TRACE_FILE", "/tmp/cclite-trace.", false) + host + "." + std::to_string(::getpid());
}

/// dump_traces() of a text made already (trace_signal.hpp looks at it first).
inline result<std::string> write_trace_file(const std::string& text) {
  const std::string path = trace_file_path();
  // The temporary file is hidden (".<name>.tmpN" beside it), so that a writer
  // killed mid-dump (cclite-run stops the other workers at once) leaves
  // nothing a `<prefix>*` glob hands to cclite-trace; N: two communicators
  // may fail at once.
  static std::atomic<unsigned> dumps{0};
  const std::size_t slash = path.rfind('/');
  const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  const std::string tmp = path.substr(0, base) + "." + path.substr(base) + ".tmp" + std::to_string(dumps.fetch_add(1));
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return make_error(errc::system_error, "flight recorder: cannot write %s (CCLITE_TRACE_FILE): %s", tmp.c_str(),
                            std::strerror(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return make_error(errc::system_error, "flight recorder: writing %s failed: %s", path.c_str(),
                      std::strerror(e));
  }
  return path;
}
}  // namespace detail

/// Writes trace_text(reason) to CCLITE_TRACE_FILE<host>.<pid> (default prefix
/// /tmp/cclite-trace.), through a hidden temporary file and a rename, so a
/// reader never sees half a dump; a later dump replaces the earlier one. Returns the
/// path. Communicators call it when one of their calls fails for good; a
/// program may call it itself (e.g. from its own watchdog thread).
inline result<std::string> dump_traces(const std::string& reason) {
  {
    detail::trace_registry& r = detail::trace_recorders();
    std::lock_guard<std::mutex> g(r.m);
    r.last_reason = reason;  // a dump on request later names it (trace_signal.hpp)
    r.last_reason_pid = ::getpid();
  }
  return detail::write_trace_file(trace_text(reason));
}
CCLITE_SETUP_CODE_END

}  // namespace cclite
