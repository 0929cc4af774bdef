// cclite/nccl/types.hpp - NCCL's results, dtypes and ops in cclite's terms, and
// the unique-id exchange through a cclite::store.
//
// NCCL needs one ncclUniqueId, made by one rank, known to all before
// ncclCommInitRank. Where MPI programs broadcast it with MPI_Bcast, cclite puts
// it in the job's store (TCP store hosted by rank 0, or the file store): the same
// rendezvous the CPU transports use, so no MPI is needed.
#pragma once

#include <nccl.h>

#include <cstring>
#include <string>

#include <cclite/bootstrap/store.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>

namespace cclite::nccl {

/// `what: <NCCL's name for r> (<ncclGetLastError>)` as a status; ncclSuccess is ok.
/// Codes: bad arguments / usage -> invalid_argument, a remote rank's failure ->
/// peer_lost, anything else -> system_error. `comm` may be null (before init).
inline status nccl_status(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return status();
  const char* last = ncclGetLastError(comm);
  errc code = errc::system_error;
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) code = errc::invalid_argument;
  if (r == ncclRemoteError) code = errc::peer_lost;
  return make_error(code, "%s: %s%s%s%s", what, ncclGetErrorString(r),
                    last && *last ? " (" : "", last ? last : "", last && *last ? ")" : "");
}

/// NCCL's data type for a cclite dtype (all ten have one; NCCL >= 2.10 for bfloat16).
inline result<ncclDataType_t> to_nccl(dtype t) {
  switch (t) {
    case dtype::int8: return ncclInt8;
    case dtype::uint8: return ncclUint8;
    case dtype::int32: return ncclInt32;
    case dtype::uint32: return ncclUint32;
    case dtype::int64: return ncclInt64;
    case dtype::uint64: return ncclUint64;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
  }
  return make_error(errc::invalid_argument, "dtype %d is not a cclite dtype", static_cast<int>(t));
}

/// NCCL's reduction for a cclite op; avg is ncclAvg (NCCL >= 2.10), which like
/// cclite divides the sum by the rank count (integers: truncating).
inline result<ncclRedOp_t> to_nccl(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::prod: return ncclProd;
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
    case reduce_op::avg: return ncclAvg;
    case reduce_op::band:
    case reduce_op::bor:
    case reduce_op::bxor:
      return make_error(errc::unsupported, "NCCL has no bitwise reduction (%s); use the native GPU backend "
                        "(CCLITE_GPU_BACKEND=native) or host memory", to_string(op));
  }
  return make_error(errc::invalid_argument, "reduce_op %d is not a cclite op", static_cast<int>(op));
}

/// "2.28.9" for the NCCL library loaded at run time (may differ from nccl.h's).
inline std::string version_string() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

/// Rank 0 makes a unique id (ncclGetUniqueId, which opens NCCL's bootstrap
/// socket but needs no GPU) and stores it under `key`; every other rank waits for
/// it until `until`. `key` must be fresh for each communicator built on the same
/// store (a stale id would join an old communicator): use a prefix per communicator.
inline result<ncclUniqueId> exchange_unique_id(store& kv, const std::string& key, int rank,
                                               deadline until) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0) {
    CCLITE_TRY(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    CCLITE_TRY(kv.set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id)));
    return id;
  }
  auto v = kv.get(key, until);
  if (!v) {
    return make_error(v.error().code(), "rank %d: waiting for rank 0's NCCL unique id: %s", rank,
                      v.error().message().c_str());
  }
  if (v.value().size() != sizeof id) {
    return make_error(errc::protocol_error,
                      "rank %d: NCCL unique id under '%s' has %zu bytes, expected %zu (another "
                      "program's key, or a different NCCL version on rank 0?)",
                      rank, key.c_str(), v.value().size(), sizeof id);
  }
  std::memcpy(&id, v.value().data(), sizeof id);
  return id;
}

/// Rank 0's ncclGetUniqueId sent to every rank of `comm` (any cclite
/// communicator: broadcast(void*, count, dtype, root) -> status), for jobs that
/// have a CPU communicator but no store at hand. Collective over `comm`; bounded
/// by its timeout.
template <class Comm>
result<ncclUniqueId> broadcast_unique_id(Comm& comm) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (comm.rank() == 0) CCLITE_TRY(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  status s = comm.broadcast(&id, sizeof id, dtype::uint8, 0);
  if (!s.ok()) {
    return make_error(s.code(), "rank %d: broadcasting the NCCL unique id: %s", comm.rank(), s.message().c_str());
  }
  return id;
}

}  // namespace cclite::nccl
