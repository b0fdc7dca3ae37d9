#include "router/router_metrics.h"

#include "services/common/metrics.h"

namespace ferry {

namespace {

prometheus::Histogram::BucketBoundaries QueueWaitBuckets() {
  return {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300};
}

}  // namespace

RouterMetrics::RouterMetrics(prometheus::Registry& registry) {
  requests_ = &prometheus::BuildCounter()
                   .Name("ferry_router_requests_total")
                   .Help("API requests by endpoint and HTTP status code.")
                   .Register(registry);
  ttft_ = &prometheus::BuildHistogram()
               .Name("ferry_router_ttft_seconds")
               .Help("Time from a request's arrival to its first token.")
               .Register(registry);
  inter_token_ = &prometheus::BuildHistogram()
                      .Name("ferry_router_inter_token_seconds")
                      .Help("Time between consecutive tokens of a response.")
                      .Register(registry)
                      .Add({}, LatencyBucketsSeconds());
  request_seconds_ = &prometheus::BuildHistogram()
                          .Name("ferry_router_request_seconds")
                          .Help("Time from a request's arrival to its last byte.")
                          .Register(registry);
  prefill_phase_seconds_ = &prometheus::BuildHistogram()
                                .Name("ferry_router_prefill_phase_seconds")
                                .Help(
                                    "P/D requests' prefill, as the prefill worker answered: "
                                    "queue, compute, push_tail (the KV push after the compute), "
                                    "store_read.")
                                .Register(registry);
  for (const char* phase : {"queue", "compute", "push_tail", "store_read"}) {
    prefill_phase_seconds_->Add({{"phase", phase}}, LatencyBucketsSeconds());
  }
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("ferry_router_queue_depth")
                      .Help("Requests waiting for a worker that can take them.")
                      .Register(registry)
                      .Add({});
  queued_tokens_ = &prometheus::BuildGauge()
                        .Name("ferry_router_queued_tokens")
                        .Help("Prompt (and resumed output) tokens of the queued requests.")
                        .Register(registry)
                        .Add({});
  queue_wait_ = &prometheus::BuildHistogram()
                     .Name("ferry_router_queue_wait_seconds")
                     .Help(
                         "How long requests had waited for a worker each time they left the "
                         "queue (since arrival or their last token), by the pool they waited "
                         "for.")
                     .Register(registry);
  for (const char* pool : {"prefill", "decode", "aggregated"}) {
    queue_wait_->Add({{"pool", pool}}, QueueWaitBuckets());
  }
  queue_expired_ = &prometheus::BuildCounter()
                        .Name("ferry_router_queue_expired_total")
                        .Help(
                            "Queued requests that gave up waiting for a worker (503): "
                            "queue_timeout, deadline.")
                        .Register(registry);
  for (const char* reason : {"queue_timeout", "deadline"})
    queue_expired_->Add({{"reason", reason}});
  kv_waits_ = &prometheus::BuildCounter()
                   .Name("ferry_router_kv_waits_total")
                   .Help(
                       "Requests a decode worker refused for want of KV, sent back to the queue "
                       "to wait for room.")
                   .Register(registry)
                   .Add({});
  collisions_ = &prometheus::BuildCounter()
                     .Name("ferry_router_attempt_collisions_total")
                     .Help(
                         "Attempts a worker refused as already running (a reused attempt id: a "
                         "router bug), restarted under a new id.")
                     .Register(registry)
                     .Add({});
  routed_ = &prometheus::BuildCounter()
                 .Name("ferry_router_routing_decisions_total")
                 .Help("Requests sent to a worker, by policy and worker.")
                 .Register(registry);
  reasons_ = &prometheus::BuildCounter()
                  .Name("ferry_router_routing_reasons_total")
                  .Help(
                      "Routing decisions by policy and why (prefix_aware: prefix_hit, "
                      "store_hit, least_cost, all_busy).")
                  .Register(registry);
  prefix_tokens_ = &prometheus::BuildCounter()
                        .Name("ferry_router_prefix_tokens_total")
                        .Help(
                            "Prompt tokens of finished requests the policy predicted the "
                            "computing worker would reuse (kind=predicted) from its memory "
                            "(tier=local) or the store (tier=store), and that it did "
                            "(kind=reused).")
                        .Register(registry);
  predictions_ = &prometheus::BuildCounter()
                      .Name("ferry_router_prefix_predictions_total")
                      .Help(
                          "Requests by how the predicted local hit compared with the reused "
                          "one: exact, over (fewer reused), under.")
                      .Register(registry);
  for (const char* outcome : {"exact", "over", "under"}) predictions_->Add({{"outcome", outcome}});
  index_entries_ = &prometheus::BuildGauge()
                        .Name("ferry_router_kv_index_entries")
                        .Help("(worker, block) entries in the router's KV index.")
                        .Register(registry)
                        .Add({});
  index_bytes_ = &prometheus::BuildGauge()
                      .Name("ferry_router_kv_index_bytes")
                      .Help("Bytes of the KV index's tables (at most --kv_index_bytes).")
                      .Register(registry)
                      .Add({});
  index_events_ = &prometheus::BuildCounter()
                       .Name("ferry_router_kv_index_events_total")
                       .Help("Stored and evicted block hashes applied to the KV index.")
                       .Register(registry)
                       .Add({});
  index_dropped_ = &prometheus::BuildCounter()
                        .Name("ferry_router_kv_index_dropped_total")
                        .Help("Stored block hashes dropped at the KV index's byte cap.")
                        .Register(registry)
                        .Add({});
  auto& probes = prometheus::BuildCounter()
                     .Name("ferry_router_store_probes_total")
                     .Help(
                         "Prompts the KV store was asked about (asked), and those answered 0 "
                         "without asking because the probe's queue was full (skipped).")
                     .Register(registry);
  probes_asked_ = &probes.Add({{"result", "asked"}});
  probes_skipped_ = &probes.Add({{"result", "skipped"}});
  retries_ = &prometheus::BuildCounter()
                  .Name("ferry_router_retries_total")
                  .Help("Requests sent to another worker after one failed them before a token.")
                  .Register(registry)
                  .Add({});
  migrations_ = &prometheus::BuildCounter()
                     .Name("ferry_router_migrations_total")
                     .Help(
                         "Requests moved to another worker mid-stream, by cause: stream_broken, "
                         "worker_down (no heartbeat), worker_error, drain_handoff (with its KV, "
                         "from a draining worker), handoff_failed (re-prefill after a failed "
                         "hand-off).")
                     .Register(registry);
  for (const char* cause :
       {"stream_broken", "worker_down", "worker_error", "drain_handoff", "handoff_failed"}) {
    migrations_->Add({{"cause", cause}});
  }
  handoffs_ = &prometheus::BuildCounter()
                   .Name("ferry_router_handoffs_total")
                   .Help(
                       "Drain hand-offs by outcome: completed (the target streamed a token or "
                       "ended the request), fell_back (re-prefill instead), failed (the request "
                       "could not go on).")
                   .Register(registry);
  for (const char* outcome : {"completed", "fell_back", "failed"}) {
    handoffs_->Add({{"outcome", outcome}});
  }
  precopies_ = &prometheus::BuildCounter()
                    .Name("ferry_router_precopies_total")
                    .Help("Drain pre-copies asked of hand-off targets, by outcome: done, failed.")
                    .Register(registry);
  for (const char* outcome : {"done", "failed"}) precopies_->Add({{"outcome", outcome}});
  migrated_tokens_ = &prometheus::BuildCounter()
                          .Name("ferry_router_migrated_tokens_total")
                          .Help("Output tokens carried over by migrations (recovered).")
                          .Register(registry)
                          .Add({});
  token_streams_ = &prometheus::BuildGauge()
                        .Name("ferry_router_token_streams")
                        .Help("Token streams open: one per worker, carrying its requests' tokens.")
                        .Register(registry)
                        .Add({});
  token_stream_messages_ = &prometheus::BuildCounter()
                                .Name("ferry_router_token_stream_messages_total")
                                .Help("Messages read from the workers' token streams.")
                                .Register(registry)
                                .Add({});
  auto& stream_chunks =
      prometheus::BuildCounter()
          .Name("ferry_router_token_stream_chunks_total")
          .Help(
              "TokenChunks read from token streams: delivered to their request, or dropped (the "
              "request had left).")
          .Register(registry);
  token_stream_delivered_ = &stream_chunks.Add({{"delivered", "true"}});
  token_stream_dropped_ = &stream_chunks.Add({{"delivered", "false"}});
  untracked_ = &prometheus::BuildCounter()
                    .Name("ferry_router_migration_untracked_total")
                    .Help("Requests whose output went over a tracking cap: they cannot migrate.")
                    .Register(registry)
                    .Add({});
  tracked_tokens_ = &prometheus::BuildGauge()
                         .Name("ferry_router_migration_tracked_tokens")
                         .Help("Output token ids the router keeps for migration now.")
                         .Register(registry)
                         .Add({});
  failed_ = &prometheus::BuildCounter()
                 .Name("ferry_router_failed_requests_total")
                 .Help(
                     "Requests the service failed, by cause: no_worker, worker_error, deadline, "
                     "migration_limit, untracked, several_choices.")
                 .Register(registry);
  for (const char* cause : {"no_worker", "worker_error", "deadline", "migration_limit", "untracked",
                            "several_choices"}) {
    failed_->Add({{"cause", cause}});
  }
  orphan_aborts_ = &prometheus::BuildCounter()
                        .Name("ferry_router_orphan_aborts_total")
                        .Help(
                            "Aborts of abandoned attempts sent to the workers they touched (at "
                            "once, or when the worker came back): found, not_found, failed.")
                        .Register(registry);
  auto& prompt = prometheus::BuildCounter()
                     .Name("ferry_router_prompt_tokens_total")
                     .Help(
                         "Prompt tokens by source: computed by a worker, reused from its memory "
                         "(prefill_memory), read from the KV store (store); decode_memory: held "
                         "by the decode worker already (a part of the others).")
                     .Register(registry);
  prompt_computed_ = &prompt.Add({{"source", "computed"}});
  prompt_prefill_memory_ = &prompt.Add({{"source", "prefill_memory"}});
  prompt_store_ = &prompt.Add({{"source", "store"}});
  prompt_decode_memory_ = &prompt.Add({{"source", "decode_memory"}});
  completion_ = &prometheus::BuildCounter()
                     .Name("ferry_router_completion_tokens_total")
                     .Help("Tokens generated for clients.")
                     .Register(registry)
                     .Add({});
  auto& workers = prometheus::BuildGauge()
                      .Name("ferry_router_workers")
                      .Help("Workers by state: up (accepted into the pool) or down.")
                      .Register(registry);
  workers_up_ = &workers.Add({{"state", "up"}});
  workers_down_ = &workers.Add({{"state", "down"}});
  refusals_ = &prometheus::BuildCounter()
                   .Name("ferry_router_worker_refusals_total")
                   .Help("Workers refused from the pool, by what differed.")
                   .Register(registry);
  tool_calls_ = &prometheus::BuildCounter()
                     .Name("ferry_router_tool_calls_total")
                     .Help(
                         "Tool calls parsed from replies, by their arguments: valid, invalid, "
                         "incomplete.")
                     .Register(registry);
  image_fetches_ = &prometheus::BuildCounter()
                        .Name("ferry_router_image_fetches_total")
                        .Help(
                            "Remote image URLs fetched (ok), refused by the fetcher (error), and "
                            "requests refused for a full fetch queue (queue_full).")
                        .Register(registry);
  constraints_ = &prometheus::BuildCounter()
                      .Name("ferry_router_constraints_total")
                      .Help(
                          "Requests with structured output, by the form their constraint was "
                          "lowered from (json_schema, json_object, regex, grammar, choice, "
                          "tool_calls), or refused (it could not be enforced: a 400).")
                      .Register(registry);
  encodes_ = &prometheus::BuildCounter()
                  .Name("ferry_router_encodes_total")
                  .Help(
                      "Images of requests to a vision model, by result: ok (encoded by the "
                      "first choice of --encoders), cached (an encoder had it), failover (encoded "
                      "after another encoder failed), fallback (none could: the bytes went "
                      "inline), skipped (a worker holds its positions: neither encoded nor "
                      "sent; PromptImage.expect_cached).")
                  .Register(registry);
  encoder_up_ = &prometheus::BuildGauge()
                     .Name("ferry_router_encoder_up")
                     .Help("1 while the encoder's status stream is up (--encoders), else 0.")
                     .Register(registry);
  images_inlined_ = &prometheus::BuildCounter()
                         .Name("ferry_router_images_inlined_on_retry_total")
                         .Help(
                             "Images a retry or migration sent as inline bytes instead of the "
                             "encoder handle of the failed attempt, or of nothing (an image "
                             "predicted cached that was not).")
                         .Register(registry)
                         .Add({});
  auto& slo = prometheus::BuildCounter()
                  .Name("ferry_router_slo_requests_total")
                  .Help(
                      "Requests judged against the service-level objectives: ttft (--slo_ttft) "
                      "and itl (their mean time between output tokens, --slo_itl), met or "
                      "missed.")
                  .Register(registry);
  ttft_met_ = &slo.Add({{"objective", "ttft"}, {"result", "met"}});
  ttft_missed_ = &slo.Add({{"objective", "ttft"}, {"result", "missed"}});
  itl_met_ = &slo.Add({{"objective", "itl"}, {"result", "met"}});
  itl_missed_ = &slo.Add({{"objective", "itl"}, {"result", "missed"}});
}

void RouterMetrics::Request(const std::string& endpoint, int code) {
  requests_->Add({{"endpoint", endpoint}, {"code", std::to_string(code)}}).Increment();
}

void RouterMetrics::Ttft(const std::string& endpoint, double seconds) {
  ttft_->Add({{"endpoint", endpoint}}, LatencyBucketsSeconds()).Observe(seconds);
}

void RouterMetrics::InterToken(double seconds) { inter_token_->Observe(seconds); }

void RouterMetrics::RequestSeconds(const std::string& endpoint, double seconds) {
  request_seconds_->Add({{"endpoint", endpoint}}, LatencyBucketsSeconds()).Observe(seconds);
}

void RouterMetrics::PrefillPhases(double queue, double compute, double push_tail,
                                  double store_read) {
  prefill_phase_seconds_->Add({{"phase", "queue"}}, LatencyBucketsSeconds()).Observe(queue);
  prefill_phase_seconds_->Add({{"phase", "compute"}}, LatencyBucketsSeconds()).Observe(compute);
  prefill_phase_seconds_->Add({{"phase", "push_tail"}}, LatencyBucketsSeconds()).Observe(push_tail);
  prefill_phase_seconds_->Add({{"phase", "store_read"}}, LatencyBucketsSeconds())
      .Observe(store_read);
}

void RouterMetrics::QueueDepth(int64_t depth, int64_t tokens) {
  queue_depth_->Set(static_cast<double>(depth));
  queued_tokens_->Set(static_cast<double>(tokens));
}

void RouterMetrics::QueueWait(const char* pool, double seconds) {
  queue_wait_->Add({{"pool", pool}}, QueueWaitBuckets()).Observe(seconds);
}

void RouterMetrics::Slo(const char* objective, bool met) {
  const bool ttft = std::string(objective) == "ttft";
  (ttft ? (met ? ttft_met_ : ttft_missed_) : (met ? itl_met_ : itl_missed_))->Increment();
}

void RouterMetrics::QueueExpired(const std::string& reason) {
  queue_expired_->Add({{"reason", reason}}).Increment();
}

void RouterMetrics::KvWait() { kv_waits_->Increment(); }

void RouterMetrics::Collision() { collisions_->Increment(); }

void RouterMetrics::Routed(const std::string& policy, const std::string& worker) {
  routed_->Add({{"policy", policy}, {"worker", worker}}).Increment();
}

void RouterMetrics::Decided(const std::string& policy, const std::string& reason) {
  reasons_->Add({{"policy", policy}, {"reason", reason}}).Increment();
}

void RouterMetrics::Prefix(int64_t predicted_local, int64_t predicted_store, int64_t reused_local,
                           int64_t reused_store) {
  prefix_tokens_->Add({{"tier", "local"}, {"kind", "predicted"}})
      .Increment(static_cast<double>(predicted_local));
  prefix_tokens_->Add({{"tier", "store"}, {"kind", "predicted"}})
      .Increment(static_cast<double>(predicted_store));
  prefix_tokens_->Add({{"tier", "local"}, {"kind", "reused"}})
      .Increment(static_cast<double>(reused_local));
  prefix_tokens_->Add({{"tier", "store"}, {"kind", "reused"}})
      .Increment(static_cast<double>(reused_store));
  const char* outcome = predicted_local == reused_local  ? "exact"
                        : predicted_local > reused_local ? "over"
                                                         : "under";
  predictions_->Add({{"outcome", outcome}}).Increment();
}

void RouterMetrics::KvIndexState(int64_t entries, uint64_t bytes, int64_t events, int64_t dropped) {
  index_entries_->Set(static_cast<double>(entries));
  index_bytes_->Set(static_cast<double>(bytes));
  absl::MutexLock lock(&index_mu_);
  if (events > index_events_seen_) {
    index_events_->Increment(static_cast<double>(events - index_events_seen_));
    index_events_seen_ = events;
  }
  if (dropped > index_dropped_seen_) {
    index_dropped_->Increment(static_cast<double>(dropped - index_dropped_seen_));
    index_dropped_seen_ = dropped;
  }
}

void RouterMetrics::StoreProbed(bool asked) {
  (asked ? probes_asked_ : probes_skipped_)->Increment();
}

void RouterMetrics::Retry() { retries_->Increment(); }

void RouterMetrics::Migrated(const std::string& cause, int64_t tokens) {
  migrations_->Add({{"cause", cause}}).Increment();
  migrated_tokens_->Increment(static_cast<double>(tokens));
}

void RouterMetrics::Handoff(const std::string& outcome) {
  handoffs_->Add({{"outcome", outcome}}).Increment();
}

void RouterMetrics::Precopy(const std::string& outcome) {
  precopies_->Add({{"outcome", outcome}}).Increment();
}

void RouterMetrics::TokenStreams(int64_t open) { token_streams_->Set(static_cast<double>(open)); }

void RouterMetrics::TokenStreamMessage(int64_t chunks, int64_t dropped) {
  token_stream_messages_->Increment();
  token_stream_delivered_->Increment(static_cast<double>(chunks - dropped));
  token_stream_dropped_->Increment(static_cast<double>(dropped));
}

void RouterMetrics::Failed(const std::string& cause) {
  failed_->Add({{"cause", cause}}).Increment();
}

void RouterMetrics::Untracked() { untracked_->Increment(); }

void RouterMetrics::TrackedTokens(int64_t tokens) {
  tracked_tokens_->Set(static_cast<double>(tokens));
}

void RouterMetrics::OrphanAbort(const std::string& outcome) {
  orphan_aborts_->Add({{"outcome", outcome}}).Increment();
}

void RouterMetrics::PromptTokens(int64_t computed, int64_t prefill_memory, int64_t store,
                                 int64_t decode_memory) {
  prompt_computed_->Increment(static_cast<double>(computed));
  prompt_prefill_memory_->Increment(static_cast<double>(prefill_memory));
  prompt_store_->Increment(static_cast<double>(store));
  prompt_decode_memory_->Increment(static_cast<double>(decode_memory));
}

void RouterMetrics::CompletionTokens(int64_t n) { completion_->Increment(static_cast<double>(n)); }

void RouterMetrics::Workers(int64_t up, int64_t down) {
  workers_up_->Set(static_cast<double>(up));
  workers_down_->Set(static_cast<double>(down));
}

void RouterMetrics::Refusal(const std::string& reason) {
  refusals_->Add({{"reason", reason}}).Increment();
}

void RouterMetrics::ImageFetch(const char* result) {
  image_fetches_->Add({{"result", result}}).Increment();
}

void RouterMetrics::Constraint(const char* kind) {
  constraints_->Add({{"kind", kind}}).Increment();
}

void RouterMetrics::Encode(const char* result) { encodes_->Add({{"result", result}}).Increment(); }

void RouterMetrics::EncoderUp(const std::string& endpoint, bool up) {
  encoder_up_->Add({{"encoder", endpoint}}).Set(up ? 1 : 0);
}

void RouterMetrics::ImagesInlined(int64_t images) {
  images_inlined_->Increment(static_cast<double>(images));
}

void RouterMetrics::ToolCall(const std::string& arguments) {
  tool_calls_->Add({{"arguments", arguments}}).Increment();
}

}  // namespace ferry
