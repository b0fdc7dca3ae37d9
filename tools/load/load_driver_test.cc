#include "tools/load/load_driver.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/http/http_server.h"

namespace ferry {
namespace {

// A fake OpenAI server: a streamed answer of max_tokens events, one every 2 ms, each event's
// text "t<i> ", then the usage (prompt_tokens: the prompt's ids, or the messages' characters;
// cached_tokens: 7) and [DONE]. Model "hang" never answers; model "busy" gets a 429.
class FakeServer {
 public:
  FakeServer() {
    HttpServerOptions options;
    options.threads = 2;
    auto server = HttpServer::Start(
        options, [this](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
          Handle(std::move(request), std::move(responder));
        });
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  ~FakeServer() {
    server_->Shutdown(absl::ZeroDuration());
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  std::string url() const { return absl::StrCat("http://127.0.0.1:", server_->port()); }
  int max_active() const { return max_active_; }
  std::vector<nlohmann::json> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }

 private:
  void Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    nlohmann::json body = nlohmann::json::parse(request.body, nullptr, false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(body);
    }
    const std::string model = body.value("model", "");
    if (model == "busy") {
      responder->Respond(429, {{"Content-Type", "application/json"}},
                         R"({"error":{"message":"too many requests","type":"rate_limit"}})");
      return;
    }
    const int now = ++active_;
    for (int m = max_active_; now > m && !max_active_.compare_exchange_weak(m, now);) {
    }
    // Set when the client goes away.
    struct Closed {
      std::mutex mu;
      std::condition_variable cv;
      bool closed = false;
    };
    auto closed = std::make_shared<Closed>();
    responder->OnClose([closed] {
      std::lock_guard<std::mutex> lock(closed->mu);
      closed->closed = true;
      closed->cv.notify_all();
    });
    std::lock_guard<std::mutex> lock(mu_);
    threads_.emplace_back([this, body, model, responder, closed] {
      responder->StartStream(200, {{"Content-Type", "text/event-stream"}});
      if (model == "hang") {
        {  // until the client goes away (at most 2 s)
          std::unique_lock<std::mutex> lock(closed->mu);
          closed->cv.wait_for(lock, std::chrono::seconds(2), [&] { return closed->closed; });
        }
        --active_;
        responder->Finish();
        return;
      }
      const int tokens = body.value("max_tokens", 1);
      int64_t prompt = 0;
      if (body.contains("prompt")) prompt = static_cast<int64_t>(body["prompt"].size());
      if (body.contains("messages")) {
        for (const auto& m : body["messages"]) prompt += m["content"].get<std::string>().size();
      }
      const bool chat = body.contains("messages");
      for (int i = 0; i < tokens; ++i) {
        // Inherent: the fake server's token pacing (what the driver times), not a wait.
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const std::string text = absl::StrCat("t", i, " ");
        nlohmann::json choice = {{"index", 0}};
        if (chat) {
          choice["delta"] = {{"content", text}};
        } else {
          choice["text"] = text;
        }
        responder->Write("data: " + nlohmann::json{{"choices", {choice}}}.dump() + "\n\n");
      }
      nlohmann::json usage = {{"prompt_tokens", prompt},
                              {"completion_tokens", tokens},
                              {"prompt_tokens_details", {{"cached_tokens", 7}}}};
      --active_;  // before the last bytes: the client may send its next request at once
      responder->Write(
          "data: " + nlohmann::json{{"choices", nlohmann::json::array()}, {"usage", usage}}.dump() +
          "\n\ndata: [DONE]\n\n");
      responder->Finish();
    });
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> active_{0}, max_active_{0};
  std::mutex mu_;
  std::vector<std::thread> threads_;
  std::vector<nlohmann::json> bodies_;
};

Workload Requests(int n, int64_t tokens) {
  SharedPrefixSpec spec;
  spec.groups = 1;
  spec.prompts_per_group = n;
  spec.system_tokens = 4;
  spec.question_tokens = 6;
  spec.output_tokens = tokens;
  return MakeSharedPrefix(spec);
}

LoadOptions Options(const FakeServer& server) {
  LoadOptions o;
  o.url = server.url();
  o.model = "fake";
  o.request_timeout = absl::Seconds(20);
  return o;
}

TEST(LoadDriverTest, ClosedLoopKeepsConcurrencyAndRecordsTheStreams) {
  FakeServer server;
  LoadOptions options = Options(server);
  options.concurrency = 2;
  auto run = RunLoad(Requests(6, 5), options);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->records.size(), 6u);
  for (const RequestRecord& r : run->records) {
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.prompt_tokens, 10);
    EXPECT_EQ(r.output_tokens, 5);
    EXPECT_EQ(r.cached_tokens, 7);
    EXPECT_EQ(r.itl_s.size(), 4u);
    EXPECT_GE(r.ttft_s, 0.0015);  // the first event comes 2 ms after the request
    EXPECT_GE(r.e2e_s, r.ttft_s);
  }
  EXPECT_LE(server.max_active(), 2);
  EXPECT_LE(run->connections_opened, 2 + run->retries);  // kept alive, reused
  // What was sent: token ids, ignore_eos, usage asked for.
  const auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 6u);
  EXPECT_EQ(bodies[0]["prompt"].size(), 10u);
  EXPECT_EQ(bodies[0]["ignore_eos"], true);
  EXPECT_EQ(bodies[0]["stream"], true);
  EXPECT_EQ(bodies[0]["stream_options"]["include_usage"], true);
  EXPECT_EQ(bodies[0]["max_tokens"], 5);
}

TEST(LoadDriverTest, SessionTurnsFollowTheirPreviousReplyAndThinkTime) {
  FakeServer server;
  SessionSpec spec;
  spec.sessions = 2;
  spec.turns = 3;
  spec.first_tokens = 8;
  spec.turn_tokens = 2;
  spec.output_tokens = 3;
  spec.think_s = 0.05;
  const Workload w = MakeSessions(spec);
  for (const std::string mode : {"closed", "open"}) {
    LoadOptions options = Options(server);
    options.mode = mode;
    options.concurrency = 2;
    auto run = RunLoad(w, options);
    ASSERT_TRUE(run.ok()) << run.status();
    for (size_t i = 0; i < w.requests.size(); ++i) {
      const RequestRecord& r = run->records[i];
      ASSERT_TRUE(r.ok) << r.error;
      if (w.requests[i].turn > 0) {
        const RequestRecord& previous = run->records[i - 1];
        EXPECT_GE(r.start_s, previous.start_s + previous.e2e_s + 0.05) << mode << " " << i;
      }
    }
  }
}

TEST(LoadDriverTest, ChatSessionsResendTheRealReplies) {
  FakeServer server;
  SessionSpec spec;
  spec.sessions = 1;
  spec.turns = 2;
  spec.first_tokens = 3;
  spec.turn_tokens = 2;
  spec.output_tokens = 2;
  LoadOptions options = Options(server);
  options.api = "chat";
  auto run = RunLoad(MakeSessions(spec), options, [](absl::Span<const TokenId> ids) {
    return absl::StrCat("<", ids.size(), " ids>");
  });
  ASSERT_TRUE(run.ok()) << run.status();
  const auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_EQ(bodies[0]["messages"],
            nlohmann::json::parse(R"([{"role":"user","content":"<3 ids>"}])"));
  // Turn 2: the first message, the fake's actual reply, then only the 2 new ids (the reply's
  // stand-in ids of the workload are not sent).
  EXPECT_EQ(bodies[1]["messages"], nlohmann::json::parse(R"([
      {"role":"user","content":"<3 ids>"},
      {"role":"assistant","content":"t0 t1 "},
      {"role":"user","content":"<2 ids>"}])"));
  EXPECT_TRUE(run->records[1].ok);
}

TEST(LoadDriverTest, OpenLoopBoundsRequestsInFlightAndCountsTheWaits) {
  FakeServer server;
  Workload w = Requests(4, 10);  // every arrival at 0
  LoadOptions options = Options(server);
  options.mode = "open";
  options.max_inflight = 1;
  auto run = RunLoad(w, options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(server.max_active(), 1);
  EXPECT_EQ(run->max_waiting, 3);
  int waited = 0;
  for (const RequestRecord& r : run->records) {
    EXPECT_TRUE(r.ok) << r.error;
    if (r.queued_s > 0.015) ++waited;  // 10 tokens at 2 ms each ahead of it, at least
  }
  EXPECT_EQ(waited, 3);
  // Arrival times are kept: 0.1 s apart, with room in flight, they wait for nobody.
  for (size_t i = 0; i < w.requests.size(); ++i) w.requests[i].arrival_s = 0.1 * i;
  options.max_inflight = 8;
  run = RunLoad(w, options);
  ASSERT_TRUE(run.ok());
  for (size_t i = 0; i < w.requests.size(); ++i) {
    EXPECT_GE(run->records[i].start_s, 0.1 * i - 1e-3);
    EXPECT_EQ(run->records[i].queued_s, 0);
  }
}

TEST(LoadDriverTest, TimeoutsAndHttpErrorsAreFailedRecords) {
  FakeServer server;
  LoadOptions options = Options(server);
  options.model = "hang";
  options.request_timeout = absl::Milliseconds(100);
  auto run = RunLoad(Requests(2, 3), options);
  ASSERT_TRUE(run.ok()) << run.status();
  for (const RequestRecord& r : run->records) {
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("no complete answer within 100ms"), std::string::npos) << r.error;
    EXPECT_GE(r.e2e_s, 0.1);
    EXPECT_LT(r.e2e_s, 1.5);
  }
  options.model = "busy";
  run = RunLoad(Requests(1, 3), options);
  ASSERT_TRUE(run.ok());
  EXPECT_FALSE(run->records[0].ok);
  EXPECT_EQ(run->records[0].error, "HTTP 429: too many requests");
}

TEST(LoadDriverTest, BadOptionsAndUnreachableServers) {
  LoadOptions options;
  options.model = "m";
  options.api = "grpc";
  EXPECT_FALSE(RunLoad(Requests(1, 1), options).ok());
  options.api = "chat";  // no decoder
  EXPECT_FALSE(RunLoad(Requests(1, 1), options).ok());
  options.api = "completions";
  options.url = "http://127.0.0.1:1";  // nothing listens: every request fails, the run ends
  options.request_timeout = absl::Seconds(5);
  auto run = RunLoad(Requests(2, 1), options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_FALSE(run->records[0].ok);
  EXPECT_NE(run->records[0].error.find("connect"), std::string::npos) << run->records[0].error;
}

}  // namespace
}  // namespace ferry
