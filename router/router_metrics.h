// The router's Prometheus metrics (ARCHITECTURE.md §9), on its admin port's registry:
//
//   ferry_router_requests_total{endpoint,code}   API requests by endpoint and HTTP status
//   ferry_router_ttft_seconds{endpoint}          request received -> first token sent
//   ferry_router_inter_token_seconds             between consecutive tokens of a stream
//   ferry_router_request_seconds{endpoint}       request received -> last byte
//   ferry_router_prefill_phase_seconds{phase}    P/D requests, as their prefill worker answered:
//                                                queue (its engine's queue), compute (the prompt),
//                                                push_tail (the KV push after the compute: what
//                                                the first token waited for), store_read
//   ferry_router_queue_depth                     requests waiting for a worker
//   ferry_router_queued_tokens                   their prompt (and resumed output) tokens
//   ferry_router_queue_wait_seconds{pool}        how long requests had waited each time they
//                                                left it (since arrival or their last token),
//                                                by the pool they waited for: prefill, decode,
//                                                aggregated (dispatch_rules.h QueuePool)
//   ferry_router_queue_expired_total{reason}     queued requests that gave up waiting (503):
//                                                queue_timeout (--queue_timeout), deadline
//   ferry_router_kv_waits_total                  requests a decode worker refused for want of
//                                                KV, sent back to the queue to wait for room
//   ferry_router_attempt_collisions_total        attempts a worker refused as already running (a
//                                                reused attempt id: a router bug), restarted
//   ferry_router_routing_decisions_total{policy,worker}
//   ferry_router_routing_reasons_total{policy,reason}  why: prefix_hit, store_hit, least_cost,
//                                                all_busy (prefix_aware), or the policy's name
//   ferry_router_prefix_tokens_total{tier,kind}  prompt tokens of finished requests that the
//                                                policy predicted (kind=predicted) the computing
//                                                worker would reuse from its memory (tier=local)
//                                                or read from the store (tier=store), and that it
//                                                did (kind=reused)
//   ferry_router_prefix_predictions_total{outcome}  per request, local tier: exact, over (fewer
//                                                reused than predicted), under
//   ferry_router_kv_index_entries                (worker, block) entries in the KV index
//   ferry_router_kv_index_bytes                  its tables' bytes (at most --kv_index_bytes)
//   ferry_router_kv_index_events_total           stored / evicted hashes applied
//   ferry_router_kv_index_dropped_total          stored hashes dropped at the byte cap
//   ferry_router_store_probes_total{result}      --kvstore: prompts the store was asked about
//                                                (asked), and answered 0 unasked because the
//                                                probe's queue was full (skipped)
//   ferry_router_retries_total                   requests sent to another worker before a token
//   ferry_router_migrations_total{cause}         requests moved to another worker mid-stream:
//                                                stream_broken (the worker died), worker_down (no
//                                                heartbeat: stalled or cut off), worker_error,
//                                                drain_handoff (a draining worker stopped it with
//                                                its KV kept: it moves with the KV), handoff_failed
//                                                (that hand-off failed: re-prefill instead)
//   ferry_router_handoffs_total{outcome}         drain hand-offs: completed (the target streamed a
//                                                token or ended the request), fell_back (it failed
//                                                or found no target: re-prefill), failed (it failed
//                                                and the request could not go on)
//   ferry_router_precopies_total{outcome}        drain pre-copies asked of hand-off targets: done
//                                                (the KV so far landed there), failed (it did not:
//                                                the hand-off moves all of it)
//   ferry_router_migrated_tokens_total           output tokens carried over (re-prefilled, not
//                                                regenerated)
//   ferry_router_token_streams                   token streams open (one per worker)
//   ferry_router_token_stream_messages_total     messages read from them; with
//   ferry_router_token_stream_chunks_total{delivered}  their TokenChunks: delivered (true) or
//                                                dropped (false: the request had left)
//   ferry_router_migration_untracked_total       requests whose output went over a tracking cap
//                                                (they cannot migrate)
//   ferry_router_migration_tracked_tokens        output token ids kept for migration now
//   ferry_router_failed_requests_total{cause}    requests the service failed: no_worker,
//                                                worker_error, deadline, and mid-stream ones that
//                                                could not migrate: migration_limit, untracked,
//                                                several_choices
//   ferry_router_orphan_aborts_total{outcome}    Aborts of abandoned attempts sent to the workers
//                                                they touched (at once, or when the worker came
//                                                back): found, not_found, failed
//   ferry_router_prompt_tokens_total{source}     computed, prefill_memory (reused from the
//                                                memory of the worker that computed the prompt),
//                                                store (read from the KV store): these three sum
//                                                to the prompt tokens; decode_memory (held by the
//                                                decode worker already, so not pushed: a part of
//                                                the others)
//   ferry_router_completion_tokens_total
//   ferry_router_workers{state}                  up, down
//   ferry_router_worker_refusals_total{reason}   fingerprint, block_tokens, protocol
//   ferry_router_tool_calls_total{arguments}     calls parsed from replies: valid (a JSON
//                                                object), invalid, incomplete (cut off)
//   ferry_router_image_fetches_total{result}     remote image URLs fetched (ok), refused by the
//                                                fetcher (error), or requests refused because
//                                                the fetch queue was full (queue_full)
//   ferry_router_slo_requests_total{objective,result}  requests judged against --slo_ttft
//                                                (objective=ttft) and --slo_itl (itl, their mean
//                                                time between output tokens): met, missed
//                                                (router/slo.h says which requests count)
//
// Thread-safe.

#ifndef FERRY_ROUTER_ROUTER_METRICS_H_
#define FERRY_ROUTER_ROUTER_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ferry {

class RouterMetrics {
 public:
  explicit RouterMetrics(prometheus::Registry& registry);

  void Request(const std::string& endpoint, int code);
  void Ttft(const std::string& endpoint, double seconds);
  void InterToken(double seconds);
  void RequestSeconds(const std::string& endpoint, double seconds);
  void PrefillPhases(double queue, double compute, double push_tail, double store_read);
  void QueueDepth(int64_t depth, int64_t tokens);
  void QueueWait(const char* pool, double seconds);
  void QueueExpired(const std::string& reason);
  void KvWait();
  void Collision();
  void Routed(const std::string& policy, const std::string& worker);
  void Decided(const std::string& policy, const std::string& reason);
  void Prefix(int64_t predicted_local, int64_t predicted_store, int64_t reused_local,
              int64_t reused_store);
  // The index's state now (the counters advance by what they gained since the last call).
  void KvIndexState(int64_t entries, uint64_t bytes, int64_t events, int64_t dropped);
  void StoreProbed(bool asked);
  void Retry();
  void Migrated(const std::string& cause, int64_t tokens);
  void Handoff(const std::string& outcome);
  void Precopy(const std::string& outcome);
  void TokenStreams(int64_t open);
  void TokenStreamMessage(int64_t chunks, int64_t dropped);
  void Failed(const std::string& cause);
  void Untracked();
  void TrackedTokens(int64_t tokens);
  void OrphanAbort(const std::string& outcome);
  void PromptTokens(int64_t computed, int64_t prefill_memory, int64_t store, int64_t decode_memory);
  void CompletionTokens(int64_t n);
  void Workers(int64_t up, int64_t down);
  void Refusal(const std::string& reason);
  void ToolCall(const std::string& arguments);
  // "ok", "error", "queue_full".
  void ImageFetch(const char* result);
  // An image's encode (router/encode/encoder_pool.h): "ok" (encoded by its first choice),
  // "cached" (an encoder had it), "failover" (encoded after another encoder failed), "fallback"
  // (no encoder could: its bytes went inline).
  void Encode(const char* result);
  // A request's output constraint (output_constraint.h): its kind ("json_schema", ...,
  // "tool_calls"), or "refused" when it could not be enforced (a 400).
  void Constraint(const char* kind);
  void EncoderUp(const std::string& endpoint, bool up);
  // A retry or migration sent `images` inline instead of their encoder handles.
  void ImagesInlined(int64_t images);
  // "ttft" or "itl".
  void Slo(const char* objective, bool met);

 private:
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* ttft_;
  prometheus::Histogram* inter_token_;
  prometheus::Family<prometheus::Histogram>* request_seconds_;
  prometheus::Family<prometheus::Histogram>* prefill_phase_seconds_;
  prometheus::Gauge* queue_depth_;
  prometheus::Gauge* queued_tokens_;
  prometheus::Family<prometheus::Histogram>* queue_wait_;
  prometheus::Family<prometheus::Counter>* queue_expired_;
  prometheus::Counter* kv_waits_;
  prometheus::Counter* collisions_;
  prometheus::Family<prometheus::Counter>* routed_;
  prometheus::Family<prometheus::Counter>* reasons_;
  prometheus::Family<prometheus::Counter>* prefix_tokens_;
  prometheus::Family<prometheus::Counter>* predictions_;
  prometheus::Gauge* index_entries_;
  prometheus::Gauge* index_bytes_;
  prometheus::Counter* index_events_;
  prometheus::Counter* index_dropped_;
  prometheus::Counter* probes_asked_;
  prometheus::Counter* probes_skipped_;
  absl::Mutex index_mu_;
  int64_t index_events_seen_ ABSL_GUARDED_BY(index_mu_) = 0;
  int64_t index_dropped_seen_ ABSL_GUARDED_BY(index_mu_) = 0;

  prometheus::Counter* retries_;
  prometheus::Family<prometheus::Counter>* migrations_;
  prometheus::Family<prometheus::Counter>* handoffs_;
  prometheus::Family<prometheus::Counter>* precopies_;
  prometheus::Counter* migrated_tokens_;
  prometheus::Gauge* token_streams_;
  prometheus::Counter* token_stream_messages_;
  prometheus::Counter* token_stream_delivered_;
  prometheus::Counter* token_stream_dropped_;
  prometheus::Counter* untracked_;
  prometheus::Gauge* tracked_tokens_;
  prometheus::Family<prometheus::Counter>* failed_;
  prometheus::Family<prometheus::Counter>* orphan_aborts_;
  prometheus::Counter* prompt_computed_;
  prometheus::Counter* prompt_prefill_memory_;
  prometheus::Counter* prompt_store_;
  prometheus::Counter* prompt_decode_memory_;
  prometheus::Counter* completion_;
  prometheus::Gauge* workers_up_;
  prometheus::Family<prometheus::Counter>* encodes_;
  prometheus::Family<prometheus::Counter>* constraints_;
  prometheus::Family<prometheus::Gauge>* encoder_up_;
  prometheus::Counter* images_inlined_;
  prometheus::Gauge* workers_down_;
  prometheus::Family<prometheus::Counter>* refusals_;
  prometheus::Family<prometheus::Counter>* tool_calls_;
  prometheus::Family<prometheus::Counter>* image_fetches_;
  prometheus::Counter* ttft_met_;
  prometheus::Counter* ttft_missed_;
  prometheus::Counter* itl_met_;
  prometheus::Counter* itl_missed_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_ROUTER_METRICS_H_
