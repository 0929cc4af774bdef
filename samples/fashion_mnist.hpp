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

// Reads the whole of `path` (or `path` without ".gz") through zlib.
inline cclite::status read_gz(const std::string& path, std::vector<std::uint8_t>& out, std::string& used) {
  std::string candidates[2] = {path, path.substr(0, path.size() - 3)};
  for (const std::string& p : candidates) {
    std::FILE* probe = std::fopen(p.c_str(), "rb");
    if (!probe) continue;
    std::fclose(probe);
    gzFile f = gzopen(p.c_str(), "rb");
    if (!f) return cclite::make_error(cclite::errc::system_error, "cannot open %s", p.c_str());
    gzbuffer(f, 1 << 17);
    unsigned char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
    int err = 0;
    const char* msg = gzerror(f, &err);
    gzclose(f);
    if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
      return cclite::make_error(cclite::errc::protocol_error, "%s: damaged gzip data (%s)", p.c_str(), msg);
    }
    used = p;
    return {};
  }
  return cclite::make_error(cclite::errc::invalid_argument, "missing %s", path.c_str());
}

inline cclite::status read_set(const std::string& dir, const std::string& prefix, image_set& s) {
  std::vector<std::uint8_t> img, lab;
  std::string img_path, lab_path;
  CCLITE_TRY(read_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", img, img_path));
  CCLITE_TRY(read_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", lab, lab_path));
  if (img.size() < 16 || be32(img.data()) != 0x803)
    return cclite::make_error(cclite::errc::protocol_error, "%s: not an IDX image file (magic)", img_path.c_str());
  if (lab.size() < 8 || be32(lab.data()) != 0x801)
    return cclite::make_error(cclite::errc::protocol_error, "%s: not an IDX label file (magic)", lab_path.c_str());
  const std::uint32_t n = be32(img.data() + 4), rows = be32(img.data() + 8), cols = be32(img.data() + 12);
  const std::uint32_t nl = be32(lab.data() + 4);
  if (n == 0 || rows == 0 || cols == 0 || rows > 4096 || cols > 4096 || n > (1u << 26))
    return cclite::make_error(cclite::errc::protocol_error, "%s: implausible shape %u x %u x %u", img_path.c_str(), n, rows, cols);
  if (img.size() != 16 + std::size_t{n} * rows * cols)
    return cclite::make_error(cclite::errc::protocol_error, "%s: %zu bytes, expected %zu (truncated?)", img_path.c_str(),
                              img.size(), 16 + std::size_t{n} * rows * cols);
  if (nl != n || lab.size() != 8 + std::size_t{n})
    return cclite::make_error(cclite::errc::protocol_error, "%s: %u labels for %u images", lab_path.c_str(), nl, n);
  for (std::size_t i = 8; i < lab.size(); ++i)
    if (lab[i] > 9) return cclite::make_error(cclite::errc::protocol_error, "%s: label %u out of 0..9", lab_path.c_str(), lab[i]);
  s.count = static_cast<int>(n);
  s.rows = static_cast<int>(rows);
  s.cols = static_cast<int>(cols);
  s.pixels.assign(img.begin() + 16, img.end());
  s.labels.assign(lab.begin() + 8, lab.end());
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
