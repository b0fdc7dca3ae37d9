// Reads the planner's Snapshot (pool_snapshot.h) from the routers: GET /workers and GET /metrics
// of each router's admin port, every request under a deadline, parsed and summed by
// router_view.h. Each router replica is named on its own (its admin host:port): counters and
// queues add up over them, and a worker several routers list counts once.
//
// A router that does not answer (or answers pages that do not parse) counts as not answering
// this time, and its last good view stands in for it: its cumulative counters always (so that the
// sums never drop and then jump back, which the planner would read as a burst), its workers and
// queue only while that view is younger than `keep_stale`. Snapshot.routers counts the routers
// that answered now; 0 tells the planner to hold.
//
// Thread-compatible: one reader per planner loop.

#ifndef FERRY_SERVICES_PLANNER_SNAPSHOT_READER_H_
#define FERRY_SERVICES_PLANNER_SNAPSHOT_READER_H_

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/planner/pool_snapshot.h"
#include "services/planner/router_view.h"

namespace ferry {

struct SnapshotReaderOptions {
  // Admin addresses, host:port: `routers`, or when `discover` is set, what it returns at each
  // read (ferry-planner --routers_dns: the DNS discovery's endpoints; thread-safe). A router that
  // leaves the list leaves the sums (its counters' part shows once as a dip, which the planner
  // reads as no change).
  std::vector<std::string> routers;
  std::function<std::vector<std::string>()> discover;
  absl::Duration timeout = absl::Seconds(5);  // per page
  absl::Duration keep_stale = absl::Seconds(60);
  int64_t max_page_bytes = 16 << 20;
};

// GETs `path` of `address` by `deadline`: the body of a 200 (services/common/http_get.h by
// default; tests give pages of their own).
using PageFetcher = std::function<absl::StatusOr<std::string>(
    const std::string& address, const std::string& path, absl::Time deadline)>;

class SnapshotReader {
 public:
  struct Result {
    Snapshot snapshot;
    // The routers that did not answer now, and why.
    std::vector<std::pair<std::string, absl::Status>> errors;
  };

  explicit SnapshotReader(SnapshotReaderOptions options, PageFetcher fetch = nullptr);

  // Asks every router, one after another, each page by min(now + timeout, deadline); the
  // snapshot's time is `time_s` (the caller's monotonic clock).
  Result Read(double time_s, absl::Time deadline);

  const SnapshotReaderOptions& options() const { return options_; }

 private:
  struct Last {
    RouterView view;
    absl::Time at;
  };

  absl::StatusOr<RouterView> ReadOne(const std::string& address, absl::Time deadline);

  SnapshotReaderOptions options_;
  PageFetcher fetch_;
  std::map<std::string, Last> last_;  // by address
};

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_SNAPSHOT_READER_H_
