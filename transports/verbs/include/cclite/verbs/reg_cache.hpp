// cclite/verbs/reg_cache.hpp - a registration cache for user buffers (as NCCL's
// net_ib and UCX's rcache keep): registering memory with the NIC (pinning
// pages, building translation tables) costs tens of microseconds per call, so a
// buffer used again and again is registered once.
//
//   find_or_register(addr, len)  a handle (RAII, reference-counted) on a
//       registration covering [addr, addr + len): an entry that covers it (a
//       hit: no registrar call, no allocation), else a new registration of the
//       page-aligned range (start rounded down, end up, to the page size).
//   invalidate(addr, len)        drops the entries overlapping a range the
//       application freed.
//
// Policies:
// - Merging: a new registration swallows the cached entries it overlaps or
//   touches (the union is one contiguous range of pages each registered before,
//   so mapped), unless the union would exceed the byte limit; then only the
//   requested pages are registered and the overlapping entries are dropped.
//   Cached entries never overlap, so a lookup is one binary search.
// - Limits: at most `max_entries` entries and `max_bytes` registered bytes
//   (CCLITE_IB_REG_CACHE_MAX_MB, default 1024). Over a limit, the least
//   recently used entries that no handle holds are deregistered (evictions).
//   An entry a handle holds (an in-flight transfer) is never deregistered.
// - When everything is held, or one request is larger than `max_bytes`, the
//   request is registered *uncached*: the handle owns that registration and
//   deregisters it when released (stats().uncached counts them). Not an error.
// - max_bytes 0 (CCLITE_IB_REG_CACHE_MAX_MB=0) or max_entries 0: caching off,
//   every request is registered uncached (register per use, release after).
// - Dropping an entry a handle still holds (merge, invalidate) takes it out
//   of the lookup at once and deregisters it when the last handle goes.
//
// Freed memory: we do NOT hook munmap/free/brk (NCCL and UCX install memory
// hooks for this; cclite has no global state to hang them on). An application
// that frees a buffer and may get the same addresses back for another one must
// call invalidate() on the freed range first, or run with
// CCLITE_IB_REG_CACHE_MAX_MB=0; otherwise a hit returns a registration of the
// old pages and RDMA moves the wrong memory.
//
// Memory: the entry slots and the sorted index are allocated in the
// constructor (max_entries each) and never grow, so handles can name slots by
// number, and a hit (binary search, counter updates) allocates nothing. A miss
// scans the slots for the LRU victim: O(max_entries), negligible beside the
// registration itself.
//
// Registrar (the policy; ibv_registrar in registrar.hpp is the real one):
//   result<mem_registration> reg(std::uintptr_t base, std::size_t length);
//       registers [base, base + length), page-aligned; fills lkey, rkey, token.
//   void dereg(const mem_registration& r) noexcept;
//
// Thread safety: none; one thread at a time per cache (as for links). Handles
// must be released before the cache is destroyed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include <cclite/core/status.hpp>
#include <cclite/verbs/config.hpp>
#include <cclite/verbs/registrar.hpp>

namespace cclite::verbs {

/// Bounds of a reg_cache.
struct reg_cache_limits {
  std::size_t max_entries = 256;
  std::size_t max_bytes = std::size_t(1024) << 20;  ///< 0: caching off
  std::size_t page_size = 0;                        ///< 0: system_page_size(); else a power of two
  bool merge = true;                                ///< merge overlapping / adjacent ranges

  bool enabled() const noexcept { return max_entries > 0 && max_bytes > 0; }

  static reg_cache_limits from_config(const ib_config& c) {
    reg_cache_limits l;
    l.max_bytes = c.reg_cache_max_mb << 20;
    return l;
  }
  /// From CCLITE_IB_REG_CACHE_MAX_MB. Errors: invalid_argument naming it.
  static result<reg_cache_limits> from_env() {
    auto mb = ib_config::reg_cache_max_mb_from_env();
    if (!mb) return mb.error();
    reg_cache_limits l;
    l.max_bytes = mb.value() << 20;
    return l;
  }
};

/// Counters of a reg_cache.
struct reg_cache_stats {
  std::uint64_t hits = 0;             ///< requests served by a cached entry
  std::uint64_t misses = 0;           ///< requests that registered (cached or not)
  std::uint64_t registrations = 0;    ///< registrar reg() calls that succeeded
  std::uint64_t deregistrations = 0;  ///< registrar dereg() calls
  std::uint64_t evictions = 0;        ///< entries dropped for the limits (LRU)
  std::uint64_t merged = 0;           ///< entries swallowed by a larger registration
  std::uint64_t invalidated = 0;      ///< entries dropped by invalidate()
  std::uint64_t uncached = 0;         ///< registrations made for one use only
  std::size_t entries = 0;            ///< cached entries now
  std::size_t bytes_registered = 0;   ///< bytes registered by the cache now (cached + held)
  std::size_t peak_bytes = 0;         ///< largest bytes_registered seen
};

/// The cache. See the file comment. Not copyable or movable (handles point at it).
template <class Registrar>
class reg_cache {
  static constexpr std::uint32_t no_slot = 0xffffffffu;

 public:
  /// A registration held for one use: the entry is not evicted while a handle
  /// holds it. Move-only; releases on destruction.
  class handle {
   public:
    handle() = default;
    handle(handle&& o) noexcept : cache_(o.cache_), slot_(o.slot_), reg_(o.reg_) { o.cache_ = nullptr; }
    handle& operator=(handle&& o) noexcept {
      if (this != &o) {
        release();
        cache_ = o.cache_;
        slot_ = o.slot_;
        reg_ = o.reg_;
        o.cache_ = nullptr;
      }
      return *this;
    }
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    ~handle() { release(); }

    explicit operator bool() const noexcept { return cache_ != nullptr; }
    const mem_registration& registration() const noexcept { return reg_; }
    std::uint32_t lkey() const noexcept { return reg_.lkey; }
    std::uint32_t rkey() const noexcept { return reg_.rkey; }
    std::uintptr_t base() const noexcept { return reg_.base; }
    std::size_t length() const noexcept { return reg_.length; }
    /// False for a registration made for this use only (cache off or full).
    bool cached() const noexcept { return slot_ != no_slot; }
    /// Gives the registration back (deregistered now when uncached). Idempotent.
    void release() noexcept {
      if (cache_) cache_->release_slot(slot_, reg_);
      cache_ = nullptr;
    }

   private:
    friend class reg_cache;
    handle(reg_cache* c, std::uint32_t slot, const mem_registration& r) noexcept : cache_(c), slot_(slot), reg_(r) {}
    reg_cache* cache_ = nullptr;
    std::uint32_t slot_ = no_slot;
    mem_registration reg_;
  };

  reg_cache(Registrar registrar, reg_cache_limits limits)
      : registrar_(std::move(registrar)), limits_(limits) {
    page_ = limits_.page_size ? limits_.page_size : system_page_size();
    if (page_ & (page_ - 1)) page_ = system_page_size();  // not a power of two
    if (limits_.enabled()) {
      slots_.resize(limits_.max_entries);
      index_.reserve(limits_.max_entries);
      free_.reserve(limits_.max_entries);
      for (std::size_t i = limits_.max_entries; i-- > 0;) free_.push_back(static_cast<std::uint32_t>(i));
    }
  }
  reg_cache(const reg_cache&) = delete;
  reg_cache& operator=(const reg_cache&) = delete;
  ~reg_cache() {
    for (auto& s : slots_)
      if (s.live) registrar_.dereg(s.reg);
  }

  /// A handle on a registration covering [addr, addr + len). Errors:
  /// invalid_argument (empty or wrapping range), and the registrar's, prefixed
  /// with the user range and the pages registered.
  result<handle> find_or_register(const void* addr, std::size_t len) {
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    if (len == 0) return make_error(errc::invalid_argument, "registering an empty range at %p for RDMA", addr);
    if (a + len < a || a + len > UINTPTR_MAX - page_) {
      return make_error(errc::invalid_argument, "registering [%p, +%zu) for RDMA: the range wraps around", addr, len);
    }
    const std::uintptr_t b = a & ~(std::uintptr_t(page_) - 1);
    const std::uintptr_t e = (a + len + page_ - 1) & ~(std::uintptr_t(page_) - 1);
    if (!limits_.enabled()) {
      ++stats_.misses;
      return register_uncached(a, len, b, e);
    }

    // Hit: the one entry starting at or before b (entries are disjoint).
    std::size_t pos = upper_bound(b);
    if (pos > 0) {
      std::uint32_t s = index_[pos - 1];
      if (slots_[s].reg.covers(b, e - b)) {
        slot& sl = slots_[s];
        ++sl.refs;
        sl.last_use = ++clock_;
        ++stats_.hits;
        return handle(this, s, sl.reg);
      }
    }
    ++stats_.misses;

    // Entries overlapping or touching [b, e): index positions [lo, hi).
    std::size_t lo = (pos > 0 && slots_[index_[pos - 1]].reg.end() >= b) ? pos - 1 : pos;
    std::size_t hi = pos;
    while (hi < index_.size() && slots_[index_[hi]].reg.base <= e) ++hi;
    std::uintptr_t ub = b, ue = e;
    if (limits_.merge && lo < hi) {
      ub = std::min(b, slots_[index_[lo]].reg.base);
      ue = std::max(e, slots_[index_[hi - 1]].reg.end());
    }
    if (ue - ub > limits_.max_bytes) {
      ub = b;
      ue = e;
    }
    if (ue - ub > limits_.max_bytes) return register_uncached(a, len, b, e);
    if (ub == b && ue == e) {  // no merge: drop only what overlaps [b, e)
      if (lo < hi && slots_[index_[lo]].reg.end() <= b) ++lo;
      while (hi > lo && slots_[index_[hi - 1]].reg.base >= e) --hi;
    }
    drop(lo, hi, stats_.merged);

    // Room: evict unheld entries, least recently used first.
    const std::size_t want = ue - ub;
    while (free_.empty() || bytes_ + want > limits_.max_bytes) {
      if (!evict_lru()) return register_uncached(a, len, b, e);
    }
    auto r = registrar_.reg(ub, want);
    if (!r) return wrap(r.error(), a, len, ub, ue);
    ++stats_.registrations;
    std::uint32_t s = free_.back();
    free_.pop_back();
    slot& sl = slots_[s];
    sl.reg = r.value();
    sl.refs = 1;
    sl.last_use = ++clock_;
    sl.live = true;
    sl.indexed = true;
    index_.insert(index_.begin() + static_cast<std::ptrdiff_t>(upper_bound(ub)), s);
    bytes_ += want;
    stats_.peak_bytes = std::max(stats_.peak_bytes, bytes_);
    return handle(this, s, sl.reg);
  }

  /// Drops the cached entries overlapping [addr, addr + len): call it before
  /// freeing (or right after, before reusing) memory that was registered.
  /// Unheld entries are deregistered now, held ones when released. Returns how
  /// many entries were dropped.
  std::size_t invalidate(const void* addr, std::size_t len) {
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    if (len == 0 || index_.empty()) return 0;
    const std::uintptr_t z = a + len < a ? UINTPTR_MAX : a + len;
    std::size_t pos = upper_bound(a);
    std::size_t lo = (pos > 0 && slots_[index_[pos - 1]].reg.end() > a) ? pos - 1 : pos;
    std::size_t hi = pos;
    while (hi < index_.size() && slots_[index_[hi]].reg.base < z) ++hi;
    drop(lo, hi, stats_.invalidated);
    return hi - lo;
  }

  reg_cache_stats stats() const noexcept {
    reg_cache_stats s = stats_;
    s.entries = index_.size();
    s.bytes_registered = bytes_;
    return s;
  }
  const reg_cache_limits& limits() const noexcept { return limits_; }
  std::size_t page_size() const noexcept { return page_; }
  Registrar& registrar() noexcept { return registrar_; }

 private:
  struct slot {
    mem_registration reg;
    std::uint32_t refs = 0;
    std::uint64_t last_use = 0;
    bool live = false;     // registered
    bool indexed = false;  // found by lookups (false: dropped, waiting for its last handle)
  };

  // First index position whose entry starts after `x`.
  std::size_t upper_bound(std::uintptr_t x) const noexcept {
    auto it = std::upper_bound(index_.begin(), index_.end(), x,
                               [this](std::uintptr_t v, std::uint32_t s) { return v < slots_[s].reg.base; });
    return static_cast<std::size_t>(it - index_.begin());
  }

  // Takes index positions [lo, hi) out of the lookup.
  void drop(std::size_t lo, std::size_t hi, std::uint64_t& counter) {
    if (lo >= hi) return;
    for (std::size_t i = lo; i < hi; ++i) {
      std::uint32_t s = index_[i];
      slots_[s].indexed = false;
      ++counter;
      if (slots_[s].refs == 0) free_slot(s);
    }
    index_.erase(index_.begin() + static_cast<std::ptrdiff_t>(lo), index_.begin() + static_cast<std::ptrdiff_t>(hi));
  }

  void free_slot(std::uint32_t s) noexcept {
    slot& sl = slots_[s];
    registrar_.dereg(sl.reg);
    ++stats_.deregistrations;
    bytes_ -= sl.reg.length;
    sl = slot{};
    free_.push_back(s);
  }

  bool evict_lru() {
    std::size_t best = index_.size();
    for (std::size_t i = 0; i < index_.size(); ++i) {
      const slot& sl = slots_[index_[i]];
      if (sl.refs == 0 && (best == index_.size() || sl.last_use < slots_[index_[best]].last_use)) best = i;
    }
    if (best == index_.size()) return false;
    std::uint32_t s = index_[best];
    index_.erase(index_.begin() + static_cast<std::ptrdiff_t>(best));
    free_slot(s);
    ++stats_.evictions;
    return true;
  }

  result<handle> register_uncached(std::uintptr_t a, std::size_t len, std::uintptr_t b, std::uintptr_t e) {
    auto r = registrar_.reg(b, e - b);
    if (!r) return wrap(r.error(), a, len, b, e);
    ++stats_.registrations;
    ++stats_.uncached;
    return handle(this, no_slot, r.value());
  }

  void release_slot(std::uint32_t s, const mem_registration& r) noexcept {
    if (s == no_slot) {
      registrar_.dereg(r);
      ++stats_.deregistrations;
      return;
    }
    slot& sl = slots_[s];
    if (sl.refs > 0) --sl.refs;
    sl.last_use = ++clock_;
    if (sl.refs == 0 && !sl.indexed && sl.live) free_slot(s);
  }

  static status wrap(const status& err, std::uintptr_t a, std::size_t len, std::uintptr_t b, std::uintptr_t e) {
    char head[160];
    std::snprintf(head, sizeof head, "registering user buffer [%#jx, %#jx) (%zu bytes, pages [%#jx, %#jx)) for RDMA: ",
                  (std::uintmax_t)a, (std::uintmax_t)(a + len), len, (std::uintmax_t)b, (std::uintmax_t)e);
    return status(err.code(), head + err.message());
  }

  Registrar registrar_;
  reg_cache_limits limits_;
  std::size_t page_ = 4096;
  std::vector<slot> slots_;            // max_entries, fixed
  std::vector<std::uint32_t> index_;   // cached slots by base; ranges disjoint
  std::vector<std::uint32_t> free_;    // unused slot numbers
  std::size_t bytes_ = 0;
  std::uint64_t clock_ = 0;
  reg_cache_stats stats_;
};

}  // namespace cclite::verbs
