// tests/gpu/emulated_cudart.cpp - a host-memory stand-in for the part of the CUDA
// runtime that cclite's device engines call, so that their host-side logic runs
// on a machine without a GPU (device_comm_emulated in tests/gpu/gpu.cmake).
//
// Not a GPU: "device" memory is ordinary memory (memfd-backed, so that another
// process can map it through a CUDA IPC handle), the device reduction kernel is
// cclite's host kernel. So it runs the engines' chunking, offsets, call
// sequences, handle exchanges, collective agreements and destructors for real
// between processes, but says nothing about speed. One device, index 0.
//
// Two modes:
//  - in order (default): every copy, memset, kernel and host function runs at
//    once on the calling thread; streams and events only exist.
//  - asynchronous (CCLITE_EMULATED_ASYNC=1): every stream is a thread running
//    its operations in order, later than they were issued and after random
//    short delays; events count their records (in memory another process
//    maps, for CUDA IPC events); cudaStreamWaitEvent holds a stream until the
//    event's last record before the call has run. An engine that reads a result before
//    its stream produced it, or orders two streams wrongly, then sees wrong
//    bytes or a hang. As on a GPU: operations on the legacy default stream
//    (0) and cudaMemcpy wait for the blocking streams; a copy into pageable
//    host memory is done when the call returns, one from it stages the source
//    at the call and writes the destination in stream order; cudaFree,
//    cudaFreeHost and cudaDeviceSynchronize wait for every stream.
#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

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

bool async_mode() {
  static const bool on = std::getenv("CCLITE_EMULATED_ASYNC") != nullptr;
  return on;
}

// ---- events: two counters each, in an arena another process can map ----------

// Record n of an event has run when done[n % ring] == n. One event may be
// recorded on several streams, whose records then run in any order, and a wait
// is for the record before it, not for a later one (as in CUDA): hence one
// entry per record in flight, not a single "completed" count.
constexpr std::uint64_t ring = 64;
struct ev_state {
  std::atomic<std::uint64_t> recorded{0};  // records issued
  std::atomic<std::uint64_t> done[ring] = {};
};
constexpr std::size_t arena_events = 1 << 14;  // sparse: only pages of created events are touched
struct arena {
  int fd = -1;
  ev_state* ev = nullptr;
  std::atomic<std::size_t> next{0};
};
arena& own_arena() {
  static arena a;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::size_t bytes = arena_events * sizeof(ev_state);
    a.fd = memfd_create("cclite-emulated-events", 0);
    if (a.fd >= 0 && ftruncate(a.fd, static_cast<off_t>(bytes)) == 0) {
      void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
      if (m != MAP_FAILED) a.ev = static_cast<ev_state*>(m);
    }
  });
  return a;
}
struct event_st {
  ev_state* st = nullptr;
  std::uint32_t index = 0;
};
struct ev_handle {  // what crosses a process boundary in an event handle
  std::int32_t pid;
  std::int32_t fd;
  std::uint32_t index;
};
static_assert(sizeof(ev_handle) <= sizeof(cudaIpcEventHandle_t), "handle too small");

// Only ever raises an entry: with records on several streams, record n may
// complete after record n + 64 reused its entry, and lowering it would make a
// wait for n + 64 wait forever.
void mark_completed(ev_state* e, std::uint64_t n) {
  std::atomic<std::uint64_t>& d = e->done[n % ring];
  std::uint64_t cur = d.load();
  while (cur < n && !d.compare_exchange_weak(cur, n)) {
  }
}
// Record `target` has run (0: never recorded; a record 64 or more later reusing
// its entry means it ran long ago).
bool event_done(const ev_state* e, std::uint64_t target) { return target == 0 || e->done[target % ring].load() >= target; }
// A real device has no deadline here either, but in a test a wait that never
// ends is a bug in the engine under test (a record that is never issued): end
// the process with a message instead of hanging until ctest's timeout.
// CCLITE_EMULATED_WAIT_LIMIT in seconds, default 120.
void wait_event(const ev_state* e, std::uint64_t target) {
  static const double limit_s = [] {
    const char* v = std::getenv("CCLITE_EMULATED_WAIT_LIMIT");
    const double s = v ? std::atof(v) : 0;
    return s > 0 ? s : 120.0;
  }();
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (!event_done(e, target)) {
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "emulated CUDA runtime (pid %d): an event wait for record %llu (last done %llu) "
                   "did not end in %.0f s; aborting\n", static_cast<int>(getpid()),
                   static_cast<unsigned long long>(target),
                   static_cast<unsigned long long>(e->done[target % ring].load()), limit_s);
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// ---- streams: a thread each, operations in issue order -------------------------

struct stream_st {
  explicit stream_st(bool blocking_) : blocking(blocking_) {
    if (async_mode()) worker = std::thread([this] { run(); });
  }
  ~stream_st() {
    if (!worker.joinable()) return;
    drain();
    {
      std::lock_guard<std::mutex> g(m);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> g(m);
      q.push_back(std::move(op));
      ++pending;
    }
    cv.notify_all();
  }
  bool idle() {
    std::lock_guard<std::mutex> g(m);
    return pending == 0;
  }
  void drain() {
    std::unique_lock<std::mutex> g(m);
    cv.wait(g, [&] { return pending == 0; });
  }
  void run() {
    std::minstd_rand rng(static_cast<unsigned>(getpid()) * 7919u + static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(this)));
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> g(m);
        cv.wait(g, [&] { return stop || !q.empty(); });
        if (q.empty()) return;
        op = std::move(q.front());
        q.pop_front();
      }
      // Later than issued, by a different amount each time: what was issued
      // after this operation on another stream or the host often runs first.
      if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      op();
      {
        std::lock_guard<std::mutex> g(m);
        --pending;
      }
      cv.notify_all();
    }
  }
  const bool blocking;
  std::thread worker;
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> q;
  std::size_t pending = 0;
  bool stop = false;
};

std::mutex streams_mu;
std::set<stream_st*> streams;

// Waits for every stream (or every blocking one).
void drain_streams(bool blocking_only) {
  std::vector<stream_st*> all;
  {
    std::lock_guard<std::mutex> g(streams_mu);
    all.assign(streams.begin(), streams.end());
  }
  for (stream_st* s : all)
    if (!blocking_only || s->blocking) s->drain();
}

// The thread of `s` in asynchronous mode; null in order mode or for the
// legacy default stream.
stream_st* async_stream(cudaStream_t s) {
  if (!async_mode() || !s || s == cudaStreamLegacy || s == cudaStreamPerThread) return nullptr;
  return reinterpret_cast<stream_st*>(s);
}

// Runs `op` in stream order: at once in order mode or on the legacy default
// stream (after the blocking streams), else on the stream's thread.
void issue(cudaStream_t s, std::function<void()> op) {
  if (stream_st* st = async_stream(s)) return st->push(std::move(op));
  if (async_mode()) drain_streams(true);
  op();
}

bool pinned_or_device(const void* p) {
  std::lock_guard<std::mutex> g(mu);
  return find(p) != nullptr;
}

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
  if (async_mode()) drain_streams(false);
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
  if (async_mode()) drain_streams(false);
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
  if (async_mode()) drain_streams(true);  // the legacy default stream
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
// A copy of `rows` rows of `width` bytes, `spitch` / `dpitch` apart, in
// stream order, as CUDA runs it with pageable host memory: from it, the
// source is staged at the call and the copy into `dst` runs in stream order
// (so a later write to the source does not change it, and the destination is
// written late); into it, the call returns once the copy is done.
void issue_copy(cudaStream_t s, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  auto copy = [=](const void* from) {
    for (size_t r = 0; r < rows; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(from) + r * spitch, width);
  };
  if (!width || !rows) return;
  stream_st* st = async_stream(s);
  if (!st) return issue(s, [=] { copy(src); });
  if (!pinned_or_device(dst)) {  // into pageable memory: done on return
    st->drain();
    return copy(src);
  }
  if (!pinned_or_device(src)) {  // from pageable memory: staged now, copied later
    const size_t bytes = (rows - 1) * spitch + width;
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    return st->push([=] { copy(staged->data()); });
  }
  st->push([=] { copy(src); });
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
  issue_copy(s, dst, n, src, n, n, 1);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t s) {
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
  issue_copy(s, dst, dpitch, src, spitch, width, height);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
  issue(s, [=] { std::memset(p, v, n); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  auto* st = new stream_st((flags & cudaStreamNonBlocking) == 0);
  {
    std::lock_guard<std::mutex> g(streams_mu);
    streams.insert(st);
  }
  *s = reinterpret_cast<cudaStream_t>(st);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  auto* st = reinterpret_cast<stream_st*>(s);
  {
    std::lock_guard<std::mutex> g(streams_mu);
    streams.erase(st);
  }
  delete st;  // runs what is left first
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (!async_mode() || !s) return cudaSuccess;
  return reinterpret_cast<stream_st*>(s)->idle() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaDeviceSynchronize() {
  if (async_mode()) drain_streams(false);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!async_mode()) return cudaSuccess;
  if (!s) drain_streams(true);
  else reinterpret_cast<stream_st*>(s)->drain();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (!async_mode()) return cudaSuccess;
  ev_state* st = reinterpret_cast<event_st*>(e)->st;
  const std::uint64_t target = st->recorded.load();  // the last record issued before this call
  issue(s, [=] { wait_event(st, target); });
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  issue(s, [=] { fn(data); });  // in order mode everything before it has run already
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  arena& a = own_arena();
  const std::size_t i = a.next++;
  if (!a.ev || i >= arena_events) return fail(cudaErrorMemoryAllocation);
  *e = reinterpret_cast<cudaEvent_t>(new event_st{&a.ev[i], static_cast<std::uint32_t>(i)});
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<event_st*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  ev_state* st = reinterpret_cast<event_st*>(e)->st;
  const std::uint64_t n = ++st->recorded;
  issue(s, [=] { mark_completed(st, n); });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  const ev_state* st = reinterpret_cast<event_st*>(e)->st;
  return event_done(st, st->recorded.load()) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  const ev_state* st = reinterpret_cast<event_st*>(e)->st;
  wait_event(st, st->recorded.load());
  return cudaSuccess;
}

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
  if (async_mode()) drain_streams(false);
  std::lock_guard<std::mutex> g(mu);
  auto* r = find(p);
  if (!r || !r->second.mapped) return fail(cudaErrorInvalidValue);
  munmap(reinterpret_cast<void*>(r->first), r->second.bytes);
  regions.erase(r->first);
  return cudaSuccess;
}
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* h, cudaEvent_t e) {
  ev_handle x{static_cast<std::int32_t>(getpid()), own_arena().fd, reinterpret_cast<event_st*>(e)->index};
  std::memset(h, 0, sizeof *h);
  std::memcpy(h, &x, sizeof x);
  return cudaSuccess;
}
// The peer's event counters, in its arena (mapped once per process).
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* e, cudaIpcEventHandle_t h) {
  ev_handle x{};
  std::memcpy(&x, &h, sizeof x);
  static std::mutex arenas_mu;
  static std::map<std::int32_t, ev_state*> arenas;
  std::lock_guard<std::mutex> g(arenas_mu);
  ev_state*& base = arenas[x.pid];
  if (!base) {
    const std::string path = "/proc/" + std::to_string(x.pid) + "/fd/" + std::to_string(x.fd);
    const int fd = open(path.c_str(), O_RDWR);
    if (fd < 0) return fail(cudaErrorInvalidResourceHandle);
    void* m = mmap(nullptr, arena_events * sizeof(ev_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return fail(cudaErrorMapBufferObjectFailed);
    base = static_cast<ev_state*>(m);
  }
  if (x.index >= arena_events) return fail(cudaErrorInvalidResourceHandle);
  *e = reinterpret_cast<cudaEvent_t>(new event_st{&base[x.index], x.index});
  return cudaSuccess;
}

// The device reduction kernel's entry point (cuda/device_reduce.hpp), on the host:
// out = a op b, avg divided by avg_divisor at the last step as the kernel does.
cudaError_t cclite_cuda_device_reduce(void* out, const void* a, const void* b, std::size_t count, int t, int op,
                                      int avg_divisor, cudaStream_t s) {
  const cclite::reduction red = cclite::reduction_for(static_cast<cclite::dtype>(t), static_cast<cclite::reduce_op>(op));
  issue(s, [=] {
    if (out != a) std::memmove(out, a, count * red.elem_size);
    red.inplace(out, b, count);
    if (avg_divisor > 0 && red.needs_divide) red.divide(out, count, avg_divisor);
  });
  return cudaSuccess;
}

}  // extern "C"
