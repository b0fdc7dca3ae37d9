// ferry-worker, ferry-prefill and ferry-decode (ARCHITECTURE.md §1): one engine behind
// ferry.v1.Worker in the binary's role (--role; aggregated: Generate; prefill: Prefill, pushing KV
// to decode workers over --transport; decode: Generate fed by prefill workers, KvReady), plus
// Abort, Drain, Watch, the gRPC health service, and /metrics, /healthz, /readyz on the admin
// port. Prints "grpc_port=N admin_port=M" once serving. SIGTERM: not ready at once, Watch streams
// stay open saying DRAINING, running requests go on for --drain_grace, then are handed off with
// their KV to the workers continuing them (or end, to be resumed by re-prefill), exit 0. A drain
// the Drain call began (a router's POST /workers/{id}/drain) ends the same way (unless
// --exit_when_drained=false).
//
//   ferry-worker --model SmolLM2-135M-Instruct.Q4_1.gguf --address 127.0.0.1:7500
//   ferry-worker --engine null --null_token_seconds 0.01      # the model's tokenizer, no weights
//   ferry-worker --engine sim --sim_calibration deploy/sim/cpu-smollm2-135m.json  # modeled time
//   ferry-prefill --transport ucx --ucx_tls tcp                # a prefill worker
//   ferry-decode --config decode.json                          # keys as the flags; flags win

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "engine/common/config.h"
#include "engine/common/log.h"
#include "engine/common/units.h"
#include "services/common/allocator_tuning.h"
#include "services/common/command_line.h"
#include "services/common/grpc_log.h"
#include "services/common/service_lifecycle.h"
#include "services/common/termination_signal.h"
#include "services/worker/worker.h"

#ifndef FERRY_WORKER_ROLE
#define FERRY_WORKER_ROLE "aggregated"
#endif

ABSL_FLAG(std::string, config, "", "JSON config file (keys as the flags; flags given win)");
ABSL_FLAG(std::string, role, FERRY_WORKER_ROLE, "aggregated, prefill or decode");
ABSL_FLAG(std::string, transport, "ucx",
          "KV transport, ucx or grpc (fallback): prefill to decode, and a drain's hand-offs");
ABSL_FLAG(std::string, ucx_tls, "", "UCX transports (tcp, shm, ...; default $UCX_TLS or UCX's)");
ABSL_FLAG(std::string, transport_address, "127.0.0.1:0",
          "the gRPC transport's listen address (port 0: any free port)");
ABSL_FLAG(absl::Duration, reservation_timeout, absl::Seconds(30),
          "decode: a reservation's KV must arrive within this");
ABSL_FLAG(absl::Duration, reservation_quarantine, absl::Seconds(30),
          "decode: a failed reservation's blocks wait this long for the push's outcome");
ABSL_FLAG(absl::Duration, handoff_ttl, absl::Seconds(120),
          "prefill: a push that never ends has its blocks freed after this");
ABSL_FLAG(bool, stream_kv, true,
          "prefill: push KV blocks as they complete, during the compute (false: after it)");
ABSL_FLAG(std::string, push_hold_file, "",
          "test seam (prefill): pushes wait while this file exists");
ABSL_FLAG(std::string, image_hold_file, "",
          "test seam: the image executor waits before each request while this file exists");
ABSL_FLAG(std::string, engine, "real",
          "real (the model), null (a deterministic token source) or sim (the null engine's "
          "tokens with the timing a --sim_calibration file models)");
ABSL_FLAG(std::string, sim_calibration, "",
          "--engine=sim: the calibration JSON (the timing model's coefficients; required)");
ABSL_FLAG(double, sim_speed, 1.0,
          "--engine=sim: this worker's compute speed factor (0.5: a GPU half as fast)");
ABSL_FLAG(std::string, model, "", "GGUF file or HF directory (default: ./ferry models path)");
ABSL_FLAG(std::string, model_name, "", "name reported to routers (default: the file name)");
ABSL_FLAG(std::string, weights, "bf16",
          "weight type: f32, bf16, or native (a GGUF file's block formats computed in place: "
          "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; other matrices bf16). A LLaVA model's vision tower "
          "computes in fp32 for f32, with bf16 products otherwise");
ABSL_FLAG(std::string, kv_dtype, "bf16", "KV cache type: f32 or bf16");
ABSL_FLAG(int, threads, 0, "compute threads (0: one per core)");
ABSL_FLAG(std::string, backend, "cpu",
          "compute backend: cpu, or cuda (one GPU; its KV moves through pinned host memory)");
ABSL_FLAG(int, cuda_device, 0, "--backend=cuda: the GPU");
ABSL_FLAG(bool, deterministic, false,
          "--backend=cuda: batch-invariant products (the CPU backend always is deterministic)");
ABSL_FLAG(bool, cuda_graphs, true,
          "--backend=cuda: decode steps as CUDA graphs (recorded once per batch shape, replayed)");
ABSL_FLAG(std::string, gpu_memory_bytes, "0",
          "--backend=cuda: the most device memory to hold (0: 90% of what is free)");
ABSL_FLAG(std::string, kv_pool_bytes, "1GiB",
          "KV block pool size (--engine=sim: bytes of the simulated model's KV, i.e. "
          "kv_pool_bytes / (kv_bytes_per_token x block_tokens) blocks)");
ABSL_FLAG(std::string, window_pool_bytes, "0",
          "hybrid models: the sliding-window layers' own pool (0: one pool)");
ABSL_FLAG(std::string, kv_staging, "auto",
          "how KV moves out of and into the pools: auto (in place on host memory, through pinned "
          "host memory on a GPU) or always (staged on any backend: the GPU's path, on the CPU)");
ABSL_FLAG(
    std::string, kv_staging_bytes, "0",
    "the KV staging area per pool, when staged (0: two of the model's longest sequences, at most "
    "the pool)");
ABSL_FLAG(std::string, prefix_cache_bytes, "",
          "unreferenced cached KV kept at most (default: the whole pool; --engine=sim: bytes of "
          "the simulated model's KV)");
ABSL_FLAG(std::string, window_cache_bytes, "256MiB", "hybrid models on two pools: window cache");
ABSL_FLAG(absl::Duration, window_cache_ttl, absl::Seconds(180),
          "hybrid models on two pools: window cache blocks live this long after their last use");
ABSL_FLAG(std::string, swa_replay, "exact",
          "hybrid models: rebuild expired window layers exactly, or bounded (approximate)");
ABSL_FLAG(int64_t, swa_replay_tokens, 128, "--swa_replay=bounded: positions replayed");
ABSL_FLAG(std::string, kvstore, "", "KV store nodes, host:port comma-separated (none: no store)");
ABSL_FLAG(std::string, kvstore_dns, "",
          "KV store nodes by DNS: name:port (the store's headless Service), each node named by its "
          "PTR record (its stable StatefulSet name)");
ABSL_FLAG(absl::Duration, dns_interval, absl::Seconds(5),
          "DNS discovery: names looked up again this often (sooner after a failed lookup)");
ABSL_FLAG(absl::Duration, kvstore_dns_linger, absl::Minutes(1),
          "--kvstore_dns: a store node gone from the DNS stays in the set this long (a StatefulSet "
          "pod being replaced has no record until its successor exists; meanwhile its keys are "
          "misses, not moved to other nodes); 0: it leaves with the lookup that misses it");
ABSL_FLAG(std::string, dns_servers, "",
          "DNS discovery: servers, ip[:port] comma-separated (default: /etc/resolv.conf's)");
ABSL_FLAG(int, kvstore_replication, 1, "KV store: copies of each block");
ABSL_FLAG(absl::Duration, kvstore_deadline, absl::Milliseconds(500),
          "KV store: per call; a slower node is a miss");
ABSL_FLAG(bool, kvstore_read, true,
          "KV store: read prefixes this worker lacks (prefill, aggregated)");
ABSL_FLAG(bool, kvstore_write, true, "KV store: write the blocks this worker computes");
ABSL_FLAG(int, kvstore_read_threads, 2, "KV store: concurrent reads");
ABSL_FLAG(int, kvstore_read_streams, 4, "KV store: Get calls one read splits its blocks over");
ABSL_FLAG(int64_t, kvstore_read_max_blocks, 0,
          "KV store: blocks one read may take from the pool (0: half the pool)");
ABSL_FLAG(std::string, kvstore_write_queue_bytes, "256MiB",
          "KV store: computed blocks waiting to be written at most (more are dropped)");
ABSL_FLAG(int, block_tokens, 64, "tokens per KV block (and per block hash)");
ABSL_FLAG(int64_t, prefill_chunk, 256, "prompt tokens per sequence per step");
ABSL_FLAG(int64_t, max_batch_tokens, 512, "tokens per engine step");
ABSL_FLAG(int64_t, max_running, 64, "sequences holding KV at once");
ABSL_FLAG(int64_t, max_queued, 256, "requests waiting for admission; more are refused");
ABSL_FLAG(int64_t, max_queued_image_requests, 64,
          "vision models: requests with image bytes waiting to be decoded and encoded (one at "
          "a time); more are refused RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, image_fetch_timeout, absl::Seconds(30),
          "vision models: the most a request's fetches of encoder-held embeddings may take "
          "(within its deadline)");
ABSL_FLAG(int, max_n, 16, "choices per request at most");
ABSL_FLAG(std::string, grammar_cache_bytes, "1GiB",
          "structured output: compiled grammars kept by hash, each counted at its IR plus its "
          "mask cache when full (0: none kept, each request compiles its own)");
ABSL_FLAG(std::string, grammar_max_bytes, "1MiB",
          "structured output: a constraint's grammar text at most (larger: INVALID_ARGUMENT)");
ABSL_FLAG(int64_t, grammar_max_rules, 50000,
          "structured output: rules of a grammar at most, the generated ones included");
ABSL_FLAG(int64_t, grammar_max_elements, 1 << 20,
          "structured output: elements of a grammar at most, after lowering repetitions");
ABSL_FLAG(int64_t, grammar_max_repetition, 10000,
          "structured output: the largest m or n of a {m,n} repetition");
ABSL_FLAG(int64_t, grammar_max_nesting, 64,
          "structured output: parentheses nested in parentheses at most");
ABSL_FLAG(double, null_prefill_tokens_per_second, 20000, "null engine: prefill speed");
ABSL_FLAG(double, null_token_seconds, 0.005, "null engine: per-token latency (a decode step)");
ABSL_FLAG(double, null_step_overhead_seconds, 0, "null engine: fixed cost of a step");
ABSL_FLAG(bool, exit_when_drained, true,
          "exit 0 once a drain (SIGTERM, or the Drain call: a router's POST "
          "/workers/{id}/drain) is over; false: a drained worker stays up, not ready, until "
          "SIGTERM (under an orchestrator that restarts exited containers)");
ABSL_FLAG(absl::Duration, test_step_delay, absl::ZeroDuration(),
          "testing: the engine sleeps this long after every step (slows a real tiny model so "
          "that a test acts mid-stream)");
ABSL_FLAG(std::string, null_script, "",
          "null engine: a JSON file of scripted replies, [{\"when\": text, \"reply\": text}]");
ABSL_FLAG(std::string, address, "127.0.0.1:0", "gRPC listen address (port 0: any free port)");
ABSL_FLAG(std::string, admin_host, "127.0.0.1", "admin HTTP listen address");
ABSL_FLAG(int, admin_port, 0, "admin HTTP port (0: any free port)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file with the shared token every call must carry (default: $FERRY_AUTH_TOKEN, if set)");
ABSL_FLAG(absl::Duration, secret_poll_interval, absl::Seconds(10),
          "--auth_token_file is re-read this often; a new valid content applies without a restart "
          "(0: never)");
ABSL_FLAG(std::string, advertise_address, "",
          "the host in the addresses this worker advertises (its gRPC endpoint, its gRPC KV "
          "transport); required when --address or --transport_address listens on 0.0.0.0");
ABSL_FLAG(std::string, worker_id, "",
          "id reported to routers (default: the advertised gRPC address)");
ABSL_FLAG(absl::Duration, watch_interval, absl::Milliseconds(100),
          "Watch: load updates at most this often");
ABSL_FLAG(absl::Duration, watch_heartbeat, absl::Seconds(1),
          "Watch: a message at least this often");
ABSL_FLAG(int64_t, watch_journal_events, 65536, "Watch: KV events kept for slow subscribers");
ABSL_FLAG(int64_t, watch_max_hashes_per_message, 65536, "Watch: block hashes per message at most");
ABSL_FLAG(int64_t, max_token_streams, 256,
          "Token streams (routers' Tokens calls) open at once; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, load_window, absl::Seconds(10), "window of the measured load");
ABSL_FLAG(absl::Duration, drain_grace, absl::Seconds(30),
          "SIGTERM/Drain: time for running requests");
ABSL_FLAG(absl::Duration, rpc_grace, absl::Seconds(5), "then for calls still in flight");
ABSL_FLAG(absl::Duration, handoff_wait, absl::Seconds(30),
          "after the drain deadline: how long a stopped request's KV waits for the worker "
          "continuing it to pull it (then it resumes by re-prefill)");

namespace {

using ferry::WorkerOptions;

std::string Program() {
  const std::string role = FERRY_WORKER_ROLE;
  return role == "aggregated" ? "ferry-worker" : "ferry-" + role;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  ferry::ExitOnBadOption(Program(), what, status);
}

bool Given(const char* name) { return ferry::FlagGiven(name); }

int64_t Bytes(const std::string& flag, const std::string& text) {
  return static_cast<int64_t>(ferry::ByteSizeFlagOrExit(Program(), flag, text));
}

// The flags given on the command line, over the config file's values, over the defaults.
WorkerOptions OptionsFromFlags() {
  WorkerOptions o;
  o.role = FERRY_WORKER_ROLE;  // the binary's, unless the config file or --role says otherwise
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    auto config = ferry::Config::LoadFile(path);
    if (!config.ok()) Die("--config", config.status());
    if (absl::Status s = ferry::ApplyWorkerConfig(*config, &o); !s.ok()) Die("--config", s);
  }
#define FROM_FLAG(name) \
  if (Given(#name)) o.name = absl::GetFlag(FLAGS_##name)
#define BYTES_FROM_FLAG(name) \
  if (Given(#name)) o.name = Bytes(#name, absl::GetFlag(FLAGS_##name))
  FROM_FLAG(role);
  FROM_FLAG(transport);
  FROM_FLAG(ucx_tls);
  FROM_FLAG(transport_address);
  FROM_FLAG(reservation_timeout);
  FROM_FLAG(reservation_quarantine);
  FROM_FLAG(handoff_ttl);
  FROM_FLAG(stream_kv);
  FROM_FLAG(push_hold_file);
  FROM_FLAG(image_hold_file);
  FROM_FLAG(engine);
  FROM_FLAG(model);
  FROM_FLAG(model_name);
  FROM_FLAG(weights);
  FROM_FLAG(kv_dtype);
  FROM_FLAG(threads);
  FROM_FLAG(backend);
  FROM_FLAG(cuda_device);
  FROM_FLAG(deterministic);
  FROM_FLAG(cuda_graphs);
  BYTES_FROM_FLAG(gpu_memory_bytes);
  BYTES_FROM_FLAG(kv_pool_bytes);
  BYTES_FROM_FLAG(window_pool_bytes);
  FROM_FLAG(kv_staging);
  BYTES_FROM_FLAG(kv_staging_bytes);
  BYTES_FROM_FLAG(prefix_cache_bytes);
  BYTES_FROM_FLAG(window_cache_bytes);
  FROM_FLAG(window_cache_ttl);
  FROM_FLAG(swa_replay);
  FROM_FLAG(swa_replay_tokens);
  FROM_FLAG(kvstore);
  FROM_FLAG(kvstore_dns);
  FROM_FLAG(dns_interval);
  FROM_FLAG(dns_servers);
  FROM_FLAG(kvstore_dns_linger);
  FROM_FLAG(kvstore_replication);
  FROM_FLAG(kvstore_deadline);
  FROM_FLAG(kvstore_read);
  FROM_FLAG(kvstore_write);
  FROM_FLAG(kvstore_read_threads);
  FROM_FLAG(kvstore_read_streams);
  FROM_FLAG(kvstore_read_max_blocks);
  BYTES_FROM_FLAG(kvstore_write_queue_bytes);
  FROM_FLAG(block_tokens);
  FROM_FLAG(prefill_chunk);
  FROM_FLAG(max_batch_tokens);
  FROM_FLAG(max_running);
  FROM_FLAG(max_queued);
  FROM_FLAG(max_queued_image_requests);
  FROM_FLAG(image_fetch_timeout);
  FROM_FLAG(max_n);
  BYTES_FROM_FLAG(grammar_cache_bytes);
  BYTES_FROM_FLAG(grammar_max_bytes);
  FROM_FLAG(grammar_max_rules);
  FROM_FLAG(grammar_max_elements);
  FROM_FLAG(grammar_max_repetition);
  FROM_FLAG(grammar_max_nesting);
  FROM_FLAG(null_prefill_tokens_per_second);
  FROM_FLAG(null_token_seconds);
  FROM_FLAG(null_step_overhead_seconds);
  FROM_FLAG(null_script);
  FROM_FLAG(sim_calibration);
  FROM_FLAG(sim_speed);
  FROM_FLAG(address);
  FROM_FLAG(admin_host);
  FROM_FLAG(admin_port);
  FROM_FLAG(auth_token_file);
  FROM_FLAG(secret_poll_interval);
  FROM_FLAG(advertise_address);
  FROM_FLAG(worker_id);
  FROM_FLAG(watch_interval);
  FROM_FLAG(watch_heartbeat);
  if (Given("watch_journal_events")) {
    o.watch_journal_events = static_cast<size_t>(absl::GetFlag(FLAGS_watch_journal_events));
  }
  if (Given("max_token_streams")) {
    const int64_t v = absl::GetFlag(FLAGS_max_token_streams);
    o.max_token_streams = v < 1 ? 0 : static_cast<size_t>(v);
  }
  if (Given("watch_max_hashes_per_message")) {
    o.watch_max_hashes_per_message =
        static_cast<size_t>(absl::GetFlag(FLAGS_watch_max_hashes_per_message));
  }
  FROM_FLAG(load_window);
  FROM_FLAG(drain_grace);
  FROM_FLAG(rpc_grace);
  FROM_FLAG(handoff_wait);
  FROM_FLAG(test_step_delay);
#undef FROM_FLAG
#undef BYTES_FROM_FLAG
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  auto signal = TerminationSignal::Install();  // before any thread
  CHECK_OK(signal.status());
  ParseProgramCommandLine(Program(),
                          absl::StrCat("the Ferry worker, ", FERRY_WORKER_ROLE,
                                       " role (gRPC service, admin HTTP /metrics)"),
                          argc, argv);
  RouteGrpcLogs();
  TuneAllocatorForLargeBuffers();  // KV store reads and writes: multi-MiB messages
  WorkerOptions options = OptionsFromFlags();
  if (absl::Status s = ValidateWorkerOptions(options); !s.ok()) Die("options", s);
  // A drain the Drain call began ends the process as SIGTERM's does.
  if (absl::GetFlag(FLAGS_exit_when_drained)) {
    TerminationSignal* terminate = signal->get();
    options.on_drained = [terminate] { terminate->Trigger(); };
  }
  auto worker = Worker::Start(options);
  if (!worker.ok()) Die("start", worker.status());
  std::printf("grpc_port=%d admin_port=%d\n", (*worker)->grpc_port(), (*worker)->admin_port());
  std::fflush(stdout);

  ShutdownOptions shutdown;
  shutdown.rpc_grace = options.rpc_grace;
  shutdown.drain_grace = options.drain_grace;
  Worker* w = worker->get();
  shutdown.drain = [w](absl::Time deadline) { w->Drain(deadline); };
  ServeUntilTerminated(**signal, w->grpc(), &w->admin(), shutdown);
  worker->reset();  // the engine stops; nothing is running any more
  LOG(INFO) << "worker stopped";
  return 0;
}
