// cclite/bootstrap/launch_parse.hpp - reading launcher variables: strict
// integers, ports, rendezvous endpoints, Slurm node lists.
//
// The parsers behind detect_launch() (launch_env.hpp, which includes this
// header), and env_getter, the environment they read. Errors are
// errc::bootstrap_error and name the variable, its value and what to write
// instead. For an srun job that names no endpoint, slurm_first_host() finds
// the node where its ranks meet and slurm_port() the port they meet at.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <cclite/config.hpp>
#include <cclite/core/status.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite {

/// Looks a variable up; returns nullptr when unset. ::getenv by default;
/// tests pass a fake environment.
using env_getter = std::function<const char*(const char*)>;

namespace detail {

inline const char* env_value(const env_getter& get, const char* name) {
  const char* v = name ? get(name) : nullptr;
  return (v && *v) ? v : nullptr;
}

// Strict non-negative decimal int; `out` untouched on failure.
inline bool parse_nonneg_int(const char* s, long long max, long long& out) {
  if (!s || !*s) return false;
  long long v = 0;
  for (const char* p = s; *p; ++p) {
    if (*p < '0' || *p > '9') return false;
    v = v * 10 + (*p - '0');
    if (v > max) return false;
  }
  out = v;
  return true;
}

inline status bad_int(const char* name, const char* value, const char* what) {
  return make_error(errc::bootstrap_error, "cclite: %s='%s' is not %s; check the launcher command", name,
                    value, what);
}

// Reads an optional int variable into `out` (left at -1 when unset).
inline status read_int(const env_getter& get, const char* name, int min, int& out) {
  const char* v = env_value(get, name);
  if (!v) return {};
  long long x = 0;
  if (!parse_nonneg_int(v, 0x7fffffff, x) || x < min)
    return bad_int(name, v, min > 0 ? "a positive integer" : "a non-negative integer");
  out = static_cast<int>(x);
  return {};
}

inline status parse_port(const char* name, const char* text, std::uint16_t& port) {
  long long p = 0;
  if (!parse_nonneg_int(text, 65535, p) || p == 0)
    return make_error(errc::bootstrap_error, "cclite: %s has port '%s'; a port is a number in 1..65535", name,
                      text);
  port = static_cast<std::uint16_t>(p);
  return {};
}

// "host:port" or "[v6]:port" -> host (no brackets), port.
inline status parse_endpoint(const char* text, std::string& host, std::uint16_t& port) {
  std::string s = text;
  std::string port_text;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return make_error(errc::bootstrap_error, "cclite: CCLITE_RDZV_ENDPOINT='%s' is not [ipv6-address]:port",
                        text);
    host = s.substr(1, close - 1);
    port_text = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string::npos)
      return make_error(errc::bootstrap_error,
                        "cclite: CCLITE_RDZV_ENDPOINT='%s' has no port; write host:port (e.g. node0:29400)",
                        text);
    if (s.find(':') != colon)
      return make_error(
          errc::bootstrap_error,
          "cclite: CCLITE_RDZV_ENDPOINT='%s' is ambiguous; write an IPv6 address as [addr]:port", text);
    host = s.substr(0, colon);
    port_text = s.substr(colon + 1);
  }
  if (host.empty())
    return make_error(errc::bootstrap_error, "cclite: CCLITE_RDZV_ENDPOINT='%s' has no host; write host:port",
                      text);
  std::string what = std::string("CCLITE_RDZV_ENDPOINT='") + text + "'";
  return parse_port(what.c_str(), port_text.c_str(), port);
}

// The first host of a Slurm hostlist: "node[01-04,07],login1" -> "node01",
// "rack[1-2]-n[3-4]" -> "rack1-n3". The first comma-separated item, each
// bracket replaced by its first number as written (zero padding kept).
// Empty when the list is malformed.
inline std::string slurm_first_host(const char* list) {
  std::string host;
  for (const char* p = list; *p && *p != ','; ++p) {
    if (*p == ']') return {};
    if (*p != '[') {
      host += *p;
      continue;
    }
    const char* digits = ++p;
    while (*p >= '0' && *p <= '9') ++p;
    if (p == digits) return {};
    host.append(digits, p);
    while (*p && *p != ']') ++p;
    if (!*p) return {};
  }
  return host;
}

// The store's port for an srun job that names none: in 20000..29999, below
// Linux's ephemeral ports (32768 up), so it does not collide with outgoing
// connections; different for each step of a job (1021 is prime to 10000, so
// steps 0..9999 differ) and for consecutive job ids. A non-numeric id is hashed.
inline std::uint16_t slurm_port(const char* job_id, const char* step_id) {
  auto mod10k = [](const char* s) {
    unsigned long long v = 0, h = 1469598103934665603ull;  // FNV-1a, for a non-numeric id
    bool numeric = s && *s;
    for (const char* p = s; p && *p; ++p) {
      numeric = numeric && *p >= '0' && *p <= '9';
      v = (v * 10 + static_cast<unsigned>(*p - '0')) % 10000;
      h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
    }
    return numeric ? v : h % 10000;
  };
  return static_cast<std::uint16_t>(20000 + (mod10k(job_id) + 1021 * mod10k(step_id)) % 10000);
}

}  // namespace detail
}  // namespace cclite
CCLITE_SETUP_CODE_END
