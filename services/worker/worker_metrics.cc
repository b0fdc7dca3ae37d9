#include "services/worker/worker_metrics.h"

#include <algorithm>

#include "services/common/metrics.h"

namespace ferry {

const char* RequestOutcomeName(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kCompleted:
      return "completed";
    case RequestOutcome::kAborted:
      return "aborted";
    case RequestOutcome::kCancelled:
      return "cancelled";
    case RequestOutcome::kDeadlineExceeded:
      return "deadline_exceeded";
    case RequestOutcome::kDrained:
      return "drained";
    case RequestOutcome::kError:
      return "error";
    case RequestOutcome::kInvalid:
      return "invalid";
    case RequestOutcome::kRejected:
      return "rejected";
  }
  return "?";
}

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry) {
  auto& outcomes = prometheus::BuildCounter()
                       .Name("ferry_worker_requests_total")
                       .Help("Generate calls by how they ended.")
                       .Register(registry);
  for (int i = 0; i < kNumRequestOutcomes; ++i) {
    outcomes_.push_back(
        &outcomes.Add({{"outcome", RequestOutcomeName(static_cast<RequestOutcome>(i))}}));
  }
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
  };
  queued_ = gauge("ferry_worker_queued_requests", "Sequences waiting for admission.");
  running_ = gauge("ferry_worker_running_requests", "Sequences holding KV blocks.");
  auto& blocks = prometheus::BuildGauge()
                     .Name("ferry_worker_kv_blocks")
                     .Help("KV blocks by state (cached blocks may also be in use).")
                     .Register(registry);
  blocks_used_ = &blocks.Add({{"state", "used"}});
  blocks_free_ = &blocks.Add({{"state", "free"}});
  blocks_cached_ = &blocks.Add({{"state", "cached"}});
  blocks_total_ = gauge("ferry_worker_kv_pool_blocks", "KV blocks in the pool.");
  busy_fraction_ = gauge("ferry_worker_busy_fraction",
                         "Engine step time over wall time, over --load_window (0..1).");
  kv_used_fraction_ = gauge("ferry_worker_kv_used_fraction",
                            "KV blocks held by requests over the pool's blocks (0..1; blocks "
                            "only the prefix cache holds are not counted).");
  running_fraction_ =
      gauge("ferry_worker_running_fraction", "Running sequences over --max_running (0..1).");
  queued_tokens_ =
      gauge("ferry_worker_queued_tokens", "Prompt tokens of the sequences waiting for admission.");
  refreshes_ = &prometheus::BuildCounter()
                    .Name("ferry_worker_load_refreshes_total")
                    .Help(
                        "Refreshes of the load gauges (queued, running, KV blocks) from the "
                        "engine, one per --watch_interval.")
                    .Register(registry)
                    .Add({});
  auto& prompt = prometheus::BuildCounter()
                     .Name("ferry_worker_prompt_tokens_total")
                     .Help(
                         "Prompt tokens by source: computed here, reused from this worker's "
                         "prefix cache (local), read from the KV store (store); decode workers: "
                         "held already, not pushed (decode_local).")
                     .Register(registry);
  prompt_computed_ = &prompt.Add({{"source", "computed"}});
  prompt_local_ = &prompt.Add({{"source", "local"}});
  prompt_store_ = &prompt.Add({{"source", "store"}});
  prompt_decode_local_ = &prompt.Add({{"source", "decode_local"}});
  store_lookups_ = &prometheus::BuildCounter()
                        .Name("ferry_worker_store_lookups_total")
                        .Help(
                            "Reads of a request's prefix from the KV store: hit, miss, memory "
                            "(nothing beyond this worker's cache), skipped.")
                        .Register(registry);
  for (const char* r : {"hit", "miss", "memory", "skipped"}) store_lookups_->Add({{"result", r}});
  store_existence_ = &prometheus::BuildCounter()
                          .Name("ferry_worker_store_existence_total")
                          .Help(
                              "How a prefix read knew what the KV store holds: router (the "
                              "router's probe, carried in the request), own (an Exists call).")
                          .Register(registry);
  for (const char* s : {"router", "own"}) store_existence_->Add({{"source", s}});
  store_read_blocks_ = &prometheus::BuildCounter()
                            .Name("ferry_worker_store_read_blocks_total")
                            .Help(
                                "KV store blocks asked for: loaded, missing (absent, corrupt, "
                                "node down), rejected (another KV layout), unsettled (a node "
                                "failed during a read by the KV transport: held back from the "
                                "pool a while).")
                            .Register(registry);
  for (const char* o : {"loaded", "missing", "rejected", "unsettled"}) {
    store_read_blocks_->Add({{"outcome", o}});
  }
  store_reads_ = &prometheus::BuildCounter()
                      .Name("ferry_worker_store_reads_total")
                      .Help(
                          "Reads of blocks from the KV store, by path: transport (the node's KV "
                          "transport put them into the pool's blocks), stream (in the Get "
                          "stream, copied into the blocks).")
                      .Register(registry);
  for (const char* p : {"transport", "stream"}) store_reads_->Add({{"path", p}});
  store_read_bytes_ = &prometheus::BuildCounter()
                           .Name("ferry_worker_store_read_bytes_total")
                           .Help("KV bytes read from the KV store.")
                           .Register(registry)
                           .Add({});
  store_read_seconds_ = &prometheus::BuildHistogram()
                             .Name("ferry_worker_store_read_seconds")
                             .Help("Time of one request's read from the KV store (with blocks).")
                             .Register(registry)
                             .Add({}, LatencyBucketsSeconds());
  store_write_blocks_ = &prometheus::BuildCounter()
                             .Name("ferry_worker_store_write_blocks_total")
                             .Help(
                                 "Computed KV blocks offered to the KV store: written, extended "
                                 "(the store had them with a shorter retention floor: written "
                                 "again), present (the store had them), dropped (queue full), "
                                 "failed.")
                             .Register(registry);
  for (const char* o : {"written", "extended", "present", "dropped", "failed"}) {
    store_write_blocks_->Add({{"outcome", o}});
  }
  store_written_bytes_ = &prometheus::BuildCounter()
                              .Name("ferry_worker_store_written_bytes_total")
                              .Help("KV bytes written to the KV store.")
                              .Register(registry)
                              .Add({});
  store_write_queue_bytes_ =
      gauge("ferry_worker_store_write_queue_bytes",
            "KV bytes waiting to be written to the store, or being written.");
  store_quarantined_blocks_ =
      gauge("ferry_worker_store_quarantined_blocks",
            "Pool blocks held back after a KV store node failed during a read by the KV "
            "transport (its puts may still reach them).");
  auto& window = prometheus::BuildCounter()
                     .Name("ferry_worker_window_cache_lookups_total")
                     .Help(
                         "Cached prefixes of hybrid models: their window layers' blocks cached "
                         "(hit), rebuilt by a replay, or not (miss: a shorter prefix taken).")
                     .Register(registry);
  window_hits_ = &window.Add({{"result", "hit"}});
  window_replays_ = &window.Add({{"result", "replay"}});
  window_misses_ = &window.Add({{"result", "miss"}});
  window_replayed_tokens_ =
      &prometheus::BuildCounter()
           .Name("ferry_worker_window_replayed_tokens_total")
           .Help("Positions replayed to rebuild the window layers' KV of cached prefixes.")
           .Register(registry)
           .Add({});
  window_expired_ = &prometheus::BuildCounter()
                         .Name("ferry_worker_window_cache_expired_blocks_total")
                         .Help("Window layers' cached blocks dropped by their TTL.")
                         .Register(registry)
                         .Add({});
  absent_image_rows_ =
      &prometheus::BuildCounter()
           .Name("ferry_worker_absent_image_rows_total")
           .Help(
               "Requests failed (UNAVAILABLE, retried by the router with the image) because the "
               "router sent an image without rows, predicting its positions cached, and they "
               "were not: a prediction miss.")
           .Register(registry)
           .Add({});
  generated_ = &prometheus::BuildCounter()
                    .Name("ferry_worker_generated_tokens_total")
                    .Help("Tokens sampled.")
                    .Register(registry)
                    .Add({});
  prefill_speed_ = gauge("ferry_worker_prefill_tokens_per_second",
                         "Prompt tokens per second of the recent steps that computed prompts.");
  auto& steps = prometheus::BuildHistogram()
                    .Name("ferry_worker_step_seconds")
                    .Help("Engine step time, by what the step ran.")
                    .Register(registry);
  step_decode_ = &steps.Add({{"kind", "decode"}}, LatencyBucketsSeconds());
  step_prefill_ = &steps.Add({{"kind", "prefill"}}, LatencyBucketsSeconds());
  step_mixed_ = &steps.Add({{"kind", "mixed"}}, LatencyBucketsSeconds());
  ttft_ = &prometheus::BuildHistogram()
               .Name("ferry_worker_ttft_seconds")
               .Help("Time from a Generate call's arrival to its first token.")
               .Register(registry)
               .Add({}, LatencyBucketsSeconds());
  experts_ = &prometheus::BuildCounter()
                  .Name("ferry_worker_expert_tokens_total")
                  .Help(
                      "Tokens routed to each expert (mixture-of-experts models), over the "
                      "sparse layers.")
                  .Register(registry);
  subscribers_ = gauge("ferry_worker_watch_subscribers", "Open Watch streams.");
  auto& snapshots = prometheus::BuildCounter()
                        .Name("ferry_worker_watch_snapshots_total")
                        .Help(
                            "Snapshots sent on Watch streams: initial, or lagged (the "
                            "subscriber fell behind the event journal).")
                        .Register(registry);
  snapshots_initial_ = &snapshots.Add({{"reason", "initial"}});
  snapshots_lagged_ = &snapshots.Add({{"reason", "lagged"}});
  unauthenticated_ = &prometheus::BuildCounter()
                          .Name("ferry_worker_unauthenticated_calls_total")
                          .Help("Calls refused for a missing or wrong shared token.")
                          .Register(registry)
                          .Add({});
  push_bytes_ =
      &prometheus::BuildHistogram()
           .Name("ferry_worker_kv_push_bytes")
           .Help("KV bytes one request pushed to its decode worker.")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{1 << 16, 1 << 18, 1 << 20, 1 << 22,
                                                            1 << 24, 1 << 26, 1 << 28, 1 << 30});
  push_seconds_ = &prometheus::BuildHistogram()
                       .Name("ferry_worker_kv_push_seconds")
                       .Help("Time one request's KV puts were in flight (any of them).")
                       .Register(registry)
                       .Add({}, LatencyBucketsSeconds());
  push_tail_seconds_ = &prometheus::BuildHistogram()
                            .Name("ferry_worker_kv_push_tail_seconds")
                            .Help(
                                "Time of one request's KV push after its prompt was computed "
                                "(what the first token waits for).")
                            .Register(registry)
                            .Add({}, LatencyBucketsSeconds());
  streamed_bytes_ = &prometheus::BuildCounter()
                         .Name("ferry_worker_kv_streamed_bytes_total")
                         .Help("KV bytes pushed while the prompt was still being computed.")
                         .Register(registry)
                         .Add({});
  auto& pushes = prometheus::BuildCounter()
                     .Name("ferry_worker_kv_pushes_total")
                     .Help("KV pushes to decode workers by outcome.")
                     .Register(registry);
  pushes_ok_ = &pushes.Add({{"outcome", "ok"}});
  pushes_failed_ = &pushes.Add({{"outcome", "failed"}});
  blocks_skipped_ = &prometheus::BuildCounter()
                         .Name("ferry_worker_kv_blocks_skipped_total")
                         .Help("KV blocks not pushed because the decode worker held them.")
                         .Register(registry)
                         .Add({});
  reservations_ = &prometheus::BuildCounter()
                       .Name("ferry_worker_kv_reservations_total")
                       .Help("Decode workers' KV reservations by outcome.")
                       .Register(registry);
  for (const char* o : {"landed", "timed_out", "failed", "no_blocks"}) {
    reservations_->Add({{"outcome", o}});
  }
  drains_ = &prometheus::BuildCounter()
                 .Name("ferry_worker_drains_total")
                 .Help("Drains started (SIGTERM or the Drain call).")
                 .Register(registry)
                 .Add({});
  drain_duration_ = &prometheus::BuildGauge()
                         .Name("ferry_worker_drain_duration_seconds")
                         .Help(
                             "The last drain, from its start until no call and no KV waiting "
                             "for its hand-off was left.")
                         .Register(registry)
                         .Add({});
  handoffs_ = &prometheus::BuildCounter()
                   .Name("ferry_worker_handoffs_total")
                   .Help(
                       "Requests running at the drain deadline, by what became of their KV: "
                       "pushed, failed, expired, not_parked.")
                   .Register(registry);
  for (const char* o : {"pushed", "failed", "expired", "not_parked"}) {
    handoffs_->Add({{"outcome", o}});
  }
  handoff_bytes_ = &prometheus::BuildCounter()
                        .Name("ferry_worker_handoff_bytes_total")
                        .Help("KV bytes handed off to the workers continuing drained requests.")
                        .Register(registry)
                        .Add({});
  precopies_ = &prometheus::BuildCounter()
                    .Name("ferry_worker_precopies_total")
                    .Help(
                        "Drain pre-copies pushed from running requests, by outcome: pushed, "
                        "refused, failed.")
                    .Register(registry);
  for (const char* o : {"pushed", "refused", "failed"}) precopies_->Add({{"outcome", o}});
  precopy_bytes_ = &prometheus::BuildCounter()
                        .Name("ferry_worker_precopy_bytes_total")
                        .Help(
                            "KV bytes pre-copied to the workers that will continue drained "
                            "requests.")
                        .Register(registry)
                        .Add({});
  handoffs_received_ = &prometheus::BuildCounter()
                            .Name("ferry_worker_handoffs_received_total")
                            .Help("Drained requests this worker continued with their KV.")
                            .Register(registry)
                            .Add({});
  handoff_received_bytes_ = &prometheus::BuildCounter()
                                 .Name("ferry_worker_handoff_received_bytes_total")
                                 .Help("KV bytes pushed here by draining workers.")
                                 .Register(registry)
                                 .Add({});
  handoff_seconds_ =
      &prometheus::BuildHistogram()
           .Name("ferry_worker_handoff_seconds")
           .Help("Per pushed hand-off: PushKv's arrival to the push's completion.")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                                            0.1, 0.2, 0.5, 1, 2, 5, 10});
  image_requests_ = &prometheus::BuildCounter()
                         .Name("ferry_worker_image_requests_total")
                         .Help(
                             "Requests with image bytes, by how they left the image executor: "
                             "encoded, cancelled (the caller left while it waited), rejected "
                             "(the queue was full).")
                         .Register(registry);
  for (const char* o : {"encoded", "cancelled", "rejected"}) image_requests_->Add({{"outcome", o}});
  image_waiting_ = &prometheus::BuildGauge()
                        .Name("ferry_worker_image_requests_waiting")
                        .Help("Requests with image bytes waiting for the image executor.")
                        .Register(registry)
                        .Add({});
  image_encoding_ = &prometheus::BuildGauge()
                         .Name("ferry_worker_image_requests_encoding")
                         .Help("Requests on the image executor now (0 or 1).")
                         .Register(registry)
                         .Add({});
  image_encode_seconds_ =
      &prometheus::BuildHistogram()
           .Name("ferry_worker_image_encode_seconds")
           .Help(
               "Per encoded request: its time on the image executor (decoding, preprocessing "
               "and encoding all its images).")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                                            0.1, 0.2, 0.5, 1, 2, 5, 10});
  image_fetches_ = &prometheus::BuildCounter()
                        .Name("ferry_worker_image_fetches_total")
                        .Help(
                            "Images whose embeddings were fetched from an encoder by handle, by "
                            "outcome: fetched, unavailable (the encoder unreachable, the stream "
                            "cut, the handle gone), refused (the rows are not this request's or "
                            "model's), cancelled, deadline.")
                        .Register(registry);
  for (const char* o : {"fetched", "unavailable", "refused", "cancelled", "deadline"}) {
    image_fetches_->Add({{"outcome", o}});
  }
  image_fetched_bytes_ = &prometheus::BuildCounter()
                              .Name("ferry_worker_image_fetched_bytes_total")
                              .Help("Embedding bytes fetched from encoders.")
                              .Register(registry)
                              .Add({});
  image_fetch_seconds_ =
      &prometheus::BuildHistogram()
           .Name("ferry_worker_image_fetch_seconds")
           .Help(
               "Per image fetched from an encoder, whatever the outcome: the FetchEmbeddings call.")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                            0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30});
  grammar_lookups_ = &prometheus::BuildCounter()
                          .Name("ferry_worker_grammar_cache_total")
                          .Help(
                              "Constraint compile-cache lookups: hit (cached, or another "
                              "request's compile waited for), miss (compiled), error (a bad "
                              "grammar or one over a limit).")
                          .Register(registry);
  for (const char* result : {"hit", "miss", "error"}) grammar_lookups_->Add({{"result", result}});
  grammar_compile_seconds_ =
      &prometheus::BuildHistogram()
           .Name("ferry_worker_grammar_compile_seconds")
           .Help("Per constraint compiled (a cache miss or error): parse, tables, start masks.")
           .Register(registry)
           .Add({},
                prometheus::Histogram::BucketBoundaries{0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01,
                                                        0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5});
  grammar_cache_bytes_ = gauge("ferry_worker_grammar_cache_bytes",
                               "Compiled grammars kept (estimated: IR plus mask cache when full).");
  grammar_masks_ = &prometheus::BuildCounter()
                        .Name("ferry_worker_grammar_masks_total")
                        .Help("Token masks computed for constrained choices (one per token).")
                        .Register(registry)
                        .Add({});
  grammar_mask_seconds_ = &prometheus::BuildCounter()
                               .Name("ferry_worker_grammar_mask_seconds_total")
                               .Help("Time the engine thread spent computing token masks.")
                               .Register(registry)
                               .Add({});
  token_streams_ =
      gauge("ferry_worker_token_streams", "Token streams open (routers' Tokens calls).");
  backend_info_ = &prometheus::BuildGauge()
                       .Name("ferry_worker_backend_info")
                       .Help("1: the compute backend (--backend) and its device.")
                       .Register(registry);
  auto& device_memory = prometheus::BuildGauge()
                            .Name("ferry_worker_device_memory_bytes")
                            .Help(
                                "A GPU backend's device memory: used (held now), limit (the "
                                "most it may hold), device (the GPU's size).")
                            .Register(registry);
  device_memory_used_ = &device_memory.Add({{"state", "used"}});
  device_memory_limit_ = &device_memory.Add({{"state", "limit"}});
  device_memory_total_ = &device_memory.Add({{"state", "device"}});
  token_stream_messages_ = &prometheus::BuildCounter()
                                .Name("ferry_worker_token_stream_messages_total")
                                .Help(
                                    "Messages written on token streams (about one per engine "
                                    "pass per stream with output).")
                                .Register(registry)
                                .Add({});
  token_stream_chunks_ = &prometheus::BuildCounter()
                              .Name("ferry_worker_token_stream_chunks_total")
                              .Help("TokenChunks those messages carried.")
                              .Register(registry)
                              .Add({});
  auto& released = prometheus::BuildCounter()
                       .Name("ferry_worker_kv_reservation_blocks_released_total")
                       .Help(
                           "Blocks of reservations that were not used, given back once no push "
                           "could reach them: the outcome was known, or the quarantine ran out.")
                       .Register(registry);
  released_known_ = &released.Add({{"outcome", "known"}});
  released_quarantine_ = &released.Add({{"outcome", "quarantine"}});
}

void WorkerMetrics::Outcome(RequestOutcome outcome) {
  outcomes_[static_cast<int>(outcome)]->Increment();
}

void WorkerMetrics::Ttft(double seconds) { ttft_->Observe(seconds); }

void WorkerMetrics::PromptTokens(int64_t computed, int64_t local, int64_t store) {
  prompt_computed_->Increment(static_cast<double>(computed));
  prompt_local_->Increment(static_cast<double>(local));
  prompt_store_->Increment(static_cast<double>(store));
}

void WorkerMetrics::DecodeLocalTokens(int64_t tokens) {
  prompt_decode_local_->Increment(static_cast<double>(tokens));
}

void WorkerMetrics::StoreExistence(const char* source) {
  store_existence_->Add({{"source", source}}).Increment();
}

void WorkerMetrics::StoreLookup(const char* result) {
  store_lookups_->Add({{"result", result}}).Increment();
}

void WorkerMetrics::StoreReadBlocks(const char* outcome, int64_t blocks) {
  store_read_blocks_->Add({{"outcome", outcome}}).Increment(static_cast<double>(blocks));
}

void WorkerMetrics::StoreRead(int64_t bytes, double seconds, const char* path) {
  store_reads_->Add({{"path", path}}).Increment();
  store_read_bytes_->Increment(static_cast<double>(bytes));
  store_read_seconds_->Observe(seconds);
}

void WorkerMetrics::StoreWriteBlocks(const char* outcome, int64_t blocks) {
  store_write_blocks_->Add({{"outcome", outcome}}).Increment(static_cast<double>(blocks));
}

void WorkerMetrics::StoreWrittenBytes(int64_t bytes) {
  store_written_bytes_->Increment(static_cast<double>(bytes));
}

void WorkerMetrics::StoreQuarantinedBlocks(int64_t blocks) {
  store_quarantined_blocks_->Set(static_cast<double>(blocks));
}

void WorkerMetrics::StoreWriteQueueBytes(int64_t bytes) {
  store_write_queue_bytes_->Set(static_cast<double>(bytes));
}

void WorkerMetrics::Step(const StepInfo& step) {
  if (step.prefill_tokens == 0) {
    step_decode_->Observe(step.seconds);
  } else if (step.decode_tokens == 0) {
    step_prefill_->Observe(step.seconds);
  } else {
    step_mixed_->Observe(step.seconds);
  }
}

WorkerUtilisation UtilisationOf(const EngineStats& s, double busy_fraction, int64_t max_running,
                                int64_t block_tokens) {
  WorkerUtilisation u;
  u.busy_fraction = std::clamp(busy_fraction, 0.0, 1.0);
  if (s.total_blocks > 0 && block_tokens > 0) {
    const int64_t not_free = s.total_blocks - s.free_blocks;
    const int64_t not_cache = not_free - s.cached_blocks;
    const int64_t positions = (s.running_tokens + block_tokens - 1) / block_tokens;
    const int64_t held = std::max<int64_t>(0, std::min(not_free, std::max(positions, not_cache)));
    u.kv_used_fraction = static_cast<double>(held) / static_cast<double>(s.total_blocks);
  }
  if (max_running > 0) {
    u.running_fraction =
        std::min(1.0, static_cast<double>(s.running) / static_cast<double>(max_running));
  }
  u.queued_tokens = s.queued_tokens;
  return u;
}

void WorkerMetrics::Refresh(const EngineStats& s, double prefill_tokens_per_second,
                            const WorkerUtilisation& u) {
  busy_fraction_->Set(u.busy_fraction);
  kv_used_fraction_->Set(u.kv_used_fraction);
  running_fraction_->Set(u.running_fraction);
  queued_tokens_->Set(static_cast<double>(u.queued_tokens));
  queued_->Set(static_cast<double>(s.waiting));
  running_->Set(static_cast<double>(s.running));
  blocks_used_->Set(static_cast<double>(s.total_blocks - s.free_blocks));
  blocks_free_->Set(static_cast<double>(s.free_blocks));
  blocks_cached_->Set(static_cast<double>(s.cached_blocks));
  blocks_total_->Set(static_cast<double>(s.total_blocks));
  prefill_speed_->Set(prefill_tokens_per_second);
  if (device_memory_used_bytes_) {
    device_memory_used_->Set(static_cast<double>(device_memory_used_bytes_()));
  }
  refreshes_->Increment();  // after the gauges: once it counts, they are this refresh's
  absl::MutexLock lock(&mu_);
  auto mirror = [](prometheus::Counter* c, int64_t now, int64_t& last) {
    if (now > last) c->Increment(static_cast<double>(now - last));
    last = std::max(last, now);
  };
  mirror(window_hits_, s.window_hits, last_.window_hits);
  mirror(window_replays_, s.window_replays, last_.window_replays);
  mirror(window_misses_, s.window_misses, last_.window_misses);
  mirror(window_replayed_tokens_, s.replayed_tokens, last_.replayed_tokens);
  mirror(window_expired_, s.window_expired_blocks, last_.window_expired_blocks);
  mirror(absent_image_rows_, s.absent_image_rows, last_.absent_image_rows);
  mirror(grammar_masks_, s.grammar_masks, last_.grammar_masks);
  if (s.grammar_mask_seconds > last_.grammar_mask_seconds) {
    grammar_mask_seconds_->Increment(s.grammar_mask_seconds - last_.grammar_mask_seconds);
    last_.grammar_mask_seconds = s.grammar_mask_seconds;
  }
  if (s.generated_tokens > last_generated_) {
    generated_->Increment(static_cast<double>(s.generated_tokens - last_generated_));
    last_generated_ = s.generated_tokens;
  }
  for (size_t e = 0; e < s.expert_tokens.size(); ++e) {
    if (e == expert_counters_.size()) {
      expert_counters_.push_back(&experts_->Add({{"expert", std::to_string(e)}}));
      last_experts_.push_back(0);
    }
    if (s.expert_tokens[e] > last_experts_[e]) {
      expert_counters_[e]->Increment(static_cast<double>(s.expert_tokens[e] - last_experts_[e]));
      last_experts_[e] = s.expert_tokens[e];
    }
  }
}

void WorkerMetrics::WatchSubscribers(int64_t n) { subscribers_->Set(static_cast<double>(n)); }

void WorkerMetrics::WatchSnapshot(bool lagged) {
  (lagged ? snapshots_lagged_ : snapshots_initial_)->Increment();
}

void WorkerMetrics::Unauthenticated() { unauthenticated_->Increment(); }

}  // namespace ferry

namespace ferry {

void WorkerMetrics::Push(uint64_t bytes, uint64_t streamed, double seconds, double tail_seconds,
                         bool ok) {
  push_bytes_->Observe(static_cast<double>(bytes));
  push_seconds_->Observe(seconds);
  push_tail_seconds_->Observe(tail_seconds);
  streamed_bytes_->Increment(static_cast<double>(streamed));
  (ok ? pushes_ok_ : pushes_failed_)->Increment();
}

void WorkerMetrics::BlocksSkipped(int64_t blocks) {
  blocks_skipped_->Increment(static_cast<double>(blocks));
}

void WorkerMetrics::Reservation(const std::string& outcome) {
  reservations_->Add({{"outcome", outcome}}).Increment();
}

void WorkerMetrics::KvReleased(int64_t blocks, bool outcome_known) {
  (outcome_known ? released_known_ : released_quarantine_)->Increment(static_cast<double>(blocks));
}

void WorkerMetrics::HandoffReceived(uint64_t bytes) {
  handoffs_received_->Increment();
  handoff_received_bytes_->Increment(static_cast<double>(bytes));
}

void WorkerMetrics::Precopy(const char* outcome, uint64_t bytes) {
  precopies_->Add({{"outcome", outcome}}).Increment();
  precopy_bytes_->Increment(static_cast<double>(bytes));
}

void WorkerMetrics::DrainStarted() { drains_->Increment(); }

void WorkerMetrics::DrainDuration(double seconds) { drain_duration_->Set(seconds); }

void WorkerMetrics::Handoff(const char* outcome, uint64_t bytes, double seconds) {
  handoffs_->Add({{"outcome", outcome}}).Increment();
  if (std::string(outcome) == "pushed") {
    handoff_bytes_->Increment(static_cast<double>(bytes));
    handoff_seconds_->Observe(seconds);
  }
}

void WorkerMetrics::ImageWaiting(int delta) { image_waiting_->Increment(delta); }

void WorkerMetrics::ImageEncoding(int delta) { image_encoding_->Increment(delta); }

void WorkerMetrics::ImageRequest(const char* outcome, double seconds) {
  image_requests_->Add({{"outcome", outcome}}).Increment();
  if (std::string(outcome) == "encoded") image_encode_seconds_->Observe(seconds);
}

void WorkerMetrics::GrammarLookup(const char* result, double compile_seconds, size_t cache_bytes) {
  grammar_lookups_->Add({{"result", result}}).Increment();
  if (compile_seconds > 0) grammar_compile_seconds_->Observe(compile_seconds);
  grammar_cache_bytes_->Set(static_cast<double>(cache_bytes));
}

void WorkerMetrics::SetBackend(const std::string& kind, const std::string& device,
                               uint64_t limit_bytes, uint64_t device_bytes,
                               std::function<uint64_t()> used_bytes) {
  backend_info_->Add({{"backend", kind}, {"device", device}}).Set(1);
  device_memory_limit_->Set(static_cast<double>(limit_bytes));
  device_memory_total_->Set(static_cast<double>(device_bytes));
  device_memory_used_bytes_ = std::move(used_bytes);
  if (device_memory_used_bytes_) {
    device_memory_used_->Set(static_cast<double>(device_memory_used_bytes_()));
  }
}

void WorkerMetrics::TokenStreams(int64_t open) { token_streams_->Set(static_cast<double>(open)); }

void WorkerMetrics::TokenStreamMessage(int64_t chunks) {
  token_stream_messages_->Increment();
  token_stream_chunks_->Increment(static_cast<double>(chunks));
}

void WorkerMetrics::ImageFetch(const char* outcome, uint64_t bytes, double seconds) {
  image_fetches_->Add({{"outcome", outcome}}).Increment();
  image_fetched_bytes_->Increment(static_cast<double>(bytes));
  image_fetch_seconds_->Observe(seconds);
}

}  // namespace ferry
