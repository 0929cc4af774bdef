// cclite/core/env.hpp - configuration from the environment.
//
// cclite reads its own CCLITE_<NAME> variable first and NCCL_<NAME> as a
// fallback for the names NCCL also has (SOCKET_IFNAME, DEBUG, BUFFSIZE,
// SHM_DISABLE, ...), so cluster images that set NCCL_* globally work unchanged.
// A malformed value is not silently ignored: the typed getters return an
// errc::invalid_argument status naming the variable and what it accepts.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::env {

/// Value of CCLITE_<name>, else NCCL_<name> when `nccl_fallback`, else nullptr.
inline const char* raw(const char* name, bool nccl_fallback = true) {
  std::string key = std::string("CCLITE_") + name;
  if (const char* v = std::getenv(key.c_str())) return v;
  if (nccl_fallback) {
    key = std::string("NCCL_") + name;
    if (const char* v = std::getenv(key.c_str())) return v;
  }
  return nullptr;
}

/// String value, or `def` when unset.
inline std::string get_string(const char* name, const std::string& def = {},
                              bool nccl_fallback = true) {
  const char* v = raw(name, nccl_fallback);
  return v ? std::string(v) : def;
}

/// Integer value (decimal, or with a K/M/G binary suffix: "4M" = 4 MiB), or `def`.
inline result<std::int64_t> get_int(const char* name, std::int64_t def, bool nccl_fallback = true) {
  const char* v = raw(name, nccl_fallback);
  if (!v || !*v) return def;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v) {
    return make_error(errc::invalid_argument, "CCLITE_%s='%s' is not an integer", name, v);
  }
  switch (*end) {
    case 'k': case 'K': x <<= 10; ++end; break;
    case 'm': case 'M': x <<= 20; ++end; break;
    case 'g': case 'G': x <<= 30; ++end; break;
    default: break;
  }
  if (*end == 'i' || *end == 'B') ++end;  // accept "4Mi", "4MB"
  if (*end == 'B') ++end;
  if (*end != '\0') {
    return make_error(errc::invalid_argument,
                      "CCLITE_%s='%s' is not an integer (accepted: 123, 64K, 4M, 1G)", name, v);
  }
  return static_cast<std::int64_t>(x);
}

/// Per-peer staging bytes of one transport: CCLITE_<specific> (SHM_BUFFSIZE,
/// TCP_BUFFSIZE) when set, else the generic CCLITE_BUFFSIZE (or NCCL_BUFFSIZE,
/// NCCL's per-peer buffer), else `def`. `from` gets the variable the value came
/// from ("" for the default), so a range error can name it.
inline result<std::int64_t> get_buffsize(const char* specific, std::int64_t def, std::string* from = nullptr) {
  if (from) from->clear();
  if (const char* v = raw(specific, false); v && *v) {
    if (from) *from = std::string("CCLITE_") + specific;
    return get_int(specific, def, false);
  }
  if (const char* v = raw("BUFFSIZE", true); v && *v) {
    if (from) *from = std::getenv("CCLITE_BUFFSIZE") ? "CCLITE_BUFFSIZE" : "NCCL_BUFFSIZE";
    return get_int("BUFFSIZE", def, true);
  }
  return def;
}

/// Boolean: 1/0, true/false, yes/no, on/off (case-insensitive), or `def`.
inline result<bool> get_bool(const char* name, bool def, bool nccl_fallback = true) {
  const char* v = raw(name, nccl_fallback);
  if (!v || !*v) return def;
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(c | 0x20);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return make_error(errc::invalid_argument, "CCLITE_%s='%s' is not a boolean (use 1 or 0)", name,
                    v);
}

/// Default for every wait in cclite: 30 minutes, like PyTorch's CPU backends.
inline constexpr std::int64_t default_timeout_seconds = 30 * 60;

/// CCLITE_TIMEOUT in seconds (fractions allowed: "0.5"); 0 or negative = never.
inline result<milliseconds> timeout() {
  const char* v = raw("TIMEOUT", false);
  if (!v || !*v) return milliseconds(default_timeout_seconds * 1000);
  char* end = nullptr;
  double s = std::strtod(v, &end);
  if (end == v || *end != '\0') {
    return make_error(errc::invalid_argument,
                      "CCLITE_TIMEOUT='%s' is not a number of seconds (e.g. 1800 or 0.5)", v);
  }
  if (s <= 0) return milliseconds(-1);
  return milliseconds(static_cast<std::int64_t>(s * 1000.0));
}

/// A timeout option resolved: -2 (the options' "unset") takes CCLITE_TIMEOUT,
/// zero or negative means none (-1), as CCLITE_TIMEOUT=0 and set_timeout(0) do.
inline result<milliseconds> timeout_option(milliseconds given) {
  if (given.count() == -2) return timeout();
  return given.count() > 0 ? given : milliseconds(-1);
}

/// This machine's host name (gethostname), `fallback` when it cannot be read.
inline std::string host_name(const char* fallback = "unknown") {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == 0) return fallback;
  return host;
}

}  // namespace cclite::env
CCLITE_SETUP_CODE_END
