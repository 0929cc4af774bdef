// cclite/verbs/qp_attr.hpp - what ranks exchange through the bootstrap store.
//
//   verbs/<rank>              fabric_record: this rank's chosen port (or why it
//                             has none); read by can_connect() to decide whether
//                             a pair can use verbs at all
//   verbs/<lo>-<hi>/<rank>    qp_record: the queue pairs, PSN, address and FIFO
//                             of one connection, written by each side at connect
//
// Text records ("key=value" separated by spaces, versioned) so that a record
// from another cclite version or a corrupt store fails to parse with a message
// instead of being misread. Pure functions, unit tested here.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cclite/core/status.hpp>
#include <cclite/verbs/config.hpp>

namespace cclite::verbs {

namespace detail {
inline std::string hex16(const std::uint8_t (&g)[16]) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::uint8_t b : g) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}
inline bool unhex16(const std::string& s, std::uint8_t (&g)[16]) {
  if (s.size() != 32) return false;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (int i = 0; i < 16; ++i) {
    int hi = nib(s[2 * i]), lo = nib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    g[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}
// Value of `key=` in a space-separated record ("" and false when absent).
inline bool field(const std::string& rec, const char* key, std::string& out) {
  std::string k = std::string(" ") + key + "=";
  std::string padded = " " + rec;
  std::size_t at = padded.find(k);
  if (at == std::string::npos) return false;
  std::size_t b = at + k.size();
  std::size_t e = padded.find(' ', b);
  out = padded.substr(b, e == std::string::npos ? std::string::npos : e - b);
  return true;
}
inline bool field_u64(const std::string& rec, const char* key, std::uint64_t& out) {
  std::string v;
  if (!field(rec, key, v) || v.empty()) return false;
  char* end = nullptr;
  out = std::strtoull(v.c_str(), &end, 16);
  return *end == '\0';
}
}  // namespace detail

/// Link layer of a port, as published ('I' InfiniBand, 'E' Ethernet = RoCE).
enum class link_layer : char { infiniband = 'I', ethernet = 'E' };

inline const char* to_string(link_layer l) { return l == link_layer::infiniband ? "InfiniBand" : "RoCE"; }

/// A rank's verbs endpoint for can_connect(): its port, or why it has none.
struct fabric_record {
  bool usable = false;
  std::string reason;  ///< why not usable (may hold spaces: stored last)
  std::string device;  ///< "mlx5_0"
  int port = 0;
  link_layer layer = link_layer::infiniband;
  std::uint64_t subnet_prefix = 0;  ///< IB: first 8 GID bytes (big-endian value)

  std::string serialize() const {
    if (!usable) return "verbs1 usable=0 reason=" + reason;
    char buf[160];
    std::snprintf(buf, sizeof buf, "verbs1 usable=1 dev=%s port=%x layer=%c subnet=%llx",
                  device.c_str(), port, static_cast<char>(layer), (unsigned long long)subnet_prefix);
    return buf;
  }

  /// Errors: protocol_error (not a record of this version).
  static result<fabric_record> parse(const std::string& s) {
    fabric_record r;
    auto bad = [&] {
      return make_error(errc::protocol_error, "malformed verbs endpoint record in the store: '%.80s'",
                        s.c_str());
    };
    if (s.compare(0, 7, "verbs1 ") != 0) return bad();
    std::string u;
    if (!detail::field(s, "usable", u)) return bad();
    if (u == "0") {
      std::size_t at = s.find(" reason=");
      if (at == std::string::npos) return bad();
      r.reason = s.substr(at + 8);
      return r;
    }
    std::uint64_t port = 0, subnet = 0;
    std::string layer;
    if (u != "1" || !detail::field(s, "dev", r.device) || !detail::field_u64(s, "port", port) ||
        !detail::field(s, "layer", layer) || !detail::field_u64(s, "subnet", subnet) ||
        (layer != "I" && layer != "E")) {
      return bad();
    }
    r.usable = true;
    r.port = static_cast<int>(port);
    r.layer = static_cast<link_layer>(layer[0]);
    r.subnet_prefix = subnet;
    return r;
  }
};

/// Whether two ranks' endpoints can talk over verbs: both usable, same link
/// layer, and for InfiniBand the same subnet prefix (different IB subnets need
/// a router NCCL does not assume either). RoCE v2 is routed over IP, so any two
/// RoCE ports pass. `why` gets the reason when false (for the INFO line).
inline bool fabric_compatible(const fabric_record& self, const fabric_record& peer, std::string& why) {
  if (!self.usable) {
    why = "this rank has no usable RDMA port (" + self.reason + ")";
    return false;
  }
  if (!peer.usable) {
    why = "the peer has no usable RDMA port (" + peer.reason + ")";
    return false;
  }
  if (self.layer != peer.layer) {
    why = std::string("different fabrics: this rank's ") + self.device + " is " + to_string(self.layer) +
          ", the peer's " + peer.device + " is " + to_string(peer.layer);
    return false;
  }
  if (self.layer == link_layer::infiniband && self.subnet_prefix != peer.subnet_prefix) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "different InfiniBand subnets (prefix %016llx here, %016llx there)",
                  (unsigned long long)self.subnet_prefix, (unsigned long long)peer.subnet_prefix);
    why = buf;
    return false;
  }
  return true;
}

/// One side of a connection: everything the peer needs to move its QPs to RTR
/// and to write into this side's FIFO.
struct qp_record {
  int nqps = 1;
  std::uint32_t qpn[max_qps] = {};
  std::uint32_t psn = 0;       ///< first PSN of every QP of this side (24 bits)
  std::uint32_t lid = 0;       ///< IB LID (0 on RoCE)
  std::uint8_t gid[16] = {};
  int mtu = 0;                 ///< ibv_mtu enum value of the port's active MTU
  std::uint64_t fifo_addr = 0; ///< remote address of the receive FIFO
  std::uint32_t rkey = 0;
  std::uint64_t cap = 0;       ///< FIFO bytes
  std::uint64_t block = 0;     ///< striping block

  std::string serialize() const {
    char buf[128];
    std::string s = "verbs1 n=" + std::to_string(nqps) + " qpn=";
    for (int q = 0; q < nqps; ++q) {
      std::snprintf(buf, sizeof buf, "%s%x", q ? "," : "", qpn[q]);
      s += buf;
    }
    std::snprintf(buf, sizeof buf, " psn=%x lid=%x mtu=%x addr=%llx rkey=%x cap=%llx block=%llx gid=", psn,
                  lid, mtu, (unsigned long long)fifo_addr, rkey, (unsigned long long)cap,
                  (unsigned long long)block);
    return s + buf + detail::hex16(gid);
  }

  /// Errors: protocol_error (malformed, or values out of range).
  static result<qp_record> parse(const std::string& s) {
    qp_record r;
    auto bad = [&] {
      return make_error(errc::protocol_error, "malformed verbs connection record in the store: '%.120s'",
                        s.c_str());
    };
    if (s.compare(0, 7, "verbs1 ") != 0) return bad();
    std::string n, qpns, gid;
    std::uint64_t psn = 0, lid = 0, mtu = 0, addr = 0, rkey = 0, cap = 0, block = 0;
    if (!detail::field(s, "n", n) || !detail::field(s, "qpn", qpns) || !detail::field_u64(s, "psn", psn) ||
        !detail::field_u64(s, "lid", lid) || !detail::field_u64(s, "mtu", mtu) ||
        !detail::field_u64(s, "addr", addr) || !detail::field_u64(s, "rkey", rkey) ||
        !detail::field_u64(s, "cap", cap) || !detail::field_u64(s, "block", block) ||
        !detail::field(s, "gid", gid) || !detail::unhex16(gid, r.gid)) {
      return bad();
    }
    r.nqps = std::atoi(n.c_str());
    if (r.nqps < 1 || r.nqps > max_qps || psn > 0xffffff || lid > 0xffff || rkey > 0xffffffffu ||
        cap == 0 || cap % 4096 || block == 0 || block % 4096) {
      return bad();
    }
    std::size_t b = 0;
    for (int q = 0; q < r.nqps; ++q) {
      std::size_t e = qpns.find(',', b);
      if ((e == std::string::npos) != (q == r.nqps - 1)) return bad();
      std::string one = qpns.substr(b, e == std::string::npos ? std::string::npos : e - b);
      char* end = nullptr;
      unsigned long v = std::strtoul(one.c_str(), &end, 16);
      if (one.empty() || *end != '\0' || v > 0xffffff) return bad();
      r.qpn[q] = static_cast<std::uint32_t>(v);
      b = e + 1;
    }
    r.psn = static_cast<std::uint32_t>(psn);
    r.lid = static_cast<std::uint32_t>(lid);
    r.mtu = static_cast<int>(mtu);
    r.fifo_addr = addr;
    r.rkey = static_cast<std::uint32_t>(rkey);
    r.cap = cap;
    r.block = block;
    return r;
  }
};

}  // namespace cclite::verbs
