// ferry-worker's life around requests, on the null engine (the tiny dense model's tokenizer and
// positions, a configured time per token) so that requests last long enough to be interrupted:
// cancel mid-stream, Abort (idempotent), a request deadline, the queue bound, Drain, SIGTERM under
// load (within the grace: everything finishes; past it: retryable errors), the shared token, and
// the null engine's API and timing. Assertions count tokens and events, never elapsed time,
// except lower bounds the configured timing implies.

#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/common/grpc_client.h"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

// A null-engine worker whose every decode step takes `token_seconds`.
std::unique_ptr<ServiceProcess> NullWorker(double token_seconds,
                                           const std::vector<std::string>& extra = {}) {
  std::vector<std::string> flags = {"--engine=null",
                                    absl::StrCat("--null_token_seconds=", token_seconds),
                                    "--null_prefill_tokens_per_second=0"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return StartWorker(TinyModel("llama_gqa_bf16"), flags);
}

// Counts an event once it arrived; lets a test wait for "n tokens in".
class Progress {
 public:
  void Add(int64_t tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_ += tokens;
    cv_.notify_all();
  }
  bool WaitFor(int64_t tokens, absl::Duration timeout = absl::Seconds(60)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&] { return tokens_ >= tokens; });
  }
  int64_t tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t tokens_ = 0;
};

Sampling Long(uint32_t max_tokens) {
  Sampling s;
  s.max_tokens = max_tokens;
  return s;
}

std::vector<TokenId> Prompt(int n = 20, uint32_t seed = 1) { return RandomPrompt(n, seed, 512); }

TEST(WorkerLifecycleTest, CancelMidStreamAbortsWithinAStepAndLeavesThePoolIdle) {
  auto worker = NullWorker(0.02);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  int events = 0;
  GenerateResult got = client.Generate(
      MakeRequest("c", Prompt(40), Long(200)), absl::Seconds(60),
      [&](const v1::GenerateEvent& e) { return !(e.has_tokens() && ++events == 3); });
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(got.choices[0].tokens.size(), 200u);
  ASSERT_TRUE(WaitUntilIdle(client));
  WaitForMetric(worker->admin_port(), "ferry_worker_requests_total{outcome=\"cancelled\"}", 1,
                absl::Seconds(2));
  EXPECT_EQ(MetricValue(worker->admin_port(), "ferry_worker_requests_total{outcome=\"cancelled\"}"),
            1);
  // Healthy: the next request runs to its end.
  got = client.Generate(MakeRequest("after", Prompt(), Long(5)), absl::Seconds(60));
  EXPECT_TRUE(got.status.ok());
  EXPECT_EQ(got.choices[0].tokens.size(), 5u);
}

TEST(WorkerLifecycleTest, AbortEndsEveryChoiceOnceAndIsIdempotent) {
  auto worker = NullWorker(0.02);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  Progress progress;
  Sampling s = Long(500);
  s.n = 2;
  GenerateResult got;
  std::thread caller([&] {
    got = client.Generate(MakeRequest("ab", Prompt(), s), absl::Seconds(60),
                          [&](const v1::GenerateEvent& e) {
                            if (e.has_tokens()) progress.Add(e.tokens().token_ids_size());
                            return true;
                          });
  });
  ASSERT_TRUE(progress.WaitFor(4));
  bool found = false;
  ASSERT_TRUE(client.Abort("ab", &found).ok());
  EXPECT_TRUE(found);
  caller.join();
  EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  ASSERT_EQ(got.choices.size(), 2u);
  for (const ChoiceOutput& c : got.choices) {
    EXPECT_EQ(c.finish, v1::FINISH_REASON_ABORT);
    EXPECT_LT(c.tokens.size(), 500u);
    EXPECT_TRUE(c.indexes_ok);
  }
  ASSERT_TRUE(got.has_usage);
  EXPECT_EQ(got.usage.completion_tokens(),
            got.choices[0].tokens.size() + got.choices[1].tokens.size());
  ASSERT_TRUE(client.Abort("ab", &found).ok());
  EXPECT_FALSE(found);
  ASSERT_TRUE(client.Abort("never-was", &found).ok());
  EXPECT_FALSE(found);
  EXPECT_TRUE(WaitUntilIdle(client));
}

TEST(WorkerLifecycleTest, ARequestDeadlineEndsItWithDeadlineExceeded) {
  auto worker = NullWorker(0.02);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  v1::GenerateRequest r = MakeRequest("late", Prompt(), Long(1000));
  r.mutable_request()->mutable_context()->set_deadline_unix_ms(
      absl::ToUnixMillis(absl::Now() + absl::Milliseconds(300)));
  GenerateResult got = client.Generate(r, absl::Seconds(60));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(got.has_error);
  EXPECT_EQ(got.error.kind(), v1::ERROR_KIND_DEADLINE_EXCEEDED);
  EXPECT_EQ(got.error.trace_id(), "trace-late");
  EXPECT_LT(got.choices[0].tokens.size(), 1000u);
  EXPECT_TRUE(WaitUntilIdle(client));
}

TEST(WorkerLifecycleTest, AFullQueueRefusesWithResourceExhausted) {
  // 0.2 s a token: the tiny model's 256 positions end a request after about 50 s, long enough
  // for "run" to hold the one running slot until it is aborted below, whatever the machine's load.
  // (At 0.02 s it ended after 5 s, and a slow ASan run then admitted "wait" and "over".)
  auto worker = NullWorker(0.2, {"--max_running=1", "--max_queued=1"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  Progress first;
  std::thread running([&] {
    // Runs until aborted below (the model's positions end it first, after about 50 s).
    client.Generate(MakeRequest("run", Prompt(), Long(2000)), absl::Seconds(60),
                    [&](const v1::GenerateEvent& e) {
                      if (e.has_tokens()) first.Add(1);
                      return true;
                    });
  });
  ASSERT_TRUE(first.WaitFor(1));
  std::thread queued(
      [&] { client.Generate(MakeRequest("wait", Prompt(), Long(2)), absl::Seconds(60)); });
  // Until the worker reports the second one waiting.
  auto stream = client.Watch(v1::WatchRequest(), absl::Seconds(30));
  v1::WorkerStatus status;
  bool waiting = false;
  while (!waiting && stream->Next(&status)) waiting = status.load().queued_requests() == 1;
  ASSERT_TRUE(waiting);
  GenerateResult refused =
      client.Generate(MakeRequest("over", Prompt(), Long(2)), absl::Seconds(30));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  bool found = false;
  client.Abort("run", &found);
  running.join();
  queued.join();
  EXPECT_TRUE(WaitUntilIdle(*stream, nullptr));
  stream->Cancel();
  EXPECT_GE(MetricValue(worker->admin_port(), "ferry_worker_requests_total{outcome=\"rejected\"}"),
            1);
}

TEST(WorkerLifecycleTest, DrainStopsAdmittingLetsRunningRequestsFinishAndReportsDrained) {
  auto worker = NullWorker(0.02);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  Progress progress;
  GenerateResult got;
  std::thread caller([&] {
    // 2 s: still running when the Drain call lands, even on a loaded machine.
    got = client.Generate(MakeRequest("d", Prompt(), Long(100)), absl::Seconds(60),
                          [&](const v1::GenerateEvent& e) {
                            if (e.has_tokens()) progress.Add(1);
                            return true;
                          });
  });
  ASSERT_TRUE(progress.WaitFor(1));
  v1::DrainResponse drain;
  ASSERT_TRUE(client.Drain(30, &drain).ok());
  EXPECT_EQ(drain.state(), v1::DRAIN_STATE_DRAINING);
  EXPECT_EQ(drain.running_requests(), 1u);
  EXPECT_EQ(HttpGet(worker->admin_port(), "/readyz"), 503);
  GenerateResult refused =
      client.Generate(MakeRequest("new", Prompt(), Long(2)), absl::Seconds(30));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  caller.join();
  EXPECT_TRUE(got.status.ok());
  EXPECT_EQ(got.choices[0].tokens.size(), 100u);
  // Drained through the Drain call, the worker exits 0 as on SIGTERM.
  EXPECT_EQ(worker->WaitForExit(absl::Seconds(30)), 0) << worker->LogTail();
}

TEST(WorkerLifecycleTest, WithoutExitWhenDrainedADrainedWorkerStaysDrained) {
  auto worker = NullWorker(0.001, {"--exit_when_drained=false"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  auto watch = client.Watch(v1::WatchRequest(), absl::Seconds(5));
  v1::DrainResponse drain;
  ASSERT_TRUE(client.Drain(30, &drain).ok());
  // The Watch stream reports each change of the drain state: read it until DRAINED.
  v1::WorkerStatus status;
  bool drained = false;
  while (!drained && watch->Next(&status)) {
    drained = status.drain_state() == v1::DRAIN_STATE_DRAINED;
  }
  EXPECT_TRUE(drained);
  watch->Cancel();
  watch->Finish();
  ASSERT_TRUE(client.Drain(0, &drain).ok());
  EXPECT_EQ(drain.state(), v1::DRAIN_STATE_DRAINED);
  EXPECT_EQ(HttpGet(worker->admin_port(), "/healthz"), 200);  // alive, just not ready
  EXPECT_NE(HttpGet(worker->admin_port(), "/readyz"), 200);
}

TEST(WorkerLifecycleTest, SigtermUnderLoadFinishesRunningRequestsAndExitsZero) {
  auto worker = NullWorker(0.02);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  auto watch = client.Watch(v1::WatchRequest(), absl::Seconds(60));
  v1::WorkerStatus status;
  ASSERT_TRUE(watch->Next(&status));  // subscribed
  constexpr int kRequests = 4;
  constexpr uint32_t kTokens = 60;
  Progress progress;
  std::vector<GenerateResult> results(kRequests);
  std::vector<std::thread> callers;
  for (int i = 0; i < kRequests; ++i) {
    callers.emplace_back([&, i] {
      results[i] = client.Generate(MakeRequest(absl::StrCat("s", i), Prompt(20, i), Long(kTokens)),
                                   absl::Seconds(60), [&](const v1::GenerateEvent& e) {
                                     if (e.has_tokens()) progress.Add(e.tokens().token_ids_size());
                                     return true;
                                   });
    });
  }
  ASSERT_TRUE(progress.WaitFor(kRequests));  // all are decoding
  worker->Signal(SIGTERM);
  // The Watch stream says DRAINING at once, long before the requests end (a router sends
  // nothing new, and does not take the worker for gone).
  bool draining = false;
  while (!draining && watch->Next(&status)) {
    draining = status.drain_state() == v1::DRAIN_STATE_DRAINING;
  }
  EXPECT_TRUE(draining);
  EXPECT_LT(progress.tokens(), kRequests * kTokens);
  // Not ready any more; a new request is refused.
  int ready = 200;
  for (int i = 0; i < 200 && ready == 200; ++i) {
    ready = HttpGet(worker->admin_port(), "/readyz");
    if (ready == 200) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_NE(ready, 200);
  GenerateResult refused =
      client.Generate(MakeRequest("new", Prompt(), Long(2)), absl::Seconds(30));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  for (auto& t : callers) t.join();
  for (const GenerateResult& r : results) {
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.choices[0].tokens.size(), kTokens);
    EXPECT_EQ(r.choices[0].finish, v1::FINISH_REASON_LENGTH);
  }
  // The Watch stream ends with the worker.
  while (watch->Next(&status)) {
  }
  EXPECT_EQ(worker->WaitForExit(absl::Seconds(30)), 0) << worker->LogTail();
}

// Past the grace the request is parked with its KV for the worker continuing it; nobody takes it
// here, so it is released after --handoff_wait and the worker exits.
TEST(WorkerLifecycleTest, PastTheDrainGraceRequestsEndRetryableAndTheWorkerStillExitsZero) {
  // 0.1 s a token: "long" runs about 25 s (the tiny model's 256 positions), well past the grace.
  auto worker = NullWorker(0.1, {"--drain_grace=1s", "--handoff_wait=1s"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  Progress progress;
  GenerateResult got;
  std::thread caller([&] {
    got = client.Generate(MakeRequest("long", Prompt(), Long(2000)), absl::Seconds(60),
                          [&](const v1::GenerateEvent& e) {
                            if (e.has_tokens()) progress.Add(1);
                            return true;
                          });
  });
  ASSERT_TRUE(progress.WaitFor(1));
  worker->Signal(SIGTERM);
  caller.join();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(got.has_error);
  EXPECT_TRUE(got.error.retryable());
  EXPECT_EQ(got.error.handoff_endpoint(), worker->address());
  EXPECT_LT(got.choices[0].tokens.size(), 2000u);
  EXPECT_GT(got.choices[0].tokens.size(), 0u);
  EXPECT_EQ(worker->WaitForExit(absl::Seconds(30)), 0) << worker->LogTail();
}

// A request of several choices cannot be handed off: past the grace it runs on (for up to
// --handoff_wait) and completes, while one choice's request beside it is parked.
TEST(WorkerLifecycleTest, PastTheGraceSeveralChoicesRunOnAndComplete) {
  auto worker = NullWorker(0.02, {"--drain_grace=0s", "--handoff_wait=3s"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  Progress progress;
  GenerateResult two, one;
  Sampling n2 = Long(60);
  n2.n = 2;
  std::thread caller2([&] {
    two = client.Generate(MakeRequest("two", Prompt(), n2), absl::Seconds(60),
                          [&](const v1::GenerateEvent& e) {
                            if (e.has_tokens()) progress.Add(1);
                            return true;
                          });
  });
  std::thread caller1([&] {
    one = client.Generate(MakeRequest("one", Prompt(20, 3), Long(60)), absl::Seconds(60),
                          [&](const v1::GenerateEvent& e) {
                            if (e.has_tokens()) progress.Add(1);
                            return true;
                          });
  });
  ASSERT_TRUE(progress.WaitFor(6));
  v1::DrainResponse drain;
  ASSERT_TRUE(client.Drain(0, &drain).ok());
  caller1.join();
  caller2.join();
  EXPECT_EQ(one.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(one.error.handoff_endpoint(), worker->address());
  ASSERT_TRUE(two.status.ok()) << two.status.error_message();
  ASSERT_EQ(two.choices.size(), 2u);
  for (const ChoiceOutput& c : two.choices) EXPECT_EQ(c.tokens.size(), 60u);
  // The parked KV is never taken here: released after --handoff_wait, the worker exits.
  EXPECT_EQ(worker->WaitForExit(absl::Seconds(30)), 0) << worker->LogTail();
}

TEST(WorkerLifecycleTest, AWrongSharedTokenIsRefusedOnEveryCall) {
  const std::string token = "test-token-0123456789abcdef";
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/token");
  std::ofstream(path) << token << "\n";
  auto worker = NullWorker(0.001, {"--auth_token_file=" + path});
  ASSERT_TRUE(worker->ready());
  for (const std::string& wrong : {std::string(), std::string("test-token-0123456789abcdeX")}) {
    WorkerClient client(worker->address(), wrong);
    EXPECT_EQ(
        client.Generate(MakeRequest("g", Prompt(), Long(2)), absl::Seconds(30)).status.error_code(),
        grpc::StatusCode::UNAUTHENTICATED);
    bool found;
    EXPECT_EQ(client.Abort("g", &found).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    v1::DrainResponse drain;
    EXPECT_EQ(client.Drain(1, &drain).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    auto watch = client.Watch(v1::WatchRequest(), absl::Seconds(30));
    v1::WorkerStatus status;
    EXPECT_FALSE(watch->Next(&status));
    EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  WorkerClient right(worker->address(), token);
  GenerateResult got = right.Generate(MakeRequest("g", Prompt(), Long(3)), absl::Seconds(30));
  EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.choices[0].tokens.size(), 3u);
  // The health service needs no token (probes send none).
  auto health = grpc::health::v1::Health::NewStub(NewChannel(worker->address()));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  auto context = NewClientContext(absl::Seconds(10));
  ASSERT_TRUE(health->Check(context.get(), request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(MetricValue(worker->admin_port(), "ferry_worker_unauthenticated_calls_total"), 8);
}

// Bound to every interface, a worker refuses to start without --advertise_address; with one it
// reports that host and its bound port as its endpoint and id in Watch (what routers dial).
TEST(WorkerLifecycleTest, AWildcardListenerAdvertisesItsAdvertisedAddress) {
  ServiceProcess refused(WorkerBinary(), {"--model=" + TinyModel("llama_gqa_bf16"), "--engine=null",
                                          "--kv_pool_bytes=4MiB", "--address=0.0.0.0:0"});
  EXPECT_FALSE(refused.ready());
  EXPECT_EQ(refused.WaitForExit(absl::Seconds(30)), 2);
  EXPECT_NE(refused.LogTail().find("--advertise_address"), std::string::npos) << refused.LogTail();

  auto worker = NullWorker(0.001, {"--address=0.0.0.0:0", "--advertise_address=127.0.0.2",
                                   "--transport=grpc", "--transport_address=0.0.0.0:0"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  auto watch = client.Watch(v1::WatchRequest(), absl::Seconds(30));
  v1::WorkerStatus status;
  ASSERT_TRUE(watch->Next(&status));
  const std::string advertised = absl::StrCat("127.0.0.2:", worker->grpc_port());
  EXPECT_EQ(status.endpoint(), advertised);
  EXPECT_EQ(status.worker_id(), advertised);
  watch->Cancel();
  watch->Finish();
  // The advertised address is one peers reach it by.
  WorkerClient by_advertised(advertised);
  GenerateResult got =
      by_advertised.Generate(MakeRequest("a", Prompt(), Long(2)), absl::Seconds(30));
  EXPECT_TRUE(got.status.ok()) << got.status.error_message();
}

TEST(WorkerLifecycleTest, TheNullEngineServesTheSameApiAtItsConfiguredRates) {
  auto worker = StartWorker(
      TinyModel("llama_gqa_bf16"),
      {"--engine=null", "--null_token_seconds=0.03", "--null_prefill_tokens_per_second=2000"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  const std::vector<TokenId> prompt = Prompt(200, 9);
  Sampling s;
  s.max_tokens = 10;
  s.n = 2;
  s.temperature = 0.8f;
  s.seed = 3;
  s.logprobs = true;
  s.top_logprobs = 2;
  const absl::Time start = absl::Now();
  GenerateResult got = client.Generate(MakeRequest("n1", prompt, s), absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  ASSERT_EQ(got.choices.size(), 2u);
  for (const ChoiceOutput& c : got.choices) {
    EXPECT_EQ(c.tokens.size(), 10u);
    EXPECT_EQ(c.logprobs.size(), 10u);
    EXPECT_FALSE(c.text.empty());
  }
  // 200 prompt tokens at 2000/s, then 9 decode steps of 30 ms: no faster than that.
  EXPECT_GE(took, absl::Milliseconds(100 + 9 * 30));
  // Deterministic: the same request again gives the same tokens, now from the prefix cache.
  GenerateResult again = client.Generate(MakeRequest("n2", prompt, s), absl::Seconds(60));
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.choices[0].tokens, got.choices[0].tokens);
  EXPECT_EQ(again.choices[1].tokens, got.choices[1].tokens);
  EXPECT_EQ(again.usage.cached_tokens(), 192u);  // 12 full blocks of 16 of the 199 positions
  // A stop string from its own text ends it there.
  Sampling stopping = s;
  stopping.n = 1;
  const std::string& text = got.choices[0].text;
  stopping.stop = {text.substr(text.size() / 2, 1)};
  GenerateResult stopped = client.Generate(MakeRequest("n3", prompt, stopping), absl::Seconds(60));
  ASSERT_TRUE(stopped.status.ok());
  EXPECT_EQ(stopped.choices[0].finish, v1::FINISH_REASON_STOP);
  // The worker's own step times follow the configuration.
  const double decode_steps =
      MetricValue(worker->admin_port(), "ferry_worker_step_seconds_count{kind=\"decode\"}");
  const double decode_seconds =
      MetricValue(worker->admin_port(), "ferry_worker_step_seconds_sum{kind=\"decode\"}");
  ASSERT_GT(decode_steps, 0);
  EXPECT_GE(decode_seconds / decode_steps, 0.03);
  auto watch = client.Watch(v1::WatchRequest(), absl::Seconds(30));
  v1::WorkerStatus status;
  ASSERT_TRUE(watch->Next(&status));
  EXPECT_EQ(status.engine(), "null");
  // The compute backend: the CPU reference by default, host memory (nothing accounted).
  EXPECT_EQ(status.backend().kind(), "cpu");
  EXPECT_EQ(status.backend().device().rfind("cpu", 0), 0u) << status.backend().device();
  EXPECT_EQ(status.backend().memory_limit_bytes(), 0u);
  EXPECT_GE(status.load().step_time_ms(), 30.0f);
  // Steps ran in the window: the engine was busy part of it.
  EXPECT_GT(status.load().busy_fraction(), 0.0f);
  EXPECT_LE(status.load().busy_fraction(), 1.0f);
  watch->Cancel();
}

}  // namespace
}  // namespace ferry
