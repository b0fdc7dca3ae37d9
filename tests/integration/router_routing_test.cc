// ferry-router's routing over real ferry-workers on the null engine (the default model's
// tokenizer, no weights): round_robin spreads requests evenly, least_loaded sends them away from
// a worker busy with a long one, a worker of another model (fingerprint) is refused, a drained
// worker (POST /workers/{id}/drain) gets nothing new, a worker that fails a request before its
// first token has it retried on another, a killed worker is dropped (503 with Retry-After when
// none can take work) and taken back when it returns; every /metrics page passes
// `promtool check metrics`; prefix_aware (the default) keeps a multi-turn conversation on the
// worker that holds it and predicts exactly the prefix the worker reuses. Counts come from the
// routers' and workers' own metrics.

#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/service_process.h"

namespace ferry {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

std::string g_router, g_worker, g_model;

struct Reply {
  int status = -1;
  std::string body;
  std::string retry_after;
};

// One request on its own connection; every step within `timeout`.
Reply Post(int port, const std::string& target, const std::string& body,
           absl::Duration timeout = absl::Seconds(60)) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(absl::ToChronoNanoseconds(timeout));
  Reply reply;
  bool done = false;
  http::request<http::string_body> request(http::verb::post, target, 11);
  request.set(http::field::host, "127.0.0.1");
  request.set(http::field::content_type, "application/json");
  request.body() = body;
  request.prepare_payload();
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  stream.async_connect(
      asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)),
      [&](beast::error_code ec) {
        if (ec) return;
        http::async_write(stream, request, [&](beast::error_code ec, size_t) {
          if (ec) return;
          http::async_read(stream, buffer, response,
                           [&](beast::error_code ec, size_t) { done = !ec; });
        });
      });
  io.run();
  if (!done) return reply;
  reply.status = response.result_int();
  reply.body = response.body();
  reply.retry_after = std::string(response[http::field::retry_after]);
  return reply;
}

Reply Chat(int port, int max_tokens = 4) {
  return Post(port, "/v1/chat/completions",
              absl::StrCat(R"({"model":"smol","messages":[{"role":"user","content":"hi"}],)",
                           R"("max_tokens":)", max_tokens, R"(,"ignore_eos":true})"));
}

std::unique_ptr<ServiceProcess> Worker(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--model=" + g_model, "--engine=null", "--block_tokens=16",
                                   "--kv_pool_bytes=64MiB", "--null_token_seconds=0.005"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto w = std::make_unique<ServiceProcess>(g_worker, args);
  EXPECT_TRUE(w->ready()) << w->LogTail();
  return w;
}

std::unique_ptr<ServiceProcess> Router(const std::vector<int>& worker_ports,
                                       const std::vector<std::string>& extra) {
  std::string workers;
  for (int p : worker_ports) absl::StrAppend(&workers, workers.empty() ? "" : ",", "127.0.0.1:", p);
  std::vector<std::string> args = {"--model=" + g_model, "--served_model_name=smol",
                                   "--workers=" + workers};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = std::make_unique<ServiceProcess>(g_router, args);
  EXPECT_TRUE(r->ready()) << r->LogTail();
  return r;
}

nlohmann::json Workers(const ServiceProcess& router) {
  std::string body;
  if (HttpGet(router.admin_port(), "/workers", &body) != 200) return nlohmann::json::array();
  return nlohmann::json::parse(body, nullptr, false);
}

// Waits until the router sees `n` workers in `state` (and draining as `drain`, when given).
bool WaitForWorkers(const ServiceProcess& router, int n, const std::string& state,
                    const std::string& drain = "") {
  for (int i = 0; i < 1000; ++i) {
    int count = 0;
    for (const auto& w : Workers(router)) {
      if (w["state"] == state && (drain.empty() || w.value("drain_state", "") == drain)) ++count;
    }
    if (count == n) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

double Routed(const ServiceProcess& router, const std::string& policy, int worker_port) {
  const double v = MetricValue(
      router.admin_port(), absl::StrCat("ferry_router_routing_decisions_total{policy=\"", policy,
                                        "\",worker=\"127.0.0.1:", worker_port, "\"}"));
  return v < 0 ? 0 : v;
}

void ExpectPromtoolClean(int admin_port, const std::string& what) {
  std::string metrics;
  ASSERT_EQ(HttpGet(admin_port, "/metrics", &metrics), 200) << what;
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/metrics-", admin_port);
  std::ofstream(path) << metrics;
  const std::string out = path + ".promtool";
  const int rc =
      std::system(absl::StrCat("promtool check metrics < ", path, " > ", out, " 2>&1").c_str());
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(rc, 0) << what << ": promtool check metrics:\n" << text.str();
}

TEST(RouterRoutingTest, PoliciesRefusalsDrainsRetriesAndFailures) {
  // w0 is drained below and stays, drained, for the rest of the test.
  auto w0 = Worker({"--exit_when_drained=false"});
  auto w1 = Worker({});
  auto ll = Router({w0->grpc_port(), w1->grpc_port()}, {"--policy=least_loaded"});
  ASSERT_TRUE(WaitForWorkers(*ll, 2, "up"));
  const std::string fingerprint = Workers(*ll)[0]["fingerprint"];
  // Another model: the real engine's fingerprint is not the null engine's. The pinned
  // fingerprint refuses it whichever worker reports first.
  auto other = std::make_unique<ServiceProcess>(
      g_worker, std::vector<std::string>{"--model=" + g_model, "--block_tokens=16",
                                         "--kv_pool_bytes=64MiB", "--threads=1"});
  ASSERT_TRUE(other->ready()) << other->LogTail();
  auto rr = Router({other->grpc_port(), w0->grpc_port(), w1->grpc_port()},
                   {"--policy=round_robin", "--model_fingerprint=" + fingerprint});
  ASSERT_TRUE(WaitForWorkers(*rr, 2, "up"));
  ASSERT_TRUE(WaitForWorkers(*rr, 1, "refused"));
  for (const auto& w : Workers(*rr)) {
    if (w["state"] == "refused") {
      EXPECT_EQ(w["address"], absl::StrCat("127.0.0.1:", other->grpc_port()));
      EXPECT_NE(w["reason"].get<std::string>().find("fingerprint"), std::string::npos);
    }
  }
  const std::string refusals = "ferry_router_worker_refusals_total{reason=\"fingerprint\"}";
  for (int i = 0; i < 500 && MetricValue(rr->admin_port(), refusals) != 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(MetricValue(rr->admin_port(), refusals), 1);

  // round_robin: 20 requests, 10 each; none to the refused worker.
  for (int i = 0; i < 20; ++i) ASSERT_EQ(Chat(rr->grpc_port()).status, 200);
  EXPECT_EQ(Routed(*rr, "round_robin", w0->grpc_port()), 10);
  EXPECT_EQ(Routed(*rr, "round_robin", w1->grpc_port()), 10);
  EXPECT_EQ(Routed(*rr, "round_robin", other->grpc_port()), 0);

  // least_loaded: while one worker has a long request, the others go to the other worker.
  Reply long_reply;
  std::thread long_request([&] { long_reply = Chat(ll->grpc_port(), 1000); });  // ~5 s
  int busy = -1;
  for (int i = 0; i < 500 && busy < 0; ++i) {
    if (Routed(*ll, "least_loaded", w0->grpc_port()) == 1) busy = w0->grpc_port();
    if (Routed(*ll, "least_loaded", w1->grpc_port()) == 1) busy = w1->grpc_port();
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(busy, 0);
  const int idle = busy == w0->grpc_port() ? w1->grpc_port() : w0->grpc_port();
  for (int i = 0; i < 6; ++i) ASSERT_EQ(Chat(ll->grpc_port()).status, 200);
  EXPECT_EQ(Routed(*ll, "least_loaded", busy), 1);
  EXPECT_EQ(Routed(*ll, "least_loaded", idle), 6);
  long_request.join();
  EXPECT_EQ(long_reply.status, 200);

  // A worker that fails requests before their first token: w2 drains behind the router's back
  // (its Watch is slow, so the router does not know yet); what lands there goes to w3 instead.
  auto w2 = Worker({"--watch_interval=20s", "--watch_heartbeat=20s", "--exit_when_drained=false"});
  auto w3 = Worker({});
  auto retrying = Router({w2->grpc_port(), w3->grpc_port()},
                         {"--policy=round_robin", "--heartbeat_timeout=60s"});
  ASSERT_TRUE(WaitForWorkers(*retrying, 2, "up"));
  {
    auto direct = Router({w2->grpc_port()}, {"--heartbeat_timeout=60s"});  // to drain it
    ASSERT_TRUE(WaitForWorkers(*direct, 1, "up"));
    ASSERT_EQ(Post(direct->admin_port(),
                   absl::StrCat("/workers/127.0.0.1:", w2->grpc_port(), "/drain"), "{}")
                  .status,
              200);
  }
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Chat(retrying->grpc_port()).status, 200);
  // Every request routed to w2 was retried on w3, which served all four.
  const double to_w2 = Routed(*retrying, "round_robin", w2->grpc_port());
  EXPECT_GE(to_w2, 1);
  EXPECT_EQ(MetricValue(retrying->admin_port(), "ferry_router_retries_total"), to_w2);
  EXPECT_EQ(Routed(*retrying, "round_robin", w3->grpc_port()), 4);

  // Drain through the router's admin port: w0 gets nothing new.
  const Reply drained =
      Post(rr->admin_port(), absl::StrCat("/workers/127.0.0.1:", w0->grpc_port(), "/drain"),
           R"({"grace_seconds":30})");
  ASSERT_EQ(drained.status, 200) << drained.body;
  EXPECT_NE(drained.body.find("DRAIN_STATE_"), std::string::npos);
  ASSERT_TRUE(WaitForWorkers(*rr, 1, "up", "DRAIN_STATE_DRAINED"));
  const double w0_before = Routed(*rr, "round_robin", w0->grpc_port());
  for (int i = 0; i < 6; ++i) ASSERT_EQ(Chat(rr->grpc_port()).status, 200);
  EXPECT_EQ(Routed(*rr, "round_robin", w0->grpc_port()), w0_before);

  // w1 killed: the router drops it; with w0 draining nobody can take work: 503, Retry-After.
  const int w1_port = w1->grpc_port();
  w1->Signal(SIGKILL);
  w1->WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(WaitForWorkers(*rr, 1, "down"));
  const Reply refused = Chat(rr->grpc_port());
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.retry_after, "1");
  EXPECT_NE(HttpGet(rr->admin_port(), "/readyz"), 200);
  // Back on the same port: taken back after the backoff, and serving.
  w1 = Worker({absl::StrCat("--address=127.0.0.1:", w1_port)});
  ASSERT_TRUE(WaitForWorkers(*rr, 1, "up", "DRAIN_STATE_SERVING"));
  EXPECT_EQ(Chat(rr->grpc_port()).status, 200);
  EXPECT_EQ(HttpGet(rr->admin_port(), "/readyz"), 200);

  ExpectPromtoolClean(rr->admin_port(), "router");
  ExpectPromtoolClean(w0->admin_port(), "worker");
  for (auto* p : {rr.get(), ll.get(), retrying.get()}) {
    p->Signal(SIGTERM);
    EXPECT_EQ(p->WaitForExit(absl::Seconds(30)), 0) << p->LogTail();
  }
}

// Until the router's KV index holds what each worker's prefix cache holds now: every worker's
// stream brought two more messages (the second composed after this call, as a worker writes one
// at a time, a tick apart), and the index agrees with the load they reported.
bool WaitForIndexInSync(const ServiceProcess& router) {
  std::map<std::string, int64_t> seen;
  for (const auto& w : Workers(router)) seen[w["id"]] = w["messages"];
  for (int i = 0; i < 1000; ++i) {
    bool synced = true;
    for (const auto& w : Workers(router)) {
      if (w["messages"].get<int64_t>() < seen[w["id"]] + 2 || !w.contains("load") ||
          !w["kv_index"]["synced"].get<bool>() ||
          w["kv_index"]["blocks"] != w["load"]["cached_kv_blocks"]) {
        synced = false;
      }
    }
    if (synced) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST(RouterRoutingTest, PrefixAwareKeepsAConversationOnItsWorkerAndPredictsItsHits) {
  // Quick Watch messages (a heartbeat every 50 ms) make the index's catching up quick to see.
  const std::vector<std::string> watch = {"--watch_interval=20ms", "--watch_heartbeat=50ms"};
  auto w0 = Worker(watch);
  auto w1 = Worker(watch);
  auto router = Router({w0->grpc_port(), w1->grpc_port()}, {"--log_level=debug"});
  ASSERT_TRUE(WaitForWorkers(*router, 2, "up"));
  nlohmann::json messages = nlohmann::json::array();
  messages.push_back({{"role", "system"},
                      {"content",
                       "You are a careful assistant who answers in one short line. "
                       "Keep every answer under twenty words and never use lists."}});
  const int turns = 6;
  for (int turn = 0; turn < turns; ++turn) {
    ASSERT_TRUE(WaitForIndexInSync(*router)) << Workers(*router).dump(2);
    messages.push_back(
        {{"role", "user"}, {"content", absl::StrCat("Question ", turn, ": what comes next?")}});
    const nlohmann::json body = {
        {"model", "smol"}, {"messages", messages}, {"max_tokens", 4}, {"ignore_eos", true}};
    const Reply reply = Post(router->grpc_port(), "/v1/chat/completions", body.dump());
    ASSERT_EQ(reply.status, 200) << reply.body;
    const auto answer = nlohmann::json::parse(reply.body);
    messages.push_back(
        {{"role", "assistant"}, {"content", answer["choices"][0]["message"]["content"]}});
    if (turn > 0) {
      EXPECT_GT(answer["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0)
          << "turn " << turn << ": " << reply.body;
    }
  }
  // Every turn on one worker: the first where the tie fell, then where its prefix was.
  const double on0 = Routed(*router, "prefix_aware", w0->grpc_port());
  const double on1 = Routed(*router, "prefix_aware", w1->grpc_port());
  EXPECT_TRUE((on0 == turns && on1 == 0) || (on0 == 0 && on1 == turns)) << on0 << " " << on1;
  const int port = router->admin_port();
  EXPECT_EQ(MetricValue(port,
                        "ferry_router_routing_reasons_total{policy=\"prefix_aware\","
                        "reason=\"prefix_hit\"}"),
            turns - 1);
  // The router predicted exactly what the worker reused, turn after turn.
  EXPECT_EQ(MetricValue(port, "ferry_router_prefix_predictions_total{outcome=\"exact\"}"), turns);
  const double predicted =
      MetricValue(port, "ferry_router_prefix_tokens_total{kind=\"predicted\",tier=\"local\"}");
  const double reused =
      MetricValue(port, "ferry_router_prefix_tokens_total{kind=\"reused\",tier=\"local\"}");
  EXPECT_GT(predicted, 16 * (turns - 1));
  EXPECT_EQ(predicted, reused);
  EXPECT_GT(MetricValue(port, "ferry_router_kv_index_entries"), 0);
  EXPECT_GT(MetricValue(port, "ferry_router_kv_index_events_total"), 0);
  EXPECT_EQ(MetricValue(port, "ferry_router_kv_index_dropped_total"), 0);
  // Each decision is in the debug log with its cost terms.
  EXPECT_NE(router->LogTail(1 << 20).find("prefix_aware: 127.0.0.1:"), std::string::npos);

  // A restarted worker's blocks leave the index with its new snapshot: the conversation's next
  // turn is a miss predicted as one.
  const int holder = on0 == turns ? w0->grpc_port() : w1->grpc_port();
  auto& held = on0 == turns ? w0 : w1;
  held->Signal(SIGKILL);
  held->WaitForExit(absl::Seconds(10));
  held = Worker({absl::StrCat("--address=127.0.0.1:", holder), watch[0], watch[1]});
  ASSERT_TRUE(WaitForWorkers(*router, 2, "up"));
  ASSERT_TRUE(WaitForIndexInSync(*router));
  messages.push_back({{"role", "user"}, {"content", "And after that?"}});
  const nlohmann::json body = {
      {"model", "smol"}, {"messages", messages}, {"max_tokens", 4}, {"ignore_eos", true}};
  ASSERT_EQ(Post(router->grpc_port(), "/v1/chat/completions", body.dump()).status, 200);
  EXPECT_EQ(MetricValue(port, "ferry_router_prefix_predictions_total{outcome=\"exact\"}"),
            turns + 1);
  ExpectPromtoolClean(port, "router");
  router->Signal(SIGTERM);
  EXPECT_EQ(router->WaitForExit(absl::Seconds(30)), 0) << router->LogTail();
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* model = std::getenv("FERRY_MODEL_GGUF");
  if (argc < 3 || model == nullptr) {
    std::fprintf(stderr, "usage: FERRY_MODEL_GGUF=... %s FERRY_ROUTER FERRY_WORKER\n", argv[0]);
    return 2;
  }
  ferry::g_router = argv[1];
  ferry::g_worker = argv[2];
  ferry::g_model = model;
  return RUN_ALL_TESTS();
}
