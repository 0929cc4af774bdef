// cclite/train/checkpoint.hpp - named sections of bytes, saved atomically, loaded only if intact.
//
//   train::checkpoint ck;
//   ck.put_u64("epoch", 3);
//   ck.put_floats("fc1.weight", w.data(), w.size());
//   if (auto st = ck.save("run/ckpt.bin"); !st.ok()) ...     // rank 0 only
//   auto in = train::checkpoint::load("run/ckpt.bin");        // any rank
//   if (!in) ... in.error() says "truncated" or "corrupt" and why
//   auto bytes = ck.serialize();  auto back = train::checkpoint::parse(p, n, "name");  // in memory
//
// save() writes `path.tmp.<pid>`, fsyncs it, renames it over `path` and fsyncs
// the directory: a crash leaves either the old checkpoint or the new one,
// never a mix. The file carries a CRC-32C of its header and of its payload
// and the payload's exact length, so load() refuses (errc::protocol_error,
// with the path and what is wrong) a truncated file, a file with bytes
// flipped, or something that is not a checkpoint, and never returns partial
// data. Numbers are stored little-endian; a big-endian host refuses the file
// rather than misreading it.
//
// File layout: "CCLTCKPT" | u32 version | u32 sections | u64 payload bytes |
// u32 crc32c(payload) | u32 crc32c(preceding 28 header bytes) | payload, where
// the payload is, per section: u32 name length | name | u64 data length | data.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <cclite/core/status.hpp>

namespace cclite::train {

namespace detail {

/// CRC-32C (Castagnoli), bytewise table: ~1 GB/s, ample for checkpoints.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  static const auto table = [] {
    struct t { std::uint32_t v[256]; } out{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      out.v[i] = c;
    }
    return out;
  }();
  const auto* p = static_cast<const std::uint8_t*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = table.v[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

inline bool host_is_little_endian() noexcept {
  const std::uint32_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

inline status errno_error(const char* what, const std::string& path) {
  return make_error(errc::system_error, "checkpoint: %s '%s': %s", what, path.c_str(), std::strerror(errno));
}

}  // namespace detail

class checkpoint {
 public:
  static constexpr char magic[9] = "CCLTCKPT";
  static constexpr std::uint32_t version = 1;
  static constexpr std::size_t header_bytes = 32;

  // ---- building ------------------------------------------------------------------------

  /// Adds (or replaces) section `name` with `n` bytes.
  void put_bytes(const std::string& name, const void* data, std::size_t n) {
    std::vector<std::uint8_t> v(static_cast<const std::uint8_t*>(data), static_cast<const std::uint8_t*>(data) + n);
    for (auto& s : sections_)
      if (s.first == name) {
        s.second = std::move(v);
        return;
      }
    sections_.emplace_back(name, std::move(v));
  }
  void put_floats(const std::string& name, const float* v, std::size_t n) { put_bytes(name, v, n * sizeof(float)); }
  void put_u64(const std::string& name, std::uint64_t v) { put_bytes(name, &v, sizeof v); }
  void put_f64(const std::string& name, double v) { put_bytes(name, &v, sizeof v); }

  // ---- reading ---------------------------------------------------------------------------

  bool has(const std::string& name) const { return find(name) != nullptr; }
  /// Bytes in section `name`, or SIZE_MAX if there is none.
  std::size_t section_bytes(const std::string& name) const {
    const auto* s = find(name);
    return s ? s->size() : SIZE_MAX;
  }
  std::size_t section_count() const noexcept { return sections_.size(); }

  /// Copies section `name` into out[0..n): errc::invalid_argument if it is
  /// missing or holds a different number of floats (a different model).
  status get_floats(const std::string& name, float* out, std::size_t n) const {
    const auto* s = find(name);
    if (!s) return make_error(errc::invalid_argument, "checkpoint: no section '%s'", name.c_str());
    if (s->size() != n * sizeof(float)) {
      return make_error(errc::invalid_argument, "checkpoint: section '%s' holds %zu floats, expected %zu",
                        name.c_str(), s->size() / sizeof(float), n);
    }
    if (n) std::memcpy(out, s->data(), s->size());
    return {};
  }
  result<std::uint64_t> get_u64(const std::string& name) const { return get_scalar<std::uint64_t>(name); }
  result<double> get_f64(const std::string& name) const { return get_scalar<double>(name); }

  /// CRC-32C of the payload as last saved or loaded (0 before either): ranks
  /// that loaded the same file agree on it.
  std::uint32_t checksum() const noexcept { return crc_; }

  // ---- files ------------------------------------------------------------------------------

  /// The file's bytes (layout above), as save() writes them; sets checksum().
  /// parse() of them gives back the same sections. Little-endian hosts only,
  /// as save() (which refuses on a big-endian one).
  std::vector<std::uint8_t> serialize() {
    std::vector<std::uint8_t> payload;
    for (const auto& s : sections_) {
      append_u32(payload, static_cast<std::uint32_t>(s.first.size()));
      payload.insert(payload.end(), s.first.begin(), s.first.end());
      append_u64(payload, s.second.size());
      payload.insert(payload.end(), s.second.begin(), s.second.end());
    }
    crc_ = detail::crc32c(payload.data(), payload.size());
    std::vector<std::uint8_t> file(magic, magic + 8);
    append_u32(file, version);
    append_u32(file, static_cast<std::uint32_t>(sections_.size()));
    append_u64(file, payload.size());
    append_u32(file, crc_);
    append_u32(file, detail::crc32c(file.data(), file.size()));
    file.insert(file.end(), payload.begin(), payload.end());
    return file;
  }

  /// Writes the checkpoint to `path` atomically (temporary file, fsync, rename).
  status save(const std::string& path) {
    if (!detail::host_is_little_endian())
      return make_error(errc::unsupported, "checkpoint: saving on a big-endian host is not supported");
    const std::vector<std::uint8_t> file = serialize();

    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return detail::errno_error("cannot create", tmp);
    std::size_t done = 0;
    while (done < file.size()) {
      ssize_t w = ::write(fd, file.data() + done, file.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        status st = detail::errno_error("cannot write", tmp);
        ::close(fd);
        ::unlink(tmp.c_str());
        return st;
      }
      done += static_cast<std::size_t>(w);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
      status st = detail::errno_error("cannot flush", tmp);
      ::unlink(tmp.c_str());
      return st;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      status st = detail::errno_error("cannot rename into place", path);
      ::unlink(tmp.c_str());
      return st;
    }
    // The rename itself must reach the disk too, or a crash could bring back the old file.
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
    return {};
  }

  /// Reads and verifies `path`. errc::system_error if it cannot be read;
  /// errc::protocol_error if it is not a cclite checkpoint, truncated or corrupt.
  static result<checkpoint> load(const std::string& path) {
    std::vector<std::uint8_t> file;
    CCLITE_TRY(read_file(path, file));
    return parse(file.data(), file.size(), path);
  }

  /// Verifies and reads a checkpoint held in memory (`size` bytes at `data`);
  /// `name` stands for it in errors. Errors as load()'s: errc::protocol_error
  /// for anything but an intact checkpoint.
  static result<checkpoint> parse(const void* data, std::size_t size, const std::string& name) {
    const auto* file = static_cast<const std::uint8_t*>(data);
    auto bad = [&](const char* fmt, auto... args) {
      char why[256];
      std::snprintf(why, sizeof why, fmt, args...);
      return make_error(errc::protocol_error, "checkpoint '%s' refused: %s", name.c_str(), why);
    };
    if (!detail::host_is_little_endian()) return bad("%s", "this host is big-endian; checkpoints are little-endian");
    if (size < header_bytes) {
      return bad("truncated: %zu bytes, shorter than the %zu-byte header", size, header_bytes);
    }
    if (std::memcmp(file, magic, 8) != 0) return bad("%s", "not a cclite checkpoint (bad magic)");
    if (read_u32(file + 28) != detail::crc32c(file, 28)) return bad("%s", "corrupt header (checksum mismatch)");
    const std::uint32_t ver = read_u32(file + 8);
    if (ver != version) return bad("version %u, this build reads version %u", ver, version);
    const std::uint32_t nsec = read_u32(file + 12);
    const std::uint64_t plen = read_u64(file + 16);
    const std::uint64_t have = size - header_bytes;
    if (have < plen) {
      return bad("truncated: payload has %llu of %llu bytes", static_cast<unsigned long long>(have),
                 static_cast<unsigned long long>(plen));
    }
    if (have > plen) return bad("%llu unexpected bytes after the payload", static_cast<unsigned long long>(have - plen));
    checkpoint ck;
    ck.crc_ = detail::crc32c(file + header_bytes, plen);
    if (ck.crc_ != read_u32(file + 24)) return bad("%s", "corrupt payload (checksum mismatch)");
    const std::uint8_t* p = file + header_bytes;
    const std::uint8_t* end = p + plen;
    for (std::uint32_t i = 0; i < nsec; ++i) {
      // Lengths were covered by the checksum; bounds are checked anyway.
      if (end - p < 4) return bad("section %u: header past the end", i);
      const std::uint32_t nlen = read_u32(p);
      p += 4;
      if (static_cast<std::uint64_t>(end - p) < std::uint64_t{nlen} + 8) return bad("section %u: name past the end", i);
      std::string name(reinterpret_cast<const char*>(p), nlen);
      p += nlen;
      const std::uint64_t dlen = read_u64(p);
      p += 8;
      if (static_cast<std::uint64_t>(end - p) < dlen) return bad("section '%s': data past the end", name.c_str());
      ck.sections_.emplace_back(std::move(name), std::vector<std::uint8_t>(p, p + dlen));
      p += dlen;
    }
    if (p != end) return bad("%s", "payload longer than its sections");
    return ck;
  }

 private:
  using section = std::pair<std::string, std::vector<std::uint8_t>>;

  const std::vector<std::uint8_t>* find(const std::string& name) const {
    for (const auto& s : sections_)
      if (s.first == name) return &s.second;
    return nullptr;
  }

  template <class T>
  result<T> get_scalar(const std::string& name) const {
    const auto* s = find(name);
    if (!s) return make_error(errc::invalid_argument, "checkpoint: no section '%s'", name.c_str());
    if (s->size() != sizeof(T)) return make_error(errc::invalid_argument, "checkpoint: section '%s' has %zu bytes, expected %zu", name.c_str(), s->size(), sizeof(T));
    T v;
    std::memcpy(&v, s->data(), sizeof v);
    return v;
  }

  static status read_file(const std::string& path, std::vector<std::uint8_t>& out) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return detail::errno_error("cannot open", path);
    std::uint8_t buf[1 << 16];
    for (;;) {
      ssize_t r = ::read(fd, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        status st = detail::errno_error("cannot read", path);
        ::close(fd);
        return st;
      }
      if (r == 0) break;
      out.insert(out.end(), buf, buf + r);
    }
    ::close(fd);
    return {};
  }

  // Host order is little-endian here (checked in load; save writes host order).
  static void append_u32(std::vector<std::uint8_t>& v, std::uint32_t x) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(&x);
    v.insert(v.end(), b, b + 4);
  }
  static void append_u64(std::vector<std::uint8_t>& v, std::uint64_t x) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(&x);
    v.insert(v.end(), b, b + 8);
  }
  static std::uint32_t read_u32(const std::uint8_t* p) {
    std::uint32_t x;
    std::memcpy(&x, p, 4);
    return x;
  }
  static std::uint64_t read_u64(const std::uint8_t* p) {
    std::uint64_t x;
    std::memcpy(&x, p, 8);
    return x;
  }

  std::vector<section> sections_;
  std::uint32_t crc_ = 0;
};

}  // namespace cclite::train
