// cclite/collective/device_hook.hpp - how a communicator takes device (GPU) buffers.
//
// The CPU communicator knows nothing of GPUs (no CUDA in the core). A GPU layer
// installs a device_hook on it; from then on every call first asks the hook
// whether its buffers are device memory and, if so, hands the whole call to it:
//
//   auto env = cclite::init().value();
//   auto gpu = cclite::cuda::device_buffers<cclite::default_communicator>::enable(*env).value();
//   env->allreduce(d_grad, d_grad, n, cclite::dtype::float32, cclite::reduce_op::avg);  // device pointers
//
// (cclite/cuda/device_buffers.hpp, with CUDA-aware-MPI semantics: the device
// data must be ready when the call is made, and is when it returns.) The
// arguments are checked first, as for host buffers. Without a hook nothing
// changes and nothing is paid; with one, each call pays the hook's owns().
#pragma once

#include <cclite/collective/op.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

class device_hook {
 public:
  /// True when `d`'s buffers are device memory (or a mix the hook reports):
  /// run() then gets the call instead of the CPU path. Must not block.
  virtual bool owns(const op_desc& d) const noexcept = 0;
  /// Runs `d` to completion (blocking), with the communicator's semantics.
  virtual status run(const op_desc& d) = 0;

 protected:
  device_hook() = default;
  device_hook(const device_hook&) = default;
  device_hook& operator=(const device_hook&) = default;
  ~device_hook() = default;  // not owned through this type
};

}  // namespace cclite
