#include "tools/sim/cluster_sim.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/block_hash.h"
#include "engine/common/log.h"
#include "engine/common/status.h"

namespace ferry {
namespace {
constexpr size_t kNone = std::numeric_limits<size_t>::max();

// The bytes of one block of `pool` (the simulated KV: NullModel's states).
char* BlockBytes(KvBlockPool& pool, BlockId block) {
  return static_cast<char*>(pool.region().address) +
         static_cast<size_t>(block) * pool.layout().block_bytes();
}
}  // namespace

struct ClusterSim::Job {
  LoadRequest request;
  // The router's record of it (router/dispatch/job_record.h), which the dispatch rules decide on.
  JobRecord state;
  std::string id;  // the engine request id of this attempt
  std::function<void(const RequestRecord&)> done;
  RequestRecord record;
  // Where it runs: `worker` the aggregated or decode node, `prefill` the prefill node; the
  // router's counts it added there.
  size_t worker = kNone, prefill = kNone;
  int64_t pending = 0;  // on the node computing the prompt, until it is computed
  int64_t active = 0;   // on the decode node
  bool first = false;
  double last_token = 0;
  // P/D: the decode worker's reservation and the prefill worker's first token.
  bool reserved = false;
  KvReservation reservation;
  TokenId first_token = 0;
  bool counted_queued = false;  // in ClusterStats::queued
  SamplerState sampler_state;
  std::string held_text;
  int64_t seq = 0;                 // in live_
  bool on_engine = false;          // the attempt's request is submitted on `worker`'s engine
  std::vector<TokenId> generated;  // every token the client received
  // A drain hand-off: the source node holding the parked KV, and its table.
  size_t parked_on = kNone;
  std::string parked_id;
  std::vector<BlockId> parked_blocks;
};

ClusterSim::ClusterSim(EventLoop* loop, ClusterOptions options)
    : loop_(loop), options_(std::move(options)), links_(loop) {
  // The router's rules with its defaults but for two: the simulator moves no request that sent
  // output (it kills no worker), and its queue's bound is the simulation's.
  limits_.max_retries = options_.max_attempts - 1;
  limits_.max_migrations = 0;
  limits_.max_queued = options_.max_queue;
  limits_.queue_timeout = absl::Seconds(options_.queue_timeout_s);
}

ClusterSim::~ClusterSim() {
  nodes_.clear();  // the workers' engines before the backend
}

absl::StatusOr<std::unique_ptr<ClusterSim>> ClusterSim::Create(EventLoop* loop,
                                                               ClusterOptions options) {
  const bool pd = options.prefill > 0 || options.decode > 0;
  if (pd ? (options.prefill <= 0 || options.decode <= 0 || options.aggregated > 0)
         : options.aggregated <= 0) {
    return absl::InvalidArgumentError(
        "a simulated cluster has aggregated workers, or prefill and decode workers");
  }
  if (!(options.drain_grace_s >= 0))
    return absl::InvalidArgumentError("drain_grace_s must be >= 0");
  for (double speed : options.speeds) {
    if (!(speed > 0)) return absl::InvalidArgumentError("worker speeds must be > 0");
  }
  std::unique_ptr<ClusterSim> c(new ClusterSim(loop, std::move(options)));
  const ClusterOptions& o = c->options_;
  CpuBackendOptions backend_options;
  backend_options.threads = 1;
  ASSIGN_OR_RETURN(c->backend_, CpuBackend::Create(backend_options));
  KvIndexOptions index_options;
  c->index_ = std::make_unique<KvIndex>(index_options);
  ASSIGN_OR_RETURN(c->policy_, NewRoutingPolicy(o.policy, o.seed, c->index_.get(), o.prefix_aware));
  std::vector<WorkerKind> kinds;
  for (int i = 0; i < o.aggregated; ++i) kinds.push_back(WorkerKind::kAggregated);
  for (int i = 0; i < o.prefill; ++i) kinds.push_back(WorkerKind::kPrefill);
  for (int i = 0; i < o.decode; ++i) kinds.push_back(WorkerKind::kDecode);
  for (WorkerKind kind : kinds) {
    ASSIGN_OR_RETURN(const size_t n, c->NewNode(kind, NodeState::kReady));
    (void)n;
  }
  c->fingerprint_ = c->nodes_[0].worker->model().fingerprint();
  if (o.store) {
    const double block_bytes = o.calibration.kv_bytes_per_token * o.worker.block_tokens;
    c->store_ = std::make_unique<SimStore>(
        block_bytes > 0 ? static_cast<int64_t>(static_cast<double>(o.store_bytes) / block_bytes)
                        : 0);
  }
  c->ReportAll();
  return c;
}

absl::StatusOr<size_t> ClusterSim::NewNode(WorkerKind kind, NodeState state) {
  const size_t i = nodes_.size();
  const SimCalibration& cal = options_.calibration;
  const double speed = i < options_.speeds.size() ? options_.speeds[i] : 1.0;
  auto timing = std::make_shared<const SimTiming>(cal, speed);
  SimWorkerOptions wo = options_.worker;
  wo.kind = kind;
  wo.timing = timing;
  const char* role = kind == WorkerKind::kPrefill  ? "prefill"
                     : kind == WorkerKind::kDecode ? "decode"
                                                   : "worker";
  wo.id = absl::StrCat(role, "-", i);
  Node node;
  ASSIGN_OR_RETURN(node.worker, SimWorker::Create(loop_, backend_.get(), std::move(wo)));
  node.kind = kind;
  node.state = state;
  node.born_s = loop_->now();
  node.slot = index_->AddWorker();
  node.link = links_.AddLink(cal.link_bandwidth_bytes_per_s, cal.link_latency_s);
  node.store_link = links_.AddLink(cal.store_read_bytes_per_s, cal.store_latency_s);
  nodes_.push_back(std::move(node));
  timings_.push_back(std::move(timing));
  return i;
}

int ClusterSim::gpus() const {
  int n = 0;
  for (const Node& node : nodes_) n += node.state != NodeState::kGone ? 1 : 0;
  return n * std::max(1, options_.calibration.gpus_per_worker);
}

double ClusterSim::gpu_seconds() const {
  double seconds = 0;
  for (const Node& node : nodes_) {
    seconds += (node.state == NodeState::kGone ? node.gone_s : loop_->now()) - node.born_s;
  }
  return seconds * std::max(1, options_.calibration.gpus_per_worker);
}

int64_t ClusterSim::worker_kv_tokens() const {
  return nodes_[0].worker->pool().num_blocks() * options_.worker.block_tokens;
}

ClusterStats ClusterSim::stats() const {
  ClusterStats s = stats_;
  s.index_entries = index_->entries();
  s.busy_seconds = 0;
  for (const Node& n : nodes_) s.busy_seconds += n.worker->busy_seconds();
  return s;
}

bool ClusterSim::HasKind(WorkerKind kind) const {
  return kind == WorkerKind::kAggregated ? options_.aggregated > 0 : options_.aggregated == 0;
}

absl::Status ClusterSim::AddWorker(WorkerKind kind, double startup_s) {
  if (!HasKind(kind)) {
    return absl::InvalidArgumentError("the cluster has no workers of that kind");
  }
  ASSIGN_OR_RETURN(const size_t n, NewNode(kind, NodeState::kStarting));
  ++stats_.workers_added;
  loop_->After(std::max(0.0, startup_s), [this, n] {
    Node& node = nodes_[n];
    if (node.state != NodeState::kStarting) return;  // stopped while starting
    node.state = NodeState::kReady;
    // Its Watch stream's first report, then it is a candidate.
    node.worker->Report(index_.get(), node.slot);
    node.unreported_kv_tokens = 0;
    Pump();
  });
  return absl::OkStatus();
}

absl::Status ClusterSim::DrainWorker(WorkerKind kind) {
  if (!HasKind(kind)) {
    return absl::InvalidArgumentError("the cluster has no workers of that kind");
  }
  // A starting worker goes first, at once (the newest: it has waited least).
  for (size_t i = nodes_.size(); i-- > 0;) {
    Node& n = nodes_[i];
    if (n.kind != kind || n.state != NodeState::kStarting) continue;
    n.state = NodeState::kGone;
    n.gone_s = loop_->now();
    index_->RemoveWorker(n.slot);
    ++stats_.workers_gone;
    return absl::OkStatus();
  }
  size_t least = kNone;
  int ready = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.kind != kind || n.state != NodeState::kReady) continue;
    ++ready;
    const auto load = [](const Node& x) {
      return std::make_pair(x.inflight, x.active_tokens + x.pending_prefill_tokens);
    };
    if (least == kNone || load(n) < load(nodes_[least])) least = i;
  }
  if (ready <= 1) {
    return absl::FailedPreconditionError(
        "the last ready worker of its kind is not drained (scale to zero is not simulated)");
  }
  Node& n = nodes_[least];
  n.state = NodeState::kDraining;
  ++stats_.workers_drained;
  loop_->After(options_.drain_grace_s, [this, least] { GraceOver(least); });
  MaybeGone(least);
  return absl::OkStatus();
}

void ClusterSim::GraceOver(size_t node) {
  Node& n = nodes_[node];
  if (n.state != NodeState::kDraining) return;
  n.parking = true;
  // The streams running there (a prefill-only request finishes on its own).
  for (const auto& [seq, job] : live_) {
    if (job->worker == node && job->on_engine) n.worker->Park(job->id);
  }
}

void ClusterSim::Release(size_t node) {
  --nodes_[node].inflight;
  MaybeGone(node);
}

void ClusterSim::MaybeGone(size_t node) {
  Node& n = nodes_[node];
  if (n.state != NodeState::kDraining || n.inflight > 0) return;
  n.state = NodeState::kGone;
  n.gone_s = loop_->now();
  index_->RemoveWorker(n.slot);
  ++stats_.workers_gone;
}

PoolCounts ClusterSim::pool_counts(WorkerKind kind) const {
  PoolCounts c;
  for (const Node& n : nodes_) {
    if (n.kind != kind) continue;
    c.starting += n.state == NodeState::kStarting ? 1 : 0;
    c.ready += n.state == NodeState::kReady ? 1 : 0;
    c.draining += n.state == NodeState::kDraining ? 1 : 0;
  }
  return c;
}

namespace {
PoolRole RoleOf(WorkerKind kind) {
  return kind == WorkerKind::kPrefill  ? PoolRole::kPrefill
         : kind == WorkerKind::kDecode ? PoolRole::kDecode
                                       : PoolRole::kAggregated;
}
}  // namespace

Snapshot ClusterSim::PlannerSnapshot() const {
  Snapshot s;
  s.time_s = loop_->now();
  s.routers = 1;
  s.counters = counters_;
  for (int r = 0; r < kPoolRoles; ++r) {
    PoolSample& pool = s.pools[static_cast<size_t>(r)];
    pool.spec_replicas = 0;
    pool.queue_wait_seconds_sum = queue_wait_sum_[static_cast<size_t>(r)];
    pool.queue_wait_count = queue_wait_count_[static_cast<size_t>(r)];
  }
  for (const Node& n : nodes_) {
    PoolSample& pool = s.pool(RoleOf(n.kind));
    if (n.state == NodeState::kGone) continue;
    if (n.state == NodeState::kStarting) {
      ++pool.starting;
      ++pool.spec_replicas;
      continue;  // the router does not list it yet
    }
    if (n.state == NodeState::kReady) ++pool.spec_replicas;
    const SimWorkerLoad& load = n.worker->load();
    WorkerSample w;
    w.id = n.worker->id();
    w.ready = n.state == NodeState::kReady;
    w.draining = n.state == NodeState::kDraining;
    w.busy_fraction = load.busy_fraction;
    w.prefill_tokens_per_second = load.prefill_tokens_per_second;
    w.decode_tokens_per_second = load.decode_tokens_per_second;
    w.step_time_ms = load.step_time_ms;
    w.running_requests = load.running_requests;
    w.max_running_requests = n.worker->options().max_running;
    w.queued_requests = load.queued_requests;
    w.queued_tokens = load.queued_tokens;
    w.running_tokens = load.running_tokens;
    w.block_tokens = options_.worker.block_tokens;
    w.total_kv_blocks = load.total_blocks;
    w.free_kv_blocks = load.free_blocks;
    w.cached_kv_blocks = load.cached_blocks;
    w.inflight = n.inflight;
    w.pending_prefill_tokens = n.pending_prefill_tokens;
    w.active_tokens = n.active_tokens;
    pool.workers.push_back(std::move(w));
  }
  s.queued_requests = static_cast<int64_t>(queue_.size());
  for (const std::shared_ptr<Job>& job : queue_) s.queued_tokens += job->state.prompt_tokens;
  return s;
}

void ClusterSim::ReportAll() {
  for (Node& n : nodes_) {
    // Starting workers have no Watch stream yet; gone ones have left the index.
    if (n.state != NodeState::kReady && n.state != NodeState::kDraining) continue;
    n.worker->Report(index_.get(), n.slot);
    n.unreported_kv_tokens = 0;
  }
  RetryHandoffs();
  ExpireQueue();
  Pump();
  loop_->After(options_.report_interval_s, [this] { ReportAll(); });
}

std::vector<size_t> ClusterSim::Available() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].state != NodeState::kReady) continue;  // starting, draining or gone
    const SimWorkerOptions& w = nodes_[i].worker->options();
    if (nodes_[i].inflight >= w.max_running + w.max_queued) continue;  // at capacity
    out.push_back(i);
  }
  return out;
}

std::vector<WorkerLoadView> ClusterSim::Views(const std::vector<size_t>& nodes) const {
  std::vector<WorkerLoadView> views;
  views.reserve(nodes.size());
  for (size_t i : nodes) {
    const Node& n = nodes_[i];
    const SimWorkerLoad& load = n.worker->load();
    WorkerLoadView v;
    v.id = n.worker->id();
    v.kind = n.worker->options().kind;
    v.slot = n.slot;
    v.inflight = n.inflight;
    v.queued_tokens = load.queued_tokens;
    v.running_tokens = load.running_tokens;
    v.free_kv_blocks = load.free_blocks;
    v.total_kv_blocks = load.total_blocks;
    v.cached_kv_blocks = load.cached_blocks;
    v.load_reports = load.reports;
    v.unreported_kv_tokens = n.unreported_kv_tokens;
    v.pending_prefill_tokens = n.pending_prefill_tokens;
    v.active_tokens = n.active_tokens;
    v.prefill_tokens_per_second = load.prefill_tokens_per_second;
    v.step_time_ms = load.step_time_ms;
    views.push_back(std::move(v));
  }
  return views;
}

std::optional<std::pair<size_t, RouteChoice>> ClusterSim::Choose(const std::shared_ptr<Job>& job,
                                                                 bool prefill) {
  const std::vector<size_t> available = Available();
  const std::vector<WorkerLoadView> views = Views(available);
  const std::vector<size_t> picked =
      prefill ? PrefillCandidates(views, job->state) : StreamCandidates(views, job->state);
  if (picked.empty()) return std::nullopt;
  std::vector<WorkerLoadView> candidates;
  candidates.reserve(picked.size());
  for (size_t i : picked) candidates.push_back(views[i]);
  const RouteChoice choice = policy_->Choose(candidates, job->state.Route());
  ++stats_.reasons[choice.reason];
  return std::make_pair(available[picked[choice.index]], choice);
}

void ClusterSim::Send(const LoadRequest& request, std::function<void(const RequestRecord&)> done) {
  auto job = std::make_shared<Job>();
  job->request = request;
  job->done = std::move(done);
  job->record.id = request.id;
  job->record.start_s = loop_->now();
  job->record.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  job->record.store_tokens = 0;
  const int32_t bt = options_.worker.block_tokens;
  JobRecord& state = job->state;
  state.request_id = absl::StrCat("r", request.id);
  state.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  state.block_hashes = ComputeBlockHashes({fingerprint_, "", ""}, request.prompt, bt);
  state.block_tokens = bt;
  if (store_ != nullptr) {
    const int64_t reusable =
        std::min<int64_t>(ReusableBlocks(static_cast<int64_t>(request.prompt.size()), bt),
                          static_cast<int64_t>(state.block_hashes.size()));
    state.store_prefix_blocks =
        store_->Prefix(absl::MakeConstSpan(state.block_hashes).subspan(0, reusable));
  }
  ++in_flight_;
  job->seq = next_job_++;
  live_.emplace(job->seq, job);
  const int64_t queued = static_cast<int64_t>(queue_.size());
  Admission admission = AdmitNew(false, queued, 0, state.prompt_tokens, limits_);
  if (admission.what == Admit::kStart) {
    if (TryStart(job)) return;
    admission = AdmitUnstarted(false, queued, 0, state.prompt_tokens, limits_);
  }
  if (admission.what == Admit::kReject) {
    Finish(job, false, std::string(admission.status.message()));
    return;
  }
  Enqueue(job, /*front=*/false);
}

void ClusterSim::Enqueue(const std::shared_ptr<Job>& job, bool front) {
  if (!job->counted_queued) ++stats_.queued;
  job->counted_queued = true;
  EnterQueue(&job->state, loop_->Now());
  if (front) {
    queue_.push_front(job);
  } else {
    queue_.push_back(job);
  }
}

void ClusterSim::LeftQueue(const std::shared_ptr<Job>& job) {
  const double waited = absl::ToDoubleSeconds(LeaveQueue(&job->state, loop_->Now()));
  stats_.max_queue_wait_s = std::max(stats_.max_queue_wait_s, waited);
  // ferry_router_queue_wait_seconds{pool}: the pool of the worker that took it.
  const size_t pool = static_cast<size_t>(RoleOf(job->state.role));
  queue_wait_sum_[pool] += waited;
  ++queue_wait_count_[pool];
}

void ClusterSim::ExpireQueue() {
  std::vector<std::shared_ptr<Job>> expired;
  for (auto it = queue_.begin(); it != queue_.end();) {
    const QueueExpiry e =
        QueuedWait((*it)->state, loop_->Now(), WaitCause((*it)->state, true), limits_);
    if (!e.expired()) {
      ++it;
      continue;
    }
    expired.push_back(*it);
    it = queue_.erase(it);
    const double waited = absl::ToDoubleSeconds(LeaveQueue(&expired.back()->state, loop_->Now()));
    stats_.max_queue_wait_s = std::max(stats_.max_queue_wait_s, waited);
    PoolRole role = PoolRole::kAggregated;
    ParsePoolRole(QueuePool(Views(Available()), expired.back()->state, /*started=*/false), &role);
    queue_wait_sum_[static_cast<size_t>(role)] += waited;
    ++queue_wait_count_[static_cast<size_t>(role)];
    ++stats_.queue_expired;
    expired.back()->record.error = std::string(e.status.message());
  }
  for (const std::shared_ptr<Job>& job : expired) {
    const std::string error = job->record.error;
    Finish(job, false, error);
  }
}

void ClusterSim::Pump() {
  while (!queue_.empty()) {
    std::shared_ptr<Job> job = queue_.front();
    queue_.pop_front();
    job->state.queued = false;
    if (!TryStart(job)) {  // (a refusal inside TryStart requeues the job itself)
      job->state.queued = true;
      queue_.push_front(std::move(job));
      return;
    }
    LeftQueue(job);
  }
}

bool ClusterSim::TryStart(const std::shared_ptr<Job>& job) {
  // An aggregated worker, or a decode worker while a prefill worker can take the request too
  // (the dispatch rules' stream candidates).
  const auto chosen = Choose(job, /*prefill=*/false);
  if (!chosen.has_value()) return false;
  const auto& [w, choice] = *chosen;
  job->id = absl::StrCat(job->state.request_id, "-", job->state.attempts);
  ++job->state.attempts;
  job->state.role = nodes_[w].worker->options().kind;
  job->worker = w;
  ++nodes_[w].inflight;
  if (job->state.role != WorkerKind::kDecode) {
    job->pending = job->state.Uncached(choice);
    nodes_[w].pending_prefill_tokens += job->pending;
    ReadThenSubmit(w, job, BaseRequest(job, w));
    return true;
  }
  // P/D: the decode worker reserves first.
  job->active = job->state.prompt_tokens;
  nodes_[w].active_tokens += job->active;
  nodes_[w].unreported_kv_tokens += job->active;
  nodes_[w].worker->Reserve(job->state.block_hashes, job->state.prompt_tokens,
                            [this, job, d = w](absl::StatusOr<KvReservation> got) {
                              if (!got.ok()) return Refused(job, d, got.status(), true);
                              job->reserved = true;
                              job->reservation = *std::move(got);
                              StartPrefill(job);
                            });
  return true;
}

void ClusterSim::StartPrefill(const std::shared_ptr<Job>& job) {
  const auto chosen = Choose(job, /*prefill=*/true);
  if (!chosen.has_value()) {
    // As the router's stream: the prefill finds no worker, the attempt ends before its first
    // token (the decode worker's reservation is given back) and is retried.
    AttemptOutcome outcome;
    outcome.worker = nodes_[job->worker].worker->id();
    outcome.status = absl::UnavailableError("no prefill worker can take the request now");
    outcome.retryable = true;
    return AttemptEnded(job, outcome);
  }
  const auto& [p, choice] = *chosen;
  job->prefill = p;
  job->pending = job->state.Uncached(choice);
  ++nodes_[p].inflight;
  nodes_[p].pending_prefill_tokens += job->pending;
  EngineRequest r = BaseRequest(job, p);
  r.role = EngineRole::kPrefillOnly;
  ReadThenSubmit(p, job, std::move(r));
}

EngineRequest ClusterSim::BaseRequest(const std::shared_ptr<Job>& job, size_t node) {
  EngineRequest r;
  r.id = job->id;
  r.prompt = job->request.prompt;
  r.max_tokens = std::max<int64_t>(1, job->request.max_tokens);
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.on_event = [this, job, node](const TokenEvent& e) { OnEvent(job, node, e); };
  if (store_ != nullptr) {
    r.on_computed_blocks = [this, node](absl::Span<const ComputedBlock> blocks) {
      KvBlockPool& pool = nodes_[node].worker->pool();
      const size_t bytes = pool.layout().block_bytes();
      for (const ComputedBlock& b : blocks) {
        store_->Put(b.hash, std::string(BlockBytes(pool, b.block), bytes));
      }
    };
  }
  return r;
}

void ClusterSim::ReadThenSubmit(size_t node, const std::shared_ptr<Job>& job,
                                EngineRequest request) {
  const int32_t bt = options_.worker.block_tokens;
  const int64_t full =
      std::min<int64_t>(ReusableBlocks(static_cast<int64_t>(request.prompt.size()), bt),
                        static_cast<int64_t>(job->state.block_hashes.size()));
  if (store_ == nullptr || full <= 0) return SubmitTo(node, job, std::move(request));
  SimWorker& w = *nodes_[node].worker;
  const absl::Span<const Hash128> chain =
      absl::MakeConstSpan(job->state.block_hashes).subspan(0, full);
  const int64_t local = w.engine().kv_events().CachedPrefix(chain);
  if (local >= full) {
    ++stats_.store_lookups["memory"];
    return SubmitTo(node, job, std::move(request));
  }
  const int64_t present = store_->Prefix(chain.subspan(local));
  if (present == 0) {
    ++stats_.store_lookups["miss"];
    return SubmitTo(node, job, std::move(request));
  }
  const int64_t max_fresh = std::max<int64_t>(1, w.pool().num_blocks() / 2);
  auto shared = std::make_shared<EngineRequest>(std::move(request));
  w.ReserveImport(
      std::vector<Hash128>(chain.begin(), chain.begin() + local + present), max_fresh,
      [this, node, job, shared, bt](absl::StatusOr<KvReservation> got) {
        if (!got.ok()) {
          ++stats_.store_lookups["no_room"];
          return SubmitTo(node, job, std::move(*shared));
        }
        SimWorker& w = *nodes_[node].worker;
        KvBlockPool& pool = w.pool();
        const std::vector<BlockId>& blocks = got->blocks;
        const int64_t cached = got->cached_blocks;
        int64_t loaded = 0;
        for (size_t i = static_cast<size_t>(cached); i < blocks.size(); ++i, ++loaded) {
          const std::string* bytes = store_->Get(job->state.block_hashes[i]);
          if (bytes == nullptr) break;  // evicted meanwhile: the run ends here
          std::memcpy(BlockBytes(pool, blocks[i]), bytes->data(), bytes->size());
        }
        CHECK_OK(pool.Release(absl::MakeConstSpan(blocks).subspan(cached + loaded)));
        if (loaded == 0) {
          ++stats_.store_lookups["miss"];
          CHECK_OK(pool.Release(absl::MakeConstSpan(blocks).subspan(0, cached)));
          w.Wake();
          return SubmitTo(node, job, std::move(*shared));
        }
        ++stats_.store_reads;
        ++stats_.store_lookups["read"];
        stats_.store_blocks_read += loaded;
        const double bytes = options_.calibration.kv_bytes_per_token * loaded * bt;
        stats_.store_bytes_read += bytes;
        shared->imported_blocks.assign(blocks.begin(), blocks.begin() + cached + loaded);
        shared->imported_cached_blocks = cached;
        links_.Transfer({nodes_[node].store_link}, bytes,
                        [this, node, job, shared] { SubmitTo(node, job, std::move(*shared)); });
      });
}

void ClusterSim::SubmitTo(size_t node, const std::shared_ptr<Job>& job, EngineRequest request) {
  const std::vector<BlockId> imported = request.imported_blocks;
  const bool decode_only = request.role == EngineRole::kDecodeOnly;
  const std::string id = request.id;
  const absl::Status submitted = nodes_[node].worker->Submit(std::move(request));
  if (submitted.ok()) {
    if (node == job->worker) {
      job->on_engine = true;
      if (nodes_[node].parking) nodes_[node].worker->Park(id);  // a drain past its grace
    }
    return;
  }
  // Refused: the imported blocks are still ours (a decode-only request's: the reservation's).
  if (!imported.empty()) {
    CHECK_OK(nodes_[node].worker->pool().Release(imported));
    nodes_[node].worker->Wake();
  }
  if (decode_only) job->reserved = false;
  Refused(job, node, submitted);
}

void ClusterSim::Refused(const std::shared_ptr<Job>& job, size_t node, const absl::Status& why,
                         bool reservation) {
  AttemptOutcome outcome;
  outcome.worker = nodes_[job->worker != kNone ? job->worker : node].worker->id();
  outcome.failed = nodes_[node].worker->id();
  outcome.status =
      absl::Status(why.code(), absl::StrCat(nodes_[node].worker->id(), ": ", why.message()));
  // The first token reached the client already (a decode worker refusing the continuation).
  outcome.started = job->first;
  outcome.retryable = RetryableCode(why.code());
  outcome.migrate_cause = MigrationCause(false, true, why.code());
  outcome.error_event = true;
  if (reservation && why.code() == absl::StatusCode::kResourceExhausted) {
    // As the decode worker's error event says (ErrorInfo.kv_blocks_needed).
    const int64_t bt = std::max<int64_t>(1, options_.worker.block_tokens);
    outcome.kv_blocks_needed = (job->state.prompt_tokens + bt - 1) / bt;
    outcome.kv_reports = nodes_[node].worker->load().reports;
  }
  AttemptEnded(job, outcome);
}

void ClusterSim::OnEvent(const std::shared_ptr<Job>& job, size_t node, const TokenEvent& e) {
  const bool ok = e.finish == FinishReason::kStop || e.finish == FinishReason::kLength;
  if (node == job->prefill) {
    if (e.has_token) {
      job->first_token = e.token;
      job->record.cached_tokens = e.cached_tokens;
      job->record.store_tokens = e.imported_tokens;
    }
    if (e.finish == FinishReason::kHandoff) return Handoff(job, node, e);
    if (e.finish == FinishReason::kNone) return;
    // The request ended on the prefill worker (its first token was its last, or an error): the
    // decode worker's reservation is not needed.
    if (job->reserved) {
      CHECK_OK(nodes_[job->worker].worker->pool().Release(job->reservation.blocks));
      nodes_[job->worker].worker->Wake();
      job->reserved = false;
    }
    if (ok && e.has_token) Token(job, e.token);
    if (ok) return Finish(job, true, "");
    // The prefill failed: the router's prefill call fails, and its stream with it.
    AttemptOutcome outcome;
    outcome.worker = nodes_[job->worker].worker->id();
    outcome.failed = nodes_[node].worker->id();
    outcome.status = absl::Status(
        e.error_code == absl::StatusCode::kOk ? absl::StatusCode::kInternal : e.error_code,
        absl::StrCat("prefill worker ", outcome.failed, ": ", e.error));
    outcome.retryable = outcome.status.code() != absl::StatusCode::kInvalidArgument &&
                        outcome.status.code() != absl::StatusCode::kCancelled;
    return AttemptEnded(job, outcome);
  }
  if (e.finish == FinishReason::kHandoff) return Parked(job, node, e);
  if (e.has_token) {
    if (options_.aggregated > 0 && !job->first) {  // the worker computed the prompt
      job->record.cached_tokens = e.cached_tokens;
      job->record.store_tokens = e.imported_tokens;
      nodes_[node].pending_prefill_tokens -= job->pending;
      job->pending = 0;
    }
    Token(job, e.token);
  }
  if (e.finish != FinishReason::kNone) {
    Finish(job, ok, ok ? "" : (e.error.empty() ? FinishReasonName(e.finish) : e.error));
  }
}

void ClusterSim::Handoff(const std::shared_ptr<Job>& job, size_t p, const TokenEvent& e) {
  Node& pn = nodes_[p];
  pn.pending_prefill_tokens -= job->pending;
  job->pending = 0;
  job->sampler_state = e.sampler_state;
  job->held_text = e.held_text;
  const int32_t bt = options_.worker.block_tokens;
  const int64_t positions = static_cast<int64_t>(job->request.prompt.size());
  const int64_t cached = job->reservation.cached_blocks;
  const double bytes = options_.calibration.kv_bytes_per_token *
                       static_cast<double>(std::max<int64_t>(0, positions - cached * bt));
  stats_.handoff_bytes += bytes;
  const std::vector<BlockId> source = e.blocks;
  const size_t d = job->worker;
  links_.Transfer({pn.link, nodes_[d].link}, bytes, [this, job, p, d, source, cached] {
    // The KV lands in the decode worker's reserved blocks; the prefill worker lets go of it.
    KvBlockPool& from = nodes_[p].worker->pool();
    KvBlockPool& to = nodes_[d].worker->pool();
    const size_t n = std::min(source.size(), job->reservation.blocks.size());
    for (size_t i = static_cast<size_t>(cached); i < n; ++i) {
      std::memcpy(BlockBytes(to, job->reservation.blocks[i]), BlockBytes(from, source[i]),
                  from.layout().block_bytes());
    }
    nodes_[p].worker->ReleaseHandoff(job->id);
    job->prefill = kNone;
    Release(p);
    Token(job, job->first_token);  // the first token reaches the client with the KV
    EngineRequest r = BaseRequest(job, d);
    r.role = EngineRole::kDecodeOnly;
    ResumePoint point;
    point.generated = {job->first_token};
    point.sampler_state = job->sampler_state;
    point.held_text = job->held_text;
    r.resume.push_back(std::move(point));
    r.imported_blocks = job->reservation.blocks;
    job->reserved = false;  // the engine owns them once it accepts them
    SubmitTo(d, job, std::move(r));
  });
}

void ClusterSim::Parked(const std::shared_ptr<Job>& job, size_t node, const TokenEvent& e) {
  // The drain parked the stream: its KV (prompt and output but the last token) stays on `node`
  // until a target has it.
  job->on_engine = false;
  job->parked_on = node;
  job->parked_id = job->id;
  job->parked_blocks = e.blocks;
  job->sampler_state = e.sampler_state;
  job->held_text = e.held_text;
  HandoffPlan plan;
  plan.endpoint = plan.source = nodes_[node].worker->id();
  plan.request_id = job->id;
  plan.role = nodes_[node].kind;
  job->state.handoff = plan;
  job->state.resumed_tokens = static_cast<int64_t>(job->generated.size());
  if (TryHandoff(job)) return;
  ++stats_.drain_handoff_waits;
  handoff_waiting_.push_back(job);
}

bool ClusterSim::TryHandoff(const std::shared_ptr<Job>& job) {
  const std::vector<size_t> available = Available();
  const std::vector<WorkerLoadView> views = Views(available);
  std::vector<std::string> endpoints;
  for (const WorkerLoadView& v : views) endpoints.push_back(v.id);
  std::vector<size_t> targets;
  for (size_t i : HandoffTargets(views, endpoints, job->state)) {
    if (KvRoom(views[i], job->state)) targets.push_back(i);
  }
  if (targets.empty()) return false;
  std::vector<WorkerLoadView> candidates;
  for (size_t i : targets) candidates.push_back(views[i]);
  const RouteChoice choice = policy_->Choose(candidates, job->state.Route());
  ++stats_.reasons[choice.reason];
  const size_t t = available[targets[choice.index]];
  const size_t source = job->parked_on;
  // The target reserves the prompt and the output but its last token (the positions computed).
  std::vector<TokenId> computed = job->request.prompt;
  computed.insert(computed.end(), job->generated.begin(), job->generated.end() - 1);
  const int32_t bt = options_.worker.block_tokens;
  std::vector<Hash128> hashes = ComputeBlockHashes({fingerprint_, "", ""}, computed, bt);
  const int64_t positions = static_cast<int64_t>(computed.size());
  ++nodes_[t].inflight;
  nodes_[t].active_tokens += job->active;
  nodes_[t].unreported_kv_tokens += positions;
  nodes_[t].worker->Reserve(
      std::move(hashes), positions,
      [this, job, t, source, positions, bt](absl::StatusOr<KvReservation> got) {
        if (!got.ok()) {
          // No room after all: the KV waits on the source for the next report.
          job->state.kv_refused[nodes_[t].worker->id()] = nodes_[t].worker->load().reports;
          nodes_[t].active_tokens -= job->active;
          Release(t);
          ++stats_.drain_handoff_waits;
          handoff_waiting_.push_back(job);
          return;
        }
        auto reservation = std::make_shared<KvReservation>(*std::move(got));
        const int64_t cached = reservation->cached_blocks;
        const double bytes = options_.calibration.kv_bytes_per_token *
                             static_cast<double>(std::max<int64_t>(0, positions - cached * bt));
        stats_.drain_handoff_bytes += bytes;
        links_.Transfer(
            {nodes_[source].link, nodes_[t].link}, bytes,
            [this, job, t, source, reservation, cached] {
              KvBlockPool& from = nodes_[source].worker->pool();
              KvBlockPool& to = nodes_[t].worker->pool();
              const size_t n = std::min(job->parked_blocks.size(), reservation->blocks.size());
              for (size_t i = static_cast<size_t>(cached); i < n; ++i) {
                std::memcpy(BlockBytes(to, reservation->blocks[i]),
                            BlockBytes(from, job->parked_blocks[i]), from.layout().block_bytes());
              }
              nodes_[source].worker->ReleaseHandoff(job->parked_id);
              nodes_[source].active_tokens -= job->active;
              job->parked_on = kNone;
              job->parked_blocks.clear();
              job->state.handoff = HandoffPlan();
              job->worker = t;
              Release(source);
              ++stats_.drain_handoffs;
              job->id = absl::StrCat(job->state.request_id, "-", job->state.attempts);
              ++job->state.attempts;
              EngineRequest r = BaseRequest(job, t);
              r.role = EngineRole::kDecodeOnly;
              ResumePoint point;
              point.generated = job->generated;
              point.sampler_state = job->sampler_state;
              point.held_text = job->held_text;
              r.resume.push_back(std::move(point));
              r.imported_blocks = reservation->blocks;
              SubmitTo(t, job, std::move(r));
            });
      });
  return true;
}

void ClusterSim::RetryHandoffs() {
  std::deque<std::shared_ptr<Job>> waiting;
  waiting.swap(handoff_waiting_);
  for (std::shared_ptr<Job>& job : waiting) {
    if (!TryHandoff(job)) handoff_waiting_.push_back(std::move(job));
  }
}

SloRecord RouterSloRecord(const RequestRecord& record) {
  SloRecord r;
  r.dispatched = true;
  r.failed = !record.ok;
  r.first_token = record.output_tokens > 0;
  r.ttft_seconds = record.ttft_s;
  // As Summarize's TPOT (load_report.h), so that the two judge alike.
  r.decode_seconds = record.e2e_s - record.ttft_s;
  r.tokens_after_first = std::max<int64_t>(0, record.output_tokens - 1);
  return r;
}

void ClusterSim::Count(const Job& job) {
  const RequestRecord& r = job.record;
  ++counters_.requests;
  counters_.completion_tokens += r.output_tokens;
  if (r.ok) {
    counters_.prompt_tokens += r.prompt_tokens;
    counters_.computed_prompt_tokens += r.prompt_tokens - r.cached_tokens;
  }
  const SloJudgement j = JudgeSlo(RouterSloRecord(r), options_.slo);
  counters_.ttft_met += j.ttft == SloResult::kMet ? 1 : 0;
  counters_.ttft_missed += j.ttft == SloResult::kMissed ? 1 : 0;
  counters_.itl_met += j.itl == SloResult::kMet ? 1 : 0;
  counters_.itl_missed += j.itl == SloResult::kMissed ? 1 : 0;
}

void ClusterSim::Token(const std::shared_ptr<Job>& job, TokenId token) {
  if (options_.on_token) options_.on_token(job->request.id, token);
  const double now = loop_->now();
  if (!job->first) {
    job->first = true;
    job->record.ttft_s = now - job->record.start_s;
  } else {
    job->record.itl_s.push_back(now - job->last_token);
  }
  job->last_token = now;
  ++job->record.output_tokens;
  job->generated.push_back(token);
}

void ClusterSim::AttemptEnded(const std::shared_ptr<Job>& job, const AttemptOutcome& outcome) {
  // The decode worker's reservation goes back whatever follows.
  if (job->reserved) {
    CHECK_OK(nodes_[job->worker].worker->pool().Release(job->reservation.blocks));
    nodes_[job->worker].worker->Wake();
    job->reserved = false;
  }
  Decision decision = DecideAfterAttempt(job->state, outcome, limits_, loop_->Now());
  ApplyDecision(decision, &job->state);
  if (decision.next == Next::kEnd) return Finish(job, false, std::string(decision.end.message()));
  // A retry, or a wait for KV room (a request that sent output never moves here:
  // max_migrations is 0).
  Leave(job);
  job->record.cached_tokens = 0;
  job->record.store_tokens = 0;
  if (decision.next == Next::kQueue) {
    ++stats_.kv_waits;
    return Enqueue(job, /*front=*/true);  // started again by Pump, when a report shows room
  }
  ++stats_.retries;
  // Restarted at the next event (not from inside the refusing worker's callback).
  loop_->After(0, [this, job, decision]() mutable {
    if (TryStart(job)) return;
    RestartFoundNoWorker(false, &decision);
    Enqueue(job, /*front=*/true);
  });
}

void ClusterSim::Leave(const std::shared_ptr<Job>& job) {
  job->on_engine = false;
  if (job->prefill != kNone) {
    const size_t p = job->prefill;
    nodes_[p].pending_prefill_tokens -= job->pending;
    job->prefill = kNone;
    Release(p);
  }
  if (job->worker != kNone) {
    const size_t w = job->worker;
    nodes_[w].active_tokens -= job->active;
    if (options_.aggregated > 0) nodes_[w].pending_prefill_tokens -= job->pending;
    job->worker = kNone;
    Release(w);
  }
  job->pending = job->active = 0;
}

void ClusterSim::Finish(const std::shared_ptr<Job>& job, bool ok, const std::string& error) {
  Leave(job);
  job->record.ok = ok;
  job->record.error = ok ? "" : error;
  job->record.e2e_s = loop_->now() - job->record.start_s;
  --in_flight_;
  live_.erase(job->seq);
  Count(*job);
  auto done = std::move(job->done);
  if (done) done(job->record);
  Pump();
}

}  // namespace ferry
