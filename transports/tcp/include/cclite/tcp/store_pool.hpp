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
#include <optional>
#include <utility>
#include <vector>

#include <cclite/bootstrap/store.hpp>
#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite::tcp::detail {

/// The spare connections of one store client. Not a template over the client
/// (only the few lines of run() are): the pool is compiled once per program,
/// not once per client type and call.
class connection_pool {
 public:
  /// `spare(self)`: a client for the same server, set up as `self`, not
  /// connected yet: its first call connects, as a client whose connection
  /// broke reconnects, within that call's own deadline.
  using spare_fn = std::unique_ptr<cclite::store> (*)(cclite::store& self);
  explicit connection_pool(spare_fn spare) : spare_(spare) {}

  /// fn(c) on a connection no other thread uses meanwhile (`c` is `self` if
  /// free, else an idle spare, else a new one), and its result.
  template <class Client, class Fn>
  auto run(Client& self, Fn&& fn) -> decltype(fn(self)) {
    std::optional<decltype(fn(self))> r;
    auto call = [&](cclite::store& c) { r.emplace(fn(static_cast<Client&>(c))); };
    run_on(self, [](void* f, cclite::store& c) { (*static_cast<decltype(call)*>(f))(c); }, &call);
    return std::move(*r);
  }

 private:
  void run_on(cclite::store& self, void (*call)(void*, cclite::store&), void* ctx) {
    std::unique_lock<std::mutex> g(mu_);
    if (!self_busy_) {
      self_busy_ = true;
      g.unlock();
      struct release {  // also when the call throws (bad_alloc)
        connection_pool& p;
        ~release() {
          std::lock_guard<std::mutex> h(p.mu_);
          p.self_busy_ = false;
        }
      } done{*this};
      call(ctx, self);
      return;
    }
    std::unique_ptr<cclite::store> spare;
    if (!idle_.empty()) {
      spare = std::move(idle_.back());
      idle_.pop_back();
    }
    g.unlock();
    if (spare == nullptr) spare = spare_(self);
    call(ctx, *spare);
    g.lock();
    idle_.push_back(std::move(spare));
  }

  spare_fn spare_;
  std::mutex mu_;
  bool self_busy_ = false;
  std::vector<std::unique_ptr<cclite::store>> idle_;  ///< spares no call holds
};

}  // namespace cclite::tcp::detail
CCLITE_SETUP_CODE_END
