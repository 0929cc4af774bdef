// cclite/train/bucket_plan.hpp - which gradients share an allreduce (type-free).
//
// Backward produces gradients from the last layer to the first, so buckets
// are filled in reverse registration order: bucket 0 holds the last layers'
// gradients and can be reduced while earlier layers are still being
// differentiated. Each bucket is one contiguous range of a flat gradient
// buffer, so its allreduce needs no packing copy. Buckets are cut so that
// none exceeds its cap unless a single parameter alone is larger; the first
// bucket has its own, smaller cap, as in PyTorch DDP, because the sooner the
// first allreduce starts, the more it overlaps. A parameter is split only on
// request (split_bytes): a large one whose gradient is computed in blocks
// (mlp::set_grad_blocks) then gets one bucket per block, each reducible as
// soon as its block is done.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace cclite::train {

struct bucket_plan {
  struct bucket {
    std::size_t offset = 0;  ///< first element in the flat buffer
    std::size_t count = 0;   ///< elements
    std::size_t params = 0;  ///< parameters (or pieces of one) it holds
  };
  std::vector<bucket> buckets;             ///< in launch order
  std::vector<std::size_t> param_offset;   ///< per parameter (registration index): element offset
  std::vector<std::size_t> param_bucket;   ///< per parameter: its (first) bucket
  std::size_t total = 0;                   ///< elements in the flat buffer

  /// Plans buckets for parameters of `sizes` elements (registration order),
  /// elements of `elem_bytes` bytes. Caps of 0 mean "no cap" (one bucket).
  /// `groups` (optional, one id per parameter) marks parameters whose
  /// gradients become final together, e.g. a layer's weight and bias:
  /// consecutive parameters with the same id always share a bucket, because a
  /// bucket can only start once its last gradient is final.
  /// `split_bytes` (0 = never): a parameter larger than that is cut into
  /// ceil(bytes / split_bytes) equal pieces, the first continuing the current
  /// bucket and each other one starting a bucket of its own.
  static bucket_plan make(const std::vector<std::size_t>& sizes, std::size_t elem_bytes,
                          std::size_t first_cap_bytes, std::size_t cap_bytes,
                          const std::vector<std::size_t>& groups = {}, std::size_t split_bytes = 0) {
    bucket_plan p;
    p.param_offset.assign(sizes.size(), 0);
    p.param_bucket.assign(sizes.size(), 0);
    std::size_t off = 0;
    for (std::size_t end = sizes.size(); end > 0;) {
      // The group [begin, end) in registration order, visited from the back.
      std::size_t begin = end - 1;
      while (!groups.empty() && begin > 0 && groups[begin - 1] == groups[end - 1]) --begin;
      std::size_t count = 0;
      for (std::size_t k = begin; k < end; ++k) count += sizes[k];
      const std::size_t cap = p.buckets.size() <= 1 ? first_cap_bytes : cap_bytes;
      if (p.buckets.empty() ||
          (p.buckets.back().params > 0 && cap > 0 && (p.buckets.back().count + count) * elem_bytes > cap)) {
        p.buckets.push_back(bucket{off, 0, 0});
      }
      for (std::size_t k = end; k-- > begin;) {
        p.param_offset[k] = off;
        p.param_bucket[k] = p.buckets.size() - 1;
        const std::size_t pieces =
            split_bytes > 0 && sizes[k] * elem_bytes > split_bytes ? (sizes[k] * elem_bytes + split_bytes - 1) / split_bytes : 1;
        for (std::size_t j = 0; j < pieces; ++j) {
          const std::size_t len = sizes[k] * (j + 1) / pieces - sizes[k] * j / pieces;
          if (j > 0) p.buckets.push_back(bucket{off, 0, 0});
          p.buckets.back().count += len;
          p.buckets.back().params += 1;
          off += len;
        }
      }
      end = begin;
    }
    p.total = off;
    return p;
  }

  /// "3 buckets: [0] 2 params 33.3 KiB, [1] ..." for logs.
  std::string describe(std::size_t elem_bytes) const {
    std::string s = std::to_string(buckets.size()) + (buckets.size() == 1 ? " bucket:" : " buckets:");
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " [%zu] %zu params %.1f KiB", b, buckets[b].params,
                    static_cast<double>(buckets[b].count * elem_bytes) / 1024.0);
      s += buf;
    }
    return s;
  }
};

}  // namespace cclite::train
