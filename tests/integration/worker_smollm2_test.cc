// ferry-worker on the default model (SmolLM2-135M-Instruct, bf16 weights and KV, as `./ferry up`
// serves it): a chat prompt rendered with the model's own template gives, greedy and seeded, the
// same tokens, logprobs and text as the engine in this process; the model's end of sequence ends
// the answer; a second conversation sharing the system prompt reports the reused tokens and
// answers exactly as without them. Needs FERRY_MODEL_GGUF (set by ./ferry test).

#include <cstdlib>

#include "engine/gguf/gguf_file.h"
#include "engine/template/chat_template.h"
#include "gtest/gtest.h"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

constexpr char kSystem[] =
    "You are a careful assistant for a river-shipping company that runs barges between the "
    "ports of the Seine, the Rhine and the Danube. Customers ask about cities, rivers, ports and "
    "schedules. Answer in one or two short sentences, name the port or the river when you know "
    "it, never invent a timetable, and say so plainly when you do not know.";

std::vector<TokenId> ChatPrompt(const std::string& model, const Tokenizer& tokenizer,
                                const std::string& question) {
  auto gguf = *GgufFile::Open(model);
  auto chat = *ChatTemplate::FromGguf(*gguf);
  ChatTemplateInputs inputs;
  inputs.messages.push_back({{"role", "system"}, {"content", kSystem}});
  inputs.messages.push_back({{"role", "user"}, {"content", question}});
  inputs.add_generation_prompt = true;
  auto prompt = chat->Apply(inputs);
  EXPECT_TRUE(prompt.ok()) << prompt.status();
  auto ids = tokenizer.Encode(PromptSegments(*prompt));
  EXPECT_TRUE(ids.ok()) << ids.status();
  return *ids;
}

TEST(WorkerSmolLm2Test, ChatAnswersEqualTheEngineInProcessAndReuseTheSharedPrefix) {
  const char* model = std::getenv("FERRY_MODEL_GGUF");
  ASSERT_NE(model, nullptr) << "FERRY_MODEL_GGUF is not set; run through ./ferry test";
  auto worker = StartWorker(model, {"--kv_pool_bytes=64MiB", "--threads=2"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  InProcessEngine ref(model, 0, "bf16", "bf16", 16, 64 << 20);

  const std::vector<TokenId> first =
      ChatPrompt(model, ref.tokenizer(), "What is the capital of France?");
  ASSERT_GT(first.size(), 48u);
  Sampling greedy;
  greedy.max_tokens = 24;
  greedy.logprobs = true;
  greedy.top_logprobs = 2;
  GenerateResult got = client.Generate(MakeRequest("q1", first, greedy), absl::Seconds(120));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const std::vector<ChoiceOutput> want = ref.Run(MakeRequest("q1", first, greedy));
  EXPECT_EQ(got.choices[0].tokens, want[0].tokens);
  EXPECT_EQ(got.choices[0].text, want[0].text);
  ASSERT_EQ(got.choices[0].logprobs.size(), want[0].logprobs.size());
  for (size_t i = 0; i < want[0].logprobs.size(); ++i) {
    EXPECT_EQ(got.choices[0].logprobs[i].SerializeAsString(),
              want[0].logprobs[i].SerializeAsString());
  }
  EXPECT_NE(got.choices[0].text.find("Paris"), std::string::npos) << got.choices[0].text;
  // The answer ends on the model's end of sequence (<|im_end|>), not at max_tokens.
  EXPECT_EQ(got.choices[0].finish, v1::FINISH_REASON_STOP);
  EXPECT_TRUE(got.choices[0].has_stop_token);
  EXPECT_EQ(ref.tokenizer().TokenString(got.choices[0].stop_token), "<|im_end|>");
  EXPECT_EQ(got.usage.prompt_tokens(), first.size());

  // Another question under the same system prompt: its leading blocks come from the cache.
  const std::vector<TokenId> second =
      ChatPrompt(model, ref.tokenizer(), "Which river flows through Paris?");
  size_t shared = 0;
  while (shared < first.size() && first[shared] == second[shared]) ++shared;
  Sampling seeded;
  seeded.max_tokens = 24;
  seeded.temperature = 0.7f;
  seeded.seed = 11;
  got = client.Generate(MakeRequest("q2", second, seeded), absl::Seconds(120));
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.usage.cached_tokens(), shared / 16 * 16);
  EXPECT_GE(got.usage.cached_tokens(), 64u);
  InProcessEngine fresh(model, 0, "bf16", "bf16", 16, 64 << 20);
  const std::vector<ChoiceOutput> want_second = fresh.Run(MakeRequest("q2", second, seeded));
  EXPECT_EQ(got.choices[0].tokens, want_second[0].tokens);
  EXPECT_EQ(got.choices[0].text, want_second[0].text);
  EXPECT_TRUE(WaitUntilIdle(client));
  worker->Signal(SIGTERM);
  EXPECT_EQ(worker->WaitForExit(absl::Seconds(30)), 0) << worker->LogTail();
}

}  // namespace
}  // namespace ferry
