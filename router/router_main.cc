// ferry-router: the OpenAI-compatible front door (router.h). Prints "http_port=N admin_port=M"
// once listening; /readyz turns 200 when a worker is up. SIGTERM: not ready at once, running
// streams finish within --shutdown_grace, exit 0. SIGHUP: --api_keys_file and --workers_file are
// read again (each on its own: one that fails keeps what it had and does not stop the other).
//
//   ferry-router --model SmolLM2-135M-Instruct.Q4_1.gguf --workers 127.0.0.1:7500 --port 8000
//   curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d  (one line)
//     '{"model":"SmolLM2-135M-Instruct","messages":[{"role":"user","content":"Hi"}]}'

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "engine/common/config.h"
#include "engine/common/log.h"
#include "engine/common/units.h"
#include "router/router.h"
#include "services/common/command_line.h"
#include "services/common/grpc_log.h"
#include "services/common/termination_signal.h"

ABSL_FLAG(std::string, config, "", "JSON config file (keys as the flags; flags given win)");
ABSL_FLAG(std::string, model, "", "GGUF file or HF directory: the tokenizer and chat template");
ABSL_FLAG(std::string, served_model_name, "", "the model id clients use (default: the file name)");
ABSL_FLAG(std::vector<std::string>, workers, {}, "worker gRPC addresses, comma-separated");
ABSL_FLAG(std::string, workers_file, "",
          "a file of worker addresses, one per line (with --workers' too); read again on SIGHUP "
          "and POST /workers/reload on the admin port: workers it no longer lists get no new "
          "requests, their running ones go on");
ABSL_FLAG(std::vector<std::string>, workers_dns, {},
          "workers by DNS: name:port, comma-separated (a headless Service per pool: its A records "
          "are the workers), looked up again every --dns_interval");
ABSL_FLAG(std::vector<std::string>, kvstore_dns, {},
          "KV store nodes by DNS: name:port (the store's headless Service), each node named by its "
          "PTR record (its stable StatefulSet name), as the workers' --kvstore_dns");
ABSL_FLAG(absl::Duration, dns_interval, absl::Seconds(5),
          "DNS discovery: names looked up again this often (sooner after a failed lookup)");
ABSL_FLAG(absl::Duration, kvstore_dns_linger, absl::Minutes(1),
          "--kvstore_dns: a store node gone from the DNS stays in the set this long (a StatefulSet "
          "pod being replaced has no record until its successor exists; meanwhile its keys are "
          "misses, not moved to other nodes); 0: it leaves with the lookup that misses it");
ABSL_FLAG(std::vector<std::string>, dns_servers, {},
          "DNS discovery: servers, ip[:port] comma-separated (default: /etc/resolv.conf's)");
ABSL_FLAG(std::string, policy, "prefix_aware",
          "prefix_aware (the prompt's prefix each worker holds, its queue and measured speed), "
          "least_loaded or round_robin");
ABSL_FLAG(std::string, kv_index_bytes, "256MiB",
          "prefix_aware: memory for the index of the workers' cached blocks (at most)");
ABSL_FLAG(absl::Duration, busy_threshold, absl::Seconds(4),
          "prefix_aware: a worker with more queued prefill work than this gets requests only "
          "when all are busy");
ABSL_FLAG(absl::Duration, store_fetch_per_block, absl::Microseconds(500),
          "prefix_aware: the cost of reading one KV block from the store");
ABSL_FLAG(std::vector<std::string>, kvstore, {},
          "KV store nodes (host:port, comma-separated, as the workers name them): asked how much "
          "of each prompt they hold");
ABSL_FLAG(absl::Duration, kvstore_deadline, absl::Milliseconds(50),
          "the store probe's deadline (a slower store counts as holding nothing)");
ABSL_FLAG(std::string, api_keys_file, "",
          "clients' API keys and tenants (JSON; re-read every --secret_poll_interval and on "
          "SIGHUP); none: an open API on loopback only");
ABSL_FLAG(absl::Duration, secret_poll_interval, absl::Seconds(10),
          "--auth_token_file and --api_keys_file are re-read this often; a new valid content "
          "applies without a signal (0: never)");
ABSL_FLAG(absl::Duration, slo_ttft, absl::Seconds(2),
          "SLO: a request meets its time-to-first-token objective within this "
          "(ferry_router_slo_requests_total)");
ABSL_FLAG(absl::Duration, slo_itl, absl::Milliseconds(200),
          "SLO: a request meets its inter-token objective when its mean time between output "
          "tokens is within this");
ABSL_FLAG(bool, allow_unauthenticated, false,
          "serve without --api_keys_file on a non-loopback --host");
ABSL_FLAG(double, price_input_per_mtok, 0, "billing: dollars per million cache-miss input tokens");
ABSL_FLAG(double, price_cached_input_per_mtok, 0,
          "billing: dollars per million cache-hit input tokens");
ABSL_FLAG(double, price_output_per_mtok, 0, "billing: dollars per million output tokens");
ABSL_FLAG(double, gpus_per_worker, 1, "billing: GPUs each worker holds (revenue per GPU-hour)");
ABSL_FLAG(std::string, tool_call_parser, "auto",
          "how tool calls are read: auto (from the chat template), hermes, llama3_json, mistral, "
          "deepseek, or none");
ABSL_FLAG(std::string, tool_prompt, "template",
          "template (the chat template shows the tools) or hermes (the router writes them into "
          "the system prompt, for templates with no tool format)");
ABSL_FLAG(
    std::string, reasoning_parser, "auto",
    "<think> blocks to reasoning_content: auto (when the template knows <think>), think, none");
ABSL_FLAG(std::string, model_fingerprint, "",
          "refuse workers of any other model fingerprint (default: the first worker's)");
ABSL_FLAG(std::string, host, "127.0.0.1", "API listen address");
ABSL_FLAG(int, port, 0, "API port (0: any free port)");
ABSL_FLAG(int, threads, 2, "HTTP I/O threads");
ABSL_FLAG(int, dispatch_threads, 1,
          "threads that run the streams to the workers (each stream's events on one)");
ABSL_FLAG(int, max_connections, 1024, "open connections at most");
ABSL_FLAG(std::string, max_header_bytes, "16KiB", "request header size at most (431 beyond)");
ABSL_FLAG(std::string, max_body_bytes, "8MiB", "request body size at most (413 beyond)");
ABSL_FLAG(std::string, max_stream_buffer_bytes, "4MiB",
          "a stream's unsent bytes at most (a client that does not read is cut off)");
ABSL_FLAG(absl::Duration, read_timeout, absl::Seconds(30), "a request must arrive within this");
ABSL_FLAG(absl::Duration, idle_timeout, absl::Seconds(60), "keep-alive idle time at most");
ABSL_FLAG(absl::Duration, write_timeout, absl::Seconds(30), "a write stalled this long closes");
ABSL_FLAG(std::string, admin_host, "127.0.0.1", "admin HTTP listen address");
ABSL_FLAG(int, admin_port, 0, "admin HTTP port (0: any free port)");
ABSL_FLAG(int64_t, max_queued, 256,
          "requests waiting for a worker (all busy, none up, no KV room); more get 429");
ABSL_FLAG(int64_t, max_queued_tokens, 2 << 20,
          "prompt tokens of the requests waiting for a worker at most; more get 429 (0: no bound)");
ABSL_FLAG(absl::Duration, queue_timeout, absl::Seconds(30),
          "a request waits for a worker this long at most (or until its --request_timeout), "
          "then gets 503 with Retry-After");
ABSL_FLAG(int, max_retries, 2,
          "other workers tried when one fails a request before its first token");
ABSL_FLAG(int, max_migrations, 3,
          "moves of a request to another worker when the one streaming it dies, stalls or fails "
          "it (0: never)");
ABSL_FLAG(bool, token_streams, true,
          "requests' tokens come on one multiplexed stream per worker (false: on each request's "
          "own Generate call)");
ABSL_FLAG(bool, handoff_precopy, true,
          "a draining worker's hand-offs: the target is picked when the drain begins and "
          "pre-copies the KV computed so far (false: all of it moves at the drain deadline)");
ABSL_FLAG(int64_t, migration_max_tokens_per_request, 65536,
          "output token ids kept per request for migration (a longer output cannot migrate)");
ABSL_FLAG(int64_t, migration_max_tokens, 16 << 20,
          "output token ids kept for migration in all (4 bytes each)");
ABSL_FLAG(int, max_n, 16, "choices per request at most");
ABSL_FLAG(std::string, max_tools_bytes, "256KiB", "a request's tool definitions at most (JSON)");
ABSL_FLAG(int64_t, max_images_per_request, 16, "images in one request at most (400 beyond)");
ABSL_FLAG(std::string, max_image_bytes, "5MiB",
          "one image's bytes at most, decoded (400 beyond); inline as base64 it takes 4/3 of "
          "this inside --max_body_bytes");
ABSL_FLAG(int64_t, max_image_pixels, 50000000,
          "one image's width x height at most, read from its header (400 beyond: decompression "
          "bombs)");
ABSL_FLAG(int, image_fetch_threads, 4,
          "threads that fetch remote image URLs (with an image URL fetcher: --image_url_hosts)");
ABSL_FLAG(int64_t, max_queued_image_fetches, 64,
          "requests waiting for an image fetch thread at most (503 beyond)");
ABSL_FLAG(std::vector<std::string>, image_url_hosts, {},
          "remote image URLs: the hosts images may be fetched from (\"images.example.com\", "
          "\"*.cdn.example.com\"; public addresses only, no redirects, HTTPS verified); "
          "empty: remote image URLs are refused (send images inline as data: URLs)");
ABSL_FLAG(std::string, image_url_ca_file, "/etc/ssl/certs/ca-certificates.crt",
          "the CA bundle remote images' HTTPS servers are verified against");
ABSL_FLAG(absl::Duration, image_fetch_timeout, absl::Seconds(10),
          "one remote image's fetch at most (and the request's deadline)");
ABSL_FLAG(std::vector<std::string>, encoders, {},
          "ferry-encoder endpoints (host:port,...): with a vision model, images are encoded there "
          "(affinity by content hash, failover, inline bytes when none is up); empty: the workers "
          "encode them");
ABSL_FLAG(std::vector<std::string>, encoders_dns, {},
          "ferry-encoder pools by DNS (name:port,...: each name's A/AAAA records, looked up every "
          "--dns_interval), with --encoders");
ABSL_FLAG(int, encode_threads, 8, "threads that call the encoders (with --encoders)");
ABSL_FLAG(int64_t, max_queued_encodes, 256,
          "requests waiting for an encode thread at most (beyond: their images go inline)");
ABSL_FLAG(absl::Duration, encode_timeout, absl::Seconds(30),
          "one Encode call at most (and the request's deadline)");
ABSL_FLAG(absl::Duration, request_timeout, absl::Minutes(10), "a request's deadline");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(5),
          "a silent worker is down after this");
ABSL_FLAG(std::string, auth_token_file, "",
          "the workers' and the store's shared token (default: $FERRY_AUTH_TOKEN); one per line: "
          "the first is sent; re-read every --secret_poll_interval");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(30), "SIGTERM: time for running streams");
ABSL_FLAG(absl::Duration, responses_ttl, absl::Hours(1),
          "/v1/responses answers are kept this long (in this replica's memory) for GET and "
          "previous_response_id");
ABSL_FLAG(int64_t, responses_per_tenant, 1000, "stored /v1/responses answers per tenant at most");
ABSL_FLAG(std::string, responses_bytes_per_tenant, "64MiB",
          "stored /v1/responses answers per tenant at most, in bytes");

namespace {

using ferry::RouterOptions;

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  ferry::ExitOnBadOption("ferry-router", what, status);
}

bool Given(const char* name) { return ferry::FlagGiven(name); }

uint64_t Bytes(const std::string& flag, const std::string& text) {
  return ferry::ByteSizeFlagOrExit("ferry-router", flag, text);
}

RouterOptions OptionsFromFlags() {
  RouterOptions o;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    auto config = ferry::Config::LoadFile(path);
    if (!config.ok()) Die("--config", config.status());
    if (absl::Status s = ferry::ApplyRouterConfig(*config, &o); !s.ok()) Die("--config", s);
  }
#define FROM_FLAG(name, field) \
  if (Given(#name)) o.field = absl::GetFlag(FLAGS_##name)
  FROM_FLAG(model, model);
  FROM_FLAG(served_model_name, served_model_name);
  FROM_FLAG(workers, workers);
  FROM_FLAG(workers_file, workers_file);
  FROM_FLAG(workers_dns, workers_dns);
  FROM_FLAG(kvstore_dns, kvstore_dns);
  FROM_FLAG(dns_interval, dns_interval);
  FROM_FLAG(dns_servers, dns_servers);
  FROM_FLAG(kvstore_dns_linger, kvstore_dns_linger);
  FROM_FLAG(policy, policy);
  if (Given("kv_index_bytes")) {
    o.kv_index_bytes = Bytes("kv_index_bytes", absl::GetFlag(FLAGS_kv_index_bytes));
  }
  FROM_FLAG(busy_threshold, busy_threshold);
  FROM_FLAG(store_fetch_per_block, store_fetch_per_block);
  FROM_FLAG(kvstore, kvstore);
  FROM_FLAG(kvstore_deadline, kvstore_deadline);
  FROM_FLAG(log_level, log_level);
  FROM_FLAG(tool_call_parser, tool_call_parser);
  FROM_FLAG(api_keys_file, api_keys_file);
  FROM_FLAG(secret_poll_interval, secret_poll_interval);
  FROM_FLAG(slo_ttft, slo_ttft);
  FROM_FLAG(slo_itl, slo_itl);
  FROM_FLAG(allow_unauthenticated, allow_unauthenticated);
  FROM_FLAG(price_input_per_mtok, price_input_per_mtok);
  FROM_FLAG(price_cached_input_per_mtok, price_cached_input_per_mtok);
  FROM_FLAG(price_output_per_mtok, price_output_per_mtok);
  FROM_FLAG(gpus_per_worker, gpus_per_worker);
  FROM_FLAG(tool_prompt, tool_prompt);
  FROM_FLAG(reasoning_parser, reasoning_parser);
  FROM_FLAG(model_fingerprint, model_fingerprint);
  FROM_FLAG(host, http.host);
  FROM_FLAG(port, http.port);
  FROM_FLAG(threads, http.threads);
  FROM_FLAG(max_connections, http.max_connections);
  if (Given("max_header_bytes")) {
    o.http.max_header_bytes =
        static_cast<uint32_t>(Bytes("max_header_bytes", absl::GetFlag(FLAGS_max_header_bytes)));
  }
  if (Given("max_body_bytes")) {
    o.http.max_body_bytes = Bytes("max_body_bytes", absl::GetFlag(FLAGS_max_body_bytes));
  }
  if (Given("max_stream_buffer_bytes")) {
    o.http.max_stream_buffer_bytes =
        Bytes("max_stream_buffer_bytes", absl::GetFlag(FLAGS_max_stream_buffer_bytes));
  }
  FROM_FLAG(read_timeout, http.read_timeout);
  FROM_FLAG(idle_timeout, http.idle_timeout);
  FROM_FLAG(write_timeout, http.write_timeout);
  FROM_FLAG(admin_host, admin_host);
  FROM_FLAG(admin_port, admin_port);
  FROM_FLAG(max_queued, max_queued);
  FROM_FLAG(max_queued_tokens, max_queued_tokens);
  FROM_FLAG(queue_timeout, queue_timeout);
  FROM_FLAG(max_retries, max_retries);
  FROM_FLAG(max_migrations, max_migrations);
  FROM_FLAG(token_streams, token_streams);
  FROM_FLAG(handoff_precopy, handoff_precopy);
  FROM_FLAG(migration_max_tokens_per_request, migration_max_tokens_per_request);
  FROM_FLAG(migration_max_tokens, migration_max_tokens);
  FROM_FLAG(dispatch_threads, dispatch_threads);
  FROM_FLAG(max_n, max_n);
  if (Given("max_tools_bytes")) {
    o.max_tools_bytes = Bytes("max_tools_bytes", absl::GetFlag(FLAGS_max_tools_bytes));
  }
  FROM_FLAG(max_images_per_request, max_images_per_request);
  if (Given("max_image_bytes")) {
    o.max_image_bytes = Bytes("max_image_bytes", absl::GetFlag(FLAGS_max_image_bytes));
  }
  FROM_FLAG(max_image_pixels, max_image_pixels);
  FROM_FLAG(image_url_hosts, image_url_hosts);
  FROM_FLAG(image_url_ca_file, image_url_ca_file);
  FROM_FLAG(image_fetch_threads, image_fetch_threads);
  FROM_FLAG(max_queued_image_fetches, max_queued_image_fetches);
  FROM_FLAG(image_fetch_timeout, image_fetch_timeout);
  FROM_FLAG(encoders, encoders);
  FROM_FLAG(encoders_dns, encoders_dns);
  FROM_FLAG(encode_threads, encode_threads);
  FROM_FLAG(max_queued_encodes, max_queued_encodes);
  FROM_FLAG(encode_timeout, encode_timeout);
  FROM_FLAG(request_timeout, request_timeout);
  FROM_FLAG(heartbeat_timeout, heartbeat_timeout);
  FROM_FLAG(auth_token_file, auth_token_file);
  FROM_FLAG(shutdown_grace, shutdown_grace);
  FROM_FLAG(responses_ttl, responses_ttl);
  FROM_FLAG(responses_per_tenant, responses_per_tenant);
  if (Given("responses_bytes_per_tenant")) {
    o.responses_bytes_per_tenant =
        Bytes("responses_bytes_per_tenant", absl::GetFlag(FLAGS_responses_bytes_per_tenant));
  }
#undef FROM_FLAG
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  auto signal = TerminationSignal::Install();  // before any thread
  CHECK_OK(signal.status());
  ParseProgramCommandLine("ferry-router",
                          "the Ferry router: the OpenAI and Anthropic HTTP API over the workers "
                          "(admin HTTP /metrics, /workers)",
                          argc, argv);
  RouteGrpcLogs();
  const RouterOptions options = OptionsFromFlags();
  if (absl::Status s = ValidateRouterOptions(options); !s.ok()) Die("options", s);
  SetMinLogSeverity(*ParseLogSeverity(options.log_level));
  auto router = Router::Start(options);
  if (!router.ok()) Die("start", router.status());
  std::printf("http_port=%d admin_port=%d\n", (*router)->http_port(), (*router)->admin_port());
  std::fflush(stdout);
  Router* r = router->get();
  (*signal)->OnHangup([r, &options] {
    if (options.api_keys_file.empty() && options.workers_file.empty()) {
      LOG(WARNING) << "SIGHUP: nothing to reload (no --api_keys_file, no --workers_file)";
    }
    if (!options.api_keys_file.empty()) {
      if (absl::Status s = r->ReloadKeys(); !s.ok()) {
        LOG(ERROR) << "SIGHUP: the keys were not reloaded (the old ones stay): " << s;
      }
    }
    if (!options.workers_file.empty()) {
      if (absl::Status s = r->ReloadWorkers(); !s.ok()) {
        LOG(ERROR) << "SIGHUP: the workers were not reloaded (those in use stay): " << s;
      }
    }
  });
  (*signal)->Wait();
  (*signal)->OnHangup(nullptr);
  LOG(INFO) << "shutdown: no longer ready; running streams get " << options.shutdown_grace;
  (*router)->Shutdown();
  router->reset();
  return 0;
}
