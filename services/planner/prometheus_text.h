// Reads the samples of chosen metrics from a Prometheus text exposition (format 0.0.4, what every
// Ferry service's GET /metrics serves): the planner reads the router's counters and gauges this
// way. Lines of other metrics are skipped unread, so a page with series this parser does not know
// (or a format it would refuse) costs nothing as long as the wanted ones are well formed.
//
// Pure functions over text (untrusted input: a bad line is a Status, never a crash; bounded by
// the text's size). Thread-safe.

#ifndef FERRY_SERVICES_PLANNER_PROMETHEUS_TEXT_H_
#define FERRY_SERVICES_PLANNER_PROMETHEUS_TEXT_H_

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

struct PrometheusSample {
  std::string name;  // with its suffix: "ferry_router_queue_wait_seconds_sum"
  std::vector<std::pair<std::string, std::string>> labels;  // in the line's order, unescaped
  double value = 0;                                         // NaN and +-Inf as parsed

  // The value of label `key` ("" when absent).
  std::string Label(absl::string_view key) const;
};

// The samples whose metric name is in `names` (exact names, suffixes included), in the text's
// order. Errors (InvalidArgument, naming the line): a wanted line that is not
// `name[{label="value",...}] value [timestamp]`, a bad escape or value, more than 64 labels.
absl::StatusOr<std::vector<PrometheusSample>> ParsePrometheusText(
    absl::string_view text, const std::set<std::string, std::less<>>& names);

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_PROMETHEUS_TEXT_H_
