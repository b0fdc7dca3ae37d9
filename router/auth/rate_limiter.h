// Per-tenant rate limits (requests and tokens per minute) as token buckets: each holds at most a
// minute's allowance and refills continuously. A request is admitted when its tenant's request
// bucket holds a whole request and its token bucket is not in debt; admission takes the request
// and the prompt's tokens, and the completion's tokens are charged when they are known (a bucket
// may go into debt: the next requests wait until it has refilled). A refusal says how long until
// the request would be admitted (Retry-After).
//
// Buckets are kept per tenant name, so limits carry over a key-file reload; a reload drops the
// buckets of tenants that are gone (the number of buckets is bounded by the key file).
//
// Thread-safe.

#ifndef FERRY_ROUTER_AUTH_RATE_LIMITER_H_
#define FERRY_ROUTER_AUTH_RATE_LIMITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "router/auth/api_keys.h"

namespace ferry {

class RateLimiter {
 public:
  explicit RateLimiter(Clock* clock) : clock_(clock) {}

  struct Decision {
    bool admitted = true;
    absl::Duration retry_after;  // when refused
  };
  Decision Admit(const Tenant& tenant, int64_t prompt_tokens);
  void Charge(const Tenant& tenant, int64_t tokens);
  // Keeps only these tenants' buckets.
  void Retain(const std::vector<Tenant>& tenants);

 private:
  struct Bucket {
    double level = 0;
    absl::Duration at;
    bool started = false;
  };
  // Refills `b` (a minute's allowance `per_minute`) to now.
  void Refill(Bucket* b, double per_minute, absl::Duration now) const;

  Clock* const clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::pair<Bucket, Bucket>> buckets_
      ABSL_GUARDED_BY(mu_);  // requests, tokens
};

}  // namespace ferry

#endif  // FERRY_ROUTER_AUTH_RATE_LIMITER_H_
