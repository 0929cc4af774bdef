// cclite/shm/cma.hpp - single-copy reads from another process on this node
// (Linux cross-memory attach: process_vm_readv).
//
// What it is for: the shm links move a message through a FIFO, i.e. the
// sender copies it in and the receiver copies it out. process_vm_readv copies
// straight from the peer's buffer into ours, once: the kernel pins the peer's
// pages and copies, ~4 us a call plus ~20 GB/s here (Open MPI's vader BTL
// does the same above its eager limit). shm-direct's single-copy collectives
// (collective/comm_shared.hpp) use it between 64 KiB and 16 MiB, where it
// beats the FIFO's two copies (docs/performance.md, "Session 18").
//
// When it works: both processes in one pid namespace, and the reader allowed
// to ptrace the peer (same uid and a dumpable peer, or CAP_SYS_PTRACE; with
// Yama's ptrace_scope >= 1 only an ancestor may, so sibling ranks may not).
// cclite does not widen that (Open MPI calls prctl(PR_SET_PTRACER_ANY); we
// leave the process's ptrace policy alone): where the probe fails the
// communicator keeps the FIFO path and says why at INFO.
//
// Errors: errc::system_error with the errno text and what to do (EPERM:
// ptrace policy; EFAULT: the peer's buffer is not mapped for that many
// bytes; ESRCH: the peer is gone).
#pragma once

#if !defined(__linux__)
#error "cclite::shm needs Linux; build with -DCCLITE_WITH_SHM=OFF"
#endif

#include <sys/types.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cclite/core/status.hpp>

namespace cclite::shm {

/// Copies `bytes` from address `from` in process `pid` to `to` in this one.
/// `who` names the peer in errors ("rank 3 (node1, pid 4242)").
inline status cma_read(int pid, void* to, const void* from, std::size_t bytes, const char* who) {
  auto* dst = static_cast<std::uint8_t*>(to);
  auto src = reinterpret_cast<std::uintptr_t>(from);
  while (bytes) {
    iovec local{dst, bytes};
    iovec remote{reinterpret_cast<void*>(src), bytes};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int e = got < 0 ? errno : EFAULT;  // 0: nothing readable at `src`
      const char* hint = e == EPERM || e == EACCES
                             ? "; this process may not read the peer's memory (ptrace policy: same user, a dumpable "
                               "peer, Yama ptrace_scope 0); set CCLITE_SHM_CMA=0 to keep shm-direct on the FIFOs"
                         : e == EFAULT ? "; the peer's buffer is not mapped for that many bytes (its count or pointer "
                                         "is wrong)"
                         : e == ENOSYS ? "; the kernel or a seccomp filter refuses process_vm_readv; set "
                                         "CCLITE_SHM_CMA=0"
                                       : "";
      return make_error(errc::system_error, "single-copy read of %zu bytes at %p from %s: %s%s", bytes,
                        reinterpret_cast<void*>(src), who, std::strerror(e), hint);
    }
    dst += got;
    src += static_cast<std::uintptr_t>(got);
    bytes -= static_cast<std::size_t>(got);
  }
  return {};
}

}  // namespace cclite::shm
