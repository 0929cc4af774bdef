// cclite/bootstrap/memory_store.hpp - an in-process store.
//
// memory_store is a std::map behind a mutex and a condition variable. It is
// the rendezvous of a job of one process (WORLD_SIZE=1 needs no endpoint) and
// of tests that run ranks as threads of one process. Unlike the other stores
// it may be shared by several threads at once.
#pragma once

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <cclite/config.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite {

class memory_store final : public store {
 public:
  memory_store() = default;
  memory_store(const memory_store&) = delete;
  memory_store& operator=(const memory_store&) = delete;

  /// Errors: errc::invalid_argument for a key or value over the store limits.
  status set(const std::string& key, const std::string& value) override {
    CCLITE_TRY(check_sizes(key, value.size()));
    {
      std::lock_guard<std::mutex> lk(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
    return {};
  }

  /// Errors: errc::timeout naming the key when `until` passes first.
  result<std::string> get(const std::string& key, deadline until) override {
    CCLITE_TRY(check_sizes(key, 0));
    std::unique_lock<std::mutex> lk(mu_);
    if (!wait_locked(lk, key, until))
      return make_error(errc::timeout, "timed out waiting for key '%s' in the in-process store", key.c_str());
    return data_[key];
  }

  /// Errors: errc::invalid_argument when the key holds a non-integer or the
  /// sum overflows int64.
  result<std::int64_t> add(const std::string& key, std::int64_t delta) override {
    CCLITE_TRY(check_sizes(key, 0));
    std::int64_t next = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      std::int64_t cur = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        char* end = nullptr;
        const char* s = it->second.c_str();
        errno = 0;
        long long v = std::strtoll(s, &end, 10);
        if (it->second.empty() || errno != 0 || *end != '\0')
          return make_error(errc::invalid_argument, "add on key '%s' whose value is not an integer",
                            key.c_str());
        cur = v;
      }
      if (__builtin_add_overflow(cur, delta, &next))
        return make_error(errc::invalid_argument, "add on key '%s' overflows int64", key.c_str());
      data_[key] = std::to_string(next);
    }
    cv_.notify_all();
    return next;
  }

  /// Errors: errc::timeout naming the missing keys when `until` passes.
  status wait(const std::vector<std::string>& keys, deadline until) override {
    for (const auto& k : keys) CCLITE_TRY(check_sizes(k, 0));
    std::unique_lock<std::mutex> lk(mu_);
    for (const auto& k : keys) {
      if (wait_locked(lk, k, until)) continue;
      std::string missing;
      std::size_t n = 0;
      for (const auto& m : keys)
        if (data_.count(m) == 0 && ++n <= 8) missing += (missing.empty() ? "'" : ", '") + m + "'";
      if (n > 8) missing += ", ...";
      return make_error(errc::timeout, "timed out waiting for keys %s in the in-process store",
                        missing.c_str());
    }
    return {};
  }

  result<bool> check(const std::string& key) override {
    std::lock_guard<std::mutex> lk(mu_);
    return data_.count(key) != 0;
  }

 private:
  static status check_sizes(const std::string& key, std::size_t value_len) {
    return check_store_sizes(key, value_len);
  }

  bool wait_locked(std::unique_lock<std::mutex>& lk, const std::string& key, deadline until) {
    while (data_.count(key) == 0) {
      // wait_until(time_point::max()) overflows in some standard libraries.
      if (until.is_never()) {
        cv_.wait(lk);
      } else if (cv_.wait_until(lk, until.at()) == std::cv_status::timeout) {
        return data_.count(key) != 0;
      }
    }
    return true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace cclite
CCLITE_SETUP_CODE_END
