// cclite/train/dp_options.hpp - the knobs of train::data_parallel (data_parallel.hpp).
//
//   train::dp_options o;
//   o.first_bucket_cap_bytes = 256 << 10;   // the last layers' gradients reduced early
//   o.uneven_inputs = true;                 // ranks may run different numbers of steps
//   auto ddp = train::data_parallel<Comm>::create(comm, net.parameters(), o).value();
//
// Every rank must pass the same options (create() compares them, with the
// shapes, and returns errc::mismatch otherwise).
#pragma once

#include <cstddef>

#include <cclite/core/clock.hpp>
#include <cclite/train/grad_compression.hpp>

namespace cclite::train {

/// Knobs of data_parallel.
struct dp_options {
  /// Largest bucket, in bytes of gradient (DDP's bucket_cap_mb = 25).
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  /// Cap of the first bucket (the last layers' gradients), small so the first
  /// allreduce starts early (DDP: 1 MiB).
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  /// Bounds each wait in synchronize(). -2 (unset): the communicator's own
  /// deadline as it stands at each wait, so comm.set_timeout() after create()
  /// applies (CCLITE_TIMEOUT, default 30 min, for a communicator type without
  /// timeout()); zero or negative: none.
  milliseconds timeout{-2};
  /// Broadcast rank 0's parameter values in create() (DDP always does).
  bool broadcast_parameters = true;
  /// 0: never split a parameter. Else a parameter larger than this is cut into
  /// ceil(bytes / split_bytes) equal pieces with a bucket each, for a model
  /// that reports its gradient in blocks (grad_ready(p, begin, end);
  /// mlp::set_grad_blocks): the first layer's weight gradient, which backward
  /// finishes last, is then reduced block by block while the next block is
  /// computed, instead of all of it after backward.
  std::size_t split_bytes = 0;
  /// Keep the gradients in memory every rank of the node maps
  /// (communicator::alloc_shared), so that backward writes them where the
  /// allreduce reads them and no staging copy is made; used when the
  /// communicator offers it and all ranks share one node, else ordinary
  /// memory (the results are the same either way).
  bool shared_gradients = true;
  /// Send the gradients as fp16 or bf16 (grad_compression.hpp): half the
  /// bytes, for links between nodes; a small, bounded loss of precision.
  /// With compression the gradients stay in ordinary memory (the window
  /// would not be what is reduced). errc::unsupported for device gradients.
  grad_compression compression = grad_compression::none;
  /// Ranks may have different numbers of steps: each synchronizing step also
  /// allreduces one float (which ranks still train), and a rank out of
  /// batches calls join(). Every rank must set it alike. Not with
  /// sharded_optimizer, nor in device memory (errc::unsupported).
  bool uneven_inputs = false;
};

}  // namespace cclite::train
