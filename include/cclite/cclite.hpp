// cclite/cclite.hpp - the umbrella header: core plus every transport this build links.
//
//   #include <cclite/cclite.hpp>
//   int main() {
//     auto comm = cclite::init().value();     // started by cclite-run / torchrun / mpirun
//     std::vector<float> v(1024, float(comm->rank()));
//     cclite::check(comm->allreduce(v.data(), v.size()));  // throws / aborts on error
//   }
//
// `cclite::default_communicator` is communicator<shm::transport, tcp::transport>
// (shared memory inside a node, TCP between nodes), reduced to whichever of
// the two this build links (targets cclite::shm, cclite::tcp define
// CCLITE_HAS_SHM / CCLITE_HAS_TCP).
//
// With CCLITE_SEPARATE_COMPILATION, the default communicator and init() are
// declared compiled elsewhere: in the program's TU of <cclite/src.hpp>
// (collective/separate_compilation.hpp).
#pragma once

#include <cclite/config.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/core/status.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/bootstrap/file_store.hpp>
#include <cclite/bootstrap/memory_store.hpp>
#include <cclite/bootstrap/launch_env.hpp>
#include <cclite/topology/topology.hpp>
#include <cclite/collective/communicator.hpp>
#include <cclite/collective/init.hpp>
#include <cclite/collective/objects.hpp>
#include <cclite/collective/separate_compilation.hpp>

#if defined(CCLITE_HAS_SHM)
#include <cclite/shm/transport.hpp>
#endif
#if defined(CCLITE_HAS_TCP)
#include <cclite/tcp/transport.hpp>
#endif
#if defined(CCLITE_HAS_VERBS)
#include <cclite/verbs/transport.hpp>  // opt-in: communicator<shm::transport, verbs::transport, tcp::transport>
#endif
#if defined(CCLITE_HAS_CUDA)
#include <cclite/cuda/gpu_backend.hpp>  // targets cclite::cuda / cclite::nccl (not in cclite::cclite)
#include <cclite/cuda/runtime.hpp>
#endif
#if defined(CCLITE_HAS_NCCL)
#include <cclite/nccl/backend.hpp>
#endif

// The transports of cclite::default_communicator, in order of preference.
#if defined(CCLITE_DEFAULT_WITH_VERBS) && defined(CCLITE_HAS_VERBS) && defined(CCLITE_HAS_SHM) && \
    defined(CCLITE_HAS_TCP)
// Opt-in (-DCCLITE_DEFAULT_WITH_VERBS=1): RDMA between nodes where both ends
// have a port on one fabric, tcp elsewhere (bench's allreduce_perf_verbs).
#define CCLITE_DEFAULT_TRANSPORTS ::cclite::shm::transport, ::cclite::verbs::transport, ::cclite::tcp::transport
#elif defined(CCLITE_HAS_SHM) && defined(CCLITE_HAS_TCP)
#define CCLITE_DEFAULT_TRANSPORTS ::cclite::shm::transport, ::cclite::tcp::transport
#elif defined(CCLITE_HAS_TCP)
#define CCLITE_DEFAULT_TRANSPORTS ::cclite::tcp::transport
#elif defined(CCLITE_HAS_SHM)
#define CCLITE_DEFAULT_TRANSPORTS ::cclite::shm::transport
#endif

#if defined(CCLITE_SEPARATE_COMPILATION) && !defined(CCLITE_SOURCE) && defined(CCLITE_DEFAULT_TRANSPORTS)
CCLITE_EXTERN_COMMUNICATOR(CCLITE_DEFAULT_TRANSPORTS)
#endif

namespace cclite {

#if defined(CCLITE_DEFAULT_TRANSPORTS)
using default_communicator = communicator<CCLITE_DEFAULT_TRANSPORTS>;
#endif

#if defined(CCLITE_HAS_SHM) || defined(CCLITE_HAS_TCP)
/// The default communicator, built from the launcher's environment.
inline result<env_communicator<default_communicator>> init(comm_options opts = {}) {
  return init_communicator<default_communicator>(std::move(opts));
}
#endif

}  // namespace cclite
