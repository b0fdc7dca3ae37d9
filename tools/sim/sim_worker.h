// One simulated worker of the discrete-event simulator: the real Engine (scheduler, prefix
// cache, KV accounting, events, hand-offs) over the NullModel with the calibrated timing model
// in virtual time, stepped by the EventLoop instead of an engine thread. A step starts when the
// worker has work, its Forward costs the model's time (SimTiming::StepSeconds, at the worker's
// speed), and what the step produced (token events, reservations' answers) is delivered when
// it ends; the next step starts then. The KV pool holds NullModel's 8 bytes a position but has
// as many blocks as the calibrated model's KV in `kv_pool_bytes` would.
//
// What the router sees of it (load(), the Watch stream's numbers) is refreshed every
// `report_interval` of simulated time, as a worker's Watch stream does, so the router decides
// on slightly stale load, as it does for real; the KV index gets the engine's cache events then.
//
// Thread-compatible: everything runs on the EventLoop's thread.

#ifndef FERRY_TOOLS_SIM_SIM_WORKER_H_
#define FERRY_TOOLS_SIM_SIM_WORKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/backend.h"
#include "engine/engine.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/null_model.h"
#include "engine/model/sim_timing.h"
#include "router/index/kv_index.h"
#include "router/policy/routing_policy.h"
#include "tools/sim/event_loop.h"

namespace ferry {

struct SimWorkerOptions {
  std::string id;
  WorkerKind kind = WorkerKind::kAggregated;
  std::shared_ptr<const SimTiming> timing;    // required; its speed is the worker's
  int64_t kv_pool_bytes = int64_t{16} << 30;  // of the calibrated model's KV
  int32_t block_tokens = 64;
  // NullModel's (its logits and sampling cost CPU per row, so few); workload token ids must be
  // below it.
  int32_t vocab_size = 64;
  int64_t max_batch_tokens = 512;
  int64_t prefill_chunk = 256;
  int64_t max_running = 64;
  int64_t max_queued = 256;
  // The load window the measured speeds are averaged over (LoadWindow's).
  double load_window_s = 10;
};

// The worker's numbers as its Watch stream last reported them.
struct SimWorkerLoad {
  int64_t queued_requests = 0, running_requests = 0;  // sequences without / with KV
  int64_t queued_tokens = 0, running_tokens = 0;
  int64_t free_blocks = 0, total_blocks = 0;
  int64_t cached_blocks = 0;  // held by the prefix cache
  uint64_t reports = 0;       // reports so far
  // Over the load window, as the real worker's LoadWindow measures them (services/worker/
  // load_window.h): prompt tokens/s of the steps that computed prompt tokens, decoded tokens/s of
  // the steps that decoded (0: none in the window), the mean step time (the last measured while
  // idle), and the step time over the window's wall time (or the worker's life while shorter).
  double prefill_tokens_per_second = 0;
  double decode_tokens_per_second = 0;
  double step_time_ms = 0;
  double busy_fraction = 0;
};

class SimWorker {
 public:
  // `backend` (for the pool's memory) and `loop` must outlive the worker.
  static absl::StatusOr<std::unique_ptr<SimWorker>> Create(EventLoop* loop, Backend* backend,
                                                           SimWorkerOptions options);
  ~SimWorker();

  const SimWorkerOptions& options() const { return options_; }
  const std::string& id() const { return options_.id; }
  Engine& engine() { return *engine_; }
  KvBlockPool& pool() { return *pool_; }
  const ForwardModel& model() const { return *model_; }

  // Engine calls that wake the worker. Callbacks the engine runs during a step (token events,
  // Reserve's `done`) are delivered when the step ends, in order.
  absl::Status Submit(EngineRequest request);
  void Reserve(std::vector<Hash128> hashes, int64_t positions,
               std::function<void(absl::StatusOr<KvReservation>)> done);
  void ReserveImport(std::vector<Hash128> hashes, int64_t max_fresh,
                     std::function<void(absl::StatusOr<KvReservation>)> done);
  void ReleaseHandoff(const std::string& id);
  void Abort(const std::string& id);
  // Engine::Park: the request ends with kHandoff when it can (a drain).
  void Park(const std::string& id);
  // Blocks released on the pool from outside: the engine may be waiting for them.
  void Wake();

  // Refreshes load() from the engine (the Watch report) and applies the cache events since the
  // last report to `index` as `slot`'s (a snapshot when the journal no longer has them).
  void Report(KvIndex* index, int slot);
  const SimWorkerLoad& load() const { return load_; }

  // Totals: simulated seconds spent in steps, steps, prefill and decode tokens.
  double busy_seconds() const { return busy_seconds_; }
  int64_t steps() const { return steps_; }

 private:
  SimWorker(EventLoop* loop, SimWorkerOptions options);
  void Step();
  // Wraps a callback the engine runs during a step so that it runs when the step ends.
  template <typename T>
  std::function<void(T)> AtStepEnd(std::function<void(T)> callback);

  EventLoop* const loop_;
  const SimWorkerOptions options_;
  std::unique_ptr<NullModel> model_;
  std::unique_ptr<KvAllocator> allocator_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<Engine> engine_;

  bool stepping_ = false;   // a step is scheduled or running
  bool woken_ = false;      // work arrived since the current step started
  bool ran_model_ = false;  // the current step ran the model (on_step)
  int64_t last_prefill_tokens_ = 0, last_decode_tokens_ = 0;
  double created_s_ = 0;
  int idle_steps_ = 0;  // steps in a row that did not run the model
  // Delivered when the step ends: token events (in order), then the other callbacks.
  using EventCallback = std::shared_ptr<const std::function<void(const TokenEvent&)>>;
  std::vector<std::pair<EventCallback, TokenEvent>> step_events_;
  std::vector<std::function<void()>> step_outputs_;
  double busy_seconds_ = 0;
  int64_t steps_ = 0;
  uint64_t journal_cursor_ = 0;
  bool journal_synced_ = false;  // the index holds the snapshot up to journal_cursor_
  SimWorkerLoad load_;
  struct StepRecord {
    double end = 0, seconds = 0;
    int64_t prefill_tokens = 0, decode_tokens = 0;
  };
  std::deque<StepRecord> window_;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_SIM_SIM_WORKER_H_
