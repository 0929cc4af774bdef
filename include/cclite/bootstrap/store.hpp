// cclite/bootstrap/store.hpp - the key-value store every rank meets at.
//
// A store is how ranks find each other before any transport exists (Gloo's
// rendezvous::Store, PyTorch's TCPStore). cclite ships two:
//   - tcp::store_client / tcp::store_server  (transports/tcp; rank 0 hosts it)
//   - file_store                             (a directory every node mounts)
// Values are opaque byte strings. Every blocking call takes a deadline and
// returns errc::timeout naming the keys it was waiting for.
//
// Thread safety: a store object may be called from several threads at once,
// and cclite does so: a communicator's own thread (async calls), a dup()
// another thread drives, the program itself may each meet the store (set-up
// on first use, failures) while another waits in it. The stores cclite ships
// allow it (the TCP clients give a thread that finds the connection busy a
// spare connection, tcp/store_pool.hpp); a store of the program's own making
// must too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite {

/// Limits shared by all stores and checked on both sides of the wire, so that a
/// hostile or buggy client can never make a store allocate without bound.
inline constexpr std::size_t max_store_key_bytes = 4096;
inline constexpr std::size_t max_store_value_bytes = 64u << 20;

/// The limits above, as every store checks them before anything else.
inline status check_store_sizes(const std::string& key, std::size_t value_len) {
  if (key.empty() || key.size() > max_store_key_bytes)
    return make_error(errc::invalid_argument, "store key of %zu bytes (must be 1..%zu)", key.size(),
                      max_store_key_bytes);
  if (value_len > max_store_value_bytes)
    return make_error(errc::invalid_argument, "store value of %zu bytes (max %zu)", value_len, max_store_value_bytes);
  return {};
}

class store {
 public:
  virtual ~store() = default;

  /// Sets `key` to `value`, replacing any earlier value. Wakes waiters.
  virtual status set(const std::string& key, const std::string& value) = 0;

  /// Returns the value of `key`, waiting until it exists or `until` passes.
  virtual result<std::string> get(const std::string& key, deadline until) = 0;

  /// Atomically adds `delta` to the integer stored at `key` (absent = 0) and
  /// returns the new value. The integer is stored as decimal text.
  virtual result<std::int64_t> add(const std::string& key, std::int64_t delta) = 0;

  /// Waits until every key in `keys` exists.
  virtual status wait(const std::vector<std::string>& keys, deadline until) = 0;

  /// True if `key` exists now (never blocks beyond one round trip).
  virtual result<bool> check(const std::string& key) = 0;

  /// set(), add() and get() that also give up at `reply_by`: a store behind a
  /// connection bounds the round trip, any reconnect included, by it (errc::
  /// timeout or peer_lost), where the plain calls take the store's op timeout
  /// (CCLITE_TIMEOUT under cclite::init()). get_within() waits for the key
  /// until `until` as get() does; `reply_by` should come later. For answers
  /// worth a few seconds and no more: a failing rank records the job's first
  /// failure, and the store's host may have gone with the failure (a host
  /// lost). By default the plain calls, for stores that cannot be slow
  /// (memory_store) or cannot bound them.
  virtual status set_within(const std::string& key, const std::string& value, deadline reply_by) {
    (void)reply_by;
    return set(key, value);
  }
  virtual result<std::int64_t> add_within(const std::string& key, std::int64_t delta, deadline reply_by) {
    (void)reply_by;
    return add(key, delta);
  }
  virtual result<std::string> get_within(const std::string& key, deadline until, deadline reply_by) {
    (void)reply_by;
    return get(key, until);
  }
};

/// Base of the stores that bound every call themselves (the clients of a
/// store server): set(), get() and add() are the bounded calls without a
/// bound of the caller's, so each client writes the round trip once.
class bounded_store : public store {
 public:
  status set(const std::string& key, const std::string& value) override {
    return set_within(key, value, deadline::never());
  }
  result<std::string> get(const std::string& key, deadline until) override {
    return get_within(key, until, deadline::never());
  }
  result<std::int64_t> add(const std::string& key, std::int64_t delta) override {
    return add_within(key, delta, deadline::never());
  }
  status set_within(const std::string& key, const std::string& value, deadline reply_by) override = 0;
  result<std::int64_t> add_within(const std::string& key, std::int64_t delta, deadline reply_by) override = 0;
  result<std::string> get_within(const std::string& key, deadline until, deadline reply_by) override = 0;
};

/// A view of another store with every key prefixed by `prefix` (Gloo's
/// PrefixStore): lets a communicator and its sub-communicators share one store.
class prefix_store final : public store {
 public:
  prefix_store(store& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}

  status set(const std::string& key, const std::string& value) override {
    return base_.set(prefix_ + key, value);
  }
  result<std::string> get(const std::string& key, deadline until) override {
    return base_.get(prefix_ + key, until);
  }
  result<std::int64_t> add(const std::string& key, std::int64_t delta) override {
    return base_.add(prefix_ + key, delta);
  }
  status wait(const std::vector<std::string>& keys, deadline until) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    return base_.wait(full, until);
  }
  result<bool> check(const std::string& key) override { return base_.check(prefix_ + key); }
  status set_within(const std::string& key, const std::string& value, deadline reply_by) override {
    return base_.set_within(prefix_ + key, value, reply_by);
  }
  result<std::int64_t> add_within(const std::string& key, std::int64_t delta, deadline reply_by) override {
    return base_.add_within(prefix_ + key, delta, reply_by);
  }
  result<std::string> get_within(const std::string& key, deadline until, deadline reply_by) override {
    return base_.get_within(prefix_ + key, until, reply_by);
  }

 private:
  store& base_;
  std::string prefix_;
};

/// What store_allgather() asks between the slices of its wait, if anything:
/// `check(arg)` returning an error ends the wait with that error (a
/// communicator's set-up asking its links whether a member was lost).
struct store_wait_watch {
  status (*check)(void* arg) = nullptr;
  void* arg = nullptr;
  milliseconds slice{200};
};

/// s.get(key, until), and with a `watch` in its slices, `watch.check` asked
/// between them.
inline result<std::string> store_get_watched(store& s, const std::string& key, deadline until,
                                             const store_wait_watch& watch) {
  for (;;) {
    // `until` itself when no watch or when it comes first
    const deadline step = watch.check ? deadline::slice_of(until, watch.slice) : until;
    auto v = s.get(key, step);
    if (v || v.error().code() != errc::timeout || !step.is_slice()) return v;
    CCLITE_TRY(watch.check(watch.arg));
  }
}

/// Every rank publishes `mine` under `key/<rank>` and receives all ranks'
/// values in rank order. Used at init to exchange peer information. With a
/// `watch`, each wait is cut into its slices and `watch.check` asked between.
inline result<std::vector<std::string>> store_allgather(store& s, const std::string& key, int rank,
                                                        int size, const std::string& mine,
                                                        deadline until, const store_wait_watch& watch = {}) {
  CCLITE_TRY(s.set(key + "/" + std::to_string(rank), mine));
  std::vector<std::string> all(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    auto v = store_get_watched(s, key + "/" + std::to_string(r), until, watch);
    if (!v) return v.error();
    all[static_cast<std::size_t>(r)] = std::move(v.value());
  }
  return all;
}

}  // namespace cclite
CCLITE_SETUP_CODE_END
