#include "router/router_options.h"

#include "absl/strings/str_cat.h"
#include "engine/common/hash128.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "router/api/tool_call_parser.h"

namespace ferry {

absl::Status ApplyRouterConfig(const Config& c, RouterOptions* o) {
  RETURN_IF_ERROR(c.Read("model", &o->model));
  RETURN_IF_ERROR(c.Read("served_model_name", &o->served_model_name));
  RETURN_IF_ERROR(c.Read("workers", &o->workers));
  RETURN_IF_ERROR(c.Read("workers_file", &o->workers_file));
  RETURN_IF_ERROR(c.Read("workers_dns", &o->workers_dns));
  RETURN_IF_ERROR(c.Read("policy", &o->policy));
  RETURN_IF_ERROR(c.ReadByteSize("kv_index_bytes", &o->kv_index_bytes));
  RETURN_IF_ERROR(c.ReadDuration("busy_threshold", &o->busy_threshold));
  RETURN_IF_ERROR(c.ReadDuration("store_fetch_per_block", &o->store_fetch_per_block));
  RETURN_IF_ERROR(c.Read("kvstore", &o->kvstore));
  RETURN_IF_ERROR(c.ReadDuration("kvstore_deadline", &o->kvstore_deadline));
  RETURN_IF_ERROR(c.Read("kvstore_dns", &o->kvstore_dns));
  RETURN_IF_ERROR(c.ReadDuration("dns_interval", &o->dns_interval));
  RETURN_IF_ERROR(c.ReadDuration("kvstore_dns_linger", &o->kvstore_dns_linger));
  RETURN_IF_ERROR(c.Read("dns_servers", &o->dns_servers));
  RETURN_IF_ERROR(c.Read("log_level", &o->log_level));
  RETURN_IF_ERROR(c.Read("tool_call_parser", &o->tool_call_parser));
  RETURN_IF_ERROR(c.Read("tool_prompt", &o->tool_prompt));
  RETURN_IF_ERROR(c.Read("reasoning_parser", &o->reasoning_parser));
  RETURN_IF_ERROR(c.Read("model_fingerprint", &o->model_fingerprint));
  RETURN_IF_ERROR(c.Read("host", &o->http.host));
  int32_t i = o->http.port;
  RETURN_IF_ERROR(c.Read("port", &i));
  o->http.port = i;
  i = o->http.threads;
  RETURN_IF_ERROR(c.Read("threads", &i));
  o->http.threads = i;
  i = o->http.max_connections;
  RETURN_IF_ERROR(c.Read("max_connections", &i));
  o->http.max_connections = i;
  uint64_t bytes = o->http.max_header_bytes;
  RETURN_IF_ERROR(c.ReadByteSize("max_header_bytes", &bytes));
  o->http.max_header_bytes = static_cast<uint32_t>(bytes);
  RETURN_IF_ERROR(c.ReadByteSize("max_body_bytes", &o->http.max_body_bytes));
  bytes = o->http.max_stream_buffer_bytes;
  RETURN_IF_ERROR(c.ReadByteSize("max_stream_buffer_bytes", &bytes));
  o->http.max_stream_buffer_bytes = bytes;
  RETURN_IF_ERROR(c.ReadDuration("read_timeout", &o->http.read_timeout));
  RETURN_IF_ERROR(c.ReadDuration("idle_timeout", &o->http.idle_timeout));
  RETURN_IF_ERROR(c.ReadDuration("write_timeout", &o->http.write_timeout));
  RETURN_IF_ERROR(c.Read("admin_host", &o->admin_host));
  i = o->admin_port;
  RETURN_IF_ERROR(c.Read("admin_port", &i));
  o->admin_port = i;
  RETURN_IF_ERROR(c.Read("max_queued", &o->max_queued));
  RETURN_IF_ERROR(c.Read("max_queued_tokens", &o->max_queued_tokens));
  RETURN_IF_ERROR(c.ReadDuration("queue_timeout", &o->queue_timeout));
  i = o->max_retries;
  RETURN_IF_ERROR(c.Read("max_retries", &i));
  o->max_retries = i;
  i = o->max_migrations;
  RETURN_IF_ERROR(c.Read("max_migrations", &i));
  o->max_migrations = i;
  RETURN_IF_ERROR(c.Read("token_streams", &o->token_streams));
  RETURN_IF_ERROR(c.Read("handoff_precopy", &o->handoff_precopy));
  RETURN_IF_ERROR(c.Read("migration_max_tokens_per_request", &o->migration_max_tokens_per_request));
  RETURN_IF_ERROR(c.Read("migration_max_tokens", &o->migration_max_tokens));
  i = o->dispatch_threads;
  RETURN_IF_ERROR(c.Read("dispatch_threads", &i));
  o->dispatch_threads = i;
  RETURN_IF_ERROR(c.Read("max_n", &o->max_n));
  RETURN_IF_ERROR(c.ReadByteSize("max_tools_bytes", &o->max_tools_bytes));
  RETURN_IF_ERROR(c.Read("max_images_per_request", &o->max_images_per_request));
  RETURN_IF_ERROR(c.ReadByteSize("max_image_bytes", &o->max_image_bytes));
  RETURN_IF_ERROR(c.Read("max_image_pixels", &o->max_image_pixels));
  i = o->image_fetch_threads;
  RETURN_IF_ERROR(c.Read("image_fetch_threads", &i));
  o->image_fetch_threads = i;
  RETURN_IF_ERROR(c.Read("max_queued_image_fetches", &o->max_queued_image_fetches));
  RETURN_IF_ERROR(c.Read("image_url_hosts", &o->image_url_hosts));
  RETURN_IF_ERROR(c.Read("image_url_ca_file", &o->image_url_ca_file));
  RETURN_IF_ERROR(c.ReadDuration("image_fetch_timeout", &o->image_fetch_timeout));
  RETURN_IF_ERROR(c.Read("encoders", &o->encoders));
  RETURN_IF_ERROR(c.Read("encoders_dns", &o->encoders_dns));
  i = o->encode_threads;
  RETURN_IF_ERROR(c.Read("encode_threads", &i));
  o->encode_threads = i;
  RETURN_IF_ERROR(c.Read("max_queued_encodes", &o->max_queued_encodes));
  RETURN_IF_ERROR(c.ReadDuration("encode_timeout", &o->encode_timeout));
  RETURN_IF_ERROR(c.ReadDuration("request_timeout", &o->request_timeout));
  RETURN_IF_ERROR(c.ReadDuration("heartbeat_timeout", &o->heartbeat_timeout));
  RETURN_IF_ERROR(c.Read("auth_token_file", &o->auth_token_file));
  RETURN_IF_ERROR(c.Read("api_keys_file", &o->api_keys_file));
  RETURN_IF_ERROR(c.ReadDuration("secret_poll_interval", &o->secret_poll_interval));
  RETURN_IF_ERROR(c.ReadDuration("slo_ttft", &o->slo_ttft));
  RETURN_IF_ERROR(c.ReadDuration("slo_itl", &o->slo_itl));
  RETURN_IF_ERROR(c.Read("allow_unauthenticated", &o->allow_unauthenticated));
  RETURN_IF_ERROR(c.Read("price_input_per_mtok", &o->price_input_per_mtok));
  RETURN_IF_ERROR(c.Read("price_cached_input_per_mtok", &o->price_cached_input_per_mtok));
  RETURN_IF_ERROR(c.Read("price_output_per_mtok", &o->price_output_per_mtok));
  RETURN_IF_ERROR(c.Read("gpus_per_worker", &o->gpus_per_worker));
  RETURN_IF_ERROR(c.ReadDuration("shutdown_grace", &o->shutdown_grace));
  RETURN_IF_ERROR(c.ReadDuration("responses_ttl", &o->responses_ttl));
  RETURN_IF_ERROR(c.Read("responses_per_tenant", &o->responses_per_tenant));
  RETURN_IF_ERROR(c.ReadByteSize("responses_bytes_per_tenant", &o->responses_bytes_per_tenant));
  return c.CheckAllKeysUsed();
}

absl::Status ValidateRouterOptions(const RouterOptions& o) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (o.workers.empty() && o.workers_file.empty() && o.workers_dns.empty()) {
    return bad("--workers, --workers_file or --workers_dns: the router needs workers");
  }
  if (o.policy != "round_robin" && o.policy != "least_loaded" && o.policy != "prefix_aware") {
    return bad(absl::StrCat("--policy must be round_robin, least_loaded or prefix_aware, not '",
                            o.policy, "'"));
  }
  if (o.kv_index_bytes < (uint64_t{1} << 20) || o.busy_threshold <= absl::ZeroDuration() ||
      o.store_fetch_per_block < absl::ZeroDuration() ||
      o.kvstore_deadline <= absl::ZeroDuration()) {
    return bad(
        "--kv_index_bytes must be at least 1MiB, --busy_threshold and --kvstore_deadline "
        "positive, --store_fetch_per_block not negative");
  }
  if (o.dns_interval <= absl::ZeroDuration()) return bad("--dns_interval must be positive");
  if (o.kvstore_dns_linger < absl::ZeroDuration()) return bad("--kvstore_dns_linger must be >= 0");
  if (!o.kvstore.empty() && !o.kvstore_dns.empty()) {
    return bad("--kvstore and --kvstore_dns: give one of them");
  }
  if (absl::Status s = ParseLogSeverity(o.log_level).status(); !s.ok()) {
    return bad(absl::StrCat("--log_level: ", s.message()));
  }
  if (o.tool_call_parser != "auto" && o.tool_call_parser != "none" &&
      !ToolCallFormatFromName(o.tool_call_parser).has_value()) {
    return bad(
        absl::StrCat("--tool_call_parser must be auto, hermes, llama3_json, mistral, "
                     "deepseek or none, not '",
                     o.tool_call_parser, "'"));
  }
  if (o.api_keys_file.empty() && !o.allow_unauthenticated && o.http.host != "127.0.0.1" &&
      o.http.host != "::1" && o.http.host != "localhost") {
    return bad(absl::StrCat("--host ", o.http.host,
                            ": without --api_keys_file the API is open, so the router binds only "
                            "loopback; give keys, or --allow_unauthenticated"));
  }
  if (o.secret_poll_interval < absl::ZeroDuration()) {
    return bad("--secret_poll_interval must be >= 0");
  }
  if (o.slo_ttft <= absl::ZeroDuration() || o.slo_itl <= absl::ZeroDuration()) {
    return bad("--slo_ttft and --slo_itl must be positive");
  }
  if (!(o.price_input_per_mtok >= 0) || !(o.price_cached_input_per_mtok >= 0) ||
      !(o.price_output_per_mtok >= 0) || !(o.gpus_per_worker > 0)) {
    return bad("prices must be >= 0 and --gpus_per_worker > 0");
  }
  if (o.tool_prompt != "template" && o.tool_prompt != "hermes") {
    return bad(absl::StrCat("--tool_prompt must be template or hermes, not '", o.tool_prompt, "'"));
  }
  if (o.tool_prompt == "hermes" && o.tool_call_parser != "auto" && o.tool_call_parser != "hermes") {
    return bad("--tool_prompt=hermes reads Hermes calls: leave --tool_call_parser at auto");
  }
  if (o.reasoning_parser != "auto" && o.reasoning_parser != "think" &&
      o.reasoning_parser != "none") {
    return bad(absl::StrCat("--reasoning_parser must be auto, think or none, not '",
                            o.reasoning_parser, "'"));
  }
  if (!o.model_fingerprint.empty()) {
    if (absl::Status s = Hash128::FromHex(o.model_fingerprint).status(); !s.ok()) {
      return bad(absl::StrCat("--model_fingerprint: ", s.message()));
    }
  }
  if (o.http.port < 0 || o.http.port > 65535 || o.admin_port < 0 || o.admin_port > 65535) {
    return bad("--port and --admin_port must be in [0, 65535]");
  }
  if (o.http.threads < 1 || o.http.max_connections < 1 || o.dispatch_threads < 1 ||
      o.dispatch_threads > 64) {
    return bad("--threads and --max_connections must be positive, --dispatch_threads in [1, 64]");
  }
  if (o.max_images_per_request < 0 || o.max_images_per_request > 1024) {
    return bad("--max_images_per_request must be in [0, 1024]");
  }
  if (o.max_image_bytes < 1024 || o.max_image_bytes > (uint64_t{1} << 30)) {
    return bad("--max_image_bytes must be in [1KiB, 1GiB]");
  }
  if (o.max_image_pixels < 1 || o.max_image_pixels > 1'000'000'000) {
    return bad("--max_image_pixels must be in [1, 1000000000]");
  }
  if (o.image_fetch_threads < 1 || o.image_fetch_threads > 256 || o.max_queued_image_fetches < 0 ||
      o.image_fetch_timeout <= absl::ZeroDuration()) {
    return bad(
        "--image_fetch_threads must be in [1, 256], --max_queued_image_fetches at least 0 "
        "and --image_fetch_timeout positive");
  }
  if (o.encoders.size() > 256 || o.encode_threads < 1 || o.encode_threads > 256 ||
      o.max_queued_encodes < 0 || o.encode_timeout <= absl::ZeroDuration()) {
    return bad(
        "--encoders takes at most 256 encoders, --encode_threads must be in [1, 256], "
        "--max_queued_encodes at least 0 and --encode_timeout positive");
  }
  if (o.http.max_header_bytes < 1024 || o.http.max_body_bytes < 1024) {
    return bad("--max_header_bytes and --max_body_bytes must be at least 1KiB");
  }
  if (o.max_queued < 0 || o.max_queued_tokens < 0 || o.max_retries < 0 || o.max_n < 1) {
    return bad(
        "--max_queued, --max_queued_tokens and --max_retries must be >= 0, --max_n positive");
  }
  if (o.max_migrations < 0 || o.migration_max_tokens_per_request < 0 ||
      o.migration_max_tokens < 0) {
    return bad("--max_migrations and --migration_max_tokens[_per_request] must be >= 0");
  }
  if (o.responses_per_tenant < 0) return bad("--responses_per_tenant must be >= 0");
  for (absl::Duration d :
       {o.http.read_timeout, o.http.idle_timeout, o.http.write_timeout, o.request_timeout,
        o.heartbeat_timeout, o.responses_ttl, o.queue_timeout}) {
    if (d <= absl::ZeroDuration()) return bad("timeouts must be positive");
  }
  return absl::OkStatus();
}

}  // namespace ferry
