// cclite/cuda/ipc.hpp - device buffers and events shared between processes of one node.
//
// The building blocks of the CUDA IPC transport: a process exports a
// cudaIpcMemHandle_t for a cudaMalloc'd buffer (and a cudaIpcEventHandle_t for an
// interprocess event), publishes the bytes in the job's store, and its peers map
// the buffer once (cudaIpcOpenMemHandle) and read or reduce from it with device
// kernels. Works between two processes on one GPU as well (how it is tested on a
// single-GPU machine) and between GPUs with peer access (NVLink or PCIe P2P,
// `can_access_peer`).
//
// device_communicator's CUDA IPC path (ipc_engine.hpp) is built on these.
// Errors: no device -> unsupported; a pointer that is not the device memory of
// a cudaMalloc -> invalid_argument; a handle of the wrong size -> protocol_error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <cclite/bootstrap/store.hpp>
#include <cclite/cuda/nvml.hpp>
#include <cclite/cuda/runtime.hpp>

namespace cclite::cuda {

/// The bytes of a cudaIpcMemHandle_t for `dev_ptr`, ready to store. `dev_ptr`
/// must be device memory from cudaMalloc (a peer maps the whole allocation, at
/// the allocation's base address: export the base, pass offsets separately).
inline result<std::string> export_memory(void* dev_ptr) {
  auto n = device_count();
  if (!n) return n.error();
  if (query_pointer(dev_ptr).kind != memory_kind::device) {
    return make_error(errc::invalid_argument,
                      "export_memory: %p is not device memory from cudaMalloc (only that can be "
                      "shared with cudaIpcGetMemHandle)",
                      dev_ptr);
  }
  cudaIpcMemHandle_t h;
  CCLITE_TRY(cuda_status(cudaIpcGetMemHandle(&h, dev_ptr), "cudaIpcGetMemHandle"));
  return std::string(reinterpret_cast<const char*>(&h), sizeof h);
}

/// A peer's device allocation mapped into this process; unmapped by the destructor.
class ipc_mapping {
 public:
  ipc_mapping() = default;
  ipc_mapping(ipc_mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  ipc_mapping& operator=(ipc_mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ipc_mapping(const ipc_mapping&) = delete;
  ipc_mapping& operator=(const ipc_mapping&) = delete;
  ~ipc_mapping() { reset(); }

  /// Maps the allocation `handle` (export_memory's bytes) on the current device,
  /// enabling peer access when it lives on another GPU.
  static result<ipc_mapping> open(const std::string& handle) {
    cudaIpcMemHandle_t h;
    if (handle.size() != sizeof h) {
      return make_error(errc::protocol_error, "CUDA IPC memory handle has %zu bytes, expected %zu",
                        handle.size(), sizeof h);
    }
    std::memcpy(&h, handle.data(), sizeof h);
    ipc_mapping m;
    CCLITE_TRY(cuda_status(cudaIpcOpenMemHandle(&m.p_, h, cudaIpcMemLazyEnablePeerAccess),
                           "cudaIpcOpenMemHandle"));
    return result<ipc_mapping>(std::move(m));
  }

  void* data() const noexcept { return p_; }

  void reset() noexcept {
    if (p_) (void)cudaIpcCloseMemHandle(p_);
    p_ = nullptr;
  }

 private:
  void* p_ = nullptr;
};

/// An interprocess CUDA event: created here (and exported), or a peer's, opened.
/// Lets a peer's stream wait for this process's writes without a host round trip.
class ipc_event {
 public:
  ipc_event() = default;
  ipc_event(ipc_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  ipc_event& operator=(ipc_event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  ipc_event(const ipc_event&) = delete;
  ipc_event& operator=(const ipc_event&) = delete;
  ~ipc_event() { reset(); }

  /// A new event that other processes may open (interprocess events cannot time).
  static result<ipc_event> create() {
    ipc_event ev;
    CCLITE_TRY(cuda_status(
        cudaEventCreateWithFlags(&ev.e_, cudaEventInterprocess | cudaEventDisableTiming),
        "cudaEventCreateWithFlags(cudaEventInterprocess)"));
    return result<ipc_event>(std::move(ev));
  }

  /// A peer's event from its handle bytes.
  static result<ipc_event> open(const std::string& handle) {
    cudaIpcEventHandle_t h;
    if (handle.size() != sizeof h) {
      return make_error(errc::protocol_error, "CUDA IPC event handle has %zu bytes, expected %zu",
                        handle.size(), sizeof h);
    }
    std::memcpy(&h, handle.data(), sizeof h);
    ipc_event ev;
    CCLITE_TRY(cuda_status(cudaIpcOpenEventHandle(&ev.e_, h), "cudaIpcOpenEventHandle"));
    return result<ipc_event>(std::move(ev));
  }

  /// This event's handle bytes, for the store.
  result<std::string> handle() const {
    cudaIpcEventHandle_t h;
    CCLITE_TRY(cuda_status(cudaIpcGetEventHandle(&h, e_), "cudaIpcGetEventHandle"));
    return std::string(reinterpret_cast<const char*>(&h), sizeof h);
  }

  cudaEvent_t get() const noexcept { return e_; }

  void reset() noexcept {
    if (e_) (void)cudaEventDestroy(e_);
    e_ = nullptr;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

/// Whether kernels on `device` can read `peer`'s memory directly (NVLink or PCIe
/// P2P). The same device is always true (two processes sharing one GPU).
inline result<bool> can_access_peer(int device, int peer) {
  if (device == peer) return true;
  int yes = 0;
  CCLITE_TRY(cuda_status(cudaDeviceCanAccessPeer(&yes, device, peer), "cudaDeviceCanAccessPeer"));
  return yes != 0;
}

/// What connects `device` to `peer`, for the log: "the same GPU", "peer access
/// (P2P performance rank R, native atomics yes|no)" from
/// cudaDeviceGetP2PAttribute (rank 0 is the fastest link the driver knows; NVLink
/// is where native atomics are offered across GPUs), "no peer access", or why
/// it could not be told; then both PCI bus ids and the NVLinks between them as
/// NVML counts them (nvml.hpp: loaded at run time when the driver has it).
inline std::string describe_peer_link(int device, int peer) {
  if (device == peer) return "the same GPU";
  auto yes = can_access_peer(device, peer);
  if (!yes) return yes.error().message();
  std::string out = yes.value() ? "peer access" : "no peer access";
  int perf = -1, atomics = 0;
  if (yes.value() && cudaDeviceGetP2PAttribute(&perf, cudaDevP2PAttrPerformanceRank, device, peer) == cudaSuccess &&
      cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, peer) == cudaSuccess) {
    out += " (P2P performance rank " + std::to_string(perf) + ", native atomics " + (atomics ? "yes" : "no") + ")";
  }
  char a[32] = {}, b[32] = {};
  if (cudaDeviceGetPCIBusId(a, sizeof a, device) == cudaSuccess && cudaDeviceGetPCIBusId(b, sizeof b, peer) == cudaSuccess) {
    out += std::string("; PCI ") + a + " -> " + b + "; " + describe_nvlink(a, b);
  }
  (void)cudaGetLastError();  // the attribute queries' errors are not the caller's
  return out;
}

/// Every rank publishes `handle` under `key/<rank>` and gets all ranks' handles
/// (store_allgather with a clearer error): the one exchange the transport needs.
inline result<std::vector<std::string>> exchange_handles(store& kv, const std::string& key, int rank,
                                                         int size, const std::string& handle,
                                                         deadline until) {
  auto all = store_allgather(kv, key, rank, size, handle, until);
  if (!all) {
    return make_error(all.error().code(), "rank %d: exchanging CUDA IPC handles '%s': %s", rank,
                      key.c_str(), all.error().message().c_str());
  }
  return all;
}

}  // namespace cclite::cuda
