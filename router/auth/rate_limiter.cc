#include "router/auth/rate_limiter.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_set.h"

namespace ferry {

void RateLimiter::Refill(Bucket* b, double per_minute, absl::Duration now) const {
  if (!b->started) {
    b->started = true;
    b->level = per_minute;  // a fresh tenant starts with a full minute
    b->at = now;
    return;
  }
  const double seconds = absl::ToDoubleSeconds(now - b->at);
  b->level = std::min(per_minute, b->level + per_minute * seconds / 60.0);
  b->at = now;
}

RateLimiter::Decision RateLimiter::Admit(const Tenant& tenant, int64_t prompt_tokens) {
  Decision d;
  if (tenant.requests_per_minute <= 0 && tenant.tokens_per_minute <= 0) return d;
  const absl::Duration now = clock_->Monotonic();
  absl::MutexLock lock(&mu_);
  auto& [requests, tokens] = buckets_[tenant.name];
  double wait_seconds = 0;
  if (tenant.requests_per_minute > 0) {
    Refill(&requests, tenant.requests_per_minute, now);
    if (requests.level < 1) {
      wait_seconds = (1 - requests.level) * 60.0 / tenant.requests_per_minute;
    }
  }
  if (tenant.tokens_per_minute > 0) {
    Refill(&tokens, tenant.tokens_per_minute, now);
    if (tokens.level < 0) {
      wait_seconds = std::max(wait_seconds, -tokens.level * 60.0 / tenant.tokens_per_minute);
    }
  }
  if (wait_seconds > 0) {
    d.admitted = false;
    d.retry_after = absl::Seconds(wait_seconds);
    return d;
  }
  if (tenant.requests_per_minute > 0) requests.level -= 1;
  if (tenant.tokens_per_minute > 0) tokens.level -= static_cast<double>(prompt_tokens);
  return d;
}

void RateLimiter::Charge(const Tenant& tenant, int64_t n) {
  if (tenant.tokens_per_minute <= 0 || n <= 0) return;
  const absl::Duration now = clock_->Monotonic();
  absl::MutexLock lock(&mu_);
  Bucket& tokens = buckets_[tenant.name].second;
  Refill(&tokens, tenant.tokens_per_minute, now);
  tokens.level -= static_cast<double>(n);
}

void RateLimiter::Retain(const std::vector<Tenant>& tenants) {
  absl::flat_hash_set<std::string> names;
  for (const Tenant& t : tenants) names.insert(t.name);
  absl::MutexLock lock(&mu_);
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    if (!names.contains(it->first)) {
      buckets_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace ferry
