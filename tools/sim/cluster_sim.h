// The served system in the discrete-event simulator: simulated workers (sim_worker.h), the
// shared KV store (sim_store.h), the links KV moves over (sim_links.h) and the router's side
// with the real routing libraries: the policy (router/policy, any of NewRoutingPolicy's), the KV
// index fed by the workers' cache events (router/index/kv_index.h), the store probe, and the
// router's dispatch rules themselves (router/dispatch/dispatch_rules.h: the job record, stream
// and prefill candidates, admission into a bounded queue, and what follows a refused or failed
// attempt: a retry elsewhere, a wait in the queue for KV room, or the end). Here the registry's
// part is the simulator's: workers
// below their capacity are candidates, and the router's own pending and active token counts are
// kept per node. The simulator kills no worker, so no request that sent output moves.
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
// Thread-compatible: runs on the EventLoop's thread.

#ifndef FERRY_TOOLS_SIM_CLUSTER_SIM_H_
#define FERRY_TOOLS_SIM_CLUSTER_SIM_H_

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
  double busy_seconds = 0;  // summed over workers
};

class ClusterSim {
 public:
  static absl::StatusOr<std::unique_ptr<ClusterSim>> Create(EventLoop* loop,
                                                            ClusterOptions options);
  ~ClusterSim();

  // Sends `request` now; `done` gets its record (times from the loop's start) when it ends.
  void Send(const LoadRequest& request, std::function<void(const RequestRecord&)> done);
  // Accelerators the workers stand for (GPU-hours).
  int gpus() const;
  int64_t in_flight() const { return in_flight_; }
  ClusterStats stats() const;
  // The first KV-cache capacity of one worker, in tokens.
  int64_t worker_kv_tokens() const;

 private:
  struct Job;
  struct Node {
    std::unique_ptr<SimWorker> worker;
    int slot = -1;  // in the KV index
    int link = -1;  // its NIC
    int store_link = -1;
    int64_t inflight = 0, pending_prefill_tokens = 0, active_tokens = 0;
    int64_t unreported_kv_tokens = 0;  // active tokens added since its last report
  };

  ClusterSim(EventLoop* loop, ClusterOptions options);
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
  std::vector<Node> nodes_;
  std::deque<std::shared_ptr<Job>> queue_;
  int64_t in_flight_ = 0;
  ClusterStats stats_;
  Hash128 fingerprint_;
  int64_t next_request_ = 0;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_SIM_CLUSTER_SIM_H_
