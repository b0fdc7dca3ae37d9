#include "services/planner/pool_snapshot.h"

#include <algorithm>

namespace ferry {

const char* PoolRoleName(PoolRole role) {
  switch (role) {
    case PoolRole::kPrefill:
      return "prefill";
    case PoolRole::kDecode:
      return "decode";
    case PoolRole::kAggregated:
      return "aggregated";
  }
  return "unknown";
}

bool ParsePoolRole(const std::string& name, PoolRole* role) {
  if (name == "prefill") {
    *role = PoolRole::kPrefill;
  } else if (name == "decode") {
    *role = PoolRole::kDecode;
  } else if (name == "aggregated" || name == "worker") {
    *role = PoolRole::kAggregated;
  } else {
    return false;
  }
  return true;
}

double KvUsedFraction(const WorkerSample& w) {
  if (w.total_kv_blocks <= 0 || w.block_tokens <= 0) return 0;
  const int64_t not_free = w.total_kv_blocks - w.free_kv_blocks;
  const int64_t not_cache = not_free - w.cached_kv_blocks;
  const int64_t positions = (w.running_tokens + w.block_tokens - 1) / w.block_tokens;
  const int64_t held = std::max<int64_t>(0, std::min(not_free, std::max(positions, not_cache)));
  return std::min(1.0, static_cast<double>(held) / static_cast<double>(w.total_kv_blocks));
}

double RunningFraction(const WorkerSample& w) {
  if (w.max_running_requests <= 0) return 0;
  return std::min(
      1.0, static_cast<double>(w.running_requests) / static_cast<double>(w.max_running_requests));
}

}  // namespace ferry
