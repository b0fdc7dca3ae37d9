// ferry bench parse [--quick]: what parsing a request body costs the router, by its shape. Bodies
// of a chat request whose logit_bias has 50,000 or 300,000 keys, and of a completions request
// whose prompt is 1,000,000 token ids, parsed three ways in this run:
//   bounded:  the router's parser (router/api/bounded_json.h: linear, limits checked as it goes;
//             here with limits that take each body whole);
//   ordered:  nlohmann::ordered_json::parse, the router's parser before it (each key inserted
//             after a scan of the object's keys: quadratic in an object's size);
//   json:     nlohmann::json::parse (std::map objects, n log n; the order of keys is lost, which
//             tool schemas need), the floor for a DOM parse with this library.
// Prints a table (best of a few runs, ms) and a final JSON line with the ratios: ordered/bounded
// (what the change saves) and bounded/json (what the order and the limits cost). --quick skips
// ordered on 300,000 keys (minutes: the point of the change).

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "router/api/bounded_json.h"
#include "tools/bench/timing.h"

namespace {

using ferry::bench::BestSeconds;

struct Case {
  std::string name;
  std::string body;
  size_t values;  // keys and array elements
};

std::string ObjectBody(int keys) {
  std::string body = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"logit_bias":{)";
  for (int i = 0; i < keys; ++i) absl::StrAppend(&body, i ? "," : "", "\"", i, "\":-1.5");
  return body + "}}";
}

std::string ArrayBody(int ids) {
  std::string body = R"({"model":"m","prompt":[)";
  for (int i = 0; i < ids; ++i) absl::StrAppend(&body, i ? "," : "", (int64_t{i} * 7919) % 49152);
  return body + "]}";
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const std::vector<Case> cases = {{"object_50k", ObjectBody(50000), 50000 + 5},
                                   {"object_300k", ObjectBody(300000), 300000 + 5},
                                   {"array_1m", ArrayBody(1000000), 1000000 + 2}};
  ferry::JsonLimits limits;  // every body whole: the limits are checked, never met
  limits.max_values = uint64_t{1} << 30;
  limits.max_string_bytes = uint64_t{1} << 30;

  std::printf("request body parse, best of several runs (ordered on 300k keys: one run)\n");
  std::printf("  %-12s %9s %10s %12s %12s %12s %10s %10s\n", "body", "MB", "values", "bounded ms",
              "ordered ms", "json ms", "ord/bnd", "bnd/json");
  std::string json_line = "{\"bench\":\"parse\"";
  volatile size_t sink = 0;
  for (const Case& c : cases) {
    const int reps = c.values > 100000 ? 3 : 5;
    bool ok = true;
    const double bounded = BestSeconds(reps, [&] {
      nlohmann::ordered_json out;
      ok = ok && ferry::ParseBoundedJson(c.body, limits, &out).ok();
      sink += out.size();
    });
    const bool skip_ordered = quick && c.name == "object_300k";
    double ordered = -1;
    if (!skip_ordered) {
      ordered = BestSeconds(c.name == "object_300k" ? 1 : reps,
                            [&] { sink += nlohmann::ordered_json::parse(c.body).size(); });
    }
    const double json = BestSeconds(reps, [&] { sink += nlohmann::json::parse(c.body).size(); });
    if (!ok) {
      std::fprintf(stderr, "the bounded parser refused %s\n", c.name.c_str());
      return 1;
    }
    const double ord_ratio = ordered > 0 ? ordered / bounded : -1;
    const std::string ordered_ms = ordered > 0 ? absl::StrFormat("%.1f", ordered * 1e3) : "skipped";
    const std::string ord_over_bnd = ordered > 0 ? absl::StrFormat("%.1f", ord_ratio) : "-";
    std::printf("  %-12s %9.2f %10zu %12.1f %12s %12.1f %10s %10.2f\n", c.name.c_str(),
                c.body.size() / 1e6, c.values, bounded * 1e3, ordered_ms.c_str(), json * 1e3,
                ord_over_bnd.c_str(), bounded / json);
    absl::StrAppend(&json_line, ",\"", c.name, "_bounded_ms\":", bounded * 1e3, ",\"", c.name,
                    "_ordered_ms\":", ordered > 0 ? ordered * 1e3 : -1, ",\"", c.name,
                    "_json_ms\":", json * 1e3, ",\"", c.name, "_ordered_over_bounded\":", ord_ratio,
                    ",\"", c.name, "_bounded_over_json\":", bounded / json);
  }
  std::printf("%s}\n", json_line.c_str());
  return sink == 42 ? 1 : 0;  // keeps `sink` alive
}
