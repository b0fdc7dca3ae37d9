// The worker's Prometheus metrics (ARCHITECTURE.md §9), on the registry its admin port serves:
//
//   ferry_worker_requests_total{outcome}        Generate calls by how they ended: completed,
//                                                aborted (Abort), cancelled (the caller went
//                                                away), deadline_exceeded, drained, error,
//                                                invalid, rejected (queue full, draining)
//   ferry_worker_queued_requests                 waiting for admission (engine)
//   ferry_worker_running_requests                sequences holding KV
//   ferry_worker_kv_blocks{state}                used, free, cached; ferry_worker_kv_pool_blocks
//   ferry_worker_load_refreshes_total            refreshes of the gauges above (a tick to wait on)
//   Utilisation, the planner's inputs (docs/operations/metrics.md; WorkerUtilisation below):
//   ferry_worker_busy_fraction                   engine step time over wall time, over
//                                                --load_window (prefill pools' load)
//   ferry_worker_kv_used_fraction                KV blocks held by requests over the pool's
//                                                blocks (decode pools' load against capacity)
//   ferry_worker_running_fraction                running sequences over --max_running
//   ferry_worker_queued_tokens                   prompt tokens waiting for admission
//   ferry_worker_prompt_tokens_total{source}     prefill and aggregated workers: computed, local
//                                                (reused from this worker's cache), store (read
//                                                from the KV store); decode workers: decode_local
//                                                (held already, so not pushed)
//   ferry_worker_generated_tokens_total
//   ferry_worker_prefill_tokens_per_second       over the load window (LoadWindow)
//   ferry_worker_step_seconds{kind}              histogram per engine step: decode (only decoding
//                                                rows), prefill, mixed
//   ferry_worker_ttft_seconds                    histogram: Generate received -> first token
//   ferry_worker_expert_tokens_total{expert}     mixture-of-experts models: tokens per expert
//   ferry_worker_watch_subscribers, ferry_worker_watch_snapshots_total{reason}
//   ferry_worker_backend_info{backend, device}  1: the compute backend (--backend) and its device
//   ferry_worker_device_memory_bytes{state}     GPU backends: used, limit, device
//   ferry_worker_unauthenticated_calls_total
//   The KV store (--kvstore) and the window layers of hybrid models:
//   ferry_worker_store_lookups_total{result}     reads of a request's prefix: hit (blocks read),
//                                                miss (none stored), memory (nothing beyond this
//                                                worker's cache), skipped (busy, past deadline)
//   ferry_worker_store_existence_total{source}   how a read knew what the store holds: router
//                                                (its probe, carried in the request), own (an
//                                                Exists call of the worker's)
//   ferry_worker_store_read_blocks_total{outcome} loaded, missing (absent, corrupt, node down),
//                                                rejected (another KV layout), unsettled (a node
//                                                failed during a read by the KV transport: held
//                                                back from the pool a while)
//   ferry_worker_store_reads_total{path}         reads with blocks, by how the bytes came:
//                                                transport (the node's KV transport put them into
//                                                the blocks), stream (in the Get stream, copied)
//   ferry_worker_store_read_bytes_total, ferry_worker_store_read_seconds (histogram per read)
//   ferry_worker_store_quarantined_blocks        blocks held back after such a failure
//   ferry_worker_store_write_blocks_total{outcome} written, extended (the store had them with a
//                                                shorter retention floor than the request's:
//                                                written again), present (the store had them),
//                                                dropped (the write queue was full), failed
//   ferry_worker_store_written_bytes_total
//   ferry_worker_store_write_queue_bytes         waiting or being written
//   ferry_worker_window_cache_lookups_total{result} cached prefixes' window layers: hit, replay
//                                                (rebuilt by a replay), miss (a shorter prefix)
//   ferry_worker_window_replayed_tokens_total    positions replayed to rebuild them
//   ferry_worker_window_cache_expired_blocks_total  window blocks dropped by their TTL
//   Prefill/decode disaggregation:
//   ferry_worker_kv_push_bytes, ferry_worker_kv_push_seconds
//                                                histograms per request (prefill): KV pushed to
//                                                the decode worker, and the time its puts were
//                                                in flight
//   ferry_worker_kv_push_tail_seconds            histogram (prefill): the push's time after the
//                                                compute, which the first token waits for
//   ferry_worker_kv_streamed_bytes_total         KV pushed while the prompt was being computed
//   ferry_worker_kv_pushes_total{outcome}        ok, failed (prefill)
//   ferry_worker_kv_blocks_skipped_total         blocks not pushed: the decode worker held them
//   ferry_worker_kv_reservations_total{outcome}  decode: landed, timed_out, failed, no_blocks
//   ferry_worker_kv_reservation_blocks_released_total{outcome}
//                                                decode: blocks of failed reservations given back
//                                                once the push was known to be over (known) or
//                                                after the quarantine ran out (quarantine)
//   Drains (SIGTERM, the Drain call):
//   ferry_worker_drains_total                    drains started
//   ferry_worker_drain_duration_seconds          the last drain, from its start to nothing left
//                                                (no call, no KV waiting for its hand-off)
//   ferry_worker_handoffs_total{outcome}         requests running at the drain deadline: pushed
//                                                (their KV went to the worker continuing them),
//                                                failed (the push failed), expired (nobody took
//                                                the KV within --handoff_wait), not_parked (not
//                                                between tokens, or several choices: ended to be
//                                                resumed by re-prefill)
//   ferry_worker_handoff_bytes_total             KV bytes handed off
//   ferry_worker_handoffs_received_total, ferry_worker_handoff_received_bytes_total
//                                                the worker continuing drained requests: hand-offs
//                                                it took, and their bytes
//   ferry_worker_handoff_seconds                 histogram per pushed hand-off: PushKv's arrival
//                                                to the push's completion
//   ferry_worker_precopies_total{outcome}        drain pre-copies this worker pushed from a running
//                                                request while its drain ran: pushed, refused (the
//                                                request was gone or had too little computed),
//                                                failed (the put failed)
//   ferry_worker_precopy_bytes_total             KV bytes pre-copied
//   Vision-language models (requests with image bytes, encoded on the image executor):
//   ferry_worker_image_requests_total{outcome}   encoded (its images decoded and encoded, or
//                                                refused as invalid), cancelled (the caller left
//                                                while it waited: nothing decoded), rejected (the
//                                                queue was full: RESOURCE_EXHAUSTED)
//   ferry_worker_image_requests_waiting          waiting for the image executor
//   ferry_worker_image_requests_encoding         on the image executor now (0 or 1)
//   ferry_worker_image_encode_seconds            histogram per encoded request: its time on the
//                                                executor (decode, preprocess, tower, all images)
//   Structured output (SamplingParams.constraint):
//   ferry_worker_grammar_cache_total{result}     constraint compile-cache lookups: hit (cached,
//                                                or another request's compile waited for), miss
//                                                (compiled), error (a bad grammar or one over a
//                                                --grammar_max_* limit)
//   ferry_worker_grammar_compile_seconds         histogram per compile (misses and errors)
//   ferry_worker_grammar_cache_bytes             compiled grammars kept (estimated; at most
//                                                --grammar_cache_bytes)
//   ferry_worker_grammar_masks_total, ferry_worker_grammar_mask_seconds_total
//                                                token masks computed on the engine thread and
//                                                their time (mean mask time per token: the ratio)
//   ferry_worker_token_streams                   token streams open (worker.proto Tokens)
//   ferry_worker_token_stream_messages_total, ferry_worker_token_stream_chunks_total
//                                                messages written on them and the TokenChunks
//                                                they carried (chunks per message: the ratio)
//
// Thread-safe (prometheus-cpp metrics are).

#ifndef FERRY_SERVICES_WORKER_WORKER_METRICS_H_
#define FERRY_SERVICES_WORKER_WORKER_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ferry {

enum class RequestOutcome {
  kCompleted,
  kAborted,
  kCancelled,
  kDeadlineExceeded,
  kDrained,
  kError,
  kInvalid,
  kRejected,
};
inline constexpr int kNumRequestOutcomes = 8;
const char* RequestOutcomeName(RequestOutcome outcome);

// The utilisation gauges' values. A decode worker's busy fraction is ~1 whenever anything
// decodes, so its load is measured against its capacity: KV and running slots.
struct WorkerUtilisation {
  double busy_fraction = 0;  // LoadWindow's: step time over wall time, in [0, 1]
  // Blocks held by requests over the pool's blocks, in [0, 1]. Held: the blocks the running
  // sequences' positions fill (ceil(running_tokens / block_tokens), a prefix shared by running
  // sequences counted once per sequence), at least the blocks held by anything but the prefix
  // cache (reservations, imports) and at most the blocks not free. Blocks only the prefix cache
  // holds are not load: they are given up on demand.
  double kv_used_fraction = 0;
  double running_fraction = 0;  // running sequences over max_running, in [0, 1]
  int64_t queued_tokens = 0;    // tokens still to compute for the sequences waiting admission
};

// `max_running` and `block_tokens`: the engine's (zero or less: those fractions are 0).
WorkerUtilisation UtilisationOf(const EngineStats& stats, double busy_fraction, int64_t max_running,
                                int64_t block_tokens);

class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  void Outcome(RequestOutcome outcome);
  void Ttft(double seconds);
  // Prompt tokens of a request computed here, reused from this worker's cache, read from the
  // store.
  void PromptTokens(int64_t computed, int64_t local, int64_t store);
  // Decode workers: prompt tokens already held, not pushed.
  void DecodeLocalTokens(int64_t tokens);
  // The KV store: StoreReader's and StoreWriter's (labels as in the header comment).
  void StoreLookup(const char* result);
  void StoreExistence(const char* source);
  void StoreReadBlocks(const char* outcome, int64_t blocks);
  // `path`: "transport" or "stream".
  void StoreRead(int64_t bytes, double seconds, const char* path);
  void StoreWriteBlocks(const char* outcome, int64_t blocks);
  void StoreWrittenBytes(int64_t bytes);
  void StoreWriteQueueBytes(int64_t bytes);
  void StoreQuarantinedBlocks(int64_t blocks);
  void Step(const StepInfo& step);
  // Gauges and the counters that mirror the engine's (generated tokens, experts).
  void Refresh(const EngineStats& stats, double prefill_tokens_per_second,
               const WorkerUtilisation& utilisation);
  void WatchSubscribers(int64_t n);
  void WatchSnapshot(bool lagged);
  void Unauthenticated();
  // A push's bytes (of them, streamed during the compute), wire and tail times, outcome.
  void Push(uint64_t bytes, uint64_t streamed, double seconds, double tail_seconds, bool ok);
  void BlocksSkipped(int64_t blocks);
  // "landed", "timed_out", "failed", "no_blocks".
  void Reservation(const std::string& outcome);
  void KvReleased(int64_t blocks, bool outcome_known);
  void DrainStarted();
  void DrainDuration(double seconds);
  // "pushed", "failed", "expired", "not_parked"; bytes and seconds with "pushed".
  void Handoff(const char* outcome, uint64_t bytes = 0, double seconds = 0);
  void HandoffReceived(uint64_t bytes);
  // A drain pre-copy this worker pushed: "pushed" (with its bytes), "refused", "failed".
  void Precopy(const char* outcome, uint64_t bytes);
  // The image executor: a request queued (+1) or leaving the queue (-1); one starting (+1) or
  // ending (-1) on it; how it ended ("encoded", "cancelled", "rejected"), with its time there.
  void ImageWaiting(int delta);
  void ImageEncoding(int delta);
  void ImageRequest(const char* outcome, double seconds = 0);
  // One image's embeddings fetched from an encoder (embedding_fetcher.h): "fetched" (with its
  // bytes), "unavailable", "refused", "cancelled", "deadline"; its time either way.
  void ImageFetch(const char* outcome, uint64_t bytes, double seconds);
  // A constraint's compile-cache lookup: "hit", "miss" or "error", the compile's time when this
  // lookup compiled (0: it did not), and the cache's bytes after it.
  void GrammarLookup(const char* result, double compile_seconds, size_t cache_bytes);
  // The compute backend: ferry_worker_backend_info{backend, device} is 1; a GPU backend's
  // device memory (ferry_worker_device_memory_bytes{state}: limit and device now, used at every
  // Refresh through `used_bytes`).
  void SetBackend(const std::string& kind, const std::string& device, uint64_t limit_bytes,
                  uint64_t device_bytes, std::function<uint64_t()> used_bytes);
  // Token streams open now; a message written on one, with its chunks.
  void TokenStreams(int64_t open);
  void TokenStreamMessage(int64_t chunks);

 private:
  std::vector<prometheus::Counter*> outcomes_;
  prometheus::Gauge* queued_;
  prometheus::Gauge* running_;
  prometheus::Gauge* blocks_used_;
  prometheus::Gauge* blocks_free_;
  prometheus::Gauge* blocks_cached_;
  prometheus::Gauge* blocks_total_;
  prometheus::Counter* refreshes_;
  prometheus::Gauge* busy_fraction_;
  prometheus::Gauge* kv_used_fraction_;
  prometheus::Gauge* running_fraction_;
  prometheus::Gauge* queued_tokens_;
  prometheus::Counter* prompt_computed_;
  prometheus::Counter* prompt_local_;
  prometheus::Counter* prompt_store_;
  prometheus::Counter* prompt_decode_local_;
  prometheus::Family<prometheus::Counter>* store_lookups_;
  prometheus::Family<prometheus::Counter>* store_existence_;
  prometheus::Family<prometheus::Counter>* store_read_blocks_;
  prometheus::Counter* store_read_bytes_;
  prometheus::Family<prometheus::Counter>* store_reads_;
  prometheus::Histogram* store_read_seconds_;
  prometheus::Family<prometheus::Counter>* store_write_blocks_;
  prometheus::Counter* store_written_bytes_;
  prometheus::Gauge* store_write_queue_bytes_;
  prometheus::Gauge* store_quarantined_blocks_;
  prometheus::Counter* window_hits_;
  prometheus::Counter* window_replays_;
  prometheus::Counter* window_misses_;
  prometheus::Counter* window_replayed_tokens_;
  prometheus::Counter* window_expired_;
  prometheus::Counter* absent_image_rows_;
  prometheus::Counter* generated_;
  prometheus::Gauge* prefill_speed_;
  prometheus::Histogram* step_decode_;
  prometheus::Histogram* step_prefill_;
  prometheus::Histogram* step_mixed_;
  prometheus::Histogram* ttft_;
  prometheus::Family<prometheus::Counter>* experts_;
  prometheus::Gauge* subscribers_;
  prometheus::Counter* snapshots_initial_;
  prometheus::Counter* snapshots_lagged_;
  prometheus::Counter* unauthenticated_;
  prometheus::Histogram* push_bytes_;
  prometheus::Histogram* push_seconds_;
  prometheus::Histogram* push_tail_seconds_;
  prometheus::Counter* streamed_bytes_;
  prometheus::Counter* pushes_ok_;
  prometheus::Counter* pushes_failed_;
  prometheus::Counter* blocks_skipped_;
  prometheus::Family<prometheus::Counter>* reservations_;
  prometheus::Counter* drains_;
  prometheus::Gauge* drain_duration_;
  prometheus::Family<prometheus::Counter>* handoffs_;
  prometheus::Counter* handoff_bytes_;
  prometheus::Histogram* handoff_seconds_;
  prometheus::Counter* handoffs_received_;
  prometheus::Family<prometheus::Counter>* precopies_;
  prometheus::Counter* precopy_bytes_;
  prometheus::Counter* handoff_received_bytes_;
  prometheus::Counter* released_known_;
  prometheus::Counter* released_quarantine_;
  prometheus::Family<prometheus::Counter>* image_requests_;
  prometheus::Gauge* image_waiting_;
  prometheus::Gauge* image_encoding_;
  prometheus::Histogram* image_encode_seconds_;
  prometheus::Family<prometheus::Counter>* image_fetches_;
  prometheus::Counter* image_fetched_bytes_;
  prometheus::Histogram* image_fetch_seconds_;
  prometheus::Family<prometheus::Counter>* grammar_lookups_;
  prometheus::Histogram* grammar_compile_seconds_;
  prometheus::Gauge* grammar_cache_bytes_;
  prometheus::Counter* grammar_masks_;
  prometheus::Counter* grammar_mask_seconds_;
  prometheus::Gauge* token_streams_;
  prometheus::Family<prometheus::Gauge>* backend_info_;
  prometheus::Gauge* device_memory_used_;
  prometheus::Gauge* device_memory_limit_;
  prometheus::Gauge* device_memory_total_;
  std::function<uint64_t()> device_memory_used_bytes_;  // set once, before Refresh runs
  prometheus::Counter* token_stream_messages_;
  prometheus::Counter* token_stream_chunks_;

  absl::Mutex mu_;  // the mirrors' last values
  int64_t last_generated_ ABSL_GUARDED_BY(mu_) = 0;
  EngineStats last_ ABSL_GUARDED_BY(mu_);  // the window counters' mirrors
  std::vector<int64_t> last_experts_ ABSL_GUARDED_BY(mu_);
  std::vector<prometheus::Counter*> expert_counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_WORKER_METRICS_H_
