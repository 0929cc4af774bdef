// cclite/train/grad_compression.hpp - gradients sent as 16-bit floats (PyTorch
// DDP's fp16_compress_hook / bf16_compress_hook, Horovod's Compression.fp16).
//
// Between nodes the gradient allreduce is bound by the link (10 Gbit/s moves
// a 100 MB fp32 gradient in ~160 ms per ring pass); sending 16-bit values
// halves the bytes. data_parallel (dp_options::compression) packs each
// bucket as it is issued: every value divided by the rank count, then
// rounded to nearest even (fp16 or bf16), allreduced with sum in that type,
// and unpacked into the fp32 gradients when the step completes. Dividing
// first, as DDP's hooks do, keeps the sum of N values in range.
//
// What it costs in accuracy: each value is rounded once when packed and each
// partial sum once per reduction step, so an averaged element differs from
// the exact mean by at most about N x 2^-8 (bf16) or N x 2^-11 (fp16) times
// the mean of the |values| (tests/trainer_test.cpp states the bound). bf16
// keeps fp32's range; fp16 has 3 more bits of precision, but values below
// ~6e-8 after the division become 0 and above 65504 infinity. Every rank
// still ends with bitwise identical gradients.
//
// Inside a node over shared memory, where copies are cheap, packing costs
// more than it saves: keep it for links between nodes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <cclite/core/dtype.hpp>
#include <cclite/core/reduce_kernels.hpp>
#include <cclite/core/reduce_x86.hpp>
#include <cclite/core/status.hpp>

namespace cclite::train {

/// How data_parallel sends gradients.
enum class grad_compression : std::uint8_t {
  none,  ///< fp32, as computed (the default)
  fp16,  ///< IEEE binary16
  bf16,  ///< bfloat16
};

inline const char* to_string(grad_compression c) noexcept {
  switch (c) {
    case grad_compression::none: return "none";
    case grad_compression::fp16: return "fp16";
    case grad_compression::bf16: return "bf16";
  }
  return "?";
}

/// Parses "none", "fp16" or "bf16"; false for anything else.
inline bool parse_grad_compression(const char* s, grad_compression& out) noexcept {
  const grad_compression all[] = {grad_compression::none, grad_compression::fp16, grad_compression::bf16};
  for (grad_compression c : all) {
    if (std::strcmp(s, to_string(c)) == 0) {
      out = c;
      return true;
    }
  }
  return false;
}

CCLITE_FP_KERNELS_BEGIN

/// out[i] = round(g[i] / ranks) in Wire (half or bfloat16), 8 at a time on
/// x86 CPUs with AVX2 and F16C (core/reduce_x86.hpp; the same bits).
template <class Wire>
void pack_gradients(const float* g, Wire* out, std::size_t n, int ranks) noexcept {
  const float d = static_cast<float>(ranks);
#if CCLITE_HAS_X86_KERNELS
  if (cclite::detail::x86::cpu_has_avx2_f16c()) return cclite::detail::x86::narrow(g, out, n, d);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = cclite::detail::compute<Wire>::store(g[i] / d);
}

/// g[i] = in[i] as fp32 (exact).
template <class Wire>
void unpack_gradients(const Wire* in, float* g, std::size_t n) noexcept {
#if CCLITE_HAS_X86_KERNELS
  if (cclite::detail::x86::cpu_has_avx2_f16c()) return cclite::detail::x86::widen(in, g, n);
#endif
  for (std::size_t i = 0; i < n; ++i) g[i] = cclite::detail::compute<Wire>::load(in[i]);
}

CCLITE_FP_KERNELS_END

/// The 16-bit copy of the gradients that data_parallel sends when compression
/// is on: one buffer laid out as the fp32 gradients, so a bucket is the same
/// range [offset, offset + count) in both.
class grad_wire {
  // f(the buffer of the chosen type); first, so that its return type is
  // deduced before the members below use it.
  template <class F>
  decltype(auto) with(F&& f) {
    if (c_ == grad_compression::fp16) return f(fp16_.data());
    return f(bf16_.data());
  }

 public:
  /// Sized for `n` gradients; nothing for grad_compression::none.
  void allocate(grad_compression c, std::size_t n) {
    c_ = c;
    if (c == grad_compression::fp16) fp16_.assign(n, half{});
    if (c == grad_compression::bf16) bf16_.assign(n, bfloat16{});
  }
  bool on() const noexcept { return c_ != grad_compression::none; }

  /// Packs g[off, off + n) divided by comm.size() and starts its
  /// allreduce(sum) on `comm`; unpack() once it is done.
  template <class Comm>
  auto allreduce_async(Comm& comm, const float* g, std::size_t off, std::size_t n) {
    return with([&](auto* wire) {
      pack_gradients(g + off, wire + off, n, comm.size());
      return comm.allreduce_async(wire + off, n, reduce_op::sum);
    });
  }

  /// The same on the calling thread, unpacked into g when it worked.
  template <class Comm>
  status allreduce(Comm& comm, float* g, std::size_t off, std::size_t n) {
    status st = with([&](auto* wire) {
      pack_gradients(g + off, wire + off, n, comm.size());
      return comm.allreduce(wire + off, n, reduce_op::sum);
    });
    if (st.ok()) unpack(g, off, n);
    return st;
  }

  /// The reduced values of [off, off + n) into g, as fp32.
  void unpack(float* g, std::size_t off, std::size_t n) noexcept {
    with([&](auto* wire) { unpack_gradients(wire + off, g + off, n); });
  }

 private:
  grad_compression c_ = grad_compression::none;
  std::vector<half> fp16_;
  std::vector<bfloat16> bf16_;
};

}  // namespace cclite::train
