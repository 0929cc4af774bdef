// tests/gpu/emulated_cudart.cpp - a host-memory stand-in for the part of the CUDA
// runtime that cclite's device engines call, so that their host-side logic runs
// on a machine without a GPU (device_comm_emulated in tests/gpu/gpu.cmake).
//
// Not a GPU: "device" memory is ordinary memory (memfd-backed, so that another
// process can map it through a CUDA IPC handle), every copy, memset and host
// function runs at once on the calling thread, streams and events only exist
// (a record is complete at once, a wait has nothing to wait for), the device
// reduction kernel is cclite's host kernel. So it runs the engines' chunking,
// offsets, call sequences, handle exchanges, collective agreements and
// destructors for real between processes, but says nothing about stream
// ordering on a GPU (everything is in order here) or speed. One device, index 0.
#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include <cclite/core/reduce.hpp>

namespace {

struct region {
  std::size_t bytes = 0;
  int fd = -1;           // memfd of a cudaMalloc'd region, -1 otherwise
  cudaMemoryType type = cudaMemoryTypeDevice;
  bool mapped = false;   // opened from another process's handle
};
std::mutex mu;
std::map<std::uintptr_t, region> regions;  // by start address
cudaError_t last = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  last = e;
  return e;
}

// The region holding p (start, region), or null.
const std::pair<const std::uintptr_t, region>* find(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = regions.upper_bound(a);
  if (it == regions.begin()) return nullptr;
  --it;
  return a < it->first + it->second.bytes ? &*it : nullptr;
}

// What crosses a process boundary in a memory handle.
struct mem_handle {
  std::int32_t pid;
  std::int32_t fd;
  std::uint64_t bytes;
  std::uint64_t offset;
};
static_assert(sizeof(mem_handle) <= sizeof(cudaIpcMemHandle_t), "handle too small");

struct event_st {
  int unused = 0;
};
struct stream_st {
  int unused = 0;
};

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int) {
  *v = attr == cudaDevAttrMaxPitch ? (1 << 30) : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int* yes, int, int) {
  *yes = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetP2PAttribute(int* v, cudaDeviceP2PAttr, int, int) {
  *v = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int) {
  std::snprintf(id, static_cast<std::size_t>(len), "0000:00:00.0");
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = last;
  last = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA runtime error"; }

cudaError_t cudaMalloc(void** p, size_t bytes) {
  const int fd = memfd_create("cclite-emulated-device", 0);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(std::max<size_t>(bytes, 1))) != 0) return fail(cudaErrorMemoryAllocation);
  void* m = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(mu);
  regions[reinterpret_cast<std::uintptr_t>(m)] = region{std::max<size_t>(bytes, 1), fd, cudaMemoryTypeDevice, false};
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  std::lock_guard<std::mutex> g(mu);
  auto it = regions.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == regions.end()) return fail(cudaErrorInvalidValue);
  munmap(p, it->second.bytes);
  if (it->second.fd >= 0) close(it->second.fd);
  regions.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  // A process that runs out of pinned memory (device_comm_gpu's set-up failure case).
  if (std::getenv("CCLITE_EMULATED_FAIL_PINNED")) {
    *p = nullptr;
    return fail(cudaErrorMemoryAllocation);
  }
  *p = ::operator new(std::max<size_t>(bytes, 1));
  std::lock_guard<std::mutex> g(mu);
  regions[reinterpret_cast<std::uintptr_t>(*p)] = region{std::max<size_t>(bytes, 1), -1, cudaMemoryTypeHost, false};
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  std::lock_guard<std::mutex> g(mu);
  regions.erase(reinterpret_cast<std::uintptr_t>(p));
  ::operator delete(p);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::lock_guard<std::mutex> g(mu);
  *a = cudaPointerAttributes{};
  a->type = cudaMemoryTypeUnregistered;
  if (auto* r = find(p)) {
    a->type = r->second.type;
    a->device = 0;
    a->devicePointer = r->second.type == cudaMemoryTypeDevice ? const_cast<void*>(p) : nullptr;
    a->hostPointer = r->second.type == cudaMemoryTypeHost ? const_cast<void*>(p) : nullptr;
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind k, cudaStream_t) {
  return cudaMemcpy(dst, src, n, k);
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t) {
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new stream_st);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<stream_st*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  fn(data);  // everything before it on the stream has run already
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new event_st);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<event_st*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  std::lock_guard<std::mutex> g(mu);
  auto* r = find(p);
  if (!r || r->second.fd < 0) return fail(cudaErrorInvalidValue);
  mem_handle m{static_cast<std::int32_t>(getpid()), r->second.fd, r->second.bytes,
               reinterpret_cast<std::uintptr_t>(p) - r->first};
  std::memset(h, 0, sizeof *h);
  std::memcpy(h, &m, sizeof m);
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned int) {
  mem_handle m{};
  std::memcpy(&m, &h, sizeof m);
  const std::string path = "/proc/" + std::to_string(m.pid) + "/fd/" + std::to_string(m.fd);
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) return fail(cudaErrorInvalidResourceHandle);
  void* base = mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return fail(cudaErrorMapBufferObjectFailed);
  std::lock_guard<std::mutex> g(mu);
  regions[reinterpret_cast<std::uintptr_t>(base)] = region{m.bytes, -1, cudaMemoryTypeDevice, true};
  *p = static_cast<char*>(base) + m.offset;
  return cudaSuccess;
}
cudaError_t cudaIpcCloseMemHandle(void* p) {
  std::lock_guard<std::mutex> g(mu);
  auto* r = find(p);
  if (!r || !r->second.mapped) return fail(cudaErrorInvalidValue);
  munmap(reinterpret_cast<void*>(r->first), r->second.bytes);
  regions.erase(r->first);
  return cudaSuccess;
}
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* h, cudaEvent_t) {
  std::memset(h, 0x11, sizeof *h);
  return cudaSuccess;
}
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* e, cudaIpcEventHandle_t) {
  *e = reinterpret_cast<cudaEvent_t>(new event_st);
  return cudaSuccess;
}

// The device reduction kernel's entry point (cuda/device_reduce.hpp), on the host:
// out = a op b, avg divided by avg_divisor at the last step as the kernel does.
cudaError_t cclite_cuda_device_reduce(void* out, const void* a, const void* b, std::size_t count, int t, int op,
                                      int avg_divisor, cudaStream_t) {
  const cclite::reduction red = cclite::reduction_for(static_cast<cclite::dtype>(t), static_cast<cclite::reduce_op>(op));
  if (out != a) std::memmove(out, a, count * red.elem_size);
  red.inplace(out, b, count);
  if (avg_divisor > 0 && red.needs_divide) red.divide(out, count, avg_divisor);
  return cudaSuccess;
}

}  // extern "C"
