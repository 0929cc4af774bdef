// cclite/collective/select.hpp - which algorithm runs a collective.
//
// Automatic choice, per call, from the message size (and later the topology
// and the measured link costs): allreduce uses recursive doubling up to
// CCLITE_RD_MAX bytes (default 32 KiB), where latency dominates, and the
// pipelined ring above. CCLITE_ALGO forces a choice, for every collective
// ("ring") or per collective ("allreduce:rd,broadcast:ring"), as NCCL_ALGO
// does. A forced algorithm a collective does not have is reported once at
// init (WARN) and ignored.
#pragma once

#include <cstring>
#include <string>

#include <cclite/collective/op.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>

namespace cclite {

enum class algorithm : std::uint8_t { automatic, ring, rd };

inline const char* to_string(algorithm a) noexcept {
  switch (a) {
    case algorithm::automatic: return "auto";
    case algorithm::ring: return "ring";
    case algorithm::rd: return "rd";
  }
  return "?";
}

/// Whether `a` exists for collective `k` in this version.
inline bool available(collective_kind k, algorithm a) noexcept {
  if (a == algorithm::automatic || a == algorithm::ring) return true;
  return a == algorithm::rd && k == collective_kind::allreduce;
}

class algorithm_selector {
 public:
  /// Reads CCLITE_ALGO and CCLITE_RD_MAX; unknown names are an error (a typo
  /// must not silently measure the wrong algorithm).
  status init(const logger& log) {
    auto rd = env::get_int("RD_MAX", 32 << 10, false);
    if (!rd) return rd.error();
    rd_max_ = static_cast<std::size_t>(rd.value() < 0 ? 0 : rd.value());
    const std::string spec = env::get_string("ALGO", "", false);
    std::size_t start = 0;
    while (start < spec.size()) {
      std::size_t end = spec.find(',', start);
      if (end == std::string::npos) end = spec.size();
      std::string item = spec.substr(start, end - start);
      start = end + 1;
      if (item.empty()) continue;
      std::string coll, name = item;
      if (auto colon = item.find(':'); colon != std::string::npos) {
        coll = item.substr(0, colon);
        name = item.substr(colon + 1);
      }
      algorithm a;
      if (name == "ring") a = algorithm::ring;
      else if (name == "rd") a = algorithm::rd;
      else if (name == "auto") a = algorithm::automatic;
      else if (name == "tree" || name == "rhd" || name == "direct" || name == "hier") {
        CCLITE_WARN(log, "CCLITE_ALGO: '%s' is not implemented yet; using the automatic choice", item.c_str());
        continue;
      } else {
        return make_error(errc::invalid_argument,
                          "CCLITE_ALGO='%s': unknown algorithm '%s' (use ring, rd or auto, optionally "
                          "per collective: allreduce:rd,broadcast:ring)",
                          spec.c_str(), name.c_str());
      }
      bool matched = false;
      for (int k = 0; k < collective_kind_count; ++k) {
        auto kind = static_cast<collective_kind>(k);
        if (!coll.empty() && coll != to_string(kind)) continue;
        matched = true;
        if (available(kind, a)) forced_[k] = a;
        else if (!coll.empty())
          CCLITE_WARN(log, "CCLITE_ALGO: %s has no algorithm '%s'; using the automatic choice",
                      coll.c_str(), name.c_str());
      }
      if (!matched) {
        return make_error(errc::invalid_argument, "CCLITE_ALGO='%s': unknown collective '%s'",
                          spec.c_str(), coll.c_str());
      }
    }
    return {};
  }

  /// The algorithm for one call of `k` moving `bytes` per rank on `n` ranks.
  algorithm choose(collective_kind k, std::size_t bytes, int n) const noexcept {
    algorithm f = forced_[static_cast<int>(k)];
    if (f != algorithm::automatic) return f;
    if (k == collective_kind::allreduce && n > 1 && bytes <= rd_max_) return algorithm::rd;
    return algorithm::ring;
  }

  /// Bytes of scratch recursive doubling needs (allocated once at init).
  std::size_t rd_scratch_bytes() const noexcept {
    return forced_[static_cast<int>(collective_kind::allreduce)] == algorithm::rd ? 0 : rd_max_;
  }
  bool rd_forced() const noexcept {
    return forced_[static_cast<int>(collective_kind::allreduce)] == algorithm::rd;
  }

 private:
  algorithm forced_[collective_kind_count] = {};
  std::size_t rd_max_ = 32 << 10;
};

}  // namespace cclite
