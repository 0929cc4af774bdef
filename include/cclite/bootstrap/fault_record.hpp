// cclite/bootstrap/fault_record.hpp - the job's first failure, as the store
// keeps it.
//
// The first rank of a communicator whose call fails records its error under
// the key "fault" of the communicator's store prefix (comm_checks.hpp,
// spread_failure); the ranks that fail after it report that record instead of
// their own echo of it. The value is "<errc as a number>\n<message>".
//
// Waits that no link can end look for it too: a transport's connect to a peer
// that failed while its process lives on, or whose loss only others saw
// (transport_context::recorded_failure, transport/concept.hpp).
#pragma once

#include <cstdlib>
#include <string>

#include <cclite/bootstrap/store.hpp>
#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite {

/// The store key of the record, under a communicator's prefix.
inline constexpr const char* fault_record_key = "fault";

/// The record's value for an error `code` saying `message`.
inline std::string encode_fault_record(errc code, const std::string& message) {
  return std::to_string(static_cast<int>(code)) + "\n" + message;
}

/// The record's error; an ok status if `rec` is not a record of this version.
inline status decode_fault_record(const std::string& rec) {
  const auto nl = rec.find('\n');
  const int code = std::atoi(rec.c_str());
  if (nl == std::string::npos || code <= 0 || code > static_cast<int>(errc::resource_exhausted)) return {};
  return status(static_cast<errc>(code), rec.substr(nl + 1));
}

/// The record in `kv` if one is there now (one round trip, bounded by
/// `reply_by`: a silent store counts as no record), else an ok status.
inline status recorded_fault(store& kv, deadline reply_by) {
  auto rec = kv.get_within(fault_record_key, deadline::after(milliseconds(0)), reply_by);
  return rec ? decode_fault_record(rec.value()) : status{};
}

}  // namespace cclite
CCLITE_SETUP_CODE_END
