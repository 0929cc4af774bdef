// tools/run/output_relay.hpp - the workers of this node as the poll loop
// reads them: each worker's two pipes, relayed to its log files and, as whole
// lines with their "[rank R]: " prefix, to our stdout / stderr; and
// cclite-run's own messages (say).
//
// Writing is the only place output can fail (a full disk, a reader that left):
// a failed log file sends the rank's output back to the console, a failed
// console is dropped, and either way the job goes on. The base of
// stop_policy.hpp and supervisor.hpp.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "line_splitter.hpp"
#include "posix.hpp"
#include "worker.hpp"

namespace cclite::run {

class output_relay {
 protected:
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

  std::vector<worker> workers_;
  bool stdout_ok_ = true;
  bool stderr_ok_ = true;
};

}  // namespace cclite::run
