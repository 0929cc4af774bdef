// cclite/cuda/native_config.hpp - what the native engine's two paths share: their
// settings and the bounded wait for a stream.
//
// Internal (cclite::cuda::detail). native_engine.hpp fills a native_config from
// device_options and hands it to both paths, staged (staged_engine.hpp) and
// CUDA IPC (ipc_engine.hpp); both wait for a stream in synchronize() with
// wait_stream(), which stops early on a failed host collective and is bounded
// by the timeout.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <thread>

#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/runtime.hpp>

namespace cclite::cuda::detail {

/// Polls `stream` until its work has run, sleeping a little between polls after
/// the first ~200. Ends early with `failed()` when that is not ok (a failed
/// host collective), with the CUDA error, or with errc::timeout after `timeout`.
template <class Failed>
status wait_stream(cudaStream_t stream, milliseconds timeout, int rank, Failed&& failed) {
  const deadline until = deadline::after(timeout);
  for (int spins = 0;; ++spins) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return status();
    if (e != cudaErrorNotReady) return cuda_status(e, "device_communicator: cudaStreamQuery");
    CCLITE_TRY(failed());
    if (until.expired()) {
      return make_error(errc::timeout,
                        "device_communicator rank %d: the stream did not finish within %lld ms "
                        "(CCLITE_TIMEOUT); a rank that never made the same call is the usual cause",
                        rank, static_cast<long long>(timeout.count()));
    }
    if (spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

/// The native engine's settings (device_options'), for both its paths.
struct native_config {
  std::size_t chunk_bytes = std::size_t{4} << 20;
  int slots = 4;
  int max_pending_chunks = 256;  ///< staged path only
  milliseconds timeout{120000};
};

}  // namespace cclite::cuda::detail
