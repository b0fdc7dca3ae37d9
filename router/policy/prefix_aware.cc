#include "router/policy/prefix_aware.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/log.h"

namespace ferry {

namespace {

// The median of `values` (measured ones, all positive; `fallback` when there is none).
double MedianOrFallback(std::vector<double>& values, double fallback) {
  if (values.empty()) return fallback;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

struct Term {
  double cost = 0;
  bool busy = false;
  int64_t local = 0;  // blocks
  int64_t store = 0;  // blocks read from the store
  double queued = 0, uncached = 0, speed = 0;
};

}  // namespace

PrefixAwarePolicy::PrefixAwarePolicy(const KvIndex* index, PrefixAwareOptions options,
                                     uint64_t seed)
    : index_(index), options_(options), rng_(seed) {}

int64_t PrefixAwarePolicy::HeldPrefix(const WorkerLoadView& view, absl::Span<const Hash128> chain,
                                      int64_t matched, int64_t limit, int64_t block_tokens) const {
  int64_t k = std::min(matched, limit);
  if (view.max_window <= 0 || k == 0 || index_ == nullptr) return k;
  // The engine's rule for a hybrid model: k blocks are of use when the window cache also holds
  // the blocks the position after them sees, [FirstWindowBlock(k * B), k).
  auto window_held = [&](int64_t blocks) {
    const int64_t first =
        std::max<int64_t>(0, blocks * block_tokens + 1 - view.max_window) / block_tokens;
    for (int64_t i = first; i < blocks; ++i) {
      if (!index_->Holds(view.slot, chain[i], /*window=*/true)) return false;
    }
    return true;
  };
  while (k > 0 && !window_held(k)) --k;
  return k;
}

int64_t PrefixAwarePolicy::CachedPositions(absl::Span<const WorkerLoadView> candidates,
                                           const RouteRequest& request) const {
  const int64_t block_tokens = request.block_tokens;
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(request.block_hashes.size()),
                                          ReusableBlocks(request.prompt_tokens, block_tokens));
  if (index_ == nullptr || limit <= 0) return 0;
  const absl::Span<const Hash128> chain = request.block_hashes.subspan(0, limit);
  thread_local std::vector<int32_t> matched;
  matched.clear();
  index_->Match(chain, &matched);
  int64_t best = 0;
  for (const WorkerLoadView& w : candidates) {
    if (w.kind == WorkerKind::kDecode || w.slot < 0 || w.slot >= static_cast<int>(matched.size())) {
      continue;
    }
    const int64_t held = HeldPrefix(w, chain, matched[w.slot], limit, block_tokens);
    best = std::max(best, held * block_tokens - std::max<int64_t>(0, w.max_window));
  }
  return best;
}

RouteChoice PrefixAwarePolicy::Choose(absl::Span<const WorkerLoadView> candidates,
                                      const RouteRequest& request) {
  const size_t n = candidates.size();
  const int64_t block_tokens = request.block_tokens;
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(request.block_hashes.size()),
                                          ReusableBlocks(request.prompt_tokens, block_tokens));
  const absl::Span<const Hash128> chain = request.block_hashes.subspan(0, limit);
  thread_local std::vector<int32_t> matched;
  matched.clear();
  if (index_ != nullptr && limit > 0) index_->Match(chain, &matched);
  const int64_t store = std::clamp<int64_t>(request.store_prefix_blocks, 0, limit);

  // Unmeasured workers take the median of the measured ones (computed only when one is
  // unmeasured). Per-thread scratch: a decision allocates nothing once warm.
  thread_local std::vector<double> measured;
  auto median_of = [&](bool decode) {
    measured.clear();
    for (const WorkerLoadView& w : candidates) {
      if ((w.kind == WorkerKind::kDecode) != decode) continue;
      const double v = decode ? w.step_time_ms : w.prefill_tokens_per_second;
      if (v > 0) measured.push_back(v);
    }
    return MedianOrFallback(measured, decode ? 1.0 : 0.0);
  };
  double median_speed = -1, median_step = -1;  // (-1: not computed)
  for (const WorkerLoadView& w : candidates) {
    if (w.kind == WorkerKind::kDecode && !(w.step_time_ms > 0) && median_step < 0) {
      median_step = median_of(true);
    } else if (w.kind != WorkerKind::kDecode && !(w.prefill_tokens_per_second > 0) &&
               median_speed < 0) {
      median_speed = median_of(false);
    }
  }
  const double busy_seconds = absl::ToDoubleSeconds(options_.busy_threshold);
  const double fetch = absl::ToDoubleSeconds(options_.store_fetch_per_block);

  thread_local std::vector<Term> terms;
  terms.assign(n, Term());
  bool any_aggregated_free = false;
  for (size_t i = 0; i < n; ++i) {
    const WorkerLoadView& w = candidates[i];
    Term& t = terms[i];
    const int64_t held =
        w.slot >= 0 && w.slot < static_cast<int>(matched.size()) ? matched[w.slot] : 0;
    t.local = HeldPrefix(w, chain, held, limit, block_tokens);
    if (w.kind == WorkerKind::kDecode) {
      const double step = w.step_time_ms > 0 ? w.step_time_ms : median_step;
      const double active =
          static_cast<double>(std::max(w.running_tokens + w.queued_tokens, w.active_tokens));
      const double needed =
          static_cast<double>(std::max<int64_t>(0, request.prompt_tokens - t.local * block_tokens));
      const double capacity =
          static_cast<double>(w.total_kv_blocks * std::max<int64_t>(1, block_tokens));
      t.cost = step * (1 + (capacity > 0 ? (active + needed) / capacity : 0));
      t.busy = w.total_kv_blocks > 0 &&
               static_cast<double>(w.free_kv_blocks * std::max<int64_t>(1, block_tokens)) < needed;
      t.queued = active;
      t.uncached = needed;
      t.speed = step;
      continue;
    }
    t.speed = w.prefill_tokens_per_second > 0 ? w.prefill_tokens_per_second : median_speed;
    t.store = std::max<int64_t>(0, store - t.local);
    t.queued = static_cast<double>(std::max(w.queued_tokens, w.pending_prefill_tokens));
    t.uncached = static_cast<double>(request.prompt_tokens -
                                     std::max(t.local, store) * std::max<int64_t>(1, block_tokens));
    t.uncached = std::max(0.0, t.uncached);
    // No speed measured anywhere yet: costs in tokens, and no time to call a queue busy.
    const double speed = t.speed > 0 ? t.speed : 1.0;
    t.cost = (t.queued + t.uncached) / speed + static_cast<double>(t.store) * fetch;
    t.busy = t.speed > 0 && t.queued / t.speed > busy_seconds;
    if (w.kind == WorkerKind::kAggregated && !t.busy) any_aggregated_free = true;
  }

  // Who may be chosen: the workers that are not busy (all when every one is); in a mixed pool,
  // the aggregated ones while one of them is free.
  auto eligible = [&](size_t i, bool allow_busy) {
    if (any_aggregated_free && candidates[i].kind != WorkerKind::kAggregated) return false;
    return allow_busy || !terms[i].busy;
  };
  bool all_busy = true;
  for (size_t i = 0; i < n; ++i) {
    if (eligible(i, false)) all_busy = false;
  }
  double best = 0;
  thread_local std::vector<size_t> tied;
  tied.clear();
  for (size_t i = 0; i < n; ++i) {
    if (!eligible(i, all_busy)) continue;
    const double c = terms[i].cost;
    const double eps = 1e-6 * std::abs(best);
    if (tied.empty() || c < best - eps) {
      best = c;
      tied.assign(1, i);
    } else if (c <= best + eps) {
      tied.push_back(i);
    }
  }
  if (tied.empty()) tied.push_back(0);  // (unreachable: some candidate is eligible)
  RouteChoice choice;
  if (tied.size() == 1) {
    choice.index = tied[0];
  } else {
    absl::MutexLock lock(&mu_);
    choice.index = tied[std::uniform_int_distribution<size_t>(0, tied.size() - 1)(rng_)];
  }
  const Term& t = terms[choice.index];
  const WorkerLoadView& chosen = candidates[choice.index];
  // A decode worker's held prefix saves a push, not a computation: it predicts no reuse.
  const bool decode = chosen.kind == WorkerKind::kDecode;
  choice.cost = t.cost;
  choice.predicted_local_tokens = decode ? 0 : t.local * block_tokens;
  choice.predicted_store_tokens = decode ? 0 : t.store * block_tokens;
  choice.reason = all_busy      ? "all_busy"
                  : decode      ? "least_cost"
                  : t.local > 0 ? "prefix_hit"
                  : t.store > 0 ? "store_hit"
                                : "least_cost";
  if (LogEnabled(LogSeverity::kDebug)) {
    std::string why;
    for (size_t i = 0; i < n; ++i) {
      const Term& x = terms[i];
      if (candidates[i].kind == WorkerKind::kDecode) {
        absl::StrAppendFormat(&why,
                              " %s[decode held=%d active=%.0f needed=%.0f step_ms=%.4g "
                              "cost=%.6g%s]",
                              candidates[i].id, x.local, x.queued, x.uncached, x.speed, x.cost,
                              x.busy ? " busy" : "");
      } else {
        absl::StrAppendFormat(&why,
                              " %s[held=%d store=%d queued=%.0f uncached=%.0f speed=%.4g "
                              "cost=%.6g%s]",
                              candidates[i].id, x.local, x.store, x.queued, x.uncached, x.speed,
                              x.cost, x.busy ? " busy" : "");
      }
    }
    LOG(DEBUG) << "prefix_aware: " << chosen.id << " (" << choice.reason << ", "
               << request.prompt_tokens << " prompt tokens, " << limit << " reusable blocks, store "
               << store << "):" << why;
  }
  return choice;
}

}  // namespace ferry
