// tools/trace/report.hpp - what the flight recorder files of a job say, per
// communicator: the furthest collective any rank reached and how it ended on
// each rank, the ranks that never started it and what they were doing
// instead (a call of another communicator of the same process), ranks with
// no file, the first collective the ranks called differently, point-to-point
// calls left pending, and calls issued but still queued.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "trace/trace_file.hpp"

namespace cclite_trace {

namespace detail {

inline bool reducing(const std::string& kind) {
  return kind == "allreduce" || kind == "reduce" || kind == "reduce_scatter" || kind == "reduce_scatterv" ||
         kind == "scan" || kind == "exscan";
}
inline bool rooted(const std::string& kind) {
  return kind == "broadcast" || kind == "reduce" || kind == "gather" || kind == "scatter" || kind == "gatherv" ||
         kind == "scatterv";
}
inline bool point_to_point(const call& c) { return c.coll == 0; }

/// "0-2,5" for {0, 1, 2, 5}.
inline std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(ranks[i]);
    if (j > i) s += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

inline std::string plural_ranks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + ranks_text(ranks);
}

/// What must agree across ranks for collective `c` (its arguments as text).
inline std::string arguments(const call& c) {
  if (c.kind == "barrier") return "";
  std::string s = " (";
  // the v-variants: per-rank counts legitimately differ
  const bool v = c.kind == "allgatherv" || c.kind == "alltoallv" || c.kind == "gatherv" || c.kind == "scatterv" ||
                 c.kind == "reduce_scatterv";
  if (!v) s += std::to_string(c.count) + " x ";
  s += c.dtype;
  if (reducing(c.kind)) s += ", " + c.op;
  if (rooted(c.kind)) s += ", root " + std::to_string(c.root);
  return s + ")";
}

/// "allreduce #7 (1000 x float, sum)" or "send to rank 2 (call #12, 64 x float)".
inline std::string describe(const call& c) {
  // A queued call has no number yet (seq 0).
  const std::string no = c.seq ? "call #" + std::to_string(c.seq) : "not numbered yet";
  if (c.kind == "send") return "send to rank " + std::to_string(c.root) + " (" + no + ", " +
                               std::to_string(c.count) + " x " + c.dtype + ")";
  if (c.kind == "recv") return "recv from rank " + std::to_string(c.root) + " (" + no + ", " +
                               std::to_string(c.count) + " x " + c.dtype + ")";
  if (c.kind == "sendrecv") return "sendrecv to rank " + std::to_string(c.root) + ", from rank " +
                                   std::to_string(c.peer2) + " (" + no + ")";
  if (c.kind == "group") return "group of " + std::to_string(c.count) + " sends and receives (" + no + ")";
  return c.kind + " #" + std::to_string(c.coll) + arguments(c);
}

/// "done in 0.3 ms", "failed (timeout) after 2.01 s", "running for 4.2 s at the dump"
inline std::string outcome(const call& c, std::int64_t dumped_us) {
  const std::int64_t end = c.end_us ? c.end_us : dumped_us;
  const double s = static_cast<double>(end - c.start_us) / 1e6;
  char t[64];
  if (s < 0.01) std::snprintf(t, sizeof t, "%.3f ms", s * 1e3);
  else std::snprintf(t, sizeof t, "%.2f s", s);
  if (c.state == "queued") {  // issued, not started: behind the communicator's running call
    const double q = static_cast<double>(dumped_us - c.queued_us) / 1e6;
    if (q < 0.01) std::snprintf(t, sizeof t, "%.3f ms", q * 1e3);
    else std::snprintf(t, sizeof t, "%.2f s", q);
    return std::string("queued, not started, issued ") + t + " before the dump";
  }
  if (c.state == "running") return std::string("still running ") + t + " after it started, at the dump";
  if (c.state == "failed") return "failed (" + c.code + ") after " + t;
  return std::string("done in ") + t;
}

struct member {
  const process_dump* proc;
  const comm_section* sec;
};

inline bool queued(const call& c) { return c.state == "queued"; }

/// The last collective `s` started (not one still queued).
inline const call* last_collective(const comm_section& s) {
  for (auto it = s.kept.rbegin(); it != s.kept.rend(); ++it)
    if (!point_to_point(*it) && !queued(*it)) return &*it;
  return nullptr;
}

/// The call numbered `coll` in `s`: a started one, else one still queued (a
/// file may hold both under one number).
inline const call* find_coll(const comm_section& s, std::uint64_t coll) {
  const call* waiting = nullptr;
  for (const call& c : s.kept) {
    if (c.coll != coll) continue;
    if (!queued(c)) return &c;
    if (!waiting) waiting = &c;
  }
  return waiting;
}

// What `m`'s process did after `after_us` in its other communicators: the
// latest call started then that had not finished well, else the latest one.
inline std::string meanwhile(const member& m, std::int64_t after_us) {
  const call* best = nullptr;
  const comm_section* where = nullptr;
  const std::string own_children = m.sec->name + "/hier/";  // parts of this communicator's own calls
  for (const comm_section& other : m.proc->comms) {
    if (&other == m.sec || other.name.compare(0, own_children.size(), own_children) == 0) continue;
    for (const call& c : other.kept) {
      if (c.start_us < after_us) continue;
      const bool open = c.state != "done";
      const bool best_open = best && best->state != "done";
      if (!best || (open && !best_open) || (open == best_open && c.start_us > best->start_us)) {
        best = &c;
        where = &other;
      }
    }
  }
  if (!best) return "";
  return describe(*best) + " of communicator " + where->name + " (rank " + std::to_string(where->rank) + " there), " +
         outcome(*best, m.proc->dumped_us);
}

}  // namespace detail

/// The report on `dumps` (the files of one job), as text.
inline std::string report(const std::vector<process_dump>& dumps) {
  using namespace detail;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%zu flight recorder file%s\n", dumps.size(), dumps.size() == 1 ? "" : "s");
  out += line;
  for (const process_dump& d : dumps) out += "  " + d.host + " pid " + std::to_string(d.pid) + ": " + d.reason + "\n";

  // Communicators by id and name (one section per rank that wrote a file).
  std::map<std::string, std::vector<member>> comms;
  bool explained_missing = false;
  for (const process_dump& d : dumps)
    for (const comm_section& s : d.comms) comms[s.name + " " + s.id].push_back({&d, &s});

  for (auto& entry : comms) {
    std::vector<member>& ms = entry.second;
    std::sort(ms.begin(), ms.end(), [](const member& a, const member& b) { return a.sec->rank < b.sec->rank; });
    const comm_section& first = *ms.front().sec;
    std::vector<int> present, missing;
    std::set<int> seen;
    for (const member& m : ms) {
      if (seen.insert(m.sec->rank).second) present.push_back(m.sec->rank);
    }
    for (int r = 0; r < first.size; ++r)
      if (!seen.count(r)) missing.push_back(r);
    const std::size_t hier = first.name.rfind("/hier/");
    const std::string inside = hier == std::string::npos ? "" : ", inside the hierarchical allreduce of " + first.name.substr(0, hier);
    out += "\ncommunicator " + first.name + " (id " + first.id + ", " + std::to_string(first.size) + " ranks" + inside +
           "): files from " + plural_ranks(present) + (missing.empty() ? "" : "; none from " + plural_ranks(missing)) + "\n";
    for (const member& m : ms) {
      if (m.sec->size != first.size) {
        out += "  rank " + std::to_string(m.sec->rank) + " says the communicator has " + std::to_string(m.sec->size) +
               " ranks (files of different jobs mixed?)\n";
      }
    }

    // The first collective the ranks called differently (within what they kept).
    std::uint64_t lo = 0, hi = UINT64_MAX;
    for (const member& m : ms) {
      std::uint64_t a = UINT64_MAX, b = 0;
      for (const call& c : m.sec->kept)
        if (!point_to_point(c)) a = std::min(a, c.coll), b = std::max(b, c.coll);
      if (b == 0) continue;
      lo = std::max(lo, a);
      hi = std::min(hi, b);
    }
    // (Over the numbers the files hold, not the range: a file may say anything.)
    std::map<std::uint64_t, std::map<std::string, std::vector<int>>> calls_at;  // coll -> call -> ranks
    for (const member& m : ms)
      for (const call& c : m.sec->kept)
        if (!point_to_point(c) && c.coll >= lo && c.coll <= hi) calls_at[c.coll][c.kind + arguments(c)].push_back(m.sec->rank);
    for (const auto& k : calls_at) {
      if (k.second.size() < 2) continue;
      out += "  MISMATCH: collective #" + std::to_string(k.first) + " was called differently:";
      for (const auto& v : k.second) out += " " + plural_ranks(v.second) + ": " + v.first + ";";
      out.back() = '\n';
      break;
    }

    // The furthest collective, and each rank against it.
    std::uint64_t furthest = 0;
    for (const member& m : ms)
      if (const call* c = last_collective(*m.sec)) furthest = std::max(furthest, c->coll);
    if (furthest > 0) {
      std::map<std::string, std::vector<int>> at;  // outcome -> ranks, for those that started it
      std::map<std::string, std::vector<int>> by;  // algorithm -> ranks
      const call* shown = nullptr;
      std::vector<const member*> behind;
      for (const member& m : ms) {
        const call* c = find_coll(*m.sec, furthest);
        if (!c || queued(*c)) {  // (queued: issued, but its queue is stuck behind an earlier call)
          behind.push_back(&m);
          continue;
        }
        if (!shown) shown = c;
        std::string o = c->state == "done" ? "done" : c->state == "running" ? "still running at the dump"
                                                                            : "failed (" + c->code + ")";
        if (describe(*c) != describe(*shown)) o += " in " + describe(*c);  // a mismatch: say what they called
        at[o].push_back(m.sec->rank);
        if (!c->algo.empty()) by[c->algo].push_back(m.sec->rank);
      }
      out += "  furthest call: " + (shown ? describe(*shown) : "collective #" + std::to_string(furthest)) + ":";
      for (const auto& a : at) out += " " + plural_ranks(a.second) + " " + a.first + ";";
      out.back() = '\n';
      if (by.size() == 1) out += "    algorithm: " + by.begin()->first + "\n";
      if (by.size() > 1) {  // every rank must run the same one (set-up checks the settings)
        out += "    ALGORITHMS DIFFER:";
        for (const auto& b : by) out += " " + plural_ranks(b.second) + " " + b.first + ";";
        out.back() = '\n';
      }
      for (const member* m : behind) {
        const call* last = last_collective(*m->sec);
        out += "  rank " + std::to_string(m->sec->rank) + " never started collective #" + std::to_string(furthest);
        if (last) out += "; its last was " + describe(*last) + ", " + outcome(*last, m->proc->dumped_us);
        out += "\n";
        if (const call* q = find_coll(*m->sec, furthest); q && queued(*q))
          out += "    it had issued it: " + describe(*q) + " " + outcome(*q, m->proc->dumped_us) + "\n";
        const std::string other = meanwhile(*m, last ? last->start_us : 0);
        if (!other.empty()) out += "    meanwhile it was in " + other + "\n";
      }
      if (!missing.empty()) {
        out += "  " + plural_ranks(missing) + ": no file";
        if (!explained_missing) {  // once per report
          out += " (the process did not fail in cclite and was not asked for its file (kill -USR1 <pid>; cclite-run "
                 "asks when a job fails): still running, exited or killed first; or its file is on another node: "
                 "CCLITE_TRACE_FILE on a shared directory collects them all)";
          explained_missing = true;
        }
        out += "\n";
      }
      if (behind.empty() && missing.empty() && at.size() == 1 && at.begin()->first == "done") {
        out += "  every rank finished collective #" + std::to_string(furthest) + "\n";
      }
    }

    // Point-to-point calls that had not finished well, and the collectives
    // issued but not started (but the furthest, said above), three per rank.
    for (const member& m : ms) {
      int waiting = 0;
      for (const call& c : m.sec->kept) {
        const bool later = queued(c) && !point_to_point(c) && c.coll != furthest;
        if (later && ++waiting > 3) continue;
        if ((point_to_point(c) && c.state != "done") || later) {
          out += "  rank " + std::to_string(m.sec->rank) + ": " + describe(c) + " " + outcome(c, m.proc->dumped_us) + "\n";
        }
      }
      if (waiting > 3) out += "  rank " + std::to_string(m.sec->rank) + ": and " + std::to_string(waiting - 3) + " more collectives queued\n";
    }
  }
  return out;
}

}  // namespace cclite_trace
