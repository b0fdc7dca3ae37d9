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
  const SimCalibration& cal = o.calibration;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const double speed = i < o.speeds.size() ? o.speeds[i] : 1.0;
    if (!(speed > 0)) return absl::InvalidArgumentError("worker speeds must be > 0");
    auto timing = std::make_shared<const SimTiming>(cal, speed);
    SimWorkerOptions wo = o.worker;
    wo.kind = kinds[i];
    wo.timing = timing;
    const char* role = kinds[i] == WorkerKind::kPrefill  ? "prefill"
                       : kinds[i] == WorkerKind::kDecode ? "decode"
                                                         : "worker";
    wo.id = absl::StrCat(role, "-", i);
    Node node;
    ASSIGN_OR_RETURN(node.worker, SimWorker::Create(loop, c->backend_.get(), std::move(wo)));
    node.slot = c->index_->AddWorker();
    node.link = c->links_.AddLink(cal.link_bandwidth_bytes_per_s, cal.link_latency_s);
    node.store_link = c->links_.AddLink(cal.store_read_bytes_per_s, cal.store_latency_s);
    c->nodes_.push_back(std::move(node));
    c->timings_.push_back(std::move(timing));
  }
  c->fingerprint_ = c->nodes_[0].worker->model().fingerprint();
  if (o.store) {
    const double block_bytes = cal.kv_bytes_per_token * o.worker.block_tokens;
    c->store_ = std::make_unique<SimStore>(
        block_bytes > 0 ? static_cast<int64_t>(static_cast<double>(o.store_bytes) / block_bytes)
                        : 0);
  }
  c->ReportAll();
  return c;
}

int ClusterSim::gpus() const {
  return static_cast<int>(nodes_.size()) * std::max(1, options_.calibration.gpus_per_worker);
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

void ClusterSim::ReportAll() {
  for (Node& n : nodes_) {
    n.worker->Report(index_.get(), n.slot);
    n.unreported_kv_tokens = 0;
  }
  ExpireQueue();
  Pump();
  loop_->After(options_.report_interval_s, [this] { ReportAll(); });
}

std::vector<size_t> ClusterSim::Available() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < nodes_.size(); ++i) {
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
  if (local >= full) return SubmitTo(node, job, std::move(request));
  const int64_t present = store_->Prefix(chain.subspan(local));
  if (present == 0) return SubmitTo(node, job, std::move(request));
  const int64_t max_fresh = std::max<int64_t>(1, w.pool().num_blocks() / 2);
  auto shared = std::make_shared<EngineRequest>(std::move(request));
  w.ReserveImport(
      std::vector<Hash128>(chain.begin(), chain.begin() + local + present), max_fresh,
      [this, node, job, shared, bt](absl::StatusOr<KvReservation> got) {
        if (!got.ok()) return SubmitTo(node, job, std::move(*shared));
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
          CHECK_OK(pool.Release(absl::MakeConstSpan(blocks).subspan(0, cached)));
          w.Wake();
          return SubmitTo(node, job, std::move(*shared));
        }
        ++stats_.store_reads;
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
  const absl::Status submitted = nodes_[node].worker->Submit(std::move(request));
  if (submitted.ok()) return;
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
  if (e.has_token) {
    if (options_.aggregated > 0) {  // the worker computed the prompt
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
    --nodes_[p].inflight;
    job->prefill = kNone;
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
  if (job->prefill != kNone) {
    --nodes_[job->prefill].inflight;
    nodes_[job->prefill].pending_prefill_tokens -= job->pending;
    job->prefill = kNone;
  }
  if (job->worker != kNone) {
    --nodes_[job->worker].inflight;
    nodes_[job->worker].active_tokens -= job->active;
    if (options_.aggregated > 0) nodes_[job->worker].pending_prefill_tokens -= job->pending;
    job->worker = kNone;
  }
  job->pending = job->active = 0;
}

void ClusterSim::Finish(const std::shared_ptr<Job>& job, bool ok, const std::string& error) {
  Leave(job);
  job->record.ok = ok;
  job->record.error = ok ? "" : error;
  job->record.e2e_s = loop_->now() - job->record.start_s;
  --in_flight_;
  auto done = std::move(job->done);
  if (done) done(job->record);
  Pump();
}

}  // namespace ferry
