// cclite/collective/init.hpp - build a communicator from the launcher's environment.
//
//   auto comm = cclite::init().value();   // cclite-run, torchrun, mpirun, srun
//
// Reads rank and size from whichever launcher started the process (see
// bootstrap/launch_env.hpp), meets the other ranks at CCLITE_RDZV_ENDPOINT /
// MASTER_ADDR:MASTER_PORT (rank 0 hosts a TCP store there; needs cclite::tcp)
// or in CCLITE_RDZV_DIR (file store on a shared directory; for mpirun on one
// node, its session directory), then connects.
// Errors: bootstrap_error with one line saying what to set; timeout.
#pragma once

#include <memory>
#include <utility>

#include <cclite/config.hpp>
#include <cclite/bootstrap/file_store.hpp>
#include <cclite/bootstrap/launch_env.hpp>
#include <cclite/bootstrap/memory_store.hpp>
#include <cclite/collective/communicator.hpp>

#if defined(CCLITE_HAS_TCP)
#include <cclite/tcp/rendezvous.hpp>
#endif

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite {

namespace detail {

/// What init_communicator() builds before the communicator: the launch it
/// detected, the rendezvous store and, on the rank that hosts it, the TCP store
/// server. Not a template, so that a separately compiled program
/// (CCLITE_SEPARATE_COMPILATION) compiles the stores and the launcher
/// detection once, not in every TU that calls init().
class env_store {
 public:
  env_store() = default;
  env_store(env_store&&) noexcept = default;
  /// Closes this store first (the destructor's order: the store, then the
  /// server it may be connected to), then takes `o`'s.
  env_store& operator=(env_store&& o) noexcept {
    if (this != &o) {
      close(false);
      server_ = std::move(o.server_);
#if defined(CCLITE_HAS_TCP)
      hosted_ = std::exchange(o.hosted_, nullptr);
      drain_grace_ = o.drain_grace_;
#endif
      store_ = std::move(o.store_);
      launch_ = std::move(o.launch_);
    }
    return *this;
  }
  ~env_store() = default;

  /// Detects the launcher, resolves `opts.timeout` in place (CCLITE_TIMEOUT)
  /// and opens the store: in memory for a single process without a
  /// rendezvous, else the TCP store at the endpoint (rank 0 hosts it) or, in a
  /// build without TCP, the file store of CCLITE_RDZV_DIR.
  /// Errors: bootstrap_error naming what to set; timeout.
  CCLITE_DECL static result<env_store> open(comm_options& opts);

  store& get() const noexcept { return *store_; }
  const launch_info& launch() const noexcept { return launch_; }

  /// Rank 0's INFO line for a file-store rendezvous (where the store is).
  CCLITE_DECL void log_opened(const logger& log) const;

  /// Closes the store. On the rank that hosts the TCP store, after a failed
  /// job: the server stays up until the other ranks have disconnected (at
  /// most 10 s, or the job's timeout if shorter), so they can still read the
  /// job's first failure from it instead of reporting only that this rank is
  /// gone.
  CCLITE_DECL void close(bool failed);

 private:
  // Declared first so they are destroyed last: the store may use the server.
  std::shared_ptr<void> server_;
#if defined(CCLITE_HAS_TCP)
  tcp::store_server* hosted_ = nullptr;  ///< the server in server_, if this rank hosts one
  milliseconds drain_grace_{10000};      ///< the job's timeout, at most 10 s
#endif
  std::unique_ptr<store> store_;
  launch_info launch_;
};

#if CCLITE_DEFINITIONS
CCLITE_DECL result<env_store> env_store::open(comm_options& opts) {
  auto li = detect_launch();
  if (!li) return li.error();
  auto t = env::timeout_option(opts.timeout);
  if (!t) return t.error();
  opts.timeout = t.value();
  const deadline until = deadline::after(opts.timeout);
  env_store out;
  out.launch_ = li.value();
  if (li.value().size == 1 && li.value().rdzv_host.empty() && li.value().rdzv_dir.empty()) {
    out.store_ = std::make_unique<memory_store>();
  } else {
#if defined(CCLITE_HAS_TCP)
    std::unique_ptr<tcp::store_server> server;
    auto s = tcp::open_store(li.value(), until, &server);
    if (!s) return s.error();
    out.store_ = std::move(s.value());
    out.hosted_ = server.get();
    if (opts.timeout.count() > 0 && opts.timeout < out.drain_grace_) out.drain_grace_ = opts.timeout;
    out.server_ = std::shared_ptr<tcp::store_server>(std::move(server));
#else
    if (li.value().rdzv_dir.empty()) {
      return make_error(errc::bootstrap_error,
                        "this build has no TCP rendezvous (cclite::tcp not linked): set "
                        "CCLITE_RDZV_DIR to a directory every rank can see");
    }
    (void)until;  // the file store bounds each wait itself
    auto s = file_store::open(rdzv_store_dir(li.value()));
    if (!s) return s.error();
    out.store_ = std::move(s.value());
#endif
  }
  return {std::move(out)};  // nvcc: no implicit move into result<T> (CWG1579)
}

CCLITE_DECL void env_store::log_opened(const logger& log) const {
  const launch_info& l = launch_;
  if (l.rank == 0 && l.size > 1 && l.rdzv_host.empty())
    CCLITE_INFO(log, "init: launcher %s, file store in %s%s%s%s", l.launcher.c_str(),
                rdzv_store_dir(l).c_str(), l.rdzv_dir_from.empty() ? "" : " (", l.rdzv_dir_from.c_str(),
                l.rdzv_dir_from.empty() ? "" : ")");
}

CCLITE_DECL void env_store::close(bool failed) {
  store_.reset();
#if defined(CCLITE_HAS_TCP)
  if (failed && hosted_) hosted_->drain_clients(deadline::after(drain_grace_));
  hosted_ = nullptr;
#endif
  (void)failed;
  server_.reset();
}
#endif  // CCLITE_DEFINITIONS

}  // namespace detail

/// A communicator together with the store (and store server) it was built on.
template <class Comm>
class env_communicator {
 public:
  Comm* operator->() const noexcept { return comm_.get(); }
  Comm& operator*() const noexcept { return *comm_; }
  Comm* get() const noexcept { return comm_.get(); }
  const launch_info& launch() const noexcept { return boot_.launch(); }

  env_communicator() = default;
  env_communicator(env_communicator&&) noexcept = default;
  /// Ends this communicator and its store (as the destructor), then takes `o`'s.
  /// (Member by member, the store would go first, under a live communicator.)
  env_communicator& operator=(env_communicator&& o) noexcept {
    if (this != &o) {
      close();
      boot_ = std::move(o.boot_);
      comm_ = std::move(o.comm_);
    }
    return *this;
  }
  /// Ends the communicator, then the store (detail::env_store::close(): after
  /// a failed job the rank hosting the TCP store serves it a little longer).
  ~env_communicator() { close(); }

 private:
  void close() noexcept {
    const bool failed = comm_ && comm_->failed();
    comm_.reset();
    boot_.close(failed);
  }
  template <class C>
  friend result<env_communicator<C>> init_communicator(comm_options);
  detail::env_store boot_;  // declared first so it is destroyed last: the communicator uses the store
  std::unique_ptr<Comm> comm_;
};

/// Builds a `Comm` (a communicator<...>) from the environment.
template <class Comm>
result<env_communicator<Comm>> init_communicator(comm_options opts = {}) {
  auto b = detail::env_store::open(opts);
  if (!b) return b.error();
  env_communicator<Comm> out;
  out.boot_ = std::move(b.value());
  const launch_info& l = out.boot_.launch();
  auto c = Comm::create(out.boot_.get(), l.rank, l.size, opts);
  if (!c) return c.error();
  out.comm_ = std::move(c.value());
  out.boot_.log_opened(out.comm_->log());
  return {std::move(out)};  // nvcc: no implicit move into result<T> (CWG1579)
}

}  // namespace cclite
CCLITE_SETUP_CODE_END
