// cclite/core/log.hpp - per-rank logging controlled by CCLITE_DEBUG (fallback NCCL_DEBUG).
//
//   CCLITE_DEBUG=WARN   problems only (default)
//   CCLITE_DEBUG=INFO   + topology, transport chosen per peer, algorithm per call
//                         (printed once per collective and size class)
//   CCLITE_DEBUG=TRACE  + every call and connection step
//   CCLITE_DEBUG_FILE=/path/cclite.%h.%p.log  write there instead of stderr
//                         (%h host, %p pid, %r rank, as NCCL_DEBUG_FILE)
//
// Lines look like NCCL's:  "node1:4242:4242 [rank 3] cclite INFO ring: 0 -> 1 via shm".
// A logger is a small value owned by each communicator; there is no global
// mutable state (the level is read from the environment once, then constant).
#pragma once

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include <cclite/config.hpp>
#include <cclite/core/env.hpp>

namespace cclite {

CCLITE_SETUP_CODE_BEGIN  // logging runs at set-up or when enabled: compiled for size (config.hpp)

enum class log_level : int { none = 0, warn = 1, info = 2, trace = 3 };

inline log_level parse_log_level(const char* v) {
  if (!v) return log_level::warn;
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(c & ~0x20);  // upper case
  if (s == "TRACE") return log_level::trace;
  if (s == "INFO") return log_level::info;
  if (s == "NONE" || s == "0" || s == "OFF") return log_level::none;
  return log_level::warn;  // WARN, VERSION and anything unknown
}

/// The level from CCLITE_DEBUG / NCCL_DEBUG, read once per process.
inline log_level env_log_level() {
  static const log_level level = parse_log_level(env::raw("DEBUG"));
  return level;
}

/// Where log lines go: stderr, or CCLITE_DEBUG_FILE with %h/%p/%r expanded.
class logger {
 public:
  logger() : level_(env_log_level()) { set_rank(-1); }
  explicit logger(int rank) : level_(env_log_level()) { set_rank(rank); }
  logger(const logger&) = delete;
  logger& operator=(const logger&) = delete;
  ~logger() {
    if (file_ && file_ != stderr) std::fclose(file_);
  }

  /// Sets the rank shown in the prefix and opens CCLITE_DEBUG_FILE if asked.
  void set_rank(int rank) {
    rank_ = rank;
    host_ = env::host_name();
    std::snprintf(prefix_, sizeof prefix_, "%s:%d [rank %d] cclite", host_.c_str(), (int)::getpid(), rank);
    if (file_ && file_ != stderr) std::fclose(file_);
    file_ = stderr;
    if (const char* path = env::raw("DEBUG_FILE")) {
      std::string p = expand(path);
      if (FILE* f = std::fopen(p.c_str(), "a")) file_ = f;
    }
  }

  log_level level() const noexcept { return level_; }
  bool enabled(log_level l) const noexcept { return l <= level_ && l != log_level::none; }
  const std::string& host() const noexcept { return host_; }
  int rank() const noexcept { return rank_; }

#if defined(__GNUC__) || defined(__clang__)
  __attribute__((format(printf, 3, 4)))
#endif
  void log(log_level l, const char* fmt, ...) const {
    if (!enabled(l)) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char* tag = l == log_level::warn ? "WARN" : l == log_level::info ? "INFO" : "TRACE";
    // One fprintf per line keeps lines of concurrent ranks from interleaving.
    std::fprintf(file_, "%s %s %s\n", prefix_, tag, msg);
    std::fflush(file_);
  }

 private:
  std::string expand(const char* pattern) const {
    std::string out;
    for (const char* p = pattern; *p; ++p) {
      if (*p == '%' && p[1]) {
        ++p;
        if (*p == 'h') out += host_;
        else if (*p == 'p') out += std::to_string(::getpid());
        else if (*p == 'r') out += std::to_string(rank_);
        else out += *p;
      } else {
        out += *p;
      }
    }
    return out;
  }

  log_level level_;
  int rank_ = -1;
  std::string host_;
  char prefix_[160] = {0};
  FILE* file_ = nullptr;
};
CCLITE_SETUP_CODE_END

}  // namespace cclite

#define CCLITE_WARN(lg, ...) (lg).log(::cclite::log_level::warn, __VA_ARGS__)
#define CCLITE_INFO(lg, ...) \
  do { if ((lg).enabled(::cclite::log_level::info)) (lg).log(::cclite::log_level::info, __VA_ARGS__); } while (0)
#define CCLITE_TRACE(lg, ...) \
  do { if ((lg).enabled(::cclite::log_level::trace)) (lg).log(::cclite::log_level::trace, __VA_ARGS__); } while (0)
