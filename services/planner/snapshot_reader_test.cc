#include "services/planner/snapshot_reader.h"

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/common/admin_server.h"

namespace ferry {
namespace {

std::string Testdata(const std::string& name) {
  std::ifstream in("services/planner/testdata/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Routers as a map address -> path -> page; an absent page is Unavailable.
struct FakeRouters {
  std::map<std::string, std::map<std::string, std::string>> pages;
  std::vector<std::pair<std::string, absl::Time>> asked;

  PageFetcher Fetcher() {
    return [this](const std::string& address, const std::string& path,
                  absl::Time deadline) -> absl::StatusOr<std::string> {
      asked.emplace_back(address + path, deadline);
      const auto router = pages.find(address);
      if (router == pages.end()) return absl::UnavailableError("connection refused");
      const auto page = router->second.find(path);
      if (page == router->second.end()) return absl::UnavailableError("HTTP 503");
      return page->second;
    };
  }
};

TEST(SnapshotReaderTest, SumsTheRoutersThatAnswer) {
  FakeRouters routers;
  routers.pages["r1:9"] = {{"/workers", Testdata("workers_pd_under_load.json")},
                           {"/metrics", Testdata("metrics_pd_under_load.txt")}};
  routers.pages["r2:9"] = {{"/workers", Testdata("workers_pd_idle.json")},
                           {"/metrics", Testdata("metrics_pd_idle.txt")}};
  SnapshotReaderOptions options;
  options.routers = {"r1:9", "r2:9", "r3:9"};
  options.timeout = absl::Seconds(2);
  SnapshotReader reader(options, routers.Fetcher());
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  SnapshotReader::Result got = reader.Read(5, deadline);
  EXPECT_EQ(got.snapshot.routers, 2);
  EXPECT_EQ(got.snapshot.time_s, 5);
  ASSERT_EQ(got.errors.size(), 1u);
  EXPECT_EQ(got.errors[0].first, "r3:9");
  EXPECT_EQ(got.errors[0].second.code(), absl::StatusCode::kUnavailable);
  auto one = ParseRouterView(Testdata("workers_pd_under_load.json"),
                             Testdata("metrics_pd_under_load.txt"));
  auto two = ParseRouterView(Testdata("workers_pd_idle.json"), Testdata("metrics_pd_idle.txt"));
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(got.snapshot.counters.completion_tokens,
            one->counters.completion_tokens + two->counters.completion_tokens);
  EXPECT_EQ(got.snapshot.pool(PoolRole::kDecode).workers.size(), 2u);
  // Every page under the deadline, never later than it.
  ASSERT_EQ(routers.asked.size(), 5u);  // r3 fails at its first page
  for (const auto& [page, page_deadline] : routers.asked) EXPECT_LE(page_deadline, deadline);
}

TEST(SnapshotReaderTest, ARouterThatStopsAnsweringKeepsItsCountersAndLosesItsWorkers) {
  FakeRouters routers;
  routers.pages["r1:9"] = {{"/workers", Testdata("workers_pd_under_load.json")},
                           {"/metrics", Testdata("metrics_pd_idle.txt")}};
  SnapshotReaderOptions options;
  options.routers = {"r1:9"};
  options.keep_stale = absl::ZeroDuration();  // its workers go at once
  SnapshotReader reader(options, routers.Fetcher());
  const SnapshotReader::Result first = reader.Read(1, absl::Now() + absl::Seconds(1));
  ASSERT_EQ(first.snapshot.routers, 1);
  ASSERT_GT(first.snapshot.counters.requests, 0);
  // Its /metrics now fails: the counters stand (no drop for the planner to misread), the
  // workers are not listed, and it does not count as answering.
  routers.pages["r1:9"].erase("/metrics");
  const SnapshotReader::Result second = reader.Read(2, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(second.snapshot.routers, 0);
  ASSERT_EQ(second.errors.size(), 1u);
  EXPECT_EQ(second.snapshot.counters.requests, first.snapshot.counters.requests);
  EXPECT_EQ(second.snapshot.counters.computed_prompt_tokens,
            first.snapshot.counters.computed_prompt_tokens);
  EXPECT_TRUE(second.snapshot.pool(PoolRole::kDecode).workers.empty());
}

TEST(SnapshotReaderTest, AStaleViewStandsInWhileYoung) {
  FakeRouters routers;
  routers.pages["r1:9"] = {{"/workers", Testdata("workers_pd_under_load.json")},
                           {"/metrics", Testdata("metrics_pd_idle.txt")}};
  SnapshotReaderOptions options;
  options.routers = {"r1:9"};
  options.keep_stale = absl::Hours(1);
  SnapshotReader reader(options, routers.Fetcher());
  ASSERT_EQ(reader.Read(1, absl::Now() + absl::Seconds(1)).snapshot.routers, 1);
  routers.pages["r1:9"]["/workers"] = "garbage";  // answers, but nothing that parses
  const SnapshotReader::Result stale = reader.Read(2, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(stale.snapshot.routers, 0);
  ASSERT_EQ(stale.errors.size(), 1u);
  EXPECT_EQ(stale.errors[0].second.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stale.snapshot.pool(PoolRole::kDecode).workers.size(), 2u);
}

TEST(SnapshotReaderTest, ReadsARouterOverHttp) {
  // A router's admin port serving the recorded pages.
  const std::string workers = Testdata("workers_pd_under_load.json");
  const std::string metrics = Testdata("metrics_pd_under_load.txt");
  AdminServerOptions admin;
  admin.routes = [&](const std::string& method, const std::string& path, const std::string&,
                     AdminReply* reply) {
    if (method != "GET" || path != "/workers") return false;
    reply->body = workers;
    return true;
  };
  auto server = AdminServer::Start(admin, nullptr);
  ASSERT_TRUE(server.ok());
  SnapshotReaderOptions options;
  options.routers = {absl::StrCat("127.0.0.1:", (*server)->port())};
  SnapshotReader reader(options);
  // No /metrics there (no registry): a 404, so the router did not answer.
  SnapshotReader::Result got = reader.Read(1, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(got.snapshot.routers, 0);
  ASSERT_EQ(got.errors.size(), 1u);
  EXPECT_EQ(got.errors[0].second.code(), absl::StatusCode::kNotFound) << got.errors[0].second;
  // With the metrics page too.
  admin.routes = [&](const std::string& method, const std::string& path, const std::string&,
                     AdminReply* reply) {
    if (method != "GET") return false;
    if (path == "/workers") reply->body = workers;
    if (path == "/metrics") reply->body = metrics;
    return path == "/workers" || path == "/metrics";
  };
  auto second = AdminServer::Start(admin, nullptr);
  ASSERT_TRUE(second.ok());
  options.routers = {absl::StrCat("127.0.0.1:", (*second)->port())};
  SnapshotReader again(options);
  got = again.Read(1, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(got.snapshot.routers, 1);
  EXPECT_TRUE(got.errors.empty());
  EXPECT_EQ(got.snapshot.pool(PoolRole::kDecode).workers.size(), 2u);
  EXPECT_GT(got.snapshot.counters.completion_tokens, 0);
}

}  // namespace
}  // namespace ferry
