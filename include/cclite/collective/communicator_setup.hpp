// cclite/collective/communicator_setup.hpp - how a communicator is made:
// create(), split(), dup(), shrink() and the children that share its links.
//
// Definitions of communicator<Transports...>'s set-up members; their
// documentation is with the declarations in communicator.hpp, which includes
// this header at its end (including this one first works too). A split()
// child and the hierarchical algorithm's children (comm_dispatch.hpp) come
// from make_child(), over the parent's links (link_pool.hpp); dup() and
// shrink() meet the others through the store and connect afresh, as create().
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cclite/collective/communicator.hpp>
#include <cclite/collective/link_pool.hpp>
#include <cclite/collective/trace_signal.hpp>
#include <cclite/config.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/dtype.hpp>
#include <cclite/core/env.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

template <class... Transports>
inline auto communicator<Transports...>::create(store& kv, int rank, int size, comm_options opts)
    -> result<std::unique_ptr<communicator>> {
  if (size < 1 || rank < 0 || rank >= size) {
    return make_error(errc::invalid_argument, "communicator: rank %d / size %d is invalid", rank,
                      size);
  }
  std::unique_ptr<communicator> c(new communicator(kv, rank, size));
  CCLITE_TRY(c->core::init(std::move(opts)));
  CCLITE_TRY(c->finish_init());
  return {std::move(c)};  // nvcc: no implicit move into result<T> (CWG1579)
}

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
template <class... Transports>
inline auto communicator<Transports...>::split(int color, int key, comm_options opts)
    -> result<std::unique_ptr<communicator>> {
  if (group_.open()) {  // its allgather would only be recorded
    return make_error(errc::invalid_argument, "split() inside group_start() .. group_end(): call it after "
                      "group_end()");
  }
  std::int64_t mine[2] = {color < 0 ? -1 : color, key};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size_));
  CCLITE_TRY(allgather(mine, all.data(), 2, dtype::int64));
  const int split_no = ++splits_;
  if (color < 0) return std::unique_ptr<communicator>();
  std::vector<std::pair<std::int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < size_; ++r)
    if (all[2 * static_cast<std::size_t>(r)] == color) members.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& m : members) ranks.push_back(m.second);
  const std::string where = "split" + std::to_string(split_no) + "/" + std::to_string(color);
  // The child connects through the shared links: not while another thread
  // runs a collective of this family over them.
  std::unique_lock<std::mutex> hold(pool_->busy, std::defer_lock);
  CCLITE_TRY(hold_links(hold, deadline::after(timeout())));
  return make_child(ranks, where, std::move(opts), false);
}

template <class... Transports>
inline auto communicator<Transports...>::dup(comm_options opts) -> result<std::unique_ptr<communicator>> {
  if (opts.timeout.count() == -2) opts.timeout = timeout();
  if (!opts.chunk_bytes) opts.chunk_bytes = chunk_bytes_;
  opts.store_prefix = prefix_ + "dup" + std::to_string(++dups_);
  return create(core::user_kv_, rank_, size_, std::move(opts));
}

template <class... Transports>
inline auto communicator<Transports...>::shrink(std::vector<int> exclude, comm_options opts)
    -> result<std::unique_ptr<communicator>> {
  std::sort(exclude.begin(), exclude.end());
  exclude.erase(std::unique(exclude.begin(), exclude.end()), exclude.end());
  std::string list;
  for (int r : exclude) {
    if (r < 0 || r >= size_) return make_error(errc::invalid_argument, "shrink: rank %d out of range [0, %d)", r, size_);
    if (r == rank_) return make_error(errc::invalid_argument, "shrink: rank %d excludes itself", r);
    list += (list.empty() ? "" : ".") + std::to_string(r);
  }
  const int new_size = size_ - static_cast<int>(exclude.size());
  const int new_rank = rank_ - static_cast<int>(std::lower_bound(exclude.begin(), exclude.end(), rank_) - exclude.begin());
  // The list is part of the meeting place, so ranks that disagree do not mix.
  opts.store_prefix = prefix_ + "shrink" + std::to_string(++shrinks_) + "-" + (list.empty() ? "none" : list);
  return create(core::user_kv_, new_rank, new_size, std::move(opts));
}

template <class... Transports>
inline status communicator<Transports...>::finish_init() {
  auto piece = env::get_int("SHM_DIRECT_BUFFSIZE", 1 << 20, false);
  if (!piece) return piece.error();
  direct_bytes_ = static_cast<std::size_t>(std::max<std::int64_t>(4096, piece.value()));
  auto small = env::get_int("SHM_SMALL_MAX", static_cast<std::int64_t>(small_direct_max), false);
  if (!small) return small.error();
  if (small.value() < 0 || small.value() > static_cast<std::int64_t>(small_direct_max))
    return make_error(errc::invalid_argument, "CCLITE_SHM_SMALL_MAX=%lld is out of range (0 .. %zu bytes; 0 turns "
                      "shm-direct's small path off)", static_cast<long long>(small.value()), small_direct_max);
  select_.set_direct(has_direct, direct_bytes_, static_cast<std::size_t>(small.value()));
  auto kept = detail::trace_capacity();
  if (!kept) return kept.error();
  std::string name = prefix_;
  if (!name.empty() && name.back() == '/') name.pop_back();
  this->trace_.enable(kept.value(), std::move(name), this->comm_id_, rank_, size_);
  if (kept.value() > 0) {
    this->trace_.watch_queue(&queue_);
    CCLITE_TRY(detail::arm_trace_signal(rank_, this->log_));
  }
  return {};
}

// A child over this family's links: `ranks` = its members as ranks here,
// in their new order; `where` names it under this communicator's prefix.
// `nested`: used only from inside this communicator's own calls (the
// hierarchical algorithm's children), which already hold the links.
template <class... Transports>
inline auto communicator<Transports...>::make_child(const std::vector<int>& ranks, const std::string& where,
                                                    comm_options opts, bool nested)
    -> result<std::unique_ptr<communicator>> {
  int new_rank = -1;
  std::vector<int> roots;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    roots.push_back(root_of_[static_cast<std::size_t>(ranks[i])]);
    if (ranks[i] == rank_) new_rank = static_cast<int>(i);
  }
  if (new_rank < 0) return make_error(errc::invalid_argument, "communicator: this rank is not a member of %s", where.c_str());
  if (opts.timeout.count() == -2) opts.timeout = timeout();
  if (!opts.chunk_bytes) opts.chunk_bytes = chunk_bytes_;
  std::unique_ptr<communicator> c(new communicator(pool_, std::move(roots), new_rank));
  c->nested_ = nested;
  if (nested) c->log_.set_rank(static_cast<int>(c->root(new_rank)));  // its lines, like its calls, say the family's rank
  std::string tag = tag_ + "." + where;
  for (char& ch : tag)
    if (ch == '/') ch = '.';
  CCLITE_TRY(c->core::init_child(std::move(opts), prefix_ + where + "/", std::move(tag)));
  CCLITE_TRY(c->finish_init());
  return {std::move(c)};  // nvcc: no implicit move into result<T> (CWG1579)
}
CCLITE_SETUP_CODE_END

}  // namespace cclite
