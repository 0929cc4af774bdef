// cclite/cuda/device_communicator_setup.hpp - how a device_communicator is made:
// the device, the engine (CCLITE_GPU_BACKEND, auto agreed across the ranks),
// then NCCL or the native engine set up over the CPU communicator.
//
// Definitions of device_communicator<Comm>'s set-up members, create() and
// init(); create()'s documentation is with its declaration in
// device_communicator.hpp, which includes this header at its end (including
// this one first works too). create() is collective over the CPU
// communicator: with the backend left to auto, one allreduce(min) tells every
// rank whether every node has a GPU per local rank (NCCL allows one rank per
// GPU), so all pick the same engine; NCCL's unique id then goes out over the
// CPU communicator (nccl::broadcast_unique_id), and the native engine agrees
// on its path in its own create() (native_engine.hpp). A machine without a
// usable GPU answers on every rank before any collective.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <cclite/collective/op.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>
#include <cclite/cuda/device_call.hpp>
#include <cclite/cuda/device_communicator.hpp>
#include <cclite/cuda/gpu_backend.hpp>
#include <cclite/cuda/native_engine.hpp>
#include <cclite/cuda/nccl_calls.hpp>
#include <cclite/cuda/runtime.hpp>

namespace cclite::cuda {

template <class Comm>
inline auto device_communicator<Comm>::create(Comm& host, device_options o)
    -> result<std::unique_ptr<device_communicator>> {
  // No device: every rank answers at once, before any collective.
  auto count = device_count();
  if (!count) {
    return make_error(count.error().code(), "device_communicator rank %d: %s", host.rank(),
                      count.error().message().c_str());
  }
  int dev = o.device >= 0 ? o.device : host.local_rank() % count.value();
  CCLITE_TRY(set_device(dev));
  // The host communicator's deadline (its options, CCLITE_TIMEOUT or set_timeout()).
  const milliseconds to = host.timeout();
  const char* choice = o.backend ? o.backend : env::raw("GPU_BACKEND", false);
  std::string c = choice ? choice : "";
  for (auto& ch : c) ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch | 0x20 : ch);
  const bool is_auto = c.empty() || c == "auto";
  auto parsed = parse_gpu_backend(choice);
  if (!parsed) return parsed.error();
  gpu_backend engine = parsed.value();
  if (is_auto && engine == gpu_backend::nccl) {
    // NCCL wants one rank per GPU: only when every node has a device per local rank.
    std::int64_t own = host.local_size() <= count.value() ? 1 : 0;
    CCLITE_TRY(host.allreduce(&own, &own, 1, dtype::int64, reduce_op::min));
    if (own == 0) engine = gpu_backend::native;
  }
  std::unique_ptr<device_communicator> d(new device_communicator(host, dev, engine, to, o));
  CCLITE_TRY(d->init());
  return result<std::unique_ptr<device_communicator>>(std::move(d));
}

template <class Comm>
inline status device_communicator<Comm>::init() {
  // The blocking forms' stream synchronises with the legacy default stream:
  // a cudaMemcpy from pageable memory returns before its DMA has landed, and
  // work on a non-blocking stream may read the old contents (on an H200,
  // device_allreduce_perf's `cudaMemcpy(d, host, ...)` followed by an
  // allreduce on its non-blocking stream gave wrong results).
  auto s = stream::create(cudaStreamDefault);
  if (!s) return s.error();
  own_stream_ = std::move(s.value());
#if defined(CCLITE_HAS_NCCL) && CCLITE_HAS_NCCL
  if (engine_ == gpu_backend::nccl) {
    auto id = nccl::broadcast_unique_id(*host_);
    if (!id) return id.error();
    nccl::options no;
    no.device = device_;
    no.timeout = timeout_;
    auto b = nccl::backend::create_with_id(id.value(), rank(), size(), no);
    if (!b) return b.error();
    nccl_ = std::move(b.value());
    return status();
  }
#endif
  auto e = detail::native_engine<Comm>::create(*host_, device_, opts_, timeout_);
  if (!e) return e.error();
  native_ = std::move(e.value());
  return status();
}

}  // namespace cclite::cuda
