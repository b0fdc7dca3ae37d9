// ferry-worker's Generate against the same engine run inside the test, on the tiny dense, MoE and
// hybrid models (the hybrid also with its window layers in a pool of their own): token streams,
// logprobs and text are bit-identical, greedy and seeded, with n = 2, stop strings, max_tokens,
// the model's end of sequence (ignored on request, held back by min_tokens); a second request
// sharing a prefix reports the reused tokens and gives the same output; the pool is idle after.

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

struct ModelCase {
  std::string name;
  std::string model;
  int64_t window_pool_bytes = 0;
};

const ModelCase kCases[] = {
    {"dense", "llama_gqa_bf16"},
    {"moe", "qwen2_moe"},
    {"hybrid", "qwen3_hybrid"},
    {"hybrid_two_pools", "qwen3_hybrid", 1 << 20},
};

class WorkerGenerateTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(WorkerGenerateTest, StreamsEqualTheEngineInProcess) {
  const ModelCase& c = GetParam();
  const std::string model = TinyModel(c.model);
  std::vector<std::string> flags;
  if (c.window_pool_bytes > 0)
    flags.push_back(absl::StrCat("--window_pool_bytes=", c.window_pool_bytes));
  auto worker = StartWorker(model, flags);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  InProcessEngine ref(model, c.window_pool_bytes);
  const int64_t vocab = ref.model().config().vocab_size;

  // Greedy with logprobs: tokens, logprobs and text; usage.
  const std::vector<TokenId> prompt = RandomPrompt(40, 1, vocab);
  Sampling greedy;
  greedy.logprobs = true;
  greedy.top_logprobs = 3;
  greedy.ignore_eos = true;  // the full 12 tokens
  GenerateResult got = client.Generate(MakeRequest("greedy", prompt, greedy), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const std::vector<ChoiceOutput> want = ref.Run(MakeRequest("greedy", prompt, greedy));
  ASSERT_EQ(got.choices.size(), 1u);
  ExpectSameOutput(got.choices[0], want[0], "greedy");
  EXPECT_EQ(got.choices[0].tokens.size(), 12u);
  EXPECT_EQ(got.choices[0].finish, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(got.choices[0].logprobs.size(), 12u);
  EXPECT_EQ(got.choices[0].logprobs[0].top_alternatives_size(), 3);
  ASSERT_TRUE(got.has_usage);
  EXPECT_EQ(got.usage.prompt_tokens(), 40u);
  EXPECT_EQ(got.usage.completion_tokens(), 12u);
  EXPECT_FALSE(got.has_error);

  // Seeded, two choices.
  Sampling seeded;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.seed = 7;
  seeded.n = 2;
  seeded.logprobs = true;
  got = client.Generate(MakeRequest("seeded", prompt, seeded), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const std::vector<ChoiceOutput> want_seeded = ref.Run(MakeRequest("seeded", prompt, seeded));
  ASSERT_EQ(got.choices.size(), 2u);
  for (int i = 0; i < 2; ++i) ExpectSameOutput(got.choices[i], want_seeded[i], "seeded choice");
  EXPECT_EQ(got.usage.completion_tokens(),
            want_seeded[0].tokens.size() + want_seeded[1].tokens.size());

  // A stop string from the middle of the greedy text: the text ends before it.
  const std::string& text = want[0].text;
  ASSERT_GE(text.size(), 4u) << "the greedy text is too short for a stop string";
  const std::string stop = MiddleCharacter(text);
  Sampling stopping = greedy;
  stopping.stop = {stop};
  got = client.Generate(MakeRequest("stop", prompt, stopping), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok());
  const std::vector<ChoiceOutput> want_stop = ref.Run(MakeRequest("stop", prompt, stopping));
  ExpectSameOutput(got.choices[0], want_stop[0], "stop string");
  EXPECT_EQ(got.choices[0].finish, v1::FINISH_REASON_STOP);
  EXPECT_EQ(got.choices[0].stop_string, stop);
  EXPECT_EQ(got.choices[0].text, text.substr(0, text.find(stop)));

  // A shared prefix: 40 tokens, 2 full blocks of 16, then different tails.
  std::vector<TokenId> a = prompt, b = prompt;
  for (TokenId t : RandomPrompt(10, 2, vocab)) a.push_back(t);
  for (TokenId t : RandomPrompt(10, 3, vocab)) b.push_back(t);
  got = client.Generate(MakeRequest("a", a, greedy), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok());
  got = client.Generate(MakeRequest("b", b, greedy), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.usage.cached_tokens(), 32u);
  EXPECT_EQ(got.usage.cached_by_source().local(), 32u);
  InProcessEngine fresh(model, c.window_pool_bytes);  // nothing cached there
  const std::vector<ChoiceOutput> want_b = fresh.Run(MakeRequest("b", b, greedy));
  ExpectSameOutput(got.choices[0], want_b[0], "with a cached prefix");
  GenerateResult again = client.Generate(MakeRequest("b2", b, greedy), absl::Seconds(60));
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.usage.cached_tokens(), 48u);  // 49 of 50 positions: three full blocks
  ExpectSameOutput(again.choices[0], want_b[0], "from the cache");

  // The pool is back at its idle usage (only the prefix cache holds blocks).
  EXPECT_TRUE(WaitUntilIdle(client));
  EXPECT_EQ(MetricValue(worker->admin_port(), "ferry_worker_requests_total{outcome=\"completed\"}"),
            6);
  EXPECT_GE(MetricValue(worker->admin_port(), "ferry_worker_prompt_tokens_total{source=\"local\"}"),
            80);
  if (c.model == "qwen2_moe") {  // tokens per expert (the gauges follow within a Watch tick)
    double routed = 0;
    for (int i = 0; i < 200 && routed <= 0; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      routed = 0;
      for (int e = 0; e < 8; ++e) {
        routed += std::max(
            0.0, MetricValue(worker->admin_port(),
                             absl::StrCat("ferry_worker_expert_tokens_total{expert=\"", e, "\"}")));
      }
    }
    EXPECT_GT(routed, 0);
  }
  worker->Signal(SIGTERM);
  EXPECT_EQ(worker->WaitForExit(absl::Seconds(30)), 0) << worker->LogTail();
}

INSTANTIATE_TEST_SUITE_P(Models, WorkerGenerateTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// A copy of `from` whose end-of-sequence id is `eos` (config.json and generation_config.json).
std::string WithEos(const std::string& from, TokenId eos) {
  namespace fs = std::filesystem;
  const std::string to = absl::StrCat(std::getenv("TEST_TMPDIR"), "/eos_", eos);
  fs::create_directories(to);
  for (const auto& entry : fs::directory_iterator(from)) {
    fs::copy_file(entry.path(), to + "/" + entry.path().filename().string(),
                  fs::copy_options::overwrite_existing);
  }
  for (const char* file : {"config.json", "generation_config.json"}) {
    const std::string path = to + "/" + file;
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    j["eos_token_id"] = eos;
    std::ofstream(path) << j.dump(2);
  }
  return to;
}

TEST(WorkerGenerateEosTest, TheModelsEndOfSequenceStopsUnlessIgnoredOrTooEarly) {
  const std::string base = TinyModel("llama_gqa_bf16");
  InProcessEngine plain(base);
  const std::vector<TokenId> prompt = RandomPrompt(30, 5, plain.model().config().vocab_size);
  Sampling greedy;
  greedy.max_tokens = 16;
  greedy.ignore_eos = true;
  const std::vector<ChoiceOutput> free = plain.Run(MakeRequest("free", prompt, greedy));
  ASSERT_EQ(free[0].tokens.size(), 16u);
  const TokenId eos = free[0].tokens[4];
  const size_t first =
      std::find(free[0].tokens.begin(), free[0].tokens.end(), eos) - free[0].tokens.begin();

  const std::string model = WithEos(base, eos);
  auto worker = StartWorker(model);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  InProcessEngine ref(model);

  Sampling stops = greedy;
  stops.ignore_eos = false;
  GenerateResult got = client.Generate(MakeRequest("eos", prompt, stops), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.choices[0].finish, v1::FINISH_REASON_STOP);
  EXPECT_TRUE(got.choices[0].has_stop_token);
  EXPECT_EQ(got.choices[0].stop_token, eos);
  EXPECT_EQ(got.choices[0].tokens,
            std::vector<uint32_t>(free[0].tokens.begin(), free[0].tokens.begin() + first + 1));
  ExpectSameOutput(got.choices[0], ref.Run(MakeRequest("eos", prompt, stops))[0], "eos");

  got = client.Generate(MakeRequest("ignore", prompt, greedy), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.choices[0].tokens, free[0].tokens);
  EXPECT_EQ(got.choices[0].finish, v1::FINISH_REASON_LENGTH);

  // min_tokens past the first eos: none before it, the same as the engine in-process.
  Sampling min = stops;
  min.min_tokens = static_cast<uint32_t>(first + 2);
  got = client.Generate(MakeRequest("min", prompt, min), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok());
  ASSERT_GE(got.choices[0].tokens.size(), min.min_tokens);
  for (uint32_t i = 0; i < min.min_tokens; ++i) EXPECT_NE(got.choices[0].tokens[i], eos) << i;
  ExpectSameOutput(got.choices[0], ref.Run(MakeRequest("min", prompt, min))[0], "min_tokens");

  // A stop id the request names works as well.
  Sampling ids = greedy;
  ids.stop_ids = {free[0].tokens[2]};
  got = client.Generate(MakeRequest("ids", prompt, ids), absl::Seconds(60));
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.choices[0].stop_token, free[0].tokens[2]);
  EXPECT_LE(got.choices[0].tokens.size(), 3u);
}

TEST(WorkerGenerateErrorsTest, BadRequestsAreRefusedWithClearStatuses) {
  auto worker = StartWorker(TinyModel("llama_gqa_bf16"));
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  auto code = [&](const v1::GenerateRequest& r) {
    return client.Generate(r, absl::Seconds(30)).status.error_code();
  };
  Sampling s;
  v1::GenerateRequest r = MakeRequest("x", {5, 6, 7}, s);
  r.mutable_request()->clear_prompt_token_ids();
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = MakeRequest("x", {5, 6, 100000}, s);
  EXPECT_EQ(code(r), grpc::StatusCode::INVALID_ARGUMENT);
  r = MakeRequest("x", {5, 6, 7}, s);
  r.set_aggregated(false);
  EXPECT_EQ(code(r), grpc::StatusCode::FAILED_PRECONDITION);
  r = MakeRequest("x", {5, 6, 7}, s);
  r.mutable_request()->mutable_model()->mutable_fingerprint()->set_lo(12345);
  EXPECT_EQ(code(r), grpc::StatusCode::FAILED_PRECONDITION);
  s.n = 1000;
  EXPECT_EQ(code(MakeRequest("x", {5, 6, 7}, s)), grpc::StatusCode::INVALID_ARGUMENT);
  s = Sampling();
  s.temperature = -1;
  EXPECT_EQ(code(MakeRequest("x", {5, 6, 7}, s)), grpc::StatusCode::INVALID_ARGUMENT);
  // The calls of the other roles say where they belong.
  v1::PrefillRequest prefill;
  EXPECT_EQ(client.Prefill(prefill).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(client.KvReady(v1::KvReadyRequest()).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  r = MakeRequest("x", {5, 6, 7}, Sampling());
  r.set_aggregated(false);
  EXPECT_EQ(code(r), grpc::StatusCode::FAILED_PRECONDITION);
  // Still serving.
  EXPECT_TRUE(
      client.Generate(MakeRequest("ok", {5, 6, 7}, Sampling()), absl::Seconds(30)).status.ok());
  EXPECT_EQ(MetricValue(worker->admin_port(), "ferry_worker_requests_total{outcome=\"invalid\"}"),
            8);
}

}  // namespace
}  // namespace ferry
