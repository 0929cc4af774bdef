// cclite/topology/peer_info.hpp - what every rank publishes about itself at init.
//
// Node identity follows NCCL: hostname + /proc/sys/kernel/random/boot_id, so two
// containers with the same hostname on different machines differ, and two
// processes on one machine agree. CCLITE_HOSTID (fallback NCCL_HOSTID) replaces
// it, which is how tests make one machine look like several nodes.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>
#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite {

struct peer_info {
  int rank = -1;
  int pid = 0;
  std::string hostname;                 ///< for messages ("rank 3 (node1, pid 4242)")
  std::string host_id;                  ///< equal on ranks of one node
  std::vector<std::string> transports;  ///< names of the transports this rank enabled

  bool has_transport(const std::string& name) const {
    for (const auto& t : transports)
      if (t == name) return true;
    return false;
  }

  /// "rank 3 (node1, pid 4242)": how every error message names a peer.
  std::string describe() const {
    return "rank " + std::to_string(rank) + " (" + hostname + ", pid " + std::to_string(pid) + ")";
  }

  /// Compact text form for the store: fields separated by '\n'. Field values
  /// never contain '\n' (we strip it), so parsing is unambiguous.
  std::string serialize() const {
    std::string s = "v1\n" + std::to_string(rank) + "\n" + std::to_string(pid) + "\n" +
                    clean(hostname) + "\n" + clean(host_id) + "\n";
    for (const auto& t : transports) s += clean(t) + ",";
    return s;
  }

  static result<peer_info> parse(const std::string& s) {
    std::vector<std::string> f;
    std::size_t start = 0;
    for (std::size_t i = 0; i <= s.size(); ++i) {
      if (i == s.size() || s[i] == '\n') {
        f.push_back(s.substr(start, i - start));
        start = i + 1;
      }
    }
    if (f.size() != 6 || f[0] != "v1") {
      return make_error(errc::protocol_error, "malformed peer record in the store (%zu fields)",
                        f.size());
    }
    peer_info p;
    char* end = nullptr;
    p.rank = static_cast<int>(std::strtol(f[1].c_str(), &end, 10));
    p.pid = static_cast<int>(std::strtol(f[2].c_str(), &end, 10));
    p.hostname = f[3];
    p.host_id = f[4];
    std::size_t b = 0;
    for (std::size_t i = 0; i < f[5].size(); ++i) {
      if (f[5][i] == ',') {
        if (i > b) p.transports.push_back(f[5].substr(b, i - b));
        b = i + 1;
      }
    }
    return p;
  }

 private:
  static std::string clean(std::string v) {
    for (auto& c : v)
      if (c == '\n' || c == ',') c = '_';
    return v;
  }
};

/// This machine's node identity: CCLITE_HOSTID / NCCL_HOSTID, else hostname + boot id.
inline std::string local_host_id() {
  std::string forced = env::get_string("HOSTID");
  if (!forced.empty()) return forced;
  std::string id = env::host_name();
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char boot[64] = {0};
    if (std::fgets(boot, sizeof boot, f)) {
      std::string b(boot);
      while (!b.empty() && (b.back() == '\n' || b.back() == '\r')) b.pop_back();
      id += ":" + b;
    }
    std::fclose(f);
  }
  return id;
}

/// The calling process's peer_info (transports filled in by the communicator).
inline peer_info local_peer_info(int rank) {
  peer_info p;
  p.rank = rank;
  p.pid = static_cast<int>(::getpid());
  p.hostname = env::host_name();
  p.host_id = local_host_id();
  return p;
}

}  // namespace cclite
CCLITE_SETUP_CODE_END
