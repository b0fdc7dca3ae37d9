// ferry-worker's Generate with images in the prompt, their embeddings inline (PromptImage's
// embeddings: little-endian float32 rows of the model's hidden size), on the tiny dense model and
// the hybrid one with its window layers in a pool of their own: the stream equals the engine run
// in this process (greedy and seeded), the embeddings matter (the same tokens without them give
// another stream), the same request again reuses the cached blocks that cover the images and
// gives the same stream, another image at the same place reuses only the blocks before it, a
// resumed request (what the router sends on a migration: the whole request again, images
// included, with the resume point) continues exactly, bad images are INVALID_ARGUMENT, and a
// prefill/decode split (both sides given the images) streams as the aggregated engine.

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvstore/wire.h"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

// Placeholders [start, start + rows) of `prompt` set to `placeholder`; an image with `rows`
// deterministic pseudo-random rows of width `cols`, named by `seed`.
v1::PromptImage InlineImage(v1::GenerateRequest& request, uint32_t start, uint32_t rows,
                            int64_t cols, uint32_t seed, TokenId placeholder) {
  for (uint32_t i = 0; i < rows; ++i) {
    request.mutable_request()->set_prompt_token_ids(static_cast<int>(start + i), placeholder);
  }
  v1::PromptImage image;
  kv::HashToProto(Hash128{0xabc0u + seed, seed}, image.mutable_content_hash());
  image.set_placeholder_start(start);
  image.set_placeholder_length(rows);
  image.set_embedding_rows(rows);
  image.set_embedding_cols(static_cast<uint32_t>(cols));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::string bytes;
  for (int64_t k = 0; k < rows * cols; ++k) {
    const float f = normal(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>(u >> (8 * b)));
  }
  image.set_embeddings(bytes);
  return image;
}

// A 60-token prompt with two images: placeholders 20..39 (blocks 1 and 2 of 16) and 44..55.
v1::GenerateRequest ImageRequest(const std::string& id, int64_t vocab, int64_t hidden,
                                 const Sampling& sampling, uint32_t first_seed = 1) {
  v1::GenerateRequest r = MakeRequest(id, RandomPrompt(60, 3, vocab), sampling);
  const TokenId placeholder = 5;
  *r.mutable_request()->add_images() = InlineImage(r, 20, 20, hidden, first_seed, placeholder);
  *r.mutable_request()->add_images() = InlineImage(r, 44, 12, hidden, 2, placeholder);
  return r;
}

struct ModelCase {
  std::string name;
  std::string model;
  int64_t window_pool_bytes = 0;
};

class WorkerImageTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(WorkerImageTest, InlineEmbeddingsStreamAsTheEngineInProcess) {
  const ModelCase& c = GetParam();
  const std::string model = TinyModel(c.model);
  std::vector<std::string> flags;
  if (c.window_pool_bytes > 0) {
    flags.push_back(absl::StrCat("--window_pool_bytes=", c.window_pool_bytes));
  }
  auto worker = StartWorker(model, flags);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  InProcessEngine ref(model, c.window_pool_bytes);
  const int64_t vocab = ref.model().config().vocab_size;
  const int64_t hidden = ref.model().config().hidden_size;
  Sampling greedy;
  greedy.ignore_eos = true;
  Sampling seeded = greedy;
  seeded.temperature = 0.9f;
  seeded.seed = 7;

  // Greedy and seeded: the worker's stream is the in-process engine's.
  const v1::GenerateRequest request = ImageRequest("img", vocab, hidden, greedy);
  GenerateResult got = client.Generate(request, absl::Seconds(60));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  ASSERT_EQ(got.choices.size(), 1u);
  EXPECT_EQ(got.choices[0].tokens.size(), 12u);
  EXPECT_EQ(got.usage.cached_tokens(), 0u);
  ExpectSameOutput(got.choices[0], ref.Run(request)[0], "greedy");
  const v1::GenerateRequest sampled = ImageRequest("sampled", vocab, hidden, seeded);
  GenerateResult got_sampled = client.Generate(sampled, absl::Seconds(60));
  ASSERT_TRUE(got_sampled.status.ok()) << got_sampled.status.error_message();
  InProcessEngine fresh(model, c.window_pool_bytes);
  ExpectSameOutput(got_sampled.choices[0], fresh.Run(sampled)[0], "seeded");

  // The embeddings matter: the same tokens without the images give other logits somewhere.
  v1::GenerateRequest text_only = request;
  text_only.mutable_request()->mutable_context()->set_request_id("text");
  text_only.mutable_request()->clear_images();
  Sampling with_logprobs = greedy;
  with_logprobs.logprobs = true;
  *text_only.mutable_request()->mutable_sampling() =
      MakeRequest("x", {1}, with_logprobs).request().sampling();
  v1::GenerateRequest image_logprobs = request;
  image_logprobs.mutable_request()->mutable_context()->set_request_id("img_lp");
  *image_logprobs.mutable_request()->mutable_sampling() = text_only.request().sampling();
  InProcessEngine plain(model, c.window_pool_bytes);
  const ChoiceOutput a = plain.Run(text_only)[0], b = plain.Run(image_logprobs)[0];
  ASSERT_FALSE(a.logprobs.empty());
  EXPECT_NE(a.logprobs[0].sampled().logprob(), b.logprobs[0].sampled().logprob());

  // Again: the three full blocks (the images' included) come from the cache, same stream.
  v1::GenerateRequest again = request;
  again.mutable_request()->mutable_context()->set_request_id("again");
  GenerateResult got_again = client.Generate(again, absl::Seconds(60));
  ASSERT_TRUE(got_again.status.ok()) << got_again.status.error_message();
  EXPECT_EQ(got_again.usage.cached_tokens(), 48u);
  ExpectSameOutput(got_again.choices[0], got.choices[0], "again, from the cache");

  // Another first image at the same placeholders: only block 0 (before it) is reused.
  const v1::GenerateRequest other = ImageRequest("other", vocab, hidden, greedy, 9);
  GenerateResult got_other = client.Generate(other, absl::Seconds(60));
  ASSERT_TRUE(got_other.status.ok()) << got_other.status.error_message();
  EXPECT_EQ(got_other.usage.cached_tokens(), 16u);
  InProcessEngine cold(model, c.window_pool_bytes);
  ExpectSameOutput(got_other.choices[0], cold.Run(other)[0], "another image");

  // Resumed after 5 tokens (a migration: the router sends the request again, images and all):
  // the rest of the same stream.
  const v1::GenerateRequest resumed = Resumed(request, got.choices[0].tokens, 5, "resumed");
  GenerateResult got_resumed = client.Generate(resumed, absl::Seconds(60), {}, {5});
  ASSERT_TRUE(got_resumed.status.ok()) << got_resumed.status.error_message();
  EXPECT_EQ(got_resumed.choices[0].tokens,
            std::vector<uint32_t>(got.choices[0].tokens.begin() + 5, got.choices[0].tokens.end()));

  // Bad images: INVALID_ARGUMENT, with the reason.
  struct Bad {
    std::string what, says;
    std::function<void(v1::GenerateRequest&)> spoil;
  };
  const std::vector<Bad> bad = {
      {"wrong width", "hidden size",
       [&](v1::GenerateRequest& r) {
         v1::PromptImage* image = r.mutable_request()->mutable_images(0);
         *image = InlineImage(r, 20, 20, hidden - 1, 1, 5);
       }},
      {"outside the prompt", "outside the prompt",
       [](v1::GenerateRequest& r) {
         r.mutable_request()->mutable_images(1)->set_placeholder_start(50);
       }},
      {"overlapping", "overlap",
       [](v1::GenerateRequest& r) {
         r.mutable_request()->mutable_images(1)->set_placeholder_start(30);
       }},
      {"image bytes", "vision model",
       [](v1::GenerateRequest& r) {
         r.mutable_request()->mutable_images(0)->clear_embeddings();
         r.mutable_request()->mutable_images(0)->set_image_data("\x89PNG\r\n");
       }},
  };
  for (const Bad& b : bad) {
    v1::GenerateRequest r = request;
    r.mutable_request()->mutable_context()->set_request_id("bad");
    b.spoil(r);
    GenerateResult refused = client.Generate(r, absl::Seconds(60));
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.what;
    EXPECT_NE(refused.status.error_message().find(b.says), std::string::npos)
        << b.what << ": " << refused.status.error_message();
  }
  EXPECT_TRUE(WaitUntilIdle(client));
}

// Prefill on one worker (chunks of 24: a boundary inside the first image), decode on another
// (the KV handed off over the gRPC transport): both receive the request with its images; the
// stream is the aggregated engine's.
TEST(WorkerImageHandoffTest, APrefillDecodeSplitStreamsAsTheEngineInProcess) {
  const std::string model = TinyModel("llama_gqa_bf16");
  auto p = StartWorker(model, {"--role=prefill", "--transport=grpc", "--prefill_chunk=24"});
  auto d = StartWorker(model, {"--role=decode", "--transport=grpc"});
  ASSERT_TRUE(p->ready());
  ASSERT_TRUE(d->ready());
  WorkerClient prefill(p->address()), decode(d->address());
  InProcessEngine ref(model);
  Sampling greedy;
  greedy.ignore_eos = true;
  const v1::GenerateRequest request =
      ImageRequest("pd", ref.model().config().vocab_size, ref.model().config().hidden_size, greedy);
  PdResult got = RunPd(decode, d->address(), prefill, request);
  ASSERT_TRUE(got.reserved);
  ASSERT_TRUE(got.prefill.ok()) << got.prefill.error_message();
  ASSERT_TRUE(got.stream.status.ok()) << got.stream.status.error_message();
  ASSERT_EQ(got.stream.choices.size(), 1u);
  EXPECT_EQ(got.stream.choices[0].tokens.size(), 12u);
  ExpectSameOutput(got.stream.choices[0], ref.Run(request)[0], "prefill/decode split");
}

INSTANTIATE_TEST_SUITE_P(Models, WorkerImageTest,
                         ::testing::Values(ModelCase{"dense", "llama_gqa_bf16"},
                                           ModelCase{"hybrid_two_pools", "qwen3_hybrid", 1 << 20}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace ferry
