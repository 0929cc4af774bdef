// cclite/cuda/ipc_engine.hpp - device_communicator's native engine inside one node:
// the ranks' device staging buffers mapped into each other through CUDA IPC.
//
// Internal (cclite::cuda::detail): device_communicator checks the arguments,
// decides whether this path applies (ipc_ineligible_reason) and owns the engine.
//
// Set-up (collective over the CPU communicator, once): every rank cudaMallocs
// `slots` staging slots of `chunk_bytes` on its device and creates three
// interprocess events per slot (in, red, done); the memory and event handles
// go out in one allgather; every rank maps every peer's slots
// (cudaIpcOpenMemHandle: the same GPU, or another one with peer access over
// NVLink / PCIe) and opens its events. Any rank failing makes every rank fail
// (one allreduce of the outcome), so they all fall back together.
//
// A call is cut into chunks exactly as the staged engine cuts it
// (staged_chunk_elems), each chunk in the next slot. Everything runs on the
// caller's stream; the ranks order their streams with each other through the
// interprocess events, and a host barrier (on a communicator split off for the
// engine) makes sure an event has been recorded before a peer enqueues a wait on
// it. Per chunk, with S_q the slot of rank q:
//   free     wait for every peer's `done` of this slot's previous chunk
//   plan     ipc_plan.hpp's steps (type-free, checked on host memory by
//            tests/gpu/cuda_test.cpp): this rank's input into S_me, record `in`,
//            barrier, wait for the peers whose slots it reads; allreduce: reduce
//            segment `me` over every S_q into S_me in place (device kernels,
//            starting from S_me: each segment is reduced by one rank, so every
//            rank gets the same bits), record `red`, barrier, wait, copy every
//            segment out; the others read the root's or every slot directly
//   done     record `done` (a peer may refill its slot after this)
// Why the `free` wait cannot miss: a peer records `done` for chunk c before it
// enters chunk c + 1's first barrier, and this rank passes that barrier before
// it reuses the slot at chunk c + slots (slots >= 2).
//
// The host never waits for the GPU inside a call, only for the peers to reach
// the same chunk (one or two host barriers per chunk, a few microseconds each
// over shm). Every wait is bounded: the barriers by the CPU communicator's
// timeout, synchronize() by the same timeout. Any failure is kept and returned
// by every later call (the engine is then unusable).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <unistd.h>

#include <cclite/collective/op.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/device_reduce.hpp>
#include <cclite/cuda/ipc.hpp>
#include <cclite/cuda/ipc_plan.hpp>
#include <cclite/cuda/runtime.hpp>
#include <cclite/cuda/staged_engine.hpp>

namespace cclite::cuda::detail {

/// What this rank knows about whether the CUDA IPC path can run; every rank
/// decides alone, then they agree (device_communicator: one allreduce(min)).
struct ipc_facts {
  bool enabled = true;          ///< device_options::ipc and CCLITE_CUDA_IPC
  bool kernels_linked = true;   ///< device_reduce_linked()
  int local_size = 1;           ///< ranks on this node
  int size = 1;                 ///< ranks in the job
  bool peers_reachable = true;  ///< this rank's device can access every peer's device
  int slots = 2;
};

/// Empty when the IPC path applies on this rank, else why not (for the log).
inline std::string ipc_ineligible_reason(const ipc_facts& f) {
  if (!f.enabled) return "turned off (device_options::ipc / CCLITE_CUDA_IPC=0)";
  if (!f.kernels_linked) {
    return "the device reduction kernels are not linked into this program (link CMake's cclite::cuda, or "
           "add a .cu file including <cclite/cuda/device_reduce_entry.cuh>)";
  }
  if (f.size < 2) return "a single rank has no peer";
  if (f.local_size != f.size) return "the ranks are not all on one node";
  if (!f.peers_reachable) return "a peer's GPU cannot be reached from this one (no peer access)";
  if (f.slots < 2) return "it needs at least 2 staging slots";
  return {};
}

/// Whether an MPS control daemon serves this process's pipe directory
/// ($CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps); the runtime has no query
/// for it. What a daemon leaves there (H200, CUDA 13.0, docs/performance.md
/// "Session 15"): running, the `control` socket and nvidia-cuda-mps-control.pid
/// (its pid); after `quit`, `control` stays and the pid file is gone; after a
/// kill -9, both stay. So: no `control`, or no pid file, is "absent"; a pid
/// file whose process is not alive here is a crashed daemon, "absent". A pid
/// alive here (or one this process may not signal) is "present"; so is a
/// daemon in another pid namespace whose pid happens to exist here.
inline bool mps_daemon_present() {
  const char* env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string dir = env && *env ? env : "/tmp/nvidia-mps";
  if (::access((dir + "/control").c_str(), F_OK) != 0) return false;
  std::FILE* f = std::fopen((dir + "/nvidia-cuda-mps-control.pid").c_str(), "r");
  if (!f) return false;  // quit cleanly: the socket file outlives it
  long pid = 0;
  const bool read = std::fscanf(f, "%ld", &pid) == 1;
  std::fclose(f);
  if (!read || pid <= 0) return true;  // unreadable: the old answer, the socket is there
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

/// The auto value of device_options::ipc_min_bytes. Processes that share a GPU
/// without MPS have a context each, and the GPU time-slices between them: every
/// cross-process event wait of the IPC path then costs a context switch. On an
/// H200 (2026-12-04, docs/performance.md "Session 14") a call took ~300 us
/// over CUDA IPC at any size up to 1 MiB, against 50-250 us staged below
/// 256 KiB; from 1 MiB the IPC path was faster (321 against 361-802 us), and
/// the 2-rank trainer sample took 12.6 s per epoch over CUDA IPC, 1.0 s staged.
/// Under MPS, or on a GPU each, the IPC path is the fast one at every size.
inline std::int64_t auto_ipc_min_bytes(bool shares_gpu, bool mps) noexcept {
  return shares_gpu && !mps ? std::int64_t{1} << 20 : 0;
}

template <class Comm>
class ipc_engine {
 public:
  /// Collective over `host`: splits the engine's communicator off it,
  /// allocates and exports this rank's slots and events on the current device,
  /// maps the peers'. Every rank calls it, and every rank fails if one does:
  /// errc::unsupported, unless the CPU communicator itself failed.
  static result<std::unique_ptr<ipc_engine>> create(Comm& host, const native_config& c) {
    std::unique_ptr<ipc_engine> e(new ipc_engine(c));
    auto chan = host.split(0, host.rank());  // same ranks, same order
    if (!chan) return chan.error();
    e->chan_ = std::move(chan.value());
    // Local set-up first; its outcome travels with the handles so no rank is
    // left waiting in a collective the others skipped.
    status local = e->allocate();
    std::string mine = local.ok() ? e->export_handles() : std::string();
    if (local.ok() && mine.empty()) local = e->failure();
    const std::size_t blob = handle_bytes(e->slots());
    mine.resize(blob, '\0');
    std::vector<char> all(blob * static_cast<std::size_t>(e->size()));
    CCLITE_TRY(e->chan_->allgather(mine.data(), all.data(), blob, dtype::uint8));
    if (local.ok()) local = e->open_peers(all, blob);
    std::int64_t ok = local.ok() ? 1 : 0;
    CCLITE_TRY(e->chan_->allreduce(&ok, &ok, 1, dtype::int64, reduce_op::min));
    // Local failures as `unsupported` (the caller falls back); the CPU
    // communicator's own failures above keep their codes.
    if (!local.ok()) {
      return make_error(errc::unsupported, "device_communicator rank %d: CUDA IPC set-up: %s", e->rank(),
                        local.to_string().c_str());
    }
    if (ok == 0) {
      return make_error(errc::unsupported, "device_communicator rank %d: CUDA IPC set-up failed on another rank",
                        e->rank());
    }
    e->ready_ = true;
    return result<std::unique_ptr<ipc_engine>>(std::move(e));
  }

  ipc_engine(const ipc_engine&) = delete;
  ipc_engine& operator=(const ipc_engine&) = delete;

  /// Collective, like create(): before this rank's slots are freed, every rank
  /// has enqueued its last read of them (a barrier) and those reads have run
  /// (each peer's last `done` of every slot), so no peer reads freed memory.
  /// Both waits are bounded by the timeout; after a failure, neither is made.
  ~ipc_engine() {
    if (!ready_ || !failure().ok()) return;
    if (!chan_->barrier().ok()) return;
    const deadline until = deadline::after(cfg_.timeout);
    for (int q = 0; q < size(); ++q) {
      for (std::size_t s = 0; q != rank() && s < used_.size(); ++s) {
        if (!used_[s]) continue;
        while (cudaEventQuery(peer_event(q, ipc_done, s)) == cudaErrorNotReady && !until.expired()) {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
  }

  int rank() const noexcept { return chan_->rank(); }
  int size() const noexcept { return chan_->size(); }
  int slots() const noexcept { return cfg_.slots; }

  /// Enqueues collective `k` on `stream` chunk by chunk (see the file comment)
  /// and returns. The arguments must have been checked (device_communicator does).
  status enqueue(collective_kind k, const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                 int root, cudaStream_t stream, const v_args& va = {}) {
    CCLITE_TRY(failure());
    auto per = staged_chunk_elems(k, t, size(), cfg_.chunk_bytes);
    if (!per) return per.error();
    if (is_v(k)) {  // the number of chunks: every rank's largest block (chan_: this thread's only)
      auto m = v_largest_block(k, va, size(), chan_.get());
      if (!m) return fail(m.error());
      count = m.value();
    }
    if (count == 0) return status();
    ipc_call call;
    describe_call(call, k, rank(), size(), root, count, t, per.value(), va);
    call.own_block_in_place = own_block_in_place(k, send, recv, count * call.elem, rank(), root);
    if (k == collective_kind::allgatherv) {
      call.own_block_in_place = send == static_cast<const unsigned char*>(recv) + va.displs[rank()] * call.elem;
    }
    const char* name = to_string(k);
    // Runs the plan's steps (ipc_plan.hpp) on `stream`; the first error is kept.
    struct runner {
      ipc_engine& e;
      cudaStream_t stream;
      const char* name;
      const unsigned char* send;
      unsigned char* recv;
      dtype t;
      reduce_op op;
      std::size_t slot = 0;
      status st;
      bool check(cudaError_t err, const char* what) {
        if (err == cudaSuccess) return true;
        st = e.fail(cuda_status(err, (std::string("device ") + name + " (CUDA IPC): " + what).c_str()));
        return false;
      }
      void copy(void* to, const void* from, std::size_t bytes) {
        if (st.ok()) check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      }
      void copy_in(std::size_t slot_off, std::size_t send_off, std::size_t bytes) {
        copy(e.stage(e.rank(), slot) + slot_off, send + send_off, bytes);
      }
      void copy_out(std::size_t recv_off, int from, std::size_t slot_off, std::size_t bytes) {
        copy(recv + recv_off, e.stage(from, slot) + slot_off, bytes);
      }
      void reduce(bool to_slot, std::size_t out_off, std::size_t slot_off, std::size_t elems, int first) {
        unsigned char* out = (to_slot ? e.stage(e.rank(), slot) : recv) + out_off;
        const int n = e.size();
        for (int j = 1; j < n && st.ok(); ++j) {
          const unsigned char* a = j == 1 ? e.stage(first, slot) + slot_off : out;
          const unsigned char* b = e.stage((first + j) % n, slot) + slot_off;
          check(device_reduce(out, a, b, elems, t, op, j == n - 1 ? n : 0, stream), "reduction kernel");
        }
      }
      void exchange(ipc_event_kind ev, int from) {
        if (!st.ok() || !check(cudaEventRecord(e.own_event(ev, slot), stream), "cudaEventRecord")) return;
        status b = e.chan_->barrier();
        if (!b.ok()) {
          st = e.fail(status(b.code(), std::string("device ") + name + " (CUDA IPC): " + b.message()));
          return;
        }
        for (int q = 0; q < e.size() && st.ok(); ++q) {
          if (q == e.rank() || from == -2 || (from >= 0 && q != from)) continue;
          check(cudaStreamWaitEvent(stream, e.peer_event(q, ev, slot), 0), "cudaStreamWaitEvent");
        }
      }
    } run{*this, stream, name, static_cast<const unsigned char*>(send), static_cast<unsigned char*>(recv), t, op, 0, {}};

    for (std::size_t c = 0; c < call.chunks() && run.st.ok(); ++c) {
      const std::size_t s = next_slot_++ % static_cast<std::size_t>(slots());
      run.slot = s;
      // free: the peers have read this slot's previous contents.
      for (int q = 0; used_[s] && q < size() && run.st.ok(); ++q) {
        if (q != rank()) run.check(cudaStreamWaitEvent(stream, peer_event(q, ipc_done, s), 0), "cudaStreamWaitEvent");
      }
      used_[s] = true;
      ipc_chunk_plan(call, c, run);
      if (run.st.ok()) run.check(cudaEventRecord(own_event(ipc_done, s), stream), "cudaEventRecord");
    }
    return run.st;
  }

  /// Waits until everything enqueued on `stream` has run (bounded by the
  /// timeout), then reports the first failure.
  status synchronize(cudaStream_t stream) {
    CCLITE_TRY(failure());
    status s = wait_stream(stream, cfg_.timeout, rank(), [this] { return failure(); });
    return s.ok() ? status() : fail(std::move(s));
  }

  /// The first failure seen, ok if none.
  status failure() const { return failed_; }

 private:
  static constexpr int events_per_slot = 3;  // ipc_in, ipc_red, ipc_done

  // One rank's blob in the set-up allgather: the memory handle, then the
  // events' handles slot by slot.
  static std::size_t handle_bytes(int slots) {
    return sizeof(cudaIpcMemHandle_t) +
           static_cast<std::size_t>(slots) * events_per_slot * sizeof(cudaIpcEventHandle_t);
  }

  explicit ipc_engine(const native_config& c) : cfg_(c) {}

  status fail(status s) {
    if (failed_.ok()) failed_ = s;
    return s;
  }

  unsigned char* stage(int q, std::size_t slot) const {
    auto* base = q == rank() ? own_.as<unsigned char>() : static_cast<unsigned char*>(mapped_[q].data());
    return base + slot * cfg_.chunk_bytes;
  }
  cudaEvent_t own_event(ipc_event_kind k, std::size_t slot) const {
    return own_events_[slot * events_per_slot + k].get();
  }
  cudaEvent_t peer_event(int q, ipc_event_kind k, std::size_t slot) const {
    return peer_events_[static_cast<std::size_t>(q)][slot * events_per_slot + k].get();
  }

  status allocate() {
    if (cfg_.slots < 2) return make_error(errc::invalid_argument, "CUDA IPC path: needs at least 2 slots");
    auto b = device_buffer::allocate(cfg_.chunk_bytes * static_cast<std::size_t>(cfg_.slots));
    if (!b) return b.error();
    own_ = std::move(b.value());
    used_.assign(static_cast<std::size_t>(cfg_.slots), false);
    for (int i = 0; i < cfg_.slots * events_per_slot; ++i) {
      auto ev = ipc_event::create();
      if (!ev) return ev.error();
      own_events_.push_back(std::move(ev.value()));
    }
    return status();
  }

  // This rank's blob (empty on failure, kept in failed_).
  std::string export_handles() {
    auto mem = export_memory(own_.data());
    if (!mem) {
      (void)fail(mem.error());
      return {};
    }
    std::string blob = mem.value();
    for (auto& ev : own_events_) {
      auto h = ev.handle();
      if (!h) {
        (void)fail(h.error());
        return {};
      }
      blob += h.value();
    }
    return blob;
  }

  status open_peers(const std::vector<char>& all, std::size_t blob) {
    const std::size_t n = static_cast<std::size_t>(size());
    mapped_.resize(n);
    peer_events_.resize(n);
    for (std::size_t q = 0; q < n; ++q) {
      if (static_cast<int>(q) == rank()) continue;
      const char* p = all.data() + q * blob;
      auto m = ipc_mapping::open(std::string(p, sizeof(cudaIpcMemHandle_t)));
      if (!m) {
        return make_error(m.error().code(), "rank %d: mapping rank %zu's staging memory: %s", rank(), q,
                          m.error().message().c_str());
      }
      mapped_[q] = std::move(m.value());
      p += sizeof(cudaIpcMemHandle_t);
      for (int i = 0; i < cfg_.slots * events_per_slot; ++i, p += sizeof(cudaIpcEventHandle_t)) {
        auto ev = ipc_event::open(std::string(p, sizeof(cudaIpcEventHandle_t)));
        if (!ev) {
          return make_error(ev.error().code(), "rank %d: opening rank %zu's CUDA IPC event: %s", rank(), q,
                            ev.error().message().c_str());
        }
        peer_events_[q].push_back(std::move(ev.value()));
      }
    }
    return status();
  }

  native_config cfg_;
  std::unique_ptr<Comm> chan_;
  device_buffer own_;                                ///< this rank's slots
  std::vector<ipc_event> own_events_;                ///< in, red, done per slot
  std::vector<ipc_mapping> mapped_;                  ///< the peers' slots (empty at this rank's index)
  std::vector<std::vector<ipc_event>> peer_events_;  ///< the peers' events, opened
  std::vector<bool> used_;                           ///< slot used since set-up (its `done` was recorded)
  std::size_t next_slot_ = 0;
  bool ready_ = false;                               ///< create() succeeded on every rank
  status failed_;
};

}  // namespace cclite::cuda::detail
