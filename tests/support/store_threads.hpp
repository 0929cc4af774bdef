// tests/support/store_threads.hpp - one store object called from several
// threads at once, as cclite calls it (store.hpp): a communicator's thread, a
// dup() another thread drives, the program.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <cclite/bootstrap/store.hpp>

namespace cclite::test {

/// Threads that wait on each other through `s`: thread i waits for the key
/// thread i-1 sets (the last threads wait first), so a wait must not hold up
/// the other threads' sets (a store serving one call at a time stalls the
/// chain until its gets' 20 s deadline: they fail); meanwhile threads add to one counter and read back
/// keys of their own, each reply belonging to its own request.
inline void check_threads(store& s, const std::string& tag) {
  constexpr int n = 4, rounds = 100;
  std::atomic<int> bad{0};
  std::vector<std::thread> chain;
  for (int i = n - 1; i >= 0; --i) {
    chain.emplace_back([&, i] {
      if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others wait by now
      if (i > 0) {
        auto got = s.get(tag + "chain/" + std::to_string(i - 1), deadline::after(std::chrono::milliseconds(20000)));
        if (!got || got.value() != std::to_string(i - 1)) {
          ++bad;
          return;
        }
      }
      if (!s.set(tag + "chain/" + std::to_string(i), std::to_string(i)).ok()) ++bad;
    });
  }
  std::vector<std::thread> busy;
  for (int i = 0; i < n; ++i) {
    busy.emplace_back([&, i] {
      for (int r = 0; r < rounds; ++r) {
        if (!s.add(tag + "counter", 1).ok()) ++bad;
        const std::string k = tag + "own/" + std::to_string(i) + "/" + std::to_string(r % 5);
        const std::string v = std::to_string(i * 1000 + r);
        if (!s.set(k, v).ok()) ++bad;
        auto got = s.get(k, deadline::after(std::chrono::milliseconds(5000)));
        if (!got || got.value() != v) ++bad;
      }
    });
  }
  for (auto& t : chain) t.join();
  for (auto& t : busy) t.join();
  CHECK(bad == 0);
  auto total = s.add(tag + "counter", 0);
  REQUIRE(total.ok());
  CHECK(total.value() == n * rounds);
}

}  // namespace cclite::test
