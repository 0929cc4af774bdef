// tools/run/logs.hpp - torchrun's --log-dir, --redirects and --tee: worker
// output into files, one directory per run, attempt and local rank:
//
//   <log-dir>/<rdzv-id>_XXXXXX/attempt_<restart>/<local rank>/stdout.log, stderr.log
//
// --redirects N sends a worker's streams to its files instead of the console,
// --tee N to both; N is 0 (none), 1 (stdout), 2 (stderr) or 3 (both), for
// every worker, or per local rank as "0:1,1:2". Files get the bytes as the
// worker wrote them (no "[rank R]: " prefix). Without --log-dir, redirected or
// teed output goes under a fresh directory in $TMPDIR (torchrun does the same).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "options.hpp"

namespace cclite::run {

/// mkdir -p; "" or the error.
inline std::string make_dirs(const std::string& path) {
  for (std::size_t at = 1; at <= path.size(); ++at) {
    if (at < path.size() && path[at] != '/') continue;
    const std::string part = path.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      return "cannot create the log directory " + part + ": " + std::strerror(errno);
  }
  return {};
}

/// Creates this run's log directory under --log-dir (or $TMPDIR) when any
/// stream goes to a file (--redirects, --tee, or the ranks --local-ranks-filter
/// keeps off the console); sets `o.log_run_dir`. "" or the error.
inline std::string make_run_log_dir(options& o) {
  if (o.redirects.empty() && o.tee.empty() && o.local_ranks_filter.empty()) return {};
  std::string base = o.log_dir;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp && *tmp ? tmp : "/tmp";
  }
  if (std::string err = make_dirs(base); !err.empty()) return err;
  std::string id;
  for (char c : o.rdzv_id) id += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  std::string templ = base + "/" + (o.log_dir.empty() ? "cclite-run_" : "") + id + "_XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) return "cannot create a log directory in " + base + ": " + std::strerror(errno);
  o.log_run_dir = buf.data();
  return {};
}

/// Opens (appends to) `<run dir>/attempt_<attempt>/<local>/stdout.log` and
/// stderr.log for the streams in `streams`; fds of the others stay -1.
inline std::string open_worker_logs(const std::string& run_dir, int attempt, int local, int streams, int& out,
                                    int& err) {
  out = err = -1;
  if (!streams || run_dir.empty()) return {};
  const std::string dir = run_dir + "/attempt_" + std::to_string(attempt) + "/" + std::to_string(local);
  if (std::string e = make_dirs(dir); !e.empty()) return e;
  for (int bit : {1, 2}) {
    if (!(streams & bit)) continue;
    const std::string path = dir + (bit == 1 ? "/stdout.log" : "/stderr.log");
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
    (bit == 1 ? out : err) = fd;
  }
  return {};
}

}  // namespace cclite::run
