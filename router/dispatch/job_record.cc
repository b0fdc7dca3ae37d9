#include "router/dispatch/job_record.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry {

std::string JobRecord::AttemptId() const {
  return attempts <= 1 ? request_id : absl::StrCat(request_id, ".a", attempts);
}

RouteRequest JobRecord::Route() const {
  RouteRequest r;
  r.prompt_tokens = prompt_tokens + resumed_tokens;
  r.block_hashes = block_hashes;
  r.block_tokens = block_tokens;
  r.store_prefix_blocks = store_prefix_blocks;
  return r;
}

int64_t JobRecord::Uncached(const RouteChoice& choice) const {
  return std::max<int64_t>(0, prompt_tokens + resumed_tokens - choice.predicted_local_tokens -
                                  choice.predicted_store_tokens);
}

bool JobRecord::AllChoicesFinished() const {
  if (static_cast<int32_t>(progress.size()) != choices) return false;
  for (const ChoiceProgress& p : progress) {
    if (!p.finished) return false;
  }
  return true;
}

int64_t JobRecord::ReceivedTokens() const {
  int64_t n = 0;
  for (const ChoiceProgress& p : progress) n += static_cast<int64_t>(p.tokens.size());
  return n;
}

namespace {
// Choices a record keeps at most (a request's n is far below it).
constexpr uint32_t kMaxTrackedChoices = 4096;
}  // namespace

TrackResult Track(JobRecord* job, const ReceivedChunk& chunk, int64_t total_tracked,
                  const TrackingLimits& limits, int64_t* delta) {
  *delta = 0;
  if (!job->tracked) return TrackResult::kNotTracked;
  const int64_t n = static_cast<int64_t>(chunk.token_ids.size());
  bool consistent = chunk.choice < kMaxTrackedChoices;
  if (consistent && chunk.choice >= job->progress.size()) job->progress.resize(chunk.choice + 1);
  if (consistent) {
    consistent = chunk.first_output_index == job->progress[chunk.choice].tokens.size();
  }
  const bool fits = job->tracked_tokens + n <= limits.max_tokens_per_request &&
                    total_tracked + n <= limits.max_tokens;
  if (!consistent || !fits) {
    job->tracked = false;
    *delta = -Untrack(job);
    return consistent ? TrackResult::kOverCap : TrackResult::kInconsistent;
  }
  ChoiceProgress& p = job->progress[chunk.choice];
  p.tokens.insert(p.tokens.end(), chunk.token_ids.begin(), chunk.token_ids.end());
  p.tail = chunk.tail;
  if (chunk.finished) p.finished = true;
  job->tracked_tokens += n;
  *delta = n;
  return TrackResult::kAdded;
}

int64_t Untrack(JobRecord* job) {
  const int64_t released = job->tracked_tokens;
  job->tracked_tokens = 0;
  job->progress.clear();
  job->progress.shrink_to_fit();
  return released;
}

}  // namespace ferry
