#include "services/planner/snapshot_reader.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/common/http_get.h"

namespace ferry {

SnapshotReader::SnapshotReader(SnapshotReaderOptions options, PageFetcher fetch)
    : options_(std::move(options)), fetch_(std::move(fetch)) {
  if (!fetch_) {
    HttpGetOptions http;
    http.max_body_bytes = options_.max_page_bytes;
    http.user_agent = "ferry-planner";
    fetch_ = [http](const std::string& address, const std::string& path, absl::Time deadline) {
      return HttpGet(address, path, deadline, http);
    };
  }
}

absl::StatusOr<RouterView> SnapshotReader::ReadOne(const std::string& address,
                                                   absl::Time deadline) {
  auto workers = fetch_(address, "/workers", std::min(deadline, absl::Now() + options_.timeout));
  if (!workers.ok()) return workers.status();
  auto metrics = fetch_(address, "/metrics", std::min(deadline, absl::Now() + options_.timeout));
  if (!metrics.ok()) return metrics.status();
  return ParseRouterView(*workers, *metrics);
}

SnapshotReader::Result SnapshotReader::Read(double time_s, absl::Time deadline) {
  Result result;
  std::vector<RouterView> views;
  int answered = 0;
  const std::vector<std::string> routers =
      options_.discover ? options_.discover() : options_.routers;
  for (auto it = last_.begin(); it != last_.end();) {  // routers gone from the list
    if (std::find(routers.begin(), routers.end(), it->first) == routers.end()) {
      it = last_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& address : routers) {
    auto view = ReadOne(address, deadline);
    const absl::Time now = absl::Now();
    if (view.ok()) {
      ++answered;
      last_[address] = Last{*view, now};
      views.push_back(std::move(*view));
      continue;
    }
    result.errors.emplace_back(address, view.status());
    const auto it = last_.find(address);
    if (it == last_.end()) continue;
    RouterView stand_in;
    stand_in.counters = it->second.view.counters;
    stand_in.queue_wait_seconds_sum = it->second.view.queue_wait_seconds_sum;
    stand_in.queue_wait_count = it->second.view.queue_wait_count;
    if (now - it->second.at <= options_.keep_stale) {
      stand_in.workers = it->second.view.workers;
      stand_in.queued_requests = it->second.view.queued_requests;
      stand_in.queued_tokens = it->second.view.queued_tokens;
    }
    views.push_back(std::move(stand_in));
  }
  result.snapshot = MergeRouterViews(views, time_s);
  result.snapshot.routers = answered;
  return result;
}

}  // namespace ferry
