// cclite/tcp/store_pool.hpp - lets a store client with one connection serve
// several threads at once.
//
// A store client speaks one request / one reply at a time on its socket. The
// threads of one process that reach the same client are several: a
// communicator's own thread (async calls), a dup() that another thread drives
// (as MPI_Comm_dup), the program itself; each may meet the store for set-up on
// first use (the hierarchical allreduce's sub-communicators, shm-direct's
// segments) or on a failure. Two requests interleaved on one socket garble
// the protocol ("bad reply ... unknown reply status"; split_test's dup case).
//
// Why a connection per thread, not one lock around each call (c10d's
// TCPStore): a wait holds its connection until the key comes (up to 30 s a
// chunk, store_client.hpp), and a set that another thread of this process
// must make first (because a rank elsewhere waits for it before it sets the
// awaited key) would sit behind that wait: ranks stuck on each other until the
// deadline. So a call runs on the client's own connection when no other
// thread holds it, else on a spare connection to the same server, opened on
// first need and kept for later calls. A process opens as many connections as
// it has threads in the store at the same moment (usually one, two with a
// dup() or an async call in set-up).
#pragma once

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp::detail {

/// The spare connections of one store client (`Client`, which must have
/// `std::unique_ptr<Client> spare()`: a client for the same server, set up as
/// this one, not connected yet: its first call connects, as a client whose
/// connection broke reconnects, within that call's own deadline).
template <class Client>
class connection_pool {
 public:
  /// fn(c) on a connection no other thread uses meanwhile: `self` if free,
  /// else an idle spare, else a new one.
  template <class Fn>
  auto run(Client& self, Fn&& fn) -> decltype(fn(self)) {
    std::unique_ptr<Client> spare;
    bool mine = false;  // this call holds `self`
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!self_busy_) {
        self_busy_ = mine = true;
      } else if (!idle_.empty()) {
        spare = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (mine) {
      auto r = fn(self);
      std::lock_guard<std::mutex> g(mu_);
      self_busy_ = false;
      return r;
    }
    if (spare == nullptr) spare = self.spare();
    auto r = fn(*spare);
    std::lock_guard<std::mutex> g(mu_);
    idle_.push_back(std::move(spare));
    return r;
  }

  /// fn(c) on every idle spare (a setting that must reach them all; the
  /// caller applies it to its own connection too).
  template <class Fn>
  void each_idle(Fn&& fn) {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& c : idle_) fn(*c);
  }

 private:
  std::mutex mu_;
  bool self_busy_ = false;
  std::vector<std::unique_ptr<Client>> idle_;  ///< spares no call holds
};

}  // namespace cclite::tcp::detail
CCLITE_SETUP_CODE_END
