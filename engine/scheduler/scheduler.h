// The engine's continuous-batching scheduler (ARCHITECTURE.md §4 "Scheduler"): the live
// sequences, and each step's plan: which of them run and how many positions each computes.
//
// A step: the running sequences that are decoding (one token each) come first, then running
// prefills continue, then waiting sequences are admitted in (priority, arrival) order while the
// step's token budget, the running limit and the free KV blocks allow, strictly in that order (a
// sequence that does not fit holds back the ones behind it, so a flood of short requests cannot
// starve a long one). Prefill is chunked (prefill_chunk positions per sequence per step).
// Admission first takes the longest usable cached prefix of the sequence's chained block hashes
// (the KV cache's, with a window replay where that is cheaper). When a sequence needs a block and
// none is free, unreferenced cached blocks are evicted; then imports held for requests waiting
// behind it are let go; then the sequence ranked last is preempted (its blocks released; it
// recomputes later, continuing exactly); last, imports held for requests ranked before it.
//
// The scheduler decides and keeps the KV accounting (EngineStats: preemptions, cached and
// imported tokens, window hits); the engine runs the plan through the model and delivers tokens.
// Owned by the engine thread: thread-compatible.

#ifndef FERRY_ENGINE_SCHEDULER_SCHEDULER_H_
#define FERRY_ENGINE_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/common/clock.h"
#include "engine/engine_stats.h"
#include "engine/kv/hybrid_kv_cache.h"
#include "engine/scheduler/sequence.h"

namespace ferry {

struct SchedulerLimits {
  int64_t max_batch_tokens = 512;  // positions per step
  int64_t max_running = 64;        // sequences with KV at once
  int64_t prefill_chunk = 256;     // positions per sequence per step
};

class Scheduler {
 public:
  // `kv`, `clock` and `stats` outlive the scheduler.
  Scheduler(HybridKvCache* kv, const SchedulerLimits& limits, Clock* clock, EngineStats* stats);

  // Every live sequence, in arrival order.
  std::vector<std::unique_ptr<Sequence>>& sequences() { return seqs_; }
  int64_t NextArrival() { return arrivals_++; }
  void Add(std::unique_ptr<Sequence> seq) { seqs_.push_back(std::move(seq)); }
  // Drops the finished sequences.
  void RemoveFinished();

  // This step's plan: the sequences that run (each with its step_chunk and the blocks for it),
  // decodes first, in rank order. `admitted` is called for each sequence admitted, right after
  // its admission.
  std::vector<Sequence*> Plan(const std::function<void(Sequence&)>& admitted);
  // After a plan that scheduled nothing: the first admitted sequence (by rank) that outgrew the
  // whole KV pool (nothing will ever free a block for it), or null.
  Sequence* Outgrown();

  // Gives back a sequence's blocks (its end, or a preemption's).
  void Release(Sequence& seq);
  // A request ended before its first admission: its imports count as unused and are let go.
  void ForgetImports(RunningRequest& req);

  // The census of the live sequences, for the published stats: running and waiting sequences,
  // their positions, and the requests not admitted yet.
  void Census(EngineStats* stats, int64_t* waiting_requests) const;

 private:
  // Blocks so that `seq` holds `positions`; evicts cached blocks, lets go of waiting requests'
  // imports, then preempts sequences ranked after `seq` (never `seq` itself, dropping them from
  // `scheduled`); false when it still cannot.
  bool Reserve(Sequence& seq, int64_t positions, std::vector<Sequence*>& scheduled);
  void Preempt(Sequence& seq);
  // Takes the longest usable cached prefix; returns its tokens.
  int64_t Admit(Sequence& seq);
  // The first time a request is admitted: its queue time, what it reused, its imports' holds.
  void FirstAdmission(Sequence& seq, int64_t cached);
  // Drops the hold on a waiting request's imported blocks (they stay cached, evictable).
  void Unpin(RunningRequest& req);
  // Under KV pressure: drops the holds of the waiting request ranked last that has any, ranked
  // after `than` (null: any); false when there is none.
  bool UnpinWaiting(const Sequence* than);
  // The live sequences by rank.
  std::vector<Sequence*> Ranked() const;

  HybridKvCache* const kv_;
  const SchedulerLimits limits_;
  Clock* const clock_;
  EngineStats* const stats_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  int64_t arrivals_ = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_SCHEDULER_SCHEDULER_H_
