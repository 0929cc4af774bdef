// cclite/cuda/native_engine.hpp - device_communicator's own engine: CUDA IPC inside
// a node, else host staging, chosen once for every rank together.
//
// Internal (cclite::cuda::detail): device_communicator checks the arguments and
// owns the engine. create() is collective: every rank finds out whether the
// CUDA IPC path applies to it (ipc_ineligible_reason: on, kernels linked, one
// node, every peer's GPU reachable), they agree with one allreduce(min), and
// either all map each other's slots (ipc_engine.hpp) or all stage through
// pinned host memory (staged_engine.hpp); a set-up failure on any rank sends
// all of them to staging, and one on the staged path fails create() on all
// of them. The staged path exists either way: with IPC it
// carries send / recv / sendrecv, since point to point has no barrier to order
// the IPC slots by (pinned memory: slots x chunk_bytes, 16 MiB by default).
// Ranks that share a GPU with no MPS daemon send their collectives under 1 MiB
// there too (device_options::ipc_min_bytes; ipc_engine.hpp's auto_ipc_min_bytes).
// CCLITE_DEBUG=INFO logs the choice, why, and every peer link (ipc.hpp's
// describe_peer_link: peer access, P2P rank, PCI ids, NVLinks per NVML).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cclite/core/clock.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/device_call.hpp>
#include <cclite/cuda/device_reduce.hpp>
#include <cclite/cuda/ipc.hpp>
#include <cclite/cuda/ipc_engine.hpp>
#include <cclite/cuda/staged_engine.hpp>

namespace cclite::cuda::detail {

template <class Comm>
class native_engine {
 public:
  /// Collective over `host`; `dev` is this rank's (current) device. Errors:
  /// the CPU communicator's, or the staged path's set-up (pinned memory) on
  /// any rank: every rank fails then, the others naming the first that did.
  static result<std::unique_ptr<native_engine>> create(Comm& host, int dev, const device_options& o,
                                                       milliseconds timeout) {
    std::unique_ptr<native_engine> e(new native_engine(host, dev, o, timeout));
    CCLITE_TRY(e->try_ipc());
    native_config c;
    c.chunk_bytes = o.chunk_bytes;
    c.slots = o.slots;
    c.max_pending_chunks = o.max_pending_chunks;
    c.timeout = timeout;
    auto st = staged_engine<Comm>::create(host, c);
    // Every rank learns whether all got their staging memory: a rank failing
    // alone would leave the others to find out in their first call, and its IPC
    // path's destructor waiting for them, each until the timeout. The lowest
    // failed rank is named (size: none).
    std::int64_t first_failed = st ? host.size() : host.rank();
    const status agreed = host.allreduce(&first_failed, &first_failed, 1, dtype::int64, reduce_op::min);
    if (!st) return st.error();
    CCLITE_TRY(agreed);
    if (first_failed < host.size()) {
      return make_error(errc::resource_exhausted,
                        "device_communicator: rank %lld could not set up the native engine's staging path "
                        "(pinned host memory: %d x %zu B; its own error says why)",
                        static_cast<long long>(first_failed), c.slots, c.chunk_bytes);
    }
    e->staged_ = std::move(st.value());
    return result<std::unique_ptr<native_engine>>(std::move(e));
  }

  /// "ipc" or "staged": the path of the collectives.
  const char* path() const noexcept { return ipc_ ? "ipc" : "staged"; }
  /// With CUDA IPC: collectives of fewer bytes per rank stage instead; else 0.
  std::int64_t ipc_min_bytes() const noexcept { return ipc_ ? ipc_min_bytes_ : 0; }

  /// Hands a checked call to its path: point to point always to the staged
  /// one, and so do collectives under ipc_min_bytes() (never the v-variants,
  /// whose sizes differ between ranks: every rank must choose the same path).
  /// `va`: the v-variants' arrays, sendrecv's receive side.
  status enqueue(collective_kind k, const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                 int root, cudaStream_t stream, const v_args& va) {
    const bool p2p = k == collective_kind::send || k == collective_kind::recv || k == collective_kind::sendrecv;
    const bool small = !is_v(k) && count * size_of(t) < static_cast<std::uint64_t>(ipc_min_bytes_);
    if (ipc_ && !p2p && !small) return ipc_->enqueue(k, send, recv, count, t, op, root, stream, va);
    return staged_->enqueue(k, send, recv, count, t, op, root, stream, va);
  }

  /// Waits until everything enqueued on `stream` has run (bounded by the
  /// timeout), then reports the first failure of either path.
  status synchronize(cudaStream_t stream) {
    if (!ipc_) return staged_->synchronize(stream);
    CCLITE_TRY(ipc_->synchronize(stream));  // waits for the send / recv on `stream` too
    return staged_->failure();
  }

  /// The first failure seen, ok if none.
  status failure() const {
    status s = ipc_ ? ipc_->failure() : status();
    return !s.ok() || !staged_ ? s : staged_->failure();
  }

 private:
  native_engine(Comm& host, int dev, const device_options& o, milliseconds timeout)
      : host_(&host), device_(dev), opts_(o), timeout_(timeout) {}

  int rank() const noexcept { return host_->rank(); }
  int size() const noexcept { return host_->size(); }

  // The native engine's CUDA IPC path, when every rank can take it (they agree
  // first; a set-up failure anywhere sends every rank to the staged path).
  // Errors only when the CPU communicator fails (a malformed CCLITE_CUDA_IPC
  // turns the path off with a warning: returning here, before the collectives
  // below, would leave the other ranks waiting in them).
  status try_ipc() {
    auto on = env::get_bool("CUDA_IPC", true, false);
    if (!on) CCLITE_WARN(host_->log(), "device_communicator: CUDA IPC path off: %s", on.error().message().c_str());
    ipc_facts f;
    f.enabled = opts_.ipc && on && on.value();
    f.kernels_linked = device_reduce_linked();
    f.local_size = host_->local_size();
    f.size = size();
    f.slots = opts_.slots;
    // Every rank's device, to check peer access (the same GPU always works),
    // and its PCI id, to see which ranks share a GPU (device numbers depend on
    // CUDA_VISIBLE_DEVICES).
    const std::int64_t mine[2] = {device_, pci_key(device_)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size()));
    CCLITE_TRY(host_->allgather(mine, all.data(), 2, dtype::int64));
    bool shares_gpu = false;
    for (std::size_t q = 0; q < static_cast<std::size_t>(size()); ++q) {
      const int d = static_cast<int>(all[2 * q]);
      auto yes = can_access_peer(device_, d);
      f.peers_reachable = f.peers_reachable && yes.ok() && yes.value();
      if (static_cast<int>(q) != rank()) {
        shares_gpu = shares_gpu || (mine[1] >= 0 && all[2 * q + 1] == mine[1]);
        CCLITE_INFO(host_->log(), "device_communicator: GPU %d -> rank %zu's GPU %d: %s", device_, q, d,
                    describe_peer_link(device_, d).c_str());
      }
    }
    CCLITE_TRY(agree_on_ipc_min_bytes(shares_gpu));
    std::string why = ipc_ineligible_reason(f);
    std::int64_t all_ok = why.empty() ? 1 : 0;
    CCLITE_TRY(host_->allreduce(&all_ok, &all_ok, 1, dtype::int64, reduce_op::min));
    if (all_ok == 1) {
      native_config c;
      c.chunk_bytes = opts_.ipc_chunk_bytes;
      c.slots = opts_.slots;
      c.timeout = timeout_;
      auto e = ipc_engine<Comm>::create(*host_, c);
      if (e) {
        ipc_ = std::move(e.value());
        CCLITE_INFO(host_->log(),
                    "device_communicator: native engine over CUDA IPC (device %d, %d ranks, %d x %zu B slots; "
                    "collectives under %lld B per rank staged%s)",
                    device_, size(), opts_.slots, opts_.ipc_chunk_bytes, static_cast<long long>(ipc_min_bytes_),
                    shares_gpu_without_mps_ ? ": ranks share a GPU and no MPS daemon serves them, see "
                                              "device_options::ipc_min_bytes"
                                            : "");
        return status();
      }
      if (e.error().code() != errc::unsupported) return e.error();  // the CPU communicator failed
      why = "set-up failed: " + e.error().message();
      CCLITE_WARN(host_->log(), "device_communicator: CUDA IPC path not taken, staging through host memory: %s",
                  why.c_str());
      return status();
    }
    if (why.empty()) why = "another rank cannot take it";
    CCLITE_INFO(host_->log(),
                "device_communicator: native engine staged through pinned host memory (CUDA IPC: %s)", why.c_str());
    return status();
  }

  // `dev`'s PCI address as one number, -1 when the runtime cannot say.
  static std::int64_t pci_key(int dev) {
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) return -1;
    auto a = parse_pci_bus_id(bus);
    return a ? (std::int64_t{a.value().domain} << 16) | (a.value().bus << 8) | a.value().device : -1;
  }

  // device_options::ipc_min_bytes: CCLITE_CUDA_IPC_MIN_BYTES, else the
  // option, else auto (ipc_engine.hpp: whether this rank shares its GPU with
  // another one, `shares`, without MPS). The largest value of any rank
  // applies, so every rank routes a call alike. Errors only when the CPU
  // communicator fails; a malformed variable is warned about and ignored
  // (see try_ipc).
  status agree_on_ipc_min_bytes(bool shares) {
    const bool mps = mps_daemon_present();
    shares_gpu_without_mps_ = shares && !mps;
    std::int64_t min_bytes = opts_.ipc_min_bytes;
    auto from_env = env::get_int("CUDA_IPC_MIN_BYTES", -1, false);
    if (!from_env) {
      CCLITE_WARN(host_->log(), "device_communicator: %s; ignored", from_env.error().message().c_str());
    } else if (from_env.value() >= 0) {
      min_bytes = from_env.value();
    }
    if (min_bytes < 0) min_bytes = auto_ipc_min_bytes(shares, mps);
    CCLITE_TRY(host_->allreduce(&min_bytes, &min_bytes, 1, dtype::int64, reduce_op::max));
    ipc_min_bytes_ = min_bytes;
    return status();
  }

  Comm* host_;
  int device_;
  device_options opts_;
  milliseconds timeout_;
  // Members go in reverse: the IPC path first (its collective wait until the
  // peers stopped reading its slots), then the staged path (its wait for its
  // host functions).
  std::unique_ptr<staged_engine<Comm>> staged_;
  std::unique_ptr<ipc_engine<Comm>> ipc_;
  std::int64_t ipc_min_bytes_ = 0;       ///< agreed by every rank (agree_on_ipc_min_bytes)
  bool shares_gpu_without_mps_ = false;  ///< for the log
};

}  // namespace cclite::cuda::detail
