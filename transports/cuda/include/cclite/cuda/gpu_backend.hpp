// cclite/cuda/gpu_backend.hpp - which engine runs collectives on device buffers.
//
// CCLITE_GPU_BACKEND chooses, once per process:
//   nccl    whole collectives handed to NCCL (cclite::nccl::backend)
//   native  cclite's own path: today host staging through the CPU communicator
//           (device_communicator.hpp); the CUDA IPC transport is not written yet
//   auto    (or unset) nccl when this build has NCCL (CCLITE_HAS_NCCL), else native;
//           device_communicator::create() also falls back to native when some
//           node has more ranks than GPUs (NCCL allows one rank per GPU)
// The value is case-insensitive. An unknown value, or nccl in a build without
// NCCL, is an error naming what is accepted: a job that asked for NCCL must not
// silently run something else.
#pragma once

#include <string>

#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>

namespace cclite::cuda {

enum class gpu_backend { native, nccl };

inline const char* to_string(gpu_backend b) noexcept {
  return b == gpu_backend::nccl ? "nccl" : "native";
}

/// True when this translation unit was built with the NCCL backend (cclite::nccl).
inline constexpr bool built_with_nccl() noexcept {
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
  return true;
#else
  return false;
#endif
}

/// Parses a CCLITE_GPU_BACKEND value (nullptr or "" = auto); `have_nccl` says
/// whether the nccl backend is compiled in.
inline result<gpu_backend> parse_gpu_backend(const char* value, bool have_nccl = built_with_nccl()) {
  std::string v = value ? value : "";
  for (auto& c : v) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c | 0x20 : c);
  if (v.empty() || v == "auto") return have_nccl ? gpu_backend::nccl : gpu_backend::native;
  if (v == "native") return gpu_backend::native;
  if (v == "nccl") {
    if (have_nccl) return gpu_backend::nccl;
    return make_error(errc::unsupported,
                      "CCLITE_GPU_BACKEND=nccl but this build has no NCCL (configure with NCCL "
                      "found: libnccl-dev, NCCL_HOME or -DCCLITE_NCCL_LIBRARY=..., and link "
                      "cclite::nccl), or set CCLITE_GPU_BACKEND=native");
  }
  return make_error(errc::invalid_argument,
                    "CCLITE_GPU_BACKEND='%s' is not a GPU backend (accepted: nccl, native, auto)",
                    value);
}

/// CCLITE_GPU_BACKEND from the environment (no NCCL_* fallback: NCCL has no such variable).
inline result<gpu_backend> gpu_backend_from_env(bool have_nccl = built_with_nccl()) {
  return parse_gpu_backend(env::raw("GPU_BACKEND", false), have_nccl);
}

}  // namespace cclite::cuda
