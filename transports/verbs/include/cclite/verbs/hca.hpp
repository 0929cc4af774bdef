// cclite/verbs/hca.hpp - CCLITE_IB_HCA / NCCL_IB_HCA: which RDMA devices and ports to use.
//
// NCCL's syntax, kept so that cluster job scripts carry over:
//
//   mlx5_0:1,mlx5_1     device-name prefixes, each optionally with a port
//                       ("mlx5_1" = every port of every device starting with mlx5_1,
//                       so mlx5_10 too)
//   =mlx5_0:1,mlx5_1    exact device names (mlx5_1 but not mlx5_10)
//   ^mlx5_2             every device except these (prefixes)
//   ^=mlx5_2:1          every device and port except exactly these
//   (empty)             every device
//
// Pure functions, no verbs call, so the rules are unit tested on any machine.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include <cclite/core/status.hpp>

namespace cclite::verbs {

/// One parsed CCLITE_IB_HCA list.
struct hca_filter {
  struct entry {
    std::string name;  ///< device name or prefix
    int port = -1;     ///< -1 = every port
  };
  bool exclude = false;  ///< leading '^'
  bool exact = false;    ///< leading '=' (after '^' if both)
  std::vector<entry> entries;

  /// True when the filter keeps port `port` of device `device`.
  bool matches(const std::string& device, int port) const {
    if (entries.empty()) return true;  // unset / empty: every device
    bool hit = false;
    for (const auto& e : entries) {
      bool name_ok = exact ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
      if (name_ok && (e.port < 0 || e.port == port)) {
        hit = true;
        break;
      }
    }
    return exclude ? !hit : hit;
  }

  /// Human-readable form for log lines ("only mlx5_0:1, mlx5_1 (prefix)").
  std::string describe() const {
    if (entries.empty()) return "every device";
    std::string s = exclude ? "every device except " : "only ";
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (i) s += ", ";
      s += entries[i].name;
      if (entries[i].port >= 0) s += ":" + std::to_string(entries[i].port);
    }
    s += exact ? " (exact names)" : " (name prefixes)";
    return s;
  }
};

/// Parses a CCLITE_IB_HCA value. Errors: invalid_argument for an empty entry
/// ("mlx5_0,,mlx5_1"), a bad port ("mlx5_0:x", port 0 or > 255) or a lone
/// '^' / '='; the message quotes the whole value and what is accepted.
inline result<hca_filter> parse_hca_list(const std::string& text) {
  hca_filter f;
  std::size_t i = 0;
  // Surrounding blanks come from shell quoting; they are never part of a name.
  while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  std::size_t end = text.size();
  while (end > i && (text[end - 1] == ' ' || text[end - 1] == '\t')) --end;
  if (i == end) return f;
  if (text[i] == '^') { f.exclude = true; ++i; }
  if (i < end && text[i] == '=') { f.exact = true; ++i; }
  auto bad = [&](const char* why) {
    return make_error(errc::invalid_argument,
                      "CCLITE_IB_HCA='%s': %s (expected e.g. 'mlx5_0:1,mlx5_1', '^mlx5_2', '=mlx5_0')",
                      text.c_str(), why);
  };
  if (i == end) return bad("no device named after '^' or '='");
  std::size_t start = i;
  for (; i <= end; ++i) {
    if (i < end && text[i] != ',') continue;
    std::string item = text.substr(start, i - start);
    start = i + 1;
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty()) return bad("empty entry");
    hca_filter::entry e;
    std::size_t colon = item.find(':');
    e.name = item.substr(0, colon);
    if (e.name.empty()) return bad("entry without a device name");
    if (colon != std::string::npos) {
      std::string p = item.substr(colon + 1);
      char* stop = nullptr;
      long port = p.empty() ? 0 : std::strtol(p.c_str(), &stop, 10);
      if (p.empty() || *stop != '\0' || port < 1 || port > 255) return bad("port must be 1..255");
      e.port = static_cast<int>(port);
    }
    f.entries.push_back(std::move(e));
  }
  return f;
}

}  // namespace cclite::verbs
