// cclite/collective/cost_measure.hpp - measuring the cost model's link figures at init.
//
// Opt-in (CCLITE_COST_MEASURE=1): when a communicator is created, every ring
// link is timed once with ping-pongs, 8 bytes (alpha = half the fastest round
// trip) and 1 MiB (beta from half the fastest round trip, less alpha). The
// ranks then agree through the store on one figure per link kind, the slowest
// seen anywhere (largest alpha, smallest bandwidth), so every rank feeds the
// same numbers to its selector and all choose the same algorithms. A kind
// whose CCLITE_COST_<KIND> is set keeps the environment's figure. Costs a few
// milliseconds per link kind (more on a loaded machine); off by default
// because a measurement on a busy machine can be worse than the defaults.
//
// Which pairs: positions (0,1), (2,3), ... of the ring, then (1,2), (3,4), ...,
// then (n-1, 0): every ring link once, each rank in at most one pair per
// phase, and the lower position of each pair times it.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cclite/collective/cost_model.hpp>
#include <cclite/core/clock.hpp>
#include <cclite/core/status.hpp>
#include <cclite/config.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)
namespace cclite::detail {

struct cost_probe {
  static constexpr std::size_t small_bytes = 8;
  static constexpr std::size_t large_bytes = 1 << 20;
  static constexpr int small_iters = 20, large_iters = 4, warmup = 2;
};

/// The pair this ring position is in during `phase` (0..2): the partner's
/// ring position and whether this side times the link, or -1.
inline int probe_partner(int pos, int n, int phase, bool& initiator) {
  initiator = false;
  if (n < 2) return -1;
  if (phase < 2) {
    if (pos % 2 == phase && pos + 1 < n) {
      initiator = true;
      return pos + 1;
    }
    if (pos % 2 != phase && pos >= 1 && pos - 1 >= 0 && (pos - 1) % 2 == phase) return pos - 1;
    return -1;
  }
  if (n <= 2) return -1;  // (1, 0) is the link (0, 1) timed in phase 0
  if (pos == n - 1) {
    initiator = true;
    return 0;
  }
  return pos == 0 ? n - 1 : -1;
}

/// Times one link with ping-pongs. `exchange(out, out_bytes, in, in_bytes)`
/// is one framed transfer with the partner; `buf` holds large_bytes.
/// The responder echoes; only the initiator's figures mean anything.
template <class Exchange>
status ping_pong(Exchange&& exchange, bool initiator, std::uint8_t* buf, link_cost& out) {
  auto round = [&](std::size_t bytes, double& best_us) -> status {
    const auto t0 = clock::now();
    if (initiator) {
      CCLITE_TRY(exchange(buf, bytes, nullptr, 0));
      CCLITE_TRY(exchange(nullptr, 0, buf, bytes));
    } else {
      CCLITE_TRY(exchange(nullptr, 0, buf, bytes));
      CCLITE_TRY(exchange(buf, bytes, nullptr, 0));
    }
    const double us = std::chrono::duration<double, std::micro>(clock::now() - t0).count();
    best_us = std::min(best_us, us / 2);
    return {};
  };
  double small = 1e30, large = 1e30, ignored = 1e30;
  for (int i = 0; i < cost_probe::warmup; ++i) CCLITE_TRY(round(cost_probe::small_bytes, ignored));
  for (int i = 0; i < cost_probe::small_iters; ++i) CCLITE_TRY(round(cost_probe::small_bytes, small));
  CCLITE_TRY(round(cost_probe::large_bytes, ignored));
  for (int i = 0; i < cost_probe::large_iters; ++i) CCLITE_TRY(round(cost_probe::large_bytes, large));
  const double per_byte_us = std::max(large - small, 1e-3) / static_cast<double>(cost_probe::large_bytes);
  out.alpha_us = small;
  out.beta_us_per_byte = per_byte_us;
  return {};
}

/// "kind:alpha_us:GBps" entries joined by ';' (what each rank publishes).
inline void append_measured(std::string& s, const std::string& kind, const link_cost& c) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s%s:%.6g:%.6g", s.empty() ? "" : ";", kind.c_str(), c.alpha_us,
                1e-3 / c.beta_us_per_byte);
  s += buf;
}

/// Calls fn(kind, alpha_us, gbps) for each "kind:alpha:GBps" item of `s`
/// (the append_measured() form); malformed items are skipped.
template <class F>
void for_each_measured(const std::string& s, F&& fn) {
  std::size_t at = 0;
  while (at < s.size()) {
    std::size_t end = s.find(';', at);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(at, end - at);
    at = end + 1;
    const auto c1 = item.find(':'), c2 = item.rfind(':');
    if (c1 == std::string::npos || c2 == c1) continue;
    fn(item.substr(0, c1), std::strtod(item.c_str() + c1 + 1, nullptr), std::strtod(item.c_str() + c2 + 1, nullptr));
  }
}

/// The figures every rank uses: per kind, the slowest measured anywhere.
/// `all`: every rank's append_measured() string. Returns the same
/// "kind:alpha:GBps;..." form, kinds in first-seen order (deterministic: the
/// input is the same on every rank).
inline std::string agree_measured(const std::vector<std::string>& all) {
  std::vector<std::string> kinds;
  std::vector<double> alpha, gbps;
  for (const auto& s : all) {
    for_each_measured(s, [&](const std::string& kind, double a, double g) {
      if (!(a >= 0) || !(g > 0)) return;
      const auto it = std::find(kinds.begin(), kinds.end(), kind);
      if (it == kinds.end()) {
        kinds.push_back(kind);
        alpha.push_back(a);
        gbps.push_back(g);
      } else {
        const std::size_t k = static_cast<std::size_t>(it - kinds.begin());
        alpha[k] = std::max(alpha[k], a);
        gbps[k] = std::min(gbps[k], g);
      }
    });
  }
  std::string out;
  for (std::size_t k = 0; k < kinds.size(); ++k) append_measured(out, kinds[k], link_cost::from(alpha[k], gbps[k]));
  return out;
}

/// Feeds an agreed string to `model` (kinds set in the environment keep theirs).
inline void apply_measured(cost_model& model, const std::string& agreed) {
  for_each_measured(agreed, [&](const std::string& kind, double a, double g) {
    model.set_measured(kind, link_cost::from(a, g));
  });
}

}  // namespace cclite::detail
CCLITE_SETUP_CODE_END
