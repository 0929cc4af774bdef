// cclite/verbs/config.hpp - settings of the verbs transport, from the environment.
//
// Every variable is read as CCLITE_<name>, then NCCL_<name> where NCCL has the
// same knob (so cluster images that set NCCL_IB_* keep working):
//
//   IB_DISABLE            1: no verbs transport (NCCL_IB_DISABLE too)
//   IB_HCA                which devices / ports, NCCL syntax (hca.hpp)
//   IB_GID_INDEX          GID table index for RoCE; -1 (default): scan for a
//                         RoCE v2 IPv4-mapped entry (gid.hpp)
//   IB_QPS_PER_CONNECTION RC queue pairs per peer pair, 1..16 (default 1)
//   IB_TIMEOUT            local ACK timeout exponent, 4.096 us * 2^t, 1..31 (default 20)
//   IB_RETRY_CNT          transport retries before a failed completion, 0..7 (default 7)
//   IB_SL, IB_TC          service level 0..15, traffic class 0..255 (default 0)
//   IB_BUFFSIZE           cclite only: bytes of each registered ring, per peer and
//                         direction, multiple of 4096 (default 4M)
//   IB_BLOCK              cclite only: striping block across the QPs and largest
//                         RDMA write, multiple of 4096 (default 512K)
//   IB_SPIN_US            cclite only: microseconds wait() polls the CQ before
//                         sleeping on the completion channel (default 20)
//   IB_REG_CACHE_MAX_MB   cclite only: MiB of user buffers the registration cache
//                         keeps registered (reg_cache.hpp), 0..1048576 (default
//                         1024); 0 turns caching off (register per use)
//   IB_FORK_SAFE          cclite only: 1 (default) calls ibv_fork_init() once
//                         before the first registration (fork.hpp); 0 skips it
//
// Pure parsing: no verbs call, no allocation beyond the strings.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>

namespace cclite::verbs {

/// Upper bound of CCLITE_IB_QPS_PER_CONNECTION (fixed arrays in the link).
inline constexpr int max_qps = 16;

/// Settings of the verbs data path. Defaults are NCCL's where NCCL has the knob.
struct ib_config {
  std::string hca;          ///< CCLITE_IB_HCA / NCCL_IB_HCA, empty = every device
  int gid_index = -1;       ///< -1 = automatic (RoCE v2, IPv4-mapped preferred)
  int qps = 1;              ///< RC QPs per peer pair
  int timeout = 20;         ///< ibv_qp_attr::timeout exponent
  int retry_cnt = 7;        ///< ibv_qp_attr::retry_cnt
  int sl = 0;               ///< service level (IB) / priority (RoCE)
  int tc = 0;               ///< GRH traffic class (RoCE DSCP << 2)
  std::size_t buffsize = 4u << 20;
  std::size_t block = 512u << 10;
  int spin_us = 20;
  std::size_t reg_cache_max_mb = 1024;  ///< 0: registration cache off
  bool fork_safe = true;                ///< call ibv_fork_init() before registering

  /// Largest CCLITE_IB_REG_CACHE_MAX_MB (1 TiB).
  static constexpr std::int64_t reg_cache_max_mb_limit = std::int64_t(1) << 20;

  /// CCLITE_IB_REG_CACHE_MAX_MB: a plain decimal count of MiB (no K/M/G suffix:
  /// "1G" MiB would be ambiguous), 0..1048576, default 1024. Errors:
  /// invalid_argument naming the variable and its value.
  static result<std::size_t> reg_cache_max_mb_from_env() {
    const char* v = env::raw("IB_REG_CACHE_MAX_MB", false);
    if (!v || !*v) return std::size_t(1024);
    errno = 0;
    char* end = nullptr;
    long long x = std::strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0') {
      return make_error(errc::invalid_argument,
                        "CCLITE_IB_REG_CACHE_MAX_MB='%s' is not a whole number of MiB (e.g. 1024; 0 turns the "
                        "registration cache off)", v);
    }
    if (x < 0 || x > reg_cache_max_mb_limit) {
      return make_error(errc::invalid_argument, "CCLITE_IB_REG_CACHE_MAX_MB=%lld is out of range (0..%lld MiB)", x,
                        (long long)reg_cache_max_mb_limit);
    }
    return static_cast<std::size_t>(x);
  }

  /// CCLITE_IB_FORK_SAFE (no NCCL fallback), default true. Errors:
  /// invalid_argument (not a boolean).
  static result<bool> fork_safe_from_env() { return env::get_bool("IB_FORK_SAFE", true, false); }

  /// Whether CCLITE_IB_DISABLE / NCCL_IB_DISABLE turns the transport off.
  /// Errors: invalid_argument (not a boolean).
  static result<bool> disabled() { return env::get_bool("IB_DISABLE", false, true); }

  /// Reads the variables in the file comment. Errors: invalid_argument naming
  /// the variable, its value and the accepted range.
  static result<ib_config> from_env() {
    ib_config c;
    c.hca = env::get_string("IB_HCA", "", true);
    std::int64_t v = 0;
    CCLITE_TRY(read("IB_GID_INDEX", -1, -1, 255, true, v));
    c.gid_index = static_cast<int>(v);
    CCLITE_TRY(read("IB_QPS_PER_CONNECTION", 1, 1, max_qps, true, v));
    c.qps = static_cast<int>(v);
    CCLITE_TRY(read("IB_TIMEOUT", 20, 1, 31, true, v));
    c.timeout = static_cast<int>(v);
    CCLITE_TRY(read("IB_RETRY_CNT", 7, 0, 7, true, v));
    c.retry_cnt = static_cast<int>(v);
    CCLITE_TRY(read("IB_SL", 0, 0, 15, true, v));
    c.sl = static_cast<int>(v);
    CCLITE_TRY(read("IB_TC", 0, 0, 255, true, v));
    c.tc = static_cast<int>(v);
    CCLITE_TRY(read("IB_BUFFSIZE", 4 << 20, 4096, std::int64_t(1) << 30, false, v));
    if (v % 4096 != 0) return not_multiple("IB_BUFFSIZE", v);
    c.buffsize = static_cast<std::size_t>(v);
    CCLITE_TRY(read("IB_BLOCK", 512 << 10, 4096, std::int64_t(1) << 30, false, v));
    if (v % 4096 != 0) return not_multiple("IB_BLOCK", v);
    c.block = static_cast<std::size_t>(v);
    CCLITE_TRY(read("IB_SPIN_US", 20, 0, 1000000, false, v));
    c.spin_us = static_cast<int>(v);
    auto mb = reg_cache_max_mb_from_env();
    if (!mb) return mb.error();
    c.reg_cache_max_mb = mb.value();
    auto fs = fork_safe_from_env();
    if (!fs) return fs.error();
    c.fork_safe = fs.value();
    return c;
  }

 private:
  static status read(const char* name, std::int64_t def, std::int64_t lo, std::int64_t hi,
                     bool nccl, std::int64_t& out) {
    auto r = env::get_int(name, def, nccl);
    if (!r) return r.error();
    if (r.value() < lo || r.value() > hi) {
      return make_error(errc::invalid_argument, "CCLITE_%s=%lld is out of range (%lld..%lld)", name,
                        (long long)r.value(), (long long)lo, (long long)hi);
    }
    out = r.value();
    return {};
  }
  static status not_multiple(const char* name, std::int64_t v) {
    return make_error(errc::invalid_argument, "CCLITE_%s=%lld must be a multiple of 4096 (4K, 64K, 4M...)",
                      name, (long long)v);
  }
};

}  // namespace cclite::verbs
