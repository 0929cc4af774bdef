// cclite/collective/cost_model.hpp - alpha-beta-gamma costs of each algorithm.
//
// The textbook model (Thakur, Rabenseifner, Gropp 2005; NCCL's tuning model):
// a message of b bytes over a link costs alpha + b * beta, reducing b bytes
// costs b * gamma (charged where an algorithm reduces out of a scratch copy
// rather than inside the streaming copy, as the ring does). Each algorithm is a count of latency steps and of bytes on
// the busiest link; the selector (select.hpp) takes the cheapest. Figures are
// per link kind (shm, tcp); a collective is charged the slowest kind any of
// its links uses, agreed by all ranks at init so they choose alike.
//
// Defaults were measured on the 2-core development VM with bench/coll_perf
// (see docs/performance.md); CCLITE_COST_MEASURE=1 measures them when a
// communicator is created (cost_measure.hpp), and CCLITE_COST_<KIND>=
// "alpha_us,GBps" replaces either (e.g. CCLITE_COST_TCP="12,10" for a 100 GbE
// cluster): environment, then measurement, then defaults.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>

#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

/// Cost of one link kind: per-message latency and per-byte time, in us.
struct link_cost {
  double alpha_us = 1.0;
  double beta_us_per_byte = 1.0 / 5000.0;  // 5 GB/s
  static link_cost from(double alpha_us, double gbps) { return {alpha_us, 1.0 / (gbps * 1000.0)}; }
};

/// What the selector compares: algorithms' estimated times on the slowest link.
class cost_model {
 public:
CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
  /// Reads CCLITE_COST_SHM and CCLITE_COST_TCP ("alpha_us,GBps").
  status init() {
    CCLITE_TRY(parse("COST_SHM", shm_, env_shm_));
    CCLITE_TRY(parse("COST_TCP", tcp_, env_tcp_));
    return {};
  }

  /// A measured figure for `kind` (cost_measure.hpp); ignored for a kind set
  /// in the environment. Other kinds than shm are charged as tcp. Call
  /// set_link() afterwards to charge it.
  void set_measured(const std::string& kind, link_cost c) {
    const bool shm = kind == "shm";
    if (shm ? env_shm_ : env_tcp_) return;
    (shm ? shm_ : tcp_) = c;
    (shm ? measured_shm_ : measured_tcp_) = true;
  }
  /// The figures of a link kind, and where they came from: "env", "measured", "default".
  const link_cost& of(const std::string& kind) const { return kind == "shm" ? shm_ : tcp_; }
  const char* source(const std::string& kind) const {
    const bool shm = kind == "shm";
    return (shm ? env_shm_ : env_tcp_) ? "env" : (shm ? measured_shm_ : measured_tcp_) ? "measured" : "default";
  }

  /// The link kind collectives are charged for: "shm", "tcp" (or any other
  /// transport name, charged as tcp: the conservative choice).
  void set_link(const std::string& kind) { link_ = kind == "shm" ? shm_ : tcp_; }
CCLITE_SETUP_CODE_END
  const link_cost& link() const noexcept { return link_; }
  /// Reduction time per byte (us): one streaming pass reading two operands.
  double gamma() const noexcept { return gamma_; }

  // ---- allreduce, n ranks, `bytes` each, pieces of `chunk` bytes ---------------------
  double ring_allreduce(int n, double bytes, double chunk) const {
    const double rounds = std::ceil(bytes / n / chunk);
    const double frac = double(n - 1) / n;
    // The reduction is fused into the forward copy (primitives.hpp): no gamma.
    return (2.0 * (n - 1) + 2.0 * (rounds > 1 ? rounds - 1 : 0)) * link_.alpha_us +
           2.0 * frac * bytes * link_.beta_us_per_byte;
  }
  double rd_allreduce(int n, double bytes) const {
    const int lg = log2_floor(n);
    const bool folded = (1 << lg) != n;
    return (lg + (folded ? 2 : 0)) * (link_.alpha_us + bytes * link_.beta_us_per_byte) +
           (lg + (folded ? 1 : 0)) * bytes * gamma_;
  }
  double rhd_allreduce(int n, double bytes) const {
    const int lg = log2_floor(n), p = 1 << lg;
    const bool folded = p != n;
    const double frac = double(p - 1) / p;
    return (2.0 * lg + (folded ? 3 : 0)) * link_.alpha_us +
           (2.0 * frac + (folded ? 2 : 0)) * bytes * link_.beta_us_per_byte +
           (frac + (folded ? 1 : 0)) * bytes * gamma_;
  }
  // Two trees, half the data each; reduce then broadcast, pipelined in chunks.
  // An inner node receives from two children and sends up, then the reverse.
  double tree_allreduce(int n, double bytes, double chunk) const {
    const double rounds = std::ceil(bytes / 2 / chunk);
    return 2.0 * (log2_ceil(n) + rounds) * 2 * link_.alpha_us + 2.0 * bytes * link_.beta_us_per_byte +
           bytes * gamma_;
  }

  // Hierarchical: reduce-scatter and allgather over shm inside each node of
  // `local` ranks, allreduce of a 1/local shard across `nodes` over the link
  // charged (every local rank's shard at once, on its own connections).
  double hier_allreduce(int local, int nodes, double bytes, double chunk) const {
    const double frac = double(local - 1) / local;
    const double rounds = std::ceil(bytes / local / chunk);
    const double intra = 2.0 * ((local - 1) + (rounds > 1 ? rounds - 1 : 0)) * shm_.alpha_us +
                         2.0 * frac * bytes * shm_.beta_us_per_byte;
    return intra + ring_allreduce(nodes, bytes / local, chunk);
  }

  // shm-direct, for a message that fits one piece: two polled
  // synchronisations of all ranks (together about 1.1 FIFO hand-offs), then
  // per rank: its input copied into its shared buffer, 1/n of every rank's
  // buffer read and reduced, the whole result copied out: about (2 + 1/n)
  // memcpy passes over `bytes`, where beta (a FIFO hand-off: copy in, copy
  // out) is two. So at 2 ranks it costs more than the ring's single pass
  // (bench/algorithms.sh, session 3: 64 KiB ring 9.5, shm-direct 6.3 GB/s
  // busbw) and wins from 4 ranks, where the ring needs 2(n-1) hand-offs.
  // The selector offers it only up to one piece: beyond the caches the ring's
  // single streaming pass wins (docs/performance.md).
  double direct_allreduce(int n, double bytes) const {
    return 1.1 * shm_.alpha_us + (2.0 + 1.0 / n) * bytes * shm_.beta_us_per_byte / 2 + bytes * gamma_ / n;
  }

  // ---- broadcast / reduce from one root -------------------------------------------
  double chain_rooted(int n, double bytes, double chunk, bool reduces) const {
    const double rounds = std::ceil(bytes / chunk);
    return (n - 1 + rounds - 1) * link_.alpha_us + bytes * link_.beta_us_per_byte + (reduces ? bytes * gamma_ : 0);
  }
  double tree_rooted(int n, double bytes, double chunk, bool reduces) const {
    const double rounds = std::ceil(bytes / chunk);
    return 2.0 * (log2_ceil(n) + rounds - 1) * link_.alpha_us + 2.0 * bytes * link_.beta_us_per_byte +
           (reduces ? 2.0 * bytes * gamma_ : 0);
  }

  static int log2_floor(int n) {
    int l = 0;
    while ((2 << l) <= n) ++l;
    return l;
  }
  static int log2_ceil(int n) {
    int l = 0;
    while ((1 << l) < n) ++l;
    return l;
  }

 private:
CCLITE_SETUP_CODE_BEGIN
  static status parse(const char* name, link_cost& out, bool& set) {
    const std::string v = env::get_string(name, "", false);
    set = false;
    if (v.empty()) return {};
    char* end = nullptr;
    const double a = std::strtod(v.c_str(), &end);
    double g = 0;
    if (end && *end == ',') g = std::strtod(end + 1, &end);
    if (!end || *end != '\0' || !(a >= 0) || !(g > 0)) {
      return make_error(errc::invalid_argument,
                        "CCLITE_%s='%s': expected \"alpha_us,GBps\", e.g. \"25,1.5\"", name, v.c_str());
    }
    out = link_cost::from(a, g);
    set = true;
    return {};
  }
CCLITE_SETUP_CODE_END

  link_cost shm_ = link_cost::from(1.0, 5.0);
  link_cost tcp_ = link_cost::from(30.0, 1.6);
  link_cost link_ = shm_;
  bool env_shm_ = false, env_tcp_ = false, measured_shm_ = false, measured_tcp_ = false;
  double gamma_ = 1.0 / 8000.0;  // 8 GB/s: a two-operand reduction pass on one core
};

}  // namespace cclite
