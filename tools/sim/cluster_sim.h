// The served system in the discrete-event simulator: simulated workers (sim_worker.h), the
// shared KV store (sim_store.h), the links KV moves over (sim_links.h) and the router's side
// with the real routing libraries: the policy (router/policy, any of NewRoutingPolicy's), the KV
// index fed by the workers' cache events (router/index/kv_index.h), the store probe, and the
// router's dispatch rules themselves (router/dispatch/dispatch_rules.h: the job record, stream
// and prefill candidates, admission into a bounded queue, and what follows a refused or failed
// attempt: a retry elsewhere, a wait in the queue for KV room, or the end). Here the registry's
// part is the simulator's: ready workers below their capacity are candidates, and the router's
// own pending and active token counts are kept per node. The simulator kills no worker, so no
// request that sent output moves but by a drain's hand-off.
//
// A request's life, as in the real services:
//   aggregated  route -> (store: read the prefix the worker lacks, ReserveImport + the store
//               link's time) -> engine -> tokens stream back as steps end
//   P/D         route to a decode worker, which reserves the prompt's blocks (at its next step)
//               -> route to a prefill worker -> (store read) -> prefill-only engine request ->
//               its KV moves over both workers' links (the blocks the decode worker did not have
//               cached) -> the first token reaches the client, the decode worker continues
//               from it (a decode-only request resuming after it)
// Every worker writes the full blocks it computes to the store (free: off the request path).
//
// Pools at run time (what a planner drives; services/planner):
//   AddWorker    a worker of a kind joins: it costs GPU-seconds from now and is routable once its
//                start-up time has passed (until then "starting": not listed, not a candidate).
//   DrainWorker  the least-loaded ready worker of a kind stops taking requests (a starting one,
//                if any, is stopped instead, at once: as Kubernetes deletes a pod that is not
//                ready first). Its requests run on for drain_grace_s; then each stream still
//                running there is parked by its engine (Engine::Park) and handed off with its KV
//                to another worker of its kind, as the real drain does: the target, chosen by the
//                policy among the router's hand-off targets (HandoffTargets) that may have room
//                (KvRoom), reserves the prompt and the output but its last token, the KV moves
//                over both workers' links, and a decode-only request continues from the tokens
//                generated so far (ResumePoint), so the output is the same token for token. A
//                target that refuses, or none, and the KV waits parked for the next load report
//                (the real router would fall back to a re-prefill). Prefill-only requests finish.
//                Once it holds nothing the worker is gone: it stops costing and leaves the index.
//   gpu_seconds  integrated over every worker's life (starting, ready and draining) x
//                calibration.gpus_per_worker.
//   PlannerSnapshot  what the planner would read of the router (services/planner/pool_snapshot.h):
//                the listed workers' last load reports and the router's counts on them, the
//                replicas asked for and starting, the router's counters (requests, prompt tokens,
//                computed prompt tokens, completion tokens, SLO outcomes judged at each request's
//                end by router/slo.h's JudgeSlo against `slo`), the queue waits per pool and the
//                router's queue.
//
// Thread-compatible: runs on the EventLoop's thread.

#ifndef FERRY_TOOLS_SIM_CLUSTER_SIM_H_
#define FERRY_TOOLS_SIM_CLUSTER_SIM_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/backend.h"
#include "engine/model/sim_timing.h"
#include "router/dispatch/dispatch_rules.h"
#include "router/dispatch/job_record.h"
#include "router/index/kv_index.h"
#include "router/policy/routing_policy.h"
#include "router/slo.h"
#include "services/planner/pool_snapshot.h"
#include "tools/load/load_report.h"
#include "tools/load/workload.h"
#include "tools/sim/event_loop.h"
#include "tools/sim/sim_links.h"
#include "tools/sim/sim_store.h"
#include "tools/sim/sim_worker.h"

namespace ferry {

struct ClusterOptions {
  std::string policy = "prefix_aware";
  PrefixAwareOptions prefix_aware;
  // Either aggregated workers, or prefill and decode workers.
  int aggregated = 0;
  int prefill = 0;
  int decode = 0;
  SimCalibration calibration;
  // Compute speed per worker, in creation order (aggregated, or prefill then decode); missing
  // entries are 1.
  std::vector<double> speeds;
  // Each worker's engine (kind, id and timing are set per worker).
  SimWorkerOptions worker;
  bool store = false;
  int64_t store_bytes = int64_t{4} << 40;  // of the calibrated model's KV
  double report_interval_s = 0.1;          // the workers' Watch load interval
  int64_t max_queue = 1 << 20;             // requests waiting in the router for a worker
  double queue_timeout_s = 30;             // the router's --queue_timeout
  int max_attempts = 3;  // per request, after failures (a KV refusal waits instead: no attempt)
  // DrainWorker: how long a draining worker's requests run on before they are handed off (the
  // worker's --drain_grace).
  double drain_grace_s = 30;
  // The router's objectives (--slo_ttft, --slo_itl) its SLO counters judge requests by.
  SloObjectives slo;
  uint64_t seed = 1;
  // Every token a client receives, in order (tests; may be empty).
  std::function<void(int64_t request_id, TokenId token)> on_token;
};

struct ClusterStats {
  std::map<std::string, int64_t> reasons;  // routing decisions by reason
  int64_t queued = 0;                      // requests that waited in the router's queue
  int64_t retries = 0;
  int64_t kv_waits = 0;         // decode reservations refused: back to the queue for KV room
  int64_t queue_expired = 0;    // requests that waited queue_timeout_s and failed
  double max_queue_wait_s = 0;  // the longest a request waited (LeaveQueue: its whole wait)
  int64_t store_reads = 0, store_blocks_read = 0;
  double handoff_bytes = 0, store_bytes_read = 0;  // of the calibrated model's KV
  int64_t index_entries = 0;
  double busy_seconds = 0;  // summed over workers, gone ones included
  // The store reader's decisions, as the worker's ferry_worker_store_lookups_total{result}:
  // "memory" (the worker's cache held the whole prefix when the request arrived), "miss" (the
  // store held none of the rest), "no_room" (no block to read into), "read".
  std::map<std::string, int64_t> store_lookups;
  // Pools at run time.
  int64_t workers_added = 0, workers_drained = 0, workers_gone = 0;
  int64_t drain_handoffs = 0;       // streams a drain handed off with their KV
  double drain_handoff_bytes = 0;   // of the calibrated model's KV
  int64_t drain_handoff_waits = 0;  // hand-offs that found no target with room, and waited
};

// A pool's workers by state.
struct PoolCounts {
  int starting = 0, ready = 0, draining = 0;
};

// What the router's SLO counters judge of a request that ended (JudgeSlo's record), from the
// client's record: its mean inter-token time is Summarize's TPOT, so that a request counts within
// the SLO in the load report (WithinSlo) exactly when it is ok and neither objective is missed.
SloRecord RouterSloRecord(const RequestRecord& record);

class ClusterSim {
 public:
  static absl::StatusOr<std::unique_ptr<ClusterSim>> Create(EventLoop* loop,
                                                            ClusterOptions options);
  ~ClusterSim();

  // Sends `request` now; `done` gets its record (times from the loop's start) when it ends.
  void Send(const LoadRequest& request, std::function<void(const RequestRecord&)> done);
  // Accelerators the workers present now stand for (starting, ready and draining).
  int gpus() const;
  // GPU-seconds so far: each worker's life up to now (or its end) x gpus_per_worker.
  double gpu_seconds() const;
  int64_t in_flight() const { return in_flight_; }
  ClusterStats stats() const;
  // The first KV-cache capacity of one worker, in tokens.
  int64_t worker_kv_tokens() const;

  // A new worker of `kind` (the cluster's: aggregated, or prefill or decode), routable after
  // `startup_s`. InvalidArgument for a kind the cluster does not have.
  absl::Status AddWorker(WorkerKind kind, double startup_s);
  // Drains a worker of `kind` (see the file comment). FailedPrecondition when it would be the
  // last ready one of its kind and none is starting; InvalidArgument for a kind the cluster does
  // not have.
  absl::Status DrainWorker(WorkerKind kind);
  PoolCounts pool_counts(WorkerKind kind) const;
  // What a planner reads (time_s: the loop's time).
  Snapshot PlannerSnapshot() const;
  const RouterCounters& counters() const { return counters_; }

 private:
  struct Job;
  enum class NodeState { kStarting, kReady, kDraining, kGone };
  struct Node {
    std::unique_ptr<SimWorker> worker;  // kept when gone (idle; its loop events may be pending)
    WorkerKind kind = WorkerKind::kAggregated;
    NodeState state = NodeState::kReady;
    double born_s = 0, gone_s = -1;
    bool parking = false;  // draining past its grace: whatever runs there is parked
    int slot = -1;         // in the KV index
    int link = -1;         // its NIC
    int store_link = -1;
    int64_t inflight = 0, pending_prefill_tokens = 0, active_tokens = 0;
    int64_t unreported_kv_tokens = 0;  // active tokens added since its last report
  };

  ClusterSim(EventLoop* loop, ClusterOptions options);
  absl::StatusOr<size_t> NewNode(WorkerKind kind, NodeState state);
  bool HasKind(WorkerKind kind) const;
  // A draining node's grace ended: park its streams.
  void GraceOver(size_t node);
  // The node gives back a request's place; a draining node that holds nothing is gone.
  void Release(size_t node);
  void MaybeGone(size_t node);
  // A stream parked on a draining worker (its kHandoff event): hand it off, now or later.
  void Parked(const std::shared_ptr<Job>& job, size_t node, const TokenEvent& e);
  bool TryHandoff(const std::shared_ptr<Job>& job);
  void RetryHandoffs();
  // The router's counters for a request that ended.
  void Count(const Job& job);
  void ReportAll();
  // The nodes below their capacity (the registry's candidates), and what a policy sees of nodes.
  std::vector<size_t> Available() const;
  std::vector<WorkerLoadView> Views(const std::vector<size_t>& nodes) const;
  // The policy's choice among the rules' stream (or prefill) candidates for `job`: the node and
  // the choice; none when no candidate can take it.
  std::optional<std::pair<size_t, RouteChoice>> Choose(const std::shared_ptr<Job>& job,
                                                       bool prefill);
  void Pump();  // starts queued jobs while workers can take them
  // The job enters the queue (at the front: a restart) / left it; ends the ones that waited
  // queue_timeout_s.
  void Enqueue(const std::shared_ptr<Job>& job, bool front);
  void LeftQueue(const std::shared_ptr<Job>& job);
  void ExpireQueue();
  bool TryStart(const std::shared_ptr<Job>& job);
  void StartPrefill(const std::shared_ptr<Job>& job);
  // Reads the prefix `node` lacks from the store into `request`, then submits it there.
  void ReadThenSubmit(size_t node, const std::shared_ptr<Job>& job, EngineRequest request);
  void SubmitTo(size_t node, const std::shared_ptr<Job>& job, EngineRequest request);
  EngineRequest BaseRequest(const std::shared_ptr<Job>& job, size_t node);
  void OnEvent(const std::shared_ptr<Job>& job, size_t node, const TokenEvent& e);
  void Handoff(const std::shared_ptr<Job>& job, size_t prefill, const TokenEvent& e);
  void Token(const std::shared_ptr<Job>& job, TokenId token);
  // Gives back the router's counts the job holds on its nodes.
  void Leave(const std::shared_ptr<Job>& job);
  void Finish(const std::shared_ptr<Job>& job, bool ok, const std::string& error);
  // `node` refused the job's attempt (a reservation, or a request it was sent).
  // `reservation`: a decode worker's KV reservation (a refusal for want of KV waits for room).
  void Refused(const std::shared_ptr<Job>& job, size_t node, const absl::Status& why,
               bool reservation = false);
  // The attempt ended without completing: the dispatch rules say what follows.
  void AttemptEnded(const std::shared_ptr<Job>& job, const AttemptOutcome& outcome);

  EventLoop* const loop_;
  const ClusterOptions options_;
  DispatchLimits limits_;
  std::unique_ptr<Backend> backend_;
  std::vector<std::shared_ptr<const SimTiming>> timings_;
  std::unique_ptr<KvIndex> index_;
  std::unique_ptr<RoutingPolicy> policy_;
  SimLinks links_;
  std::unique_ptr<SimStore> store_;
  std::deque<Node> nodes_;  // by index, never erased (a gone node stays, idle)
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<int64_t, std::shared_ptr<Job>> live_;  // by Send order, until Finish
  std::deque<std::shared_ptr<Job>> handoff_waiting_;
  RouterCounters counters_;
  std::array<double, kPoolRoles> queue_wait_sum_{};
  std::array<int64_t, kPoolRoles> queue_wait_count_{};
  int64_t in_flight_ = 0;
  ClusterStats stats_;
  Hash128 fingerprint_;
  int64_t next_job_ = 0;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_SIM_CLUSTER_SIM_H_
