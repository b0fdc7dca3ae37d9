// One API call through the router's pipeline, top to bottom (STYLE.md §15):
//
//   parse + validate (the endpoint's adapter: openai_parser, anthropic_parser, responses_parser;
//   Responses put the stored conversation of previous_response_id first) -> prompt
//   (prompt_builder: template, tools, tokens, lengths) -> hash (block hashes with the pool's
//   fingerprint) -> route (dispatcher) -> parse the reply (reasoning_parser, tool_call_parser: per
//   choice, as text arrives) -> write (the adapter's ApiWriter: SSE events as tokens arrive, or one
//   body at the end; a Responses answer is kept in the router's ResponseStore when `store`)
//
// Every endpoint shares validation limits, auth, tenants, rate limits, billing and metrics (by
// endpoint); errors take the endpoint's shape (Anthropic's {"type":"error",...} and status codes
// on /v1/messages, OpenAI's elsewhere).
//
// A choice that called tools finishes with "tool_calls" (when the model stopped by itself; a
// reply cut by max_tokens stays "length", its last call incomplete). A call's arguments are the
// model's text: when they are not a JSON object they are passed on as written (as OpenAI warns
// its clients), and counted in ferry_router_tool_calls_total{arguments="invalid"}. tool_choice
// "required" or a named function constrains the model's reply to calls of the allowed functions
// (output_constraint.h), and only such calls are parsed as calls.
//
// Structured output: the request's output format and forced tool calls are lowered to one
// grammar (output_constraint.h) once its prompt is built, before dispatch (a format that cannot
// be enforced is a 400), and sent in SamplingParams.constraint; a retry or a resume elsewhere
// carries the same one.
//
// Tenants: the call's block hashes carry its tenant's cache salt, its RequestContext the tenant and
// traffic class; its tenant's rate limits admit it once its prompt is counted (429
// rate_limit_exceeded with Retry-After otherwise), and its completion tokens are charged, and
// billed, when it ends.
//
// It answers on its HttpResponder, and cancels its dispatch when the client goes away (the worker
// aborts the request at its next step). Every log line and error body carries its trace id.
//
// Images: the parsers keep a request's remote image URLs unfetched; such a request continues on
// the router's image fetch executor (the fetch blocks), which puts the bytes into the request and
// checks them as inline ones before the prompt is built. Without a fetcher the parsers refuse
// remote URLs.
//
// Thread-safe: the HTTP I/O thread starts it (and, without remote images, runs it up to the
// dispatcher); worker events arrive on gRPC threads.

#ifndef FERRY_ROUTER_API_CALL_H_
#define FERRY_ROUTER_API_CALL_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "router/api/api_request.h"
#include "router/api/api_writer.h"
#include "router/api/image_url_fetcher.h"
#include "router/api/openai_parser.h"
#include "router/api/openai_writer.h"
#include "router/api/output_constraint.h"
#include "router/api/prompt_builder.h"
#include "router/api/reasoning_parser.h"
#include "router/api/response_store.h"
#include "router/api/tool_call_parser.h"
#include "router/auth/api_keys.h"
#include "router/auth/rate_limiter.h"
#include "router/billing.h"
#include "router/dispatch/dispatcher.h"
#include "router/dispatch/store_probe.h"
#include "router/encode/encoder_pool.h"
#include "router/http/http_server.h"
#include "router/image_fetch_executor.h"
#include "router/registry/worker_registry.h"
#include "router/router_metrics.h"
#include "router/slo.h"

namespace ferry {

// What every call of one router shares.
struct ApiContext {
  const PromptBuilder* prompts = nullptr;
  WorkerRegistry* registry = nullptr;
  Dispatcher* dispatcher = nullptr;
  RouterMetrics* metrics = nullptr;
  ApiLimits limits;  // model id, vocabulary; max_n is narrowed to the pool's, json widened for it
  // --max_body_bytes: the body's JSON limits derive from it and the pool's context
  // (RequestJsonLimits).
  uint64_t max_body_bytes = uint64_t{8} << 20;
  bool reasoning = false;  // chat replies go through a <think> reasoning parser
  // The parsers' markers that are special tokens (kept in the worker's text for parsed replies).
  std::vector<TokenId> keep_special_token_ids;
  RateLimiter* limiter = nullptr;  // tenants' limits
  Billing* billing = nullptr;
  ResponseStore* responses = nullptr;  // stored Responses answers
  StoreProbe* store_probe = nullptr;   // the KV store's share of a prompt (null: no store)
  // Remote image URLs (both null: refused by the parsers, ApiLimits.remote_images false): fetched
  // on the executor's threads, each fetch at most image_fetch_timeout.
  ImageUrlFetcher* image_fetcher = nullptr;
  ImageFetchExecutor* image_fetches = nullptr;
  absl::Duration image_fetch_timeout = absl::Seconds(10);
  absl::Duration request_timeout = absl::Minutes(10);
  // Encoders (both null: none; images go inline): with a vision model, a request's images are
  // encoded on `encoders` from the `encodes` executor's threads before the prompt is dispatched,
  // and sent as handles (router/encode/encoder_pool.h); the executor full, or the encoders failing:
  // inline.
  EncoderPool* encoders = nullptr;
  ImageFetchExecutor* encodes = nullptr;
  SloObjectives slo;  // what ferry_router_slo_requests_total judges requests against
  // Structured output (output_constraint.h): the JSON Schema compiler's policies and limits, and
  // the limits of the validating grammar compile.
  grammar::JsonSchemaOptions schema;
  grammar::GbnfLimits gbnf;
};

// The HTTP status and error body of `error` in the shape of `kind`'s API.
int ApiErrorStatus(ApiKind kind, absl::StatusCode code);
std::string ApiErrorBody(ApiKind kind, const ApiError& error, const std::string& trace_id);
// The endpoint's name in metrics ("/v1/chat/completions", "/v1/messages"...).
const char* ApiEndpoint(ApiKind kind);

class ApiCall final : public GenerateSink, public std::enable_shared_from_this<ApiCall> {
 public:
  // Runs the call for `request` (ApiKind from the endpoint) of `tenant` and answers on
  // `responder`.
  static void Run(const ApiContext& context, ApiKind kind, HttpRequest request,
                  std::shared_ptr<HttpResponder> responder, const std::string& trace_id,
                  Tenant tenant);
  // POST /v1/messages/count_tokens: the prompt's tokens as the model would see them
  // ({"input_tokens": n}); nothing is dispatched.
  static void CountTokens(const ApiContext& context, const HttpRequest& request,
                          HttpResponder& responder, const std::string& trace_id);

  void OnRouted(const std::string& worker_id) override;
  void OnEvent(const ferry::v1::GenerateEvent& event) override;
  void OnBatchEnd() override;
  void OnEnd(const absl::Status& status) override;

  ApiCall(const ApiContext& context, ApiKind kind, std::shared_ptr<HttpResponder> responder,
          std::string trace_id, Tenant tenant);

 private:
  using Clock = std::chrono::steady_clock;
  // Parses the request; runs Continue, or hands FetchImages to the image fetch executor when the
  // request has remote images.
  void Start(const HttpRequest& request);
  // Fetches the request's remote images (on an image fetch thread), checks them, then Continue.
  void FetchImages();
  // Encodes the request's images on the encoders (on an encode thread), then Continue; those
  // predicted cached (expect_cached_) are skipped.
  void EncodeImages();
  // Which of `prompt`'s images lie wholly inside the positions a worker that can take the
  // request holds (Dispatcher::CachedPositions over the prompt's block hashes).
  std::vector<bool> PredictCachedImages(const BuiltPrompt& prompt, const PoolInfo& pool) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prompt, hash, writer, then the store probe or Dispatch (first EncodeImages on the encode
  // executor when the request has images and encoders are configured).
  void Continue();
  // Hands the request to the dispatcher (unless the client left).
  void Dispatch(DispatchRequest dispatch);
  // An error answer (a 4xx/5xx with the API's error body), or, once the stream started, an error
  // event and the end of the stream.
  void Fail(const ApiError& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Answer(int status, std::string body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request ended with HTTP `status`: counted in the request and SLO metrics.
  void Ended(int status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const char* endpoint() const;
  // Sets up choice parsers for a prompt.
  void StartParsers(const BuiltPrompt& prompt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the SSE stream (headers) once.
  void StartStream() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a chunk's text through choice `c`'s parsers into `delta` (content, reasoning, tool-call
  // pieces); `finished`: the choice's last chunk (held text is released, finish_reason set).
  void ParseText(int32_t c, const std::string& text, int tokens, bool finished,
                 ChoiceOutputs* delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ApiContext& context_;
  const ApiKind kind_;
  const std::shared_ptr<HttpResponder> responder_;
  const std::string trace_id_;
  const Tenant tenant_;
  const Clock::time_point start_;
  int64_t retry_after_seconds_ = 1;  // a 429's or 503's Retry-After

  absl::Mutex mu_;
  ApiRequest request_ ABSL_GUARDED_BY(mu_);
  std::vector<ApiMessage> history_ ABSL_GUARDED_BY(mu_);  // Responses: the stored conversation
  // The images' encoder handles (CollectImages order; nullopt: sent inline), once encoded_ is set.
  bool encoded_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::optional<EncodedImage>> handles_ ABSL_GUARDED_BY(mu_);
  // The images (CollectImages order) whose positions a worker is predicted to hold
  // (PredictCachedImages): neither encoded nor sent (PromptImage.expect_cached); a retry sends
  // their bytes. Set once, with predicted_.
  bool predicted_ ABSL_GUARDED_BY(mu_) = false;
  // The output constraint (output_constraint.h), lowered once with the first prompt; nullopt
  // after: none.
  bool lowered_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<LoweredConstraint> constraint_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> expect_cached_ ABSL_GUARDED_BY(mu_);
  int64_t prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<ApiWriter> writer_ ABSL_GUARDED_BY(mu_);
  std::vector<ChoiceOutputs> choices_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> choice_started_ ABSL_GUARDED_BY(mu_);  // streaming: its first chunk was sent
  struct ChoiceParsers {
    std::unique_ptr<ReasoningParser> reasoning;
    std::unique_ptr<ToolCallParser> tools;
  };
  std::vector<ChoiceParsers> parsers_ ABSL_GUARDED_BY(mu_);
  int64_t reasoning_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  UsageCounts usage_ ABSL_GUARDED_BY(mu_);
  bool has_usage_ ABSL_GUARDED_BY(mu_) = false;
  bool streaming_ ABSL_GUARDED_BY(mu_) = false;  // the SSE stream has started
  std::string unsent_ ABSL_GUARDED_BY(mu_);      // stream events held until the batch's end
  bool first_token_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point first_token_at_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_token_ ABSL_GUARDED_BY(mu_);
  int64_t tokens_after_first_ ABSL_GUARDED_BY(mu_) = 0;  // output tokens after the first chunk
  bool dispatched_ ABSL_GUARDED_BY(mu_) = false;         // it reached the dispatcher
  // Weak: the dispatcher's job holds this call as its sink until the call ends; a strong handle
  // here would make a cycle that outlives the request.
  std::weak_ptr<Dispatcher::Job> job_ ABSL_GUARDED_BY(mu_);
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  std::string worker_ ABSL_GUARDED_BY(mu_);
  ferry::v1::ErrorInfo error_ ABSL_GUARDED_BY(mu_);
  bool has_error_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_CALL_H_
