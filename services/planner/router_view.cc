#include "services/planner/router_view.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/planner/prometheus_text.h"

namespace ferry {

namespace {

using Json = nlohmann::json;

// The deepest nesting of `text`'s arrays and objects, or kMaxJsonDepth + 1 once past it (checked
// before parsing: a hostile page of a million '[' never reaches the parser's recursion).
int JsonDepth(absl::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxJsonDepth) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Typed reads of one worker's object: a missing field keeps the default; a present one of the
// wrong type or out of range is an error.
class Fields {
 public:
  Fields(const Json& object, size_t index) : object_(object), index_(index) {}

  absl::Status status() const { return status_; }

  std::string String(const char* key, const std::string& otherwise = "") {
    const Json* v = Find(key);
    if (v == nullptr) return otherwise;
    if (!v->is_string()) {
      Fail(key, "is not a string");
      return otherwise;
    }
    return v->get<std::string>();
  }

  bool Bool(const char* key) {
    const Json* v = Find(key);
    if (v == nullptr) return false;
    if (!v->is_boolean()) {
      Fail(key, "is not a boolean");
      return false;
    }
    return v->get<bool>();
  }

  // A count: a non-negative integer (a float with no fraction too), at most 2^53.
  int64_t Count(const char* key) {
    const Json* v = Find(key);
    if (v == nullptr) return 0;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > kMaxCount) {
        Fail(key, "is out of range");
        return 0;
      }
      return static_cast<int64_t>(u);
    }
    if (v->is_number_integer()) {
      const int64_t i = v->get<int64_t>();
      if (i < 0) {
        Fail(key, "is negative");
        return 0;
      }
      return i;
    }
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (!(d >= 0 && d <= static_cast<double>(kMaxCount)) || d != std::floor(d)) {
        Fail(key, "is not a count");
        return 0;
      }
      return static_cast<int64_t>(d);
    }
    Fail(key, "is not a number");
    return 0;
  }

  // A finite, non-negative measurement.
  double Measure(const char* key) {
    const Json* v = Find(key);
    if (v == nullptr) return 0;
    if (!v->is_number()) {
      Fail(key, "is not a number");
      return 0;
    }
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < 0) {
      Fail(key, "is negative or not finite");
      return 0;
    }
    return d;
  }

  // The nested object `key` (an empty one when absent).
  const Json& Object(const char* key) {
    static const Json* const kEmpty = new Json(Json::object());
    const Json* v = Find(key);
    if (v == nullptr) return *kEmpty;
    if (!v->is_object()) {
      Fail(key, "is not an object");
      return *kEmpty;
    }
    return *v;
  }

 private:
  static constexpr uint64_t kMaxCount = uint64_t{1} << 53;

  const Json* Find(const char* key) const {
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  void Fail(const char* key, const char* why) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("GET /workers: worker ", index_, ": \"", key, "\" ", why));
    }
  }

  const Json& object_;
  const size_t index_;
  absl::Status status_;
};

// Counters are sent as doubles; the planner's are integers. A router's sum of one counter stays
// within 2^53 (a double's integers), so sums over routers cannot overflow.
absl::Status ToCount(const PrometheusSample& s, int64_t* out) {
  constexpr int64_t kMax = int64_t{1} << 53;
  if (!std::isfinite(s.value) || s.value < 0 || s.value > static_cast<double>(kMax)) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: ", s.name, " is ", s.value));
  }
  const int64_t v = static_cast<int64_t>(std::llround(s.value));
  if (*out > kMax - v) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: ", s.name, " sums over 2^53"));
  }
  *out += v;
  return absl::OkStatus();
}

const std::set<std::string, std::less<>>& WantedMetrics() {
  static const auto* const kNames = new std::set<std::string, std::less<>>{
      "ferry_router_requests_total",
      "ferry_router_prompt_tokens_total",
      "ferry_router_completion_tokens_total",
      "ferry_router_slo_requests_total",
      "ferry_router_queue_wait_seconds_sum",
      "ferry_router_queue_wait_seconds_count",
      "ferry_router_queue_depth",
      "ferry_router_queued_tokens",
  };
  return *kNames;
}

}  // namespace

absl::StatusOr<std::vector<ListedWorker>> ParseRouterWorkers(absl::string_view body) {
  if (JsonDepth(body) > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("GET /workers: nested deeper than ", kMaxJsonDepth));
  }
  const Json json = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("GET /workers: not JSON");
  if (!json.is_array()) return absl::InvalidArgumentError("GET /workers: not a JSON array");
  if (json.size() > kMaxWorkersListed) {
    return absl::InvalidArgumentError(
        absl::StrCat("GET /workers: ", json.size(), " workers, more than ", kMaxWorkersListed));
  }
  std::vector<ListedWorker> out;
  for (size_t i = 0; i < json.size(); ++i) {
    const Json& w = json[i];
    if (!w.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("GET /workers: entry ", i, " not an object"));
    }
    Fields f(w, i);
    ListedWorker listed;
    WorkerSample& s = listed.sample;
    s.id = f.String("id");
    const std::string state = f.String("state");
    const std::string role = f.String("role");
    const std::string drain = f.String("drain_state");
    const bool accepted = f.Bool("accepted");
    const Json& load = f.Object("load");
    Fields l(load, i);
    s.busy_fraction = std::min(1.0, l.Measure("busy_fraction"));
    s.prefill_tokens_per_second = l.Measure("prefill_tokens_per_second");
    s.decode_tokens_per_second = l.Measure("decode_tokens_per_second");
    s.step_time_ms = l.Measure("step_time_ms");
    s.running_requests = l.Count("running_requests");
    s.queued_requests = l.Count("queued_requests");
    s.queued_tokens = l.Count("queued_tokens");
    s.running_tokens = l.Count("running_tokens");
    s.free_kv_blocks = l.Count("free_kv_blocks");
    s.cached_kv_blocks = l.Count("cached_kv_blocks");
    s.max_running_requests = f.Count("max_running_requests");
    s.block_tokens = f.Count("block_tokens");
    s.total_kv_blocks = f.Count("total_kv_blocks");
    s.inflight = f.Count("inflight");
    s.pending_prefill_tokens = f.Count("pending_prefill_tokens");
    s.active_tokens = f.Count("active_tokens");
    listed.last_message_ms_ago = f.Count("last_message_ms_ago");
    for (const Fields* fields : {&f, &l}) {
      if (!fields->status().ok()) return fields->status();
    }
    if (s.id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("GET /workers: entry ", i, " has no id"));
    }
    if (state == "removed" || role.empty()) continue;  // left the list, or in no pool yet
    if (!ParsePoolRole(role, &listed.pool)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GET /workers: worker ", s.id, ": unknown role \"", role, "\""));
    }
    s.draining = drain == "DRAIN_STATE_DRAINING" || drain == "DRAIN_STATE_DRAINED";
    s.ready = state == "up" && accepted && !s.draining;
    out.push_back(std::move(listed));
  }
  return out;
}

absl::Status ParseRouterMetrics(absl::string_view body, RouterView* view) {
  auto samples = ParsePrometheusText(body, WantedMetrics());
  if (!samples.ok()) return samples.status();
  RouterCounters& c = view->counters;
  for (const PrometheusSample& s : *samples) {
    absl::Status status;
    if (s.name == "ferry_router_requests_total") {
      status = ToCount(s, &c.requests);
    } else if (s.name == "ferry_router_prompt_tokens_total") {
      const std::string source = s.Label("source");
      if (source == "computed") {
        status = ToCount(s, &c.computed_prompt_tokens);
        if (status.ok()) status = ToCount(s, &c.prompt_tokens);
      } else if (source == "prefill_memory" || source == "store") {
        status = ToCount(s, &c.prompt_tokens);
      }
    } else if (s.name == "ferry_router_completion_tokens_total") {
      status = ToCount(s, &c.completion_tokens);
    } else if (s.name == "ferry_router_slo_requests_total") {
      const std::string objective = s.Label("objective"), result = s.Label("result");
      int64_t* counter = nullptr;
      if (objective == "ttft") counter = result == "met" ? &c.ttft_met : &c.ttft_missed;
      if (objective == "itl") counter = result == "met" ? &c.itl_met : &c.itl_missed;
      if (counter != nullptr && (result == "met" || result == "missed")) {
        status = ToCount(s, counter);
      }
    } else if (s.name == "ferry_router_queue_wait_seconds_sum" ||
               s.name == "ferry_router_queue_wait_seconds_count") {
      PoolRole pool;
      if (!ParsePoolRole(s.Label("pool"), &pool)) continue;
      const int p = static_cast<int>(pool);
      if (s.name == "ferry_router_queue_wait_seconds_count") {
        status = ToCount(s, &view->queue_wait_count[p]);
      } else if (!std::isfinite(s.value) || s.value < 0) {
        status = absl::InvalidArgumentError(absl::StrCat("metrics: ", s.name, " is ", s.value));
      } else {
        view->queue_wait_seconds_sum[p] += s.value;
      }
    } else if (s.name == "ferry_router_queue_depth") {
      status = ToCount(s, &view->queued_requests);
    } else if (s.name == "ferry_router_queued_tokens") {
      status = ToCount(s, &view->queued_tokens);
    }
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<RouterView> ParseRouterView(absl::string_view workers_body,
                                           absl::string_view metrics_body) {
  RouterView view;
  auto workers = ParseRouterWorkers(workers_body);
  if (!workers.ok()) return workers.status();
  view.workers = std::move(*workers);
  if (absl::Status s = ParseRouterMetrics(metrics_body, &view); !s.ok()) return s;
  return view;
}

Snapshot MergeRouterViews(const std::vector<RouterView>& views, double time_s) {
  Snapshot snapshot;
  snapshot.time_s = time_s;
  snapshot.routers = static_cast<int>(views.size());
  // Per worker id: its entry in its pool, and the age of the report it carries.
  std::map<std::string, std::pair<PoolRole, size_t>> seen;
  std::map<std::string, int64_t> age;
  for (const RouterView& v : views) {
    RouterCounters& c = snapshot.counters;
    c.requests += v.counters.requests;
    c.prompt_tokens += v.counters.prompt_tokens;
    c.computed_prompt_tokens += v.counters.computed_prompt_tokens;
    c.completion_tokens += v.counters.completion_tokens;
    c.ttft_met += v.counters.ttft_met;
    c.ttft_missed += v.counters.ttft_missed;
    c.itl_met += v.counters.itl_met;
    c.itl_missed += v.counters.itl_missed;
    snapshot.queued_requests += v.queued_requests;
    snapshot.queued_tokens += v.queued_tokens;
    for (int p = 0; p < kPoolRoles; ++p) {
      snapshot.pools[p].queue_wait_seconds_sum += v.queue_wait_seconds_sum[p];
      snapshot.pools[p].queue_wait_count += v.queue_wait_count[p];
    }
    for (const ListedWorker& w : v.workers) {
      const auto it = seen.find(w.sample.id);
      if (it == seen.end()) {
        std::vector<WorkerSample>& pool = snapshot.pool(w.pool).workers;
        seen[w.sample.id] = {w.pool, pool.size()};
        age[w.sample.id] = w.last_message_ms_ago;
        pool.push_back(w.sample);
        continue;
      }
      WorkerSample& have = snapshot.pool(it->second.first).workers[it->second.second];
      const int64_t inflight = have.inflight + w.sample.inflight;
      const int64_t pending = have.pending_prefill_tokens + w.sample.pending_prefill_tokens;
      const int64_t active = have.active_tokens + w.sample.active_tokens;
      const bool ready = have.ready || w.sample.ready;
      const bool draining = have.draining || w.sample.draining;
      if (w.last_message_ms_ago < age[w.sample.id] && w.pool == it->second.first) {
        have = w.sample;  // a fresher report of its load
        age[w.sample.id] = w.last_message_ms_ago;
      }
      have.inflight = inflight;
      have.pending_prefill_tokens = pending;
      have.active_tokens = active;
      have.draining = draining;
      have.ready = ready && !draining;
    }
  }
  return snapshot;
}

}  // namespace ferry
