// The router's Prometheus metrics (ARCHITECTURE.md §9), on its admin port's registry:
//
//   ferry_router_requests_total{endpoint,code}   API requests by endpoint and HTTP status
//   ferry_router_ttft_seconds{endpoint}          request received -> first token sent
//   ferry_router_inter_token_seconds             between consecutive tokens of a stream
//   ferry_router_request_seconds{endpoint}       request received -> last byte
//   ferry_router_queue_depth                     requests waiting for a worker
//   ferry_router_routing_decisions_total{policy,worker}
//   ferry_router_retries_total                   requests sent to another worker before a token
//   ferry_router_prompt_tokens_total{source}     computed, prefill_memory (reused from the
//                                                memory of the worker that computed the prompt),
//                                                store (read from the KV store): these three sum
//                                                to the prompt tokens; decode_memory (held by the
//                                                decode worker already, so not pushed: a part of
//                                                the others)
//   ferry_router_completion_tokens_total
//   ferry_router_workers{state}                  up, down
//   ferry_router_worker_refusals_total{reason}   fingerprint, block_tokens, protocol
//   ferry_router_tool_calls_total{arguments}     calls parsed from replies: valid (a JSON
//                                                object), invalid, incomplete (cut off)
//
// Thread-safe.

#ifndef FERRY_ROUTER_ROUTER_METRICS_H_
#define FERRY_ROUTER_ROUTER_METRICS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ferry {

class RouterMetrics {
 public:
  explicit RouterMetrics(prometheus::Registry& registry);

  void Request(const std::string& endpoint, int code);
  void Ttft(const std::string& endpoint, double seconds);
  void InterToken(double seconds);
  void RequestSeconds(const std::string& endpoint, double seconds);
  void QueueDepth(int64_t depth);
  void Routed(const std::string& policy, const std::string& worker);
  void Retry();
  void PromptTokens(int64_t computed, int64_t prefill_memory, int64_t store, int64_t decode_memory);
  void CompletionTokens(int64_t n);
  void Workers(int64_t up, int64_t down);
  void Refusal(const std::string& reason);
  void ToolCall(const std::string& arguments);

 private:
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* ttft_;
  prometheus::Histogram* inter_token_;
  prometheus::Family<prometheus::Histogram>* request_seconds_;
  prometheus::Gauge* queue_depth_;
  prometheus::Family<prometheus::Counter>* routed_;
  prometheus::Counter* retries_;
  prometheus::Counter* prompt_computed_;
  prometheus::Counter* prompt_prefill_memory_;
  prometheus::Counter* prompt_store_;
  prometheus::Counter* prompt_decode_memory_;
  prometheus::Counter* completion_;
  prometheus::Gauge* workers_up_;
  prometheus::Gauge* workers_down_;
  prometheus::Family<prometheus::Counter>* refusals_;
  prometheus::Family<prometheus::Counter>* tool_calls_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_ROUTER_METRICS_H_
