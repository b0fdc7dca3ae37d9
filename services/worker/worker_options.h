// Everything a worker process is configured with (STYLE.md §17: one options struct per binary).
// `ferry-worker` fills it from its JSON config file (--config; keys named as the flags, sizes as
// "2GiB", durations as "100ms") and then from the flags given on its command line, which win;
// tests build a Worker from it directly.

#ifndef FERRY_SERVICES_WORKER_WORKER_OPTIONS_H_
#define FERRY_SERVICES_WORKER_WORKER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/common/config.h"

namespace ferry {

struct WorkerOptions {
  // --- The model.
  // "real": the model on the CPU backend; "null": NullModel; "sim": NullModel timed by a
  // calibration (the simulated engine, below).
  std::string engine = "real";
  std::string model;              // a GGUF file or an HF directory ("": DefaultModelPath())
  std::string model_name;         // reported in Watch ("": the file or directory name)
  std::string weights = "bf16";   // f32 | bf16 | native
  std::string kv_dtype = "bf16";  // f32 | bf16
  int threads = 0;                // compute threads (0: one per core)
  // The compute backend (engine/backends/backend_factory.h): "cpu", or "cuda" (one GPU, the
  // plugin libferry_cuda.so; its KV leaves and enters the device through a staging area of
  // pinned host memory, engine/kv/kv_staging.h).
  std::string backend = "cpu";
  int cuda_device = 0;
  int64_t gpu_memory_bytes = 0;  // the most device memory the backend holds (0: 90% of free)
  // Batch-invariant products on the GPU (the CPU backend always is): a request's tokens do not
  // depend on what shares its batch, at some cost in speed.
  bool deterministic = false;
  // Decode steps on the GPU as CUDA graphs (recorded once per batch shape, then replayed).
  bool cuda_graphs = true;

  // --- KV cache and scheduler. With --engine=sim the byte sizes (kv_pool_bytes,
  // prefix_cache_bytes) are of the simulated model's KV (the calibration's kv_bytes_per_token):
  // the pool gets kv_pool_bytes / (kv_bytes_per_token x block_tokens) blocks of NullModel's
  // tiny layout.
  int64_t kv_pool_bytes = int64_t{1} << 30;
  // Hybrid models (sliding-window and full-attention layers): the window layers' pool (0: every
  // layer in the one pool).
  int64_t window_pool_bytes = 0;
  // How KV moves out of and into the pools (P/D pushes, KV store reads and writes, drain
  // hand-offs): "auto" (in place on host memory, through a staging area on a GPU) or "always"
  // (through a staging area on any backend: how CI tests a GPU worker's KV path on the CPU).
  std::string kv_staging = "auto";
  // The staging area's size per pool (0: two of the model's longest sequences' blocks, at most
  // the pool's); a hand-off needs its table's fresh blocks in it at once.
  int64_t kv_staging_bytes = 0;
  int64_t prefix_cache_bytes = -1;  // unreferenced cached blocks at most (-1: the whole pool)
  int64_t window_cache_bytes = int64_t{256} << 20;
  // Hybrid models on two pools (engine.h "SWA replay"): the window cache's blocks live this long
  // after their last use; a cached prefix whose window blocks are gone is replayed, "exact" (the
  // default: bit-identical) or "bounded" (swa_replay_tokens positions: cheaper, approximate).
  absl::Duration window_cache_ttl = absl::Seconds(180);
  std::string swa_replay = "exact";
  int64_t swa_replay_tokens = 128;
  int32_t block_tokens = 64;
  int64_t prefill_chunk = 256;
  int64_t max_batch_tokens = 512;
  int64_t max_running = 64;
  int64_t max_queued = 256;
  int32_t max_n = 16;
  // Vision-language models: requests with image bytes waiting to be decoded and encoded (one at
  // a time, on the image executor); more are refused RESOURCE_EXHAUSTED.
  int64_t max_queued_image_requests = 64;
  // Vision-language models: the most one request's fetches of encoder-held embeddings
  // (PromptImage.embeddings_handle) may take, within its own deadline.
  absl::Duration image_fetch_timeout = absl::Seconds(30);

  // --- Structured output (SamplingParams.constraint; docs/design/grammar.md): grammars compiled
  // for this worker's vocabulary, kept by hash up to grammar_cache_bytes (each counted at its
  // IR plus its mask cache when full); a grammar over a limit below is refused InvalidArgument.
  int64_t grammar_cache_bytes = int64_t{1} << 30;
  int64_t grammar_max_bytes = int64_t{1} << 20;  // the GBNF text
  int64_t grammar_max_rules = 50000;             // rules, the generated ones included
  int64_t grammar_max_elements = int64_t{1} << 20;
  int64_t grammar_max_repetition = 10000;  // m and n of {m,n}
  int64_t grammar_max_nesting = 64;        // parentheses in parentheses

  // --- The null engine's timing (NullModel).
  double null_prefill_tokens_per_second = 20000;
  double null_token_seconds = 0.005;  // per-token latency: a step with decoding rows
  double null_step_overhead_seconds = 0;
  // Testing: the engine thread sleeps this long after every step (a real tiny model decodes a
  // whole answer in milliseconds; a test that acts mid-stream slows it down). Zero: never.
  absl::Duration test_step_delay = absl::ZeroDuration();
  // A JSON file of scripts the null engine replies with (API tests): [{"when": text, "reply":
  // text}, ...] (at most 4; "when" absent or "": from the start). A sequence replies with the
  // script whose "when" text it held last (as tokens), then ends; "reply" may hold special tokens.
  std::string null_script;

  // --- The simulated engine (--engine=sim; engine/model/sim_timing.h): the null engine's token
  // source, its steps, KV hand-offs and store reads taking the time the calibration file models.
  std::string sim_calibration;  // the calibration JSON; required with --engine=sim
  double sim_speed = 1.0;       // compute speed factor of this worker (0.5: a GPU half as fast)

  // --- The role (ARCHITECTURE.md §1): "aggregated" (prefill and decode here: ferry-worker),
  // "prefill" (ferry-prefill: Prefill calls, pushing KV to decode workers) or "decode"
  // (ferry-decode: Generate calls whose KV a prefill worker pushes).
  std::string role = "aggregated";
  // --- The KV transport of the prefill and decode roles (services/transfer/kv_transport.h).
  std::string transport = "ucx";  // ucx | grpc (the fallback where UCX is unavailable)
  std::string ucx_tls;            // UCX transports ("tcp", "shm", ...; "": $UCX_TLS or UCX's)
  // The gRPC fallback's listen address (port 0 picks one).
  std::string transport_address = "127.0.0.1:0";
  // Decode: a reservation's KV must arrive within this (past it the request fails).
  absl::Duration reservation_timeout = absl::Seconds(30);
  // Decode: after a failed reservation's deadline, how long its blocks stay out of use while
  // the prefill worker's transfer may still be reaching them (its outcome frees them sooner).
  absl::Duration reservation_quarantine = absl::Seconds(30);
  // Prefill: a handed-off request's blocks are freed after this even if its push never ended
  // (longer than any reservation's timeout).
  absl::Duration handoff_ttl = absl::Seconds(120);
  // Prefill: push the prompt's blocks as they complete, while the rest is computed (the first
  // token then waits only for the last chunk's KV); false: the whole push after the compute.
  bool stream_kv = true;
  // Test seam (prefill): while this file exists, puts wait before they start (a streamed one,
  // the last ones; bounded by their deadline), so tests can act during a push without racing
  // it. "": none.
  std::string push_hold_file;
  // Test seam: while this file exists, the image executor waits before each request (at most
  // 60 s each). "": none.
  std::string image_hold_file;

  // --- The shared KV store (ARCHITECTURE.md §3 step 5, §5): ferry-kvstore nodes, "host:port"
  // comma-separated ("": none). Prefill and aggregated workers read the prefix their memory lacks
  // from it (StoreReader); every worker writes the full blocks it computes (StoreWriter). The
  // nodes' shared token is the worker's own (auth_token_file / FERRY_AUTH_TOKEN).
  std::string kvstore;
  // Or the nodes by DNS: "name:port" comma-separated (the store's headless Service), each node
  // named by its PTR record, its stable StatefulSet name (services/common/dns_discovery.h), looked
  // up again every dns_interval; dns_servers "ip[:port]" comma-separated ("": /etc/resolv.conf's).
  std::string kvstore_dns;
  absl::Duration dns_interval = absl::Seconds(5);
  std::string dns_servers;
  // How long a store node gone from the DNS stays in the set (its pod may be being replaced).
  absl::Duration kvstore_dns_linger = absl::Minutes(1);
  int kvstore_replication = 1;
  absl::Duration kvstore_deadline = absl::Milliseconds(500);  // per store call; slower: a miss
  bool kvstore_read = true;
  bool kvstore_write = true;
  int kvstore_read_threads = 2;
  int kvstore_read_streams = 4;         // Get calls one read splits its blocks over, at once
  int64_t kvstore_read_max_blocks = 0;  // fresh blocks one read may take (0: half the pool)
  int64_t kvstore_write_queue_bytes = int64_t{256} << 20;  // blocks waiting to be written

  // --- Serving.
  std::string address = "127.0.0.1:0";  // gRPC; port 0 picks a free port
  std::string admin_host = "127.0.0.1";
  int admin_port = 0;
  std::string auth_token_file;  // "": FERRY_AUTH_TOKEN if set, else no token
  // The token file is re-read this often; a new valid content applies to the next call (zero:
  // never re-read).
  absl::Duration secret_poll_interval = absl::Seconds(10);
  // The host in every address the worker advertises: its gRPC endpoint (and default id) in
  // Watch, the gRPC transport's address in hand-offs ("": the listen addresses' own hosts,
  // which must then not be wildcards; services/common/advertise_address.h).
  std::string advertise_address;
  std::string worker_id;  // "": the advertised gRPC endpoint (host:port)
  absl::Duration watch_interval = absl::Milliseconds(100);  // load updates at most this often
  absl::Duration watch_heartbeat = absl::Seconds(1);        // a message at least this often
  size_t watch_journal_events = size_t{1} << 16;            // events kept for slow subscribers
  size_t watch_max_hashes_per_message = size_t{1} << 16;
  // Token streams (worker.proto Tokens) open at once: one per router.
  size_t max_token_streams = 256;
  absl::Duration load_window = absl::Seconds(10);
  absl::Duration drain_grace = absl::Seconds(30);  // SIGTERM / Drain: running requests' time
  absl::Duration rpc_grace = absl::Seconds(5);     // then in-flight calls', before cancelling
  // After the drain deadline: how long a parked request's KV waits for the worker continuing it.
  absl::Duration handoff_wait = absl::Seconds(30);
  // Called once when a drain is over (nothing running, no KV waiting): ferry-worker exits then,
  // whether SIGTERM or the Drain call began it. Not from the config file.
  std::function<void()> on_drained;
};

// Applies the keys of `config` (a worker config file's root object) to `options`; every key
// must be known (Config::CheckAllKeysUsed).
absl::Status ApplyWorkerConfig(const Config& config, WorkerOptions* options);

// Range and consistency checks; errors name the option.
absl::Status ValidateWorkerOptions(const WorkerOptions& options);

// Where `./ferry models pull` puts the default model (what `./ferry models path` prints):
// $FERRY_MODEL_GGUF, else SmolLM2-135M-Instruct.Q4_1.gguf under $FERRY_MODELS_DIR, else under
// $FERRY_CACHE/models, else /var/cache/ferry/models when writable, else
// ${XDG_CACHE_HOME:-~/.cache}/ferry/models.
std::string DefaultModelPath();

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_WORKER_OPTIONS_H_
