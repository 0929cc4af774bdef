// tools/run/trace_request.hpp - before cclite-run stops the workers of a failed
// or timed-out job, it asks those still running for their flight recorder
// files (include/cclite/collective/trace_signal.hpp): the ranks that did not
// fail themselves - waiting for the failed one, or stuck in the program's own
// code - are what a hang's report needs most, and without the request they
// are killed before writing anything.
//
// Only a worker whose process catches the signal is asked (its SigCgt mask in
// /proc/<pid>/status: cclite installed the handler), since the signal's
// default action would end a worker that has not created a communicator yet,
// or a wrapper around the program, with a confusing status. Linux only, as
// cclite-run is.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cclite::run {

/// CCLITE_TRACE_SIGNAL as the workers read it: SIGUSR1 (default), SIGUSR2, or
/// 0 for none (the library refuses anything else, so a worker with another
/// value never installed a handler: 0 here).
inline int trace_signal_of_env() {
  const char* v = std::getenv("CCLITE_TRACE_SIGNAL");
  std::string name = v ? v : "USR1";
  if (name.compare(0, 3, "SIG") == 0) name = name.substr(3);
  return name == "USR1" ? SIGUSR1 : name == "USR2" ? SIGUSR2 : 0;
}

/// Whether process `pid` has a handler for `sig` (/proc/<pid>/status, SigCgt).
inline bool catches_signal(pid_t pid, int sig) {
  const std::string path = "/proc/" + std::to_string(pid) + "/status";
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return false;
  char line[256];
  unsigned long long mask = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "SigCgt:", 7) == 0) found = std::sscanf(line + 7, "%llx", &mask) == 1;
  }
  std::fclose(f);
  return found && sig >= 1 && sig <= 64 && ((mask >> (sig - 1)) & 1) != 0;
}

/// A file's identity: a dump replaces the file by a rename (a new inode), so a
/// change of inode or mtime says it was written since (mtime alone is too
/// coarse: the kernel stamps files with a clock a few ms behind).
struct file_stamp {
  bool exists = false;
  ino_t ino = 0;
  long long mtime_ns = 0;
  bool operator==(const file_stamp& o) const { return exists == o.exists && ino == o.ino && mtime_ns == o.mtime_ns; }
};

inline file_stamp stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, st.st_ino, static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec};
}

/// One worker asked for its file.
struct trace_asked {
  int rank = 0;
  pid_t pid = -1;
  std::string path;    ///< <prefix><host>.<pid>
  file_stamp before;   ///< the file as it was when asked
};

/// "ranks 1, 3" / "rank 2"
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace cclite::run
