#include "router/api_call.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/block_hash.h"
#include "engine/common/hash128.h"
#include "engine/common/log.h"
#include "router/api/anthropic_parser.h"
#include "router/api/anthropic_writer.h"
#include "router/api/image_part.h"
#include "router/api/request_json.h"
#include "router/api/responses_parser.h"
#include "router/api/responses_writer.h"
#include "router/http/http_status.h"

namespace ferry {

namespace {

uint64_t RandomU64() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  return rng();
}

std::string RandomHex(int bytes) {
  std::string out;
  while (static_cast<int>(out.size()) < 2 * bytes)
    out += absl::StrCat(absl::Hex(RandomU64(), absl::kZeroPad16));
  return out.substr(0, 2 * bytes);
}

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_TOOL_CALLS:
      return "tool_calls";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "";
  }
}

// Mistral's templates take call ids of 9 letters and digits.
std::string MistralCallId() {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id;
  for (int i = 0; i < 9; ++i) id += kAlphabet[RandomU64() % (sizeof(kAlphabet) - 1)];
  return id;
}

v1::ConstraintKind ProtoConstraintKind(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonSchema:
      return v1::CONSTRAINT_KIND_JSON_SCHEMA;
    case ConstraintKind::kJsonObject:
      return v1::CONSTRAINT_KIND_JSON_OBJECT;
    case ConstraintKind::kRegex:
      return v1::CONSTRAINT_KIND_REGEX;
    case ConstraintKind::kGrammar:
      return v1::CONSTRAINT_KIND_GRAMMAR;
    case ConstraintKind::kChoice:
      return v1::CONSTRAINT_KIND_CHOICE;
    case ConstraintKind::kToolCalls:
      return v1::CONSTRAINT_KIND_TOOL_CALLS;
  }
  return v1::CONSTRAINT_KIND_UNSPECIFIED;
}

void SetHash(const Hash128& h, v1::Hash128* out) {
  out->set_lo(h.lo);
  out->set_hi(h.hi);
}

}  // namespace

const char* ApiEndpoint(ApiKind kind) {
  switch (kind) {
    case ApiKind::kChatCompletion:
      return "/v1/chat/completions";
    case ApiKind::kCompletion:
      return "/v1/completions";
    case ApiKind::kMessages:
      return "/v1/messages";
    case ApiKind::kResponses:
      return "/v1/responses";
  }
  return "other";
}

int ApiErrorStatus(ApiKind kind, absl::StatusCode code) {
  return kind == ApiKind::kMessages ? AnthropicHttpStatus(code) : HttpStatusCode(code);
}

std::string ApiErrorBody(ApiKind kind, const ApiError& error, const std::string& trace_id) {
  if (kind == ApiKind::kMessages) return AnthropicErrorBody(error.status, trace_id);
  return OpenAiErrorBody(error.status, trace_id, error.param, error.code);
}

ApiCall::ApiCall(const ApiContext& context, ApiKind kind, std::shared_ptr<HttpResponder> responder,
                 std::string trace_id, Tenant tenant)
    : context_(context),
      kind_(kind),
      responder_(std::move(responder)),
      trace_id_(std::move(trace_id)),
      tenant_(std::move(tenant)),
      start_(Clock::now()) {}

void ApiCall::Run(const ApiContext& context, ApiKind kind, HttpRequest request,
                  std::shared_ptr<HttpResponder> responder, const std::string& trace_id,
                  Tenant tenant) {
  auto call =
      std::make_shared<ApiCall>(context, kind, std::move(responder), trace_id, std::move(tenant));
  call->Start(request);
}

const char* ApiCall::endpoint() const { return ApiEndpoint(kind_); }

void ApiCall::CountTokens(const ApiContext& context, const HttpRequest& http,
                          HttpResponder& responder, const std::string& trace_id) {
  const char* endpoint = "/v1/messages/count_tokens";
  HttpHeaders headers = {
      {"Content-Type", "application/json"}, {"x-request-id", trace_id}, {"request-id", trace_id}};
  auto fail = [&](const ApiError& error) {
    const int status = ApiErrorStatus(ApiKind::kMessages, error.status.code());
    context.metrics->Request(endpoint, status);
    responder.Respond(status, headers, ApiErrorBody(ApiKind::kMessages, error, trace_id));
  };
  ApiRequest request;
  ApiError error = ParseAnthropicCountTokens(http.body, context.limits, &request);
  if (!error.status.ok()) return fail(error);
  // Counted whatever the context holds: the count is what a client checks against it.
  BuiltPrompt prompt;
  request.sampling.max_tokens = 1;
  error = context.prompts->Build(request, std::numeric_limits<int32_t>::max(), &prompt);
  if (!error.status.ok()) return fail(error);
  context.metrics->Request(endpoint, 200);
  responder.Respond(200, headers,
                    DumpJson(nlohmann::ordered_json{
                        {"input_tokens", static_cast<int64_t>(prompt.tokens.size())}}));
}

void ApiCall::StartStream() {
  if (streaming_) return;
  streaming_ = true;
  HttpHeaders headers = {{"Content-Type", "text/event-stream"},
                         {"Cache-Control", "no-cache"},
                         {"X-Accel-Buffering", "no"},
                         {"x-request-id", trace_id_}};
  if (kind_ == ApiKind::kMessages) headers.emplace_back("request-id", trace_id_);
  responder_->StartStream(200, headers);
}

void ApiCall::Answer(int status, std::string body) {
  if (answered_) return;
  answered_ = true;
  Ended(status);
  context_.metrics->RequestSeconds(endpoint(),
                                   std::chrono::duration<double>(Clock::now() - start_).count());
  HttpHeaders headers = {{"Content-Type", "application/json"}, {"x-request-id", trace_id_}};
  if (kind_ == ApiKind::kMessages) headers.emplace_back("request-id", trace_id_);
  if (status == 429 || status == 503 || status == 529) {
    headers.emplace_back("Retry-After", std::to_string(retry_after_seconds_));
  }
  responder_->Respond(status, headers, std::move(body));
}

void ApiCall::Ended(int status) {
  context_.metrics->Request(endpoint(), status);
  SloRecord r;
  r.dispatched = dispatched_;
  r.failed = status >= 500 || status == 429;
  r.first_token = first_token_;
  if (first_token_) {
    r.ttft_seconds = std::chrono::duration<double>(first_token_at_ - start_).count();
    r.decode_seconds = std::chrono::duration<double>(last_token_ - first_token_at_).count();
    r.tokens_after_first = tokens_after_first_;
  }
  const SloJudgement j = JudgeSlo(r, context_.slo);
  if (j.ttft != SloResult::kNotJudged) context_.metrics->Slo("ttft", j.ttft == SloResult::kMet);
  if (j.itl != SloResult::kNotJudged) context_.metrics->Slo("itl", j.itl == SloResult::kMet);
}

void ApiCall::Fail(const ApiError& error) {
  const int status = ApiErrorStatus(kind_, error.status.code());
  if (status >= 500) {
    LOG(WARNING) << LogTraceId(trace_id_) << "request " << trace_id_ << ": " << status << " "
                 << error.status;
  }
  if (!streaming_) return Answer(status, ApiErrorBody(kind_, error, trace_id_));
  // The stream started: an error event, and the end of the stream.
  if (answered_) return;
  answered_ = true;
  Ended(status);
  std::string events;
  events.swap(unsent_);  // what the client had not been sent yet, then the error
  events += writer_->StreamError(error, trace_id_);
  responder_->Write(std::move(events));
  responder_->Finish();
}

void ApiCall::Start(const HttpRequest& http) {
  std::weak_ptr<ApiCall> weak = weak_from_this();
  responder_->OnClose([weak] {
    if (auto self = weak.lock()) {
      std::shared_ptr<Dispatcher::Job> job;
      {
        absl::MutexLock lock(&self->mu_);
        self->answered_ = true;  // nobody to answer
        job = self->job_.lock();
      }
      if (job != nullptr) self->context_.dispatcher->Cancel(job);
    }
  });
  absl::ReleasableMutexLock lock(&mu_);
  ApiLimits limits = context_.limits;
  // The pool's facts; while every worker is down or restarting, the last ones (the request waits
  // in the dispatcher's queue for a worker to come back).
  const PoolInfo pool = context_.registry->last_pool();
  if (pool.known && pool.max_choices > 0) {
    limits.max_n = std::min<int32_t>(limits.max_n, static_cast<int32_t>(pool.max_choices));
  }
  // A completions prompt of the whole context in token ids must parse.
  if (pool.known) limits.json = RequestJsonLimits(context_.max_body_bytes, pool.max_context_tokens);
  ApiError error;
  switch (kind_) {
    case ApiKind::kChatCompletion:
      error = ParseChatCompletion(http.body, limits, &request_);
      break;
    case ApiKind::kCompletion:
      error = ParseCompletion(http.body, limits, &request_);
      break;
    case ApiKind::kMessages:
      error = ParseAnthropicMessages(http.body, limits, &request_);
      break;
    case ApiKind::kResponses:
      error = ParseResponses(http.body, limits, &request_);
      break;
  }
  if (!error.status.ok()) return Fail(error);
  // Responses: the conversation so far (previous_response_id's), then this request's input.
  if (kind_ == ApiKind::kResponses) {
    error = ResponsesConversation(*context_.responses, tenant_.name, &request_, &history_);
    if (!error.status.ok()) return Fail(error);
  }
  bool remote = false;
  for (const ApiImage* image : CollectImages(request_)) remote = remote || !image->url.empty();
  if (remote) {
    // Remote images: fetched off this I/O thread, then the rest of the pipeline runs there.
    if (context_.image_fetcher == nullptr || context_.image_fetches == nullptr) {
      return Fail({absl::InvalidArgumentError(kRemoteImagesDisabled), "messages",
                   "remote_images_disabled"});
    }
    auto self = shared_from_this();
    if (!context_.image_fetches->Submit([self] { self->FetchImages(); })) {
      context_.metrics->ImageFetch("queue_full");
      retry_after_seconds_ = 1;
      return Fail(
          {absl::UnavailableError("the router's image fetch queue is full; retry later"), "", ""});
    }
    return;
  }
  lock.Release();
  Continue();
}

void ApiCall::FetchImages() {
  struct Remote {
    size_t message;
    size_t part;
    std::string url;
    std::string param;
  };
  std::vector<Remote> remote;
  {
    absl::MutexLock lock(&mu_);
    if (answered_) return;  // the client left while the call waited
    for (size_t i = 0; i < request_.messages.size(); ++i) {
      const std::vector<ApiContentPart>& parts = request_.messages[i].content;
      for (size_t j = 0; j < parts.size(); ++j) {
        if (parts[j].image.has_value() && !parts[j].image->url.empty()) {
          remote.push_back({i, j, parts[j].image->url, parts[j].image->param});
        }
      }
    }
  }
  const absl::Time deadline =
      absl::Now() + std::min(context_.image_fetch_timeout, context_.request_timeout);
  std::vector<std::string> bytes(remote.size());
  for (size_t k = 0; k < remote.size(); ++k) {
    auto fetched = context_.image_fetcher->Fetch(remote[k].url, deadline);
    ApiError error;
    if (!fetched.ok()) {
      error = {
          absl::Status(fetched.status().code(), absl::StrCat("the image could not be fetched: ",
                                                             fetched.status().message())),
          remote[k].param, "image_fetch_failed"};
    } else if (static_cast<int64_t>(fetched->size()) > context_.limits.max_image_bytes) {
      error =
          ApiInvalid(remote[k].param,
                     absl::StrCat("the fetched image takes ", fetched->size(), " bytes; at most ",
                                  context_.limits.max_image_bytes, " per image"),
                     "image_too_large");
    }
    context_.metrics->ImageFetch(error.status.ok() ? "ok" : "error");
    if (!error.status.ok()) {
      absl::MutexLock lock(&mu_);
      return Fail(error);
    }
    bytes[k] = *std::move(fetched);
  }
  {
    absl::MutexLock lock(&mu_);
    if (answered_) return;
    // Responses: the conversation kept for previous_response_id holds the bytes too (a later
    // turn does not fetch them again).
    std::map<std::string, const std::string*> by_url;
    for (size_t k = 0; k < remote.size(); ++k) by_url[remote[k].url] = &bytes[k];
    for (ApiMessage& m : history_) {
      for (ApiContentPart& p : m.content) {
        if (!p.image.has_value() || p.image->url.empty()) continue;
        auto it = by_url.find(p.image->url);
        if (it == by_url.end()) continue;
        p.image->bytes = *it->second;
        p.image->url.clear();
      }
    }
    for (size_t k = 0; k < remote.size(); ++k) {
      ApiImage& image = *request_.messages[remote[k].message].content[remote[k].part].image;
      image.bytes = std::move(bytes[k]);
      image.url.clear();
    }
    ApiError error = CheckImages(request_, context_.limits);
    if (!error.status.ok()) return Fail(error);
  }
  Continue();
}

void ApiCall::EncodeImages() {
  std::vector<const std::string*> bytes;
  std::vector<bool> skip;
  {
    absl::MutexLock lock(&mu_);
    if (answered_) return;  // the client left while the call waited
    // (The images' bytes stay as they are from here on: Continue only reads them.)
    for (const ApiImage* image : CollectImages(request_)) bytes.push_back(&image->bytes);
    skip = expect_cached_;
  }
  const absl::Time deadline = absl::Now() + context_.request_timeout;
  std::vector<std::optional<EncodedImage>> handles(bytes.size());
  std::map<Hash128, size_t> first;  // an image repeated in the request is encoded once
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i < skip.size() && skip[i]) continue;  // predicted cached: not needed
    const Hash128 hash = Xxh3Hash128(*bytes[i]);
    if (auto it = first.find(hash); it != first.end()) {
      handles[i] = handles[it->second];
      continue;
    }
    first[hash] = i;
    absl::StatusOr<EncodedImage> encoded =
        context_.encoders->Encode(*bytes[i], hash, deadline, trace_id_);
    if (!encoded.ok()) {
      LOG(WARNING) << LogTraceId(trace_id_) << "image " << hash.ToHex()
                   << " goes inline (no encoder could encode it: " << encoded.status() << ")";
      context_.metrics->Encode("fallback");
      continue;
    }
    context_.metrics->Encode(encoded->tried > 1 ? "failover" : encoded->cached ? "cached" : "ok");
    handles[i] = *std::move(encoded);
  }
  {
    absl::MutexLock lock(&mu_);
    encoded_ = true;
    handles_ = std::move(handles);
  }
  Continue();
}

std::vector<bool> ApiCall::PredictCachedImages(const BuiltPrompt& prompt,
                                               const PoolInfo& pool) const {
  std::vector<bool> cached(prompt.images.size(), false);
  const std::vector<const ApiImage*> images = CollectImages(request_);
  if (pool.block_tokens <= 0 || images.size() != prompt.images.size()) return cached;
  std::vector<PromptImageSpan> spans;
  int64_t last_end = 0;
  for (size_t i = 0; i < prompt.images.size(); ++i) {
    spans.push_back({Xxh3Hash128(images[i]->bytes), static_cast<uint32_t>(prompt.images[i].start),
                     static_cast<uint32_t>(prompt.images[i].length)});
    last_end = std::max<int64_t>(last_end, prompt.images[i].start + prompt.images[i].length);
  }
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.tokens.size());
  // Only the chain up to the last image's end matters (and no more than a worker may reuse).
  if (ReusableBlocks(prompt_tokens, pool.block_tokens) * pool.block_tokens < last_end) {
    return cached;
  }
  const std::vector<Hash128> hashes = ComputeBlockHashes({pool.fingerprint, tenant_.cache_salt, ""},
                                                         prompt.tokens, pool.block_tokens, spans);
  const int64_t held =
      context_.dispatcher->CachedPositions(hashes, prompt_tokens, pool.block_tokens);
  for (size_t i = 0; i < prompt.images.size(); ++i) {
    cached[i] = prompt.images[i].start + prompt.images[i].length <= held;
  }
  return cached;
}

void ApiCall::Continue() {
  absl::ReleasableMutexLock lock(&mu_);
  if (answered_) return;  // the client left
  const PoolInfo pool = context_.registry->last_pool();
  ApiError error;
  if (!pool.known) {
    return Fail({absl::UnavailableError("no worker has been up yet to serve the model"), "", ""});
  }
  BuiltPrompt prompt;
  error = context_.prompts->Build(request_, pool.max_context_tokens, &prompt);
  if (!error.status.ok()) return Fail(error);
  if (!lowered_) {
    lowered_ = true;
    ConstraintSetup setup;
    setup.tool_format = context_.prompts->tool_setup().format;
    setup.tools_rendered = prompt.tools_rendered;
    setup.reasoning = context_.reasoning;
    setup.reasoning_started = prompt.reasoning_started;
    setup.schema = context_.schema;
    setup.gbnf = context_.gbnf;
    error = LowerOutputConstraint(request_, setup, &constraint_);
    if (!error.status.ok()) {
      context_.metrics->Constraint("refused");
      return Fail(error);
    }
    if (constraint_.has_value())
      context_.metrics->Constraint(ConstraintKindName(constraint_->kind));
  }
  if (!predicted_ && context_.prompts->vision().has_value() && !prompt.images.empty()) {
    // Images whose positions a worker holds are neither encoded nor sent (a miss: a retry).
    predicted_ = true;
    expect_cached_ = PredictCachedImages(prompt, pool);
  }
  if (!encoded_ && context_.encoders != nullptr && context_.encodes != nullptr &&
      context_.prompts->vision().has_value() && !CollectImages(request_).empty()) {
    encoded_ = true;
    size_t to_encode = 0;
    for (size_t i = 0; i < CollectImages(request_).size(); ++i) {
      if (i >= expect_cached_.size() || !expect_cached_[i]) ++to_encode;
    }
    if (to_encode > 0) {
      // The Encode calls block: off this thread. The executor full: the images go inline.
      auto self = shared_from_this();
      if (context_.encodes->Submit([self] { self->EncodeImages(); })) return;
      for (size_t i = 0; i < to_encode; ++i) context_.metrics->Encode("fallback");
    }
  }
  prompt_tokens_ = static_cast<int64_t>(prompt.tokens.size());
  const ApiSampling& s = request_.sampling;
  if (context_.limiter != nullptr) {
    const RateLimiter::Decision d = context_.limiter->Admit(tenant_, prompt_tokens_);
    if (!d.admitted) {
      retry_after_seconds_ = std::max<int64_t>(
          1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(d.retry_after))));
      return Fail(
          {absl::ResourceExhaustedError(absl::StrCat(
               "Rate limit reached for tenant '", tenant_.name, "' (", tenant_.requests_per_minute,
               " requests, ", tenant_.tokens_per_minute,
               " tokens per minute; 0: no limit). Retry after ", retry_after_seconds_, " s.")),
           "", "rate_limit_exceeded"});
    }
  }

  // The worker request: tokens, the pool's block hashes, sampling, the request's life.
  DispatchRequest dispatch;
  dispatch.trace_id = trace_id_;
  dispatch.prompt_tokens = prompt_tokens_;
  dispatch.deadline = absl::Now() + context_.request_timeout;
  v1::GenerateRequest& g = dispatch.request;
  g.set_aggregated(true);
  v1::TokenizedRequest* t = g.mutable_request();
  t->mutable_context()->set_request_id(absl::StrCat("req-", RandomHex(12)));
  t->mutable_context()->set_trace_id(trace_id_);
  t->mutable_context()->set_deadline_unix_ms(absl::ToUnixMillis(dispatch.deadline));
  t->mutable_context()->set_tenant(tenant_.name);
  t->mutable_context()->set_cache_salt(tenant_.cache_salt);
  t->mutable_context()->set_traffic_class(tenant_.traffic_class);
  t->mutable_context()->set_retention_floor_seconds(
      static_cast<uint32_t>(request_.retention_floor_seconds));
  t->mutable_model()->set_name(pool.model_name);
  SetHash(pool.fingerprint, t->mutable_model()->mutable_fingerprint());
  for (TokenId id : prompt.tokens) t->add_prompt_token_ids(id);
  // The images: an encoder's handle (EncodeImages), or their bytes as the client sent them (the
  // worker decodes and encodes them; a retry or migration sends the bytes of those sent by handle:
  // DispatchRequest.inline_images), their content hash, and their placeholder spans, which the
  // block hashes cover.
  std::vector<PromptImageSpan> spans;
  const std::vector<const ApiImage*> images = CollectImages(request_);
  for (size_t i = 0; i < prompt.images.size() && i < images.size(); ++i) {
    v1::PromptImage* image = t->add_images();
    const Hash128 hash = Xxh3Hash128(images[i]->bytes);
    SetHash(hash, image->mutable_content_hash());
    image->set_placeholder_start(static_cast<uint32_t>(prompt.images[i].start));
    image->set_placeholder_length(static_cast<uint32_t>(prompt.images[i].length));
    const std::optional<EncodedImage>* handle = i < handles_.size() ? &handles_[i] : nullptr;
    if (i < expect_cached_.size() && expect_cached_[i]) {
      image->set_expect_cached(true);
      dispatch.inline_images.push_back(images[i]->bytes);
      context_.metrics->Encode("skipped");
    } else if (handle != nullptr && handle->has_value() &&
               (*handle)->num_tokens == static_cast<uint32_t>(prompt.images[i].length)) {
      image->set_embeddings_handle((*handle)->handle);
      image->set_encoder_endpoint((*handle)->endpoint);
      dispatch.inline_images.push_back(images[i]->bytes);
    } else {
      image->set_image_data(images[i]->bytes);
      dispatch.inline_images.emplace_back();
    }
    spans.push_back({hash, static_cast<uint32_t>(prompt.images[i].start),
                     static_cast<uint32_t>(prompt.images[i].length)});
  }
  t->set_block_tokens(pool.block_tokens);
  if (pool.block_tokens > 0) {
    dispatch.block_hashes = ComputeBlockHashes({pool.fingerprint, tenant_.cache_salt, ""},
                                               prompt.tokens, pool.block_tokens, spans);
    for (const Hash128& h : dispatch.block_hashes) SetHash(h, t->add_block_hashes());
  }
  v1::SamplingParams* p = t->mutable_sampling();
  p->set_temperature(s.temperature);
  p->set_top_p(s.top_p);
  p->set_top_k(static_cast<uint32_t>(s.top_k));
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  p->set_presence_penalty(s.presence_penalty);
  for (const auto& [token, bias] : s.logit_bias) {
    v1::LogitBias* b = p->add_logit_biases();
    b->set_token_id(token);
    b->set_bias(bias);
  }
  for (const std::string& stop : s.stop) p->add_stop_strings(stop);
  p->set_ignore_eos(s.ignore_eos);
  p->set_max_tokens(static_cast<uint32_t>(prompt.max_tokens));
  p->set_min_tokens(static_cast<uint32_t>(s.min_tokens));
  p->set_logprobs(s.logprobs);
  p->set_top_logprobs(static_cast<uint32_t>(s.top_logprobs));
  p->set_n(static_cast<uint32_t>(s.n));
  if (kind_ != ApiKind::kCompletion && (prompt.tools_rendered || context_.reasoning)) {
    for (TokenId id : context_.keep_special_token_ids) p->add_keep_special_token_ids(id);
  }
  if (constraint_.has_value()) {
    v1::OutputConstraint* c = p->mutable_constraint();
    c->set_kind(ProtoConstraintKind(constraint_->kind));
    c->set_grammar(constraint_->grammar);
    SetHash(constraint_->hash, c->mutable_hash());
  }
  // A request without a seed gets one, kept for its life (a retry draws the same tokens).
  p->set_seed(s.seed.has_value() ? *s.seed : RandomU64());

  const int64_t created = absl::ToUnixSeconds(absl::Now());
  switch (kind_) {
    case ApiKind::kChatCompletion:
    case ApiKind::kCompletion: {
      ResponseHeader header;
      header.kind = kind_;
      header.id =
          absl::StrCat(kind_ == ApiKind::kChatCompletion ? "chatcmpl-" : "cmpl-", RandomHex(12));
      header.created = created;
      header.model = request_.model;
      header.system_fingerprint = "fp_" + pool.fingerprint.ToHex().substr(0, 12);
      std::string echo;
      if (request_.echo) {
        if (request_.prompt_is_ids) {
          auto text = context_.prompts->tokenizer().Decode(request_.prompt_ids);
          if (text.ok()) echo = *text;
        } else {
          echo = request_.prompt_text;
        }
      }
      writer_ = std::make_unique<OpenAiWriter>(
          header, &context_.prompts->tokenizer(), s.logprobs, echo, request_.include_usage,
          request_.return_token_ids,
          request_.return_token_ids ? prompt.tokens : std::vector<TokenId>());
      break;
    }
    case ApiKind::kMessages:
      writer_ = std::make_unique<AnthropicWriter>(absl::StrCat("msg_", RandomHex(12)),
                                                  request_.model, prompt_tokens_);
      break;
    case ApiKind::kResponses:
      writer_ =
          std::make_unique<ResponsesWriter>(absl::StrCat("resp_", RandomHex(24)), created, request_,
                                            std::move(history_), context_.responses, tenant_.name);
      break;
  }
  choices_.assign(s.n, ChoiceOutputs());
  choice_started_.assign(s.n, false);
  StartParsers(prompt);

  const int64_t prompt_tokens = prompt_tokens_;
  lock.Release();
  // The store's share of the prompt, for the policy (store_probe.h), off this I/O thread: the
  // chain up to the blocks a worker may reuse.
  const int64_t reusable = std::min<int64_t>(ReusableBlocks(prompt_tokens, pool.block_tokens),
                                             dispatch.block_hashes.size());
  if (context_.store_probe != nullptr && reusable > 0) {
    std::vector<Hash128> chain(dispatch.block_hashes.begin(),
                               dispatch.block_hashes.begin() + reusable);
    auto pending = std::make_shared<DispatchRequest>(std::move(dispatch));
    auto self = shared_from_this();
    context_.store_probe->Probe(std::move(chain), pool.fingerprint,
                                [self, pending, reusable](std::optional<int64_t> blocks) {
                                  if (blocks.has_value()) {
                                    // For the policy, and for the worker that reads the prefix (no
                                    // second question).
                                    pending->store_prefix_blocks = *blocks;
                                    v1::StoreHint* hint =
                                        pending->request.mutable_request()->mutable_store_hint();
                                    hint->set_probed_blocks(static_cast<uint32_t>(reusable));
                                    hint->set_prefix_blocks(static_cast<uint32_t>(*blocks));
                                  }
                                  self->Dispatch(std::move(*pending));
                                });
    return;
  }
  Dispatch(std::move(dispatch));
}

void ApiCall::Dispatch(DispatchRequest dispatch) {
  {
    absl::MutexLock lock(&mu_);
    if (answered_) return;  // the client left meanwhile
    dispatched_ = true;     // (before: its end may come before Dispatch returns)
  }
  auto job = context_.dispatcher->Dispatch(std::move(dispatch), shared_from_this());
  absl::ReleasableMutexLock lock(&mu_);
  if (!job.ok()) return Fail({job.status(), "", ""});
  job_ = *job;
  if (answered_) {  // the client left while it was being dispatched
    lock.Release();
    context_.dispatcher->Cancel(*job);
  }
}

void ApiCall::StartParsers(const BuiltPrompt& prompt) {
  parsers_.clear();
  parsers_.resize(choices_.size());
  if (kind_ == ApiKind::kCompletion) return;
  const ToolSetup& setup = context_.prompts->tool_setup();
  for (ChoiceParsers& p : parsers_) {
    if (context_.reasoning) {
      p.reasoning = std::make_unique<ReasoningParser>(prompt.reasoning_started);
    }
    if (!prompt.tools_rendered || !setup.format.has_value()) continue;
    ToolCallParserOptions options;
    if (request_.tool_choice.mode == ApiToolChoice::Mode::kFunction) {
      options.functions = {request_.tool_choice.function};
    } else {
      for (const ApiTool& tool : request_.tools) options.functions.push_back(tool.name);
    }
    options.first_call_only = !request_.parallel_tool_calls;
    if (*setup.format == ToolCallFormat::kMistral) {
      options.call_id = [](int) { return MistralCallId(); };
    } else {
      options.call_id = [](int) { return "call_" + RandomHex(12); };
    }
    p.tools = NewToolCallParser(*setup.format, std::move(options));
  }
}

void ApiCall::ParseText(int32_t c, const std::string& text, int tokens, bool finished,
                        ChoiceOutputs* delta) {
  ChoiceParsers& p = parsers_[c];
  std::string content = text;
  if (p.reasoning != nullptr) {
    std::string reasoning;
    content.clear();
    p.reasoning->Feed(text, &reasoning, &content);
    // Tokens count as reasoning while the block may still be open (by chunk: a chunk that also
    // holds content counts as content).
    if (content.empty() && (p.reasoning->reasoning() || !reasoning.empty())) {
      reasoning_tokens_ += tokens;
    }
    if (finished) p.reasoning->Finish(&reasoning, &content);
    delta->reasoning = std::move(reasoning);
  }
  if (p.tools == nullptr) {
    delta->text = std::move(content);
    return;
  }
  ParsedText parsed;
  p.tools->Feed(content, &parsed);
  if (finished) p.tools->Finish(&parsed);
  delta->text = std::move(parsed.content);
  delta->tool_call_deltas = std::move(parsed.tool_calls);
  if (!finished) return;
  ChoiceOutputs& all = choices_[c];
  for (const ParsedToolCall& call : p.tools->calls()) {
    all.tool_calls.push_back({call.id, call.name, call.arguments});
    context_.metrics->ToolCall(!call.complete         ? "incomplete"
                               : call.arguments_valid ? "valid"
                                                      : "invalid");
  }
  if (!all.tool_calls.empty() && delta->finish_reason == "stop") {
    delta->finish_reason = "tool_calls";
  }
}

void ApiCall::OnRouted(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  worker_ = worker_id;
}

void ApiCall::OnEvent(const v1::GenerateEvent& event) {
  {
    absl::MutexLock lock(&mu_);
    if (answered_) return;
    if (event.has_usage()) {
      usage_.prompt_tokens = event.usage().prompt_tokens();
      usage_.completion_tokens = event.usage().completion_tokens();
      usage_.cached_tokens = event.usage().cached_tokens();
      usage_.store_tokens = event.usage().cached_by_source().store();
      usage_.decode_local_tokens = event.usage().cached_by_source().decode_local();
      has_usage_ = true;
      return;
    }
    if (event.has_error()) {
      error_ = event.error();
      has_error_ = true;
      return;
    }
    if (!event.has_tokens()) return;
    const v1::TokenChunk& chunk = event.tokens();
    if (chunk.choice_index() >= choices_.size()) return;
    const int32_t c = static_cast<int32_t>(chunk.choice_index());
    const Clock::time_point now = Clock::now();
    if (chunk.token_ids_size() > 0) {
      if (!first_token_) {
        first_token_ = true;
        first_token_at_ = now;
        context_.metrics->Ttft(endpoint(), std::chrono::duration<double>(now - start_).count());
      } else {
        tokens_after_first_ += chunk.token_ids_size();
        const double gap =
            std::chrono::duration<double>(now - last_token_).count() / chunk.token_ids_size();
        for (int i = 0; i < chunk.token_ids_size(); ++i) context_.metrics->InterToken(gap);
      }
      last_token_ = now;
    }
    ChoiceOutputs delta;
    for (int i = 0; i < chunk.token_ids_size(); ++i) {
      delta.tokens.push_back(chunk.token_ids(i));
      if (i < chunk.logprobs_size()) {
        TokenLogprob lp;
        lp.token = chunk.logprobs(i).sampled().token_id();
        lp.logprob = chunk.logprobs(i).sampled().logprob();
        for (const auto& alt : chunk.logprobs(i).top_alternatives()) {
          lp.top.emplace_back(alt.token_id(), alt.logprob());
        }
        delta.logprobs.push_back(std::move(lp));
      }
    }
    delta.finish_reason = FinishName(chunk.finish_reason());
    ParseText(c, chunk.text(), chunk.token_ids_size(), !delta.finish_reason.empty(), &delta);
    ChoiceOutputs& all = choices_[c];
    all.text += delta.text;
    all.reasoning += delta.reasoning;
    all.tokens.insert(all.tokens.end(), delta.tokens.begin(), delta.tokens.end());
    all.logprobs.insert(all.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
    delta.matched_stop = chunk.matched_stop_string();
    if (!delta.finish_reason.empty()) {
      all.finish_reason = delta.finish_reason;
      all.matched_stop = delta.matched_stop;
    }
    if (!request_.stream) return;
    StartStream();
    // The events wait in unsent_ for the batch's end: one write per worker message.
    if (!choice_started_[c]) {
      choice_started_[c] = true;
      unsent_ += writer_->StreamStart(c);
    }
    // With return_token_ids a chunk whose text is held back (by the worker's stop strings or the
    // parsers here) still goes out, with its ids.
    if (!delta.text.empty() || !delta.reasoning.empty() || !delta.tool_call_deltas.empty() ||
        !delta.finish_reason.empty() || !delta.logprobs.empty() ||
        (request_.return_token_ids && !delta.tokens.empty())) {
      unsent_ += writer_->StreamDelta(c, delta);
    }
  }
}

void ApiCall::OnBatchEnd() {
  std::shared_ptr<Dispatcher::Job> cancel;
  {
    absl::MutexLock lock(&mu_);
    if (answered_ || unsent_.empty()) return;
    std::string events;
    events.swap(unsent_);
    if (!responder_->Write(std::move(events))) {
      answered_ = true;  // the client stopped reading (or left): cut off, and abort
      cancel = job_.lock();
    }
  }
  if (cancel != nullptr) context_.dispatcher->Cancel(cancel);
}

void ApiCall::OnEnd(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (answered_) {
    Ended(499);
    return;
  }
  int64_t completion = 0;
  for (const ChoiceOutputs& c : choices_) completion += static_cast<int64_t>(c.tokens.size());
  if (!status.ok() || has_error_) {
    absl::Status why = status;
    if (has_error_) {
      why = absl::Status(static_cast<absl::StatusCode>(error_.status_code()), error_.message());
    }
    if (why.code() == absl::StatusCode::kUnavailable || why.code() == absl::StatusCode::kInternal) {
      LOG(WARNING) << LogTraceId(trace_id_) << "request " << trace_id_ << " failed on worker "
                   << worker_ << ": " << why;
    }
    return Fail({why, "", ""});
  }
  if (!has_usage_) {
    usage_.prompt_tokens = prompt_tokens_;
    usage_.completion_tokens = completion;
  }
  usage_.reasoning_tokens = std::min(reasoning_tokens_, usage_.completion_tokens);
  context_.metrics->PromptTokens(usage_.prompt_tokens - usage_.cached_tokens,
                                 usage_.cached_tokens - usage_.store_tokens, usage_.store_tokens,
                                 usage_.decode_local_tokens);
  context_.metrics->CompletionTokens(usage_.completion_tokens);
  if (context_.limiter != nullptr) context_.limiter->Charge(tenant_, usage_.completion_tokens);
  if (context_.billing != nullptr) {
    context_.billing->Record(tenant_.name, request_.model, usage_.prompt_tokens,
                             usage_.cached_tokens, usage_.completion_tokens);
  }
  if (!request_.stream) return Answer(200, writer_->Full(choices_, usage_));
  StartStream();
  std::string events;
  events.swap(unsent_);
  for (size_t c = 0; c < choices_.size(); ++c) {
    if (choice_started_[c]) continue;  // a choice that never sent a chunk still starts
    choice_started_[c] = true;
    events += writer_->StreamStart(static_cast<int32_t>(c));
  }
  events += writer_->StreamEnd(choices_, usage_);
  responder_->Write(std::move(events));
  responder_->Finish();
  answered_ = true;
  Ended(200);
  context_.metrics->RequestSeconds(endpoint(),
                                   std::chrono::duration<double>(Clock::now() - start_).count());
}

}  // namespace ferry
