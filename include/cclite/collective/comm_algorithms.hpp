// cclite/collective/comm_algorithms.hpp - running each algorithm over a communicator's links.
//
// The layer between comm_checks (ranks, topology, links, cross-rank checks;
// collective/comm_core.hpp, comm_checks.hpp) and communicator
// (collective/communicator.hpp): each run_* takes a
// collective's buffers, connects the links its schedule needs (ensure_links,
// in a deadlock-free pair order) and runs the type-free schedule of
// algorithm/ over primitives on those links. Scratch buffers belong to the
// communicator and are sized at init, so automatic choices do not allocate.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include <cclite/algorithm/halving_doubling.hpp>
#include <cclite/algorithm/p2p_envelope.hpp>
#include <cclite/algorithm/p2p_group.hpp>
#include <cclite/algorithm/recursive_doubling.hpp>
#include <cclite/algorithm/ring_gather.hpp>
#include <cclite/algorithm/scan.hpp>
#include <cclite/algorithm/tree.hpp>
#include <cclite/collective/comm_checks.hpp>
#include <cclite/transport/any_link.hpp>

namespace cclite::detail {

template <class... Transports>
class comm_algorithms : public comm_checks<Transports...> {
 protected:
  using base = comm_checks<Transports...>;
  using base::base;
  using base::rank_; using base::size_; using base::topo_; using base::chunk_bytes_; using base::scratch_;
  using base::scratch_len_; using base::scratch_off_; using base::scratch_peers_;
  using base::with_links; using base::ensure_links; using base::local_copy; using base::exchange_with;

  // Allgather and allgatherv: own block into place, then the ring moves the rest.
  status run_allgather(const op_desc& d, const std::uint8_t* send, std::uint8_t* recv, std::size_t elem,
                       deadline until) {
    const int n = size_;
    std::vector<std::size_t>& len = scratch_len_;
    std::vector<std::size_t>& off = scratch_off_;
    len.resize(static_cast<std::size_t>(n));  // no allocation after the first call
    off.resize(static_cast<std::size_t>(n));
    std::size_t max_len = 0;
    for (int r = 0; r < n; ++r) {
      const std::size_t i = static_cast<std::size_t>(r);
      len[i] = d.counts ? d.counts[i] : d.count;
      off[i] = d.displs ? d.displs[i] : i * d.count;
      max_len = std::max(max_len, len[i]);
    }
    const std::size_t me = static_cast<std::size_t>(rank_);
    if (d.counts && d.count != len[me]) {
      return make_error(errc::invalid_argument, "allgatherv: send count %zu differs from counts[%d] = %zu",
                        d.count, rank_, len[me]);
    }
    CCLITE_TRY(local_copy(send, recv + off[me] * elem, len[me] * elem));
    if (n == 1) return {};
    const ring_blocks b{topo_.ring().data(), len.data(), off.data(), max_len};
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes_ / elem);
    return with_links(topo_.ring_prev(rank_), topo_.ring_next(rank_), elem, nullptr, until, [&](auto& pr) {
      return ring_allgather(pr, recv, elem, n, topo_.ring_position(rank_), b, chunk, send != recv + off[me] * elem);
    });
  }

  // reduce_scatterv around the ring: rank r's block is counts[r] elements
  // right after the blocks of the ranks before it (MPI_Reduce_scatter's
  // layout). reduce_scatter's equal blocks go straight to ring_reduce_scatter.
  status run_reduce_scatterv(const op_desc& d, const std::uint8_t* send, std::uint8_t* recv, std::size_t elem,
                             const reduction& red, deadline until) {
    const int n = size_;
    std::vector<std::size_t>& len = scratch_len_;
    std::vector<std::size_t>& off = scratch_off_;
    len.resize(static_cast<std::size_t>(n));  // no allocation after the first call
    off.resize(static_cast<std::size_t>(n));
    std::size_t max_len = 0, at = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
      len[r] = d.counts[r];
      off[r] = at;
      at += len[r];
      max_len = std::max(max_len, len[r]);
    }
    const ring_blocks b{topo_.ring().data(), len.data(), off.data(), max_len};
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes_ / elem);
    if (n == 1) return local_copy(send, recv, len[0] * elem);
    return with_links(topo_.ring_prev(rank_), topo_.ring_next(rank_), elem, &red, until, [&](auto& pr) {
      return ring_reduce_scatter(pr, send, recv, b, elem, red, n, topo_.ring_position(rank_), rank_, chunk);
    });
  }

  // Scan and exscan (algorithm/scan.hpp): the chain in rank order, over the
  // links to rank - 1 and rank + 1 (the ring's, when the ring is in rank
  // order), or recursive doubling (`rd`) with rank ^ 2^k.
  status run_scan(bool exclusive, bool rd, const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                  const reduction& red, deadline until) {
    const std::size_t bytes = count * red.elem_size;
    int peers[64];
    int m = 0;
    if (rd) {
      m = recursive_doubling_scan_peers(rank_, size_, peers);
    } else {
      if (rank_ > 0) peers[m++] = rank_ - 1;
      if (rank_ + 1 < size_) peers[m++] = rank_ + 1;
    }
    CCLITE_TRY(this->agree_before_connecting(rd ? base::site_scan_rd : base::site_chain, -1, until));
    CCLITE_TRY(ensure_links(peers, m, until));
    if (rd) {
      if (scratch_.size() < 2 * bytes) scratch_.resize(2 * bytes);  // once per size class
      std::uint8_t* total = scratch_.data();
      CCLITE_TRY(local_copy(send, total, bytes));
      if (!exclusive) CCLITE_TRY(local_copy(send, recv, bytes));
      CCLITE_TRY(recursive_doubling_scan(recv, total, total + bytes, count, red, rank_, size_, exclusive,
                                         [&](int peer, const std::uint8_t* o, std::size_t ob, std::uint8_t* in,
                                             std::size_t ib) {
                                           return exchange_with(peer, o, ob, in, ib, red.elem_size, until);
                                         }));
    } else {
      if (!exclusive && rank_ == 0) CCLITE_TRY(local_copy(send, recv, bytes));
      CCLITE_TRY(with_links(peers[0], peers[m - 1], red.elem_size, &red, until, [&](auto& pr) {
        return chain_scan(pr, send, recv, bytes, rank_, size_, exclusive);
      }));
    }
    // avg: both algorithms carried sums; each rank divides its own prefix.
    const int members = exclusive ? rank_ : rank_ + 1;
    if (red.needs_divide && members > 0) red.divide(recv, count, members);
    return {};
  }

  // Recursive doubling on `recv` (send copied in first), exchanging with each
  // partner over a direct link.
  status run_rd_allreduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                          const reduction& red, deadline until) {
    const std::size_t bytes = count * red.elem_size;
    CCLITE_TRY(local_copy(send, recv, bytes));
    if (scratch_.size() < bytes) scratch_.resize(bytes);  // only when rd is forced on large data
    int peers[64];
    const int m = recursive_doubling_peers(rank_, size_, peers);
    CCLITE_TRY(this->agree_before_connecting(base::site_rd, -1, until));
    CCLITE_TRY(ensure_links(peers, m, until));
    auto exchange = [&](int peer, const std::uint8_t* out, std::size_t ob, std::uint8_t* in, std::size_t ib) {
      return with_links(peer, peer, red.elem_size, nullptr, until, [&](auto& pr) -> status {
        pr.will_finish();  // the end pad leaves with the data (primitives.hpp)
        CCLITE_TRY(pr.sendrecv(out, ob, in, ib));
        return pr.finish();
      });
    };
    return recursive_doubling_allreduce(recv, scratch_.data(), count, red, rank_, size_, exchange);
  }

  // Rabenseifner's reduce-scatter + allgather on `recv` (send copied in first).
  status run_hd_allreduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                          const reduction& red, deadline until) {
    CCLITE_TRY(local_copy(send, recv, count * red.elem_size));
    const std::size_t need = halving_doubling_scratch(count, size_) * red.elem_size;
    if (scratch_.size() < need) scratch_.resize(need);  // sized at init for the automatic range
    int peers[64];
    const int m = halving_doubling_peers(rank_, size_, peers);
    CCLITE_TRY(this->agree_before_connecting(base::site_rhd, -1, until));
    CCLITE_TRY(ensure_links(peers, m, until));
    auto exchange = [&](int peer, const std::uint8_t* out, std::size_t ob, std::uint8_t* in, std::size_t ib) {
      return exchange_with(peer, out, ob, in, ib, red.elem_size, until);
    };
    return halving_doubling_allreduce(recv, scratch_.data(), count, red, rank_, size_, exchange);
  }

  // The tree algorithms work on ring positions (node by node), so most tree
  // edges stay inside a node; `root_pos` rotates a rooted tree onto the root.
  template <class F>
  status with_tree_peers(int root_pos, std::size_t elem, deadline until, bool both_trees, F&& fn) {
    const int n = size_;
    const int me = (topo_.ring_position(rank_) - root_pos + n) % n;
    auto rank_at = [&](int tpos) { return topo_.ring()[static_cast<std::size_t>((tpos + root_pos) % n)]; };
    int tp[6], peers[6];
    int m = 0;
    if (both_trees) {
      m = double_tree_peers(me, n, tp);
    } else {
      tree_node t = bit_tree(me, n);
      for (int p : {t.parent, t.child[0], t.child[1]})
        if (p >= 0) tp[m++] = p;
    }
    for (int i = 0; i < m; ++i) peers[i] = rank_at(tp[i]);
    CCLITE_TRY(this->agree_before_connecting(both_trees ? base::site_tree : base::site_tree_rooted,
                                             both_trees ? -1 : root_pos, until));
    CCLITE_TRY(ensure_links(peers, m, until));
    auto send = [&](int tpos, const std::uint8_t* src, std::size_t b) {
      return exchange_with(rank_at(tpos), src, b, nullptr, 0, elem, until);
    };
    auto recv = [&](int tpos, std::uint8_t* dst, std::size_t b) {
      return exchange_with(rank_at(tpos), nullptr, 0, dst, b, elem, until);
    };
    return fn(me, send, recv);
  }

  // Tree pieces stay well inside a link buffer (see fit_chunk_to_buffers).
  std::size_t tree_chunk_elems(std::size_t elem) const { return std::max<std::size_t>(1, chunk_bytes_ / elem); }

  status run_tree_allreduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count,
                            const reduction& red, deadline until) {
    CCLITE_TRY(local_copy(send, recv, count * red.elem_size));
    const std::size_t chunk = tree_chunk_elems(red.elem_size);
    if (scratch_.size() < chunk * red.elem_size) scratch_.resize(chunk * red.elem_size);
    return with_tree_peers(0, red.elem_size, until, true, [&](int me, auto& snd, auto& rcv) {
      return double_tree_allreduce(recv, scratch_.data(), count, red, me, size_, chunk, snd, rcv);
    });
  }

  status run_tree_broadcast(std::uint8_t* data, std::size_t bytes, int root, std::size_t elem, deadline until) {
    const std::size_t chunk = tree_chunk_elems(elem) * elem;
    return with_tree_peers(topo_.ring_position(root), elem, until, false, [&](int me, auto& snd, auto& rcv) {
      return tree_broadcast(data, bytes, me, size_, chunk, snd, rcv);
    });
  }

  status run_tree_reduce(const std::uint8_t* send, std::uint8_t* recv, std::size_t count, int root,
                         const reduction& red, deadline until) {
    const std::size_t chunk = tree_chunk_elems(red.elem_size);
    if (scratch_.size() < 2 * chunk * red.elem_size) scratch_.resize(2 * chunk * red.elem_size);
    return with_tree_peers(topo_.ring_position(root), red.elem_size, until, false, [&](int me, auto& snd, auto& rcv) {
      return tree_reduce(send, recv, scratch_.data(), count, red, me, size_, chunk, snd, rcv);
    });
  }

  // Gather / scatter (and gatherv / scatterv) straight between the root and
  // each rank, in rank order. The v-variants' sizes differ per rank, so each
  // message carries an envelope with its count (algorithm/p2p_envelope.hpp),
  // checked by its receiver before any data is taken: a rank whose count
  // differs from the root's counts[r] is a mismatch naming both, never bytes
  // read into the wrong place (the call header cannot hold per-rank counts).
  status run_rooted_direct(const op_desc& d, const std::uint8_t* send, std::uint8_t* recv, std::size_t bytes,
                           std::size_t elem, deadline until) {
    const bool gather = d.kind == collective_kind::gather || d.kind == collective_kind::gatherv;
    const bool v = d.kind == collective_kind::gatherv || d.kind == collective_kind::scatterv;
    const bool envelopes = v && this->check_mismatch_;
    if (!v) {  // the v-variants checked these when called (op.hpp)
      if (bytes && (gather ? !send : !recv)) return make_error(errc::invalid_argument, "%s: null buffer", to_string(d.kind));
      if (bytes && rank_ == d.root && (gather ? !recv : !send))
        return make_error(errc::invalid_argument, "%s: null buffer on the root", to_string(d.kind));
    }
    CCLITE_TRY(this->agree_before_connecting(base::site_rooted_direct, d.root, until));
    std::uint8_t env[p2p_envelope::wire_bytes];
    if (rank_ != d.root) {
      CCLITE_TRY(ensure_links(&d.root, 1, until));
      return with_links(d.root, d.root, elem, nullptr, until, [&](auto& pr) -> status {
        if (gather) {
          if (envelopes) p2p_envelope::encode(env, d.type, d.count);
          CCLITE_TRY(pr.send_prefixed(env, envelopes ? sizeof env : 0, send, bytes));
        } else {
          if (envelopes) {
            CCLITE_TRY(pr.recv(env, sizeof env));
            CCLITE_TRY(check_v_count(d, env, d.root, d.count));
          }
          CCLITE_TRY(pr.recv(recv, bytes));
        }
        return pr.finish();
      });
    }
    const std::size_t me = static_cast<std::size_t>(rank_);
    auto count_of = [&](std::size_t r) { return v ? d.counts[r] : d.count; };
    auto at_of = [&](std::size_t r) { return (v ? d.displs[r] : r * d.count) * elem; };
    if (gather) CCLITE_TRY(local_copy(send, recv + at_of(me), bytes));
    else CCLITE_TRY(local_copy(send + at_of(me), recv, bytes));
    std::vector<int>& all = scratch_peers_;
    all.resize(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) all[static_cast<std::size_t>(r)] = r;
    CCLITE_TRY(ensure_links(all.data(), size_, until));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::size_t ur = static_cast<std::size_t>(r), count = count_of(ur), at = at_of(ur);
      CCLITE_TRY(with_links(r, r, elem, nullptr, until, [&](auto& pr) -> status {
        if (gather) {
          if (envelopes) {
            CCLITE_TRY(pr.recv(env, sizeof env));
            CCLITE_TRY(check_v_count(d, env, r, count));
          }
          CCLITE_TRY(pr.recv(recv + at, count * elem));
        } else {
          if (envelopes) p2p_envelope::encode(env, d.type, count);
          CCLITE_TRY(pr.send_prefixed(env, envelopes ? sizeof env : 0, send + at, count * elem));
        }
        return pr.finish();
      }));
    }
    return {};
  }

  // The envelope `env` of a gatherv / scatterv / alltoallv message from
  // `peer` against the `count` this rank expects from it (same dtype: the
  // call header said).
  status check_v_count(const op_desc& d, const std::uint8_t* env, int peer, std::size_t count) {
    if (p2p_envelope::check(env, d.type, count, peer).ok()) return {};
    return v_count_mismatch(d, env, peer, count);
  }
CCLITE_SETUP_CODE_BEGIN  // an error message: compiled for size (config.hpp)
  [[gnu::noinline]] status v_count_mismatch(const op_desc& d, const std::uint8_t* env, int peer,
                                            std::size_t count) const {
    const bool gather = d.kind == collective_kind::gatherv;
    const unsigned long long theirs = get_le(env + 8, 8);
    if (static_cast<std::uint32_t>(get_le(env, 4)) != p2p_envelope::magic_value)
      return make_error(errc::mismatch, "what came from rank %d is not its message's envelope "
                        "(CCLITE_CHECK_MISMATCH must be the same on every rank)", peer);
    if (d.kind == collective_kind::alltoallv) {
      const bool in_place = d.send && d.send == d.recv;
      return make_error(errc::mismatch, "rank %d sends %llu x %s to this rank but this rank's recv_counts[%d] is %zu; "
                        "%s", peer, theirs, to_string(d.type), peer, count, in_place
                        ? "in place, recv_counts[j] on rank i must equal recv_counts[i] on rank j (MPI_IN_PLACE)"
                        : "send_counts[j] on rank i must equal recv_counts[i] on rank j");
    }
    if (gather)
      return make_error(errc::mismatch, "rank %d sends %llu x %s but the root's recv_counts[%d] is %zu; the root's "
                        "counts must equal each rank's send_count", peer, theirs, to_string(d.type), peer, count);
    return make_error(errc::mismatch, "the root (rank %d) sends %llu x %s to this rank (send_counts[%d]) but its "
                      "recv_count is %zu; the root's counts must equal each rank's recv_count", peer, theirs,
                      to_string(d.type), rank_, count);
  }
CCLITE_SETUP_CODE_END

  // Pairwise exchange: in step k send to rank+k and receive from rank-k, both
  // at once; n-1 steps, each rank sends (n-1)/n of its buffer. In place
  // (send == recv, MPI_IN_PLACE): run_alltoall_in_place.
  status run_alltoall(const op_desc& d, const std::uint8_t* send, std::uint8_t* recv, std::size_t elem,
                      deadline until) {
    const int n = size_;
    const bool in_place = send && send == recv;
    auto scount = [&](int r) { return in_place ? rcount_of(d, r) : d.counts ? d.counts[r] : d.count; };
    auto sdispl = [&](int r) { return in_place ? rdispl_of(d, r) : d.displs ? d.displs[r] : static_cast<std::size_t>(r) * d.count; };
    auto rcount = [&](int r) { return rcount_of(d, r); };
    auto rdispl = [&](int r) { return rdispl_of(d, r); };
    if (scount(rank_) != rcount(rank_)) {
      return make_error(errc::invalid_argument, "alltoallv: send_counts[%d] = %zu but recv_counts[%d] = %zu",
                        rank_, scount(rank_), rank_, rcount(rank_));
    }
    CCLITE_TRY(local_copy(send + sdispl(rank_) * elem, recv + rdispl(rank_) * elem, scount(rank_) * elem));
    if (n == 1) return {};
    std::vector<int>& all = scratch_peers_;
    all.resize(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
    CCLITE_TRY(this->agree_before_connecting(base::site_alltoall, -1, until));
    CCLITE_TRY(ensure_links(all.data(), n, until));
    if (in_place) return run_alltoall_in_place(d, recv, elem, until);
    // Outputs larger than the cache: non-temporal stores, as the rings
    // (primitives.hpp; 2 ranks, 4 alternated pairs: 16 MiB +10 %, 32-64 MiB +3-4 %).
    std::size_t total = 0;
    for (int r = 0; r < n; ++r) total += rcount(r) * elem;
    const bool stream = total >= ring_stream_output_min_bytes;
    // alltoallv's per-pair counts: an envelope ahead of each message, as
    // gatherv's (run_rooted_direct), checked before any data is taken.
    const bool envelopes = d.kind == collective_kind::alltoallv && this->check_mismatch_;
    for (int k = 1; k < n; ++k) {
      const int to = (rank_ + k) % n, from = (rank_ - k + n) % n;
      const std::uint8_t* out = send + sdispl(to) * elem;
      std::uint8_t* in = recv + rdispl(from) * elem;
      const std::size_t ob = scount(to) * elem, ib = rcount(from) * elem;
      CCLITE_TRY(with_links(from, to, elem, nullptr, until, [&](auto& pr) -> status {
        pr.stream_output(stream, stream);
        if (!envelopes) {
          pr.will_finish();
          CCLITE_TRY(pr.sendrecv(out, ob, in, ib));
          return pr.finish();
        }
        std::uint8_t oenv[p2p_envelope::wire_bytes], ienv[p2p_envelope::wire_bytes];
        p2p_envelope::encode(oenv, d.type, scount(to));
        if (sizeof oenv + ob <= chunk_bytes_) {  // ours fits the link buffer: out at once, one trip
          pr.will_finish();
          CCLITE_TRY(pr.send_prefixed(oenv, sizeof oenv, out, ob));
          CCLITE_TRY(pr.recv(ienv, sizeof ienv));
          CCLITE_TRY(check_v_count(d, ienv, from, rcount(from)));
          CCLITE_TRY(pr.recv(in, ib));
        } else {  // envelopes both ways first, then the data both ways at once
          CCLITE_TRY(pr.sendrecv(oenv, sizeof oenv, ienv, sizeof ienv));
          CCLITE_TRY(check_v_count(d, ienv, from, rcount(from)));
          pr.will_finish();
          CCLITE_TRY(pr.sendrecv(out, ob, in, ib));
        }
        return pr.finish();
      }));
    }
    return {};
  }
  // A group of sends and receives (communicator::group_start()): connects
  // every peer of the group (each rank asks for its own set; the pair order
  // of ensure_links keeps that deadlock-free), then moves all of them at once.
  status run_group(const op_desc& d, deadline until) {
    std::vector<int>& peers = scratch_peers_;
    peers.clear();
    for (std::size_t i = 0; i < d.count; ++i)
      if (d.transfers[i].peer != rank_) peers.push_back(d.transfers[i].peer);
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    CCLITE_TRY(ensure_links(peers.data(), static_cast<int>(peers.size()), until));
    using L = any_link<typename base::link>;
    return run_p2p_group(d.transfers, d.count, rank_, [&](int p) { return L(this->link_at(p)); }, until,
                         group_steps_, this->check_mismatch_);
  }

  static std::size_t rcount_of(const op_desc& d, int r) { return d.rcounts ? d.rcounts[r] : d.count; }
  static std::size_t rdispl_of(const op_desc& d, int r) {
    return d.rdispls ? d.rdispls[r] : static_cast<std::size_t>(r) * d.count;
  }

  // In-place alltoall: block p of `buf` goes to p and is replaced by p's block
  // for us, so each step swaps one block with one partner (a round-robin
  // tournament: n-1 rounds for even n, n rounds with one rank idle for odd n).
  // The outgoing piece is copied to the communicator's scratch first, at most
  // scratch_.size() bytes at a time: no allocation per call. alltoallv in
  // place (MPI's rule) uses the recv counts both ways, which must then be
  // symmetric: recv_counts[p] here = recv_counts[me] on p.
  status run_alltoall_in_place(const op_desc& d, std::uint8_t* buf, std::size_t elem, deadline until) {
    const int n = size_;
    const int m = n % 2 ? n : n - 1;  // odd: the circle of m ranks; even: rank n-1 sits in its middle
    const std::size_t piece = std::max<std::size_t>(elem, scratch_.size() / elem * elem);
    for (int k = 0; k < m; ++k) {
      int p;
      if (rank_ < m) {
        p = ((k - rank_) % m + m) % m;
        if (p == rank_) p = n % 2 ? -1 : n - 1;  // odd n: a bye this round
      } else {
        p = static_cast<int>((static_cast<std::int64_t>(k) * (n / 2)) % m);  // 2p = k (mod m)
      }
      if (p < 0) continue;
      std::uint8_t* block = buf + rdispl_of(d, p) * elem;
      const std::size_t bytes = rcount_of(d, p) * elem;
      if (d.kind == collective_kind::alltoallv && this->check_mismatch_) {  // the pair's counts first
        std::uint8_t oenv[p2p_envelope::wire_bytes], ienv[p2p_envelope::wire_bytes];
        p2p_envelope::encode(oenv, d.type, rcount_of(d, p));
        CCLITE_TRY(exchange_with(p, oenv, sizeof oenv, ienv, sizeof ienv, elem, until));
        CCLITE_TRY(check_v_count(d, ienv, p, rcount_of(d, p)));
      }
      for (std::size_t at = 0; at < bytes; at += piece) {
        const std::size_t b = std::min(piece, bytes - at);
        std::memcpy(scratch_.data(), block + at, b);
        CCLITE_TRY(exchange_with(p, scratch_.data(), b, block + at, b, elem, until));
      }
    }
    return {};
  }

  std::vector<group_step> group_steps_;  // run_group's scratch: reused, a steady stream of groups does not allocate
};

}  // namespace cclite::detail
