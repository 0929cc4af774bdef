// cclite/verbs/gid.hpp - GID table entries, the RoCE GID choice, port speed.
//
// On RoCE the GID index decides the protocol and the address of every packet:
// each IP address of the netdev appears once as RoCE v1 (layer 2 only) and
// once as RoCE v2 (UDP/IP, routable). NCCL's automatic choice, kept here:
// the first RoCE v2 entry holding an IPv4-mapped address (::ffff:a.b.c.d),
// else the first RoCE v2 entry with a global IPv6 address, else any RoCE v2,
// else RoCE v1. On InfiniBand, GID 0 (subnet prefix + port GUID) is used.
// CCLITE_IB_GID_INDEX forces an index on either.
//
// Pure functions over a table the device layer fills in (device.hpp), so the
// choice is unit tested with synthetic tables on machines without RDMA.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cclite/core/status.hpp>

namespace cclite::verbs {

/// What a GID table entry is for (ibv_gid_entry::gid_type, simplified).
enum class gid_kind : int { ib = 0, roce_v1 = 1, roce_v2 = 2 };

inline const char* to_string(gid_kind k) {
  return k == gid_kind::ib ? "IB" : k == gid_kind::roce_v1 ? "RoCE v1" : "RoCE v2";
}

/// One populated GID table entry.
struct gid_entry {
  int index = 0;
  std::uint8_t raw[16] = {};
  gid_kind kind = gid_kind::ib;

  bool is_zero() const {
    for (std::uint8_t b : raw)
      if (b) return false;
    return true;
  }
  /// ::ffff:a.b.c.d, the form an IPv4 address of the netdev takes in the table.
  bool is_ipv4_mapped() const {
    for (int i = 0; i < 10; ++i)
      if (raw[i]) return false;
    return raw[10] == 0xff && raw[11] == 0xff;
  }
  /// fe80::/10: never routed, so a poor choice for RoCE v2 across subnets.
  bool is_link_local() const { return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80; }
};

/// The 16 bytes as text: "a.b.c.d" (RoCE IPv4-mapped) or eight hex groups.
inline std::string gid_to_string(const std::uint8_t (&g)[16]) {
  char buf[48];
  gid_entry e;
  std::memcpy(e.raw, g, 16);
  if (e.is_ipv4_mapped() && !e.is_zero()) {
    std::snprintf(buf, sizeof buf, "::ffff:%u.%u.%u.%u", g[12], g[13], g[14], g[15]);
    return buf;
  }
  std::string s;
  for (int i = 0; i < 16; i += 2) {
    std::snprintf(buf, sizeof buf, "%s%02x%02x", i ? ":" : "", g[i], g[i + 1]);
    s += buf;
  }
  return s;
}

/// The chosen index and why (for the INFO line).
struct gid_choice {
  int index = 0;
  std::string reason;
};

/// Chooses the GID index of a port (see the file comment). `table` holds the
/// populated entries (zero GIDs may be included; they are skipped);
/// `ethernet` = RoCE port; `forced` = CCLITE_IB_GID_INDEX or -1.
/// Errors: invalid_argument when `forced` names an empty or missing entry;
/// unsupported when a RoCE port has no usable GID (no IP address on its netdev).
inline result<gid_choice> select_gid(const std::vector<gid_entry>& table, bool ethernet, int forced) {
  if (forced >= 0) {
    for (const auto& e : table) {
      if (e.index == forced && !e.is_zero())
        return gid_choice{forced, "CCLITE_IB_GID_INDEX=" + std::to_string(forced) + " (" + to_string(e.kind) + ")"};
    }
    return make_error(errc::invalid_argument,
                      "CCLITE_IB_GID_INDEX=%d: that GID table entry is empty or does not exist on "
                      "this port (unset it to choose automatically; 'show_gids' lists the table)",
                      forced);
  }
  if (!ethernet) return gid_choice{0, "InfiniBand: GID 0"};
  struct rule {
    bool (*ok)(const gid_entry&);
    const char* why;
  };
  static const rule rules[] = {
      {[](const gid_entry& e) { return e.kind == gid_kind::roce_v2 && e.is_ipv4_mapped(); },
       "first RoCE v2 entry with an IPv4 address"},
      {[](const gid_entry& e) { return e.kind == gid_kind::roce_v2 && !e.is_link_local(); },
       "first RoCE v2 entry with a global IPv6 address (no IPv4 entry)"},
      {[](const gid_entry& e) { return e.kind == gid_kind::roce_v2; },
       "first RoCE v2 entry (link-local only: not routable)"},
      {[](const gid_entry& e) { return e.kind == gid_kind::roce_v1; }, "first RoCE v1 entry (no RoCE v2)"},
  };
  for (const auto& r : rules) {
    for (const auto& e : table) {
      if (!e.is_zero() && r.ok(e)) return gid_choice{e.index, r.why};
    }
  }
  return make_error(errc::unsupported,
                    "this RoCE port has no usable GID (its network interface has no IP address?); "
                    "set CCLITE_IB_GID_INDEX or give the interface an address");
}

/// Link speed in Gbit/s from ibv_port_attr active_width and active_speed
/// codes (0 when a code is unknown, e.g. a newer generation).
inline double port_gbps(int active_width, int active_speed) {
  int lanes = 0;
  switch (active_width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return 0;
  }
  double lane = 0;
  switch (active_speed) {
    case 1: lane = 2.5; break;    // SDR
    case 2: lane = 5; break;      // DDR
    case 4: case 8: lane = 10; break;  // QDR, FDR10
    case 16: lane = 14; break;    // FDR
    case 32: lane = 25; break;    // EDR
    case 64: lane = 50; break;    // HDR
    case 128: lane = 100; break;  // NDR
    case 256: lane = 200; break;  // XDR
    default: return 0;
  }
  return lanes * lane;
}

}  // namespace cclite::verbs
