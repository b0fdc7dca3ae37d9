#include "engine/scheduler/scheduler.h"

#include <algorithm>

#include "engine/common/log.h"

namespace ferry {

Scheduler::Scheduler(HybridKvCache* kv, const SchedulerLimits& limits, Clock* clock,
                     EngineStats* stats)
    : kv_(kv), limits_(limits), clock_(clock), stats_(stats) {}

void Scheduler::RemoveFinished() {
  seqs_.erase(std::remove_if(seqs_.begin(), seqs_.end(),
                             [](const std::unique_ptr<Sequence>& s) { return s->finished; }),
              seqs_.end());
}

std::vector<Sequence*> Scheduler::Ranked() const {
  std::vector<Sequence*> order;
  for (const auto& s : seqs_) {
    if (!s->finished) order.push_back(s.get());
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const Sequence* a, const Sequence* b) { return a->rank() < b->rank(); });
  return order;
}

std::vector<Sequence*> Scheduler::Plan(const std::function<void(Sequence&)>& admitted) {
  const std::vector<Sequence*> order = Ranked();
  std::vector<Sequence*> scheduled;
  int64_t budget = limits_.max_batch_tokens, running = 0;
  for (Sequence* s : order) running += s->admitted ? 1 : 0;
  auto schedule = [&](Sequence* s) -> bool {
    const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->computed;
    const int64_t chunk = std::min({remaining, budget, limits_.prefill_chunk});
    if (chunk <= 0) return false;
    if (!Reserve(*s, s->computed + chunk, scheduled)) return false;
    s->step_chunk = chunk;
    scheduled.push_back(s);
    budget -= chunk;
    return true;
  };
  // Admitted sequences by rank: decodes first, then continuing prefills.
  for (int pass = 0; pass < 2; ++pass) {
    for (Sequence* s : order) {
      if (!s->admitted || s->finished) continue;
      const bool decoding = static_cast<int64_t>(s->tokens.size()) - s->computed == 1;
      if (decoding == (pass == 0)) schedule(s);
    }
  }
  // Admission, strictly in rank order.
  for (Sequence* s : order) {
    if (s->admitted || s->finished) continue;
    if (budget <= 0 || running >= limits_.max_running) break;
    const int64_t cached = Admit(*s);
    if (!schedule(s)) {
      // Not now: give the cache hits back and hold everything behind it.
      Release(*s);
      s->computed = 0;
      s->replay_end = 0;
      s->window_floor = 0;
      s->admitted = false;
      stats_->cached_tokens -= cached;
      break;
    }
    if (!s->req->admitted_once) FirstAdmission(*s, cached);
    ++running;
    admitted(*s);
  }
  return scheduled;
}

Sequence* Scheduler::Outgrown() {
  for (Sequence* s : Ranked()) {
    if (s->admitted && !s->finished && !kv_->CanEverHold(s->computed + 1)) return s;
  }
  return nullptr;
}

bool Scheduler::Reserve(Sequence& seq, int64_t positions, std::vector<Sequence*>& scheduled) {
  // Both tables grow alike (the window table's entries before the window are kNoBlock).
  const int64_t need =
      kv_->pool().layout().BlocksFor(positions) - static_cast<int64_t>(seq.kv.blocks.size());
  if (need <= 0) return true;
  while (kv_->Shortfall(need) > 0) {
    if (kv_->EvictFor(need) > 0) continue;
    // Imports held for requests that wait behind `seq` become evictable.
    if (UnpinWaiting(&seq)) continue;
    // Preempt the admitted sequence ranked last, if it ranks after `seq`.
    Sequence* victim = nullptr;
    for (auto& s : seqs_) {
      if (s->admitted && !s->finished && s.get() != &seq && s->rank() > seq.rank() &&
          (victim == nullptr || s->rank() > victim->rank())) {
        victim = s.get();
      }
    }
    if (victim == nullptr) {
      // Last, the imports of requests ranked before `seq` that still wait.
      if (UnpinWaiting(nullptr)) continue;
      return false;
    }
    scheduled.erase(std::remove(scheduled.begin(), scheduled.end(), victim), scheduled.end());
    Preempt(*victim);
  }
  kv_->Grow(&seq.kv, need);
  return true;
}

void Scheduler::Release(Sequence& seq) { kv_->Release(&seq.kv); }

void Scheduler::Preempt(Sequence& seq) {
  Release(seq);
  seq.computed = 0;
  seq.replay_end = 0;
  seq.window_floor = 0;
  seq.admitted = false;
  ++stats_->preemptions;
}

void Scheduler::Unpin(RunningRequest& req) { kv_->ReleaseFull(&req.pinned); }

void Scheduler::ForgetImports(RunningRequest& req) {
  if (req.pinned.empty()) return;
  const int64_t loaded = static_cast<int64_t>(req.pinned.size()) - req.r.imported_cached_blocks;
  stats_->unused_imported_blocks += std::max<int64_t>(0, loaded);
  Unpin(req);
}

bool Scheduler::UnpinWaiting(const Sequence* than) {
  Sequence* worst = nullptr;
  for (auto& s : seqs_) {
    if (s->finished || s->req->admitted_once || s->req->pinned.empty()) continue;
    if (than != nullptr && (s->req == than->req || !(s->rank() > than->rank()))) continue;
    if (worst == nullptr || s->rank() > worst->rank()) worst = s.get();
  }
  if (worst == nullptr) return false;
  ForgetImports(*worst->req);
  return true;
}

int64_t Scheduler::Admit(Sequence& seq) {
  const int32_t bt = kv_->block_tokens();
  // Hashes of the full blocks of everything but the last token (at least one token is computed
  // to get logits), then the longest cached prefix of them.
  const int64_t full = (static_cast<int64_t>(seq.tokens.size()) - 1) / bt;
  HashFullBlocks(seq, full, bt);
  WindowReplay replay;
  kv_->TakeCachedPrefix(absl::MakeConstSpan(seq.hashes), full, &seq.kv, &replay);
  seq.admission = replay;
  const int64_t cached = static_cast<int64_t>(seq.kv.blocks.size()) * bt;
  seq.computed = cached;
  seq.replay_end = 0;
  seq.window_floor = 0;
  if (replay.end > 0) {
    // The window layers are rebuilt from replay.from; the full-attention KV is the cache's.
    seq.computed = replay.from;
    seq.replay_end = replay.end;
    seq.window_floor = replay.from;
    if (replay.approximate) seq.req->approximate = true;
  }
  kv_->Admitted(&seq.kv, seq.computed);
  seq.cached_blocks = static_cast<int64_t>(seq.kv.blocks.size());
  seq.offer_from = seq.cached_blocks;
  stats_->cached_tokens += cached;
  seq.admitted = true;
  return cached;
}

void Scheduler::FirstAdmission(Sequence& seq, int64_t cached) {
  RunningRequest& req = *seq.req;
  const int32_t bt = kv_->block_tokens();
  req.admitted_once = true;
  req.cached_prompt_tokens = std::min(cached, seq.prompt_len);
  req.queued = clock_->Monotonic() - req.submitted_at;
  // The imports it used: prefix blocks that are the very blocks it brought from elsewhere.
  const int64_t prefix = std::min<int64_t>(cached / bt, req.pinned.size());
  int64_t used = 0;
  for (int64_t i = req.r.imported_cached_blocks; i < prefix; ++i) {
    if (seq.kv.blocks[i] == req.pinned[i]) ++used;
  }
  const int64_t loaded = static_cast<int64_t>(req.pinned.size()) - req.r.imported_cached_blocks;
  req.imported_tokens = used * bt;
  stats_->imported_tokens += req.imported_tokens;
  stats_->unused_imported_blocks += std::max<int64_t>(0, loaded - used);
  Unpin(req);
  const WindowReplay& a = seq.admission;
  if (a.end > 0) {
    req.replayed_tokens = a.end - a.from;
    stats_->replayed_tokens += req.replayed_tokens;
    ++stats_->window_replays;
    if (a.approximate) req.window_floor = a.from;
  } else if (a.longest > 0) {  // (a window pool's admissions only)
    ++(a.windowed == a.longest ? stats_->window_hits : stats_->window_misses);
  }
}

void Scheduler::Census(EngineStats* stats, int64_t* waiting_requests) const {
  *waiting_requests = 0;
  const RunningRequest* last = nullptr;
  for (const auto& s : seqs_) {
    if (s->admitted) {
      ++stats->running;
      stats->running_tokens += static_cast<int64_t>(s->tokens.size());
    } else {
      ++stats->waiting;
      stats->queued_tokens += static_cast<int64_t>(s->tokens.size()) - s->computed;
      if (!s->req->admitted_once && s->req.get() != last) ++*waiting_requests;
      last = s->req.get();
    }
  }
}

}  // namespace ferry
