// cclite/cuda/runtime.hpp - the CUDA runtime seen through cclite's errors.
//
// What every GPU part of cclite needs first: is there a device, is this pointer
// device memory, and CUDA errors turned into `status` values with the runtime's
// own text (cudaGetErrorName / cudaGetErrorString) and a hint a user can act on.
// Host code only: includes <cuda_runtime_api.h>, compiles with g++/clang++ as
// well as nvcc, and needs libcudart at link time (target cclite::cuda).
//
// No device is an ordinary answer, not a crash: on a machine without a GPU or
// without the NVIDIA driver, `device_count()` returns errc::unsupported saying
// "no CUDA device" and why (the runtime reports a missing driver as
// cudaErrorInsufficientDriver, a hidden GPU as cudaErrorNoDevice), and the CPU
// transports work on in the same process.
//
// fork(): a process that has made CUDA calls must not make CUDA calls in a
// forked child (the CUDA runtime does not survive fork). Make the first CUDA
// call after forking, as cclite-run's one process per GPU does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include <cclite/core/status.hpp>

namespace cclite::cuda {

namespace detail {
/// True for the errors that mean "this process sees no usable GPU".
inline bool is_no_device_error(cudaError_t e) noexcept {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
         e == cudaErrorInvalidDevice || e == cudaErrorDevicesUnavailable ||
         e == cudaErrorSystemDriverMismatch || e == cudaErrorCompatNotSupportedOnDevice ||
         e == cudaErrorSystemNotReady;
}
}  // namespace detail

/// `what: cudaErrorX: <runtime text>` as a status; cudaSuccess gives ok.
/// The code says how to recover: no device -> unsupported, out of memory ->
/// resource_exhausted, a bad argument -> invalid_argument, anything else
/// (a sticky kernel fault, a lost device) -> system_error.
/// The runtime's last-error slot is cleared, so a non-sticky error does not
/// resurface from an unrelated later call.
inline status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return status();
  (void)cudaGetLastError();
  const char* name = cudaGetErrorName(e);
  const char* text = cudaGetErrorString(e);
  if (detail::is_no_device_error(e)) {
    return make_error(errc::unsupported,
                      "%s: no CUDA device (%s: %s); check that the NVIDIA driver is loaded "
                      "(nvidia-smi) and CUDA_VISIBLE_DEVICES",
                      what, name, text);
  }
  errc code = errc::system_error;
  if (e == cudaErrorMemoryAllocation) code = errc::resource_exhausted;
  if (e == cudaErrorInvalidValue || e == cudaErrorInvalidDevicePointer ||
      e == cudaErrorInvalidResourceHandle || e == cudaErrorInvalidMemcpyDirection) {
    code = errc::invalid_argument;
  }
  return make_error(code, "%s: %s: %s", what, name, text);
}

/// Number of CUDA devices this process sees (at least 1), or errc::unsupported
/// "no CUDA device ..." naming the runtime's reason.
inline result<int> device_count() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cuda_status(e, "cudaGetDeviceCount");
  if (n <= 0) {
    return make_error(errc::unsupported,
                      "cudaGetDeviceCount: no CUDA device (the driver reports 0 GPUs); check "
                      "nvidia-smi and CUDA_VISIBLE_DEVICES");
  }
  return n;
}

/// True when at least one CUDA device is usable. Never fails.
inline bool available() noexcept { return device_count().ok(); }

/// Makes `device` current for the calling thread; an out-of-range index is
/// invalid_argument naming the count.
inline status set_device(int device) {
  auto n = device_count();
  if (!n) return n.error();
  if (device < 0 || device >= n.value()) {
    return make_error(errc::invalid_argument, "CUDA device %d does not exist (this process sees %d)",
                      device, n.value());
  }
  return cuda_status(cudaSetDevice(device), "cudaSetDevice");
}

/// Where a pointer's memory lives, as far as CUDA knows.
enum class memory_kind {
  host,         ///< ordinary host memory CUDA does not know (malloc, stack, mmap)
  pinned_host,  ///< page-locked host memory (cudaMallocHost / cudaHostRegister)
  device,       ///< device memory (cudaMalloc)
  managed,      ///< unified memory (cudaMallocManaged)
};

inline const char* to_string(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::host: return "host";
    case memory_kind::pinned_host: return "pinned_host";
    case memory_kind::device: return "device";
    case memory_kind::managed: return "managed";
  }
  return "?";
}

/// A pointer's memory kind and, for device / managed / pinned memory, its device.
struct pointer_info {
  memory_kind kind = memory_kind::host;
  int device = -1;
};

/// Classifies `p` with cudaPointerGetAttributes. Without a usable device or
/// driver nothing can be device memory, so every pointer is host memory (no
/// error): a CPU-only caller may ask freely. Null is host.
inline pointer_info query_pointer(const void* p) noexcept {
  pointer_info info;
  if (p == nullptr) return info;
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; keep it from surfacing elsewhere
    return info;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice: info.kind = memory_kind::device; break;
    case cudaMemoryTypeManaged: info.kind = memory_kind::managed; break;
    case cudaMemoryTypeHost: info.kind = memory_kind::pinned_host; break;
    default: info.kind = memory_kind::host; break;
  }
  if (info.kind != memory_kind::host) info.device = a.device;
  return info;
}

/// True when kernels on a device can read `p` directly: device or managed memory.
inline bool is_device_pointer(const void* p) noexcept {
  const memory_kind k = query_pointer(p).kind;
  return k == memory_kind::device || k == memory_kind::managed;
}

/// Device memory owned by the object (cudaMalloc / cudaFree). Move-only.
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  /// `bytes` of device memory on the current device; errc::unsupported without a
  /// device, errc::resource_exhausted when the device is full.
  static result<device_buffer> allocate(std::size_t bytes) {
    device_buffer b;
    if (bytes == 0) return result<device_buffer>(std::move(b));
    CCLITE_TRY(cuda_status(cudaMalloc(&b.p_, bytes), "cudaMalloc"));
    b.n_ = bytes;
    // Spelled out: nvcc's C++17 front end does not move into result's constructor.
    return result<device_buffer>(std::move(b));
  }

  void* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  template <class T>
  T* as() const noexcept { return static_cast<T*>(p_); }

  void reset() noexcept {
    if (p_) (void)cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

/// A CUDA stream owned by the object (non-blocking with respect to the legacy
/// default stream, so cclite's work never serialises with unrelated work). Move-only.
class stream {
 public:
  stream() = default;
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { reset(); }

  /// A new stream on the current device. cudaStreamNonBlocking (the default)
  /// runs independently of the legacy default stream; cudaStreamDefault waits
  /// for the legacy stream's earlier work, e.g. the DMA that a cudaMemcpy from
  /// pageable memory may still have in flight when it returns.
  static result<stream> create(unsigned flags = cudaStreamNonBlocking) {
    stream s;
    CCLITE_TRY(cuda_status(cudaStreamCreateWithFlags(&s.s_, flags), "cudaStreamCreateWithFlags"));
    return result<stream>(std::move(s));
  }

  cudaStream_t get() const noexcept { return s_; }

  void reset() noexcept {
    if (s_) (void)cudaStreamDestroy(s_);
    s_ = nullptr;
  }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace cclite::cuda
