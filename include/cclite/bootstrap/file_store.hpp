// cclite/bootstrap/file_store.hpp - a store in a directory every node mounts.
//
// For clusters where ranks share a filesystem (the /app or /home of an HPC
// cluster, NFS, Lustre) but no one wants to pick a port: every key is one file.
//   - set writes a unique temporary file and rename()s it over the key's file,
//     so a reader sees the old value or the new one, never half of one;
//   - get / wait poll for the file with backoff, 1 ms doubling to 50 ms, or
//     to 5 ms on a filesystem known to be local (tmpfs, ext4, xfs, btrfs...:
//     mpirun's session directory, a one-node CCLITE_RDZV_DIR), where polling
//     costs no server anything (8 ranks under mpirun: init 0.12 s slower than
//     with the TCP store at 50 ms, within 0.03 s of it at 5 ms);
//   - add is a read-modify-write under flock() on `<dir>/.lock` (Linux NFS
//     maps flock to byte-range locks, so it holds across nodes).
// Key bytes are mapped to safe file names ("k_" + bytes outside [A-Za-z0-9_-]
// %XX-escaped); a name that would be too long for the filesystem becomes a
// 128-bit hash ("h_<hex>"). Each file holds its full key, which is checked on
// read, so a hash collision is reported rather than returned as data.
//
// The directory must be private to one run: keys left by an earlier run with
// the same directory would be read as this run's. rendezvous.hpp uses
// `<CCLITE_RDZV_DIR>/<job id>`; reuse of a job id needs a fresh directory.
// On NFS, new files may take the client's attribute-cache time (acdirmin,
// typically a few seconds) to become visible on other nodes.
//
// Thread safety: calls may come from several threads at once (each is file
// operations of its own; temp names are unique per call). Several processes
// and several file_store objects may share a directory.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cclite/config.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite {

class file_store final : public store {
 public:
  /// Opens (creating it and its parents if needed) the store directory `dir`.
  /// `op_timeout` bounds add()'s wait for the lock.
  /// Errors: errc::bootstrap_error when the directory cannot be created or is
  /// not writable (the message names it and says what it must be).
  static result<std::unique_ptr<file_store>> open(const std::string& dir,
                                                  milliseconds op_timeout = milliseconds(300000)) {
    auto fail = [&](const char* what, int err) {
      return make_error(errc::bootstrap_error,
                        "cannot use rendezvous directory '%s': %s: %s; it must be creatable and writable "
                        "by every rank on every node (set CCLITE_RDZV_DIR to such a shared directory)",
                        dir.c_str(), what, std::strerror(err));
    };
    if (dir.empty()) return fail("empty path", EINVAL);
    for (std::size_t pos = 1;; ++pos) {  // mkdir -p
      pos = dir.find('/', pos);
      std::string part = dir.substr(0, pos);
      struct stat pst {};
      // An existing parent we may not write to can answer EACCES/EROFS, not EEXIST.
      if (::mkdir(part.c_str(), 0777) != 0) {
        int err = errno;
        if (err != EEXIST && ::stat(part.c_str(), &pst) != 0) return fail("mkdir", err);
      }
      if (pos == std::string::npos) break;
    }
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return fail("stat", errno);
    if (!S_ISDIR(st.st_mode)) return fail("not a directory", ENOTDIR);
    std::unique_ptr<file_store> fs(new file_store(dir, op_timeout));
    struct statfs sfs {};
    if (::statfs(dir.c_str(), &sfs) == 0 && local_filesystem(static_cast<unsigned long>(sfs.f_type)))
      fs->poll_cap_ = milliseconds(5);
    std::string probe = fs->temp_name();
    int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return fail("not writable", errno);
    ::close(fd);
    ::unlink(probe.c_str());
    return {std::move(fs)};
  }

  const std::string& dir() const noexcept { return dir_; }

  /// Longest pause between two polls of a key (see above).
  milliseconds poll_cap() const noexcept { return poll_cap_; }

  /// Whether statfs's f_type names a filesystem on this machine's own
  /// memory or disks. Anything else (NFS, Lustre, GPFS, CIFS, FUSE, ...)
  /// counts as shared and is polled gently.
  static bool local_filesystem(unsigned long f_type) noexcept {
    switch (f_type) {
      case 0x01021994:  // tmpfs
      case 0x858458f6:  // ramfs
      case 0xef53:      // ext2/3/4
      case 0x58465342:  // xfs
      case 0x9123683e:  // btrfs
      case 0xf2f52010:  // f2fs
      case 0x2fc12fc1:  // zfs
      case 0x794c7630:  // overlayfs
        return true;
      default:
        return false;
    }
  }

  /// The file that holds `key` (for tests and debugging).
  std::string path_of(const std::string& key) const { return dir_ + "/" + file_name(key); }

  /// Errors: errc::invalid_argument over the size limits; errc::system_error
  /// when the file cannot be written (disk full, permissions).
  status set(const std::string& key, const std::string& value) override {
    CCLITE_TRY(check_sizes(key, value.size()));
    return write_key(key, value);
  }

  /// Errors: errc::timeout naming the key and the directory.
  result<std::string> get(const std::string& key, deadline until) override {
    CCLITE_TRY(check_sizes(key, 0));
    auto t0 = clock::now();
    milliseconds backoff(1);
    for (;;) {
      std::string value;
      bool found = false;
      CCLITE_TRY(read_key(key, value, found));
      if (found) return value;
      if (until.expired()) return timeout_error(t0, "key '" + printable(key) + "'");
      pause(backoff, until);
    }
  }

  /// Errors: errc::timeout when the lock stays held past the op timeout;
  /// errc::invalid_argument when the key holds a non-integer or overflows.
  result<std::int64_t> add(const std::string& key, std::int64_t delta) override {
    CCLITE_TRY(check_sizes(key, 0));
    std::string lock_path = dir_ + "/.lock";
    int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return sys_error("open", lock_path);
    // Opened per call: a descriptor inherited across fork() would share its
    // lock with the parent and exclude nothing.
    struct closer {
      int fd;
      ~closer() { ::close(fd); }  // also releases the flock
    } guard{fd};
    deadline until = deadline::after(op_timeout_);
    auto t0 = clock::now();
    milliseconds backoff(1);
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) return sys_error("flock", lock_path);
      if (until.expired())
        return make_error(errc::timeout,
                          "timed out after %lld ms waiting for the lock %s for add on key '%s' (held by a "
                          "stuck process, or a stale lock on the shared filesystem?)",
                          since(t0), lock_path.c_str(), printable(key).c_str());
      pause(backoff, until);
    }
    std::string cur_text;
    bool found = false;
    CCLITE_TRY(read_key(key, cur_text, found));
    std::int64_t cur = 0, next = 0;
    if (found && !parse_i64(cur_text, cur))
      return make_error(errc::invalid_argument, "add on key '%s' whose value is not an integer",
                        printable(key).c_str());
    if (__builtin_add_overflow(cur, delta, &next))
      return make_error(errc::invalid_argument, "add on key '%s' overflows int64", printable(key).c_str());
    CCLITE_TRY(write_key(key, std::to_string(next)));
    return next;
  }

  /// Errors: errc::timeout naming the missing keys and the directory.
  status wait(const std::vector<std::string>& keys, deadline until) override {
    auto t0 = clock::now();
    milliseconds backoff(1);
    for (std::size_t i = 0; i < keys.size();) {
      CCLITE_TRY(check_sizes(keys[i], 0));
      auto has = check(keys[i]);
      if (!has) return has.error();
      if (has.value()) {
        ++i;
        continue;
      }
      if (until.expired()) {
        std::string missing;
        std::size_t n = 0;
        for (std::size_t j = i; j < keys.size(); ++j) {
          auto h = check(keys[j]);
          if (h.ok() && h.value()) continue;
          if (++n <= 8) missing += (missing.empty() ? "'" : ", '") + printable(keys[j]) + "'";
        }
        if (n > 8) missing += ", ...";
        return timeout_error(
            t0, std::to_string(n) + " of " + std::to_string(keys.size()) + " keys (" + missing + ")");
      }
      pause(backoff, until);
    }
    return {};
  }

  result<bool> check(const std::string& key) override {
    CCLITE_TRY(check_sizes(key, 0));
    std::string path = path_of(key);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT) return false;
    return sys_error("stat", path);
  }

 private:
  file_store(std::string dir, milliseconds op_timeout) : dir_(std::move(dir)), op_timeout_(op_timeout) {
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    tag_ = env::host_name("host") + "." + std::to_string(::getpid()) + "." +
           std::to_string(reinterpret_cast<std::uintptr_t>(this));
  }

  // Unique across nodes (host), processes (pid) and objects (address).
  std::string temp_name() { return dir_ + "/.tmp." + tag_ + "." + std::to_string(++seq_); }

  static std::string file_name(const std::string& key) {
    static const char hex[] = "0123456789ABCDEF";
    std::string name = "k_";
    for (unsigned char c : key) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-') {
        name += static_cast<char>(c);
      } else {
        name += '%';
        name += hex[c >> 4];
        name += hex[c & 15];
      }
      if (name.size() > 200) break;  // NAME_MAX is 255 on most filesystems
    }
    if (name.size() <= 200) return name;
    // Two independent 64-bit FNV-1a hashes; the key stored in the file
    // catches the (astronomically unlikely) collision.
    std::uint64_t a = 14695981039346656037ull, b = 0x84222325cbf29ce4ull;
    for (unsigned char c : key) {
      a = (a ^ c) * 1099511628211ull;
      b = (b ^ static_cast<unsigned char>(c + 0x5b)) * 0x100000001b3ull;
    }
    char buf[40];
    std::snprintf(buf, sizeof buf, "h_%016llx%016llx", static_cast<unsigned long long>(a),
                  static_cast<unsigned long long>(b));
    return buf;
  }

  // File layout: u32 little-endian key length, key, value.
  status write_key(const std::string& key, const std::string& value) {
    std::string tmp = temp_name();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return sys_error("create", tmp);
    unsigned char len[4];
    for (int i = 0; i < 4; ++i) len[i] = static_cast<unsigned char>(key.size() >> (8 * i));
    bool ok = write_all(fd, len, 4) && write_all(fd, key.data(), key.size()) &&
              write_all(fd, value.data(), value.size());
    int err = errno;
    if (::close(fd) != 0 && ok) ok = false, err = errno;
    std::string path = path_of(key);
    if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) ok = false, err = errno;
    if (!ok) {
      ::unlink(tmp.c_str());
      errno = err;
      return sys_error("write", path);
    }
    return {};
  }

  status read_key(const std::string& key, std::string& value, bool& found) {
    std::string path = path_of(key);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      found = false;
      return errno == ENOENT ? status() : sys_error("open", path);
    }
    std::string data;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) != 0) {
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        errno = err;
        return sys_error("read", path);
      }
      data.append(buf, static_cast<std::size_t>(n));
      if (data.size() > 4 + max_store_key_bytes + max_store_value_bytes) break;
    }
    ::close(fd);
    std::size_t klen = 0;
    for (int i = 0; i < 4 && data.size() >= 4; ++i)
      klen |= std::size_t(static_cast<unsigned char>(data[i])) << (8 * i);
    if (data.size() < 4 || klen != key.size() || data.size() - 4 < klen ||
        data.size() > 4 + max_store_key_bytes + max_store_value_bytes || data.compare(4, klen, key) != 0)
      return make_error(errc::protocol_error,
                        "file %s does not hold key '%s' (corrupt, written by another program, or a hash "
                        "collision); use an empty CCLITE_RDZV_DIR",
                        path.c_str(), printable(key).c_str());
    value.assign(data, 4 + klen, std::string::npos);
    found = true;
    return {};
  }

  static bool write_all(int fd, const void* p, std::size_t n) {
    auto* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t k = ::write(fd, c, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      c += k;
      n -= static_cast<std::size_t>(k);
    }
    return true;
  }

  void pause(milliseconds& backoff, deadline until) const {
    std::this_thread::sleep_for(std::min(backoff, until.remaining()));
    backoff = std::min(backoff * 2, poll_cap_);
  }

  static status check_sizes(const std::string& key, std::size_t value_len) {
    return check_store_sizes(key, value_len);
  }

  static bool parse_i64(const std::string& s, std::int64_t& out) {
    if (s.empty() || s.size() > 20) return false;
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || *end != '\0' || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9'))) return false;
    out = v;
    return true;
  }

  static std::string printable(const std::string& key) {
    std::string out;
    for (unsigned char c : key) {
      if (out.size() >= 160) return out + "...";
      if (c >= 0x20 && c < 0x7f) {
        out += static_cast<char>(c);
      } else {
        char b[8];
        std::snprintf(b, sizeof b, "\\x%02x", c);
        out += b;
      }
    }
    return out;
  }

  static long long since(clock::time_point t0) {
    return static_cast<long long>(std::chrono::duration_cast<milliseconds>(clock::now() - t0).count());
  }

  status timeout_error(clock::time_point t0, const std::string& what) const {
    return make_error(errc::timeout,
                      "timed out after %lld ms waiting for %s in the file store %s; did every rank start, "
                      "with the same CCLITE_RDZV_DIR and job id?",
                      since(t0), what.c_str(), dir_.c_str());
  }

  static status sys_error(const char* op, const std::string& path) {
    int err = errno;
    return make_error(errc::system_error, "file store: %s %s: %s", op, path.c_str(), std::strerror(err));
  }

  std::string dir_;
  milliseconds op_timeout_;
  milliseconds poll_cap_{50};  // 5 ms on a local filesystem (open())
  std::string tag_;
  std::atomic<std::uint64_t> seq_{0};  // temp names unique across threads too
};

}  // namespace cclite
CCLITE_SETUP_CODE_END
