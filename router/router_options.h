// Everything ferry-router is configured with (STYLE.md §17): `ferry-router` fills it from its
// flags (and the JSON --config file, whose keys are the flags' names); tests build a Router from
// it directly.

#ifndef FERRY_ROUTER_ROUTER_OPTIONS_H_
#define FERRY_ROUTER_ROUTER_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/common/config.h"
#include "router/api/image_url_fetcher.h"
#include "router/http/http_server.h"

namespace ferry {

struct RouterOptions {
  // The model whose tokenizer and chat template the router uses (a GGUF file or an HF
  // directory), and the id clients ask for ("": the file or directory name, without ".gguf").
  std::string model;
  std::string served_model_name;
  // Workers: "host:port" addresses, and/or a file of them (one per line), which the router reads
  // again on SIGHUP and POST /workers/reload (Router::ReloadWorkers); `workers` always stay.
  std::vector<std::string> workers;
  std::string workers_file;
  // Workers found by DNS ("name:port" each: a headless Service's A records are its pods), looked
  // up again every dns_interval (services/common/dns_discovery.h), with the others above.
  std::vector<std::string> workers_dns;
  std::string policy = "prefix_aware";  // round_robin | least_loaded | prefix_aware
  // prefix_aware (router/policy/prefix_aware.h): the KV index's byte cap, when a worker's queue
  // makes it busy, and the cost of reading a block from the KV store.
  uint64_t kv_index_bytes = uint64_t{256} << 20;
  absl::Duration busy_threshold = absl::Seconds(4);
  absl::Duration store_fetch_per_block = absl::Microseconds(500);
  // The KV store nodes ("host:port", as the workers name them), asked how much of each prompt
  // they hold (none: the policy counts the workers' caches only), and the probe's deadline.
  std::vector<std::string> kvstore;
  absl::Duration kvstore_deadline = absl::Milliseconds(50);
  // The KV store nodes by DNS instead ("name:port": the store's headless Service), each named by
  // its PTR record (its stable StatefulSet name), as the workers' --kvstore_dns names them.
  std::vector<std::string> kvstore_dns;
  // DNS discovery: how often names are looked up again, and the servers ("ip[:port]"; none: the
  // system's /etc/resolv.conf).
  absl::Duration dns_interval = absl::Seconds(5);
  std::vector<std::string> dns_servers;
  // How long a store node gone from the DNS stays in the set (its pod may be being replaced).
  absl::Duration kvstore_dns_linger = absl::Minutes(1);
  std::string log_level = "info";  // debug logs each routing decision with its cost terms
  // How tool calls are read from the model's text: "auto" (from the chat template's markers),
  // hermes | llama3_json | mistral | deepseek, or "none" (tools refused).
  std::string tool_call_parser = "auto";
  // "template": the chat template shows the model its tools; "hermes": the router writes them into
  // the system prompt in Hermes's words and parses Hermes calls (for templates with no tool
  // format, such as SmolLM2's).
  std::string tool_prompt = "template";
  // <think> blocks to reasoning_content: "auto" (when the template knows <think>), think, none.
  std::string reasoning_parser = "auto";
  // The one model fingerprint (32 hex digits) the pool takes; "": the first worker accepted's.
  std::string model_fingerprint;

  HttpServerOptions http;  // the API port and its limits
  std::string admin_host = "127.0.0.1";
  int admin_port = 0;

  // The queue of requests no worker can take now (every one busy, none up, no KV room): at most
  // max_queued requests and max_queued_tokens prompt tokens (more get 429), each waiting at most
  // queue_timeout (or until its request_timeout) before a 503.
  int64_t max_queued = 256;
  int64_t max_queued_tokens = 2 << 20;
  absl::Duration queue_timeout = absl::Seconds(30);
  int max_retries = 2;     // other workers tried before a first token
  int max_migrations = 3;  // moves of a request mid-stream (dispatcher.h "Migration")
  // Requests' tokens come on one token stream per worker (docs/design/token-streams.md); false:
  // on each request's own Generate call.
  bool token_streams = true;
  // When a draining worker announces a hand-off (GenerateEvent.handoff_planned), pick its target
  // then and have it pre-copy the KV (PrefetchKv); false: the hand-off moves all of it at the
  // drain deadline.
  bool handoff_precopy = true;
  int64_t migration_max_tokens_per_request = 65536;  // output token ids kept per request
  int64_t migration_max_tokens = 16 << 20;           // ... and in all
  int dispatch_threads = 1;  // threads that run the worker streams (CompletionThreads)
  int32_t max_n = 16;
  uint64_t max_tools_bytes = 256 << 10;  // a request's tool definitions (their JSON) at most
  // Images (router/api/image_part.h): per request at most max_images_per_request, each at most
  // max_image_bytes once decoded (inline, base64 takes 4/3 of that inside max_body_bytes: the
  // defaults, 5 MiB and 8 MiB, let one image of the largest size through) and max_image_pixels
  // by its header (a decompression bomb is refused before any worker sees it).
  int64_t max_images_per_request = 16;
  uint64_t max_image_bytes = uint64_t{5} << 20;
  int64_t max_image_pixels = 50'000'000;
  // Remote image URLs, off by default: the hosts they may come from (router/fetch/
  // host_allowlist.h: "images.example.com", "*.cdn.example.com"), fetched by the router's
  // RemoteImageFetcher (router/fetch/remote_image_fetcher.h: public addresses only, no
  // redirects, HTTPS verified against image_url_ca_file, at most max_image_bytes, dns_servers
  // when given); empty: none. docs/serving/remote-images.md.
  std::vector<std::string> image_url_hosts;
  std::string image_url_ca_file = "/etc/ssl/certs/ca-certificates.crt";
  // The fetcher remote image URLs go through: set by Router::Start from image_url_hosts, or given
  // by a test (which then wins); null: a remote URL is a 400. The fetches block, so they run on
  // image_fetch_threads threads
  // (router/image_fetch_executor.h), at most max_queued_image_fetches requests waiting (503
  // beyond), each fetch at most image_fetch_timeout (and the request's deadline).
  std::shared_ptr<ImageUrlFetcher> image_url_fetcher;
  int image_fetch_threads = 4;
  int64_t max_queued_image_fetches = 64;
  absl::Duration image_fetch_timeout = absl::Seconds(10);
  // Encoders (ferry-encoder, "host:port" each; docs/serving/encoder.md "The router's side"): with
  // a vision model, each image of a request is encoded on one (router/encode/encoder_pool.h) and
  // reaches the workers as a handle; none up, or all failing: the bytes go inline (the worker
  // encodes them). The Encode calls block, so they run on encode_threads threads (at most
  // max_queued_encodes requests waiting; beyond: the images go inline), each call at most
  // encode_timeout (and the request's deadline). Empty: images always go inline.
  std::vector<std::string> encoders;
  // Encoders found by DNS ("name:port" each, as workers_dns), with `encoders`.
  std::vector<std::string> encoders_dns;
  int encode_threads = 8;
  int64_t max_queued_encodes = 256;
  absl::Duration encode_timeout = absl::Seconds(30);
  absl::Duration request_timeout = absl::Minutes(10);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  std::string auth_token_file;  // the workers' shared token ("": FERRY_AUTH_TOKEN, if set)
  // Clients' API keys and their tenants (router/auth/api_keys.h), reloaded on SIGHUP. Without a
  // key file the API is open, and the router binds only a loopback address unless
  // allow_unauthenticated.
  std::string api_keys_file;
  // auth_token_file and api_keys_file are re-read this often (PolledFile: Kubernetes Secrets
  // change without a signal); a new valid content applies at once (zero: never re-read).
  absl::Duration secret_poll_interval = absl::Seconds(10);
  // The service-level objectives ferry_router_slo_requests_total counts requests against
  // (router/slo.h): the time to the first token, and the mean time between output tokens.
  absl::Duration slo_ttft = absl::Seconds(2);
  absl::Duration slo_itl = absl::Milliseconds(200);
  bool allow_unauthenticated = false;
  // Billing (router/billing.h): dollars per million tokens of each class, GPUs per worker.
  double price_input_per_mtok = 0;
  double price_cached_input_per_mtok = 0;
  double price_output_per_mtok = 0;
  double gpus_per_worker = 1;
  absl::Duration shutdown_grace = absl::Seconds(30);
  // /v1/responses answers kept (in this replica's memory) for GET and previous_response_id.
  absl::Duration responses_ttl = absl::Hours(1);
  int64_t responses_per_tenant = 1000;
  uint64_t responses_bytes_per_tenant = 64 << 20;
};

absl::Status ApplyRouterConfig(const Config& config, RouterOptions* options);
absl::Status ValidateRouterOptions(const RouterOptions& options);

}  // namespace ferry

#endif  // FERRY_ROUTER_ROUTER_OPTIONS_H_
