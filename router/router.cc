#include "router/router.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/clock.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "engine/gguf/gguf_file.h"
#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "kvstore/client/dynamic_kv_client.h"
#include "router/api/anthropic_writer.h"
#include "router/api/openai_writer.h"
#include "router/api/prompt_builder.h"
#include "router/api/request_json.h"
#include "router/api/response_store.h"
#include "router/api/vision_prompt.h"
#include "router/api_call.h"
#include "router/auth/api_keys.h"
#include "router/auth/rate_limiter.h"
#include "router/billing.h"
#include "router/dispatch/dispatcher.h"
#include "router/encode/encoder_pool.h"
#include "router/fetch/remote_image_fetcher.h"
#include "router/http/http_status.h"
#include "router/registry/worker_registry.h"
#include "router/router_metrics.h"
#include "services/common/admin_server.h"
#include "services/common/completion_thread.h"
#include "services/common/dns_discovery.h"
#include "services/common/metrics.h"
#include "services/common/polled_file.h"
#include "services/common/shared_token.h"

namespace ferry {

namespace {

// The router's ImageUrlFetcher (the seam router/api knows) over router/fetch's fetcher.
class RemoteImageUrlFetcher : public ImageUrlFetcher {
 public:
  explicit RemoteImageUrlFetcher(std::unique_ptr<RemoteImageFetcher> fetcher)
      : fetcher_(std::move(fetcher)) {}
  absl::StatusOr<std::string> Fetch(const std::string& url, absl::Time deadline) override {
    return fetcher_->Fetch(url, deadline);
  }

 private:
  const std::unique_ptr<RemoteImageFetcher> fetcher_;
};

}  // namespace
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string DefaultModelId(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string name = path.substr(path.rfind('/') + 1);
  if (absl::EndsWith(name, ".gguf")) name.resize(name.size() - 5);
  return name;
}

// A client's x-request-id when it is a plain token (letters, digits, ._-), at most 128 bytes.
bool ValidTraceId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

// YYYY-MM-DD, from 2023-01-01 on.
bool ValidAnthropicVersion(const std::string& v) {
  if (v.size() != 10 || v[4] != '-' || v[7] != '-') return false;
  for (int i : {0, 1, 2, 3, 5, 6, 8, 9}) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(v[i]))) return false;
  }
  const int month = std::stoi(v.substr(5, 2)), day = std::stoi(v.substr(8, 2));
  return v >= "2023-01-01" && month >= 1 && month <= 12 && day >= 1 && day <= 31;
}

std::string NewTraceId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat("req_", absl::Hex(rng(), absl::kZeroPad16));
}

std::string JsonError(const absl::Status& status, const std::string& trace_id,
                      const std::string& code = "") {
  return OpenAiErrorBody(status, trace_id, "", code);
}

// The errors the HTTP server answers itself (413, 431, 400): Anthropic's shape under
// /v1/messages, as Handle gives every other error there; elsewhere the server's own (OpenAI's).
std::string ServerErrorBody(int status, const std::string& path, const std::string& message) {
  if (path != "/v1/messages" && !absl::StartsWith(path, "/v1/messages/")) return "";
  nlohmann::ordered_json body = {
      {"type", "error"},
      {"error", {{"type", std::string(AnthropicErrorType(status))}, {"message", message}}},
      {"request_id", nullptr}};
  return DumpJson(body);
}

}  // namespace

class Router::Impl {
 public:
  explicit Impl(const RouterOptions& options) : options_(options) {}

  ~Impl() {
    Shutdown();
    keys_file_.reset();  // its thread applies keys into members declared after it
  }

  absl::Status Start() {
    RETURN_IF_ERROR(ValidateRouterOptions(options_));

    registry_metrics_ = NewServiceRegistry("router");
    SharedTokenSource::Options token_options;
    token_options.file = options_.auth_token_file;
    token_options.poll_interval = options_.secret_poll_interval;
    token_options.registry = registry_metrics_.get();
    ASSIGN_OR_RETURN(token_source_, SharedTokenSource::Start(token_options));
    const SharedToken& token = token_source_->token();
    limiter_ = std::make_unique<RateLimiter>(&RealClock());
    if (!options_.api_keys_file.empty()) {
      // Polled (Kubernetes Secrets change without a signal) and re-read on SIGHUP (ReloadKeys).
      PolledFileOptions keys_options;
      keys_options.path = options_.api_keys_file;
      keys_options.name = "api_keys";
      keys_options.interval = options_.secret_poll_interval;
      keys_options.registry = registry_metrics_.get();
      ASSIGN_OR_RETURN(keys_file_, PolledFile::Start(keys_options, [this](const std::string& json) {
                         return ApplyKeys(json);
                       }));
    } else {
      LOG(WARNING) << "no --api_keys_file: the API is open to anyone who can reach "
                   << options_.http.host;
    }
    // The model's tokenizer and chat template, never its weights.
    if (IsDirectory(options_.model)) {
      ASSIGN_OR_RETURN(tokenizer_, Tokenizer::FromHfDirectory(options_.model));
      std::ifstream config(options_.model + "/tokenizer_config.json");
      std::stringstream text;
      text << config.rdbuf();
      auto chat = ChatTemplate::FromTokenizerConfig(text.str());
      if (chat.ok()) chat_template_ = *std::move(chat);
    } else {
      auto gguf = GgufFile::Open(options_.model);
      if (!gguf.ok()) {
        return absl::Status(gguf.status().code(), absl::StrCat("--model ", options_.model, ": ",
                                                               gguf.status().message()));
      }
      ASSIGN_OR_RETURN(tokenizer_, Tokenizer::FromGguf(**gguf));
      auto chat = ChatTemplate::FromGguf(**gguf);
      if (chat.ok()) chat_template_ = *std::move(chat);
    }
    if (chat_template_ == nullptr) {
      LOG(WARNING) << "the model has no chat template: /v1/chat/completions answers 400";
    }
    model_id_ = options_.served_model_name.empty() ? DefaultModelId(options_.model)
                                                   : options_.served_model_name;
    // Tools and reasoning: from the template's markers unless flags say otherwise.
    const std::string source = chat_template_ != nullptr ? chat_template_->source() : "";
    ToolSetup tools;
    if (options_.tool_prompt == "hermes") {
      tools.hermes_prompt = true;
      tools.format = ToolCallFormat::kHermes;
    } else if (options_.tool_call_parser == "auto") {
      tools.format = DetectToolCallFormat(source);
    } else if (options_.tool_call_parser != "none") {
      tools.format = ToolCallFormatFromName(options_.tool_call_parser);
    }
    reasoning_ =
        options_.reasoning_parser == "think" ||
        (options_.reasoning_parser == "auto" && absl::StrContains(source, ReasoningParser::kOpen));
    // Markers that are special tokens of this tokenizer must reach the parsers as text.
    std::vector<std::string> markers;
    if (tools.format.has_value()) markers = ToolCallMarkers(*tools.format);
    if (reasoning_) {
      markers.emplace_back(ReasoningParser::kOpen);
      markers.emplace_back(ReasoningParser::kClose);
    }
    for (const std::string& marker : markers) {
      auto ids = tokenizer_->Encode(marker, /*allow_special=*/true);
      if (ids.ok() && ids->size() == 1 && tokenizer_->IsSpecial((*ids)[0])) {
        context_.keep_special_token_ids.push_back((*ids)[0]);
      }
    }
    LOG(INFO) << "tool calls: "
              << (tools.format.has_value() ? ToolCallFormatName(*tools.format) : "none (refused)")
              << (tools.hermes_prompt ? " (the router's Hermes system prompt)" : "")
              << "; reasoning parser: " << (reasoning_ ? "<think>" : "none");
    // A vision-language model: its image token and tokens per image (config.json, no weights).
    ASSIGN_OR_RETURN(std::optional<VisionPromptSetup> vision,
                     ReadVisionPromptSetup(options_.model, *tokenizer_));
    if (vision.has_value()) {
      LOG(INFO) << "images: token " << vision->image_token << ", " << vision->tokens_per_image
                << " tokens per image; at most " << options_.max_images_per_request
                << " per request, " << options_.max_image_bytes << " bytes each";
    }
    prompts_ = std::make_unique<PromptBuilder>(tokenizer_.get(), chat_template_.get(),
                                               std::move(tools), std::move(vision));

    std::vector<std::string> workers = options_.workers;
    if (!options_.workers_file.empty()) {
      ASSIGN_OR_RETURN(std::vector<std::string> listed,
                       WorkerRegistry::ReadWorkerFile(options_.workers_file));
      workers.insert(workers.end(), listed.begin(), listed.end());
    }
    if (workers.empty() && options_.workers_dns.empty()) {
      return absl::InvalidArgumentError(
          "no workers given (--workers, --workers_file, --workers_dns)");
    }
    {
      absl::MutexLock lock(&sources_mu_);
      file_workers_.assign(workers.begin() + static_cast<ptrdiff_t>(options_.workers.size()),
                           workers.end());
    }

    metrics_ = std::make_unique<RouterMetrics>(*registry_metrics_);
    billing_ = std::make_unique<Billing>(
        Prices{options_.price_input_per_mtok, options_.price_cached_input_per_mtok,
               options_.price_output_per_mtok},
        options_.gpus_per_worker, &RealClock(), *registry_metrics_);
    ResponseStoreOptions stored;
    stored.ttl = options_.responses_ttl;
    stored.max_responses_per_tenant = options_.responses_per_tenant;
    stored.max_bytes_per_tenant = options_.responses_bytes_per_tenant;
    stored.clock = &RealClock();
    responses_ = std::make_unique<ResponseStore>(stored);
    for (int i = 0; i < options_.dispatch_threads; ++i) {
      completions_.push_back(std::make_unique<CompletionThread>(absl::StrCat("dispatch-", i)));
    }
    RegistryOptions ro;
    ro.completions = completions_[0].get();
    ro.heartbeat_timeout = options_.heartbeat_timeout;
    ro.auth_token = token;
    if (!options_.model_fingerprint.empty()) {
      ASSIGN_OR_RETURN(ro.fingerprint, Hash128::FromHex(options_.model_fingerprint));
    }
    KvIndexOptions io;
    io.max_bytes = options_.kv_index_bytes;
    kv_index_ = std::make_unique<KvIndex>(io);
    ro.index = kv_index_.get();
    registry_ = std::make_unique<WorkerRegistry>(workers, ro, &RealClock());
    PrefixAwareOptions po;
    po.busy_threshold = options_.busy_threshold;
    po.store_fetch_per_block = options_.store_fetch_per_block;
    ASSIGN_OR_RETURN(
        policy_, NewRoutingPolicy(options_.policy, std::random_device{}(), kv_index_.get(), po));
    if (!options_.kvstore.empty() || !options_.kvstore_dns.empty()) {
      kv::ClientOptions ko;
      ko.nodes = options_.kvstore;
      ko.deadline = options_.kvstore_deadline;
      ko.auth_token = token;
      ASSIGN_OR_RETURN(std::unique_ptr<kv::DynamicKvClient> client,
                       kv::DynamicKvClient::Create(ko));
      kv::DynamicKvClient* nodes = client.get();
      RouterMetrics* metrics = metrics_.get();
      store_probe_ = std::make_unique<StoreProbe>(
          std::move(client), 256, [metrics](bool asked) { metrics->StoreProbed(asked); });
      if (!options_.kvstore_dns.empty()) {
        DnsDiscoveryOptions d = DiscoveryOptions(options_.kvstore_dns, "KV store nodes");
        d.naming = DnsDiscoveryOptions::Naming::kStableName;
        d.stable_name_linger = options_.kvstore_dns_linger;
        ASSIGN_OR_RETURN(store_dns_, DnsDiscovery::Start(d, [nodes](std::vector<std::string> e) {
                           if (absl::Status s = nodes->SetNodes(std::move(e)); !s.ok()) {
                             LOG(WARNING) << "KV store nodes from DNS: " << s;
                           }
                         }));
      }
    }
    DispatcherOptions dopts;
    dopts.max_queued = options_.max_queued;
    dopts.max_queued_tokens = options_.max_queued_tokens;
    dopts.queue_timeout = options_.queue_timeout;
    dopts.max_retries = options_.max_retries;
    dopts.max_migrations = options_.max_migrations;
    dopts.token_streams = options_.token_streams;
    dopts.handoff_precopy = options_.handoff_precopy;
    dopts.max_tracked_tokens_per_request = options_.migration_max_tokens_per_request;
    dopts.max_tracked_tokens = options_.migration_max_tokens;
    dopts.auth_token = token;
    for (auto& c : completions_) dopts.completions.push_back(c.get());
    DispatchObserver observer;
    RouterMetrics* m = metrics_.get();
    observer.routed = [m](const std::string& policy, const std::string& worker) {
      m->Routed(policy, worker);
    };
    observer.decided = [m](const std::string& policy, const RouteChoice& choice) {
      m->Decided(policy, choice.reason);
    };
    observer.prefix = [m](int64_t predicted_local, int64_t predicted_store, int64_t local,
                          int64_t store) {
      m->Prefix(predicted_local, predicted_store, local, store);
    };
    observer.prefill_phases = [m](double queue, double compute, double push_tail,
                                  double store_read) {
      m->PrefillPhases(queue, compute, push_tail, store_read);
    };
    observer.retried = [m] { m->Retry(); };
    observer.images_inlined = [m](int64_t images) { m->ImagesInlined(images); };
    observer.queue_depth = [m](int64_t depth, int64_t tokens) { m->QueueDepth(depth, tokens); };
    observer.queue_wait = [m](const char* pool, double seconds) { m->QueueWait(pool, seconds); };
    observer.queue_expired = [m](const std::string& reason) { m->QueueExpired(reason); };
    observer.kv_wait = [m] { m->KvWait(); };
    observer.collision = [m] { m->Collision(); };
    observer.migrated = [m](const std::string& cause, int64_t tokens) {
      m->Migrated(cause, tokens);
    };
    observer.failed = [m](const std::string& cause) { m->Failed(cause); };
    observer.untracked = [m] { m->Untracked(); };
    observer.orphan_abort = [m](const std::string& outcome) { m->OrphanAbort(outcome); };
    observer.handoff = [m](const std::string& outcome) { m->Handoff(outcome); };
    observer.precopy = [m](const std::string& outcome) { m->Precopy(outcome); };
    observer.token_streams = [m](int64_t open) { m->TokenStreams(open); };
    observer.token_stream_message = [m](int64_t chunks, int64_t dropped) {
      m->TokenStreamMessage(chunks, dropped);
    };
    dispatcher_ = std::make_unique<Dispatcher>(registry_.get(), policy_.get(), dopts, observer);

    context_.prompts = prompts_.get();
    context_.registry = registry_.get();
    context_.dispatcher = dispatcher_.get();
    context_.metrics = metrics_.get();
    context_.limits.model = model_id_;
    context_.limits.vocab_size = static_cast<int64_t>(tokenizer_->vocab_size());
    context_.limits.max_n = options_.max_n;
    context_.limits.max_tools_bytes = options_.max_tools_bytes;
    context_.limits.max_images = options_.max_images_per_request;
    context_.limits.max_image_bytes = static_cast<int64_t>(options_.max_image_bytes);
    context_.limits.image.max_pixels = options_.max_image_pixels;
    // Remote image URLs: refused by the parsers unless a fetcher is set; fetched off the I/O
    // threads.
    image_url_fetcher_ = options_.image_url_fetcher;
    if (image_url_fetcher_ == nullptr && !options_.image_url_hosts.empty()) {
      RemoteImageFetcherOptions fetch;
      fetch.allowed_hosts = options_.image_url_hosts;
      fetch.max_image_bytes = static_cast<int64_t>(options_.max_image_bytes);
      fetch.timeout = options_.image_fetch_timeout;
      fetch.ca_file = options_.image_url_ca_file;
      fetch.dns_servers = options_.dns_servers;
      absl::StatusOr<std::unique_ptr<RemoteImageFetcher>> fetcher =
          RemoteImageFetcher::Create(std::move(fetch));
      if (!fetcher.ok()) {
        return absl::Status(fetcher.status().code(),
                            absl::StrCat("--image_url_hosts: ", fetcher.status().message()));
      }
      image_url_fetcher_ = std::make_shared<RemoteImageUrlFetcher>(*std::move(fetcher));
    }
    if (image_url_fetcher_ != nullptr) {
      image_fetches_ = std::make_unique<ImageFetchExecutor>(options_.image_fetch_threads,
                                                            options_.max_queued_image_fetches);
      context_.limits.remote_images = true;
      context_.image_fetcher = image_url_fetcher_.get();
      context_.image_fetches = image_fetches_.get();
      context_.image_fetch_timeout = options_.image_fetch_timeout;
    }
    // Encoders: with a vision model only (a text-only model refuses images before they would be
    // encoded).
    if (!options_.encoders.empty() || !options_.encoders_dns.empty()) {
      if (!prompts_->vision().has_value()) {
        LOG(WARNING) << "--encoders given, but " << options_.model
                     << " is not a vision model: the encoders are not used";
      } else {
        EncoderPoolOptions eo;
        eo.endpoints = options_.encoders;
        eo.auth_token = token;
        eo.encode_timeout = options_.encode_timeout;
        eo.expected_image_tokens = static_cast<uint32_t>(prompts_->vision()->tokens_per_image);
        eo.on_state = [m](const std::string& endpoint, bool up) { m->EncoderUp(endpoint, up); };
        for (const std::string& e : options_.encoders) m->EncoderUp(e, false);
        ASSIGN_OR_RETURN(encoder_pool_, EncoderPool::Start(std::move(eo)));
        if (!options_.encoders_dns.empty()) {
          // The listed encoders and the names' addresses, as each lookup finds them.
          EncoderPool* pool = encoder_pool_.get();
          const std::vector<std::string> listed = options_.encoders;
          ASSIGN_OR_RETURN(
              encoders_dns_,
              DnsDiscovery::Start(DiscoveryOptions(options_.encoders_dns, "encoders"),
                                  [pool, listed](std::vector<std::string> found) {
                                    found.insert(found.end(), listed.begin(), listed.end());
                                    if (absl::Status s = pool->SetEndpoints(std::move(found));
                                        !s.ok()) {
                                      LOG(WARNING) << "encoders from DNS: " << s;
                                    }
                                  }));
        }
        encodes_ = std::make_unique<ImageFetchExecutor>(options_.encode_threads,
                                                        options_.max_queued_encodes);
        context_.encoders = encoder_pool_.get();
        context_.encodes = encodes_.get();
        LOG(INFO) << "images: encoded on " << encoder_pool_->size() << " encoder(s)";
      }
    }
    // Before a worker reports the context: the body limit's (ApiCall widens them for the pool).
    context_.limits.json = RequestJsonLimits(options_.http.max_body_bytes, 0);
    context_.max_body_bytes = options_.http.max_body_bytes;
    context_.request_timeout = options_.request_timeout;
    context_.slo.ttft = options_.slo_ttft;
    context_.slo.itl = options_.slo_itl;
    context_.reasoning = reasoning_;
    context_.limiter = limiter_.get();
    context_.billing = billing_.get();
    context_.responses = responses_.get();
    context_.store_probe = store_probe_.get();

    AdminServerOptions admin;
    admin.host = options_.admin_host;
    admin.port = options_.admin_port;
    admin.routes = [this](const std::string& method, const std::string& path,
                          const std::string& body,
                          AdminReply* reply) { return AdminRoute(method, path, body, reply); };
    ASSIGN_OR_RETURN(admin_, AdminServer::Start(admin, registry_metrics_));

    registry_->SetOnChange([this] { OnRegistryChange(); });
    registry_->SetOnRefusal([m](const std::string& reason) { m->Refusal(reason); });
    Dispatcher* dispatcher = dispatcher_.get();
    registry_->SetOnWorkerState([this, dispatcher](const std::string& id, bool up) {
      dispatcher->OnWorkerState(id, up);
      if (!up) {
        // A pod replaced comes back on another address: look the pools up again now.
        absl::MutexLock lock(&dns_mu_);
        if (workers_dns_ != nullptr) workers_dns_->ResolveSoon();
      }
    });
    registry_->Start();
    if (!options_.workers_dns.empty()) {
      ASSIGN_OR_RETURN(std::unique_ptr<DnsDiscovery> discovery,
                       DnsDiscovery::Start(DiscoveryOptions(options_.workers_dns, "workers"),
                                           [this](std::vector<std::string> endpoints) {
                                             {
                                               absl::MutexLock lock(&sources_mu_);
                                               dns_workers_ = std::move(endpoints);
                                             }
                                             if (absl::Status s = ApplyWorkerSources(); !s.ok()) {
                                               LOG(WARNING) << "workers from DNS: " << s;
                                             }
                                           }));
      absl::MutexLock lock(&dns_mu_);
      workers_dns_ = std::move(discovery);
    }

    ASSIGN_OR_RETURN(http_,
                     HttpServer::Start(
                         options_.http,
                         [this](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
                           Handle(std::move(request), std::move(responder));
                         },
                         ServerErrorBody));
    created_ = absl::ToUnixSeconds(absl::Now());
    LOG(INFO) << "router serving '" << model_id_ << "' on " << options_.http.host << ":"
              << http_->port() << " (" << options_.policy << ", " << workers.size()
              << " worker(s)), admin on " << options_.admin_host << ":" << admin_->port();
    return absl::OkStatus();
  }

  void Shutdown() {
    {
      absl::MutexLock lock(&change_mu_);
      if (shut_down_.exchange(true)) return;
    }
    if (admin_ != nullptr) admin_->SetReady(false, "shutting down");
    std::unique_ptr<DnsDiscovery> workers_dns;  // (their callbacks use the registry and the
    {                                           // store probe's client)
      absl::MutexLock lock(&dns_mu_);
      workers_dns = std::move(workers_dns_);
    }
    workers_dns.reset();
    store_dns_.reset();
    if (dispatcher_ != nullptr) {
      dispatcher_->DropQueue(absl::UnavailableError("the router is shutting down"));
    }
    if (http_ != nullptr) http_->Shutdown(options_.shutdown_grace);
    image_fetches_.reset();  // (its running fetches finish; what waits is dropped)
    encoders_dns_.reset();   // (its callback uses the pool)
    if (encoder_pool_ != nullptr) encoder_pool_->Shutdown();  // (running encodes end at once)
    encodes_.reset();  // (their requests go on with the images inline)
    encoder_pool_.reset();
    store_probe_.reset();  // (what it still holds is dispatched, or dropped with the queue)
    dispatcher_.reset();   // waits for the streams still running
    if (registry_ != nullptr) registry_->Stop();
    if (admin_ != nullptr) admin_->Stop();
    LOG(INFO) << "router stopped";
  }

  int http_port() const { return http_->port(); }
  int admin_port() const { return admin_->port(); }
  const std::string& model_id() const { return model_id_; }

 private:
  void OnRegistryChange() {
    absl::MutexLock lock(&change_mu_);
    if (shut_down_) return;
    const int64_t up = registry_->up_count();
    metrics_->Workers(up, static_cast<int64_t>(registry_->ToJson().size()) - up);
    metrics_->KvIndexState(kv_index_->entries(), kv_index_->bytes(), kv_index_->events(),
                           kv_index_->dropped());
    metrics_->TrackedTokens(dispatcher_->tracked_tokens());
    billing_->WorkersUp(up);
    const bool serving = registry_->AnyUp();
    admin_->SetReady(serving, serving ? "" : "no worker can take requests");
    dispatcher_->Pump();
  }

  bool AdminRoute(const std::string& method, const std::string& path, const std::string& body,
                  AdminReply* reply) {
    if (path == "/billing") {
      if (method != "GET") {
        reply->status = 405;
        reply->body = R"({"error":"GET /billing"})";
        return true;
      }
      reply->body = billing_->Report().dump(2);
      return true;
    }
    if (path == "/workers/reload") {
      if (method != "POST") {
        reply->status = 405;
        reply->body = R"({"error":"POST /workers/reload"})";
        return true;
      }
      auto listed = ReloadWorkers();
      if (!listed.ok()) {
        reply->status = HttpStatusCode(listed.status().code());
        reply->body = JsonError(listed.status(), "");
        return true;
      }
      reply->body = nlohmann::json{{"workers", *listed}}.dump();
      return true;
    }
    if (path == "/workers") {
      if (method != "GET") {
        reply->status = 405;
        reply->body = R"({"error":"GET /workers"})";
        return true;
      }
      reply->body = registry_->ToJson().dump(2);
      return true;
    }
    const std::string prefix = "/workers/", suffix = "/drain";
    if (absl::StartsWith(path, prefix) && absl::EndsWith(path, suffix) &&
        path.size() > prefix.size() + suffix.size()) {
      if (method != "POST") {
        reply->status = 405;
        reply->body = R"({"error":"POST /workers/{id}/drain"})";
        return true;
      }
      const std::string id =
          path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
      uint32_t grace = 0;
      if (!body.empty()) {
        auto j = nlohmann::json::parse(body, nullptr, false);
        if (j.is_object() && j.contains("grace_seconds") &&
            j["grace_seconds"].is_number_unsigned()) {
          grace = j["grace_seconds"].get<uint32_t>();
        }
      }
      auto drained = registry_->Drain(id, grace);
      if (!drained.ok()) {
        reply->status = HttpStatusCode(drained.status().code());
        reply->body = JsonError(drained.status(), "");
        return true;
      }
      reply->body = nlohmann::json{{"id", id},
                                   {"state", ferry::v1::DrainState_Name(drained->state())},
                                   {"running_requests", drained->running_requests()}}
                        .dump();
      return true;
    }
    return false;
  }

  void Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    const std::string& sent = request.header("x-request-id");
    const std::string trace_id = ValidTraceId(sent) ? sent : NewTraceId();
    const std::string& path = request.path;
    // The API whose shape errors take: Anthropic's under /v1/messages, OpenAI's elsewhere.
    const bool anthropic = path == "/v1/messages" || absl::StartsWith(path, "/v1/messages/");
    const ApiKind shape = anthropic ? ApiKind::kMessages : ApiKind::kChatCompletion;
    const char* endpoint = "other";
    if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/messages" ||
        path == "/v1/messages/count_tokens" || path == "/v1/responses") {
      endpoint = path.c_str();
    } else if (absl::StartsWith(path, "/v1/responses/")) {
      endpoint = "/v1/responses/{id}";
    } else if (absl::StartsWith(path, "/v1/models")) {
      endpoint = "/v1/models";
    }
    auto reply = [&](int status, const std::string& body, const std::string& endpoint) {
      metrics_->Request(endpoint, status);
      HttpHeaders headers = {{"Content-Type", "application/json"}, {"x-request-id", trace_id}};
      if (anthropic) headers.emplace_back("request-id", trace_id);
      if (status == 405) {
        headers.emplace_back("Allow", path.rfind("/v1/models", 0) == 0           ? "GET"
                                      : absl::StartsWith(path, "/v1/responses/") ? "GET, DELETE"
                                                                                 : "POST");
      }
      responder->Respond(status, headers, body);
    };
    auto fail = [&](const absl::Status& status, const std::string& code) {
      reply(code == "method_not_allowed" ? 405 : ApiErrorStatus(shape, status.code()),
            ApiErrorBody(shape, {status, "", code}, trace_id), endpoint);
    };
    // Every /v1 path needs a tenant's key when the router has a key file.
    // Without a key file everyone is one tenant, which may choose its traffic class.
    Tenant tenant;
    tenant.name = "anonymous";
    tenant.traffic_class_header = true;
    if (absl::StartsWith(path, "/v1/")) {
      std::string code;
      absl::Status auth = Authenticate(request, &tenant, &code);
      if (!auth.ok()) return fail(auth, code);
      // A request's own traffic class (its KV's retention in the store), where its tenant allows.
      if (const std::string& c = request.header("x-ferry-traffic-class"); !c.empty()) {
        auto parsed = ParseTrafficClass(absl::AsciiStrToLower(absl::StripAsciiWhitespace(c)));
        if (!tenant.traffic_class_header) {
          return fail(absl::PermissionDeniedError(
                          absl::StrCat("tenant '", tenant.name,
                                       "' may not choose its traffic class: remove the "
                                       "x-ferry-traffic-class header")),
                      "traffic_class_not_allowed");
        }
        if (!parsed.ok()) {
          return fail(absl::InvalidArgumentError(absl::StrCat("x-ferry-traffic-class '", c,
                                                              "': ", parsed.status().message())),
                      "invalid_traffic_class");
        }
        tenant.traffic_class = *parsed;
      }
      // Anthropic's API version, required as Anthropic requires it: a date (every SDK sends
      // one). Ferry answers every version in the shape of 2023-06-01, the API's one version so far.
      if (anthropic) {
        const std::string& version = request.header("anthropic-version");
        if (version.empty()) {
          return fail(absl::InvalidArgumentError("anthropic-version: header is required"), "");
        }
        if (!ValidAnthropicVersion(version)) {
          return fail(absl::InvalidArgumentError(
                          absl::StrCat("anthropic-version: '", version,
                                       "' is not a version; send a date such as 2023-06-01")),
                      "");
        }
      }
    }
    static const std::pair<const char*, ApiKind> kCalls[] = {
        {"/v1/chat/completions", ApiKind::kChatCompletion},
        {"/v1/completions", ApiKind::kCompletion},
        {"/v1/messages", ApiKind::kMessages},
        {"/v1/responses", ApiKind::kResponses}};
    for (const auto& [route, kind] : kCalls) {
      if (path != route) continue;
      if (request.method != "POST") {
        return fail(absl::InvalidArgumentError(
                        absl::StrCat(request.method, " is not allowed here; use POST")),
                    "method_not_allowed");
      }
      ApiCall::Run(context_, kind, std::move(request), std::move(responder), trace_id,
                   std::move(tenant));
      return;
    }
    if (path == "/v1/messages/count_tokens") {
      if (request.method != "POST") {
        return fail(absl::InvalidArgumentError(
                        absl::StrCat(request.method, " is not allowed here; use POST")),
                    "method_not_allowed");
      }
      return ApiCall::CountTokens(context_, request, *responder, trace_id);
    }
    if (absl::StartsWith(path, "/v1/responses/")) {
      return StoredResponse(request, tenant, trace_id, reply);
    }
    if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/")) {
      if (request.method != "GET") {
        return reply(
            405, JsonError(absl::InvalidArgumentError("use GET"), trace_id, "method_not_allowed"),
            "/v1/models");
      }
      const nlohmann::ordered_json model = {
          {"id", model_id_}, {"object", "model"}, {"created", created_}, {"owned_by", "ferry"}};
      if (path == "/v1/models") {
        return reply(200,
                     DumpJson(nlohmann::ordered_json{
                         {"object", "list"}, {"data", nlohmann::ordered_json::array({model})}}),
                     "/v1/models");
      }
      const std::string id = path.substr(std::string("/v1/models/").size());
      if (id != model_id_) {
        return reply(
            404,
            JsonError(absl::NotFoundError(absl::StrCat("The model '", id, "' does not exist")),
                      trace_id, "model_not_found"),
            "/v1/models/{id}");
      }
      return reply(200, DumpJson(model), "/v1/models/{id}");
    }
    fail(absl::NotFoundError(absl::StrCat("no route for ", request.method, " ", path,
                                          "; see /v1/chat/completions, /v1/messages or "
                                          "/v1/responses")),
         "not_found");
  }

  // GET and DELETE /v1/responses/{id}: a response this router stored for the tenant.
  template <typename Reply>
  void StoredResponse(const HttpRequest& request, const Tenant& tenant, const std::string& trace_id,
                      Reply& reply) {
    const std::string id = request.path.substr(std::string("/v1/responses/").size());
    const char* endpoint = "/v1/responses/{id}";
    if (request.method != "GET" && request.method != "DELETE") {
      return reply(405,
                   JsonError(absl::InvalidArgumentError(absl::StrCat(
                                 request.method, " is not allowed here; use GET or DELETE")),
                             trace_id, "method_not_allowed"),
                   endpoint);
    }
    auto not_found = [&] {
      reply(404,
            JsonError(absl::NotFoundError(absl::StrCat("Response with id '", id,
                                                       "' not found. Responses are kept for ",
                                                       FormatDuration(options_.responses_ttl),
                                                       " by the router replica that served them.")),
                      trace_id, "not_found"),
            endpoint);
    };
    if (request.method == "DELETE") {
      if (!responses_->Delete(tenant.name, id)) return not_found();
      return reply(
          200,
          DumpJson(nlohmann::ordered_json{{"id", id}, {"object", "response"}, {"deleted", true}}),
          endpoint);
    }
    auto stored = responses_->Get(tenant.name, id);
    if (!stored.has_value()) return not_found();
    reply(200, stored->response_json, endpoint);
  }

  // The tenant of the request's key (Authorization: Bearer <key>, or x-api-key), or why not; no
  // key file: every request is the anonymous tenant's. A key never reaches a log or a reply.
  absl::Status Authenticate(const HttpRequest& request, Tenant* tenant, std::string* code) {
    std::shared_ptr<const ApiKeys> keys;
    {
      absl::MutexLock lock(&keys_mu_);
      keys = keys_;
    }
    if (keys == nullptr) return absl::OkStatus();
    absl::string_view key;
    const std::string& authorization = request.header("authorization");
    if (!authorization.empty()) {
      constexpr absl::string_view kBearer = "bearer ";
      if (authorization.size() <= kBearer.size() ||
          !absl::EqualsIgnoreCase(absl::string_view(authorization).substr(0, kBearer.size()),
                                  kBearer)) {
        *code = "invalid_api_key";
        return absl::UnauthenticatedError(
            "the Authorization header must be 'Bearer <your API key>'");
      }
      key = absl::StripAsciiWhitespace(absl::string_view(authorization).substr(kBearer.size()));
    } else {
      key = absl::StripAsciiWhitespace(request.header("x-api-key"));
    }
    if (key.empty()) {
      *code = "missing_api_key";
      return absl::UnauthenticatedError(
          "You didn't provide an API key: send it as 'Authorization: Bearer <key>' or in an "
          "'x-api-key' header");
    }
    const Tenant* found = keys->Find(key);
    if (found == nullptr) {
      *code = "invalid_api_key";
      return absl::UnauthenticatedError("Incorrect API key provided");
    }
    *tenant = *found;
    return absl::OkStatus();
  }

 public:
  // The workers given on the command line and those the file lists now; the current ones stay on
  // an error. Returns the addresses now listed.
  absl::StatusOr<std::vector<std::string>> ReloadWorkers() {
    if (options_.workers_file.empty()) {
      return absl::FailedPreconditionError("the router was started without --workers_file");
    }
    ASSIGN_OR_RETURN(std::vector<std::string> listed,
                     WorkerRegistry::ReadWorkerFile(options_.workers_file));
    if (listed.empty() && options_.workers.empty() && options_.workers_dns.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(options_.workers_file,
                       " lists no worker: the workers in use stay (a router with none "
                       "serves nothing)"));
    }
    {
      absl::MutexLock lock(&sources_mu_);
      file_workers_ = listed;
    }
    RETURN_IF_ERROR(ApplyWorkerSources());
    LOG(INFO) << "workers reloaded from " << options_.workers_file << ": " << listed.size()
              << " listed there, " << options_.workers.size() << " given by --workers";
    std::vector<std::string> workers = options_.workers;
    workers.insert(workers.end(), listed.begin(), listed.end());
    return workers;
  }

 private:
  // The workers: --workers, then --workers_file's (as last read), then DNS's (as last found).
  absl::Status ApplyWorkerSources() {
    absl::MutexLock lock(&sources_mu_);  // one SetWorkers at a time, in the order sources change
    std::vector<std::string> workers = options_.workers;
    workers.insert(workers.end(), file_workers_.begin(), file_workers_.end());
    workers.insert(workers.end(), dns_workers_.begin(), dns_workers_.end());
    std::sort(workers.begin(), workers.end());
    workers.erase(std::unique(workers.begin(), workers.end()), workers.end());
    return registry_->SetWorkers(std::move(workers));
  }

  DnsDiscoveryOptions DiscoveryOptions(const std::vector<std::string>& targets,
                                       const std::string& what) const {
    DnsDiscoveryOptions d;
    d.targets = targets;
    d.interval = options_.dns_interval;
    d.retry = std::min(options_.dns_interval, absl::Seconds(1));
    d.dns.servers = options_.dns_servers;
    d.what = what;
    return d;
  }

 public:
  absl::Status ReloadKeys() {
    if (keys_file_ == nullptr) {
      return absl::FailedPreconditionError("the router was started without --api_keys_file");
    }
    return keys_file_->Poll(/*force=*/true);
  }

 private:
  // The key file's content (at the start, then each new one): the keys in force from now on.
  absl::Status ApplyKeys(const std::string& json) {
    ASSIGN_OR_RETURN(std::unique_ptr<const ApiKeys> keys, ApiKeys::Parse(json));
    LOG(INFO) << "API keys: " << keys->keys() << " key(s) of " << keys->tenants().size()
              << " tenant(s) from " << options_.api_keys_file;
    limiter_->Retain(keys->tenants());
    absl::MutexLock lock(&keys_mu_);
    keys_ = std::move(keys);
    return absl::OkStatus();
  }

  const RouterOptions options_;
  // Remote image URLs' fetcher (options_.image_url_fetcher, or one made from image_url_hosts).
  std::shared_ptr<ImageUrlFetcher> image_url_fetcher_;
  std::shared_ptr<prometheus::Registry> registry_metrics_;  // first: the pollers count into it
  std::unique_ptr<SharedTokenSource> token_source_;         // the workers' and store's token
  std::unique_ptr<PolledFile> keys_file_;                   // null without --api_keys_file
  absl::Mutex keys_mu_;
  std::shared_ptr<const ApiKeys> keys_ ABSL_GUARDED_BY(keys_mu_);  // null: no key file
  std::unique_ptr<RateLimiter> limiter_;
  std::unique_ptr<Billing> billing_;
  std::unique_ptr<ResponseStore> responses_;  // Responses answers kept for GET and continuations
  absl::Mutex change_mu_;                     // registry callbacks vs. shutdown
  std::atomic<bool> shut_down_{false};
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<PromptBuilder> prompts_;
  bool reasoning_ = false;
  std::string model_id_;
  int64_t created_ = 0;
  std::unique_ptr<RouterMetrics> metrics_;
  // Where every call to the workers completes (watch streams, Generate streams, prefills): one
  // thread polls the connections and runs what arrived (destroyed after the registry and the
  // dispatcher, once their calls are done).
  std::vector<std::unique_ptr<CompletionThread>> completions_;
  std::unique_ptr<KvIndex> kv_index_;  // the workers' cached blocks (outlives its users)
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<RoutingPolicy> policy_;
  std::unique_ptr<StoreProbe> store_probe_;  // null without --kvstore or --kvstore_dns
  absl::Mutex sources_mu_;                   // the worker sources, and SetWorkers in their order
  std::vector<std::string> file_workers_ ABSL_GUARDED_BY(sources_mu_);
  std::vector<std::string> dns_workers_ ABSL_GUARDED_BY(sources_mu_);
  absl::Mutex dns_mu_;  // workers_dns_ vs. the registry's callbacks
  std::unique_ptr<DnsDiscovery> workers_dns_ ABSL_GUARDED_BY(dns_mu_);  // null: no --workers_dns
  std::unique_ptr<DnsDiscovery> store_dns_;  // null without --kvstore_dns
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<ImageFetchExecutor> image_fetches_;  // null without an image URL fetcher
  std::unique_ptr<EncoderPool> encoder_pool_;
  std::unique_ptr<DnsDiscovery> encoders_dns_;   // null without --encoders_dns    // null without
                                                 // --encoders (or a vision model)
  std::unique_ptr<ImageFetchExecutor> encodes_;  // the Encode calls' threads (with the pool)
  ApiContext context_;
  std::unique_ptr<AdminServer> admin_;
  std::unique_ptr<HttpServer> http_;
};

absl::StatusOr<std::unique_ptr<Router>> Router::Start(const RouterOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

Router::Router(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Router::~Router() { Shutdown(); }
int Router::http_port() const { return impl_->http_port(); }
int Router::admin_port() const { return impl_->admin_port(); }
const std::string& Router::model_id() const { return impl_->model_id(); }
void Router::Shutdown() { impl_->Shutdown(); }
absl::Status Router::ReloadKeys() { return impl_->ReloadKeys(); }
absl::Status Router::ReloadWorkers() { return impl_->ReloadWorkers().status(); }

}  // namespace ferry
