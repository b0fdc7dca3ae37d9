#include "services/worker/worker_options.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "services/common/advertise_address.h"

namespace ferry {
namespace {

constexpr char kDefaultModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";

absl::Status ReadSize(const Config& c, const char* key, int64_t* out) {
  if (!c.Has(key)) return absl::OkStatus();
  uint64_t v = 0;
  RETURN_IF_ERROR(c.ReadByteSize(key, &v));
  *out = static_cast<int64_t>(v);
  return absl::OkStatus();
}

absl::Status ReadDuration(const Config& c, const char* key, absl::Duration* out) {
  return c.ReadDuration(key, out);
}

absl::Status ReadSizeT(const Config& c, const char* key, size_t* out) {
  uint64_t v = *out;
  RETURN_IF_ERROR(c.Read(key, &v));
  *out = static_cast<size_t>(v);
  return absl::OkStatus();
}

absl::Status ReadInt(const Config& c, const char* key, int* out) {
  int32_t v = *out;
  RETURN_IF_ERROR(c.Read(key, &v));
  *out = v;
  return absl::OkStatus();
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

absl::Status ApplyWorkerConfig(const Config& c, WorkerOptions* o) {
  RETURN_IF_ERROR(c.Read("engine", &o->engine));
  RETURN_IF_ERROR(c.Read("model", &o->model));
  RETURN_IF_ERROR(c.Read("model_name", &o->model_name));
  RETURN_IF_ERROR(c.Read("weights", &o->weights));
  RETURN_IF_ERROR(c.Read("kv_dtype", &o->kv_dtype));
  RETURN_IF_ERROR(ReadInt(c, "threads", &o->threads));
  RETURN_IF_ERROR(c.Read("backend", &o->backend));
  RETURN_IF_ERROR(ReadInt(c, "cuda_device", &o->cuda_device));
  RETURN_IF_ERROR(ReadSize(c, "gpu_memory_bytes", &o->gpu_memory_bytes));
  RETURN_IF_ERROR(c.Read("deterministic", &o->deterministic));
  RETURN_IF_ERROR(c.Read("cuda_graphs", &o->cuda_graphs));
  RETURN_IF_ERROR(ReadSize(c, "kv_pool_bytes", &o->kv_pool_bytes));
  RETURN_IF_ERROR(ReadSize(c, "window_pool_bytes", &o->window_pool_bytes));
  RETURN_IF_ERROR(c.Read("kv_staging", &o->kv_staging));
  RETURN_IF_ERROR(ReadSize(c, "kv_staging_bytes", &o->kv_staging_bytes));
  RETURN_IF_ERROR(ReadSize(c, "prefix_cache_bytes", &o->prefix_cache_bytes));
  RETURN_IF_ERROR(ReadSize(c, "window_cache_bytes", &o->window_cache_bytes));
  RETURN_IF_ERROR(ReadDuration(c, "window_cache_ttl", &o->window_cache_ttl));
  RETURN_IF_ERROR(c.Read("swa_replay", &o->swa_replay));
  RETURN_IF_ERROR(c.Read("swa_replay_tokens", &o->swa_replay_tokens));
  RETURN_IF_ERROR(c.Read("kvstore", &o->kvstore));
  RETURN_IF_ERROR(c.Read("kvstore_dns", &o->kvstore_dns));
  RETURN_IF_ERROR(ReadDuration(c, "dns_interval", &o->dns_interval));
  RETURN_IF_ERROR(ReadDuration(c, "kvstore_dns_linger", &o->kvstore_dns_linger));
  RETURN_IF_ERROR(c.Read("dns_servers", &o->dns_servers));
  RETURN_IF_ERROR(ReadInt(c, "kvstore_replication", &o->kvstore_replication));
  RETURN_IF_ERROR(ReadDuration(c, "kvstore_deadline", &o->kvstore_deadline));
  RETURN_IF_ERROR(c.Read("kvstore_read", &o->kvstore_read));
  RETURN_IF_ERROR(c.Read("kvstore_write", &o->kvstore_write));
  RETURN_IF_ERROR(ReadInt(c, "kvstore_read_threads", &o->kvstore_read_threads));
  RETURN_IF_ERROR(ReadInt(c, "kvstore_read_streams", &o->kvstore_read_streams));
  RETURN_IF_ERROR(c.Read("kvstore_read_max_blocks", &o->kvstore_read_max_blocks));
  RETURN_IF_ERROR(ReadSize(c, "kvstore_write_queue_bytes", &o->kvstore_write_queue_bytes));
  RETURN_IF_ERROR(c.Read("block_tokens", &o->block_tokens));
  RETURN_IF_ERROR(c.Read("prefill_chunk", &o->prefill_chunk));
  RETURN_IF_ERROR(c.Read("max_batch_tokens", &o->max_batch_tokens));
  RETURN_IF_ERROR(c.Read("max_running", &o->max_running));
  RETURN_IF_ERROR(c.Read("max_queued", &o->max_queued));
  RETURN_IF_ERROR(c.Read("max_n", &o->max_n));
  RETURN_IF_ERROR(c.Read("max_queued_image_requests", &o->max_queued_image_requests));
  RETURN_IF_ERROR(c.Read("null_prefill_tokens_per_second", &o->null_prefill_tokens_per_second));
  RETURN_IF_ERROR(c.Read("null_token_seconds", &o->null_token_seconds));
  RETURN_IF_ERROR(c.Read("null_step_overhead_seconds", &o->null_step_overhead_seconds));
  RETURN_IF_ERROR(c.Read("null_script", &o->null_script));
  RETURN_IF_ERROR(c.Read("sim_calibration", &o->sim_calibration));
  RETURN_IF_ERROR(c.Read("sim_speed", &o->sim_speed));
  RETURN_IF_ERROR(c.Read("role", &o->role));
  RETURN_IF_ERROR(c.Read("transport", &o->transport));
  RETURN_IF_ERROR(c.Read("ucx_tls", &o->ucx_tls));
  RETURN_IF_ERROR(c.Read("transport_address", &o->transport_address));
  RETURN_IF_ERROR(ReadDuration(c, "reservation_timeout", &o->reservation_timeout));
  RETURN_IF_ERROR(ReadDuration(c, "reservation_quarantine", &o->reservation_quarantine));
  RETURN_IF_ERROR(ReadDuration(c, "handoff_ttl", &o->handoff_ttl));
  RETURN_IF_ERROR(c.Read("stream_kv", &o->stream_kv));
  RETURN_IF_ERROR(c.Read("push_hold_file", &o->push_hold_file));
  RETURN_IF_ERROR(c.Read("image_hold_file", &o->image_hold_file));
  RETURN_IF_ERROR(c.Read("address", &o->address));
  RETURN_IF_ERROR(c.Read("admin_host", &o->admin_host));
  RETURN_IF_ERROR(ReadInt(c, "admin_port", &o->admin_port));
  RETURN_IF_ERROR(c.Read("auth_token_file", &o->auth_token_file));
  RETURN_IF_ERROR(ReadDuration(c, "secret_poll_interval", &o->secret_poll_interval));
  RETURN_IF_ERROR(c.Read("advertise_address", &o->advertise_address));
  RETURN_IF_ERROR(c.Read("worker_id", &o->worker_id));
  RETURN_IF_ERROR(ReadDuration(c, "watch_interval", &o->watch_interval));
  RETURN_IF_ERROR(ReadDuration(c, "watch_heartbeat", &o->watch_heartbeat));
  RETURN_IF_ERROR(ReadSizeT(c, "watch_journal_events", &o->watch_journal_events));
  RETURN_IF_ERROR(ReadSizeT(c, "watch_max_hashes_per_message", &o->watch_max_hashes_per_message));
  RETURN_IF_ERROR(ReadSizeT(c, "max_token_streams", &o->max_token_streams));
  RETURN_IF_ERROR(ReadDuration(c, "load_window", &o->load_window));
  RETURN_IF_ERROR(ReadDuration(c, "drain_grace", &o->drain_grace));
  RETURN_IF_ERROR(ReadDuration(c, "rpc_grace", &o->rpc_grace));
  RETURN_IF_ERROR(ReadDuration(c, "handoff_wait", &o->handoff_wait));
  RETURN_IF_ERROR(ReadDuration(c, "image_fetch_timeout", &o->image_fetch_timeout));
  RETURN_IF_ERROR(ReadSize(c, "grammar_cache_bytes", &o->grammar_cache_bytes));
  RETURN_IF_ERROR(ReadSize(c, "grammar_max_bytes", &o->grammar_max_bytes));
  RETURN_IF_ERROR(c.Read("grammar_max_rules", &o->grammar_max_rules));
  RETURN_IF_ERROR(c.Read("grammar_max_elements", &o->grammar_max_elements));
  RETURN_IF_ERROR(c.Read("grammar_max_repetition", &o->grammar_max_repetition));
  RETURN_IF_ERROR(c.Read("grammar_max_nesting", &o->grammar_max_nesting));
  RETURN_IF_ERROR(ReadDuration(c, "test_step_delay", &o->test_step_delay));
  return c.CheckAllKeysUsed();
}

absl::Status ValidateWorkerOptions(const WorkerOptions& o) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (o.engine != "real" && o.engine != "null" && o.engine != "sim") {
    return bad(absl::StrCat("--engine must be real, null or sim, not '", o.engine, "'"));
  }
  if (o.backend != "cpu" && o.backend != "cuda") {
    return bad(absl::StrCat("--backend must be cpu or cuda, not '", o.backend, "'"));
  }
  if (o.backend == "cuda") {
    if (o.engine != "real") return bad("--backend=cuda computes a real model: --engine=real");
    if (o.cuda_device < 0) return bad("--cuda_device must be >= 0");
  }
  if (o.gpu_memory_bytes < 0) return bad("--gpu_memory_bytes must be >= 0");
  if (o.backend == "cpu" && (o.cuda_device != 0 || o.gpu_memory_bytes != 0)) {
    return bad("--cuda_device and --gpu_memory_bytes are for --backend=cuda");
  }
  if (o.engine == "sim" && o.sim_calibration.empty()) {
    return bad(
        "--engine=sim needs --sim_calibration FILE: the timing model's coefficients (a JSON "
        "file; docs/serving/workers.md, \"The simulated engine\")");
  }
  if (o.engine != "sim" && !o.sim_calibration.empty()) {
    return bad("--sim_calibration is for --engine=sim");
  }
  if (!(o.sim_speed > 0) || !std::isfinite(o.sim_speed)) {
    return bad("--sim_speed must be a positive number (1: the calibrated speed)");
  }
  if (o.weights != "f32" && o.weights != "bf16" && o.weights != "native") {
    return bad(absl::StrCat("--weights must be f32, bf16 or native, not '", o.weights, "'"));
  }
  if (o.kv_dtype != "f32" && o.kv_dtype != "bf16") {
    return bad(absl::StrCat("--kv_dtype must be f32 or bf16, not '", o.kv_dtype, "'"));
  }
  if (o.role != "aggregated" && o.role != "prefill" && o.role != "decode") {
    return bad(absl::StrCat("--role must be aggregated, prefill or decode, not '", o.role, "'"));
  }
  if (o.transport != "ucx" && o.transport != "grpc") {
    return bad(absl::StrCat("--transport must be ucx or grpc, not '", o.transport, "'"));
  }
  if (o.reservation_timeout <= absl::ZeroDuration() ||
      o.reservation_quarantine < absl::ZeroDuration()) {
    return bad("--reservation_timeout must be positive and --reservation_quarantine >= 0");
  }
  if (o.handoff_ttl <= o.reservation_timeout) {
    return bad(
        "--handoff_ttl must be longer than --reservation_timeout (a push may read the "
        "blocks until its deadline)");
  }
  if (o.threads < 0) return bad("--threads must be >= 0");
  if (o.kv_pool_bytes <= 0) return bad("--kv_pool_bytes must be positive");
  if (o.kv_staging != "auto" && o.kv_staging != "always") {
    return bad(absl::StrCat("--kv_staging must be auto or always, not '", o.kv_staging, "'"));
  }
  if (o.kv_staging_bytes < 0) return bad("--kv_staging_bytes must be >= 0");
  if (o.window_pool_bytes < 0 || o.window_cache_bytes < 0 || o.prefix_cache_bytes < -1) {
    return bad("--window_pool_bytes, --window_cache_bytes and --prefix_cache_bytes must be >= 0");
  }
  if (o.block_tokens < 1 || o.block_tokens > 4096)
    return bad("--block_tokens must be in [1, 4096]");
  if (o.prefill_chunk < 1 || o.max_batch_tokens < 1 || o.max_running < 1 || o.max_queued < 1 ||
      o.max_n < 1 || o.max_queued_image_requests < 1) {
    return bad(
        "--prefill_chunk, --max_batch_tokens, --max_running, --max_queued, --max_n, "
        "--max_queued_image_requests must be positive");
  }
  if (!(o.null_prefill_tokens_per_second >= 0) || !(o.null_token_seconds >= 0) ||
      !(o.null_step_overhead_seconds >= 0)) {
    return bad("the null engine's timings must be >= 0");
  }
  if (!o.null_script.empty() && o.engine == "real") {
    return bad("--null_script is for --engine=null (or sim)");
  }
  if (o.swa_replay != "exact" && o.swa_replay != "bounded") {
    return bad(absl::StrCat("--swa_replay must be exact or bounded, not '", o.swa_replay, "'"));
  }
  if (o.swa_replay_tokens < 1) return bad("--swa_replay_tokens must be positive");
  if (o.window_cache_ttl < absl::ZeroDuration()) {
    return bad("--window_cache_ttl must be >= 0 (0: no expiry)");
  }
  if (!o.kvstore.empty() && !o.kvstore_dns.empty()) {
    return bad("--kvstore and --kvstore_dns: give one of them");
  }
  if (o.dns_interval <= absl::ZeroDuration()) return bad("--dns_interval must be positive");
  if (o.kvstore_dns_linger < absl::ZeroDuration()) return bad("--kvstore_dns_linger must be >= 0");
  if (o.kvstore_replication < 1 || o.kvstore_deadline <= absl::ZeroDuration() ||
      o.kvstore_read_threads < 1 || o.kvstore_read_threads > 64 || o.kvstore_read_streams < 1 ||
      o.kvstore_read_streams > 16 || o.kvstore_read_max_blocks < 0 ||
      o.kvstore_write_queue_bytes < 0) {
    return bad(
        "--kvstore_replication and --kvstore_deadline must be positive, --kvstore_read_threads "
        "in [1, 64], --kvstore_read_streams in [1, 16], --kvstore_read_max_blocks and "
        "--kvstore_write_queue_bytes >= 0");
  }
  if (o.admin_port < 0 || o.admin_port > 65535) return bad("--admin_port must be in [0, 65535]");
  if (o.watch_interval <= absl::ZeroDuration() || o.watch_heartbeat < o.watch_interval) {
    return bad("--watch_interval must be positive and --watch_heartbeat at least as long");
  }
  if (o.watch_journal_events < 1 || o.watch_max_hashes_per_message < 1) {
    return bad("--watch_journal_events and --watch_max_hashes_per_message must be positive");
  }
  if (o.load_window <= absl::ZeroDuration()) return bad("--load_window must be positive");
  if (o.max_token_streams < 1) return bad("--max_token_streams must be positive");
  if (o.secret_poll_interval < absl::ZeroDuration()) {
    return bad("--secret_poll_interval must be >= 0");
  }
  if (!o.advertise_address.empty()) {
    RETURN_IF_ERROR(ValidateAdvertiseHost("--advertise_address", o.advertise_address));
  }
  RETURN_IF_ERROR(CheckAdvertisable("--address", o.address, o.advertise_address));
  if (o.transport == "grpc") {
    RETURN_IF_ERROR(
        CheckAdvertisable("--transport_address", o.transport_address, o.advertise_address));
  }
  if (o.drain_grace < absl::ZeroDuration() || o.rpc_grace < absl::ZeroDuration() ||
      o.handoff_wait < absl::ZeroDuration()) {
    return bad("--drain_grace, --rpc_grace and --handoff_wait must be >= 0");
  }
  if (o.grammar_cache_bytes < 0 || o.grammar_max_bytes < 1 || o.grammar_max_rules < 1 ||
      o.grammar_max_elements < 1 || o.grammar_max_repetition < 1 || o.grammar_max_nesting < 1) {
    return bad(
        "--grammar_cache_bytes must be >= 0 and --grammar_max_bytes, --grammar_max_rules, "
        "--grammar_max_elements, --grammar_max_repetition, --grammar_max_nesting positive");
  }
  if (o.image_fetch_timeout <= absl::ZeroDuration()) {
    return bad("--image_fetch_timeout must be > 0");
  }
  return absl::OkStatus();
}

std::string DefaultModelPath() {
  if (std::string v = Env("FERRY_MODEL_GGUF"); !v.empty()) return v;
  std::string dir = Env("FERRY_MODELS_DIR");
  if (dir.empty()) {
    std::string cache = Env("FERRY_CACHE");
    if (cache.empty()) {
      if (access("/var/cache", W_OK) == 0 || access("/var/cache/ferry", W_OK) == 0) {
        cache = "/var/cache/ferry";
      } else {
        const std::string xdg = Env("XDG_CACHE_HOME");
        cache = (xdg.empty() ? Env("HOME") + "/.cache" : xdg) + "/ferry";
      }
    }
    dir = cache + "/models";
  }
  return absl::StrCat(dir, "/", kDefaultModelFile);
}

}  // namespace ferry
