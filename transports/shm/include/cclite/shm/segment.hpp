// cclite/shm/segment.hpp - an RAII POSIX shared-memory segment (shm_open + mmap).
//
// What it is for: the shm transport puts one segment between each pair of ranks
// on a node. The lower rank create()s it, the higher rank open()s it, and both
// unlink() its name as soon as both have it mapped, so that nothing is left in
// /dev/shm if either process is killed later (the kernel frees the memory when
// the last mapping goes away).
//
// Memory is committed up front: create() reserves the pages in tmpfs with
// posix_fallocate (so a too-small /dev/shm is an error now, not a SIGBUS in the
// middle of a collective) and both create() and open() map with MAP_POPULATE
// (page faults cost 11-15 us per 4 KiB page on small VMs; the hot path must
// never take one).
//
// Errors: system_error (errno text), resource_exhausted (/dev/shm full),
// protocol_error (the object has an unexpected size). Destroying a segment
// unmaps it and unlinks its name if unlink() was not called yet.
#pragma once

#if !defined(__linux__)
#error "cclite::shm needs Linux (POSIX shm + futex); build with -DCCLITE_WITH_SHM=OFF"
#endif

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include <cclite/core/status.hpp>
#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::shm {

class segment {
 public:
  segment() noexcept = default;
  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;
  segment(segment&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        name_(std::move(o.name_)),
        linked_(std::exchange(o.linked_, false)) {}
  segment& operator=(segment&& o) noexcept {
    if (this != &o) {
      release();
      addr_ = std::exchange(o.addr_, nullptr);
      size_ = std::exchange(o.size_, 0);
      name_ = std::move(o.name_);
      linked_ = std::exchange(o.linked_, false);
    }
    return *this;
  }
  ~segment() { release(); }

  /// Creates the object `name` ("/cclite-..."), exclusively (O_EXCL, mode 0600),
  /// sizes it to `size` bytes, commits its memory and maps it. When the name
  /// already exists, *already_exists is set (if given) and system_error returned.
  static result<segment> create(const std::string& name, std::size_t size,
                                bool* already_exists = nullptr) {
    if (already_exists) *already_exists = false;
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      int e = errno;
      if (e == EEXIST && already_exists) *already_exists = true;
      return make_error(e == EMFILE || e == ENFILE ? errc::resource_exhausted : errc::system_error,
                        "shm_open(%s, O_CREAT|O_EXCL) failed: %s", name.c_str(), std::strerror(e));
    }
    segment s;
    s.name_ = name;
    s.linked_ = true;  // from here on, every error path unlinks (destructor)
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      int e = errno;
      ::close(fd);
      return make_error(errc::system_error, "ftruncate(%s, %zu) failed: %s", name.c_str(), size,
                        std::strerror(e));
    }
    // posix_fallocate returns the error number instead of setting errno.
    int e = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (e == ENOSPC || e == ENOMEM) {
      ::close(fd);
      return make_error(errc::resource_exhausted,
                        "cannot allocate %zu KiB of shared memory for %s: %s; /dev/shm is too "
                        "small (check `df -h /dev/shm`; in Docker use --shm-size=1g or "
                        "--ipc=host) or lower CCLITE_SHM_BUFFSIZE, or set CCLITE_SHM_DISABLE=1",
                        size >> 10, name.c_str(), std::strerror(e));
    }
    // EINVAL/EOPNOTSUPP: a file system without fallocate; MAP_POPULATE still commits.
    status st = s.map(fd, size);
    ::close(fd);
    if (!st.ok()) return st;
    return result<segment>(std::move(s));
  }

  /// Opens and maps the existing object `name`; its size comes from fstat and
  /// must be at least `min_size` bytes.
  static result<segment> open(const std::string& name, std::size_t min_size) {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
      int e = errno;
      return make_error(errc::system_error, "shm_open(%s) failed: %s", name.c_str(),
                        std::strerror(e));
    }
    segment s;
    s.name_ = name;
    s.linked_ = true;
    struct stat sb;
    if (::fstat(fd, &sb) != 0) {
      int e = errno;
      ::close(fd);
      return make_error(errc::system_error, "fstat(%s) failed: %s", name.c_str(), std::strerror(e));
    }
    std::size_t size = static_cast<std::size_t>(sb.st_size);
    if (size < min_size) {
      ::close(fd);
      return make_error(errc::protocol_error,
                        "shared memory segment %s has %zu bytes, expected at least %zu",
                        name.c_str(), size, min_size);
    }
    status st = s.map(fd, size);
    ::close(fd);
    if (!st.ok()) return st;
    return result<segment>(std::move(s));
  }

  /// Removes the name from /dev/shm (the mapping stays valid). A name already
  /// gone (ENOENT: the peer unlinked it first) is success.
  status unlink() {
    if (!linked_) return {};
    linked_ = false;
    return unlink_name(name_);
  }

  /// shm_unlink(name), treating ENOENT as success.
  static status unlink_name(const std::string& name) {
    if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
      int e = errno;
      return make_error(errc::system_error, "shm_unlink(%s) failed: %s", name.c_str(),
                        std::strerror(e));
    }
    return {};
  }

  void* data() const noexcept { return addr_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }
  bool mapped() const noexcept { return addr_ != nullptr; }
  bool linked() const noexcept { return linked_; }

 private:
  status map(int fd, std::size_t size) {
    int flags = MAP_SHARED;
#ifdef MAP_POPULATE
    flags |= MAP_POPULATE;
#endif
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      return make_error(e == ENOMEM ? errc::resource_exhausted : errc::system_error,
                        "mmap(%s, %zu bytes) failed: %s", name_.c_str(), size, std::strerror(e));
    }
    addr_ = p;
    size_ = size;
    return {};
  }

  void release() noexcept {
    if (addr_) ::munmap(addr_, size_);
    addr_ = nullptr;
    size_ = 0;
    if (linked_) (void)unlink_name(name_);
    linked_ = false;
  }

  void* addr_ = nullptr;
  std::size_t size_ = 0;
  std::string name_;
  bool linked_ = false;
};

}  // namespace cclite::shm
CCLITE_SETUP_CODE_END
