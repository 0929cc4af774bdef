// cclite/collective/communicator.hpp - the public API: a group of ranks and their collectives.
//
//   auto comm = cclite::init().value();            // from cclite-run / torchrun / mpirun env
//   std::vector<float> g(n, 1.0f);
//   comm->allreduce(g.data(), g.size());           // in place, sum
//
// `communicator<Transports...>` compiles only the transports named; for each
// peer the first one both ranks enabled and that can reach the peer is used.
// All ranks must issue the same collectives in the same order with the same
// count, dtype, op and root (as in NCCL/MPI).
//
// Errors: every call returns a status. errc::invalid_argument (bad pointer,
// root, dtype) leaves the communicator usable; timeout / peer_lost / aborted /
// protocol_error make it unusable: later calls return the same error at once,
// and the application should destroy it and build a new one.
//
// Thread safety: calls may come from any thread; they run one at a time in
// issue order (see work_queue.hpp). abort() may be called from any thread.
#pragma once

#include <atomic>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cclite/algorithm/primitives.hpp>
#include <cclite/algorithm/ring_allreduce.hpp>
#include <cclite/algorithm/ring_broadcast.hpp>
#include <cclite/bootstrap/store.hpp>
#include <cclite/collective/work_queue.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/log.hpp>
#include <cclite/core/reduce.hpp>
#include <cclite/topology/topology.hpp>
#include <cclite/transport/transport_set.hpp>

namespace cclite {

/// Knobs of a communicator; defaults come from the environment.
struct comm_options {
  /// Bounds every wait (bootstrap, connect, each collective). Default
  /// CCLITE_TIMEOUT, 30 minutes. Negative = no deadline.
  milliseconds timeout{-2};  // -2: take CCLITE_TIMEOUT
  /// Elements a ring round moves per segment = chunk_bytes / element size.
  /// Default CCLITE_CHUNKSIZE or 512 KiB; must stay at most a quarter of the
  /// transports' buffer size so a ring round always fits in the FIFOs.
  std::size_t chunk_bytes = 0;
  /// Key prefix in the store, so several communicators can share one store.
  std::string store_prefix = "cclite";
};

template <class... Transports>
class communicator final : private detail::op_executor {
 public:
  using transports = transport_set<Transports...>;
  using link = typename transports::link;

  /// Joins `size` ranks that share `kv`. Blocks until this rank is connected
  /// to the peers it needs (its ring neighbours), bounded by the timeout.
  /// `kv` must outlive the communicator.
  /// Errors: invalid_argument, bootstrap_error, no_transport, timeout, peer_lost.
  static result<std::unique_ptr<communicator>> create(store& kv, int rank, int size,
                                                      comm_options opts = {}) {
    if (size < 1 || rank < 0 || rank >= size) {
      return make_error(errc::invalid_argument, "communicator: rank %d / size %d is invalid", rank,
                        size);
    }
    std::unique_ptr<communicator> c(new communicator(kv, rank, size));
    CCLITE_TRY(c->init(std::move(opts)));
    return c;
  }

  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  /// Waits for queued collectives (each bounded by its deadline), then closes.
  ~communicator() { queue_.shutdown(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const { return topo_.local_rank(rank_); }
  int local_size() const { return topo_.local_size(rank_); }
  int node_count() const { return topo_.node_count(); }
  const topology& topo() const noexcept { return topo_; }
  const peer_info& peer(int r) const { return peers_[static_cast<std::size_t>(r)]; }
  /// Transport chosen for `peer` ("shm", "tcp", "self").
  const char* transport_of(int peer) const {
    return peer == rank_ ? "self" : transports::name(choice_[static_cast<std::size_t>(peer)]);
  }
  /// The logger carrying this rank's prefix (CCLITE_DEBUG).
  const logger& log() const noexcept { return log_; }

  // ---- collectives --------------------------------------------------------------

  /// recv[i] = send[i] (op) over all ranks, for i < count. `send == recv` is
  /// the in-place form. Blocking.
  status allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return queue_.run(make_allreduce(send, recv, count, t, op));
  }
  template <class T>
  status allreduce(const T* send, T* recv, std::size_t count, reduce_op op = reduce_op::sum) {
    return allreduce(send, recv, count, dtype_of_v<T>, op);
  }
  template <class T>
  status allreduce(T* data, std::size_t count, reduce_op op = reduce_op::sum) {
    return allreduce(data, data, count, dtype_of_v<T>, op);
  }
  work allreduce_async(const void* send, void* recv, std::size_t count, dtype t, reduce_op op) {
    return queue_.submit(make_allreduce(send, recv, count, t, op));
  }
  template <class T>
  work allreduce_async(T* data, std::size_t count, reduce_op op = reduce_op::sum) {
    return allreduce_async(data, data, count, dtype_of_v<T>, op);
  }

  /// Copies root's `count` elements of `buf` to every rank's `buf`. Blocking.
  status broadcast(void* buf, std::size_t count, dtype t, int root) {
    return queue_.run(make_broadcast(buf, count, t, root));
  }
  template <class T>
  status broadcast(T* buf, std::size_t count, int root) {
    return broadcast(buf, count, dtype_of_v<T>, root);
  }
  work broadcast_async(void* buf, std::size_t count, dtype t, int root) {
    return queue_.submit(make_broadcast(buf, count, t, root));
  }

  /// Returns once every rank called barrier().
  status barrier() { return queue_.run(op_desc{}); }
  work barrier_async() { return queue_.submit(op_desc{}); }

  /// Makes every running and future call on this communicator return
  /// errc::aborted (within ~50 ms). Safe from any thread, e.g. a watchdog.
  void abort() noexcept { aborted_.store(true); }

 private:
  communicator(store& kv, int rank, int size)
      : user_kv_(kv), rank_(rank), size_(size), log_(rank), queue_(*this) {}

  // ---- set-up ------------------------------------------------------------------------

  status init(comm_options opts) {
    if (opts.timeout.count() == -2) {
      auto t = env::timeout();
      if (!t) return t.error();
      opts.timeout = t.value();
    }
    timeout_ = opts.timeout;
    auto chunk = env::get_int("CHUNKSIZE", 512 << 10, false);
    if (!chunk) return chunk.error();
    chunk_bytes_ = opts.chunk_bytes ? opts.chunk_bytes : static_cast<std::size_t>(chunk.value());
    if (chunk_bytes_ < 4096) chunk_bytes_ = 4096;
    const deadline until = deadline::after(timeout_);

    // A generation number per communicator built on this store: ranks of the
    // g-th communicator draw counter values in (g*size, (g+1)*size], because
    // nobody can start the next join before this one's allgather completed.
    auto joined = user_kv_.add(opts.store_prefix + "/join", 1);
    if (!joined) return joined.error();
    const std::int64_t gen = (joined.value() - 1) / size_;
    kv_ = std::make_unique<prefix_store>(user_kv_, opts.store_prefix + "/" + std::to_string(gen) + "/");

    peer_info self = local_peer_info(rank_);
    auto names = transports::enabled_names();
    if (!names) return names.error();
    self.transports = names.value();
    if (rank_ == 0) {
      char tag[64];
      std::snprintf(tag, sizeof tag, "%x-%" PRId64 "-%x", static_cast<unsigned>(self.pid), gen,
                    static_cast<unsigned>(clock::now().time_since_epoch().count() & 0xfffff));
      CCLITE_TRY(kv_->set("tag", tag));
    }
    auto all = store_allgather(*kv_, "peer", rank_, size_, self.serialize(), until);
    if (!all) return all.error();
    for (int r = 0; r < size_; ++r) {
      auto p = peer_info::parse(all.value()[static_cast<std::size_t>(r)]);
      if (!p) return p.error();
      peers_.push_back(std::move(p.value()));
    }
    auto t = topology::build(peers_);
    if (!t) return t.error();
    topo_ = std::move(t.value());
    auto tag = kv_->get("tag", until);
    if (!tag) return tag.error();

    ctx_.rank = rank_;
    ctx_.size = size_;
    ctx_.peers = &peers_;
    ctx_.kv = kv_.get();
    ctx_.log = &log_;
    ctx_.aborted = &aborted_;
    ctx_.job_tag = tag.value();
    transports_ = std::make_unique<transports>(ctx_);
    CCLITE_TRY(transports_->publish(peers_[static_cast<std::size_t>(rank_)]));

    CCLITE_INFO(log_, "init: rank %d of %d, local rank %d of %d, %s", rank_, size_, local_rank(),
                local_size(), topo_.describe(peers_).c_str());
    CCLITE_TRY(choose_transports());
    links_.resize(static_cast<std::size_t>(size_));
    if (size_ > 1) CCLITE_TRY(connect_ring(until));
    return {};
  }

  status choose_transports() {
    choice_.assign(static_cast<std::size_t>(size_), -1);
    const peer_info& me = peers_[static_cast<std::size_t>(rank_)];
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const peer_info& p = peers_[static_cast<std::size_t>(r)];
      int c = transports_->choose(me, p);
      if (c < 0) {
        return make_error(errc::no_transport,
                          "no transport can reach %s from %s: this rank enabled [%s], the peer "
                          "enabled [%s]; compile a common transport into communicator<...> or "
                          "unset CCLITE_*_DISABLE",
                          p.describe().c_str(), me.describe().c_str(), join(me.transports).c_str(),
                          join(p.transports).c_str());
      }
      choice_[static_cast<std::size_t>(r)] = c;
      CCLITE_INFO(log_, "peer %s: via %s", p.describe().c_str(), transports::name(c));
    }
    return {};
  }

  // Ring neighbours are connected eagerly, in (min, max) pair order on every
  // rank: a global order of pairs, so blocking pairwise handshakes cannot deadlock.
  status connect_ring(deadline until) {
    int a = topo_.ring_prev(rank_), b = topo_.ring_next(rank_);
    auto key = [&](int p) { return std::min(rank_, p) * size_ + std::max(rank_, p); };
    if (key(b) < key(a)) std::swap(a, b);
    CCLITE_TRY(connect_peer(a, until));
    if (b != a) CCLITE_TRY(connect_peer(b, until));
    CCLITE_INFO(log_, "ring: %d -> %d -> %d (%s, %s)", topo_.ring_prev(rank_), rank_,
                topo_.ring_next(rank_), transport_of(topo_.ring_prev(rank_)),
                transport_of(topo_.ring_next(rank_)));
    return {};
  }

  status connect_peer(int p, deadline until) {
    auto l = transports_->connect(choice_[static_cast<std::size_t>(p)], p, until);
    if (!l) {
      return status(l.error().code(), "connecting to " + peer(p).describe() + " via " +
                                           transport_of(p) + ": " + l.error().message());
    }
    links_[static_cast<std::size_t>(p)] = std::move(l.value());
    return {};
  }

  // ---- execution ------------------------------------------------------------------------

  op_desc make_allreduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) const {
    op_desc d;
    d.kind = collective_kind::allreduce;
    d.send = s;
    d.recv = r;
    d.count = n;
    d.type = t;
    d.op = op;
    return d;
  }
  op_desc make_broadcast(void* buf, std::size_t n, dtype t, int root) const {
    op_desc d;
    d.kind = collective_kind::broadcast;
    d.send = buf;
    d.recv = buf;
    d.count = n;
    d.type = t;
    d.root = root;
    return d;
  }

  status validate(const op_desc& d) const {
    if (d.kind == collective_kind::barrier) return {};
    if (!is_valid(d.type)) return make_error(errc::invalid_argument, "%s: invalid dtype %d", to_string(d.kind), static_cast<int>(d.type));
    if (d.kind == collective_kind::allreduce && !is_valid(d.op))
      return make_error(errc::invalid_argument, "allreduce: invalid reduce_op %d", static_cast<int>(d.op));
    if (d.count > (SIZE_MAX >> 4) / size_of(d.type))
      return make_error(errc::invalid_argument, "%s: count %zu overflows the byte size", to_string(d.kind), d.count);
    if (d.count > 0 && (!d.recv || !d.send))
      return make_error(errc::invalid_argument, "%s: null buffer with count %zu", to_string(d.kind), d.count);
    if (d.kind == collective_kind::broadcast && (d.root < 0 || d.root >= size_))
      return make_error(errc::invalid_argument, "broadcast: root %d out of range [0, %d)", d.root, size_);
    return {};
  }

  status execute(const op_desc& d) override {
    CCLITE_TRY(validate(d));
    const std::uint64_t seq = ++seq_;
    if (aborted_.load()) {
      broken_ = make_error(errc::aborted, "communicator aborted (rank %d)", rank_);
      return broken_;
    }
    if (!broken_.ok()) {
      return status(broken_.code(), "communicator unusable after an earlier error: " + broken_.message());
    }
    log_call(d);
    status st = size_ == 1 ? run_local(d) : run_ring(d);
    if (!st.ok()) {
      st = status(st.code(), describe_call(d, seq) + ": " + st.message());
      if (st.code() != errc::invalid_argument && st.code() != errc::unsupported) broken_ = st;
      CCLITE_WARN(log_, "%s", st.to_string().c_str());
    }
    return st;
  }

  status run_local(const op_desc& d) {
    if (d.kind == collective_kind::allreduce && d.send != d.recv && d.count)
      std::memcpy(d.recv, d.send, d.count * size_of(d.type));
    return {};
  }

  status run_ring(const op_desc& d) {
    link& prev = links_[static_cast<std::size_t>(topo_.ring_prev(rank_))];
    link& next = links_[static_cast<std::size_t>(topo_.ring_next(rank_))];
    const deadline until = deadline::after(timeout_);
    const std::size_t elem = d.kind == collective_kind::barrier ? 1 : size_of(d.type);
    const reduction red = d.kind == collective_kind::allreduce ? reduction_for(d.type, d.op) : reduction{};
    const int pos = topo_.ring_position(rank_);
    return std::visit(
        [&](auto& p, auto& n) -> status {
          using P = std::decay_t<decltype(p)>;
          using N = std::decay_t<decltype(n)>;
          if constexpr (std::is_same_v<P, std::monostate> || std::is_same_v<N, std::monostate>) {
            return make_error(errc::no_transport, "ring neighbour not connected");
          } else {
            primitives<P, N> prims(p, n, elem, &red, until);
            switch (d.kind) {
              case collective_kind::allreduce:
                return ring_allreduce(prims, static_cast<const std::uint8_t*>(d.send),
                                      static_cast<std::uint8_t*>(d.recv), d.count, elem, red, size_,
                                      pos, std::max<std::size_t>(1, chunk_bytes_ / elem));
              case collective_kind::broadcast: {
                int rel = (pos - topo_.ring_position(d.root) + size_) % size_;
                return ring_broadcast(prims, static_cast<std::uint8_t*>(d.recv), d.count * elem, size_, rel);
              }
              case collective_kind::barrier:
                return ring_barrier(prims, size_, pos);
            }
            return {};
          }
        },
        prev, next);
  }

  std::string describe_call(const op_desc& d, std::uint64_t seq) const {
    char buf[200];
    if (d.kind == collective_kind::barrier) {
      std::snprintf(buf, sizeof buf, "rank %d: barrier #%" PRIu64, rank_, seq);
    } else {
      std::snprintf(buf, sizeof buf, "rank %d: %s #%" PRIu64 " (%zu x %s%s%s)", rank_, to_string(d.kind), seq,
                    d.count, to_string(d.type), d.kind == collective_kind::allreduce ? ", " : "",
                    d.kind == collective_kind::allreduce ? to_string(d.op) : "");
    }
    return buf;
  }

  // INFO: the algorithm of each call, once per (collective, power-of-two size class).
  void log_call(const op_desc& d) {
    if (!log_.enabled(log_level::info)) return;
    std::size_t bytes = d.count * (d.kind == collective_kind::barrier ? 0 : size_of(d.type));
    int cls = 0;
    while (cls < 63 && (std::size_t(1) << cls) < bytes) ++cls;
    std::uint64_t bit = std::uint64_t(1) << cls;
    std::uint64_t& seen = logged_[static_cast<std::size_t>(d.kind)];
    if (!(seen & bit)) {
      seen |= bit;
      const char* algo = size_ == 1 ? "local copy" : d.kind == collective_kind::broadcast ? "ring chain" : "ring";
      CCLITE_INFO(log_, "%s: %zu bytes (class <= 2^%d): algorithm %s, chunk %zu bytes, ring %s/%s",
                  to_string(d.kind), bytes, cls, algo, chunk_bytes_,
                  size_ > 1 ? transport_of(topo_.ring_prev(rank_)) : "self",
                  size_ > 1 ? transport_of(topo_.ring_next(rank_)) : "self");
    }
    CCLITE_TRACE(log_, "%s #%" PRIu64 ": count %zu", to_string(d.kind), seq_, d.count);
  }

  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  }

  store& user_kv_;
  std::unique_ptr<prefix_store> kv_;
  int rank_, size_;
  logger log_;
  std::vector<peer_info> peers_;
  topology topo_;
  transport_context ctx_;
  std::unique_ptr<transports> transports_;
  std::vector<int> choice_;
  std::vector<link> links_;
  milliseconds timeout_{0};
  std::size_t chunk_bytes_ = 512 << 10;
  std::atomic<bool> aborted_{false};
  std::uint64_t seq_ = 0;
  status broken_;
  std::uint64_t logged_[3] = {0, 0, 0};
  detail::work_queue queue_;  // last: its thread must stop before the rest is destroyed
};

}  // namespace cclite
