// cclite/verbs/registrar.hpp - one registration of memory with the NIC
// (mem_registration: a page-aligned range and its keys) and the real
// Registrar policy of reg_cache: ibv_registrar, ibv_reg_mr / ibv_dereg_mr on
// one protection domain, whose errors name the range, errno and what to do:
// ENOMEM / EAGAIN / EPERM are resource_exhausted (the locked-memory limit),
// EFAULT / EINVAL invalid_argument (not mapped: a freed buffer still cached?),
// anything else system_error.
//
// Apart from reg_cache.hpp so that the cache's bookkeeping reads apart from
// the verbs calls it makes; the cache sees a registrar only through the policy
// described in reg_cache.hpp's file comment (the unit tests pass a fake one
// that records every call). reg_cache.hpp includes this header.
#pragma once

#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cclite/core/status.hpp>

namespace cclite::verbs {

/// One registration of the page-aligned range [base, base + length).
struct mem_registration {
  std::uintptr_t base = 0;
  std::size_t length = 0;
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  void* token = nullptr;  ///< the registrar's own handle (ibv_mr*)

  std::uintptr_t end() const noexcept { return base + length; }
  /// Whether [a, a + n) lies inside this registration.
  bool covers(std::uintptr_t a, std::size_t n) const noexcept {
    return a >= base && a - base <= length && n <= length - (a - base);
  }
};

/// Page size of this host, from sysconf once.
inline std::size_t system_page_size() {
  static const std::size_t page = [] {
    long v = ::sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<std::size_t>(v) : std::size_t(4096);
  }();
  return page;
}

/// What to tell the user when registering failed with errno `e`.
inline const char* reg_failure_hint(int e) {
  switch (e) {
    case ENOMEM: case EAGAIN: case EPERM:
      return "the locked-memory limit ('ulimit -l', memlock in /etc/security/limits.conf or the container's) must "
             "allow it; raise it, or lower CCLITE_IB_REG_CACHE_MAX_MB";
    case EFAULT: case EINVAL:
      return "the range must be memory mapped by this process: a freed buffer still cached? call "
             "reg_cache::invalidate() when freeing, or set CCLITE_IB_REG_CACHE_MAX_MB=0";
    default:
      return "see dmesg for the driver's reason";
  }
}

/// The real registrar: ibv_reg_mr / ibv_dereg_mr on one protection domain,
/// local write and remote read / write allowed. The PD must outlive it.
class ibv_registrar {
 public:
  static constexpr int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

  explicit ibv_registrar(ibv_pd* pd) noexcept : pd_(pd) {}

  /// Errors: resource_exhausted (locked-memory limit), invalid_argument (not
  /// mapped), system_error (other), each naming the range, errno and a hint.
  result<mem_registration> reg(std::uintptr_t base, std::size_t length) {
    ibv_mr* mr = ::ibv_reg_mr(pd_, reinterpret_cast<void*>(base), length, access);
    if (!mr) {
      int e = errno;
      errc code = (e == ENOMEM || e == EAGAIN || e == EPERM) ? errc::resource_exhausted
                  : (e == EFAULT || e == EINVAL)             ? errc::invalid_argument
                                                             : errc::system_error;
      return make_error(code, "ibv_reg_mr of [%#jx, %#jx) (%zu bytes) failed: %s (%s)", (std::uintmax_t)base,
                        (std::uintmax_t)(base + length), length, std::strerror(e), reg_failure_hint(e));
    }
    mem_registration r;
    r.base = base;
    r.length = length;
    r.lkey = mr->lkey;
    r.rkey = mr->rkey;
    r.token = mr;
    return r;
  }
  void dereg(const mem_registration& r) noexcept {
    if (r.token) ::ibv_dereg_mr(static_cast<ibv_mr*>(r.token));
  }

 private:
  ibv_pd* pd_;
};

}  // namespace cclite::verbs
