// Service-level objectives (SLOs) the router judges its requests against, for a planner that
// sizes the prefill and decode pools (docs/operations/metrics.md): the time to the first token
// (TTFT, the prefill pool's and the queue's doing) and the inter-token latency (ITL, the decode
// pool's). Each request counts at most once per objective in
// ferry_router_slo_requests_total{objective, result}:
//
//   ttft  met when its first token came within --slo_ttft of its arrival; missed when it came
//         later, or when the request failed with no token (a 5xx, or 429 from a full queue).
//         Requests refused before they reached the dispatcher (bad input, a tenant's rate
//         limit) and ones the client left before a token are not judged.
//   itl   met when its mean time between output tokens (from its first token to its last, over
//         the tokens after the first, all choices together) is within --slo_itl; requests with
//         fewer than two tokens are not judged. The mean, not the worst gap: a planner compares
//         the decode pool's steady speed with the objective, and a single long gap (a migration,
//         a hand-off) shows in the ferry_router_inter_token_seconds histogram instead.
//
// A pure function over what the router saw of the request (STYLE.md §21). Thread-compatible.

#ifndef FERRY_ROUTER_SLO_H_
#define FERRY_ROUTER_SLO_H_

#include <cstdint>

#include "absl/time/time.h"

namespace ferry {

struct SloObjectives {
  absl::Duration ttft = absl::Seconds(2);
  absl::Duration itl = absl::Milliseconds(200);
};

// What the router saw of one request by its end.
struct SloRecord {
  bool dispatched = false;  // it reached the dispatcher (queued, started, or refused there)
  bool failed = false;      // it ended with a 5xx, or a 429 (the queue was full)
  bool first_token = false;
  double ttft_seconds = 0;         // arrival -> first token
  double decode_seconds = 0;       // first token -> last token
  int64_t tokens_after_first = 0;  // output tokens after the first token's chunk
};

enum class SloResult { kNotJudged, kMet, kMissed };

struct SloJudgement {
  SloResult ttft = SloResult::kNotJudged;
  SloResult itl = SloResult::kNotJudged;
};

SloJudgement JudgeSlo(const SloRecord& request, const SloObjectives& objectives);

}  // namespace ferry

#endif  // FERRY_ROUTER_SLO_H_
