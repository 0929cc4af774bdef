// samples/fashion_mnist.hpp - reads Fashion-MNIST (or MNIST) in IDX format, gzipped or not.
//
//   auto ds = sample::load_fashion_mnist("/usr/share/datasets/fashion-mnist");
//
// The four files of the dataset (Debian: apt-get install dataset-fashion-mnist,
// which puts them in /usr/share/datasets/fashion-mnist):
//   train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
//   t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz
// IDX: a big-endian u32 magic (0x803 images, 0x801 labels), big-endian u32
// dimensions, then one unsigned byte per pixel or label. zlib's gzread reads
// the .gz files and, transparently, uncompressed copies without the suffix.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <cclite/core/status.hpp>

namespace sample {

struct image_set {
  int count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols, row-major per image
  std::vector<std::uint8_t> labels;  // count, 0..9
  int features() const { return rows * cols; }
};

struct fashion_mnist {
  image_set train, test;
};

namespace detail {

inline std::uint32_t be32(const unsigned char* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}

// Reads the IDX file `path` (or `path` without ".gz") through zlib: the
// big-endian header first, then the payload straight into `out` (sized once
// from the header's dimensions; no growing and copying of 47 MB).
inline cclite::status read_idx(const std::string& path, std::uint32_t magic, std::vector<std::uint32_t>& dims,
                               std::vector<std::uint8_t>& out, std::string& used) {
  const std::string candidates[2] = {path, path.substr(0, path.size() - 3)};
  for (const std::string& p : candidates) {
    std::FILE* probe = std::fopen(p.c_str(), "rb");
    if (!probe) continue;
    std::fclose(probe);
    used = p;
    gzFile f = gzopen(p.c_str(), "rb");
    if (!f) return cclite::make_error(cclite::errc::system_error, "cannot open %s", p.c_str());
    gzbuffer(f, 1 << 18);
    auto fail = [&](const char* what) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      cclite::status st = cclite::make_error(cclite::errc::protocol_error, "%s: %s%s%s", p.c_str(), what,
                                             err != Z_OK ? ": " : "", err != Z_OK ? msg : "");
      gzclose(f);
      return st;
    };
    unsigned char head[4];
    if (gzread(f, head, 4) != 4) return fail("too short for an IDX header");
    if (be32(head) != magic) return fail(magic == 0x803 ? "not an IDX image file (magic)" : "not an IDX label file (magic)");
    std::size_t total = 1;
    dims.clear();
    for (unsigned d = 0; d < (magic & 0xffu); ++d) {
      if (gzread(f, head, 4) != 4) return fail("truncated IDX header");
      dims.push_back(be32(head));
      if (dims.back() == 0 || dims.back() > (1u << 26)) return fail("implausible IDX dimension");
      total *= dims.back();
      if (total > (std::size_t{1} << 32)) return fail("implausible IDX size");
    }
    out.resize(total);
    std::size_t got = 0;
    while (got < total) {
      const unsigned want = static_cast<unsigned>(std::min<std::size_t>(total - got, 1u << 30));
      const int n = gzread(f, out.data() + got, want);
      if (n <= 0) return fail("truncated (fewer bytes than its header announces)");
      got += static_cast<std::size_t>(n);
    }
    gzclose(f);
    return {};
  }
  return cclite::make_error(cclite::errc::invalid_argument, "missing %s", path.c_str());
}

inline cclite::status read_set(const std::string& dir, const std::string& prefix, image_set& s) {
  std::vector<std::uint32_t> idims, ldims;
  std::string img_path, lab_path;
  CCLITE_TRY(read_idx(dir + "/" + prefix + "-images-idx3-ubyte.gz", 0x803, idims, s.pixels, img_path));
  CCLITE_TRY(read_idx(dir + "/" + prefix + "-labels-idx1-ubyte.gz", 0x801, ldims, s.labels, lab_path));
  if (ldims[0] != idims[0])
    return cclite::make_error(cclite::errc::protocol_error, "%s: %u labels for %u images", lab_path.c_str(), ldims[0], idims[0]);
  for (std::uint8_t l : s.labels)
    if (l > 9) return cclite::make_error(cclite::errc::protocol_error, "%s: label %u out of 0..9", lab_path.c_str(), l);
  s.count = static_cast<int>(idims[0]);
  s.rows = static_cast<int>(idims[1]);
  s.cols = static_cast<int>(idims[2]);
  return {};
}

}  // namespace detail

/// Where Debian's dataset-fashion-mnist package installs the files.
inline const char* default_fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

/// Loads the training and test sets from `dir`. A missing file gives an
/// error that names the Debian package to install.
inline cclite::result<fashion_mnist> load_fashion_mnist(const std::string& dir) {
  fashion_mnist ds;
  for (auto [prefix, set] : {std::pair<const char*, image_set*>{"train", &ds.train}, {"t10k", &ds.test}}) {
    cclite::status st = detail::read_set(dir, prefix, *set);
    if (st.code() == cclite::errc::invalid_argument) {
      return cclite::make_error(cclite::errc::invalid_argument,
                                "Fashion-MNIST not found: %s. Install Debian's package with "
                                "'apt-get install dataset-fashion-mnist' (files in %s), or pass "
                                "--data DIR with train-images-idx3-ubyte.gz and the three others",
                                st.message().c_str(), default_fashion_mnist_dir());
    }
    if (!st.ok()) return st;
  }
  if (ds.train.features() != ds.test.features())
    return cclite::make_error(cclite::errc::protocol_error, "train and test images differ in size");
  return ds;
}

}  // namespace sample
